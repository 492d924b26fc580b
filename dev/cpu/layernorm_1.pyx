# layernorm variant 1: the straight port of llm.c's CPU layernorm, single-threaded.
#   out (B,T,C) = (inp - mean) * rstd * weight + bias;  mean, rstd (B,T) kept for backward
#   backward: dinp (B,T,C), dweight, dbias (C,) += ...
from libc.math cimport sqrtf

include "kernels/layernorm_wrappers.pxi"


cdef void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int B, int T, int C) noexcept nogil:
    cdef float eps = 1e-5
    cdef Py_ssize_t b, t, i
    cdef const float* x
    cdef float* out_bt
    cdef float m, v, s, xshift, n
    for b in range(B):
        for t in range(T):
            x = inp + (b * T + t) * C
            m = 0.0
            for i in range(C):
                m += x[i]
            m = m / C
            v = 0.0
            for i in range(C):
                xshift = x[i] - m
                v += xshift * xshift
            v = v / C
            s = 1.0 / sqrtf(v + eps)
            out_bt = out + (b * T + t) * C
            for i in range(C):
                n = s * (x[i] - m)
                out_bt[i] = n * weight[i] + bias[i]
            mean[b * T + t] = m
            rstd[b * T + t] = s


cdef void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t b, t, i
    cdef const float* dout_bt
    cdef const float* inp_bt
    cdef float* dinp_bt
    cdef float mean_bt, rstd_bt, dnorm_mean, dnorm_norm_mean, norm_bti, dnorm_i, dval
    for b in range(B):
        for t in range(T):
            dout_bt = dout + (b * T + t) * C
            inp_bt = inp + (b * T + t) * C
            dinp_bt = dinp + (b * T + t) * C
            mean_bt = mean[b * T + t]
            rstd_bt = rstd[b * T + t]
            # first: the two reductions over the channels
            dnorm_mean = 0.0
            dnorm_norm_mean = 0.0
            for i in range(C):
                norm_bti = (inp_bt[i] - mean_bt) * rstd_bt
                dnorm_i = weight[i] * dout_bt[i]
                dnorm_mean += dnorm_i
                dnorm_norm_mean += dnorm_i * norm_bti
            dnorm_mean = dnorm_mean / C
            dnorm_norm_mean = dnorm_norm_mean / C
            # then: accumulate all the gradients
            for i in range(C):
                norm_bti = (inp_bt[i] - mean_bt) * rstd_bt
                dnorm_i = weight[i] * dout_bt[i]
                dbias[i] += dout_bt[i]
                dweight[i] += norm_bti * dout_bt[i]
                dval = dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean
                dinp_bt[i] += dval * rstd_bt
