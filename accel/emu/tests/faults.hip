// accel/emu/tests/faults.hip — kernels whose barriers or collectives a GPU would hang on or
// silently mis-run; the emulator must report each. Usage: faults early-return|divergent-barriers|exit-before-shuffle
// Exits 3 with the emulator's report on stderr; 0 if the fault went unnoticed.
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>

// Threads past the end leave before the barrier the others wait at.
__global__ void scale_early_return(float* out, const float* in, int n) {
    __shared__ float tile[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    tile[threadIdx.x] = in[i];
    __syncthreads();
    out[i] = 2.0f * tile[blockDim.x - 1 - threadIdx.x];
}

// Odd and even threads wait at different barriers.
__global__ void divergent_barriers(float* out) {
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Lanes past the end leave before the warp shuffle the others wait at.
__global__ void sum_exit_before_shuffle(float* out, int n) {
    const int i = threadIdx.x;
    if (i >= n) return;
    out[i] = __shfl_xor(float(i), 1);
}

int main(int argc, char** argv) {
    const char* variant = argc > 1 ? argv[1] : "";
    float *in, *out;
    hipMalloc(&in, 1024 * sizeof(float));
    hipMalloc(&out, 1024 * sizeof(float));
    hipMemset(in, 0, 1024 * sizeof(float));
    if (!std::strcmp(variant, "early-return"))
        hipLaunchKernelGGL(scale_early_return, dim3(2), dim3(256), 0, 0, out, in, 300);
    else if (!std::strcmp(variant, "divergent-barriers"))
        hipLaunchKernelGGL(divergent_barriers, dim3(1), dim3(64), 0, 0, out);
    else if (!std::strcmp(variant, "exit-before-shuffle"))
        hipLaunchKernelGGL(sum_exit_before_shuffle, dim3(1), dim3(64), 0, 0, out, 20);
    else {
        std::fprintf(stderr, "unknown variant %s\n", variant);
        return 2;
    }
    const hipError_t e = hipGetLastError();
    std::printf("%s\n", hipGetErrorString(e));
    return e == hipSuccess ? 0 : 3;
}
