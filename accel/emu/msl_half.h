// accel/emu/msl_half.h — MSL's 16-bit floating types for the CPU emulator: `half` (IEEE binary16)
// and `bfloat` (bfloat16, MSL 3.1), as 16 bits of storage with the GPU's rounding, in software
// (no reliance on the host compiler's _Float16).
//
//   float -> half     to nearest, ties to even; subnormal halves kept (down to 2^-24), |x| >=
//                     65520 overflows to infinity; a NaN stays a (quiet) NaN
//   float -> bfloat   to nearest, ties to even (kernels/bf16.pxd's float_to_bf16, bit for bit)
//   widening          exact (an implicit conversion to float, as in MSL)
//   half op half      computed in float and rounded once to half: float's 24 bits are at least
//                     2 x 11 + 2, so that is the correctly rounded half result (the same for bfloat)
//   half op float     float (MSL promotes to float too)
//
// Narrowing is explicit here (`half(x)`, `bfloat(x)`), where MSL also converts implicitly: an
// assignment of a float to a half element that forgets to say so does not compile in the
// emulator, so every rounding a kernel does is one it writes.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "blas/bf16_bits.h"   // bfloat's conversions: the emulated hipBLAS's bf16 ones

namespace emu_msl {

inline uint32_t float_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

inline float bits_float(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// IEEE binary16 from float, to nearest even.
inline uint16_t half_bits_of(float f) {
    const uint32_t x = float_bits(f), sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));  // NaN, quiet
    if (magnitude >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // 65520 and up (ties to even): infinity
    if (magnitude >= 0x38800000u) {                                    // a normal half (2^-14 and up)
        const uint32_t rebiased = magnitude - 0x38000000u;            // exponent bias 127 -> 15
        return uint16_t(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
    }
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return uint16_t(sign);                         // below 2^-25: zero
    // a subnormal half: k 2^-24, k the float's significand shifted right, rounded to nearest even
    // (k = 1024 is the smallest normal, whose bits follow on)
    const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u, shift = 126 - exponent;
    return uint16_t(sign | ((significand + (1u << (shift - 1)) - 1u + ((significand >> shift) & 1u)) >> shift));
}

// float from IEEE binary16, exactly.
inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        const float magnitude = float(mantissa) * 0x1p-24f;   // exact: a subnormal half
        return bits_float(sign | float_bits(magnitude));
    }
    return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// A 16-bit floating type: Traits::narrow(float) -> bits, Traits::widen(bits) -> float.
template <class Traits>
struct float16_storage {
    uint16_t bits;   // uninitialised, as a scalar: threadgroup memory's poison (0xFFFF) is a NaN

    float16_storage() = default;
    template <class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>
    explicit float16_storage(S value) : bits(Traits::narrow(float(value))) {}
    operator float() const { return Traits::widen(bits); }

    static float16_storage from_bits(uint16_t b) {
        float16_storage x;
        x.bits = b;
        return x;
    }
    friend float16_storage operator+(float16_storage a, float16_storage b) { return float16_storage(float(a) + float(b)); }
    friend float16_storage operator-(float16_storage a, float16_storage b) { return float16_storage(float(a) - float(b)); }
    friend float16_storage operator*(float16_storage a, float16_storage b) { return float16_storage(float(a) * float(b)); }
    friend float16_storage operator/(float16_storage a, float16_storage b) { return float16_storage(float(a) / float(b)); }
    friend float16_storage operator-(float16_storage a) { return from_bits(uint16_t(a.bits ^ 0x8000u)); }
    float16_storage& operator+=(float16_storage b) { return *this = *this + b; }
    float16_storage& operator-=(float16_storage b) { return *this = *this - b; }
    float16_storage& operator*=(float16_storage b) { return *this = *this * b; }
    float16_storage& operator/=(float16_storage b) { return *this = *this / b; }
};

struct half_traits {
    static uint16_t narrow(float f) { return half_bits_of(f); }
    static float widen(uint16_t b) { return half_to_float(b); }
};
struct bfloat_traits {
    static uint16_t narrow(float f) { return emu_blas::float_to_bf16(f); }   // kernels/bf16.pxd's rounding
    static float widen(uint16_t b) { return emu_blas::bf16_to_float(b); }
};

// the MSL floating types: float, half, bfloat
template <class T>
inline constexpr bool is_msl_float = std::is_floating_point_v<T> ||
                                     std::is_same_v<T, float16_storage<half_traits>> ||
                                     std::is_same_v<T, float16_storage<bfloat_traits>>;

}  // namespace emu_msl

using half = emu_msl::float16_storage<emu_msl::half_traits>;
using bfloat = emu_msl::float16_storage<emu_msl::bfloat_traits>;
static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2 && std::is_trivially_copyable_v<half>, "16 bits of storage");
