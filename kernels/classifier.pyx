# The output head's softmax cross-entropy, fused so that no (B,T,V) probability buffer exists:
#   logsum[b,t] = log sum_i exp(logits[b,t,i] - max)         (max: the row's largest logit)
#   losses[b,t] = max - logits[b,t,target] + logsum[b,t]      (= -log softmax[target])
#   dlogits    += (exp(logits - max) / exp(logsum) - onehot(target)) * dlosses
# A target of -1 is a position not scored (llm.c's mask; transformers' -100): its loss is 0 and
# its row of dlogits gets nothing; its logsum is written all the same.
# Against a softmax into a probability buffer and a backward that reads it back
# (kernels/crossentropy), this moves about half the bytes at a large vocabulary (the rows are
# the big tensors of a small model: 128 KB each at V=32000): forward reads the logits once (the
# max pass brings a row into cache for the sum pass), backward reads them once more, finds the
# max again (in cache) and recomputes the exponentials.  Keeping the max out of the stored
# number keeps logits - max exact, so the probabilities are as accurate as a softmax's however
# far the logits are from 0.  exp is kernels.vexp's vectorisable vexpf; threads take rows.
from cython.parallel cimport prange
from libc.math cimport expf, logf

from kernels.bf16 cimport load, store
from kernels.parallel cimport SERIAL_BELOW
from kernels.rowmax cimport row_max
from kernels.vexp cimport vexpf


cdef void classifier_forward(float* losses, float* logsum, const floatX* logits, const int* targets,
                             int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, bt, i
    cdef const floatX* row
    cdef float maxval, total
    for bt in prange(BT, schedule="static", use_threads_if=BT * V >= SERIAL_BELOW):
        row = logits + bt * Vp
        maxval = row_max(row, V)
        total = 0.0
        for i in range(V):
            total = total + vexpf(load(row, i) - maxval)
        logsum[bt] = logf(total)
        if targets != NULL and losses != NULL:
            losses[bt] = 0.0 if targets[bt] < 0 else (maxval - load(row, targets[bt])) + logsum[bt]


cdef void classifier_backward(floatX* dlogits, const float* dlosses, const floatX* logits,
                              const float* logsum, const int* targets, int B, int T, int V,
                              int Vp) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, bt, i
    cdef const floatX* row
    cdef floatX* drow
    cdef float dloss, maxval, scale, value
    cdef Py_ssize_t target
    for bt in prange(BT, schedule="static", use_threads_if=BT * V >= SERIAL_BELOW):
        target = targets[bt]
        if target < 0:   # not scored
            continue
        row = logits + bt * Vp
        drow = dlogits + bt * Vp
        dloss = dlosses[bt]
        maxval = row_max(row, V)
        # the softmax as exp(logits - max) / sum, not exp(logits - (max + logsum)):
        # -fassociative-math could fold the two subtractions and round away logits - max's digits
        scale = expf(-logsum[bt]) * dloss
        for i in range(V):
            # the target's -dloss after the sum, as two float32 roundings, before the one
            # rounding of a bf16 store
            value = load(drow, i) + vexpf(load(row, i) - maxval) * scale
            if i == target:
                value = value - dloss
            store(drow, i, value)


# ----------------------------------------------------------------------------
# Python wrappers: check shapes and token ids, then run the kernel without the GIL

def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"classifier.{where}: {name} has shape {got}, expected {want}")


cdef _check_targets(str where, const int[:, ::1] targets, int V):
    cdef Py_ssize_t b, t
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if not -1 <= targets[b, t] < V:
                raise ValueError(f"classifier.{where}: targets[{b}, {t}] = {targets[b, t]} is "
                                 f"not a token id in [0, {V}) nor -1 (not scored)")


def forward(float[:, ::1] logsum, const float[:, :, ::1] logits, float[:, ::1] losses=None,
            const int[:, ::1] targets=None):
    """logsum (B,T) = log sum exp(logits - the row's max) of logits (B,T,V); with targets (B,T)
    also the losses (B,T) (0 where a target is -1: not scored)."""
    cdef int B = logits.shape[0], T = logits.shape[1], V = logits.shape[2]
    _check_shape("forward", "logsum", (logsum.shape[0], logsum.shape[1]), (B, T))
    if (losses is None) != (targets is None):
        raise ValueError("classifier.forward: give both losses and targets, or neither")
    cdef float* losses_p = NULL
    cdef const int* targets_p = NULL
    if targets is not None:
        _check_shape("forward", "losses", (losses.shape[0], losses.shape[1]), (B, T))
        _check_shape("forward", "targets", (targets.shape[0], targets.shape[1]), (B, T))
        _check_targets("forward", targets, V)
    if B * T == 0:
        return
    if V == 0:
        raise ValueError("classifier.forward: logits have no vocabulary (V = 0)")
    if targets is not None:
        losses_p, targets_p = &losses[0, 0], &targets[0, 0]
    with nogil:
        classifier_forward(losses_p, &logsum[0, 0], &logits[0, 0, 0], targets_p, B, T, V, V)


def backward(float[:, :, ::1] dlogits, const float[:, ::1] dlosses, const float[:, :, ::1] logits,
             const float[:, ::1] logsum, const int[:, ::1] targets):
    """dlogits (B,T,V) += (softmax(logits) - onehot(targets)) * dlosses (B,T), nothing in the rows
    whose target is -1; logsum from forward."""
    cdef int B = logits.shape[0], T = logits.shape[1], V = logits.shape[2]
    _check_shape("backward", "dlogits", (dlogits.shape[0], dlogits.shape[1], dlogits.shape[2]), (B, T, V))
    for name, arr in (("dlosses", dlosses), ("logsum", logsum), ("targets", targets)):
        _check_shape("backward", name, (arr.shape[0], arr.shape[1]), (B, T))
    _check_targets("backward", targets, V)
    if B * T == 0 or V == 0:
        return
    with nogil:
        classifier_backward(&dlogits[0, 0, 0], &dlosses[0, 0], &logits[0, 0, 0], &logsum[0, 0],
                            &targets[0, 0], B, T, V, V)
