# LayerNorm over the channel dimension, eps 1e-5.
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32; the
# gradients dweight, dbias float32 or bf16 (floatG)
from kernels.bf16 cimport bf16, floatG, floatX

cdef void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                            const floatX* weight, const floatX* bias, int B, int T, int C) noexcept nogil
# out (B,T,C), mean (B,T), rstd (B,T) cached for backward; inp (B,T,C), weight, bias (C,)
cdef void layernorm_backward(floatX* dinp, floatG* dweight, floatG* dbias, const floatX* dout,
                             const floatX* inp, const floatX* weight, const float* mean,
                             const float* rstd, int B, int T, int C) noexcept nogil
# dinp (B,T,C), dweight, dbias (C,) += ...;  mean, rstd float32 always.  bf16 dweight, dbias:
# each element's sum over the positions in float32, added once (rounded once)
