# Causal multi-head self-attention.  NH heads, head size hs = C / NH.
cdef void attention_forward(float* out, float* preatt, float* att, const float* inp,
                            int B, int T, int C, int NH) noexcept nogil
# out (B,T,C); preatt, att (B,NH,T,T) pre-/post-softmax scores; inp (B,T,3C) = q,k,v
cdef void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                             const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil
# dinp (B,T,3C) += ...; dpreatt, datt (B,NH,T,T) scratch gradients (+=); dout (B,T,C)
