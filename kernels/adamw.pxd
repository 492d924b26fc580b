# AdamW (decoupled weight decay), as llm.c:  param -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * param)
from libc.stdint cimport uint32_t, uint64_t

from kernels.bf16 cimport bf16, floatG

cdef void adamw_update(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int t) noexcept nogil
# params, m, v (n,) updated in place; grads (n,) are multiplied by grad_scale first; t >= 1
cdef void adamw_update_rounded(bf16* rounded, float* params, float* m, float* v,
                               const floatG* grads, Py_ssize_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t, Py_ssize_t first) noexcept nogil
# the same on float32 master weights params, each new one also written to rounded (n,) in bf16,
# stochastically rounded as kernels/bf16.pxd's narrow_stochastic(first, seed=t) rounds it;
# grads float32 or bf16 (floatG), widened exactly as read
cdef void adamw_update_narrow(bf16* params, float* m, float* v, const floatG* grads,
                              Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, float grad_scale, int t,
                              Py_ssize_t first) noexcept nogil
# the same with no master weights (llm.c's -w 0): params (n,) bf16 read widened, updated, and
# rounded back stochastically as adamw_update_rounded rounds them (first, seed t)
cdef double global_norm_squared(const floatG* x, Py_ssize_t n) noexcept nogil
# sum of x^2, accumulated in double; x float32 or bf16 (floatG)
