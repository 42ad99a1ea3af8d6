#!/usr/bin/env bash
# Second, shorter GPU call: tests (CUDA ones included), build speed and streaming only.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
W=/tmp/imgpack-bench
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA node\(s\))" | tee "$OUT/machine.txt"
python3 -c "import PIL, numpy, torch, tensordict; print('pillow', PIL.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'tensordict', tensordict.__version__)" | tee -a "$OUT/machine.txt"
python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tail -25 > "$OUT/pytest.txt"; tail -4 "$OUT/pytest.txt"
python3 scripts/bench_build.py --images 16000 --work $W 2>&1 | tee "$OUT/build.txt" | tail -7
python3 scripts/bench_stream.py --images 50000 --work $W 2>&1 | tee "$OUT/stream.txt" | tail -19
