#!/usr/bin/env bash
# GPU-machine calls for issues 2, 7 and 8 (device time is scarce: one call each).
#   bash scripts/gpu_bench.sh bench   # tests, then the full `imgpack bench` grid on CUDA
#   bash scripts/gpu_bench.sh build   # build speed with the machine's decode ceiling
#   bash scripts/gpu_bench.sh ddp     # DDP ResNet-18 on 1 and on all GPUs (torchrun)
# Writes log.txt and results under $OUT (or ./out); at most 8 files come back.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
L=$OUT/log.txt
W=/tmp/imgpack-bench
{ lscpu | grep -E "^(CPU\(s\)|Thread|Model name|NUMA node\(s\))"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import PIL, numpy, torch, tensordict; print('pillow', PIL.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'tensordict', tensordict.__version__)"
  date -u +%F; } >> "$L" 2>&1
for what in "$@"; do
  echo "==== $what" >> "$L"
  case $what in
    tests) python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tail -15 >> "$L" ;;
    bench) python3 -m packer bench --device cuda --out "$OUT/bench" 2>&1 >/dev/null \
             | tr '\r' '\n' | grep -v '%|' >> "$L"
           cat "$OUT/bench/results.md" >> "$L" ;;
    build) python3 scripts/bench_build.py --images 16000 --work $W 2>&1 | tail -24 >> "$L" ;;
    ddp-smoke) torchrun --standalone --nproc-per-node 1 scripts/train_ddp.py --make-pack 4096 \
             --pack $W/ddp224 --steps 5 --warmup 3 2>&1 | tail -5 >> "$L" ;;
    ddp) n=$(nvidia-smi -L | wc -l)
         for k in 1 "$n"; do
           torchrun --standalone --nproc-per-node "$k" scripts/train_ddp.py --make-pack 20000 \
             --pack $W/ddp224 2>&1 | tail -5 >> "$L"
         done ;;
  esac
done
cat "$L"
