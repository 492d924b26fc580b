// accel/emu/tests/atomics.hip — atomicAdd (int, float) and atomicMax (int) from every thread of
// a grid, into global and shared memory. Prints the totals; exits 1 when one is wrong.
#include <hip/hip_runtime.h>

#include <cstdio>

// totals: [0] count of threads, [1] histogram bins 0..7 follow at 2..9; sum_half: 0.5 per thread
// (exact in float at any order); largest: max of a scrambled index.
__global__ void accumulate(int* totals, float* sum_half, int* largest, int n) {
    __shared__ int block_count;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    if (i < n) {
        atomicAdd(&block_count, 1);
        atomicAdd(&totals[2 + i % 8], 1);
        atomicAdd(sum_half, 0.5f);
        atomicMax(largest, (i * 7919) % n);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(&totals[0], block_count);
}

int main() {
    const int n = 1000, threads = 96, blocks = (n + threads - 1) / threads;
    int *totals, *largest;
    float* sum_half;
    hipMalloc(&totals, 10 * sizeof(int));
    hipMalloc(&largest, sizeof(int));
    hipMalloc(&sum_half, sizeof(float));
    hipMemset(totals, 0, 10 * sizeof(int));
    hipMemset(largest, 0, sizeof(int));
    hipMemset(sum_half, 0, sizeof(float));
    hipLaunchKernelGGL(accumulate, dim3(blocks), dim3(threads), 0, 0, totals, sum_half, largest, n);
    if (hipDeviceSynchronize() != hipSuccess) return 3;
    bool ok = totals[0] == n && *sum_half == 0.5f * n && *largest == n - 1;
    std::printf("count %d sum %g max %d bins", totals[0], *sum_half, *largest);
    for (int b = 0; b < 8; ++b) {
        std::printf(" %d", totals[2 + b]);
        ok &= totals[2 + b] == n / 8;
    }
    std::printf("\n");
    return ok ? 0 : 1;
}
