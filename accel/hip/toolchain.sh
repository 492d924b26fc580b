#!/usr/bin/env bash
# accel/hip/toolchain.sh — what accel/hip/Makefile asks about the machine's GPU toolchains.
#   toolchain.sh cublas-include     the folder holding cublas_v2.h
#   toolchain.sh cublas-library     the libcublas shared library to link
#   toolchain.sh amd-archs ARCH...  those of the AMD targets that this hipcc compiles for (the
#                                   others, and why, on stderr)
#   toolchain.sh hipblas-include    the folder holding hipblas/hipblas.h, if ROCm has one
#   toolchain.sh nccl-include       the folder holding nccl.h (NVIDIA's collectives)
#   toolchain.sh nccl-library       the libnccl shared library to link
#   toolchain.sh rccl-include       the folder holding rccl/rccl.h, if ROCm has one
#   toolchain.sh amd-bf16 ARCH      whether this hipcc has HIP's bf16 type (hip/hip_bf16.h, ROCm 6),
#                                   which the bf16 build needs (exit 1, and why on stderr, if not)
# cuBLAS is looked for in $CUBLAS_HOME, beside nvcc (the CUDA toolkit), then in the PyPI wheels
# (nvidia-cublas for CUDA 13, nvidia-cublas-cu12 for CUDA 12). Prints nothing and exits 1 when
# there is none. NCCL likewise: $NCCL_HOME, beside nvcc, then the PyPI wheels (nvidia-nccl-cu13,
# nvidia-nccl-cu12, both in nvidia/nccl).
set -euo pipefail
PYTHON=${PYTHON:-python3}

# the CUDA toolkit's root, from nvcc itself (it may be a wrapper script elsewhere)
toolkit_root() {
    if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
        local nvcc
        nvcc=$(command -v "${NVCC:-nvcc}")
        "$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1
    fi
}

# the folders of these Python packages (the PyPI wheels' nvidia.*)
wheel_homes() {
    "$PYTHON" - "$@" <<'EOF' 2>/dev/null || true
import importlib, sys
for name in sys.argv[1:]:
    try:
        for path in importlib.import_module(name).__path__:
            print(path)
    except ImportError:
        pass
EOF
}

cublas_homes() {
    [ -n "${CUBLAS_HOME:-}" ] && echo "$CUBLAS_HOME"
    toolkit_root
    wheel_homes nvidia.cu13 nvidia.cublas
}

nccl_homes() {
    [ -n "${NCCL_HOME:-}" ] && echo "$NCCL_HOME"
    toolkit_root
    wheel_homes nvidia.nccl
}

# include_of HEADER HOME...: the first HOME/include holding HEADER (status 1: none)
include_of() {
    local header=$1 home
    shift
    for home in "$@"; do
        [ -f "$home/include/$header" ] && { echo "$home/include"; return 0; }
    done
    return 1
}

# library_of NAME HOME...: the first NAME.so (or NAME.so.N) in a HOME's lib64 or lib (status 1: none)
library_of() {
    local name=$1 home lib
    shift
    for home in "$@"; do
        for lib in "$home/lib64/$name.so" "$home/lib/$name.so" "$home"/lib/"$name".so.[0-9]*; do
            [ -f "$lib" ] && { echo "$lib"; return 0; }
        done
    done
    return 1
}

case "${1:-}" in
cublas-include) include_of cublas_v2.h $(cublas_homes) ;;
cublas-library) library_of libcublas $(cublas_homes) ;;
amd-archs)
    shift
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    printf '#include <hip/hip_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n' > "$probe/probe.hip"
    found=()
    for arch in "$@"; do
        if why=$(HIP_PLATFORM=amd "${HIPCC:-hipcc}" --offload-arch="$arch" -c "$probe/probe.hip" -o "$probe/probe.o" 2>&1); then
            found+=("$arch")
        else
            echo "accel/hip: this hipcc cannot build for $arch: $(echo "$why" | grep -m1 error || echo "$why" | head -1)" >&2
        fi
    done
    [ ${#found[@]} -gt 0 ] || exit 1
    echo "${found[@]}" ;;
amd-bf16)
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    printf '#include <hip/hip_runtime.h>\n#include <hip/hip_bf16.h>\n__global__ void k(__hip_bfloat16* x) { x[0] = __float2bfloat16(1.0f); }\n' > "$probe/probe.hip"
    if ! why=$(HIP_PLATFORM=amd "${HIPCC:-hipcc}" --offload-arch="$2" -c "$probe/probe.hip" -o "$probe/probe.o" 2>&1); then
        echo "accel/hip: this hipcc has no HIP bf16 type (hip/hip_bf16.h, ROCm 6 and later): $(echo "$why" | grep -m1 error || echo "$why" | head -1)" >&2
        exit 1
    fi ;;
nccl-include) include_of nccl.h $(nccl_homes) ;;
nccl-library) library_of libnccl $(nccl_homes) ;;
rccl-include)
    for root in "${ROCM_PATH:-/opt/rocm}" /usr; do
        [ -f "$root/include/rccl/rccl.h" ] && { echo "$root/include"; exit 0; }
    done
    exit 1 ;;
hipblas-include)
    for root in "${ROCM_PATH:-/opt/rocm}" /usr; do
        [ -f "$root/include/hipblas/hipblas.h" ] && { echo "$root/include"; exit 0; }
    done
    exit 1 ;;
*)
    echo "usage: $0 cublas-include | cublas-library | nccl-include | nccl-library | rccl-include | amd-archs ARCH... | amd-bf16 ARCH | hipblas-include" >&2
    exit 2 ;;
esac
