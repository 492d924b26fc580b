# RMSNorm over the channel dimension (Llama):  out = inp / sqrt(mean(inp^2) + eps) * weight
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32; the
# gradient dweight float32 or bf16 (floatG)
from kernels.bf16 cimport bf16, floatG, floatX
cdef void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight,
                          float eps, int B, int T, int C) noexcept nogil
# out (B,T,C), rstd (B,T) cached for backward; inp (B,T,C), weight (C,); llama2.c: eps 1e-5
cdef void rmsnorm_backward(floatX* dinp, floatG* dweight, const floatX* dout, const floatX* inp,
                           const floatX* weight, const float* rstd, int B, int T, int C) noexcept nogil
# dinp (B,T,C), dweight (C,) (NULL: a frozen weight, not computed) += ...;  dout (B,T,C).
# bf16 dweight: each element's sum over the positions in float32, added once (rounded once)
