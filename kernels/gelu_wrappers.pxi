# Python wrappers of kernels/gelu.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/gelu.pyx and by every dev/cpu/gelu_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

def forward(float[::1] out, const float[::1] inp):
    """out (N,) = gelu(inp)."""
    cdef Py_ssize_t N = inp.shape[0]
    if out.shape[0] != N:
        raise ValueError(f"gelu.forward: out has {out.shape[0]} elements, expected {N}")
    if N == 0:
        return
    with nogil:
        gelu_forward(&out[0], &inp[0], N)


def backward(float[::1] dinp, const float[::1] inp, const float[::1] dout):
    """dinp (N,) += gelu'(inp) * dout."""
    cdef Py_ssize_t N = inp.shape[0]
    if dinp.shape[0] != N or dout.shape[0] != N:
        raise ValueError(f"gelu.backward: dinp, dout have {dinp.shape[0]}, {dout.shape[0]} "
                         f"elements, expected {N}")
    if N == 0:
        return
    with nogil:
        gelu_backward(&dinp[0], &inp[0], &dout[0], N)
