# Softmax and cross-entropy (promoted from dev/cpu/crossentropy_2.pyx): multi-threaded, vectorised.
#   probs (B,T,Vp) = softmax(logits) over the first V entries, 0 in the padding
#   losses (B,T) = -log probs[target];  dlogits (B,T,Vp) += (probs - onehot(target)) * dlosses
# The softmax is ~V exponentials per position (12.9M at B=4, T=64): with libm's expf that is
# one call per element; kernels.vexp's exp vectorises.  The max, the exp-and-sum and the scale
# are three unit-stride sweeps of a row; the sum uses several float accumulators (vector lanes),
# which keeps its error at the level of a pairwise sum.  Each thread takes whole rows.
from cython.parallel cimport prange
from libc.math cimport logf, INFINITY
from kernels.vexp cimport vexpf

# Python wrappers shared by the dev/cpu/crossentropy_N variants: the same names and arguments
# as kernels.crossentropy, so dev/ab.py drives every variant the same way.

cdef int _check(str where, str name, tuple got, tuple expected) except -1:
    if got != expected:
        raise ValueError(f"crossentropy.{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int _check_targets(str where, const int[:, ::1] targets, int V) except -1:
    cdef Py_ssize_t b, t
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if not 0 <= targets[b, t] < V:
                raise ValueError(f"crossentropy.{where}: targets[{b}, {t}] = {targets[b, t]} "
                                 f"is not a token id in [0, {V})")
    return 0


def softmax(float[:, :, ::1] probs, const float[:, :, ::1] logits, int V):
    """probs (B,T,Vp) = softmax of logits (B,T,Vp) over the first V entries, 0 in the padding."""
    cdef int B = logits.shape[0], T = logits.shape[1], Vp = logits.shape[2]
    _check("softmax", "probs", (probs.shape[0], probs.shape[1], probs.shape[2]), (B, T, Vp))
    if not 0 < V <= Vp:
        raise ValueError(f"crossentropy.softmax: V = {V} must be in [1, Vp = {Vp}]")
    if B * T == 0:
        return
    with nogil:
        softmax_forward(&probs[0, 0, 0], &logits[0, 0, 0], B, T, V, Vp)



def forward(float[:, ::1] losses, const float[:, :, ::1] probs, const int[:, ::1] targets):
    """losses (B,T) = -log probs[b, t, targets[b, t]]."""
    cdef int B = probs.shape[0], T = probs.shape[1], Vp = probs.shape[2]
    _check("forward", "losses", (losses.shape[0], losses.shape[1]), (B, T))
    _check("forward", "targets", (targets.shape[0], targets.shape[1]), (B, T))
    _check_targets("forward", targets, Vp)
    if B * T == 0:
        return
    with nogil:
        crossentropy_forward(&losses[0, 0], &probs[0, 0, 0], &targets[0, 0], B, T, Vp)


def backward(float[:, :, ::1] dlogits, const float[:, ::1] dlosses, const float[:, :, ::1] probs,
             const int[:, ::1] targets, int V):
    """dlogits (B,T,Vp) += (probs - onehot(targets)) * dlosses over the first V entries."""
    cdef int B = probs.shape[0], T = probs.shape[1], Vp = probs.shape[2]
    _check("backward", "dlogits", (dlogits.shape[0], dlogits.shape[1], dlogits.shape[2]), (B, T, Vp))
    _check("backward", "dlosses", (dlosses.shape[0], dlosses.shape[1]), (B, T))
    _check("backward", "targets", (targets.shape[0], targets.shape[1]), (B, T))
    if not 0 < V <= Vp:
        raise ValueError(f"crossentropy.backward: V = {V} must be in [1, Vp = {Vp}]")
    _check_targets("backward", targets, V)
    if B * T == 0:
        return
    with nogil:
        crossentropy_softmax_backward(&dlogits[0, 0, 0], &dlosses[0, 0], &probs[0, 0, 0],
                                      &targets[0, 0], B, T, V, Vp)


cdef inline void softmax_row(float* probs_bt, const float* logits_bt, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t i
    cdef float maxval = -INFINITY, total = 0.0, e, scale
    for i in range(V):
        maxval = max(maxval, logits_bt[i])
    for i in range(V):
        e = vexpf(logits_bt[i] - maxval)
        probs_bt[i] = e
        total = total + e
    scale = 1.0 / total
    for i in range(V):
        probs_bt[i] = probs_bt[i] * scale
    for i in range(V, Vp):
        probs_bt[i] = 0.0


cdef void softmax_forward(float* probs, const float* logits, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        softmax_row(probs + bt * Vp, logits + bt * Vp, V, Vp)


cdef void crossentropy_forward(float* losses, const float* probs, const int* targets,
                               int B, int T, int Vp) noexcept nogil:
    cdef Py_ssize_t bt
    for bt in range(<Py_ssize_t>B * T):   # B*T logs: not worth a thread team
        losses[bt] = -logf(probs[bt * Vp + targets[bt]])


cdef void crossentropy_softmax_backward(float* dlogits, const float* dlosses, const float* probs,
                                        const int* targets, int B, int T, int V, int Vp) noexcept nogil:
    cdef Py_ssize_t bt, i
    cdef float* dlogits_bt
    cdef const float* probs_bt
    cdef float dloss
    for bt in prange(<Py_ssize_t>B * T, schedule="static"):
        dlogits_bt = dlogits + bt * Vp
        probs_bt = probs + bt * Vp
        dloss = dlosses[bt]
        for i in range(V):
            dlogits_bt[i] = dlogits_bt[i] + probs_bt[i] * dloss
        dlogits_bt[targets[bt]] = dlogits_bt[targets[bt]] - dloss
