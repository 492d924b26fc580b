# bfloat16 (bf16): the upper 16 bits of a float32 (sign, 8 exponent bits, 7 mantissa bits),
# held as uint16_t.  Widening to float32 is exact.  Narrowing rounds to nearest, ties to even
# (as PyTorch's .to(torch.bfloat16) and the GPUs' __float2bfloat16_rn), or stochastically:
# up with probability equal to the dropped fraction (llm.c's update of its bf16 parameters, so
# that updates smaller than half a bf16 step are not all lost).  The random bits are a hash of
# the element's index and a seed, so an element rounds the same whichever thread rounds it, and
# a resumed run rounds as the uninterrupted one did.
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

ctypedef uint16_t bf16


cdef inline float bf16_to_float(bf16 x) noexcept nogil:
    cdef uint32_t bits = (<uint32_t>x) << 16
    cdef float f
    memcpy(&f, &bits, sizeof(float))
    return f


cdef inline uint32_t float_bits(float f) noexcept nogil:
    cdef uint32_t bits
    memcpy(&bits, &f, sizeof(float))
    return bits


cdef inline bf16 float_to_bf16(float f) noexcept nogil:
    cdef uint32_t bits = float_bits(f)
    if (bits & 0x7fffffff) > 0x7f800000:        # NaN stays a (quiet) NaN
        return <bf16>((bits >> 16) | 0x40)
    return <bf16>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16)


cdef inline uint32_t noise16(uint64_t index, uint32_t seed) noexcept nogil:
    # 16 uniform bits from (index, seed): for each seed, a bijection of the index's low 32 bits
    # (a multiply by an odd constant, then murmur3's finaliser), 32-bit arithmetic throughout
    # so that it vectorises here and costs a GPU thread little
    cdef uint32_t h = (<uint32_t>index) * <uint32_t>0x9E3779B1
    h += (<uint32_t>(index >> 32)) * <uint32_t>0x85EBCA77 + seed * <uint32_t>0xC2B2AE3D
    h ^= h >> 16
    h *= <uint32_t>0x85EBCA6B
    h ^= h >> 13
    h *= <uint32_t>0xC2B2AE35
    h ^= h >> 16
    return h & 0xffff


cdef inline bf16 float_to_bf16_stochastic(float f, uint64_t index, uint32_t seed) noexcept nogil:
    cdef uint32_t bits = float_bits(f)
    if (bits & 0x7fffffff) > 0x7f800000:
        return <bf16>((bits >> 16) | 0x40)
    return <bf16>((bits + noise16(index, seed)) >> 16)


# A kernel written once for both precisions takes floatX pointers (Cython compiles it once per
# type) and reads and writes its elements through load and store, which compute in float32.
ctypedef fused floatX:
    float
    bf16


cdef inline float load(const floatX* p, Py_ssize_t i) noexcept nogil:
    if floatX is float:
        return p[i]
    else:
        return bf16_to_float(p[i])


cdef inline void store(floatX* p, Py_ssize_t i, float value) noexcept nogil:
    if floatX is float:
        p[i] = value
    else:
        p[i] = float_to_bf16(value)


# A parameter gradient: float32, or bf16 in a model trained with bf16 gradients (llm.c's
# choice; Model(grads="bf16")).  A kernel sums its own contribution in float32 and adds it
# into a bf16 gradient once, rounded to nearest (add_grad), so each call rounds each element
# once, however many positions it sums.
ctypedef fused floatG:
    float
    bf16


cdef inline void add_grad(floatG* p, Py_ssize_t i, float value) noexcept nogil:
    if floatG is float:
        p[i] = p[i] + value
    else:
        p[i] = float_to_bf16(bf16_to_float(p[i]) + value)


# whole arrays, on the OpenMP threads above kernels.parallel's SERIAL_BELOW elements
cdef void widen(float* out, const bf16* inp, Py_ssize_t n) noexcept nogil
# out (n,) = inp (n,) as float32
cdef void narrow(bf16* out, const float* inp, Py_ssize_t n) noexcept nogil
# out (n,) = inp (n,) rounded to nearest even
cdef void narrow_stochastic(bf16* out, const float* inp, Py_ssize_t n, Py_ssize_t first,
                            uint32_t seed) noexcept nogil
# out (n,) = inp (n,) rounded stochastically; element i draws its bits from (first + i, seed)
