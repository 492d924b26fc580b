# flash_attention (promoted from dev/cpu/flash_attention_3.pyx): tiles of queries x keys, their
# products through kernels.blas's sgemm, the softmax never stored.
#   inp (B,T,3C) = q, k, v;  out (B,T,C);  lse (B,NH,T);  NH heads of hs = C/NH
# dev/cpu/flash_attention_1's algorithm on tiles of BQ query rows x BK keys, so that each
# product is one single-threaded sgemm on strided views of inp, out and dinp (row stride 3C or
# C, no copies), and the scores of a tile stay in the thread's L2:
#   forward   S = scale Q K^T;  online softmax over the tile's rows (running max m and sum l,
#             the rows of out rescaled by exp(m_old - m_new) when the max grows);  out += P V;
#             at the end out /= l, lse = m + log l
#   backward  P = exp(S - lse);  dV += P^T dO;  dP = dO V^T;  dS = P (dP - D), D = rowsum(dO out);
#             dQ += scale dS K;  dK += scale dS^T Q
# Causal: a query tile only visits the key blocks up to its last row; inside a block that
# crosses the diagonal the scores above it are set to probability 0 before any product.
# Threads: forward over (b, h, query tile), longest tiles first; backward over (b, h), since a
# query tile adds into the k and v gradients of every key block before it.
# Variant 3 over variant 2 (64 x 64 tiles; dev/BENCHMARKS.md section 6): GCC does not vectorise
# a max reduction without -ffinite-math-only (never used here), so variant 2's row maximum was
# one serial chain of compares; here it is kernels.rowmax's, in 16 independent lanes, which
# GCC keeps in registers, 16 compares in flight; and tiles of 128 x 256, a quarter of the
# sgemm calls.
# The scratch tiles (128 KB each, two in backward) live on the thread's stack.  The exponentials
# use kernels.vexp's vectorisable exp; the BLAS is held to one thread (kernels.parallel's
# blas_single_threaded), as in every kernel that calls it from OpenMP's threads.
from cython.parallel cimport prange
from libc.math cimport logf, sqrtf, INFINITY

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.parallel cimport blas_single_threaded
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf

include "kernels/_flash_attention_wrappers.pxi"

cdef enum:
    BQ = 128   # query rows per tile
    BK = 256   # keys per block


cdef inline int visible(int t, int j0, int cols) noexcept nogil:
    # how many of the keys j0 .. j0+cols-1 query t sees (t2 <= t)
    return max(0, min(cols, t - j0 + 1))


cdef void forward_tile(float* out, float* lse, const float* inp, int b, int h, int i0,
                       int T, int C, int NH) noexcept nogil:
    cdef int C3 = 3 * C
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q = inp + <Py_ssize_t>b * T * C3 + h * hs
    cdef const float* k = q + C
    cdef const float* v = q + 2 * C
    cdef float* out_i = out + (<Py_ssize_t>b * T + i0) * C + h * hs
    cdef float* lse_i = lse + (<Py_ssize_t>b * NH + h) * T + i0
    cdef int rows = min(<int>BQ, T - i0)
    cdef float S[BQ * BK]      # scores, then probabilities (unnormalised) of one block
    cdef float m[BQ]           # running max of each row's scores
    cdef float l[BQ]           # running sum of exp(score - m)
    cdef float* row
    cdef float* o
    cdef float new_max, correction, total, e
    cdef int r, c, d, j0, cols, n
    for r in range(rows):
        m[r] = -INFINITY
        l[r] = 0.0
        o = out_i + <Py_ssize_t>r * C
        for d in range(hs):
            o[d] = 0.0
    j0 = 0
    while j0 < i0 + rows:
        cols = min(<int>BK, i0 + rows - j0)
        # S (rows, cols) = scale Q[i0:] K[j0:]^T
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale,
              q + <Py_ssize_t>i0 * C3, C3, k + <Py_ssize_t>j0 * C3, C3, 0.0, S, BK)
        for r in range(rows):
            row = S + r * BK
            n = visible(i0 + r, j0, cols)
            new_max = max(m[r], row_max(row, n))
            total = 0.0
            for c in range(n):
                e = vexpf(row[c] - new_max)
                row[c] = e
                total = total + e
            for c in range(n, cols):
                row[c] = 0.0
            if new_max != m[r]:
                correction = vexpf(m[r] - new_max) if l[r] > 0.0 else 0.0
                l[r] = l[r] * correction
                o = out_i + <Py_ssize_t>r * C
                for d in range(hs):
                    o[d] = o[d] * correction
                m[r] = new_max
            l[r] = l[r] + total
        # out[i0:] += P V[j0:]
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0,
              S, BK, v + <Py_ssize_t>j0 * C3, C3, 1.0, out_i, C)
        j0 += BK
    for r in range(rows):
        o = out_i + <Py_ssize_t>r * C
        e = 1.0 / l[r]
        for d in range(hs):
            o[d] = o[d] * e
        lse_i[r] = m[r] + logf(l[r])


