# Residual connection: out = inp1 + inp2.
cdef void residual_forward(float* out, const float* inp1, const float* inp2, Py_ssize_t N) noexcept nogil
cdef void residual_backward(float* dinp1, float* dinp2, const float* dout, Py_ssize_t N) noexcept nogil
# dinp1, dinp2 += dout;  all (N,)
