# Causal multi-head self-attention, flash style: the softmax is never stored.  NH heads, head size
# hs = C / NH.  The forward keeps each row's log-sum-exp of its scaled scores; the backward
# rebuilds the probabilities from it, tile by tile.
cdef void flash_attention_forward(float* out, float* lse, const float* inp,
                                  int B, int T, int C, int NH) noexcept nogil
# out (B,T,C); lse (B,NH,T); inp (B,T,3C) = q,k,v
cdef void flash_attention_backward(float* dinp, const float* dout, const float* inp,
                                   const float* out, const float* lse,
                                   int B, int T, int C, int NH) noexcept nogil
# dinp (B,T,3C) += ...; dout, out (B,T,C); lse (B,NH,T) as the forward left them
