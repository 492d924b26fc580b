# Causal self-attention, flash style: the softmax is never stored.  The forward keeps each row's
# log-sum-exp of its scaled scores; the backward rebuilds the probabilities from it, tile by tile.
# Two forms: GPT-2's (q, k, v side by side in one (B,T,3C) tensor, NH heads of hs = C / NH) and
# Llama's (separate q, k, v; NKV key/value heads shared by the NH query heads, NKV dividing NH:
# query head h reads key/value head h / (NH/NKV)).
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd); lse float32 always.  Each returns
# 0, or -1 where bf16's scratch found no memory (float32 takes none, and never fails).
from kernels.bf16 cimport floatX

cdef int flash_attention_forward(floatX* out, float* lse, const floatX* inp,
                                 int B, int T, int C, int NH) noexcept nogil
# out (B,T,C); lse (B,NH,T); inp (B,T,3C) = q,k,v
cdef int flash_attention_backward(floatX* dinp, const floatX* dout, const floatX* inp,
                                  const floatX* out, const float* lse,
                                  int B, int T, int C, int NH) noexcept nogil
# dinp (B,T,3C) += ...; dout, out (B,T,C); lse (B,NH,T) as the forward left them
cdef int flash_attention_gqa_forward(floatX* out, float* lse, const floatX* q, const floatX* k,
                                     const floatX* v, int B, int T, int NH, int NKV,
                                     int hs) noexcept nogil
# out (B,T,NH,hs); lse (B,NH,T); q (B,T,NH,hs); k, v (B,T,NKV,hs)
cdef int flash_attention_gqa_backward(floatX* dq, floatX* dk, floatX* dv, const floatX* dout,
                                      const floatX* q, const floatX* k, const floatX* v,
                                      const floatX* out, const float* lse, int B, int T, int NH,
                                      int NKV, int hs) noexcept nogil
# dq (B,T,NH,hs), dk, dv (B,T,NKV,hs) += ...; dout, out (B,T,NH,hs); lse (B,NH,T) as the
# forward left them
