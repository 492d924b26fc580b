# Token embedding without a position table (Llama: positions enter through RoPE).
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd); the gradient dwte float32 or
# bf16 (floatG), each call's sums in float32
from kernels.bf16 cimport bf16, floatG, floatX

cdef void embedding_forward(floatX* out, const int* inp, const floatX* wte,
                            int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp];  inp (B,T) token ids, wte (Vp,C)
cdef void embedding_backward(floatG* dwte, const floatX* dout, const int* inp,
                             int B, int T, int C) noexcept nogil
# dwte (Vp,C) += ...;  dout (B,T,C).  bf16 dwte: each row's contribution (a token id's
# positions) summed in float32, added once (rounded once); the same whatever the thread count
