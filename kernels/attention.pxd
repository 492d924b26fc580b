from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf

# Causal multi-head self-attention.  NH heads, head size hs = C / NH.
cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil
# out (B,T,C); preatt, att (B,NH,T,T) pre-/post-softmax scores; inp (B,T,3C) = q,k,v
cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil
# dinp (B,T,3C) += ...; dpreatt, datt (B,NH,T,T) scratch gradients (+=); dout (B,T,C)


# Shared with kernels/attention_gqa (which passes preatt == att: it keeps only the
# probabilities); each element is read before it is written, so in place is safe.
cdef inline void softmax_rows(float* preatt, float* att, int t0, int t1, int T) noexcept nogil:
    # rows t0..t1 of one head: att = softmax of preatt over t2 <= t; both zero above
    cdef Py_ssize_t t, t2
    cdef float* pre_t
    cdef float* att_t
    cdef float maxval, expsum, inv, e
    for t in range(t0, t1):
        pre_t = preatt + t * T
        att_t = att + t * T
        maxval = row_max(pre_t, t + 1)
        expsum = 0.0
        for t2 in range(t + 1):
            e = vexpf(pre_t[t2] - maxval)
            att_t[t2] = e
            expsum = expsum + e
        inv = 1.0 / expsum
        for t2 in range(t + 1):
            att_t[t2] = att_t[t2] * inv
        for t2 in range(t + 1, T):
            pre_t[t2] = 0.0
            att_t[t2] = 0.0
