# Causal self-attention with grouped-query heads (Llama 2/3): NH query heads share NKV key/value
# heads (NKV divides NH; query head h reads kv head h / (NH/NKV)); head size hs; scale 1/sqrt(hs).
cdef void attention_gqa_forward(float* out, float* att, const float* q, const float* k,
                                const float* v, int B, int T, int NH, int NKV, int hs) noexcept nogil
# out (B,T,NH,hs); att (B,NH,T,T) probabilities, zeros above the diagonal, kept for backward;
# q (B,T,NH,hs); k, v (B,T,NKV,hs)
cdef int attention_gqa_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* q, const float* k, const float* v, const float* att,
                                int B, int T, int NH, int NKV, int hs) noexcept nogil
# dq (B,T,NH,hs), dk, dv (B,T,NKV,hs) += ...;  dout (B,T,NH,hs); att as forward wrote it.
# Returns 0, or -1 (nothing added) when its scratch memory cannot be allocated.
