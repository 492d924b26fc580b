# adamw variant 2: one multi-threaded, vectorised pass over the four buffers.
#   m = beta1 m + (1-beta1) g;  v = beta2 v + (1-beta2) g^2;  g = grads * grad_scale
#   params -= lr (m / (1-beta1^t) / (sqrt(v / (1-beta2^t)) + eps) + weight_decay params)
# The update is memory-bound (7 floats of traffic per parameter): the per-step constants are
# folded before the loop (1/(1-beta^t) as multipliers, lr*weight_decay as one factor) so the
# loop is loads, a few FMAs, one sqrt and one divide per element, and threads stream through
# contiguous 256 KiB chunks.  global_norm_squared: per-chunk double partial sums, in parallel.
from cython.parallel cimport prange
from libc.math cimport powf, sqrtf

include "kernels/adamw_wrappers.pxi"

cdef enum:
    CHUNK = 65536   # floats per task: 256 KiB of each buffer


cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil:
    cdef float m_scale = 1.0 / (1.0 - powf(beta1, t))
    cdef float v_scale = 1.0 / (1.0 - powf(beta2, t))
    cdef float one_minus_beta1 = 1.0 - beta1
    cdef float one_minus_beta2 = 1.0 - beta2
    cdef float decay = lr * weight_decay
    cdef Py_ssize_t num_chunks = (n + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef float g, m_i, v_i
    for chunk in prange(num_chunks, schedule="static"):
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            g = grads[i] * grad_scale
            m_i = beta1 * m[i] + one_minus_beta1 * g
            v_i = beta2 * v[i] + one_minus_beta2 * (g * g)
            m[i] = m_i
            v[i] = v_i
            params[i] = params[i] - (lr * (m_i * m_scale) / (sqrtf(v_i * v_scale) + eps) + decay * params[i])


cdef double global_norm_squared(const float* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t num_chunks = (n + CHUNK - 1) // CHUNK
    cdef Py_ssize_t chunk, i
    cdef double total = 0.0
    cdef double part
    for chunk in prange(num_chunks, schedule="static"):
        part = 0.0
        for i in range(chunk * CHUNK, min(chunk * CHUNK + CHUNK, n)):
            part = part + <double>x[i] * x[i]
        total += part
    return total
