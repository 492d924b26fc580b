// accel/emu/tests/warp_reduce.hip — warp collectives: a block sum by shuffles, a warp scan, a
// ballot count; and two sums that assume 32 lanes. Usage: warp_reduce correct|offsets-from-16|mask-32
// Prints the results; exits 1 when they are wrong, 3 when the emulator reported a fault.
#include <hip/hip_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

enum class Variant { correct, offsets_from_16, mask_32 };

template <Variant VARIANT>
__device__ float warp_sum(float v) {
    if constexpr (VARIANT == Variant::offsets_from_16)
        for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor(v, offset);
    else if constexpr (VARIANT == Variant::mask_32)
        for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    else
        for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_xor(v, offset);
    return v;
}

// Block sum: each warp reduces by shuffles, warp 0 reduces the warps' partial sums.
template <Variant VARIANT>
__global__ void block_sum(float* sums, const float* in) {
    __shared__ float warp_partials[1024];  // one per warp, for any warp size
    const int t = threadIdx.x, lane = t % warpSize, warp = t / warpSize;
    const int warps = blockDim.x / warpSize;
    float v = warp_sum<VARIANT>(in[blockIdx.x * blockDim.x + t]);
    if (lane == 0) warp_partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? warp_partials[lane] : 0.0f;
        for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_down(v, offset);
        if (lane == 0) sums[blockIdx.x] = v;
    }
}

// Inclusive prefix sum within each warp by __shfl_up, plus the warp's total broadcast by __shfl;
// and the number of positive inputs per warp by __ballot.
__global__ void warp_scan(float* scan, float* totals, int* positives, const float* in) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = __lane_id();
    float v = in[i];
    for (int offset = 1; offset < warpSize; offset *= 2) {
        const float up = __shfl_up(v, offset);
        if (lane >= offset) v += up;
    }
    scan[i] = v;
    totals[i] = __shfl(v, warpSize - 1);
    const unsigned long long ballot = __ballot(in[i] > 0.0f);
    if (lane == 0) positives[i / warpSize] = __popcll(ballot);
}

template <class T>
T* device_copy(const std::vector<T>& host) {
    T* p;
    hipMalloc(&p, host.size() * sizeof(T));
    hipMemcpy(p, host.data(), host.size() * sizeof(T), hipMemcpyHostToDevice);
    return p;
}

template <class T>
std::vector<T> host_copy(const T* device, size_t n) {
    std::vector<T> host(n);
    hipMemcpy(host.data(), device, n * sizeof(T), hipMemcpyDeviceToHost);
    return host;
}

template <class T>
bool report(const char* label, const std::vector<T>& got, const std::vector<T>& expected) {
    std::printf("%s:", label);
    for (T v : got) std::printf(" %g", double(v));
    std::printf("\n");
    return got == expected;
}

template <Variant VARIANT>
bool check_block_sum() {
    const int threads = 256, blocks = 3, n = threads * blocks;
    std::vector<float> in(n), expected(blocks, 0.0f);
    for (int i = 0; i < n; ++i) expected[i / threads] += in[i] = float(i % 11 - 5);
    float* d_in = device_copy(in);
    float* d_sums = device_copy(std::vector<float>(blocks));
    hipLaunchKernelGGL(block_sum<VARIANT>, dim3(blocks), dim3(threads), 0, 0, d_sums, d_in);
    if (hipDeviceSynchronize() != hipSuccess) std::exit(3);
    return report("block_sum", host_copy(d_sums, blocks), expected);
}

bool check_warp_scan() {
    const int threads = 128, blocks = 2, n = threads * blocks, warp = warpSize;
    std::vector<float> in(n), scan(n), totals(n);
    std::vector<int> positives(n / warp, 0);
    for (int i = 0; i < n; ++i) in[i] = float(i % 7 - 2);
    for (int i = 0; i < n; ++i) {
        scan[i] = in[i] + (i % warp ? scan[i - 1] : 0.0f);
        positives[i / warp] += in[i] > 0;
    }
    for (int i = 0; i < n; ++i) totals[i] = scan[i / warp * warp + warp - 1];
    float *d_in = device_copy(in), *d_scan = device_copy(scan), *d_totals = device_copy(totals);
    int* d_positives = device_copy(positives);
    hipLaunchKernelGGL(warp_scan, dim3(blocks), dim3(threads), 0, 0, d_scan, d_totals, d_positives, d_in);
    if (hipDeviceSynchronize() != hipSuccess) std::exit(3);
    bool ok = report("scan", host_copy(d_scan, n), scan);
    ok &= report("totals", host_copy(d_totals, n), totals);
    return ok & report("positives", host_copy(d_positives, n / warp), positives);
}

int main(int argc, char** argv) {
    const char* variant = argc > 1 ? argv[1] : "correct";
    bool ok;
    if (!std::strcmp(variant, "correct"))
        ok = check_block_sum<Variant::correct>() & check_warp_scan();
    else if (!std::strcmp(variant, "offsets-from-16"))
        ok = check_block_sum<Variant::offsets_from_16>();
    else if (!std::strcmp(variant, "mask-32"))
        ok = check_block_sum<Variant::mask_32>();
    else {
        std::fprintf(stderr, "unknown variant %s\n", variant);
        return 2;
    }
    return ok ? 0 : 1;
}
