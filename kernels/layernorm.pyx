# LayerNorm over the channels of each position, as in GPT-2 (eps = 1e-5):
#   mean[b,t] = sum_i inp[b,t,i] / C
#   rstd[b,t] = 1 / sqrt(sum_i (inp[b,t,i] - mean)^2 / C + eps)
#   out[b,t,i] = (inp[b,t,i] - mean) * rstd * weight[i] + bias[i]
#   inp, out (B,T,C); mean, rstd (B,T), kept for the backward pass; weight, bias (C,)
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free

from kernels.bf16 cimport load, store
from kernels.parallel cimport max_threads

include "kernels/layernorm_wrappers.pxi"

cdef float EPS = 1e-5

cdef enum:
    # per-thread scratch rows are whole 64-byte cache lines long, so threads barely share lines
    FLOATS_PER_CACHE_LINE = 16


cdef void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                            const floatX* weight, const floatX* bias, int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef const floatX* x
    cdef floatX* out_bt
    cdef float m, v, s, xshift
    for bt in prange(BT, schedule="static"):
        x = inp + bt * C
        out_bt = out + bt * C
        m = 0.0
        for i in range(C):
            m = m + load(x, i)
        m = m / C
        # variance from the shifted values (two passes): no cancellation for large means
        v = 0.0
        for i in range(C):
            xshift = load(x, i) - m
            v = v + xshift * xshift
        v = v / C
        s = 1.0 / sqrtf(v + EPS)
        for i in range(C):
            store(out_bt, i, (s * (load(x, i) - m)) * load(weight, i) + load(bias, i))
        mean[bt] = m
        rstd[bt] = s


cdef inline void layernorm_backward_row(floatX* dinp_bt, float* dweight, float* dbias,
                                        const floatX* dout_bt, const floatX* inp_bt,
                                        const floatX* weight, float mean_bt, float rstd_bt,
                                        int C) noexcept nogil:
    # one position: dinp_bt (C,) += ..., and this position's share of dweight, dbias (C,)
    cdef Py_ssize_t i
    cdef float norm_i, dnorm_i, dval
    # the two reductions over the channels that every dinp_bt[i] depends on
    cdef float dnorm_mean = 0.0
    cdef float dnorm_norm_mean = 0.0
    for i in range(C):
        norm_i = (load(inp_bt, i) - mean_bt) * rstd_bt
        dnorm_i = load(weight, i) * load(dout_bt, i)
        dnorm_mean += dnorm_i
        dnorm_norm_mean += dnorm_i * norm_i
    dnorm_mean = dnorm_mean / C
    dnorm_norm_mean = dnorm_norm_mean / C
    for i in range(C):
        norm_i = (load(inp_bt, i) - mean_bt) * rstd_bt
        dnorm_i = load(weight, i) * load(dout_bt, i)
        # the gradient flows through the normalisation directly, through the mean, and
        # through the variance
        dval = dnorm_i - dnorm_mean - norm_i * dnorm_norm_mean
        store(dinp_bt, i, load(dinp_bt, i) + dval * rstd_bt)
    # a separate loop for the parameter gradients: few enough pointers that the compiler
    # still vectorises both loops (it must check every output against every input)
    for i in range(C):
        norm_i = (load(inp_bt, i) - mean_bt) * rstd_bt
        dbias[i] += load(dout_bt, i)
        dweight[i] += norm_i * load(dout_bt, i)


cdef void layernorm_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                             const floatX* inp, const floatX* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil:
    # dinp is per position, so threads split the positions; dweight and dbias sum over all
    # positions, so each thread sums into its own scratch rows, added up at the end
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i, th
    cdef Py_ssize_t stride = (C + FLOATS_PER_CACHE_LINE - 1) // FLOATS_PER_CACHE_LINE * FLOATS_PER_CACHE_LINE
    cdef int num_threads = max_threads()
    if num_threads > BT:
        num_threads = <int>BT
    cdef float* scratch = NULL  # (num_threads, 2, stride): dweight row, dbias row per thread
    cdef float* dweight_th
    cdef float* dbias_th
    if num_threads > 1:
        scratch = <float*>calloc(num_threads * 2 * stride, sizeof(float))
    if scratch == NULL:
        # one thread (or no memory for the scratch): sum straight into dweight, dbias
        for bt in range(BT):
            layernorm_backward_row(dinp + bt * C, dweight, dbias, dout + bt * C, inp + bt * C,
                                   weight, mean[bt], rstd[bt], C)
        return
    for bt in prange(BT, schedule="static", num_threads=num_threads):
        dweight_th = scratch + threadid() * 2 * stride
        dbias_th = dweight_th + stride
        layernorm_backward_row(dinp + bt * C, dweight_th, dbias_th, dout + bt * C, inp + bt * C,
                               weight, mean[bt], rstd[bt], C)
    for th in range(num_threads):
        dweight_th = scratch + th * 2 * stride
        dbias_th = dweight_th + stride
        for i in range(C):
            dweight[i] += dweight_th[i]
            dbias[i] += dbias_th[i]
    free(scratch)
