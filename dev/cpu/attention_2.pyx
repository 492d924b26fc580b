# attention variant 2: multi-threaded and vectorised, no BLAS.
#   inp (B,T,3C) = q, k, v;  preatt, att (B,NH,T,T);  out (B,T,C);  NH heads of hs = C/NH
# One thread per (b, h) head in both passes: a head touches only its own hs channels of q, k,
# v, out and their gradients, and its own (T,T) scores, so nothing is shared.  Per head:
#  - k (and, in backward, v) is first copied transposed, (hs,Tp), into the thread's scratch,
#    so that a row of scores is built as  row[t2] += q[i] kT[i,t2]  along t2: unit stride,
#    vectorised, no horizontal sum per score (as a dot product along i has);
#  - sums that run over a loop (a block of 64 scores over i, 64 channels of out or dq over t2)
#    go into a local array of 64 floats: four vector registers, four independent FMA chains,
#    instead of a load-add-store chain through memory that the compiler cannot keep in
#    registers (it cannot prove the output does not alias the inputs);
#  - score rows are computed in whole blocks of 64 (Tp = T rounded up, padding columns of kT
#    zero, scores for t2 > t computed and dropped): no scalar remainder loops;
#  - the softmax uses kernels.vexp's vectorisable exp;
#  - the softmax gradient is O(T) per row: dpreatt = att (datt - sum(att datt)).
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf, INFINITY
from libc.stdlib cimport malloc, free
from kernels.vexp cimport vexpf

include "kernels/attention_wrappers.pxi"

from kernels.parallel cimport max_threads

cdef enum:
    BLOCK = 64   # scores or channels summed at once in registers (4 x 16-float vectors)


cdef inline Py_ssize_t padded(Py_ssize_t n) noexcept nogil:
    return (n + BLOCK - 1) // BLOCK * BLOCK


cdef inline void transpose_head(float* dst, const float* src, Py_ssize_t T, Py_ssize_t hs,
                                Py_ssize_t row_stride) noexcept nogil:
    # dst (hs,Tp) <- src rows t (stride row_stride), hs channels each; columns T..Tp are zero
    cdef Py_ssize_t Tp = padded(T)
    cdef Py_ssize_t t, i
    for i in range(hs):
        for t in range(T, Tp):
            dst[i * Tp + t] = 0.0
    for t in range(T):
        for i in range(hs):
            dst[i * Tp + t] = src[t * row_stride + i]


cdef inline void scores_row(float* row, const float* vec, const float* mat_t, Py_ssize_t n,
                            Py_ssize_t Tp, Py_ssize_t hs, float scale) noexcept nogil:
    # row[t2] = scale * sum_i vec[i] mat_t[i, t2]  for t2 < padded(n);  mat_t (hs, Tp)
    cdef float acc[BLOCK]
    cdef Py_ssize_t t0, i, j
    cdef float a
    cdef const float* m
    cdef Py_ssize_t n_pad = padded(n)
    t0 = 0
    while t0 < n_pad:
        for j in range(BLOCK):
            acc[j] = 0.0
        for i in range(hs):
            a = vec[i]
            m = mat_t + i * Tp + t0
            for j in range(BLOCK):
                acc[j] = acc[j] + a * m[j]
        for j in range(BLOCK):
            row[t0 + j] = acc[j] * scale
        t0 += BLOCK


cdef inline void weighted_rows(float* dst, const float* weights, const float* src,
                               Py_ssize_t n, Py_ssize_t row_stride, Py_ssize_t hs, bint add) noexcept nogil:
    # dst[i] (+)= sum_{t2 < n} weights[t2] src[t2 * row_stride + i],  i < hs
    cdef float acc[BLOCK]
    cdef Py_ssize_t i0, t2, j
    cdef float w
    cdef const float* s
    i0 = 0
    while i0 + BLOCK <= hs:
        for j in range(BLOCK):
            acc[j] = dst[i0 + j] if add else 0.0
        for t2 in range(n):
            w = weights[t2]
            s = src + t2 * row_stride + i0
            for j in range(BLOCK):
                acc[j] = acc[j] + w * s[j]
        for j in range(BLOCK):
            dst[i0 + j] = acc[j]
        i0 += BLOCK
    if i0 < hs:   # a head size that is not a multiple of 64: the rest channel by channel
        for j in range(i0, hs):
            if not add:
                dst[j] = 0.0
        for t2 in range(n):
            w = weights[t2]
            s = src + t2 * row_stride
            for j in range(i0, hs):
                dst[j] = dst[j] + w * s[j]


