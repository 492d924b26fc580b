#!/usr/bin/env bash
# dev/gpu/check_and_time.sh — the HIP backend on a lent GPU machine: build it, check GPT-2's and
# Llama's parity on it, train 20 steps of each, time a step against PyTorch and llm.c on the same
# GPU. For a machine with an NVIDIA GPU, its nvcc, Python with NumPy, Cython and PyTorch for that
# GPU (or hipcc and an AMD GPU, HIP_PLATFORM=amd), that reaches no package index: it fetches
# nothing. What it lacks of requirements.txt's required packages comes as wheels (dev/gpu/wheels.txt
# lists them, under 10 MB), llm.c as a checkout; both travel with the run (dev/gpu/README.md).
#
#   bash dev/gpu/check_and_time.sh --download   HERE, with an index: pip download the wheels into
#                                               $WHEELS (PLATFORM: manylinux2014_x86_64 by default)
#   bash dev/gpu/check_and_time.sh              THERE: the steps below, logs in $OUT (default out_gpu/)
#   DRY_RUN=1 bash dev/gpu/check_and_time.sh    print the steps and check the tools, run nothing
#   STEPS="wheels build-product" bash ...       only the steps named (two device calls: see README)
#
# Settings: PYTHON (python3), OUT (out_gpu), WHEELS (dev/gpu/wheels), LLMC_DIR (shared/llm.c: llm.c's
# checkout; where there is none its rows are left out, said in one line), NVCC_ARCH (sm_XY from
# nvidia-smi's compute capability, else native), BENCH_FLAGS (more bench_gpu.py flags, e.g.
# "--no-compile --steps 5" where device time is short).
#   wheels            pip install --no-index --find-links $WHEELS -r dev/gpu/wheels.txt (what is missing)
#   build-product     make train_gpt2 with PIP_NO_INDEX=1: the optional packages (MKL, ...) skipped in a line
#   build-hip         make hip NVCC_ARCH=...: both precisions, against cuBLAS beside nvcc (or PyTorch's
#                     nvidia-cublas wheel)
#   build-llmc        llm.c's train_gpt2_fp32.cu and train_gpt2.cu (PRECISION=BF16, no cuDNN):
#                     dev/gpu/llmc_peer.py build
#   reference-gpt2    a fresh d12 (GPT-2 124M shapes, random init) written by PyTorch on the CPU at B=4, T=64
#   parity-gpt2       test_gpt2.py --backend hip on it, fp32; parity-gpt2-bf16 at --precision bf16
#   reference-llama   a fresh stories110M likewise (train_llama2_torch.py)
#   parity-llama      test_llama2.py --backend hip on it, fp32; parity-llama-bf16 at bf16
#   data              tinyshakespeare for GPT-2 where it can be prepared offline; random tokens (ids under
#                     32000, both vocabularies') otherwise and for Llama
#   train-gpt2        20 steps of train.py --backend hip -e d12 at B=8, T=1024, bf16
#   train-llama       20 steps of train.py --model stories110M --backend hip at B=8, T=1024, bf16
#   bench-gpt2        dev/gpu/bench_gpu.py: d12 at B=8, T=1024, fp32 and bf16, against PyTorch eager and
#                     torch.compile (fp32, bf16 autocast) and llm.c: the ratios and issue 22's targets
#   bench-llama       the same for stories110M (PyTorch only)
# Stops at the first failing step with its log's tail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-out_gpu}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
WHEELS=${WHEELS:-dev/gpu/wheels}
LLMC_DIR=${LLMC_DIR:-shared/llm.c}
ALL_STEPS="wheels build-product build-hip build-llmc reference-gpt2 parity-gpt2 parity-gpt2-bf16 reference-llama
parity-llama parity-llama-bf16 data train-gpt2 train-llama bench-gpt2 bench-llama"
STEPS=${STEPS:-$ALL_STEPS}

