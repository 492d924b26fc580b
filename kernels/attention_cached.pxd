# Causal self-attention of T new positions after P cached ones: the KV cache of generation.
# The T positions' keys and values are written into the caches at rows P .. P+T-1, then query
# t (position P+t) attends over keys 0 .. P+t.  Two forms, as kernels/attention and
# kernels/attention_gqa: GPT-2's (q, k, v side by side in one (T,3C) tensor, NH heads of
# hs = C / NH) and Llama's (separate q, k, v; NKV key/value heads, query head h reads
# key/value head h / (NH/NKV)).  One sequence (B = 1): a cache is one text's.  In float32 or
# bf16 (floatX: every tensor here); both return 0, or -1 where bf16's float32 scratch could not
# be had (float32 needs none).
from kernels.bf16 cimport floatX

cdef int attention_cached_forward(floatX* out, floatX* att, floatX* k_cache, floatX* v_cache,
                                  const floatX* inp, int T, int P, int C, int NH) noexcept nogil
# out (T,C); att (NH,T,P+T) the probabilities (scratch); k_cache, v_cache (P+T,C), the first P
# rows cached, the next T written here; inp (T,3C) = q,k,v
cdef int attention_gqa_cached_forward(floatX* out, floatX* att, floatX* k_cache, floatX* v_cache,
                                      const floatX* q, const floatX* k, const floatX* v,
                                      int T, int P, int NH, int NKV, int hs) noexcept nogil
# out (T,NH,hs); att (NH,T,P+T); k_cache, v_cache (P+T,NKV,hs), the first P rows cached, the
# next T written here; q (T,NH,hs); k, v (T,NKV,hs)
