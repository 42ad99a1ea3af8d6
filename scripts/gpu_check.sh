#!/usr/bin/env bash
# On a GPU machine: the whole test suite (CUDA tests included), then the GPU benchmarks,
# in one call (device time is scarce). Run from the repository root, after installing
# what the machine lacks (see README "GPU machine"):
#   bash scripts/gpu_check.sh [tests] [augment] [train] [bench] [stream] [build] [ddp] [cuda]
#                             [jpeg] [nvjpeg] [rn50] [gpubuild] [probe] [buildprobe]
#                             [buildprobe_shm] [rn50probe] [buildworkers] [zerocopy] [gathertrain]
#                             [buildprocs] [buildread]
#   (default: tests augment train)
# tests    pytest, CUDA tests included
# augment  scripts/bench_augment.py: RandomResizedCrop+flip on the GPU vs roi_align vs a
#          device copy of the same bytes
# train    scripts/bench_train_aug.py: ResNet-18/50 fed by PackLoader+augmentation vs the
#          same step on batches already on the GPU vs ImageFolder+torchvision; PackDataset
# bench    the full `imgpack bench` grid (about 7 minutes on 16 cores)
# stream   scripts/bench_stream.py: PackLoader on 50,000-image packs against the machine's
#          copy limits, over threads, prefetch, populate and GPU-resident mode
# build    scripts/bench_build.py: build speed against the machine's decode ceiling
# ddp      scripts/train_ddp.py: DDP ResNet-18 on 1 GPU and on all (torchrun)
# cuda     the test files with CUDA tests only (loader, JPEG, GPU build, transforms)
# jpeg     scripts/bench_jpeg.py: JPEG packs and the GPU build vs the CPU ceiling
# rn50     scripts/bench_train_aug.py --jpeg, ResNet-50 only, no ImageFolder road
# gpubuild scripts/bench_build.py set b: --device cuda vs the CPU build vs the ceiling
# nvjpeg   scripts/probe_nvjpeg.py: where the batched GPU decode's time goes
# probe    scripts/probe_stream.py on a 16,000-image 224² pack, fresh and after churn
# buildprobe scripts/probe_build_gpu.py: the GPU build's stages alone and inside a build
# buildprobe_shm the same with its set and packs in /dev/shm: the pipeline without the disk
# rn50probe scripts/probe_train_jpeg.py: where ResNet-50 fed by a JPEG pack loses time
# buildworkers scripts/probe_build_workers.py: the GPU build with 16, 8, 4 CPU workers
# zerocopy scripts/probe_zero_copy.py then probe_stream.py --variants device,cpu: the GPU
#          reading a 16,000-image 224² pack in place vs the CPU way
# gathertrain scripts/probe_gather_train.py: what gather="device" costs ResNet-18 beside it
# buildprocs scripts/probe_build_procs.py: the GPU half of the build in 1-4 decoder processes
# buildread scripts/probe_build_read.py: whole GPU builds, warm, disk and tmpfs, against the
#          packer at $OLD_TREE (a carried `git archive` of an older commit) when set
# Logs and JSON go under $OUT (or ./out); the tables are printed last.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
W=/tmp/imgpack-gpu
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(tests augment train)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores: $(nproc)  date: $(date -u +%F)"
  python3 -c "import torch, torchvision, tensordict, PIL; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'tensordict', tensordict.__version__, 'pillow', PIL.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
