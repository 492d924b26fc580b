# layernorm variant 2: multi-threaded and vectorised, deterministic.
#   out (B,T,C) = (inp - mean) * rstd * weight + bias;  mean, rstd (B,T) kept for backward
#   backward: dinp (B,T,C), dweight, dbias (C,) += ...
# Forward: one position per task (two passes over the row: mean, then the variance of the
# shifted values, so a large mean cannot cancel).  Backward in two parallel sweeps that never
# write the same float: over positions for dinp, then over blocks of channels for dweight and
# dbias (each block sums all positions in order: no scratch, no final reduction, and the same
# result for any thread count).  The second sweep re-reads inp and dout, which at GPT-2 sizes
# (B*T*C floats) are still in cache from the first.
from cython.parallel cimport prange
from libc.math cimport sqrtf

include "kernels/layernorm_wrappers.pxi"

cdef enum:
    CHANNEL_BLOCK = 64   # dweight/dbias floats per task: whole cache lines, vector-wide


cdef void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t bt, i
    cdef const float* x
    cdef float* out_bt
    cdef float m, v, s, d
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        x = inp + bt * C
        out_bt = out + bt * C
        m = 0.0
        for i in range(C):
            m = m + x[i]
        m = m / C
        v = 0.0
        for i in range(C):
            d = x[i] - m
            v = v + d * d
        s = 1.0 / sqrtf(v / C + <float>1e-5)
        for i in range(C):
            out_bt[i] = (x[i] - m) * s * weight[i] + bias[i]
        mean[bt] = m
        rstd[bt] = s


cdef inline void dinp_row(float* dinp_bt, const float* dout_bt, const float* inp_bt,
                          const float* weight, float m, float s, int C) noexcept nogil:
    cdef Py_ssize_t i
    cdef float dnorm_mean = 0.0, dnorm_norm_mean = 0.0, norm_i, dnorm_i
    for i in range(C):
        dnorm_i = weight[i] * dout_bt[i]
        dnorm_mean = dnorm_mean + dnorm_i
        dnorm_norm_mean = dnorm_norm_mean + dnorm_i * (inp_bt[i] - m) * s
    dnorm_mean = dnorm_mean / C
    dnorm_norm_mean = dnorm_norm_mean / C
    for i in range(C):
        norm_i = (inp_bt[i] - m) * s
        dinp_bt[i] = dinp_bt[i] + (weight[i] * dout_bt[i] - dnorm_mean - norm_i * dnorm_norm_mean) * s


cdef void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, block, i, c0, c1
    cdef const float* dout_bt
    cdef const float* inp_bt
    cdef float m, s
    for bt in prange(BT, schedule="static"):
        dinp_row(dinp + bt * C, dout + bt * C, inp + bt * C, weight, mean[bt], rstd[bt], C)
    for block in prange((C + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK, schedule="static"):
        c0 = block * CHANNEL_BLOCK
        c1 = min(c0 + CHANNEL_BLOCK, <Py_ssize_t>C)
        for bt in range(BT):
            dout_bt = dout + bt * C
            inp_bt = inp + bt * C
            m = mean[bt]
            s = rstd[bt]
            for i in range(c0, c1):
                dbias[i] = dbias[i] + dout_bt[i]
                dweight[i] = dweight[i] + (inp_bt[i] - m) * s * dout_bt[i]
