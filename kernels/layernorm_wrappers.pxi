# Python wrappers of kernels/layernorm.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/layernorm.pyx and by every dev/cpu/layernorm_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"layernorm.{where}: {name} has shape {got}, expected {want}")


def forward(float[:, :, ::1] out, float[:, ::1] mean, float[:, ::1] rstd,
            const float[:, :, ::1] inp, const float[::1] weight, const float[::1] bias):
    """out (B,T,C), mean (B,T), rstd (B,T) = layernorm of inp (B,T,C) with weight, bias (C,)."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    _check_shape("forward", "out", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C))
    _check_shape("forward", "mean", (mean.shape[0], mean.shape[1]), (B, T))
    _check_shape("forward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    _check_shape("forward", "weight", (weight.shape[0],), (C,))
    _check_shape("forward", "bias", (bias.shape[0],), (C,))
    if C == 0:
        raise ValueError("layernorm.forward: inp has no channels (C = 0)")
    if B == 0 or T == 0:
        return
    with nogil:
        layernorm_forward(&out[0, 0, 0], &mean[0, 0], &rstd[0, 0], &inp[0, 0, 0],
                          &weight[0], &bias[0], B, T, C)


def backward(float[:, :, ::1] dinp, float[::1] dweight, float[::1] dbias,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[::1] weight,
             const float[:, ::1] mean, const float[:, ::1] rstd):
    """dinp (B,T,C), dweight, dbias (C,) += gradients of layernorm; mean, rstd from forward."""
    B, T, C = inp.shape[0], inp.shape[1], inp.shape[2]
    _check_shape("backward", "dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C))
    _check_shape("backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C))
    _check_shape("backward", "dweight", (dweight.shape[0],), (C,))
    _check_shape("backward", "dbias", (dbias.shape[0],), (C,))
    _check_shape("backward", "weight", (weight.shape[0],), (C,))
    _check_shape("backward", "mean", (mean.shape[0], mean.shape[1]), (B, T))
    _check_shape("backward", "rstd", (rstd.shape[0], rstd.shape[1]), (B, T))
    if B == 0 or T == 0 or C == 0:
        return
    with nogil:
        layernorm_backward(&dinp[0, 0, 0], &dweight[0], &dbias[0], &dout[0, 0, 0],
                           &inp[0, 0, 0], &weight[0], &mean[0, 0], &rstd[0, 0], B, T, C)
