# RMSNorm over the channel dimension (Llama):  out = inp / sqrt(mean(inp^2) + eps) * weight
cdef void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                          float eps, int B, int T, int C) noexcept nogil
# out (B,T,C), rstd (B,T) cached for backward; inp (B,T,C), weight (C,); llama2.c: eps 1e-5
cdef void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, int B, int T, int C) noexcept nogil
# dinp (B,T,C), dweight (C,) += ...;  dout (B,T,C)
