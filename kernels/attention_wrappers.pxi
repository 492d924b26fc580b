# Python wrappers of kernels/attention.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/attention.pyx and by every dev/cpu/attention_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

cdef int _check(str where, tuple got, tuple expected, str name) except -1:
    if got != expected:
        raise ValueError(f"attention.{where}: {name} has shape {got}, expected {expected}")
    return 0


def forward(float[:, :, ::1] out, float[:, :, :, ::1] preatt, float[:, :, :, ::1] att,
            const float[:, :, ::1] inp, int NH):
    """out (B,T,C), preatt, att (B,NH,T,T)  <-  causal self-attention of inp (B,T,3C)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    if inp.shape[2] != 3 * C or NH <= 0 or C % NH != 0:
        raise ValueError(f"attention.forward: inp has {inp.shape[2]} channels, expected 3*C "
                         f"with C a multiple of NH={NH}")
    _check("forward", (out.shape[0], out.shape[1], out.shape[2]), (B, T, C), "out")
    _check("forward", (preatt.shape[0], preatt.shape[1], preatt.shape[2], preatt.shape[3]), (B, NH, T, T), "preatt")
    _check("forward", (att.shape[0], att.shape[1], att.shape[2], att.shape[3]), (B, NH, T, T), "att")
    if B * T == 0:
        return
    with nogil:
        attention_forward(&out[0, 0, 0], &preatt[0, 0, 0, 0], &att[0, 0, 0, 0], &inp[0, 0, 0],
                          B, T, C, NH)


def backward(float[:, :, ::1] dinp, float[:, :, :, ::1] dpreatt, float[:, :, :, ::1] datt,
             const float[:, :, ::1] dout, const float[:, :, ::1] inp, const float[:, :, :, ::1] att,
             int NH):
    """dinp (B,T,3C), dpreatt, datt (B,NH,T,T)  +=  gradients from dout (B,T,C)."""
    cdef int B = inp.shape[0], T = inp.shape[1], C = inp.shape[2] // 3
    if inp.shape[2] != 3 * C or NH <= 0 or C % NH != 0:
        raise ValueError(f"attention.backward: inp has {inp.shape[2]} channels, expected 3*C "
                         f"with C a multiple of NH={NH}")
    _check("backward", (dinp.shape[0], dinp.shape[1], dinp.shape[2]), (B, T, 3 * C), "dinp")
    _check("backward", (dout.shape[0], dout.shape[1], dout.shape[2]), (B, T, C), "dout")
    _check("backward", (att.shape[0], att.shape[1], att.shape[2], att.shape[3]), (B, NH, T, T), "att")
    _check("backward", (dpreatt.shape[0], dpreatt.shape[1], dpreatt.shape[2], dpreatt.shape[3]), (B, NH, T, T), "dpreatt")
    _check("backward", (datt.shape[0], datt.shape[1], datt.shape[2], datt.shape[3]), (B, NH, T, T), "datt")
    if B * T == 0:
        return
    with nogil:
        attention_backward(&dinp[0, 0, 0], &dpreatt[0, 0, 0, 0], &datt[0, 0, 0, 0], &dout[0, 0, 0],
                           &inp[0, 0, 0], &att[0, 0, 0, 0], B, T, C, NH)
