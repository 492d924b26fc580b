# The loss of the output head without a probability buffer (Llama): per position, the log of
# the softmax's normaliser is all that the loss and its gradient need besides the logits.
# float32 or bf16 where a pointer is floatX (kernels/bf16.pxd), computed in float32
from kernels.bf16 cimport floatX
cdef void classifier_forward(float* losses, float* logsum, const floatX* logits, const int* targets,
                             int B, int T, int V, int Vp) noexcept nogil
# logsum (B,T) = log sum_i exp(logits[b,t,i] - max_i logits[b,t,i]);
# losses (B,T) = max + logsum - logits[target], 0 where target is -1 (not scored) (targets,
# losses may be NULL: logsum alone); logits (B,T,Vp) of which the first V are the vocabulary
# (Vp = V: no padding), targets (B,T)
cdef void classifier_backward(floatX* dlogits, const float* dlosses, const floatX* logits,
                              const float* logsum, const int* targets, int B, int T, int V,
                              int Vp) noexcept nogil
# dlogits (B,T,Vp) += (softmax(logits) - onehot(target)) * dlosses over the first V, nothing
# in a row whose target is -1;
# softmax = exp(logits - max) / exp(logsum), the max found again
