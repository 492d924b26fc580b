# AdamW optimizer step (llm.c's gpt2_update), over the flat parameter buffer, all (n,):
#   g = grads * grad_scale
#   m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
#   m_hat = m / (1 - beta1^t)            v_hat = v / (1 - beta2^t)          t = 1, 2, ...
#   params -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay params)
# One pass over the four buffers.  Which parameters are decayed is the caller's business: it
# calls this once per span of the buffer with the weight_decay that span gets.
# adamw_update_rounded: the same, params being float32 master weights, in the same pass writing
# each updated parameter rounded stochastically into bf16 (llm.c's adamw_kernel3 with master
# weights): the rounding's hash costs no extra pass over memory.
# global_norm_squared: sum of x^2 in double, for gradient-norm clipping.
from cython.parallel cimport prange
from libc.math cimport powf, sqrtf

from kernels.bf16 cimport float_to_bf16_stochastic

include "kernels/adamw_wrappers.pxi"


cdef inline float update_one(float* params, float* m, float* v, const float* grads, Py_ssize_t i,
                             float lr, float beta1, float beta2, float one_minus_beta1,
                             float one_minus_beta2, float eps, float weight_decay,
                             float grad_scale, float beta1_correction,
                             float beta2_correction) noexcept nogil:
    """Parameter i's update; returns its new value."""
    cdef float grad = grads[i] * grad_scale
    cdef float m_i = beta1 * m[i] + one_minus_beta1 * grad
    cdef float v_i = beta2 * v[i] + one_minus_beta2 * grad * grad
    m[i] = m_i
    v[i] = v_i
    cdef float m_hat = m_i / beta1_correction
    cdef float v_hat = v_i / beta2_correction
    params[i] = params[i] - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i])
    return params[i]


cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil:
    cdef float beta1_correction = 1.0 - powf(beta1, t)
    cdef float beta2_correction = 1.0 - powf(beta2, t)
    cdef float one_minus_beta1 = 1.0 - beta1
    cdef float one_minus_beta2 = 1.0 - beta2
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        update_one(params, m, v, grads, i, lr, beta1, beta2, one_minus_beta1, one_minus_beta2,
                   eps, weight_decay, grad_scale, beta1_correction, beta2_correction)


cdef void adamw_update_rounded(bf16* rounded, float* params, float* m, float* v,
                               const float* grads, Py_ssize_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t, Py_ssize_t first) noexcept nogil:
    cdef float beta1_correction = 1.0 - powf(beta1, t)
    cdef float beta2_correction = 1.0 - powf(beta2, t)
    cdef float one_minus_beta1 = 1.0 - beta1
    cdef float one_minus_beta2 = 1.0 - beta2
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        rounded[i] = float_to_bf16_stochastic(
            update_one(params, m, v, grads, i, lr, beta1, beta2, one_minus_beta1,
                       one_minus_beta2, eps, weight_decay, grad_scale, beta1_correction,
                       beta2_correction), <uint64_t>(first + i), <uint32_t>t)


cdef double global_norm_squared(const float* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        total += <double>x[i] * x[i]
    return total
