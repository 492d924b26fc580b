# attention (promoted from dev/cpu/attention_3.pyx): the per-head products through kernels.blas, on OpenMP's threads.
#   inp (B,T,3C) = q, k, v;  preatt, att (B,NH,T,T);  out (B,T,C);  NH heads of hs = C/NH
# One thread per (b, h) head, as variant 2, but each head's four kinds of products are
# single-threaded sgemm calls on strided views of inp/dinp (row stride 3C, no copies):
#   forward   preatt = scale q k^T,  out = att v
#   backward  datt += dout v^T,  dv += att^T dout,  dq += scale dpreatt k,  dk += scale dpreatt^T q
# The causal mask is used by blocks of TB rows: row block i only multiplies the columns
# 0 .. (i+1)TB, so about half of the square is skipped at large T.  Forward's scores cover a
# few entries above the diagonal inside the diagonal block, which the softmax then sets to
# zero; backward takes its diagonal blocks through a small TB x TB buffer, so that it adds
# nothing above the diagonal of datt and dpreatt (llm.c's kernels never touch those).
# The BLAS must run single-threaded for calls from OpenMP threads: the kernels see to it
# (kernels.parallel's blas_single_threaded).  The softmax uses kernels.vexp's vectorisable exp.
from cython.parallel cimport prange
from libc.math cimport sqrtf

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.parallel cimport blas_single_threaded

include "kernels/attention_wrappers.pxi"

cdef enum:
    TB = 64   # rows of the scores per block of the causal mask


cdef void forward_head(float* out, float* preatt, float* att, const float* inp,
                       int b, int h, int T, int C, int NH) noexcept nogil:
    cdef int C3 = 3 * C
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q = inp + <Py_ssize_t>b * T * C3 + h * hs
    cdef const float* k = q + C
    cdef const float* v = q + 2 * C
    cdef float* pre_bh = preatt + (<Py_ssize_t>b * NH + h) * T * T
    cdef float* att_bh = att + (<Py_ssize_t>b * NH + h) * T * T
    cdef float* out_bh = out + <Py_ssize_t>b * T * C + h * hs
    cdef int t0, rows, cols
    t0 = 0
    while t0 < T:
        rows = min(<int>TB, T - t0)
        cols = t0 + rows
        # preatt[t0:t0+rows, :cols] = scale q[t0:t0+rows] k[:cols]^T
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale,
              q + <Py_ssize_t>t0 * C3, C3, k, C3, 0.0, pre_bh + <Py_ssize_t>t0 * T, T)
        softmax_rows(pre_bh, att_bh, t0, t0 + rows, T)
        # out[t0:t0+rows] = att[t0:t0+rows, :cols] v[:cols]
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0,
              att_bh + <Py_ssize_t>t0 * T, T, v, C3, 0.0, out_bh + <Py_ssize_t>t0 * C, C)
        t0 += TB


cdef inline void lower_triangle(float* dst, const float* src, int ld, int rows) noexcept nogil:
    # dst (rows, rows), leading dimension TB = the lower triangle of src (leading dimension
    # ld), zeros above the diagonal
    cdef int i, j
    for i in range(rows):
        for j in range(rows):
            dst[i * TB + j] = src[<Py_ssize_t>i * ld + j] if j <= i else 0.0


cdef void backward_head(float* dinp, float* dpreatt, float* datt, const float* dout,
                        const float* inp, const float* att, int b, int h, int T, int C,
                        int NH) noexcept nogil:
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
    cdef const float* att_bh = att + (<Py_ssize_t>b * NH + h) * T * T
    cdef float* datt_bh = datt + (<Py_ssize_t>b * NH + h) * T * T
    cdef float* dpre_bh = dpreatt + (<Py_ssize_t>b * NH + h) * T * T
    cdef const float* dout_bh = dout + <Py_ssize_t>b * T * C + h * hs
    cdef float diag[TB * TB]   # a diagonal block of datt, att or dpreatt, zero above the diagonal
    cdef const float* att_t
    cdef float* datt_t
    cdef float* dpre_t
    cdef int t0, rows, i, j
    cdef Py_ssize_t t, t2
    cdef float dot
    t0 = 0
    while t0 < T:
        rows = min(<int>TB, T - t0)
        # out = att v:  datt[t0:, :t0+rows] += dout[t0:] v^T, the diagonal block through `diag`
        # so that nothing is added above the diagonal
        if t0 > 0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, t0, hs, 1.0,
                  dout_bh + <Py_ssize_t>t0 * C, C, v, C3, 1.0, datt_bh + <Py_ssize_t>t0 * T, T)
        sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, rows, hs, 1.0,
              dout_bh + <Py_ssize_t>t0 * C, C, v + <Py_ssize_t>t0 * C3, C3, 0.0, diag, TB)
        for i in range(rows):
            datt_t = datt_bh + <Py_ssize_t>(t0 + i) * T + t0
            for j in range(i + 1):
                datt_t[j] = datt_t[j] + diag[i * TB + j]
        # dv[:t0+rows] += att[t0:, :t0+rows]^T dout[t0:], the diagonal block's lower triangle
        # through `diag` (att above the diagonal is never read)
        if t0 > 0:
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t0, hs, rows, 1.0,
                  att_bh + <Py_ssize_t>t0 * T, T, dout_bh + <Py_ssize_t>t0 * C, C, 1.0, dv, C3)
        lower_triangle(diag, att_bh + <Py_ssize_t>t0 * T + t0, T, rows)
        sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, hs, rows, 1.0,
              diag, TB, dout_bh + <Py_ssize_t>t0 * C, C, 1.0, dv + <Py_ssize_t>t0 * C3, C3)
        # softmax: dpreatt[t2] += att[t2] (datt[t2] - sum_t3 att[t3] datt[t3]),  t2 <= t
        for t in range(t0, t0 + rows):
            att_t = att_bh + t * T
            datt_t = datt_bh + t * T
            dpre_t = dpre_bh + t * T
            dot = 0.0
            for t2 in range(t + 1):
                dot = dot + att_t[t2] * datt_t[t2]
            for t2 in range(t + 1):
                dpre_t[t2] = dpre_t[t2] + att_t[t2] * (datt_t[t2] - dot)
        # preatt = scale q k^T:  dq[t0:] += scale dpreatt[t0:, :] k,  dk += scale dpreatt^T q[t0:],
        # columns below t0 straight from dpreatt, the diagonal block from its lower triangle
        if t0 > 0:
            sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, t0, scale,
                  dpre_bh + <Py_ssize_t>t0 * T, T, k, C3, 1.0, dq + <Py_ssize_t>t0 * C3, C3)
            sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t0, hs, rows, scale,
                  dpre_bh + <Py_ssize_t>t0 * T, T, q + <Py_ssize_t>t0 * C3, C3, 1.0, dk, C3)
        lower_triangle(diag, dpre_bh + <Py_ssize_t>t0 * T + t0, T, rows)
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, rows, scale,
              diag, TB, k + <Py_ssize_t>t0 * C3, C3, 1.0, dq + <Py_ssize_t>t0 * C3, C3)
        sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, hs, rows, scale,
              diag, TB, q + <Py_ssize_t>t0 * C3, C3, 1.0, dk + <Py_ssize_t>t0 * C3, C3)
        t0 += TB


cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t bh
    blas_single_threaded()
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        forward_head(out, preatt, att, inp, <int>(bh // NH), <int>(bh % NH), T, C, NH)


cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t bh
    blas_single_threaded()
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        backward_head(dinp, dpreatt, datt, dout, inp, att, <int>(bh // NH), <int>(bh % NH), T, C, NH)
