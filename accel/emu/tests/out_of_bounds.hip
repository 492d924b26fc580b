// accel/emu/tests/out_of_bounds.hip — for the AddressSanitizer build: a kernel that stays in
// bounds (shared memory, barriers and shuffles, so fibers switch under ASan) and one that writes
// one element past its output. Usage: out_of_bounds in-bounds|one-past-the-end
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>

__global__ void reverse_block(float* out, const float* in) {
    __shared__ float tile[128];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    tile[t] = in[i];
    __syncthreads();
    out[i] = tile[blockDim.x - 1 - t] + __shfl_xor(tile[t], 1);
}

// The bounds check is off by one: thread n writes out[n].
__global__ void fill_past_the_end(float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;
}

int main(int argc, char** argv) {
    const char* variant = argc > 1 ? argv[1] : "";
    const int n = 256;
    float *in, *out;
    hipMalloc(&in, n * sizeof(float));
    hipMalloc(&out, n * sizeof(float));
    hipMemset(in, 0, n * sizeof(float));
    if (!std::strcmp(variant, "in-bounds"))
        hipLaunchKernelGGL(reverse_block, dim3(n / 128), dim3(128), 0, 0, out, in);
    else if (!std::strcmp(variant, "one-past-the-end"))
        hipLaunchKernelGGL(fill_past_the_end, dim3(3), dim3(128), 0, 0, out, n);
    else {
        std::fprintf(stderr, "unknown variant %s\n", variant);
        return 2;
    }
    hipFree(in);
    hipFree(out);
    return hipDeviceSynchronize() == hipSuccess ? 0 : 3;
}
