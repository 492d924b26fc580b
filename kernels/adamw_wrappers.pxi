# Python wrappers of kernels/adamw.pyx: check the arguments, then run the kernel without the GIL.
# Included, not imported, by kernels/adamw.pyx and by every dev/cpu/adamw_N.pyx variant, so
# each module wraps its own cdef functions under the same names and arguments: the tests,
# dev/ab.py and dev/promote.py treat a kernel and its variants alike.

def update(float[::1] params, float[::1] m, float[::1] v, const float[::1] grads,
           float lr, float beta1, float beta2, float eps, float weight_decay,
           float grad_scale, int t):
    """One AdamW step on params (n,), with moments m, v (n,) and gradients grads (n,); t >= 1."""
    n = params.shape[0]
    for name, buf in (("m", m), ("v", v), ("grads", grads)):
        if buf.shape[0] != n:
            raise ValueError(f"adamw.update: {name} has {buf.shape[0]} elements, params has {n}")
    if t < 1:
        raise ValueError(f"adamw.update: step t={t}, must be >= 1 (bias correction divides by 1 - beta^t)")
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
