# Token + position embedding.  B batch, T time, C channels.
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX

cdef void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                          int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids, wte (Vp,C), wpe (maxT,C)
cdef void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                           int B, int T, int C) noexcept nogil
# dwte, dwpe += ...;  dout (B,T,C)
