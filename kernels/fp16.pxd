# IEEE half precision (fp16): sign, 5 exponent bits, 10 mantissa bits, held as uint16_t; the
# largest finite value 65504, subnormals down to 2^-24.  Widening to float32 is exact.
# Narrowing rounds to nearest, ties to even, as NumPy's astype(np.float16), the GPUs' float to
# half conversions (MSL's half(x), CUDA's __float2half_rn): subnormals are kept, what rounds
# past 65504 becomes inf, NaN stays a (quiet) NaN.  Plain integer arithmetic, so the same bits
# on every machine, with or without F16C.
from libc.stdint cimport uint16_t, uint32_t
from kernels.bf16 cimport float_bits
from libc.string cimport memcpy

ctypedef uint16_t fp16


cdef inline float fp16_to_float(fp16 h) noexcept nogil:
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff
    cdef uint32_t bits
    cdef float f
    if exponent == 0:            # zero or subnormal: mantissa * 2^-24, exact in float32
        f = <float>mantissa * 5.9604644775390625e-08
        return -f if sign else f
    if exponent == 31:           # inf, NaN
        bits = sign | 0x7f800000 | (mantissa << 13)
    else:
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13)
    memcpy(&f, &bits, sizeof(float))
    return f


cdef inline fp16 float_to_fp16(float f) noexcept nogil:
    cdef uint32_t bits = float_bits(f)
    cdef uint16_t sign = <uint16_t>((bits >> 16) & 0x8000)
    cdef uint32_t magnitude = bits & 0x7fffffff, exponent, mantissa, shift, rest, half_way, h
    if magnitude > 0x7f800000:                  # NaN
        return sign | 0x7e00 | <uint16_t>((magnitude >> 13) & 0x3ff)
    if magnitude >= 0x477ff000:                 # 65520 and up (inf too): a tie at 65520 goes to even, inf
        return sign | 0x7c00
    if magnitude >= 0x38800000:                 # 2^-14 and up: normal; the rounding may carry into the exponent
        return sign | <uint16_t>((magnitude - 0x38000000 + 0xfff + ((magnitude >> 13) & 1)) >> 13)
    exponent = magnitude >> 23
    if exponent < 102:                          # below 2^-25: rounds to zero
        return sign
    mantissa = (magnitude & 0x7fffff) | 0x800000
    shift = 126 - exponent                      # the subnormal's units of 2^-24
    h = mantissa >> shift
    rest = mantissa & (((<uint32_t>1) << shift) - 1)
    half_way = (<uint32_t>1) << (shift - 1)
    if rest > half_way or (rest == half_way and (h & 1)):
        h += 1
    return sign | <uint16_t>h


# whole arrays, on the OpenMP threads above kernels.parallel's SERIAL_BELOW elements
cdef void widen_fp16(float* out, const fp16* inp, Py_ssize_t n) noexcept nogil
# out (n,) = inp (n,) as float32
cdef void narrow_fp16(fp16* out, const float* inp, Py_ssize_t n) noexcept nogil
# out (n,) = inp (n,) rounded to nearest even
