# Softmax over the vocabulary and cross-entropy loss.  V real vocab, Vp padded (row stride).
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX
cdef void softmax_forward(float* probs, const floatX* logits, int B, int T, int V, int Vp) noexcept nogil
# probs (B,T,Vp): softmax over the first V entries, zeros in the padding;  logits (B,T,Vp)
cdef void crossentropy_forward(float* losses, const float* probs, const int* targets,
                               int B, int T, int Vp) noexcept nogil
# losses (B,T) = -log probs[target], 0 where target is -1 (not scored);  targets (B,T)
cdef void crossentropy_softmax_backward(floatX* dlogits, const float* dlosses, const float* probs,
                                        const int* targets, int B, int T, int V, int Vp) noexcept nogil
# dlogits (B,T,Vp) += (probs - onehot(target)) * dlosses, over the first V entries; nothing in
# a row whose target is -1
