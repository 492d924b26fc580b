# Python wrappers shared by the dev/cpu/matmul_N variants: the same names and arguments as
# kernels.matmul, so dev/ab.py drives every variant (and the promoted kernel) the same way.
# Included (not imported) so that each variant's cdef functions are the ones wrapped.

cdef int _expect_shape(str where, str name, tuple got, tuple expected) except -1:
    if got != expected:
        raise ValueError(f"{where}: {name} has shape {got}, expected {expected}")
    return 0


def forward(float[:, :, ::1] out, const float[:, :, ::1] inp, const float[:, ::1] weight,
            const float[::1] bias=None):
    """out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC,) (bias may be None)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    _expect_shape("matmul.forward", "weight", (weight.shape[0], weight.shape[1]), (OC, C))
    _expect_shape("matmul.forward", "out", (out.shape[0], out.shape[1], out.shape[2]), (B, T, OC))
    if bias is not None:
        _expect_shape("matmul.forward", "bias", (bias.shape[0],), (OC,))
    if B * T == 0 or OC == 0:
        return
    cdef const float* bias_ptr = &bias[0] if bias is not None else NULL
    with nogil:
        matmul_forward(&out[0, 0, 0], &inp[0, 0, 0], &weight[0, 0], bias_ptr, B, T, C, OC)


def backward(float[:, :, ::1] dinp, float[:, ::1] dweight, float[::1] dbias,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[:, ::1] weight):
    """dinp (B,T,C), dweight (OC,C), dbias (OC,) or None  +=  gradients from dout (B,T,OC)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2], OC = weight.shape[0]
    _expect_shape("matmul.backward", "weight", (weight.shape[0], weight.shape[1]), (OC, C))
    _expect_shape("matmul.backward", "dout", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, OC))
    _expect_shape("matmul.backward", "dinp", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, C))
    _expect_shape("matmul.backward", "dweight", (dweight.shape[0], dweight.shape[1]), (OC, C))
    if dbias is not None:
        _expect_shape("matmul.backward", "dbias", (dbias.shape[0],), (OC,))
    if B * T == 0 or OC == 0 or C == 0:
        return
    cdef float* dbias_ptr = &dbias[0] if dbias is not None else NULL
    with nogil:
        matmul_backward(&dinp[0, 0, 0], &dweight[0, 0], dbias_ptr, &dout[0, 0, 0], &inp[0, 0, 0],
                        &weight[0, 0], B, T, C, OC)
