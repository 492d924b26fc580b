# LayerNorm over the channels of each position, as in GPT-2 (eps = 1e-5):
#   mean[b,t] = sum_i inp[b,t,i] / C
#   rstd[b,t] = 1 / sqrt(sum_i (inp[b,t,i] - mean)^2 / C + eps)
#   out[b,t,i] = (inp[b,t,i] - mean) * rstd * weight[i] + bias[i]
#   inp, out (B,T,C); mean, rstd (B,T), kept for the backward pass; weight, bias (C,)
# Backward sums dweight and dbias over the positions in float32 (per thread, then the threads'
# sums); into bf16 gradients, each element's whole sum is added once (rounded once).
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free

from kernels.bf16 cimport add_grad, load, store
from kernels.parallel cimport max_threads

include "kernels/layernorm_wrappers.pxi"

cdef float EPS = 1e-5

cdef enum:
    # per-thread scratch rows are whole 64-byte cache lines long, so threads barely share lines
    FLOATS_PER_CACHE_LINE = 16
    # channels of bf16 dweight, dbias whose float32 sums a thread keeps on its stack, where
    # there are no scratch rows
    PARAM_CHUNK = 64


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


cdef inline void layernorm_params_row(float* dweight, float* dbias, const floatX* dout_bt,
                                      const floatX* inp_bt, float mean_bt, float rstd_bt,
                                      Py_ssize_t n) noexcept nogil:
    # one position's share of dweight, dbias (n,): n channels, from the pointers' first
    cdef Py_ssize_t i
    cdef float norm_i
    for i in range(n):
        norm_i = (load(inp_bt, i) - mean_bt) * rstd_bt
        dbias[i] += load(dout_bt, i)
        dweight[i] += norm_i * load(dout_bt, i)


cdef inline void layernorm_backward_row(floatX* dinp_bt, float* dweight, float* dbias,
                                        const floatX* dout_bt, const floatX* inp_bt,
                                        const floatX* weight, float mean_bt, float rstd_bt,
                                        int C) noexcept nogil:
    # one position: dinp_bt (C,) += ..., and this position's share of dweight, dbias (C,)
    # (skipped where dweight is NULL: bf16 gradients' sums are made a chunk of channels at a time)
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
    if dweight != NULL:
        layernorm_params_row(dweight, dbias, dout_bt, inp_bt, mean_bt, rstd_bt, C)


cdef inline void layernorm_params_chunk(floatG* dweight, floatG* dbias, const floatX* dout,
                                        const floatX* inp, const float* mean, const float* rstd,
                                        Py_ssize_t BT, int C, Py_ssize_t c0,
                                        Py_ssize_t c1) noexcept nogil:
    # dweight, dbias [c0:c1] (at most PARAM_CHUNK channels) += their sums over all positions,
    # summed in float32 on this call's stack (one per thread), added once
    cdef float dweight_c[PARAM_CHUNK]
    cdef float dbias_c[PARAM_CHUNK]
    cdef Py_ssize_t bt, i
    for i in range(c1 - c0):
        dweight_c[i] = 0.0
        dbias_c[i] = 0.0
    for bt in range(BT):
        layernorm_params_row(dweight_c, dbias_c, dout + bt * C + c0, inp + bt * C + c0,
                             mean[bt], rstd[bt], c1 - c0)
    for i in range(c1 - c0):
        add_grad(dweight, c0 + i, dweight_c[i])
        add_grad(dbias, c0 + i, dbias_c[i])


