# The output of GPT-2: softmax over the vocabulary, then the cross-entropy loss.
#   probs[b,t,:V] = softmax(logits[b,t,:V]),  probs[b,t,V:Vp] = 0
#   losses[b,t] = -log probs[b,t,targets[b,t]]
#   logits, probs (B,T,Vp): V real tokens, rows padded to Vp (llm.c pads the vocab to a
#   multiple of 128 so the matmul is faster); targets (B,T) int ids in [0, V); losses (B,T)
# Backward goes through both at once: dlogits += (probs - onehot(target)) * dlosses.
from cython.parallel cimport prange
from libc.math cimport expf, logf, INFINITY


cdef void softmax_forward(float* probs, const float* logits, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef const float* logits_bt
    cdef float* probs_bt
    cdef float maxval, e, scale
    cdef double total
    for bt in prange(BT, schedule="static"):
        logits_bt = logits + bt * Vp
        probs_bt = probs + bt * Vp
        # subtract the max so expf cannot overflow
        maxval = -INFINITY
        for i in range(V):
            if logits_bt[i] > maxval:
                maxval = logits_bt[i]
        total = 0.0
        for i in range(V):
            e = expf(logits_bt[i] - maxval)
            probs_bt[i] = e
            total = total + e
        scale = 1.0 / total
        for i in range(V):
            probs_bt[i] = probs_bt[i] * scale
        # the padded entries are never tokens: probability 0
        for i in range(V, Vp):
            probs_bt[i] = 0.0


cdef void crossentropy_forward(float* losses, const float* probs, const int* targets,
                               int B, int T, int Vp) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt
    for bt in prange(BT, schedule="static"):
        losses[bt] = -logf(probs[bt * Vp + targets[bt]])


cdef void crossentropy_softmax_backward(float* dlogits, const float* dlosses, const float* probs,
                                        const int* targets, int B, int T, int V, int Vp) noexcept nogil:
    # d loss / d logits[i] = probs[i] - (i == target); the padding gets no gradient
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef Py_ssize_t bt, i
    cdef float* dlogits_bt
    cdef const float* probs_bt
    cdef float dloss
    for bt in prange(BT, schedule="static"):
        dlogits_bt = dlogits + bt * Vp
        probs_bt = probs + bt * Vp
        dloss = dlosses[bt]
        for i in range(V):
            dlogits_bt[i] = dlogits_bt[i] + probs_bt[i] * dloss
        # the one-hot part, outside the loop so the loop stays branch-free
        dlogits_bt[targets[bt]] = dlogits_bt[targets[bt]] - dloss


# ----------------------------------------------------------------------------
# Python wrappers: check shapes, V and targets, then run the kernel without the GIL

def _check_shape(str where, str name, tuple got, tuple want):
    if got != want:
        raise ValueError(f"crossentropy.{where}: {name} has shape {got}, expected {want}")


def _check_vocab(str where, int V, Py_ssize_t Vp):
    if not 0 < V <= Vp:
        raise ValueError(f"crossentropy.{where}: V = {V} must be in [1, Vp = {Vp}]")


cdef _check_targets(str where, const int[:, ::1] targets, int V):
    cdef Py_ssize_t b, t
    cdef int ix
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            ix = targets[b, t]
            if ix < 0 or ix >= V:
                raise ValueError(f"crossentropy.{where}: targets[{b}, {t}] = {ix} is not a token "
                                 f"(expected 0 <= id < {V})")


def softmax(float[:, :, ::1] probs, const float[:, :, ::1] logits, int V):
    """probs (B,T,Vp) = softmax of logits (B,T,Vp) over the first V entries, 0 in the padding."""
    B, T, Vp = logits.shape[0], logits.shape[1], logits.shape[2]
    _check_shape("softmax", "probs", (probs.shape[0], probs.shape[1], probs.shape[2]),
                 (B, T, Vp))
    _check_vocab("softmax", V, Vp)
    if B == 0 or T == 0:
        return
    with nogil:
        softmax_forward(&probs[0, 0, 0], &logits[0, 0, 0], B, T, V, Vp)


def forward(float[:, ::1] losses, const float[:, :, ::1] probs, const int[:, ::1] targets):
    """losses (B,T) = -log probs[b, t, targets[b, t]]; probs (B,T,Vp), targets (B,T) int32.

    Knowing only Vp here, targets are checked against [0, Vp); a target in the padding [V, Vp)
    has probability 0 and so an infinite loss.
    """
    B, T, Vp = probs.shape[0], probs.shape[1], probs.shape[2]
    _check_shape("forward", "losses", (losses.shape[0], losses.shape[1]), (B, T))
    _check_shape("forward", "targets", (targets.shape[0], targets.shape[1]), (B, T))
    _check_targets("forward", targets, Vp)
    if B == 0 or T == 0:
        return
    with nogil:
        crossentropy_forward(&losses[0, 0], &probs[0, 0, 0], &targets[0, 0], B, T, Vp)


def backward(float[:, :, ::1] dlogits, const float[:, ::1] dlosses, const float[:, :, ::1] probs,
             const int[:, ::1] targets, int V):
    """dlogits (B,T,Vp) += (probs - onehot(targets)) * dlosses over the first V entries."""
    B, T, Vp = probs.shape[0], probs.shape[1], probs.shape[2]
    _check_shape("backward", "dlogits", (dlogits.shape[0], dlogits.shape[1], dlogits.shape[2]),
                 (B, T, Vp))
    _check_shape("backward", "dlosses", (dlosses.shape[0], dlosses.shape[1]), (B, T))
    _check_shape("backward", "targets", (targets.shape[0], targets.shape[1]), (B, T))
    _check_vocab("backward", V, Vp)
    _check_targets("backward", targets, V)
    if B == 0 or T == 0:
        return
    with nogil:
        crossentropy_softmax_backward(&dlogits[0, 0, 0], &dlosses[0, 0], &probs[0, 0, 0],
                                      &targets[0, 0], B, T, V, Vp)
