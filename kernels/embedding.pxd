# Token embedding without a position table (Llama: positions enter through RoPE).
from kernels.bf16 cimport bf16, floatX
cdef void embedding_forward(float* out, const int* inp, const float* wte,
                            int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp];  inp (B,T) token ids, wte (Vp,C)
cdef void embedding_backward(float* dwte, const floatX* dout, const int* inp,
                             int B, int T, int C) noexcept nogil
# dwte (Vp,C) += ...;  dout (B,T,C)
cdef void embedding_forward_bf16(bf16* out, const int* inp, const bf16* wte,
                                 int B, int T, int C) noexcept nogil
# the same rows copied in bf16
