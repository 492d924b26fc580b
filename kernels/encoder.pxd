# Token + position embedding.  B batch, T time, C channels.
from kernels.bf16 cimport bf16, floatX
cdef void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                          int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids, wte (Vp,C), wpe (maxT,C)
cdef void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const int* inp,
                           int B, int T, int C) noexcept nogil
# dwte, dwpe += ...;  dout (B,T,C)
cdef void encoder_forward_bf16(bf16* out, const int* inp, const bf16* wte, const bf16* wpe,
                               int B, int T, int C) noexcept nogil
# the same in bf16: the sum of the two bf16 rows taken in float32, rounded once
