# matmul variant 2: a hand-written cache-tiled, register-blocked GEMM (no BLAS).
#   forward:  out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,)
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# All three products are one kernel, c[i,j] += sum_k a(i,k) * b(j,k), where a and b are read
# through strides (a transposed operand is just a different stride).  The output is cut into
# MB x NB tiles, shared out among the threads; for each block of KB steps along k a thread
# copies ("packs") its slice of a and of b into contiguous rows, so that the innermost kernel
# reads unit-stride memory from L1/L2 whatever the operands' layout.  The innermost kernel
# computes a 4x4 block of c as 16 dot products over the packed rows: 16 independent sums that
# the compiler vectorises along k (with -fassociative-math) and keeps in registers.
from cython.parallel cimport prange, threadid
from libc.stdlib cimport malloc, free

include "kernels/matmul_wrappers.pxi"

from kernels.parallel cimport max_threads

cdef enum:
    MR = 4      # rows of a per register block
    NR = 4      # rows of b (columns of c) per register block
    MB = 64     # rows of c per tile: 64 packed rows of a, 128 KiB at KB = 512
    NB = 128    # columns of c per tile: 128 packed rows of b, 256 KiB, stays in L2
    KB = 512    # steps along k per packed block: a 4-row strip is 8 KiB, stays in L1


cdef inline void pack(float* dst, const float* src, Py_ssize_t row_stride, Py_ssize_t k_stride,
                      Py_ssize_t r0, Py_ssize_t nr, Py_ssize_t k0, Py_ssize_t kc) noexcept nogil:
    # dst (nr, kc) contiguous  <-  rows r0.. , steps k0.. of the strided matrix src
    cdef Py_ssize_t r, k, rb, kb
    cdef const float* s
    if k_stride == 1:
        for r in range(nr):
            s = src + (r0 + r) * row_stride + k0
            for k in range(kc):
                dst[r * kc + k] = s[k]
    else:
        # a transpose: done in 16x16 squares, so that the 16 source and 16 destination cache
        # lines in flight stay in L1 (a whole column at once would evict its own lines)
        for kb in range(0, kc, 16):
            for rb in range(0, nr, 16):
                for k in range(kb, min(kb + 16, kc)):
                    s = src + (k0 + k) * k_stride + r0 * row_stride
                    for r in range(rb, min(rb + 16, nr)):
                        dst[r * kc + k] = s[r * row_stride]


cdef inline void block_4x4(float* c, Py_ssize_t ldc, const float* a, const float* b,
                           Py_ssize_t kc) noexcept nogil:
    # c[0:4, 0:4] += a (4,kc) . b (4,kc)^T, both packed
    cdef const float* a0 = a
    cdef const float* a1 = a + kc
    cdef const float* a2 = a + 2 * kc
    cdef const float* a3 = a + 3 * kc
    cdef const float* b0 = b
    cdef const float* b1 = b + kc
    cdef const float* b2 = b + 2 * kc
    cdef const float* b3 = b + 3 * kc
    cdef float s00 = 0, s01 = 0, s02 = 0, s03 = 0
    cdef float s10 = 0, s11 = 0, s12 = 0, s13 = 0
    cdef float s20 = 0, s21 = 0, s22 = 0, s23 = 0
    cdef float s30 = 0, s31 = 0, s32 = 0, s33 = 0
    cdef float x0, x1, x2, x3, y0, y1, y2, y3
    cdef Py_ssize_t k
    for k in range(kc):
        x0 = a0[k]
        x1 = a1[k]
        x2 = a2[k]
        x3 = a3[k]
        y0 = b0[k]
        y1 = b1[k]
        y2 = b2[k]
        y3 = b3[k]
        s00 = s00 + x0 * y0
        s01 = s01 + x0 * y1
        s02 = s02 + x0 * y2
        s03 = s03 + x0 * y3
        s10 = s10 + x1 * y0
        s11 = s11 + x1 * y1
        s12 = s12 + x1 * y2
        s13 = s13 + x1 * y3
        s20 = s20 + x2 * y0
        s21 = s21 + x2 * y1
        s22 = s22 + x2 * y2
        s23 = s23 + x2 * y3
        s30 = s30 + x3 * y0
        s31 = s31 + x3 * y1
        s32 = s32 + x3 * y2
        s33 = s33 + x3 * y3
    c[0] += s00
    c[1] += s01
    c[2] += s02
    c[3] += s03
    c[ldc] += s10
    c[ldc + 1] += s11
    c[ldc + 2] += s12
    c[ldc + 3] += s13
    c[2 * ldc] += s20
    c[2 * ldc + 1] += s21
    c[2 * ldc + 2] += s22
    c[2 * ldc + 3] += s23
    c[3 * ldc] += s30
    c[3 * ldc + 1] += s31
    c[3 * ldc + 2] += s32
    c[3 * ldc + 3] += s33


