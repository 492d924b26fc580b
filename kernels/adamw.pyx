# AdamW optimizer step (llm.c's gpt2_update), over the flat parameter buffer, all (n,):
#   g = grads * grad_scale
#   m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
#   m_hat = m / (1 - beta1^t)            v_hat = v / (1 - beta2^t)          t = 1, 2, ...
#   params -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay params)
# One pass over the four buffers.  Which parameters are decayed is the caller's business: it
# calls this once per span of the buffer with the weight_decay that span gets.
# global_norm_squared: sum of x^2 in double, for gradient-norm clipping.
from cython.parallel cimport prange
from libc.math cimport powf, sqrtf


cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil:
    cdef float beta1_correction = 1.0 - powf(beta1, t)
    cdef float beta2_correction = 1.0 - powf(beta2, t)
    cdef float one_minus_beta1 = 1.0 - beta1
    cdef float one_minus_beta2 = 1.0 - beta2
    cdef float grad, m_i, v_i, m_hat, v_hat
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        grad = grads[i] * grad_scale
        m_i = beta1 * m[i] + one_minus_beta1 * grad
        v_i = beta2 * v[i] + one_minus_beta2 * grad * grad
        m[i] = m_i
        v[i] = v_i
        m_hat = m_i / beta1_correction
        v_hat = v_i / beta2_correction
        params[i] = params[i] - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i])


cdef double global_norm_squared(const float* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        total += <double>x[i] * x[i]
    return total


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
    with nogil:
        adamw_update(&params[0], &m[0], &v[0], &grads[0], n, lr, beta1, beta2, eps, weight_decay,
                     grad_scale, t)


def norm_squared(const float[::1] x):
    """Sum of x^2 over x (n,), accumulated in double."""
    cdef double total
    with nogil:
        total = global_norm_squared(&x[0], x.shape[0])
    return total

