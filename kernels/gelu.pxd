# GELU, tanh approximation:  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
# float32 or bf16 (kernels/bf16.pxd's floatX), computed in float32
from kernels.bf16 cimport floatX

cdef void gelu_forward(floatX* out, const floatX* inp, Py_ssize_t N) noexcept nogil
cdef void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, Py_ssize_t N) noexcept nogil
# dinp += gelu'(inp) * dout;  all (N,)
