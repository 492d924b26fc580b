# matmul variant 6: a hand-written GEMM in the BLIS style, with explicit SIMD vectors.
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# As variant 2, the three products are one kernel, c[i,j] += sum_k a(i,k) b(j,k) on strided
# operands, cut into tiles that are packed into contiguous panels.  The difference is the
# innermost kernel: an outer product.  For each k it broadcasts 6 values of a, loads 16 of b
# (two 8-float vectors) and does 12 vector FMAs into a 6x16 block of c held in 12 registers:
# no horizontal sums at all, 12 FMAs per 8 loads.  Variant 2's compiler-vectorised dot
# products cannot do this (the compiler spills the 16 sums and their operands), so here the
# vectors are explicit: GCC/Clang vector extensions (8 floats: AVX2 registers, or halves of
# AVX-512 ones at the same FMA rate on Zen 4; other targets get the compiler's lowering).
# Panels: a is packed k-major in strips of 6 rows, b in strips of 16 columns, zero-padded at
# the edges so the kernel never branches; edge blocks of c go through a small buffer.
from cython.parallel cimport prange, threadid
from libc.stdlib cimport malloc, free

from kernels.parallel cimport max_threads

include "kernels/matmul_wrappers.pxi"

cdef extern from *:
    """
    typedef float f32x8 __attribute__((vector_size(32)));
    typedef float f32x8u __attribute__((vector_size(32), aligned(4)));
    static inline f32x8 v8_load(const float* p) { return *(const f32x8u*)p; }
    static inline void v8_store(float* p, f32x8 v) { *(f32x8u*)p = v; }
    static inline f32x8 v8_zero(void) { f32x8 z = {0}; return z; }
    static inline f32x8 v8_fma(f32x8 acc, float a, f32x8 b) { return acc + a * b; }
    static inline f32x8 v8_add(f32x8 x, f32x8 y) { return x + y; }
    """
    ctypedef struct f32x8:
        pass
    f32x8 v8_load(const float* p) noexcept nogil
    void v8_store(float* p, f32x8 v) noexcept nogil
    f32x8 v8_zero() noexcept nogil
    f32x8 v8_fma(f32x8 acc, float a, f32x8 b) noexcept nogil
    f32x8 v8_add(f32x8 x, f32x8 y) noexcept nogil

cdef enum:
    MR = 6      # rows of c per register block
    NR = 16     # columns of c per register block (two 8-float vectors)
    MC = 96     # rows of c per tile (16 strips of 6): a's panel, 96 KiB at KC = 256
    NC = 256    # columns of c per tile (16 strips of 16): b's panel, 256 KiB, stays in L2
    KC = 256    # steps along k per panel: a 6-row strip is 6 KiB, a 16-column one 16 KiB


cdef inline void pack_strips(float* dst, const float* src, Py_ssize_t row_stride,
                             Py_ssize_t k_stride, Py_ssize_t r0, Py_ssize_t nr, Py_ssize_t k0,
                             Py_ssize_t kc, Py_ssize_t width) noexcept nogil:
    # rows r0..r0+nr of the strided matrix src, steps k0..k0+kc, into strips of `width` rows
    # stored k-major: dst[strip][k][r] (rows past nr are zero).  When the rows are the
    # unit-stride direction (a transposed operand) the loop runs along them for every k, so
    # that each source line and page is visited once per panel, not once per strip.
    cdef Py_ssize_t strips = (nr + width - 1) // width
    cdef Py_ssize_t s, r, k, rows
    cdef float* d
    cdef const float* src_k
    cdef const float* src_s
    if row_stride == 1:
        for k in range(kc):
            src_k = src + r0 + (k0 + k) * k_stride
            for s in range(strips):
                rows = min(width, nr - s * width)
                d = dst + s * kc * width + k * width
                for r in range(rows):
                    d[r] = src_k[s * width + r]
    else:
        for s in range(strips):
            d = dst + s * kc * width
            rows = min(width, nr - s * width)
            src_s = src + (r0 + s * width) * row_stride + k0 * k_stride
            for k in range(kc):
                for r in range(rows):
                    d[k * width + r] = src_s[r * row_stride + k * k_stride]
    for s in range(strips):
        rows = min(width, nr - s * width)
        if rows < width:
            d = dst + s * kc * width
            for k in range(kc):
                for r in range(rows, width):
                    d[k * width + r] = 0.0


cdef inline void add_row(float* c, f32x8 lo, f32x8 hi) noexcept nogil:
    v8_store(c, v8_add(lo, v8_load(c)))
    v8_store(c + 8, v8_add(hi, v8_load(c + 8)))


