# SwiGLU, the gate of Llama's FFN:  out = silu(a) * b,  silu(a) = a * sigmoid(a)
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX
cdef void swiglu_forward(floatX* out, const floatX* a, const floatX* b, Py_ssize_t N) noexcept nogil
# out (N,); a = w1 x, b = w3 x (N,) (N = B*T*hidden_dim)
cdef void swiglu_backward(floatX* da, floatX* db, const floatX* dout, const floatX* a,
                          const floatX* b, Py_ssize_t N) noexcept nogil
# da, db (N,) += ...;  dout (N,)