cdef inline void block_edge(float* c, Py_ssize_t ldc, const float* a, const float* b,
                            Py_ssize_t mr, Py_ssize_t nr, Py_ssize_t kc) noexcept nogil:
    # the ragged edge of a tile (fewer than 4 rows or columns): one dot product per element
    cdef Py_ssize_t i, j, k
    cdef float s
    for i in range(mr):
        for j in range(nr):
            s = 0
            for k in range(kc):
                s = s + a[i * kc + k] * b[j * kc + k]
            c[i * ldc + j] += s


cdef void tile(float* c, Py_ssize_t ldc, const float* a, Py_ssize_t a_rs, Py_ssize_t a_ks,
               const float* b, Py_ssize_t b_rs, Py_ssize_t b_ks, Py_ssize_t i0, Py_ssize_t mb,
               Py_ssize_t j0, Py_ssize_t nb, Py_ssize_t K, float* apack, float* bpack) noexcept nogil:
    # c[i0:i0+mb, j0:j0+nb] += its share of the product, KB steps along k at a time
    cdef Py_ssize_t k0, kc, i, j, mr, nr
    k0 = 0
    while k0 < K:
        kc = min(<Py_ssize_t>KB, K - k0)
        pack(apack, a, a_rs, a_ks, i0, mb, k0, kc)
        pack(bpack, b, b_rs, b_ks, j0, nb, k0, kc)
        i = 0
        while i < mb:
            mr = min(<Py_ssize_t>MR, mb - i)
            j = 0
            while j < nb:
                nr = min(<Py_ssize_t>NR, nb - j)
                if mr == MR and nr == NR:
                    block_4x4(c + (i0 + i) * ldc + j0 + j, ldc, apack + i * kc, bpack + j * kc, kc)
                else:
                    block_edge(c + (i0 + i) * ldc + j0 + j, ldc, apack + i * kc, bpack + j * kc,
                               mr, nr, kc)
                j += NR
            i += MR
        k0 += KB


cdef void gemm(float* c, Py_ssize_t ldc, const float* a, Py_ssize_t a_rs, Py_ssize_t a_ks,
               const float* b, Py_ssize_t b_rs, Py_ssize_t b_ks,
               Py_ssize_t M, Py_ssize_t N, Py_ssize_t K) noexcept nogil:
    # c (M,N) += a (M,K) . b (N,K)^T, with a(i,k) = a[i*a_rs + k*a_ks], b(j,k) = b[j*b_rs + k*b_ks]
    cdef Py_ssize_t m_tiles = (M + MB - 1) // MB
    cdef Py_ssize_t n_tiles = (N + NB - 1) // NB
    cdef Py_ssize_t t, mt, nt
    cdef int num_threads = max_threads()
    cdef Py_ssize_t scratch_per_thread = (MB + NB) * KB
    cdef float* scratch = <float*>malloc(num_threads * scratch_per_thread * sizeof(float))
    cdef float* apack
    if scratch == NULL:
        return
    # consecutive tiles share their column block of b, which then stays in cache
    for t in prange(m_tiles * n_tiles, schedule="static", num_threads=num_threads):
        nt = t // m_tiles
        mt = t % m_tiles
        apack = scratch + threadid() * scratch_per_thread
        tile(c, ldc, a, a_rs, a_ks, b, b_rs, b_ks, mt * MB, min(<Py_ssize_t>MB, M - mt * MB),
             nt * NB, min(<Py_ssize_t>NB, N - nt * NB), K, apack, apack + MB * KB)
    free(scratch)


cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    # out starts at the bias (or zero) and the product accumulates onto it
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
    # dinp (BT,C) += dout (BT,OC) . weight^T^T: b(j=c, k=o) = weight[o*C + c]
    gemm(dinp, C, dout, OC, 1, weight, 1, C, BT, C, OC)
    # dweight (OC,C) += dout^T (OC,BT) . inp: a(i=o, k=bt) = dout[bt*OC + o], b(j=c, k=bt) = inp[bt*C + c]
    gemm(dweight, C, dout, 1, OC, inp, 1, C, OC, C, BT)
    if dbias != NULL:
        # a thread owns 64 columns of dbias (whole cache lines) and sweeps all rows over them
        for block in prange((OC + 63) // 64, schedule="static"):
            for bt in range(BT):
                dout_bt = dout + bt * OC
                for o in range(block * 64, min(block * 64 + 64, <Py_ssize_t>OC)):
                    dbias[o] = dbias[o] + dout_bt[o]
