# Python wrappers of kernels/residual.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/residual.pyx and by every dev/cpu/residual_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.
# Flat (N,) float32 arrays: pass x.reshape(-1) for a (B,T,C) tensor.

def _check_size(str where, str name, Py_ssize_t got, Py_ssize_t want):
    if got != want:
        raise ValueError(f"residual.{where}: {name} has {got} elements, expected {want}")


def forward(float[::1] out, const float[::1] inp1, const float[::1] inp2):
    """out (N,) = inp1 + inp2."""
    cdef Py_ssize_t N = out.shape[0]
    _check_size("forward", "inp1", inp1.shape[0], N)
    _check_size("forward", "inp2", inp2.shape[0], N)
    if N == 0:
        return
    with nogil:
        residual_forward(&out[0], &inp1[0], &inp2[0], N)


def backward(float[::1] dinp1, float[::1] dinp2, const float[::1] dout):
    """dinp1, dinp2 (N,) += dout."""
    cdef Py_ssize_t N = dout.shape[0]
    _check_size("backward", "dinp1", dinp1.shape[0], N)
    _check_size("backward", "dinp2", dinp2.shape[0], N)
    if N == 0:
        return
    with nogil:
        residual_backward(&dinp1[0], &dinp2[0], &dout[0], N)
