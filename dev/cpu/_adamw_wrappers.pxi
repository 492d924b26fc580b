# Python wrappers shared by the dev/cpu/adamw_N variants: the same names and arguments as
# kernels.adamw, so dev/ab.py drives every variant the same way.

def update(float[::1] params, float[::1] m, float[::1] v, const float[::1] grads,
           float lr, float beta1, float beta2, float eps, float weight_decay,
           float grad_scale, int t):
    """One AdamW step on params (n,), with moments m, v (n,) and gradients grads (n,); t >= 1."""
    cdef Py_ssize_t n = params.shape[0]
    if m.shape[0] != n or v.shape[0] != n or grads.shape[0] != n:
        raise ValueError(f"adamw.update: m, v, grads have {m.shape[0]}, {v.shape[0]}, "
                         f"{grads.shape[0]} elements, params has {n}")
    if t < 1:
        raise ValueError(f"adamw.update: step t={t}, must be >= 1")
    if n == 0:
        return
    with nogil:
        adamw_update(&params[0], &m[0], &v[0], &grads[0], n, lr, beta1, beta2, eps, weight_decay,
                     grad_scale, t)


def norm_squared(const float[::1] x):
    """Sum of x^2 over x (n,), accumulated in double."""
    if x.shape[0] == 0:
        return 0.0
    cdef double total
    with nogil:
        total = global_norm_squared(&x[0], x.shape[0])
    return total

