# Linear layer in bf16 (kernels/matmul.pxd's, with bf16 activations and weights): the products
# of bf16 operands summed in float32 by kernels.blas's gemm_bf16, the bias added in float32,
# each output rounded to bf16 once.  The weight gradients are float32, the GEMM adding into them
# directly, or bf16 (floatG), each call's sum over its rows rounded once into them: the many
# small per-position contributions are not rounded away one by one.
from kernels.bf16 cimport bf16, bf16_to_float, floatG

from libc.stdint cimport uint32_t
from libc.string cimport memcpy

cdef enum:
    PAIR_LANES = 16   # running sums of dot_bf16, each for the even and for the odd elements: 4
                      # AVX2 (2 AVX-512) vectors of FMAs that do not wait on each other (GCC does
                      # not reorder a float sum on its own)


cdef inline void split_pairs(float* x_even, float* x_odd, const bf16* x, Py_ssize_t n) noexcept nogil:
    """x (n,) bf16 widened into x_even ((n+1)/2,) = x[0::2] and x_odd (n/2,) = x[1::2]:
    dot_bf16's other operand."""
    cdef Py_ssize_t i
    for i in range(n // 2):
        x_even[i] = bf16_to_float(x[2 * i])
        x_odd[i] = bf16_to_float(x[2 * i + 1])
    if n % 2:
        x_even[n // 2] = bf16_to_float(x[n - 1])


cdef inline float dot_bf16(const bf16* a, const float* x_even, const float* x_odd,
                           Py_ssize_t n) noexcept nogil:
    """a (n,) bf16 . x (n,) float32, x given as split_pairs's halves, summed in float32.
    The bf16 operand is read as it is, two elements a 32-bit load: the even one is the word
    shifted up 16 bits, the odd one its upper half masked, which costs fewer instructions than
    widening each element (1.2-1.9x at GPT-2's decode shapes on a Zen 3, dev/BENCHMARKS.md
    section 23).  Half a float32 operand's bytes: the matrix-vector products of decoding are
    bound by reading their matrix.  PAIR_LANES running sums of each parity, folded in halves
    down to 8 by vector adds, then 8 scalar adds (a chain of 32 dependent adds would cost a
    short row as much as its products)."""
    cdef float even[PAIR_LANES]
    cdef float odd[PAIR_LANES]
    cdef float total = 0.0
    cdef Py_ssize_t i, j, pairs = n // 2, body = pairs - pairs % PAIR_LANES
    cdef uint32_t word, shifted, masked
    cdef float lo, hi
    for j in range(PAIR_LANES):
        even[j] = 0.0
        odd[j] = 0.0
    for i in range(0, body // PAIR_LANES):
        for j in range(PAIR_LANES):
            memcpy(&word, a + 2 * (i * PAIR_LANES + j), 4)   # any alignment; one load
            shifted = word << 16
            masked = word & 0xffff0000u
            memcpy(&lo, &shifted, 4)
            memcpy(&hi, &masked, 4)
            even[j] += lo * x_even[i * PAIR_LANES + j]
            odd[j] += hi * x_odd[i * PAIR_LANES + j]
    for j in range(PAIR_LANES):
        even[j] += odd[j]
    for j in range(PAIR_LANES // 2):
        even[j] += even[j + PAIR_LANES // 2]
    for j in range(PAIR_LANES // 2):
        total += even[j]
    for i in range(body, pairs):
        total += bf16_to_float(a[2 * i]) * x_even[i] + bf16_to_float(a[2 * i + 1]) * x_odd[i]
    if n % 2:
        total += bf16_to_float(a[n - 1]) * x_even[pairs]
    return total


cdef int matmul_forward_bf16(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                             int B, int T, int C, int OC) noexcept nogil
# out (B,T,OC) bf16; inp (B,T,C) bf16; weight (OC,C) bf16; bias (OC,) bf16 or NULL
cdef int matmul_backward_bf16(bf16* dinp, floatG* dweight, floatG* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, int B, int T, int C,
                              int OC) noexcept nogil
# dinp (B,T,C) bf16, dweight (OC,C), dbias (OC,) float32 or bf16, each NULL where not wanted
# (dweight: a frozen weight, its GEMM skipped): all += ...;
# dout (B,T,OC) bf16.  Both return -1 where a GEMM or a block found no scratch memory, else 0.