for w in "${what[@]}"; do
  case $w in
    tests) python3 -m pytest tests -q -p no:cacheprovider -x 2>&1 | tail -30 > "$OUT/tests.txt" ;;
    augment) python3 scripts/bench_augment.py --device cuda --json "$OUT/augment.json" > "$OUT/augment.txt" 2>&1 ;;
    train) python3 scripts/bench_train_aug.py --jpeg --work $W --out "$OUT" > "$OUT/train.txt" 2>&1 ;;
    bench) python3 -m packer bench --device cuda --out "$OUT/bench" -q > "$OUT/bench.txt" 2>&1 ;;
    stream) python3 scripts/bench_stream.py --work $W > "$OUT/stream.txt" 2>&1 ;;
    build) python3 scripts/bench_build.py --images 16000 --work $W > "$OUT/build.txt" 2>&1 ;;
    cuda) python3 -m pytest -q -p no:cacheprovider -x tests/test_jpeg.py tests/test_jpeg_loader.py \
            tests/test_jpeg_pack.py tests/test_build_gpu.py tests/test_loader.py \
            tests/test_loader_lifetime.py tests/test_targets_loader.py tests/test_transforms.py \
            2>&1 | tail -30 > "$OUT/cuda.txt" ;;
    jpeg) python3 scripts/bench_jpeg.py --images 8192 --work $W/jpeg > "$OUT/jpeg.txt" 2>&1 ;;
    nvjpeg) python3 scripts/probe_nvjpeg.py > "$OUT/nvjpeg.txt" 2>&1 ;;
    rn50) python3 scripts/bench_train_aug.py --jpeg --archs resnet50 --no-folder --work $W \
            --out "$OUT" > "$OUT/rn50.txt" 2>&1 ;;
    gpubuild) python3 scripts/bench_build.py --sets b --variants new,gpu --no-disk --repeats 3 \
            --images 16000 --work $W/build > "$OUT/gpubuild.txt" 2>&1 ;;
    probe) python3 -c "from pathlib import Path; from packer.bench.synth import make_random_pack as m; m(Path('$W/p224'), 16000, 224)" \
           && python3 scripts/probe_stream.py --pack $W/p224 --modes fresh,churn \
              --variants default > "$OUT/probe.txt" 2>&1 ;;
    buildprobe) python3 scripts/probe_build_gpu.py --work $W/build > "$OUT/buildprobe.txt" 2>&1 ;;
    buildprobe_shm) { df -h /dev/shm; python3 scripts/probe_build_gpu.py --work /dev/shm/imgpack-build; \
                      rm -rf /dev/shm/imgpack-build; } > "$OUT/buildprobe_shm.txt" 2>&1 ;;
    buildworkers) python3 scripts/probe_build_workers.py --work $W/bw > "$OUT/buildworkers.txt" 2>&1 ;;
    rn50probe) python3 scripts/probe_train_jpeg.py --work $W/rn50probe --out "$OUT" \
                 > "$OUT/rn50probe.txt" 2>&1 ;;
    zerocopy) python3 -c "from pathlib import Path; from packer.bench.synth import make_random_pack as m; m(Path('$W/p224'), 16000, 224)" \
           && { python3 scripts/probe_zero_copy.py --pack $W/p224; python3 scripts/probe_stream.py \
                --pack $W/p224 --modes fresh,churn,fresh --variants device,cpu; } > "$OUT/zerocopy.txt" 2>&1 ;;
    gathertrain) python3 scripts/probe_gather_train.py --work $W > "$OUT/gathertrain.txt" 2>&1 ;;
    buildprocs) python3 scripts/probe_build_procs.py --work $W/procs > "$OUT/buildprocs.txt" 2>&1; \
                rm -rf /dev/shm/imgpack-procs ;;
    buildread) python3 scripts/probe_build_read.py ${OLD_TREE:+--old-tree "$OLD_TREE"} --work $W/read \
                 > "$OUT/buildread.txt" 2>&1; rm -rf /dev/shm/imgpack-read ;;
    ddp) n=$(nvidia-smi -L | wc -l)
         for k in 1 "$n"; do
           torchrun --standalone --nproc-per-node "$k" scripts/train_ddp.py --make-pack 20000 \
             --pack $W/ddp224 2>&1 | tail -5
         done > "$OUT/ddp.txt" ;;
    *) echo "unknown part: $w (tests augment train bench stream build ddp cuda jpeg nvjpeg rn50 gpubuild probe buildprobe buildprobe_shm rn50probe buildworkers zerocopy gathertrain buildprocs buildread)" >&2; exit 2 ;;
  esac
done
for w in "${what[@]}"; do
  echo "==== $w"
  tail -25 "$OUT/$w.txt"
done
