# AdamW optimizer step (llm.c's gpt2_update), over the flat parameter buffer, all (n,):
#   g = grads * grad_scale
#   m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
#   m_hat = m / (1 - beta1^t)            v_hat = v / (1 - beta2^t)          t = 1, 2, ...
#   params -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay params)
# One pass over the four buffers.  Which parameters are decayed is the caller's business: it
# calls this once per span of the buffer with the weight_decay that span gets.
# adamw_update_rounded: the same, params being float32 master weights, in the same pass writing
# each updated parameter rounded stochastically into bf16 (llm.c's adamw_kernel3 with master
# weights): the rounding's hash costs no extra pass over memory.  Its gradients float32 or bf16
# (a model with bf16 gradients), widened as they are read.
# adamw_update_narrow: the same without master weights (llm.c's -w 0): each bf16 parameter read
# widened, updated, and rounded stochastically back into place, as adamw_update_rounded rounds.
# global_norm_squared: sum of x^2 in double, for gradient-norm clipping; x float32 or bf16.
from cython.parallel cimport prange
from libc.math cimport powf, sqrtf

from kernels.bf16 cimport bf16_to_float, float_to_bf16_stochastic, load

include "kernels/adamw_wrappers.pxi"


ctypedef struct Settings:
    # one step's settings, and what each parameter's update derives from them alike
    float lr, beta1, beta2, eps, weight_decay, grad_scale
    float one_minus_beta1, one_minus_beta2, beta1_correction, beta2_correction


cdef inline Settings settings_of(float lr, float beta1, float beta2, float eps,
                                 float weight_decay, float grad_scale, int t) noexcept nogil:
    cdef Settings s
    s.lr, s.beta1, s.beta2, s.eps = lr, beta1, beta2, eps
    s.weight_decay, s.grad_scale = weight_decay, grad_scale
    s.one_minus_beta1 = 1.0 - beta1
    s.one_minus_beta2 = 1.0 - beta2
    s.beta1_correction = 1.0 - powf(beta1, t)
    s.beta2_correction = 1.0 - powf(beta2, t)
    return s


cdef inline float updated(float param, float* m, float* v, const floatG* grads, Py_ssize_t i,
                          Settings s) noexcept nogil:
    """Parameter i's new value from its old one, param; updates its moments m[i], v[i]."""
    cdef float grad = load(grads, i) * s.grad_scale
    cdef float m_i = s.beta1 * m[i] + s.one_minus_beta1 * grad
    cdef float v_i = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad
    m[i] = m_i
    v[i] = v_i
    cdef float m_hat = m_i / s.beta1_correction
    cdef float v_hat = v_i / s.beta2_correction
    return param - s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * param)


cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil:
    cdef Settings s = settings_of(lr, beta1, beta2, eps, weight_decay, grad_scale, t)
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        params[i] = updated(params[i], m, v, grads, i, s)


cdef enum:
    ROUNDED_BLOCK = 2048     # parameters a thread updates and then rounds while they are in L1


cdef inline void update_then_round(bf16* rounded, float* params, float* m, float* v,
                                   const floatG* grads, Py_ssize_t start, Py_ssize_t end,
                                   Settings s, Py_ssize_t first, int t) noexcept nogil:
    # Two loops, not one: GCC vectorises each, where the loop doing both needs more run-time
    # alias checks than its limit (10) with float32 gradients and ran scalar, 4-7x slower
    cdef Py_ssize_t i
    for i in range(start, end):
        params[i] = updated(params[i], m, v, grads, i, s)
    for i in range(start, end):
        rounded[i] = float_to_bf16_stochastic(params[i], <uint64_t>(first + i), <uint32_t>t)


cdef void adamw_update_rounded(bf16* rounded, float* params, float* m, float* v,
                               const floatG* grads, Py_ssize_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t, Py_ssize_t first) noexcept nogil:
    cdef Settings s = settings_of(lr, beta1, beta2, eps, weight_decay, grad_scale, t)
    cdef Py_ssize_t block, start
    for block in prange((n + ROUNDED_BLOCK - 1) // ROUNDED_BLOCK, schedule="static"):
        start = block * ROUNDED_BLOCK
        update_then_round(rounded, params, m, v, grads, start, min(start + ROUNDED_BLOCK, n), s,
                          first, t)


cdef void adamw_update_narrow(bf16* params, float* m, float* v, const floatG* grads,
                              Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, float grad_scale, int t,
                              Py_ssize_t first) noexcept nogil:
    cdef Settings s = settings_of(lr, beta1, beta2, eps, weight_decay, grad_scale, t)
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        params[i] = float_to_bf16_stochastic(updated(bf16_to_float(params[i]), m, v, grads, i, s),
                                             <uint64_t>(first + i), <uint32_t>t)


cdef double global_norm_squared(const floatG* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in prange(n, schedule="static"):
        total += <double>load(x, i) * load(x, i)
    return total


# ----------------------------------------------------------------------------
# Python wrappers of adamw_update_rounded and of bf16 gradients (tests), here rather than in
# kernels/adamw_wrappers.pxi: the dev/cpu variants that include that file have neither

def _checked(where, n, t, **buffers):
    """n, the parameters' count, once each buffer has as many elements and t >= 1."""
    for name, buf in buffers.items():
        if len(buf) != n:
            raise ValueError(f"adamw.{where}: {name} has {len(buf)} elements, params has {n}")
    if t < 1:
        raise ValueError(f"adamw.{where}: step t={t}, must be >= 1")
    return n


def update_rounded(bf16[::1] rounded, float[::1] params, float[::1] m, float[::1] v,
                   const floatG[::1] grads, float lr, float beta1, float beta2, float eps,
                   float weight_decay, float grad_scale, int t, Py_ssize_t first=0):
    """One AdamW step on float32 master weights params (n,) with moments m, v (n,) and
    gradients grads (n,), float32 or bf16 bits (uint16); each new parameter also written to
    rounded (n,) as bf16 bits, rounded stochastically (element i's bits from (first + i, t))."""
    cdef Py_ssize_t n = _checked("update_rounded", params.shape[0], t, rounded=rounded, m=m, v=v,
                                 grads=grads)
    if n == 0:
        return
    with nogil:
        adamw_update_rounded(&rounded[0], &params[0], &m[0], &v[0], &grads[0], n, lr, beta1,
                             beta2, eps, weight_decay, grad_scale, t, first)


def update_narrow(bf16[::1] params, float[::1] m, float[::1] v, const floatG[::1] grads,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, Py_ssize_t first=0):
    """One AdamW step on bf16 parameters params (n,) (bits, uint16) with no master weights:
    moments m, v (n,), gradients grads (n,) float32 or bf16 bits; each new parameter rounded
    stochastically into params as update_rounded rounds it."""
    cdef Py_ssize_t n = _checked("update_narrow", params.shape[0], t, m=m, v=v, grads=grads)
    if n == 0:
        return
    with nogil:
        adamw_update_narrow(&params[0], &m[0], &v[0], &grads[0], n, lr, beta1, beta2, eps,
                            weight_decay, grad_scale, t, first)


def norm_squared_bf16(const bf16[::1] x):
    """Sum of x^2 over x (n,) bf16 bits (uint16), accumulated in double."""
    if x.shape[0] == 0:
        return 0.0
    cdef double total
    with nogil:
        total = global_norm_squared(&x[0], x.shape[0])
    return total
