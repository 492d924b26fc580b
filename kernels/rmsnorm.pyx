# RMSNorm over the channels of each position, as in Llama (Meta's reference, llama2.c):
#   rstd[b,t] = 1 / sqrt(sum_i inp[b,t,i]^2 / C + eps)
#   out[b,t,i] = inp[b,t,i] * rstd * weight[i]
#   inp, out (B,T,C); rstd (B,T), kept for the backward pass; weight (C,); no bias, no mean
# Backward, with norm = inp * rstd and g = weight * dout:
#   dinp    += rstd * (g - norm * sum_i(g_i norm_i) / C)
#   dweight += sum over positions of norm * dout      (skipped where dweight is NULL: frozen)
# summed in float32 (per thread, then the threads' sums); into a bf16 dweight, each element's
# whole sum is added once (rounded once).
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free

from kernels.bf16 cimport add_grad, load, store
from kernels.parallel cimport SERIAL_BELOW, max_threads

cdef enum:
    # per-thread dweight rows are whole 64-byte cache lines long, so threads barely share lines
    FLOATS_PER_CACHE_LINE = 16
    # channels of a bf16 dweight whose float32 sums a thread keeps on its stack, where there
    # are no scratch rows
    PARAM_CHUNK = 64


cdef void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight,
                          float eps, int B, int T, int C) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef const floatX* x
    cdef floatX* out_bt
    cdef float ss, s
    for bt in prange(BT, schedule="static", use_threads_if=BT * C >= SERIAL_BELOW):
        x = inp + bt * C
        out_bt = out + bt * C
        ss = 0.0
        for i in range(C):
            ss = ss + load(x, i) * load(x, i)
        s = 1.0 / sqrtf(ss / C + eps)
        for i in range(C):
            store(out_bt, i, (load(x, i) * s) * load(weight, i))
        rstd[bt] = s


cdef inline void rmsnorm_params_row(float* dweight, const floatX* dout_bt, const floatX* inp_bt,
                                    float rstd_bt, Py_ssize_t n) noexcept nogil:
    # one position's share of dweight (n,): n channels, from the pointers' first
    cdef Py_ssize_t i
    for i in range(n):
        dweight[i] += (load(inp_bt, i) * rstd_bt) * load(dout_bt, i)


cdef inline void rmsnorm_backward_row(floatX* dinp_bt, float* dweight, const floatX* dout_bt,
                                      const floatX* inp_bt, const floatX* weight, float rstd_bt,
                                      int C) noexcept nogil:
    # one position: dinp_bt (C,) += ..., and this position's share of dweight (C,) (or NULL)
    cdef Py_ssize_t i
    cdef float norm_i
    # the one reduction over the channels that every dinp_bt[i] depends on (through rstd)
    cdef float dnorm_norm_mean = 0.0
    for i in range(C):
        dnorm_norm_mean += load(weight, i) * load(dout_bt, i) * (load(inp_bt, i) * rstd_bt)
    dnorm_norm_mean = dnorm_norm_mean / C
    for i in range(C):
        norm_i = load(inp_bt, i) * rstd_bt
        store(dinp_bt, i, load(dinp_bt, i) + (load(weight, i) * load(dout_bt, i) - norm_i * dnorm_norm_mean) * rstd_bt)
    # separate loop: fewer pointers per loop, so the compiler still vectorises both
    if dweight != NULL:
        rmsnorm_params_row(dweight, dout_bt, inp_bt, rstd_bt, C)


cdef inline void rmsnorm_params_chunk(floatG* dweight, const floatX* dout, const floatX* inp,
                                      const float* rstd, Py_ssize_t BT, int C, Py_ssize_t c0,
                                      Py_ssize_t c1) noexcept nogil:
    # dweight[c0:c1] (at most PARAM_CHUNK channels) += its sums over all positions, summed in
    # float32 on this call's stack (one per thread), added once
    cdef float dweight_c[PARAM_CHUNK]
    cdef Py_ssize_t bt, i
    for i in range(c1 - c0):
        dweight_c[i] = 0.0
    for bt in range(BT):
        rmsnorm_params_row(dweight_c, dout + bt * C + c0, inp + bt * C + c0, rstd[bt], c1 - c0)
    for i in range(c1 - c0):
        add_grad(dweight, c0 + i, dweight_c[i])


