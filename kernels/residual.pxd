# Residual connection: out = inp1 + inp2.
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX

cdef void residual_forward(floatX* out, const floatX* inp1, const floatX* inp2, Py_ssize_t N) noexcept nogil
cdef void residual_backward(floatX* dinp1, floatX* dinp2, const floatX* dout, Py_ssize_t N) noexcept nogil
# dinp1, dinp2 += dout;  all (N,)
