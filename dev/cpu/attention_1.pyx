# attention variant 1: the straight port of llm.c's CPU attention.
#   inp (B,T,3C) = q, k, v;  preatt, att (B,NH,T,T);  out (B,T,C);  NH heads of hs = C/NH
# Forward: one thread per (b, t, h) query row (llm.c's collapse(3)); preatt is written for
# t2 <= t only, att is zero above the diagonal.  Backward: single-threaded, as in llm.c (its
# loops add into the k and v gradients of earlier positions, so rows would collide), and the
# softmax gradient is the full T x T Jacobian product per row.
from cython.parallel cimport prange
from libc.math cimport expf, sqrtf

include "kernels/attention_wrappers.pxi"


cdef inline void forward_row(float* out, float* preatt, float* att, const float* inp,
                             Py_ssize_t b, Py_ssize_t t, Py_ssize_t h,
                             int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef Py_ssize_t hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef const float* query_t = inp + (b * T + t) * C3 + h * hs
    cdef float* preatt_bth = preatt + ((b * NH + h) * T + t) * T
    cdef float* att_bth = att + ((b * NH + h) * T + t) * T
    cdef float* out_bth = out + (b * T + t) * C + h * hs
    cdef const float* key_t2
    cdef const float* value_t2
    cdef Py_ssize_t t2, i
    cdef float val, maxval = -10000.0, expsum = 0.0, expsum_inv, att_btht2
    # pass 1: q.k scores and their maximum
    for t2 in range(t + 1):
        key_t2 = inp + (b * T + t2) * C3 + h * hs + C
        val = 0.0
        for i in range(hs):
            val += query_t[i] * key_t2[i]
        val *= scale
        if val > maxval:
            maxval = val
        preatt_bth[t2] = val
    # pass 2: exponentials and their sum
    for t2 in range(t + 1):
        val = expf(preatt_bth[t2] - maxval)
        expsum += val
        att_bth[t2] = val
    expsum_inv = 0.0 if expsum == 0.0 else 1.0 / expsum
    # pass 3: normalise; the future is masked out
    for t2 in range(T):
        if t2 <= t:
            att_bth[t2] *= expsum_inv
        else:
            att_bth[t2] = 0.0
    # pass 4: weighted sum of the values
    for i in range(hs):
        out_bth[i] = 0.0
    for t2 in range(t + 1):
        value_t2 = inp + (b * T + t2) * C3 + h * hs + 2 * C
        att_btht2 = att_bth[t2]
        for i in range(hs):
            out_bth[i] += att_btht2 * value_t2[i]


cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t row, b, t, h
    for row in prange(<Py_ssize_t>B * T * NH, schedule="static"):
        b = row // (T * NH)
        t = (row // NH) % T
        h = row % NH
        forward_row(out, preatt, att, inp, b, t, h, T, C, NH)


cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * C
    cdef Py_ssize_t hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t b, t, h, t2, t3, i
    cdef const float* att_bth
    cdef float* datt_bth
    cdef float* dpreatt_bth
    cdef float* dquery_t
    cdef float* dkey_t2
    cdef float* dvalue_t2
    cdef const float* dout_bth
    cdef const float* query_t
    cdef const float* key_t2
    cdef const float* value_t2
    cdef float indicator, local_derivative
    for b in range(B):
        for t in range(T):
            for h in range(NH):
                att_bth = att + ((b * NH + h) * T + t) * T
                datt_bth = datt + ((b * NH + h) * T + t) * T
                dpreatt_bth = dpreatt + ((b * NH + h) * T + t) * T
                dquery_t = dinp + (b * T + t) * C3 + h * hs
                query_t = inp + (b * T + t) * C3 + h * hs
                dout_bth = dout + (b * T + t) * C + h * hs
                # backward pass 4: out = att @ v
                for t2 in range(t + 1):
                    value_t2 = inp + (b * T + t2) * C3 + h * hs + 2 * C
                    dvalue_t2 = dinp + (b * T + t2) * C3 + h * hs + 2 * C
                    for i in range(hs):
                        datt_bth[t2] += value_t2[i] * dout_bth[i]
                        dvalue_t2[i] += att_bth[t2] * dout_bth[i]
                # backward passes 2 and 3: the softmax Jacobian
                for t2 in range(t + 1):
                    for t3 in range(t + 1):
                        indicator = 1.0 if t2 == t3 else 0.0
                        local_derivative = att_bth[t2] * (indicator - att_bth[t3])
                        dpreatt_bth[t3] += local_derivative * datt_bth[t2]
                # backward pass 1: preatt = q.k * scale
                for t2 in range(t + 1):
                    key_t2 = inp + (b * T + t2) * C3 + h * hs + C
                    dkey_t2 = dinp + (b * T + t2) * C3 + h * hs + C
                    for i in range(hs):
                        dquery_t[i] += key_t2[i] * dpreatt_bth[t2] * scale
                        dkey_t2[i] += query_t[i] * dpreatt_bth[t2] * scale
