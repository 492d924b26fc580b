// accel/emu/tests/msl_half.cpp — msl_half.h's conversions and arithmetic over arrays, for
// tests/test_metal_half.py (ctypes) to compare with NumPy's float16 and kernels/bf16.pxd.
#include <cstddef>
#include <cstdint>

#include "../msl_half.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT void floats_to_half(uint16_t* out, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = half(in[i]).bits;
}
EXPORT void halves_to_float(float* out, const uint16_t* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = float(half::from_bits(in[i]));
}
EXPORT void floats_to_bfloat(uint16_t* out, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = bfloat(in[i]).bits;
}
EXPORT void bfloats_to_float(float* out, const uint16_t* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = float(bfloat::from_bits(in[i]));
}
// op 0: a + b, 1: a * b, 2: a - b, 3: a / b, each of two halves (a half result)
EXPORT void half_arithmetic(uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n, int op) {
    for (size_t i = 0; i < n; ++i) {
        const half x = half::from_bits(a[i]), y = half::from_bits(b[i]);
        const half r = op == 0 ? x + y : op == 1 ? x * y : op == 2 ? x - y : x / y;
        out[i] = r.bits;
    }
}
