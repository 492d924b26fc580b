# Python wrappers of kernels/crossentropy.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/crossentropy.pyx and by every dev/cpu/crossentropy_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

cdef int _check(str where, str name, tuple got, tuple expected) except -1:
    if got != expected:
        raise ValueError(f"crossentropy.{where}: {name} has shape {got}, expected {expected}")
    return 0


cdef int _check_targets(str where, const int[:, ::1] targets, int V) except -1:
    cdef Py_ssize_t b, t
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            if not -1 <= targets[b, t] < V:
                raise ValueError(f"crossentropy.{where}: targets[{b}, {t}] = {targets[b, t]} "
                                 f"is not a token id in [0, {V}) nor -1 (not scored)")
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
    """losses (B,T) = -log probs[b, t, targets[b, t]], 0 where the target is -1 (not scored)."""
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
    """dlogits (B,T,Vp) += (probs - onehot(targets)) * dlosses over the first V entries, nothing
    in the rows whose target is -1."""
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
