# RMSNorm over the channels of each position, as in Llama (Meta's reference, llama2.c):
#   rstd[b,t] = 1 / sqrt(sum_i inp[b,t,i]^2 / C + eps)
#   out[b,t,i] = inp[b,t,i] * rstd * weight[i]
#   inp, out (B,T,C); rstd (B,T), kept for the backward pass; weight (C,); no bias, no mean
# Backward, with norm = inp * rstd and g = weight * dout:
#   dinp    += rstd * (g - norm * sum_i(g_i norm_i) / C)
#   dweight += sum over positions of norm * dout      (skipped where dweight is NULL: frozen)
from cython.parallel cimport prange, threadid
from libc.math cimport sqrtf
from libc.stdlib cimport calloc, free

from kernels.bf16 cimport load, store
from kernels.parallel cimport SERIAL_BELOW, max_threads

cdef enum:
    # per-thread dweight rows are whole 64-byte cache lines long, so threads barely share lines
    FLOATS_PER_CACHE_LINE = 16


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
        for i in range(C):
            dweight[i] += (load(inp_bt, i) * rstd_bt) * load(dout_bt, i)


cdef void rmsnorm_backward(floatX* dinp, float* dweight, const floatX* dout, const floatX* inp,
                           const floatX* weight, const float* rstd, int B, int T, int C) noexcept nogil:
    # dinp is per position, so threads split the positions; dweight sums over all positions,
    # so each thread sums into its own scratch row, added up at the end (as layernorm does)
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i, th
    cdef Py_ssize_t stride = (C + FLOATS_PER_CACHE_LINE - 1) // FLOATS_PER_CACHE_LINE * FLOATS_PER_CACHE_LINE
    cdef int num_threads = max_threads() if BT * C >= SERIAL_BELOW else 1
    if num_threads > BT:
        num_threads = <int>BT
    cdef float* scratch = NULL  # (num_threads, stride): one dweight row per thread
    cdef float* dweight_th
    if dweight == NULL:
        # a frozen weight: dinp alone, no sums to gather
        for bt in prange(BT, schedule="static", num_threads=num_threads):
            rmsnorm_backward_row(dinp + bt * C, NULL, dout + bt * C, inp + bt * C, weight,
                                 rstd[bt], C)
        return
    if num_threads > 1:
        scratch = <float*>calloc(num_threads * stride, sizeof(float))
    if scratch == NULL:
        # one thread (or no memory for the scratch): sum straight into dweight
        for bt in range(BT):
            rmsnorm_backward_row(dinp + bt * C, dweight, dout + bt * C, inp + bt * C,
                                 weight, rstd[bt], C)
        return
    for bt in prange(BT, schedule="static", num_threads=num_threads):
        dweight_th = scratch + threadid() * stride
        rmsnorm_backward_row(dinp + bt * C, dweight_th, dout + bt * C, inp + bt * C,
                             weight, rstd[bt], C)
    for th in range(num_threads):
        dweight_th = scratch + th * stride
        for i in range(C):
            dweight[i] += dweight_th[i]
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
