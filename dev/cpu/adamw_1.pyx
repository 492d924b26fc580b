# adamw variant 1: the straight port of llm.c's CPU AdamW (gpt2_update), single-threaded.
#   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2;  g = grads * grad_scale
#   params -= lr (m / (1-beta1^t) / (sqrt(v / (1-beta2^t)) + eps) + weight_decay params)
# global_norm_squared: sum of x^2 in double, single-threaded.
from libc.math cimport powf, sqrtf

include "kernels/adamw_wrappers.pxi"


cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil:
    cdef Py_ssize_t i
    cdef float param, grad, m_i, v_i, m_hat, v_hat
    for i in range(n):
        param = params[i]
        grad = grads[i] * grad_scale
        m_i = beta1 * m[i] + (1.0 - beta1) * grad
        v_i = beta2 * v[i] + (1.0 - beta2) * grad * grad
        m_hat = m_i / (1.0 - powf(beta1, t))
        v_hat = v_i / (1.0 - powf(beta2, t))
        m[i] = m_i
        v[i] = v_i
        params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * param)


cdef double global_norm_squared(const float* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        total += <double>x[i] * x[i]
    return total