cdef void rmsnorm_backward(floatX* dinp, floatG* dweight, const floatX* dout, const floatX* inp,
                           const floatX* weight, const float* rstd, int B, int T, int C) noexcept nogil:
    # dinp is per position, so threads split the positions; dweight sums over all positions,
    # so each thread sums into its own scratch row, added up at the end (as layernorm does)
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i, th, chunk
    cdef Py_ssize_t stride = (C + FLOATS_PER_CACHE_LINE - 1) // FLOATS_PER_CACHE_LINE * FLOATS_PER_CACHE_LINE
    cdef int num_threads = max_threads() if BT * C >= SERIAL_BELOW else 1
    if num_threads > BT:
        num_threads = <int>BT
    cdef float* scratch = NULL  # (num_threads, stride): one dweight row per thread
    cdef float* dweight_th
    cdef float dweight_i
    if dweight == NULL:
        # a frozen weight: dinp alone, no sums to gather
        for bt in prange(BT, schedule="static", num_threads=num_threads):
            rmsnorm_backward_row(dinp + bt * C, NULL, dout + bt * C, inp + bt * C, weight,
                                 rstd[bt], C)
        return
    if num_threads > 1:
        scratch = <float*>calloc(num_threads * stride, sizeof(float))
    if scratch == NULL:
        if floatG is float:
            # one thread (or no memory for the scratch): sum straight into dweight
            for bt in range(BT):
                rmsnorm_backward_row(dinp + bt * C, dweight, dout + bt * C, inp + bt * C,
                                     weight, rstd[bt], C)
        else:
            # a bf16 dweight takes float32 sums: dinp position by position, then dweight a
            # chunk of channels at a time, over every position
            for bt in prange(BT, schedule="static", num_threads=num_threads):
                rmsnorm_backward_row(dinp + bt * C, NULL, dout + bt * C, inp + bt * C, weight,
                                     rstd[bt], C)
            for chunk in prange((C + PARAM_CHUNK - 1) // PARAM_CHUNK, schedule="static",
                                num_threads=num_threads):
                rmsnorm_params_chunk(dweight, dout, inp, rstd, BT, C, chunk * PARAM_CHUNK,
                                     min(chunk * PARAM_CHUNK + PARAM_CHUNK, <Py_ssize_t>C))
        return
    for bt in prange(BT, schedule="static", num_threads=num_threads):
        dweight_th = scratch + threadid() * stride
        rmsnorm_backward_row(dinp + bt * C, dweight_th, dout + bt * C, inp + bt * C,
                             weight, rstd[bt], C)
    if floatG is float:
        for th in range(num_threads):
            dweight_th = scratch + th * stride
            for i in range(C):
                dweight[i] += dweight_th[i]
    else:
        # bf16: the threads' rows summed in float32, then added once
        for i in range(C):
            dweight_i = 0.0
            for th in range(num_threads):
                dweight_i = dweight_i + scratch[th * stride + i]
            add_grad(dweight, i, dweight_i)
    free(scratch)


# ----------------------------------------------------------------------------
# Python wrappers: check shapes, then run the kernel without the GIL

def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"rmsnorm.{where}: {name} has shape {got}, expected {want}")


def forward(float[:, :, ::1] out, float[:, ::1] rstd, const float[:, :, ::1] inp,
            const float[::1] weight, float eps=1e-5):
    """out (B,T,C), rstd (B,T) = RMSNorm of inp (B,T,C) with weight (C,)."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    _check_shape("forward", "out", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C))
    _check_shape("forward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    _check_shape("forward", "weight", (weight.shape[0],), (C,))
    if C == 0:
        raise ValueError("rmsnorm.forward: inp has no channels (C = 0)")
    if not eps > 0:
        raise ValueError(f"rmsnorm.forward: eps must be positive, got {eps}")
    if B == 0 or T == 0:
        return
    with nogil:
        rmsnorm_forward(&out[0, 0, 0], &rstd[0, 0], &inp[0, 0, 0], &weight[0], eps, B, T, C)


def backward(float[:, :, ::1] dinp, float[::1] dweight, const float[:, :, ::1] dout,
             const float[:, :, ::1] inp, const float[::1] weight, const float[:, ::1] rstd):
    """dinp (B,T,C), dweight (C,) += gradients of RMSNorm; rstd (B,T) from forward."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    _check_shape("backward", "dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C))
    _check_shape("backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C))
    _check_shape("backward", "dweight", (dweight.shape[0],), (C,))
    _check_shape("backward", "weight", (weight.shape[0],), (C,))
    _check_shape("backward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        rmsnorm_backward(&dinp[0, 0, 0], &dweight[0], &dout[0, 0, 0], &inp[0, 0, 0],
                         &weight[0], &rstd[0, 0], B, T, C)


def backward_bf16_grads(floatX[:, :, ::1] dinp, bf16[::1] dweight, const floatX[:, :, ::1] dout,
                        const floatX[:, :, ::1] inp, const floatX[::1] weight,
                        const float[:, ::1] rstd):
    """backward with a bf16 gradient: dweight (C,) bf16 bits (uint16), or None (frozen), each
    element rounded once; dinp, dout, inp (B,T,C), weight (C,) all float32 or all bf16 bits."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    where = "backward_bf16_grads"
    _check_shape(where, "dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C))
    _check_shape(where, "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C))
    if dweight is not None:
        _check_shape(where, "dweight", (dweight.shape[0],), (C,))
    _check_shape(where, "weight", (weight.shape[0],), (C,))
    _check_shape(where, "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    if B == 0 or T == 0 or C == 0:
        return
    cdef bf16* dweight_ptr = &dweight[0] if dweight is not None else NULL
    with nogil:
        rmsnorm_backward(&dinp[0, 0, 0], dweight_ptr, &dout[0, 0, 0], &inp[0, 0, 0],
                         &weight[0], &rstd[0, 0], B, T, C)
