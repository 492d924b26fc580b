# Token + position embedding.  B batch, T time, C channels.
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32; the
# gradients dwte, dwpe float32 or bf16 (floatG)
from kernels.bf16 cimport bf16, floatG, floatX

cdef void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                          int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids, wte (Vp,C), wpe (maxT,C)
cdef void encoder_backward(floatG* dwte, floatG* dwpe, const floatX* dout, const int* inp,
                           int B, int T, int C) noexcept nogil
# dwte, dwpe += ...;  dout (B,T,C).  bf16 dwte, dwpe: each element's whole contribution summed
# in float32, added once (rounded once)
