# Token embedding without a position table (Llama: positions enter through RoPE).
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd)
from kernels.bf16 cimport floatX

cdef void embedding_forward(floatX* out, const int* inp, const floatX* wte,
                            int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp];  inp (B,T) token ids, wte (Vp,C)
cdef void embedding_backward(float* dwte, const floatX* dout, const int* inp,
                             int B, int T, int C) noexcept nogil
# dwte (Vp,C) += ...;  dout (B,T,C)
