#!/usr/bin/env bash
# dev/metal/check_and_time.sh — the Metal backend on a Mac: build it, check its parity for both
# model families, train with it, time it against PyTorch's MPS backend and MLX on the same Mac.
# NOT YET RUN ON A MAC: the first Mac user, please run it and report (accel/metal/README.md).
# Run from anywhere, on a Mac with Xcode's command-line tools (xcrun metal, clang), Python with
# this repository's requirements, and PyTorch with MPS (MLX too, if installed, is timed).
#
#   bash dev/metal/check_and_time.sh             everything below, logs into $OUT (default out_metal/)
#   DRY_RUN=1 bash dev/metal/check_and_time.sh   print the steps and check the tools, run nothing
#                                                (any OS: CI runs it, tests/test_metal_lab.py)
#
#   1. build: make train_gpt2, then make metal (the runtime and build/gpt2.metallib)
#   2. parity on the committed fixtures, GPT-2 and Llama: test_gpt2.py and test_llama2.py on
#      --backend metal, then on check:metal (every kernel call against the CPU oracle)
#   3. training: 20 steps of train.py --backend metal, Llama (stories15M) and GPT-2 (d12) at
#      B=4, T=256 (tinyshakespeare; random tokens where it cannot be prepared offline)
#   4. speed: dev/metal/bench_metal.py, a GPT-2 d12 step at B=4, T=1024 against PyTorch on mps
#      and MLX in the same run, at fp32, fp16 and bf16: the ratios
#   5. the matmul's A/B table on metal (dev/metal/ab.py): the variants' errors and times
#   6. half precision: test_gpt2.py and test_llama2.py on check:metal at fp16, then bf16 (bfloat
#      needs MSL 3.1, macOS 14: on an older macOS that step fails, saying so)
# Stops at the first failing step with its log's tail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-out_metal}
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

# passed NAME: the parity log NAME ends "overall okay: 1"
passed() {
    [ "$DRY_RUN" = 1 ] || grep -q "overall okay: 1" "$OUT/$1.log" || { echo "check_and_time.sh: $1 failed" >&2; exit 1; }
}

# the tools, said in one line each: what is missing makes the run stop before it starts
missing=0
if [ "$(uname -s)" = Darwin ]; then
    echo "macOS $(sw_vers -productVersion 2>/dev/null || echo '?'), $(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo 'CPU ?')"
    xcrun -sdk macosx metal --version >/dev/null 2>&1 && echo "compiler: $(xcrun -sdk macosx metal --version 2>&1 | head -1)" \
        || { echo "check_and_time.sh: no Metal compiler (xcode-select --install)" >&2; missing=1; }
else
    echo "check_and_time.sh: Metal needs macOS (here: $(uname -s); the emulator runs the kernels: make metal-emu)" >&2
    missing=1
fi
if "$PYTHON" -c "import sys, torch; sys.exit(not torch.backends.mps.is_available())" 2>/dev/null; then
    "$PYTHON" -c "import torch; print('PyTorch', torch.__version__, 'with MPS')"
else
    echo "check_and_time.sh: PyTorch with MPS is needed (for the timing)" >&2
    missing=1
fi
"$PYTHON" -c "import mlx.core as mx; print('MLX', mx.__version__)" 2>/dev/null || echo "MLX not installed: not timed"
if [ "$missing" = 1 ]; then
    [ "$DRY_RUN" = 1 ] && echo "(dry run: the steps that would run)" || exit 1
fi

# 1. build
run build-product make train_gpt2 PYTHON="$PYTHON"
run build-metal make metal PYTHON="$PYTHON"

# 2. parity, both families, then every kernel call against the CPU
run parity-gpt2 "$PYTHON" test_gpt2.py --backend metal
passed parity-gpt2
run check-gpt2 "$PYTHON" test_gpt2.py --backend check:metal
passed check-gpt2
run parity-llama "$PYTHON" test_llama2.py --backend metal
passed parity-llama
run check-llama "$PYTHON" test_llama2.py --backend check:metal
passed check-llama

# 3. training: tinyshakespeare, or random tokens where it cannot be prepared (no network)
data=(-i dev/data/tinyshakespeare/tiny_shakespeare_train.bin -j dev/data/tinyshakespeare/tiny_shakespeare_val.bin)
if [ "$DRY_RUN" != 1 ] && ! "$PYTHON" dev/data/tinyshakespeare.py > "$OUT/data.log" 2>&1; then
    echo "tinyshakespeare cannot be prepared here (see $OUT/data.log): training on random tokens"
    "$PYTHON" - "$OUT" <<'PY'
import sys
import numpy as np
from llmc.data_prep import write_datafile
rng = np.random.default_rng(0)
for split, n in (("train", 300_000), ("val", 40_000)):
    write_datafile(f"{sys.argv[1]}/random_{split}.bin", rng.integers(0, 50257, n).tolist())
PY
    data=(-i "$OUT/random_train.bin" -j "$OUT/random_val.bin")
fi
run train-llama "$PYTHON" train.py --model stories15M --backend metal -b 4 -t 256 -x 20 -v 10 -m 2 -s 0 "${data[@]}"
run train-gpt2 "$PYTHON" train.py --model d12 --backend metal -b 4 -t 256 -x 20 -v 10 -m 2 -s 0 "${data[@]}"

# 4. speed against PyTorch (mps) and MLX on the same Mac
run bench "$PYTHON" dev/metal/bench_metal.py -e 12 -b 4 -t 1024 --precision all --json "$OUT/bench.json"

# 5. the matmul's variants, checked and timed on the GPU
run ab-matmul "$PYTHON" dev/metal/ab.py matmul --backend metal

# 6. half precision, every kernel call against the CPU's table of that precision
for precision in fp16 bf16; do
    run "check-gpt2-$precision" "$PYTHON" test_gpt2.py --backend check:metal --precision "$precision"
    passed "check-gpt2-$precision"
    run "check-llama-$precision" "$PYTHON" test_llama2.py --backend check:metal --precision "$precision"
    passed "check-llama-$precision"
done
echo "check_and_time.sh: done; logs and bench.json in $OUT/ (record the bench table in dev/BENCHMARKS.md)"
