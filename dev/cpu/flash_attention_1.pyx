# flash_attention variant 1: the straight loops of flash attention, one query row at a time.
#   inp (B,T,3C) = q, k, v;  out (B,T,C);  lse (B,NH,T);  NH heads of hs = C/NH
# Forward: one thread per (b, h, t) query row.  The row's keys t2 <= t are visited once, in
# order, with the online softmax: a running maximum m, the running sum l of exp(s - m) and the
# output accumulated unnormalised, both rescaled by exp(m_old - m_new) when the maximum grows;
# at the end out /= l and lse = m + log l.  Nothing of size T x T is stored.
# Backward: one thread per (b, h) head (a row adds into the k and v gradients of every earlier
# position of its head, so rows of one head would collide).  Each row's probabilities are
# recomputed from the scores and lse, p = exp(s - lse), and with D = dout . out:
#   dv[t2] += p dout,  ds = p (dout . v[t2] - D),  dq += scale ds k[t2],  dk[t2] += scale ds q.
from cython.parallel cimport prange
from libc.math cimport expf, logf, sqrtf, INFINITY

include "kernels/flash_attention_wrappers.pxi"


cdef void forward_row(float* out, float* lse, const float* inp, int b, int h, int t,
                      int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q = inp + (<Py_ssize_t>b * T + t) * C3 + h * hs
    cdef const float* k
    cdef const float* v
    cdef float* o = out + (<Py_ssize_t>b * T + t) * C + h * hs
    cdef float m = -INFINITY, l = 0.0, s, p, correction
    cdef int t2, i
    for i in range(hs):
        o[i] = 0.0
    for t2 in range(t + 1):
        k = inp + (<Py_ssize_t>b * T + t2) * C3 + C + h * hs
        v = k + C
        s = 0.0
        for i in range(hs):
            s = s + q[i] * k[i]
        s = s * scale
        if s > m:
            correction = expf(m - s)    # 0 the first time (m = -inf)
            l = l * correction
            for i in range(hs):
                o[i] = o[i] * correction
            m = s
        p = expf(s - m)
        l = l + p
        for i in range(hs):
            o[i] = o[i] + p * v[i]
    for i in range(hs):
        o[i] = o[i] / l
    lse[(<Py_ssize_t>b * NH + h) * T + t] = m + logf(l)


cdef void backward_head(float* dinp, const float* dout, const float* inp, const float* out,
                        const float* lse, int b, int h, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* q
    cdef const float* k
    cdef const float* v
    cdef const float* do_t
    cdef const float* o_t
    cdef float* dq
    cdef float* dk
    cdef float* dv
    cdef float D, s, p, dp, ds, lse_t
    cdef int t, t2, i
    for t in range(T):
        q = inp + (<Py_ssize_t>b * T + t) * C3 + h * hs
        dq = dinp + (<Py_ssize_t>b * T + t) * C3 + h * hs
        do_t = dout + (<Py_ssize_t>b * T + t) * C + h * hs
        o_t = out + (<Py_ssize_t>b * T + t) * C + h * hs
        lse_t = lse[(<Py_ssize_t>b * NH + h) * T + t]
        D = 0.0
        for i in range(hs):
            D = D + do_t[i] * o_t[i]
        for t2 in range(t + 1):
            k = inp + (<Py_ssize_t>b * T + t2) * C3 + C + h * hs
            v = k + C
            dk = dinp + (<Py_ssize_t>b * T + t2) * C3 + C + h * hs
            dv = dk + C
            s = 0.0
            dp = 0.0
            for i in range(hs):
                s = s + q[i] * k[i]
                dp = dp + do_t[i] * v[i]
            p = expf(s * scale - lse_t)
            ds = p * (dp - D) * scale
            for i in range(hs):
                dv[i] = dv[i] + p * do_t[i]
                dq[i] = dq[i] + ds * k[i]
                dk[i] = dk[i] + ds * q[i]


cdef void flash_attention_forward(float* out, float* lse, const float* inp,
                                  int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t row, b, h, t
    for row in prange(<Py_ssize_t>B * NH * T, schedule="static"):
        b = row // (NH * T)
        h = row // T % NH
        t = row % T
        forward_row(out, lse, inp, <int>b, <int>h, <int>t, T, C, NH)


cdef void flash_attention_backward(float* dinp, const float* dout, const float* inp,
                                   const float* out, const float* lse,
                                   int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t bh
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        backward_head(dinp, dout, inp, out, lse, <int>(bh // NH), <int>(bh % NH), T, C, NH)
