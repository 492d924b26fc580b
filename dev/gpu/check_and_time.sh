#!/usr/bin/env bash
# dev/gpu/check_and_time.sh — the HIP backend on a real GPU: build it, check its parity, train with
# it, time it against PyTorch on the same GPU. Run from anywhere, on a machine with nvcc and an
# NVIDIA GPU (or hipcc and an AMD GPU, HIP_PLATFORM=amd), Python and this repository's
# requirements, and PyTorch built for that GPU.
#
#   bash dev/gpu/check_and_time.sh             everything below, logs into $OUT (default out_gpu/)
#   DRY_RUN=1 bash dev/gpu/check_and_time.sh   print the steps and check the tools, run nothing
#
#   1. build: make train_gpt2, then make hip (the nvcc build where nvcc is found)
#   2. parity: a fresh d12 (GPT-2 124M shapes, random init) reference written by PyTorch on the
#      CPU (train_gpt2_torch.py -e d12 -b 4 -t 64), then test_gpt2.py --backend hip on it
#   3. training: 20 steps of train.py --backend hip at B=4, T=1024 (tinyshakespeare; random
#      tokens where it cannot be prepared offline)
#   4. speed: dev/gpu/bench_gpu.py, a step at B=4, T=1024 against PyTorch eager fp32 and
#      torch.compile on the same GPU in the same run, TF32 off on every side: the ratios
# Stops at the first failing step with its log's tail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-out_gpu}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
mkdir -p "$OUT"

# run NAME COMMAND...: the command with its output in $OUT/NAME.log (and on the terminal)
run() {
    local name=$1
    shift
    echo "== $name: $*"
    [ "$DRY_RUN" = 1 ] && return 0
    if ! "$@" 2>&1 | tee "$OUT/$name.log"; then
        echo "check_and_time.sh: step '$name' failed (log: $OUT/$name.log)" >&2
        exit 1
    fi
}

# the tools, said in one line each: what is missing makes the run stop before it starts
missing=0
if command -v nvcc >/dev/null && [ "${HIP_PLATFORM:-nvidia}" = nvidia ]; then
    echo "compiler: $(nvcc --version | tail -1)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
        || { echo "check_and_time.sh: no NVIDIA GPU here (nvidia-smi)" >&2; missing=1; }
elif command -v hipcc >/dev/null; then
    echo "compiler: hipcc, $(hipcc --version 2>/dev/null | grep -m1 'HIP version' || echo 'version unknown')"
    command -v rocm-smi >/dev/null && rocm-smi --showproductname || { echo "check_and_time.sh: no AMD GPU here (rocm-smi)" >&2; missing=1; }
else
    echo "check_and_time.sh: neither nvcc nor hipcc found" >&2
    missing=1
fi
if "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    "$PYTHON" -c "import torch; print('PyTorch', torch.__version__, 'on', torch.cuda.get_device_name())"
else
    echo "check_and_time.sh: PyTorch that sees the GPU is needed (for the timing)" >&2
    missing=1
fi
if [ "$missing" = 1 ]; then
    [ "$DRY_RUN" = 1 ] && echo "(dry run: the steps that would run)" || exit 1
fi

# 1. build
run build-product make train_gpt2 PYTHON="$PYTHON"
run build-hip make hip PYTHON="$PYTHON"

# 2. parity on a fresh d12 reference
run reference env OMP_NUM_THREADS="$(nproc)" "$PYTHON" train_gpt2_torch.py -e d12 -b 4 -t 64 -o "$OUT" --name gpt2_d12
run parity "$PYTHON" test_gpt2.py --backend hip --model "$OUT/gpt2_d12.bin" --state "$OUT/gpt2_d12_debug_state.bin"
[ "$DRY_RUN" = 1 ] || grep -q "overall okay: 1" "$OUT/parity.log" || { echo "check_and_time.sh: parity failed" >&2; exit 1; }

# 3. training: tinyshakespeare, or random tokens where it cannot be prepared (no network)
data=(-i dev/data/tinyshakespeare/tiny_shakespeare_train.bin -j dev/data/tinyshakespeare/tiny_shakespeare_val.bin)
if [ "$DRY_RUN" != 1 ] && ! "$PYTHON" dev/data/tinyshakespeare.py > "$OUT/data.log" 2>&1; then
    echo "tinyshakespeare cannot be prepared here (see $OUT/data.log): training on random tokens"
    "$PYTHON" - "$OUT" <<'EOF'
import sys
import numpy as np
sys.path.insert(0, "dev/data")
from data_common import write_datafile
rng = np.random.default_rng(0)
for split, n in (("train", 300_000), ("val", 40_000)):
    write_datafile(f"{sys.argv[1]}/random_{split}.bin", rng.integers(0, 50257, n).tolist())
EOF
    data=(-i "$OUT/random_train.bin" -j "$OUT/random_val.bin")
fi
run train "$PYTHON" train.py --backend hip -b 4 -t 1024 -x 20 -v 10 -m 2 -s 0 "${data[@]}"

# 4. speed against PyTorch on the same GPU
run bench "$PYTHON" dev/gpu/bench_gpu.py -e 12 -b 4 -t 1024 --json "$OUT/bench.json"
echo "check_and_time.sh: done; logs and bench.json in $OUT/ (record the bench table in dev/BENCHMARKS.md)"
