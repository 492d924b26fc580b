# gelu variant 1: the straight port of llm.c's CPU GELU (tanh approximation), single-threaded.
#   out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));  dinp += gelu'(inp) * dout;  all (N,)
# Each element calls libm's tanhf (and coshf in backward): one element at a time.
from libc.math cimport tanhf, coshf

include "kernels/gelu_wrappers.pxi"

cdef float GELU_SCALING_FACTOR = 0.7978845608028654   # sqrt(2/pi)


cdef void gelu_forward(float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t i
    cdef float x, cube
    for i in range(N):
        x = inp[i]
        cube = 0.044715 * x * x * x
        out[i] = 0.5 * x * (1.0 + tanhf(GELU_SCALING_FACTOR * (x + cube)))


cdef void gelu_backward(float* dinp, const float* inp, const float* dout, Py_ssize_t N) noexcept nogil:
    cdef Py_ssize_t i
    cdef float x, cube, tanh_arg, tanh_out, coshf_out, sech_out, local_grad
    for i in range(N):
        x = inp[i]
        cube = 0.044715 * x * x * x
        tanh_arg = GELU_SCALING_FACTOR * (x + cube)
        tanh_out = tanhf(tanh_arg)
        coshf_out = coshf(tanh_arg)
        sech_out = 1.0 / (coshf_out * coshf_out)
        local_grad = (0.5 * (1.0 + tanh_out)
                      + x * 0.5 * sech_out * GELU_SCALING_FACTOR * (1.0 + 3.0 * 0.044715 * x * x))
        dinp[i] += local_grad * dout[i]