cdef void backward_head(float* dinp, const float* dout, const float* inp, const float* out,
                        const float* lse, int b, int h, int T, int C, int NH) noexcept nogil:
    cdef int C3 = 3 * C
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t base = <Py_ssize_t>b * T * C3 + h * hs
    cdef const float* q = inp + base
    cdef const float* k = q + C
    cdef const float* v = q + 2 * C
    cdef float* dq = dinp + base
    cdef float* dk = dq + C
    cdef float* dv = dq + 2 * C
    cdef const float* dout_bh = dout + <Py_ssize_t>b * T * C + h * hs
    cdef const float* out_bh = out + <Py_ssize_t>b * T * C + h * hs
    cdef const float* lse_bh = lse + (<Py_ssize_t>b * NH + h) * T
    cdef float P[BQ * BK]      # probabilities of one tile
    cdef float dS[BQ * BK]     # their gradient, then the scores' gradient
    cdef float D[BQ]           # rowsum(dO * out): the softmax gradient's per-row term
    cdef const float* do_r
    cdef const float* o_r
    cdef float* p_r
    cdef float* ds_r
    cdef float dot, lse_r
    cdef int i0, j0, rows, cols, r, c, d, n
    i0 = 0
    while i0 < T:
        rows = min(<int>BQ, T - i0)
        for r in range(rows):
            do_r = dout_bh + <Py_ssize_t>(i0 + r) * C
            o_r = out_bh + <Py_ssize_t>(i0 + r) * C
            dot = 0.0
            for d in range(hs):
                dot = dot + do_r[d] * o_r[d]
            D[r] = dot
        j0 = 0
        while j0 < i0 + rows:
            cols = min(<int>BK, i0 + rows - j0)
            # P = exp(scale Q K^T - lse), 0 where the key is in the future
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale,
                  q + <Py_ssize_t>i0 * C3, C3, k + <Py_ssize_t>j0 * C3, C3, 0.0, P, BK)
            for r in range(rows):
                p_r = P + r * BK
                n = visible(i0 + r, j0, cols)
                lse_r = lse_bh[i0 + r]
                for c in range(n):
                    p_r[c] = vexpf(p_r[c] - lse_r)
                for c in range(n, cols):
                    p_r[c] = 0.0
            # dV[j0:] += P^T dO[i0:]
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0,
                  P, BK, dout_bh + <Py_ssize_t>i0 * C, C, 1.0, dv + <Py_ssize_t>j0 * C3, C3)
            # dP = dO[i0:] V[j0:]^T, then dS = P (dP - D)
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0,
                  dout_bh + <Py_ssize_t>i0 * C, C, v + <Py_ssize_t>j0 * C3, C3, 0.0, dS, BK)
            for r in range(rows):
                p_r = P + r * BK
                ds_r = dS + r * BK
                for c in range(cols):
                    ds_r[c] = p_r[c] * (ds_r[c] - D[r])
            # dQ[i0:] += scale dS K[j0:];  dK[j0:] += scale dS^T Q[i0:]
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale,
                  dS, BK, k + <Py_ssize_t>j0 * C3, C3, 1.0, dq + <Py_ssize_t>i0 * C3, C3)
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale,
                  dS, BK, q + <Py_ssize_t>i0 * C3, C3, 1.0, dk + <Py_ssize_t>j0 * C3, C3)
            j0 += BK
        i0 += BQ


cdef void flash_attention_forward(float* out, float* lse, const float* inp,
                                  int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t tiles = (T + BQ - 1) // BQ, unit, bh, tile
    blas_single_threaded()
    # the last query tiles see the most keys: hand them out first, the short ones fill the gaps
    for unit in prange(<Py_ssize_t>B * NH * tiles, schedule="dynamic"):
        tile = tiles - 1 - unit // (B * NH)
        bh = unit % (B * NH)
        forward_tile(out, lse, inp, <int>(bh // NH), <int>(bh % NH), <int>(tile * BQ), T, C, NH)


cdef void flash_attention_backward(float* dinp, const float* dout, const float* inp,
                                   const float* out, const float* lse,
                                   int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t bh
    blas_single_threaded()
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        backward_head(dinp, dout, inp, out, lse, <int>(bh // NH), <int>(bh % NH), T, C, NH)
