# Causal multi-head self-attention (llm.c's attention), NH heads of size hs = C / NH.
#   inp (B,T,3C): the q, k, v vectors of each position, in that order, each split into NH heads
#   preatt (B,NH,T,T) = q . k / sqrt(hs)           (row t filled for t2 <= t, zero above)
#   att    (B,NH,T,T) = softmax over t2 <= t       (zero above the diagonal)
#   out    (B,T,C)    = att @ v, heads side by side
# Backward, all += :  dinp (B,T,3C);  datt, dpreatt (B,NH,T,T) are scratch gradients that the
# backward accumulates into and reads back (zero them before, as llm.c's zero_grad does).
# Both passes run one thread per (b, h) pair: a head reads and writes only its own hs channels
# of q, k, v and of out, and its own (T,T) block of the scores, so the threads never collide.
from cython.parallel cimport prange
from libc.limits cimport INT_MAX
from libc.math cimport expf, sqrtf, INFINITY


cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * <Py_ssize_t>C
    cdef Py_ssize_t hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t bh, b, h, t, t2, i
    cdef const float* query_t
    cdef const float* key_t2
    cdef const float* value_t2
    cdef float* preatt_bth
    cdef float* att_bth
    cdef float* out_bth
    cdef float val, maxval, expsum, expsum_inv, att_btht2
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        b = bh // NH
        h = bh % NH
        for t in range(T):
            query_t = inp + (b * T + t) * C3 + h * hs
            preatt_bth = preatt + (bh * T + t) * T
            att_bth = att + (bh * T + t) * T

            # scores against every earlier position, and their maximum for a stable softmax
            maxval = -INFINITY
            for t2 in range(t + 1):
                key_t2 = inp + (b * T + t2) * C3 + h * hs + C
                val = 0.0
                for i in range(hs):
                    val = val + query_t[i] * key_t2[i]
                val = val * scale
                preatt_bth[t2] = val
                if val > maxval:
                    maxval = val

            expsum = 0.0
            for t2 in range(t + 1):
                val = expf(preatt_bth[t2] - maxval)
                att_bth[t2] = val
                expsum = expsum + val
            expsum_inv = 1.0 / expsum
            for t2 in range(t + 1):
                att_bth[t2] = att_bth[t2] * expsum_inv
            # the future is masked; zeros keep the buffers deterministic
            for t2 in range(t + 1, T):
                preatt_bth[t2] = 0.0
                att_bth[t2] = 0.0

            # weighted sum of the values
            out_bth = out + (b * T + t) * C + h * hs
            for i in range(hs):
                out_bth[i] = 0.0
            for t2 in range(t + 1):
                value_t2 = inp + (b * T + t2) * C3 + h * hs + 2 * C
                att_btht2 = att_bth[t2]
                for i in range(hs):
                    out_bth[i] = out_bth[i] + att_btht2 * value_t2[i]


cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil:
    cdef Py_ssize_t C3 = 3 * <Py_ssize_t>C
    cdef Py_ssize_t hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t bh, b, h, t, t2, i
    cdef const float* query_t
    cdef const float* key_t2
    cdef const float* value_t2
    cdef const float* att_bth
    cdef const float* dout_bth
    cdef float* dquery_t
    cdef float* dkey_t2
    cdef float* dvalue_t2
    cdef float* datt_bth
    cdef float* dpreatt_bth
    cdef float dot, att_btht2, att_dot_datt, dscore
    for bh in prange(<Py_ssize_t>B * NH, schedule="static"):
        b = bh // NH
        h = bh % NH
        for t in range(T):
            att_bth = att + (bh * T + t) * T
            datt_bth = datt + (bh * T + t) * T
            dpreatt_bth = dpreatt + (bh * T + t) * T
            query_t = inp + (b * T + t) * C3 + h * hs
            dquery_t = dinp + (b * T + t) * C3 + h * hs
            dout_bth = dout + (b * T + t) * C + h * hs

            # out = att @ v
            for t2 in range(t + 1):
                value_t2 = inp + (b * T + t2) * C3 + h * hs + 2 * C
                dvalue_t2 = dinp + (b * T + t2) * C3 + h * hs + 2 * C
                att_btht2 = att_bth[t2]
                dot = 0.0
                for i in range(hs):
                    dot = dot + value_t2[i] * dout_bth[i]
                    dvalue_t2[i] = dvalue_t2[i] + att_btht2 * dout_bth[i]
                datt_bth[t2] = datt_bth[t2] + dot

            # softmax: dpreatt[t2] = att[t2] * (datt[t2] - sum_t3 att[t3] datt[t3]), which is
            # llm.c's double loop over the Jacobian att[t2] (delta(t2,t3) - att[t3]) in O(T)
            att_dot_datt = 0.0
            for t2 in range(t + 1):
                att_dot_datt = att_dot_datt + att_bth[t2] * datt_bth[t2]
            for t2 in range(t + 1):
                dpreatt_bth[t2] = dpreatt_bth[t2] + att_bth[t2] * (datt_bth[t2] - att_dot_datt)

            # preatt = q . k * scale
            for t2 in range(t + 1):
                key_t2 = inp + (b * T + t2) * C3 + h * hs + C
                dkey_t2 = dinp + (b * T + t2) * C3 + h * hs + C
                dscore = dpreatt_bth[t2] * scale
                for i in range(hs):
                    dquery_t[i] = dquery_t[i] + key_t2[i] * dscore
                    dkey_t2[i] = dkey_t2[i] + query_t[i] * dscore


cdef int expect_shape(str where, str name, const Py_ssize_t* shape, int ndim, tuple expected) except -1:
    got = tuple([shape[i] for i in range(ndim)])
    if got != expected:
        raise ValueError(f"{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int check_inp(str where, const float[:, :, ::1] inp, int NH) except -1:
    cdef Py_ssize_t C3 = inp.shape[2]
    if inp.shape[0] > INT_MAX or inp.shape[1] > INT_MAX or C3 > INT_MAX:
        raise ValueError(f"{where}: inp shape ({inp.shape[0]}, {inp.shape[1]}, {C3}) exceeds the int range")
    if C3 % 3 != 0:
        raise ValueError(f"{where}: inp has {C3} channels, expected 3*C (q, k, v)")
    if NH <= 0 or (C3 // 3) % NH != 0:
        raise ValueError(f"{where}: NH={NH} heads must be positive and divide C={C3 // 3}")
    return 0


def forward(float[:, :, ::1] out, float[:, :, :, ::1] preatt, float[:, :, :, ::1] att,
            const float[:, :, ::1] inp, int NH):
    """out (B,T,C), preatt, att (B,NH,T,T)  <-  causal self-attention of inp (B,T,3C)."""
    where = "attention.forward"
    check_inp(where, inp, NH)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    expect_shape(where, "out", out.shape, 3, (B, T, C))
    expect_shape(where, "preatt", preatt.shape, 4, (B, NH, T, T))
    expect_shape(where, "att", att.shape, 4, (B, NH, T, T))
    with nogil:
        attention_forward(&out[0, 0, 0], &preatt[0, 0, 0, 0], &att[0, 0, 0, 0], &inp[0, 0, 0],
                          B, T, C, NH)


def backward(float[:, :, ::1] dinp, float[:, :, :, ::1] dpreatt, float[:, :, :, ::1] datt,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[:, :, :, ::1] att,
             int NH):
    """dinp (B,T,3C), dpreatt, datt (B,NH,T,T)  +=  gradients from dout (B,T,C)."""
    where = "attention.backward"
    check_inp(where, inp, NH)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    expect_shape(where, "dinp", dinp.shape, 3, (B, T, 3 * C))
    expect_shape(where, "dout", dout.shape, 3, (B, T, C))
    expect_shape(where, "att", att.shape, 4, (B, NH, T, T))
    expect_shape(where, "dpreatt", dpreatt.shape, 4, (B, NH, T, T))
    expect_shape(where, "datt", datt.shape, 4, (B, NH, T, T))
    with nogil:
        attention_backward(&dinp[0, 0, 0], &dpreatt[0, 0, 0, 0], &datt[0, 0, 0, 0], &dout[0, 0, 0],
                           &inp[0, 0, 0], &att[0, 0, 0, 0], B, T, C, NH)
