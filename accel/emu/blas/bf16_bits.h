// accel/emu/blas/bf16_bits.h — bf16 as its bits (the upper half of a float32), for the emulated
// hipBLAS and hipBLASLt: widening is exact; narrowing rounds to nearest even, as the GPUs do.
#pragma once

#include <cstdint>
#include <cstring>

namespace emu_blas {

inline float bf16_to_float(uint16_t b) {
    const uint32_t bits = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// float32 to bf16, to nearest even (a NaN stays a quiet NaN)
inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
    return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace emu_blas