cdef inline void kernel_6x16(float* c, Py_ssize_t ldc, const float* a, const float* b,
                             Py_ssize_t kc) noexcept nogil:
    # c[0:6, 0:16] += a strip (kc, 6) times b strip (kc, 16)
    cdef f32x8 c00 = v8_zero(), c01 = v8_zero(), c10 = v8_zero(), c11 = v8_zero()
    cdef f32x8 c20 = v8_zero(), c21 = v8_zero(), c30 = v8_zero(), c31 = v8_zero()
    cdef f32x8 c40 = v8_zero(), c41 = v8_zero(), c50 = v8_zero(), c51 = v8_zero()
    cdef f32x8 b0, b1
    cdef Py_ssize_t k
    for k in range(kc):
        b0 = v8_load(b + k * NR)
        b1 = v8_load(b + k * NR + 8)
        c00 = v8_fma(c00, a[k * MR], b0)
        c01 = v8_fma(c01, a[k * MR], b1)
        c10 = v8_fma(c10, a[k * MR + 1], b0)
        c11 = v8_fma(c11, a[k * MR + 1], b1)
        c20 = v8_fma(c20, a[k * MR + 2], b0)
        c21 = v8_fma(c21, a[k * MR + 2], b1)
        c30 = v8_fma(c30, a[k * MR + 3], b0)
        c31 = v8_fma(c31, a[k * MR + 3], b1)
        c40 = v8_fma(c40, a[k * MR + 4], b0)
        c41 = v8_fma(c41, a[k * MR + 4], b1)
        c50 = v8_fma(c50, a[k * MR + 5], b0)
        c51 = v8_fma(c51, a[k * MR + 5], b1)
    add_row(c, c00, c01)
    add_row(c + ldc, c10, c11)
    add_row(c + 2 * ldc, c20, c21)
    add_row(c + 3 * ldc, c30, c31)
    add_row(c + 4 * ldc, c40, c41)
    add_row(c + 5 * ldc, c50, c51)


cdef void tile(float* c, Py_ssize_t ldc, const float* a, Py_ssize_t a_rs, Py_ssize_t a_ks,
               const float* b, Py_ssize_t b_rs, Py_ssize_t b_ks, Py_ssize_t i0, Py_ssize_t mc,
               Py_ssize_t j0, Py_ssize_t nc, Py_ssize_t K, float* apack, float* bpack) noexcept nogil:
    # c[i0:i0+mc, j0:j0+nc] += its share of the product, KC steps along k at a time
    cdef float edge[MR * NR]
    cdef Py_ssize_t k0, kc, i, j, r, q, mr, nr
    k0 = 0
    while k0 < K:
        kc = min(<Py_ssize_t>KC, K - k0)
        pack_strips(apack, a, a_rs, a_ks, i0, mc, k0, kc, MR)
        pack_strips(bpack, b, b_rs, b_ks, j0, nc, k0, kc, NR)
        j = 0
        while j < nc:
            nr = min(<Py_ssize_t>NR, nc - j)
            i = 0
            while i < mc:
                mr = min(<Py_ssize_t>MR, mc - i)
                if mr == MR and nr == NR:
                    kernel_6x16(c + (i0 + i) * ldc + j0 + j, ldc, apack + i * kc, bpack + j * kc, kc)
                else:
                    for q in range(MR * NR):
                        edge[q] = 0.0
                    kernel_6x16(edge, NR, apack + i * kc, bpack + j * kc, kc)
                    for r in range(mr):
                        for q in range(nr):
                            c[(i0 + i + r) * ldc + j0 + j + q] += edge[r * NR + q]
                i += MR
            j += NR
        k0 += KC


cdef void gemm(float* c, Py_ssize_t ldc, const float* a, Py_ssize_t a_rs, Py_ssize_t a_ks,
               const float* b, Py_ssize_t b_rs, Py_ssize_t b_ks,
               Py_ssize_t M, Py_ssize_t N, Py_ssize_t K) noexcept nogil:
    # c (M,N) += a (M,K) . b (N,K)^T, with a(i,k) = a[i*a_rs + k*a_ks], b(j,k) = b[j*b_rs + k*b_ks]
    cdef Py_ssize_t m_tiles = (M + MC - 1) // MC
    cdef Py_ssize_t n_tiles = (N + NC - 1) // NC
    cdef Py_ssize_t t, mt, nt
    cdef int num_threads = max_threads()
    cdef Py_ssize_t per_thread = (MC + NC) * KC
    cdef float* scratch = <float*>malloc(num_threads * per_thread * sizeof(float))
    cdef float* apack
    if scratch == NULL:
        return
    # consecutive tiles share their column block of b
    for t in prange(m_tiles * n_tiles, schedule="static", num_threads=num_threads):
        nt = t // m_tiles
        mt = t % m_tiles
        apack = scratch + threadid() * per_thread
        tile(c, ldc, a, a_rs, a_ks, b, b_rs, b_ks, mt * MC, min(<Py_ssize_t>MC, M - mt * MC),
             nt * NC, min(<Py_ssize_t>NC, N - nt * NC), K, apack, apack + MC * KC)
    free(scratch)


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    for bt in prange(BT, schedule="static"):
        out_bt = out + bt * OC
        for o in range(OC):
            out_bt[o] = bias[o] if bias != NULL else 0.0
    # out (BT,OC) += inp (BT,C) . weight (OC,C)^T
    gemm(out, OC, inp, C, 1, weight, C, 1, BT, OC, C)


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t block, o, bt
    cdef const float* dout_bt
    # dinp (BT,C) += dout (BT,OC) . weight: b(j=c, k=o) = weight[o*C + c]
    gemm(dinp, C, dout, OC, 1, weight, 1, C, BT, C, OC)
    # dweight (OC,C) += dout^T . inp: a(i=o, k=bt) = dout[bt*OC + o], b(j=c, k=bt) = inp[bt*C + c]
    gemm(dweight, C, dout, 1, OC, inp, 1, C, OC, C, BT)
    if dbias != NULL:
        for block in prange((OC + 63) // 64, schedule="static"):
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(block * 64, min(block * 64 + 64, <Py_ssize_t>OC)):
                    dbias[o] = dbias[o] + dout_bt[o]
