// accel/emu/tests/msl_features.metal — sample kernels for the emulator's MSL front-end: the parts
// of msl_emu.h and msl_runtime.cpp that gpt2.metal does not use (atomics, the simd shuffles,
// vector types, half, dynamic threadgroup memory, 3-D non-uniform grids, simdgroup matrices). Driven through the
// C ABI by tests/test_metal_emu.py.
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

// counts[0] += 1 per thread, counts[1] = the largest thread index, through atomics.
kernel void count(device atomic_uint* counts [[buffer(0)]],
                  uint i [[thread_position_in_grid]]) {
    atomic_fetch_add_explicit(&counts[0], 1u, memory_order_relaxed);
    atomic_fetch_max_explicit(&counts[1], i, memory_order_relaxed);
}

// Per lane: out[4i..4i+3] = the shuffles of the lane index across its simdgroup.
kernel void shuffles(device float4* out [[buffer(0)]],
                     uint i [[thread_position_in_grid]],
                     uint lane [[thread_index_in_simdgroup]],
                     uint width [[threads_per_simdgroup]]) {
    float x = float(lane);
    float4 r = float4(simd_shuffle_down(x, 1u), simd_shuffle_up(x, 1u), simd_shuffle_xor(x, 1u),
                      simd_broadcast(x, 0u));
    out[i] = r + float4(0.0f, 0.0f, 0.0f, simd_sum(1.0f) - float(width));  // .w: 0 in a full simdgroup
}

// out = a * b + c through half precision and back; dot products of float3.
kernel void vectors(device float* out [[buffer(0)]],
                    device const float* a [[buffer(1)]],
                    constant float& c [[buffer(2)]],
                    uint i [[thread_position_in_grid]]) {
    half h = half(a[i]) * half(2.0f);
    float3 v = float3(a[i], 1.0f, 2.0f);
    out[i] = float(h) + dot(v, v) + c;
}

// Reverses each threadgroup's slice of x through dynamic threadgroup memory.
kernel void reverse(device float* out [[buffer(0)]],
                    device const float* x [[buffer(1)]],
                    threadgroup float* scratch [[threadgroup(0)]],
                    uint i [[thread_position_in_grid]],
                    uint t [[thread_position_in_threadgroup]],
                    uint n [[threads_per_threadgroup]]) {
    scratch[t] = x[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[i] = scratch[n - 1 - t];
}

// out[z][y][x] = the flat grid position, written once per thread of a 3-D grid; sizes[...] =
// the threadgroup size seen by the thread (smaller at the grid's far edges).
kernel void positions(device uint* out [[buffer(0)]],
                      device uint* sizes [[buffer(1)]],
                      uint3 pos [[thread_position_in_grid]],
                      uint3 grid [[threads_per_grid]],
                      uint3 group_size [[threads_per_threadgroup]]) {
    uint flat = (pos.z * grid.y + pos.y) * grid.x + pos.x;
    out[flat] += flat + 1;
    sizes[flat] = group_size.x * group_size.y * group_size.z;
}

// out (8,8) = a (8,8) b (8,8) + c (8,8) through simdgroup matrices, one simdgroup; `skip` >= 0:
// that lane skips the load of b (a fault the emulator must report).
kernel void simdgroup_product(device float* out [[buffer(0)]],
                              device const float* a [[buffer(1)]],
                              device const float* b [[buffer(2)]],
                              device const float* c [[buffer(3)]],
                              constant int& skip [[buffer(4)]],
                              uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 am, bm, cm;
    simdgroup_load(am, a, 8);
    if (int(lane) != skip) simdgroup_load(bm, b, 8);
    simdgroup_load(cm, c, 8, ulong2(0, 0), true);   // c transposed
    simdgroup_multiply_accumulate(cm, am, bm, cm);
    simdgroup_store(cm, out, 8);
}
