# crossentropy variant 1: the straight port of llm.c's CPU softmax and cross-entropy.
#   probs (B,T,Vp) = softmax(logits) over the first V entries, 0 in the padding
#   losses (B,T) = -log probs[target];  dlogits (B,T,Vp) += (probs - onehot(target)) * dlosses
#   a target of -1 is not scored (train_gpt2.cu's mask): loss 0, nothing added to its row
# softmax_forward: one thread per position (llm.c's collapse(2)), libm expf per element.
# The loss and its gradient: single-threaded, as in llm.c.
from cython.parallel cimport prange
from libc.math cimport expf, logf

include "kernels/crossentropy_wrappers.pxi"


cdef inline void softmax_row(float* probs_bt, const float* logits_bt, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t i
    cdef float maxval = -10000.0, total = 0.0
    for i in range(V):
        if logits_bt[i] > maxval:
            maxval = logits_bt[i]
    for i in range(V):
        probs_bt[i] = expf(logits_bt[i] - maxval)
        total += probs_bt[i]
    for i in range(V):
        probs_bt[i] /= total
    for i in range(V, Vp):
        probs_bt[i] = 0.0


cdef void softmax_forward(float* probs, const float* logits, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        softmax_row(probs + bt * Vp, logits + bt * Vp, V, Vp)


cdef void crossentropy_forward(float* losses, const float* probs, const int* targets,
                               int B, int T, int Vp) noexcept nogil:
    cdef Py_ssize_t b, t
    cdef int ix
    for b in range(B):
        for t in range(T):
            ix = targets[b * T + t]
            losses[b * T + t] = 0.0 if ix < 0 else -logf(probs[(b * T + t) * Vp + ix])


cdef void crossentropy_softmax_backward(float* dlogits, const float* dlosses, const float* probs,
                                        const int* targets, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t b, t, i
    cdef float* dlogits_bt
    cdef const float* probs_bt
    cdef float dloss, indicator
    cdef int ix
    for b in range(B):
        for t in range(T):
            dlogits_bt = dlogits + (b * T + t) * Vp
            probs_bt = probs + (b * T + t) * Vp
            dloss = dlosses[b * T + t]
            ix = targets[b * T + t]
            if ix < 0:
                continue
            for i in range(V):
                indicator = 1.0 if i == ix else 0.0
                dlogits_bt[i] += (probs_bt[i] - indicator) * dloss
