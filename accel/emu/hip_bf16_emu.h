// accel/emu/hip_bf16_emu.h — bfloat16 for the emulated build: HIP's `__hip_bfloat16` and
// `__hip_bfloat162` (hip/hip_bf16.h), with the conversions a GPU has, exactly.
//
// bf16 is the upper 16 bits of a float32 (sign, 8 exponent bits, 7 mantissa bits). Widening is
// exact; __float2bfloat16 rounds to nearest, ties to even, as the device instruction does
// (NVIDIA's cvt.rn.bf16.f32, AMD's conversion sequence), subnormals kept; a NaN stays a quiet
// NaN (its bit pattern is not specified across devices, so nothing should compare NaN bits).
// The type holds its bits and has no implicit conversions to or from float: a kernel says where
// it widens and where it rounds (on a GPU both types convert implicitly; the emulated build is
// the stricter one, so a missing conversion fails here first).
//
// A .hip file keeps `#include <hip/hip_bf16.h>`; accel/emu/include/hip/hip_bf16.h lands here.
#pragma once

#include <cstdint>
#include <cstring>

struct __hip_bfloat16 {
    uint16_t data;
};

// Two bf16 values in one 4-byte word, as a GPU loads and stores them at once.
struct alignas(4) __hip_bfloat162 {
    __hip_bfloat16 x, y;
};

inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline __hip_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __hip_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__hip_bfloat16 x) { return x.data; }

inline float __bfloat162float(__hip_bfloat16 x) { return __uint_as_float(unsigned(x.data) << 16); }

inline __hip_bfloat16 __float2bfloat16(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __hip_bfloat16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
    return __hip_bfloat16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline float __low2float(__hip_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__hip_bfloat162 v) { return __bfloat162float(v.y); }
inline __hip_bfloat162 __halves2bfloat162(__hip_bfloat16 low, __hip_bfloat16 high) { return __hip_bfloat162{low, high}; }
inline __hip_bfloat162 __floats2bfloat162_rn(float low, float high) {
    return __hip_bfloat162{__float2bfloat16(low), __float2bfloat16(high)};
}