cdef void layernorm_backward(floatX* dinp, floatG* dweight, floatG* dbias, const floatX* dout,
                             const floatX* inp, const floatX* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil:
    # dinp is per position, so threads split the positions; dweight and dbias sum over all
    # positions, so each thread sums into its own scratch rows, added up at the end
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i, th, chunk
    cdef Py_ssize_t stride = (C + FLOATS_PER_CACHE_LINE - 1) // FLOATS_PER_CACHE_LINE * FLOATS_PER_CACHE_LINE
    cdef int num_threads = max_threads()
    if num_threads > BT:
        num_threads = <int>BT
    cdef float* scratch = NULL  # (num_threads, 2, stride): dweight row, dbias row per thread
    cdef float* dweight_th
    cdef float* dbias_th
    cdef float dweight_i, dbias_i
    if num_threads > 1:
        scratch = <float*>calloc(num_threads * 2 * stride, sizeof(float))
    if scratch == NULL:
        if floatG is float:
            # one thread (or no memory for the scratch): sum straight into dweight, dbias
            for bt in range(BT):
                layernorm_backward_row(dinp + bt * C, dweight, dbias, dout + bt * C, inp + bt * C,
                                       weight, mean[bt], rstd[bt], C)
        else:
            # bf16 gradients take float32 sums: dinp position by position, then dweight and
            # dbias a chunk of channels at a time, over every position
            for bt in prange(BT, schedule="static", num_threads=num_threads):
                layernorm_backward_row(dinp + bt * C, NULL, NULL, dout + bt * C, inp + bt * C,
                                       weight, mean[bt], rstd[bt], C)
            for chunk in prange((C + PARAM_CHUNK - 1) // PARAM_CHUNK, schedule="static",
                                num_threads=num_threads):
                layernorm_params_chunk(dweight, dbias, dout, inp, mean, rstd, BT, C,
                                       chunk * PARAM_CHUNK,
                                       min(chunk * PARAM_CHUNK + PARAM_CHUNK, <Py_ssize_t>C))
        return
    for bt in prange(BT, schedule="static", num_threads=num_threads):
        dweight_th = scratch + threadid() * 2 * stride
        dbias_th = dweight_th + stride
        layernorm_backward_row(dinp + bt * C, dweight_th, dbias_th, dout + bt * C, inp + bt * C,
                               weight, mean[bt], rstd[bt], C)
    if floatG is float:
        for th in range(num_threads):
            dweight_th = scratch + th * 2 * stride
            dbias_th = dweight_th + stride
            for i in range(C):
                dweight[i] += dweight_th[i]
                dbias[i] += dbias_th[i]
    else:
        # bf16: the threads' rows summed in float32, then added once
        for i in range(C):
            dweight_i = 0.0
            dbias_i = 0.0
            for th in range(num_threads):
                dweight_i = dweight_i + scratch[th * 2 * stride + i]
                dbias_i = dbias_i + scratch[th * 2 * stride + stride + i]
            add_grad(dweight, i, dweight_i)
            add_grad(dbias, i, dbias_i)
    free(scratch)


# ----------------------------------------------------------------------------
# Python wrapper with bf16 gradients (tests), here rather than in kernels/layernorm_wrappers.pxi:
# the dev/cpu variants that include that file take float32 gradients only

def backward_bf16_grads(floatX[:, :, ::1] dinp, bf16[::1] dweight, bf16[::1] dbias,
                        const floatX[:, :, ::1] dout, const floatX[:, :, ::1] inp,
                        const floatX[::1] weight, const float[:, ::1] mean,
                        const float[:, ::1] rstd):
    """backward with bf16 gradients: dweight, dbias (C,) bf16 bits (uint16), each element
    rounded once; dinp, dout, inp (B,T,C), weight (C,) all float32 or all bf16 bits."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    for name, got, want in (("dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C)),
                            ("dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C)),
                            ("dweight", (dweight.shape[0],), (C,)),
                            ("dbias", (dbias.shape[0],), (C,)),
                            ("weight", (weight.shape[0],), (C,)),
                            ("mean", (mean.shape[0], mean.shape[1]), (B, T)),
                            ("rstd", (rstd.shape[0], rstd.shape[1]), (B, T))):
        _check_shape("backward_bf16_grads", name, got, want)
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        layernorm_backward(&dinp[0, 0, 0], &dweight[0], &dbias[0], &dout[0, 0, 0],
                           &inp[0, 0, 0], &weight[0], &mean[0, 0], &rstd[0, 0], B, T, C)
