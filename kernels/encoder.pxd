# Token + position embedding.  B batch, T time, C channels.
cdef void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                          int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids, wte (Vp,C), wpe (maxT,C)
cdef void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                           int B, int T, int C) noexcept nogil
# dwte, dwpe += ...;  dout (B,T,C)
