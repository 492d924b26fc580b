# A vectorisable expf for the CPU kernels (GELU, softmax, attention).
# libm's expf and tanhf are function calls, so a loop that calls them runs one element at a
# time (GCC only swaps in the SIMD versions from libmvec under -ffast-math, which this project
# does not use).  This one is plain arithmetic that the compiler inlines and vectorises:
#   exp(x) = 2^n * exp(r),  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]
# r is formed with two fused multiply-adds (ln 2 split in a high and a low part: Cody-Waite),
# which -fassociative-math cannot reorder; exp(r) is Cephes' degree-5 minimax polynomial
# (about 1 ulp); 2^n is built in the float's exponent bits.  Inputs are clamped to the range
# where the result is a normal float, so it returns 0-ish/huge instead of 0/inf at the ends:
# every caller here feeds it either x <= 0 (softmax) or uses it as 1 / (1 + exp(x)).
from libc.math cimport fmaf, floorf
from libc.stdint cimport int32_t
from libc.string cimport memcpy

cdef inline float vexpf(float x) noexcept nogil:
    cdef float n, r, p, scale
    cdef int32_t bits
    x = min(max(x, <float>-87.0), <float>88.0)
    n = floorf(x * <float>1.44269504088896341 + <float>0.5)
    r = fmaf(n, <float>-0.693359375, x)
    r = fmaf(n, <float>2.12194440e-4, r)
    p = <float>1.9875691500e-4
    p = fmaf(p, r, <float>1.3981999507e-3)
    p = fmaf(p, r, <float>8.3334519073e-3)
    p = fmaf(p, r, <float>4.1665795894e-2)
    p = fmaf(p, r, <float>1.6666665459e-1)
    p = fmaf(p, r, <float>5.0000001201e-1)
    p = fmaf(p, r * r, r) + <float>1.0
    bits = (<int32_t>n + 127) << 23
    memcpy(&scale, &bits, sizeof(float))
    return p * scale
