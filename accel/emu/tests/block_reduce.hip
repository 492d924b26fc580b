// accel/emu/tests/block_reduce.hip — a block sum through shared memory, correct and with a
// planted missing __syncthreads. Usage: block_reduce correct|no-barrier-after-store|no-barrier-in-loop
// Prints the sums; exits 1 when they are wrong, 3 when the emulator reported a fault.
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

enum class Fault { none, no_barrier_after_store, no_barrier_in_loop };

// Each block sums BLOCK consecutive inputs by a tree in static shared memory.
template <int BLOCK, Fault FAULT>
__global__ void block_sum_static(float* sums, const float* in) {
    __shared__ float partial[BLOCK];
    const int t = threadIdx.x;
    partial[t] = in[blockIdx.x * BLOCK + t];
    if constexpr (FAULT != Fault::no_barrier_after_store) __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        if constexpr (FAULT != Fault::no_barrier_in_loop) __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

// The same over dynamic shared memory, for a 2-D block of any power-of-two size.
__global__ void block_sum_dynamic(float* sums, const float* in) {
    HIP_DYNAMIC_SHARED(float, partial)
    const int threads = blockDim.x * blockDim.y;
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    partial[t] = in[blockIdx.x * threads + t];
    __syncthreads();
    for (int stride = threads / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

// Runs `launch` over `blocks` blocks of `block_threads` inputs; prints and checks the sums.
template <class Launch>
bool check_sums(const char* label, int blocks, int block_threads, Launch launch) {
    const int n = blocks * block_threads;
    std::vector<float> host_in(n), host_sums(blocks), expected(blocks, 0.0f);
    for (int i = 0; i < n; ++i) {
        host_in[i] = float(i % 13 - 6);  // small integers: every summation order is exact
        expected[i / block_threads] += host_in[i];
    }
    float *in, *sums;
    hipMalloc(&in, n * sizeof(float));
    hipMalloc(&sums, blocks * sizeof(float));
    hipMemcpy(in, host_in.data(), n * sizeof(float), hipMemcpyHostToDevice);
    launch(sums, in);
    if (hipDeviceSynchronize() != hipSuccess) std::exit(3);
    hipMemcpy(host_sums.data(), sums, blocks * sizeof(float), hipMemcpyDeviceToHost);
    hipFree(in);
    hipFree(sums);
    std::printf("%s:", label);
    for (float s : host_sums) std::printf(" %g", s);
    std::printf("\n");
    return std::memcmp(host_sums.data(), expected.data(), blocks * sizeof(float)) == 0;
}

int main(int argc, char** argv) {
    const char* variant = argc > 1 ? argv[1] : "correct";
    constexpr int BLOCK = 128, BLOCKS = 5;
    auto static_launch = [](auto kernel) {
        return [kernel](float* sums, const float* in) { hipLaunchKernelGGL(kernel, dim3(BLOCKS), dim3(BLOCK), 0, 0, sums, in); };
    };
    bool ok;
    if (!std::strcmp(variant, "correct")) {
        ok = check_sums("static", BLOCKS, BLOCK, static_launch(block_sum_static<BLOCK, Fault::none>));
        ok &= check_sums("dynamic", 3, 64, [](float* sums, const float* in) {
            hipLaunchKernelGGL(block_sum_dynamic, dim3(3), dim3(16, 4), 64 * sizeof(float), 0, sums, in);
        });
    } else if (!std::strcmp(variant, "no-barrier-after-store")) {
        ok = check_sums("static", BLOCKS, BLOCK, static_launch(block_sum_static<BLOCK, Fault::no_barrier_after_store>));
    } else if (!std::strcmp(variant, "no-barrier-in-loop")) {
        ok = check_sums("static", BLOCKS, BLOCK, static_launch(block_sum_static<BLOCK, Fault::no_barrier_in_loop>));
    } else {
        std::fprintf(stderr, "unknown variant %s\n", variant);
        return 2;
    }
    return ok ? 0 : 1;
}
