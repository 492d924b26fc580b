# Python wrappers of kernels/flash_attention.pyx: check the arguments, then run the kernel without
# the GIL.  Included, not imported, by kernels/flash_attention.pyx and by every
# dev/cpu/flash_attention_N.pyx variant, so each module wraps its own cdef functions under the
# same names and arguments.

cdef int _check(str where, tuple got, tuple expected, str name) except -1:
    if got != expected:
        raise ValueError(f"flash_attention.{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int _check_heads(str where, Py_ssize_t channels, int NH) except -1:
    if channels % 3 != 0 or NH <= 0 or (channels // 3) % NH != 0:
        raise ValueError(f"flash_attention.{where}: inp has {channels} channels, expected 3*C "
                         f"with C a multiple of NH={NH}")
    return 0


def forward(float[:, :, ::1] out, float[:, :, ::1] lse, const float[:, :, ::1] inp, int NH):
    """out (B,T,C), lse (B,NH,T)  <-  causal self-attention of inp (B,T,3C), and each row's
    log-sum-exp of its scaled scores."""
    _check_heads("forward", inp.shape[2], NH)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    _check("forward", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C), "out")
    _check("forward", (lse.shape[0], lse.shape[1], lse.shape[2]), (B, NH, T), "lse")
    if B * T == 0:
        return
    with nogil:
        flash_attention_forward(&out[0, 0, 0], &lse[0, 0, 0], &inp[0, 0, 0], B, T, C, NH)


def backward(float[:, :, ::1] dinp, const float[:, :, ::1] dout, const float[:, :, ::1] inp,
             const float[:, :, ::1] out, const float[:, :, ::1] lse, int NH):
    """dinp (B,T,3C)  +=  the gradient from dout (B,T,C), recomputing the softmax from inp and
    the forward's out (B,T,C) and lse (B,NH,T)."""
    _check_heads("backward", inp.shape[2], NH)
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    _check("backward", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, 3 * C), "dinp")
    _check("backward", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C), "dout")
    _check("backward", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C), "out")
    _check("backward", (lse.shape[0], lse.shape[1], lse.shape[2]), (B, NH, T), "lse")
    if B * T == 0:
        return
    with nogil:
        flash_attention_backward(&dinp[0, 0, 0], &dout[0, 0, 0], &inp[0, 0, 0], &out[0, 0, 0],
                                 &lse[0, 0, 0], B, T, C, NH)
