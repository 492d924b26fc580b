# Rotary position embedding (RoPE), as Meta's Llama and llama2.c apply it: in every head, the
# channel pair (2i, 2i+1) of position t is rotated by the angle t * theta^(-2i/hs).
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX
cdef void rope_forward(floatX* out, const floatX* inp, const float* freqs_cos,
                       const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil
# out (B,T,NH,hs) = inp (B,T,NH,hs) rotated (out may be inp); freqs_cos, freqs_sin (>= T, hs/2)
cdef void rope_backward(floatX* dinp, const floatX* dout, const float* freqs_cos,
                        const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil
# dinp (B,T,NH,hs) += dout (B,T,NH,hs) rotated back (dinp must not be dout)
