# Causal self-attention, flash style: the softmax is never stored.  The forward keeps each row's
# log-sum-exp of its scaled scores; the backward rebuilds the probabilities from it, tile by tile.
# Two forms: GPT-2's (q, k, v side by side in one (B,T,3C) tensor, NH heads of hs = C / NH) and
# Llama's (separate q, k, v; NKV key/value heads shared by the NH query heads, NKV dividing NH:
# query head h reads key/value head h / (NH/NKV)).
cdef void flash_attention_forward(float* out, float* lse, const float* inp,
                                  int B, int T, int C, int NH) noexcept nogil
# out (B,T,C); lse (B,NH,T); inp (B,T,3C) = q,k,v
cdef void flash_attention_backward(float* dinp, const float* dout, const float* inp,
                                   const float* out, const float* lse,
                                   int B, int T, int C, int NH) noexcept nogil
# dinp (B,T,3C) += ...; dout, out (B,T,C); lse (B,NH,T) as the forward left them
cdef void flash_attention_gqa_forward(float* out, float* lse, const float* q, const float* k,
                                      const float* v, int B, int T, int NH, int NKV,
                                      int hs) noexcept nogil
# out (B,T,NH,hs); lse (B,NH,T); q (B,T,NH,hs); k, v (B,T,NKV,hs)
cdef void flash_attention_gqa_backward(float* dq, float* dk, float* dv, const float* dout,
                                       const float* q, const float* k, const float* v,
                                       const float* out, const float* lse, int B, int T, int NH,
                                       int NKV, int hs) noexcept nogil
# dq (B,T,NH,hs), dk, dv (B,T,NKV,hs) += ...; dout, out (B,T,NH,hs); lse (B,NH,T) as the
# forward left them