cdef void forward_head(float* out, float* preatt, float* att, const float* inp, float* kt,
                       float* scores, Py_ssize_t b, Py_ssize_t h, Py_ssize_t T, Py_ssize_t C,
                       Py_ssize_t NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef Py_ssize_t hs = C // NH
    cdef Py_ssize_t Tp = padded(T)
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t t, t2
    cdef const float* query_t
    cdef float* preatt_bth
    cdef float* att_bth
    cdef float maxval, expsum, expsum_inv, a
    transpose_head(kt, inp + b * T * C3 + h * hs + C, T, hs, C3)
    for t in range(T):
        query_t = inp + (b * T + t) * C3 + h * hs
        preatt_bth = preatt + ((b * NH + h) * T + t) * T
        att_bth = att + ((b * NH + h) * T + t) * T
        scores_row(scores, query_t, kt, t + 1, Tp, hs, scale)
        maxval = -INFINITY
        for t2 in range(t + 1):
            preatt_bth[t2] = scores[t2]
            maxval = max(maxval, scores[t2])
        expsum = 0.0
        for t2 in range(t + 1):
            a = vexpf(scores[t2] - maxval)
            att_bth[t2] = a
            expsum = expsum + a
        expsum_inv = 1.0 / expsum
        for t2 in range(t + 1):
            att_bth[t2] = att_bth[t2] * expsum_inv
        for t2 in range(t + 1, T):
            preatt_bth[t2] = 0.0
            att_bth[t2] = 0.0
        # out[t] = sum_t2 att[t2] v[t2]
        weighted_rows(out + (b * T + t) * C + h * hs, att_bth, inp + b * T * C3 + h * hs + 2 * C,
                      t + 1, C3, hs, False)


cdef void backward_head(float* dinp, float* dpreatt, float* datt, const float* dout,
                        const float* inp, const float* att, float* vt, float* scratch_row,
                        float* dscores, Py_ssize_t b, Py_ssize_t h, Py_ssize_t T, Py_ssize_t C,
                        Py_ssize_t NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef Py_ssize_t hs = C // NH
    cdef Py_ssize_t Tp = padded(T)
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t t, t2, i
    cdef const float* att_bth
    cdef float* datt_bth
    cdef float* dpreatt_bth
    cdef const float* dout_bth
    cdef const float* query_t
    cdef float* dkey_t2
    cdef float* dvalue_t2
    cdef float a, d, att_dot_datt
    transpose_head(vt, inp + b * T * C3 + h * hs + 2 * C, T, hs, C3)
    for t in range(T):
        att_bth = att + ((b * NH + h) * T + t) * T
        datt_bth = datt + ((b * NH + h) * T + t) * T
        dpreatt_bth = dpreatt + ((b * NH + h) * T + t) * T
        dout_bth = dout + (b * T + t) * C + h * hs
        query_t = inp + (b * T + t) * C3 + h * hs
        # out = att @ v:  datt[t2] += dout . v[t2];  dv[t2] += att[t2] dout
        scores_row(scratch_row, dout_bth, vt, t + 1, Tp, hs, 1.0)
        for t2 in range(t + 1):
            datt_bth[t2] = datt_bth[t2] + scratch_row[t2]
            dvalue_t2 = dinp + (b * T + t2) * C3 + h * hs + 2 * C
            a = att_bth[t2]
            for i in range(hs):
                dvalue_t2[i] = dvalue_t2[i] + a * dout_bth[i]
        # softmax
        att_dot_datt = 0.0
        for t2 in range(t + 1):
            att_dot_datt = att_dot_datt + att_bth[t2] * datt_bth[t2]
        for t2 in range(t + 1):
            dpreatt_bth[t2] = dpreatt_bth[t2] + att_bth[t2] * (datt_bth[t2] - att_dot_datt)
            dscores[t2] = dpreatt_bth[t2] * scale
        # preatt = scale q.k:  dq += sum_t2 scale dpreatt[t2] k[t2];  dk[t2] += scale dpreatt[t2] q
        weighted_rows(dinp + (b * T + t) * C3 + h * hs, dscores, inp + b * T * C3 + h * hs + C,
                      t + 1, C3, hs, True)
        for t2 in range(t + 1):
            dkey_t2 = dinp + (b * T + t2) * C3 + h * hs + C
            d = dscores[t2]
            for i in range(hs):
                dkey_t2[i] = dkey_t2[i] + d * query_t[i]


cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil:
    cdef int num_threads = max_threads()
    cdef Py_ssize_t hs = C // NH
    cdef Py_ssize_t Tp = padded(T)
    cdef Py_ssize_t per_thread = (hs + 1) * Tp   # kT (hs, Tp) and a row of scores
    cdef float* scratch = <float*>malloc(num_threads * per_thread * sizeof(float))
    cdef float* mine
    cdef Py_ssize_t bh
    if scratch == NULL:
        return
    for bh in prange(<Py_ssize_t>B * NH, schedule="static", num_threads=num_threads):
        mine = scratch + threadid() * per_thread
        forward_head(out, preatt, att, inp, mine, mine + hs * Tp, bh // NH, bh % NH, T, C, NH)
    free(scratch)


cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil:
    cdef int num_threads = max_threads()
    cdef Py_ssize_t hs = C // NH
    cdef Py_ssize_t Tp = padded(T)
    cdef Py_ssize_t per_thread = (hs + 2) * Tp   # vT (hs, Tp), a row of datt, a row of dscores
    cdef float* scratch = <float*>malloc(num_threads * per_thread * sizeof(float))
    cdef float* mine
    cdef Py_ssize_t bh
    if scratch == NULL:
        return
    for bh in prange(<Py_ssize_t>B * NH, schedule="static", num_threads=num_threads):
        mine = scratch + threadid() * per_thread
        backward_head(dinp, dpreatt, datt, dout, inp, att, mine, mine + hs * Tp,
                      mine + (hs + 1) * Tp, bh // NH, bh % NH, T, C, NH)
    free(scratch)