if [ "${1:-}" = --download ]; then
    mkdir -p "$WHEELS"
    (set -x; "$PYTHON" -m pip download --only-binary=:all: --no-deps --platform "${PLATFORM:-manylinux2014_x86_64}" \
        -d "$WHEELS" -r dev/gpu/wheels.txt)
    du -ch "$WHEELS"/*.whl | tail -1
    exit 0
fi
for step in $STEPS; do
    [[ " $(echo $ALL_STEPS) " == *" $step "* ]] ||
        { echo "check_and_time.sh: no step '$step' (steps: $(echo $ALL_STEPS))" >&2; exit 2; }
done
mkdir -p "$OUT"
# nothing below reaches a package index: pip finds only the wheels brought along
case "$WHEELS" in /*) find_links=$WHEELS ;; *) find_links=$ROOT/$WHEELS ;; esac
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$find_links" PIP_DISABLE_PIP_VERSION_CHECK=1

# run NAME COMMAND...: the command with its output in $OUT/NAME.log (and on the terminal), when
# NAME is one of $STEPS
run() {
    local name=$1
    shift
    [[ " $(echo $STEPS) " == *" $name "* ]] || return 0
    echo "== $name: $*"
    [ "$DRY_RUN" = 1 ] && return 0
    if ! "$@" 2>&1 | tee "$OUT/$name.log"; then
        echo "check_and_time.sh: step '$name' failed (log: $OUT/$name.log)" >&2
        exit 1
    fi
}

# the tools, said in one line each: what is missing makes the run stop before it starts
missing=0
arch=${NVCC_ARCH:-}
if command -v nvcc >/dev/null && [ "${HIP_PLATFORM:-nvidia}" = nvidia ]; then
    echo "compiler: $(nvcc --version | tail -1)"
    if command -v nvidia-smi >/dev/null &&
        gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1); then
        echo "GPU: $gpu"
        cap=$(echo "$gpu" | cut -d, -f2 | tr -d ' .')
        [ -n "$arch" ] || arch=sm_$cap
    else
        echo "check_and_time.sh: no NVIDIA GPU here (nvidia-smi)" >&2
        missing=1
    fi
    arch=${arch:-native}
    if cublas=$(accel/hip/toolchain.sh cublas-library) && accel/hip/toolchain.sh cublas-include >/dev/null; then
        echo "cuBLAS: $cublas"
    else
        echo "check_and_time.sh: no cuBLAS beside nvcc or in PyTorch's nvidia-cublas wheel; the nvidia-cublas" \
             "wheel (444 MB) is over what a run carries: use a machine whose CUDA toolkit has cuBLAS" >&2
        missing=1
    fi
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
    echo "check_and_time.sh: PyTorch that sees the GPU is needed (the references and the timing)" >&2
    missing=1
fi
wheels=$(find "$WHEELS" -maxdepth 1 -name '*.whl' 2>/dev/null | wc -l)
echo "wheels: $wheels in $WHEELS (dev/gpu/wheels.txt; pip reaches no index)"
llmc=()
if [ -f "$LLMC_DIR/train_gpt2.cu" ] && [ -f "$LLMC_DIR/train_gpt2_fp32.cu" ]; then
    echo "llm.c: $LLMC_DIR"
    llmc=(--llmc "$LLMC_DIR")
else
    echo "llm.c: no checkout at $LLMC_DIR (LLMC_DIR): its build and its rows in the timing are left out"
    STEPS=$(echo " $(echo $STEPS) " | sed 's/ build-llmc / /')
fi
# the steps that need neither the GPU nor PyTorch (dev/gpu/bare_box.py runs them on a CPU machine)
gpu_steps=$(echo " $(echo $STEPS) " | sed 's/ wheels / /; s/ build-product / /; s/ data / /' | tr -d ' ')
if [ "$missing" = 1 ] && [ -n "$gpu_steps" ]; then
    [ "$DRY_RUN" = 1 ] && echo "(dry run: the steps that would run)" || exit 1
fi

# 1. build: the wheels, the product (optional packages skipped), the GPU library, llm.c
run wheels "$PYTHON" -m pip install --no-index --find-links "$WHEELS" -r dev/gpu/wheels.txt
run build-product make train_gpt2 PYTHON="$PYTHON"
run build-hip make hip PYTHON="$PYTHON" NVCC_ARCH="${arch:-native}"
run build-llmc env GPU_COMPUTE_CAPABILITY="${cap:-}" "$PYTHON" dev/gpu/llmc_peer.py build --llmc "$LLMC_DIR"

# 2. parity on fresh references, both families, both precisions
parity() {   # parity NAME SCRIPT ARGS...: the step, then its verdict
    run "$@"
    [[ " $(echo $STEPS) " == *" $1 "* ]] || return 0
    [ "$DRY_RUN" = 1 ] || grep -q "overall okay: 1" "$OUT/$1.log" ||
        { echo "check_and_time.sh: $1 failed" >&2; exit 1; }
}
threads=(env OMP_NUM_THREADS="$(nproc)")
run reference-gpt2 "${threads[@]}" "$PYTHON" train_gpt2_torch.py -e d12 -b 4 -t 64 -o "$OUT" --name gpt2_d12
gpt2=(--model "$OUT/gpt2_d12.bin" --state "$OUT/gpt2_d12_debug_state.bin")
parity parity-gpt2 "$PYTHON" test_gpt2.py --backend hip "${gpt2[@]}"
parity parity-gpt2-bf16 "$PYTHON" test_gpt2.py --backend hip --precision bf16 "${gpt2[@]}"
run reference-llama "${threads[@]}" "$PYTHON" train_llama2_torch.py -e stories110M -b 4 -t 64 -o "$OUT" \
    --name llama2_stories110M
llama=(--model "$OUT/llama2_stories110M.bin" --state "$OUT/llama2_stories110M_debug_state.bin")
parity parity-llama "$PYTHON" test_llama2.py --backend hip "${llama[@]}"
parity parity-llama-bf16 "$PYTHON" test_llama2.py --backend hip --precision bf16 "${llama[@]}"

# 3. training, 20 steps of each family at B=8, T=1024, bf16: tinyshakespeare for GPT-2 where it
# can be prepared (no network), random tokens otherwise and for Llama (ids under 32000)
gpt2_data=(-i dev/data/tinyshakespeare/tiny_shakespeare_train.bin -j dev/data/tinyshakespeare/tiny_shakespeare_val.bin)
random_data=(-i "$OUT/random_train.bin" -j "$OUT/random_val.bin")
run data "$PYTHON" - "$OUT" <<'EOF'
import subprocess, sys
import numpy as np
from llmc.data_prep import write_datafile
rng = np.random.default_rng(0)
for split, n in (("train", 400_000), ("val", 40_000)):
    write_datafile(f"{sys.argv[1]}/random_{split}.bin", rng.integers(0, 32000, n).tolist())
if subprocess.run([sys.executable, "dev/data/tinyshakespeare.py"]).returncode != 0:
    print("tinyshakespeare cannot be prepared here: GPT-2 trains on the random tokens")
EOF
[ -f "${gpt2_data[1]}" ] || gpt2_data=("${random_data[@]}")
train=(--backend hip -b 8 -t 1024 -x 20 -v 10 -m 2 -s 0 --precision bf16)
run train-gpt2 "$PYTHON" train.py -e d12 "${train[@]}" "${gpt2_data[@]}" -o "$OUT/train_gpt2"
run train-llama "$PYTHON" train.py --model stories110M "${train[@]}" "${random_data[@]}" -o "$OUT/train_llama"

# 4. speed against PyTorch and llm.c on the same GPU
bench=(-b 8 -t 1024 ${BENCH_FLAGS:-})
run bench-gpt2 "$PYTHON" dev/gpu/bench_gpu.py -e 12 "${bench[@]}" "${llmc[@]}" --json "$OUT/bench_gpt2.json"
run bench-llama "$PYTHON" dev/gpu/bench_gpu.py --model stories110M "${bench[@]}" --json "$OUT/bench_llama.json"
echo "check_and_time.sh: done; logs and bench_*.json in $OUT/ (record the bench tables in dev/BENCHMARKS.md)"
