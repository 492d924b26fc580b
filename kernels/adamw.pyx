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

include "kernels/_adamw_wrappers.pxi"


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
