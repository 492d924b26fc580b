# Linear layer: out = inp @ weight^T + bias.  OC output channels.
cdef void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                         int B, int T, int C, int OC) noexcept nogil
# out (B,T,OC); inp (B,T,C); weight (OC,C); bias (OC,) or NULL
cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil
# dinp (B,T,C), dweight (OC,C), dbias (OC,) or NULL: all += ...;  dout (B,T,OC)
