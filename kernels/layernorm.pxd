# LayerNorm over the channel dimension, eps 1e-5.
cdef void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int B, int T, int C) noexcept nogil
# out (B,T,C), mean (B,T), rstd (B,T) cached for backward; inp (B,T,C), weight, bias (C,)
cdef void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil
# dinp (B,T,C), dweight, dbias (C,) += ...
