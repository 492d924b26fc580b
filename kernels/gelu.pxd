# GELU, tanh approximation:  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
cdef void gelu_forward(float* out, const float* inp, Py_ssize_t N) noexcept nogil
cdef void gelu_backward(float* dinp, const float* inp, const float* dout, Py_ssize_t N) noexcept nogil
# dinp += gelu'(inp) * dout;  all (N,)
