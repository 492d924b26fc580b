# Python wrappers shared by the dev/cpu/layernorm_N variants: the same names and arguments as
# kernels.layernorm, so dev/ab.py drives every variant the same way.

cdef int _check(str where, str name, tuple got, tuple expected) except -1:
    if got != expected:
        raise ValueError(f"layernorm.{where}: {name} has shape {got}, expected {expected}")
    return 0


def forward(float[:, :, ::1] out, float[:, ::1] mean, float[:, ::1] rstd,
            const float[:, :, ::1] inp, const float[::1] weight, const float[::1] bias):
    """out (B,T,C), mean (B,T), rstd (B,T) = layernorm of inp (B,T,C) with weight, bias (C,)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2]
    _check("forward", "out", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C))
    _check("forward", "mean", (mean.shape[0], mean.shape[1]), (B, T))
    _check("forward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    _check("forward", "weight", (weight.shape[0],), (C,))
    _check("forward", "bias", (bias.shape[0],), (C,))
    if B * T == 0 or C == 0:
        return
    with nogil:
        layernorm_forward(&out[0, 0, 0], &mean[0, 0], &rstd[0, 0], &inp[0, 0, 0],
                          &weight[0], &bias[0], B, T, C)


def backward(float[:, :, ::1] dinp, float[::1] dweight, float[::1] dbias,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[::1] weight,
             const float[:, ::1] mean, const float[:, ::1] rstd):
    """dinp (B,T,C), dweight, dbias (C,) += gradients of layernorm; mean, rstd from forward."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2]
    _check("backward", "dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C))
    _check("backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C))
    _check("backward", "dweight", (dweight.shape[0],), (C,))
    _check("backward", "dbias", (dbias.shape[0],), (C,))
    _check("backward", "weight", (weight.shape[0],), (C,))
    _check("backward", "mean", (mean.shape[0], mean.shape[1]), (B, T))
    _check("backward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    if B * T == 0 or C == 0:
        return
    with nogil:
        layernorm_backward(&dinp[0, 0, 0], &dweight[0], &dbias[0], &dout[0, 0, 0],
                           &inp[0, 0, 0], &weight[0], &mean[0, 0], &rstd[0, 0], B, T, C)
