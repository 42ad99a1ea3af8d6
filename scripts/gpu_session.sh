#!/usr/bin/env bash
# Every GPU-machine measurement in one call (device time is scarce). Run from the
# repository root on the GPU machine, after installing the carried wheels:
#   bash scripts/gpu_session.sh
# Writes logs and JSON under $OUT (or ./out) and prints the tables last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
W=/tmp/imgpack-bench
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
echo "cores: $(nproc)  date: $(date -u +%F)" | tee -a "$OUT/machine.txt"
python3 -m pytest tests -q -x -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/pytest.txt"
python3 scripts/bench_build.py --images 16000 --work $W 2>&1 | tee "$OUT/build.txt" | tail -8
python3 scripts/bench_stream.py --images 50000 --work $W 2>&1 | tee "$OUT/stream.txt" | tail -16
python3 scripts/train_example.py --bench --work $W --folder $W/jpeg640 2>&1 | tee "$OUT/train.txt" | tail -6
python3 scripts/bench_compress.py --images 96 --work $W 2>&1 | tee "$OUT/compress.txt" | tail -8
python3 -m packer build $W/jpeg640 $W/pack640 --overwrite -q
python3 -m packer verify $W/pack640 --device cuda --batch-size 256 --plot "$OUT/verify.png" \
  --trace "$OUT/trace.json" 2>&1 | tee "$OUT/verify.txt"
echo "==== summary"; for f in build stream train compress verify; do echo "--- $f"; tail -14 "$OUT/$f.txt"; done
