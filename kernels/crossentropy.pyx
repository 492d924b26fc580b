# Softmax and cross-entropy (promoted from dev/cpu/crossentropy_2.pyx): multi-threaded, vectorised.
#   probs (B,T,Vp) = softmax(logits) over the first V entries, 0 in the padding
#   losses (B,T) = -log probs[target];  dlogits (B,T,Vp) += (probs - onehot(target)) * dlosses
#   a target of -1 is a position not scored (llm.c's mask): loss 0, nothing added to its row
# The softmax is ~V exponentials per position (12.9M at B=4, T=64): with libm's expf that is
# one call per element; kernels.vexp's exp vectorises, and so does kernels.rowmax's maximum
# (a plain max loop is one dependent compare per element).  The max, the exp-and-sum and the
# scale are three unit-stride sweeps of a row; the sum uses several float accumulators (vector lanes),
# which keeps its error at the level of a pairwise sum.  Each thread takes whole rows.
from cython.parallel cimport prange
from libc.math cimport logf
from kernels.bf16 cimport load, store
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf

include "kernels/crossentropy_wrappers.pxi"


cdef inline void softmax_row(float* probs_bt, const floatX* logits_bt, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t i
    cdef float maxval = row_max(logits_bt, V), total = 0.0, e, scale
    for i in range(V):
        e = vexpf(load(logits_bt, i) - maxval)
        probs_bt[i] = e
        total = total + e
    scale = 1.0 / total
    for i in range(V):
        probs_bt[i] = probs_bt[i] * scale
    for i in range(V, Vp):
        probs_bt[i] = 0.0


cdef void softmax_forward(float* probs, const floatX* logits, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        softmax_row(probs + bt * Vp, logits + bt * Vp, V, Vp)


cdef void crossentropy_forward(float* losses, const float* probs, const int* targets,
                               int B, int T, int Vp) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in range(<Py_ssize_t>B * T):   # B*T logs: not worth a thread team
        losses[bt] = 0.0 if targets[bt] < 0 else -logf(probs[bt * Vp + targets[bt]])


cdef void crossentropy_softmax_backward(floatX* dlogits, const float* dlosses, const float* probs,
                                        const int* targets, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t bt, i
    cdef floatX* dlogits_bt
    cdef const float* probs_bt
    cdef float dloss, value
    cdef Py_ssize_t target
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        target = targets[bt]
        if target < 0:   # not scored
            continue
        dlogits_bt = dlogits + bt * Vp
        probs_bt = probs + bt * Vp
        dloss = dlosses[bt]
        for i in range(V):
            # the target's -dloss after the sum, as two float32 roundings, before the one
            # rounding of a bf16 store
            value = load(dlogits_bt, i) + probs_bt[i] * dloss
            if i == target:
                value = value - dloss
            store(dlogits_bt, i, value)
