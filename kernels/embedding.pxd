# Token embedding without a position table (Llama: positions enter through RoPE).
cdef void embedding_forward(float* out, const int* inp, const float* wte,
                            int B, int T, int C) noexcept nogil
# out (B,T,C) = wte[inp];  inp (B,T) token ids, wte (Vp,C)
cdef void embedding_backward(float* dwte, const float* dout, const int* inp,
                             int B, int T, int C) noexcept nogil
# dwte (Vp,C) += ...;  dout (B,T,C)
