"""
The CPU backend: host memory and the Cython kernels of kernels/, gathered into the backend
table (accel/backend.pxd).  Each entry is the kernel itself behind a one-line adapter that drops
the context, which the CPU does not need.

Memory comes from mmap: page-aligned (so guard:cpu can protect it), zero pages until first
written, and large buffers advised to transparent huge pages as NumPy does for its arrays.
"""
from accel.backend cimport Backend, BackendTable
from kernels.encoder cimport encoder_forward, encoder_backward
from kernels.layernorm cimport layernorm_forward, layernorm_backward
from kernels.matmul cimport matmul_forward, matmul_backward
from kernels.attention cimport attention_forward, attention_backward
from kernels.flash_attention cimport flash_attention_forward, flash_attention_backward
from kernels.gelu cimport gelu_forward, gelu_backward
from kernels.residual cimport residual_forward, residual_backward
from kernels.crossentropy cimport softmax_forward, crossentropy_forward, crossentropy_softmax_backward
from kernels.adamw cimport adamw_update, global_norm_squared
from kernels.embedding cimport embedding_forward, embedding_backward
from kernels.rmsnorm cimport rmsnorm_forward, rmsnorm_backward
from kernels.rope cimport rope_forward, rope_backward
from kernels.swiglu cimport swiglu_forward, swiglu_backward
from kernels.attention_gqa cimport attention_gqa_forward, attention_gqa_backward
from kernels.classifier cimport classifier_forward, classifier_backward
from kernels.zero cimport zero_bytes
from libc.string cimport memcpy
from posix.mman cimport mmap, munmap, madvise, MAP_FAILED, MAP_PRIVATE, MAP_ANONYMOUS, PROT_READ, PROT_WRITE

cdef extern from "<sys/mman.h>" nogil:
    int MADV_HUGEPAGE

cdef enum:
    HUGEPAGE_MIN_BYTES = 4 << 20   # NumPy's threshold for advising huge pages


# --- memory ------------------------------------------------------------------------------

cdef void* cpu_alloc(void* ctx, size_t nbytes) noexcept nogil:
    cdef void* ptr = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if ptr == MAP_FAILED:
        return NULL
    if nbytes >= HUGEPAGE_MIN_BYTES:
        madvise(ptr, nbytes, MADV_HUGEPAGE)   # advice only: a kernel without THP ignores it
    return ptr

cdef void cpu_free(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    munmap(ptr, nbytes)

cdef void cpu_zero(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    zero_bytes(ptr, nbytes)

cdef void cpu_copy(void* ctx, void* dst, const void* src, size_t nbytes) noexcept nogil:
    memcpy(dst, src, nbytes)

cdef void cpu_synchronize(void* ctx) noexcept nogil:
    pass

# the message of a kernel that failed (out of scratch memory), until last_error hands it out
cdef const char* pending_error = NULL

cdef const char* cpu_last_error(void* ctx) noexcept nogil:
    global pending_error
    cdef const char* message = pending_error
    pending_error = NULL
    return message

cdef void cpu_mark(void* ctx, int step, int layer) noexcept nogil:
    pass

# --- loss bookkeeping and the optimizer ---------------------------------------------------

cdef void cpu_fill(void* ctx, float* out, float value, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = value

cdef float cpu_mean(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    cdef double total = 0.0
    cdef Py_ssize_t i
    for i in range(n):
        total += x[i]
    return <float>(total / n)

cdef void cpu_adamw_update(void* ctx, float* params, float* m, float* v, const float* grads,
                           Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, float grad_scale, int t) noexcept nogil:
    adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t)

cdef double cpu_global_norm_squared(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    return global_norm_squared(x, n)

# --- GPT-2's layers ----------------------------------------------------------------------

cdef void cpu_encoder_forward(void* ctx, float* out, const int* inp, const float* wte,
                              const float* wpe, int B, int T, int C) noexcept nogil:
    encoder_forward(out, inp, wte, wpe, B, T, C)

cdef void cpu_encoder_backward(void* ctx, float* dwte, float* dwpe, const float* dout,
                               const int* inp, int B, int T, int C, int Vp) noexcept nogil:
    encoder_backward(dwte, dwpe, dout, inp, B, T, C)

cdef void cpu_layernorm_forward(void* ctx, float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int B, int T, int C) noexcept nogil:
    layernorm_forward(out, mean, rstd, inp, weight, bias, B, T, C)

cdef void cpu_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                                 const float* dout, const float* inp, const float* weight,
                                 const float* mean, const float* rstd, int B, int T, int C) noexcept nogil:
    layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C)

cdef void cpu_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                             const float* bias, int B, int T, int C, int OC) noexcept nogil:
    matmul_forward(out, inp, weight, bias, B, T, C, OC)

cdef void cpu_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight,
                              int B, int T, int C, int OC) noexcept nogil:
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC)

cdef void cpu_attention_forward(void* ctx, float* out, float* preatt, float* att,
                                const float* inp, int B, int T, int C, int NH) noexcept nogil:
    attention_forward(out, preatt, att, inp, B, T, C, NH)

cdef void cpu_attention_backward(void* ctx, float* dinp, float* dpreatt, float* datt,
                                 const float* dout, const float* inp, const float* att,
                                 int B, int T, int C, int NH) noexcept nogil:
    attention_backward(dinp, dpreatt, datt, dout, inp, att, B, T, C, NH)

cdef void cpu_gelu_forward(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    gelu_forward(out, inp, N)

cdef void cpu_gelu_backward(void* ctx, float* dinp, const float* inp, const float* dout,
                            Py_ssize_t N) noexcept nogil:
    gelu_backward(dinp, inp, dout, N)

cdef void cpu_residual_forward(void* ctx, float* out, const float* inp1, const float* inp2,
                               Py_ssize_t N) noexcept nogil:
    residual_forward(out, inp1, inp2, N)

cdef void cpu_residual_backward(void* ctx, float* dinp1, float* dinp2, const float* dout,
                                Py_ssize_t N) noexcept nogil:
    residual_backward(dinp1, dinp2, dout, N)

cdef void cpu_softmax_forward(void* ctx, float* probs, const float* logits,
                              int B, int T, int V, int Vp) noexcept nogil:
    softmax_forward(probs, logits, B, T, V, Vp)

cdef void cpu_crossentropy_forward(void* ctx, float* losses, const float* probs,
                                   const int* targets, int B, int T, int Vp) noexcept nogil:
    crossentropy_forward(losses, probs, targets, B, T, Vp)

cdef void cpu_crossentropy_softmax_backward(void* ctx, float* dlogits, const float* dlosses,
                                            const float* probs, const int* targets,
                                            int B, int T, int V, int Vp) noexcept nogil:
    crossentropy_softmax_backward(dlogits, dlosses, probs, targets, B, T, V, Vp)

# --- flash attention --------------------------------------------------------------------

cdef void cpu_flash_attention_forward(void* ctx, float* out, float* lse, const float* inp,
                                      int B, int T, int C, int NH) noexcept nogil:
    flash_attention_forward(out, lse, inp, B, T, C, NH)

cdef void cpu_flash_attention_backward(void* ctx, float* dinp, const float* dout, const float* inp,
                                       const float* out, const float* lse,
                                       int B, int T, int C, int NH) noexcept nogil:
    flash_attention_backward(dinp, dout, inp, out, lse, B, T, C, NH)


# --- Llama's layers ----------------------------------------------------------------------

cdef void cpu_embedding_forward(void* ctx, float* out, const int* inp, const float* wte,
                                int B, int T, int C) noexcept nogil:
    embedding_forward(out, inp, wte, B, T, C)

cdef void cpu_embedding_backward(void* ctx, float* dwte, const float* dout, const int* inp,
                                 int B, int T, int C, int V) noexcept nogil:
    embedding_backward(dwte, dout, inp, B, T, C)

cdef void cpu_rmsnorm_forward(void* ctx, float* out, float* rstd, const float* inp,
                              const float* weight, float eps, int B, int T, int C) noexcept nogil:
    rmsnorm_forward(out, rstd, inp, weight, eps, B, T, C)

cdef void cpu_rmsnorm_backward(void* ctx, float* dinp, float* dweight, const float* dout,
                               const float* inp, const float* weight, const float* rstd,
                               int B, int T, int C) noexcept nogil:
    rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, B, T, C)

cdef void cpu_rope_forward(void* ctx, float* out, const float* inp, const float* freqs_cos,
                           const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    rope_forward(out, inp, freqs_cos, freqs_sin, B, T, NH, hs)

cdef void cpu_rope_backward(void* ctx, float* dinp, const float* dout, const float* freqs_cos,
                            const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    rope_backward(dinp, dout, freqs_cos, freqs_sin, B, T, NH, hs)

cdef void cpu_swiglu_forward(void* ctx, float* out, const float* a, const float* b,
                             Py_ssize_t N) noexcept nogil:
    swiglu_forward(out, a, b, N)

cdef void cpu_swiglu_backward(void* ctx, float* da, float* db, const float* dout, const float* a,
                              const float* b, Py_ssize_t N) noexcept nogil:
    swiglu_backward(da, db, dout, a, b, N)

cdef void cpu_attention_gqa_forward(void* ctx, float* out, float* att, const float* q,
                                    const float* k, const float* v,
                                    int B, int T, int NH, int NKV, int hs) noexcept nogil:
    attention_gqa_forward(out, att, q, k, v, B, T, NH, NKV, hs)

cdef void cpu_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv, const float* dout,
                                     const float* q, const float* k, const float* v,
                                     const float* att, int B, int T, int NH, int NKV,
                                     int hs) noexcept nogil:
    global pending_error
    if attention_gqa_backward(dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, hs) != 0:
        pending_error = "attention_gqa_backward: out of memory for its scratch buffers"

cdef void cpu_classifier_forward(void* ctx, float* losses, float* logsum, const float* logits,
                                 const int* targets, int B, int T, int V) noexcept nogil:
    classifier_forward(losses, logsum, logits, targets, B, T, V)

cdef void cpu_classifier_backward(void* ctx, float* dlogits, const float* dlosses,
                                  const float* logits, const float* logsum, const int* targets,
                                  int B, int T, int V) noexcept nogil:
    classifier_backward(dlogits, dlosses, logits, logsum, targets, B, T, V)


# --- planted faults: deliberately wrong entries, for the tests that prove check: finds them --

cdef void faulty_gelu_forward(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    memcpy(out, inp, N * sizeof(float))   # the identity instead of GELU

cdef void faulty_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                                    const float* dout, const float* inp, const float* weight,
                                    const float* mean, const float* rstd, int B, int T, int C) noexcept nogil:
    cdef float* scratch_dbias = dweight   # dbias lands in dweight: both wrong, dinp right
    layernorm_backward(dinp, dweight, scratch_dbias, dout, inp, weight, mean, rstd, B, T, C)

cdef void faulty_rope_backward(void* ctx, float* dinp, const float* dout, const float* freqs_cos,
                               const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    rope_forward(dinp, dout, freqs_cos, freqs_sin, B, T, NH, hs)   # rotates forward, and overwrites

cdef void faulty_flash_attention_backward(void* ctx, float* dinp, const float* dout,
                                          const float* inp, const float* out, const float* lse,
                                          int B, int T, int C, int NH) noexcept nogil:
    pass   # adds nothing into dinp

FAULTS = ("gelu_forward", "layernorm_backward",      # found by tests/test_backend.py
          "flash_attention_backward")                # and tests/test_flash_attention.py
LLAMA_FAULTS = ("rope_backward",)                    # found by tests/test_llama_model.py


def create(fault=None, bint flash=True):
    """The CPU backend; with fault (one of FAULTS) that entry deliberately wrong, and with
    flash=False without the flash group (as a backend that has no flash attention), for tests."""
    name = "cpu" if fault is None else f"cpu-with-faulty-{fault}"
    cdef Backend backend = Backend(name if flash else name + "-without-flash", True,
                                   ("gpt2", "llama", "flash") if flash else ("gpt2", "llama"))
    cdef BackendTable* t = &backend.table
    t.ctx = NULL
    t.alloc = cpu_alloc
    t.free = cpu_free
    t.zero = cpu_zero
    t.copy_to_backend = cpu_copy
    t.copy_to_host = cpu_copy
    t.synchronize = cpu_synchronize
    t.last_error = cpu_last_error
    t.mark = cpu_mark
    t.fill = cpu_fill
    t.mean = cpu_mean
    t.adamw_update = cpu_adamw_update
    t.global_norm_squared = cpu_global_norm_squared
    t.encoder_forward = cpu_encoder_forward
    t.encoder_backward = cpu_encoder_backward
    t.layernorm_forward = cpu_layernorm_forward
    t.layernorm_backward = cpu_layernorm_backward
    t.matmul_forward = cpu_matmul_forward
    t.matmul_backward = cpu_matmul_backward
    t.attention_forward = cpu_attention_forward
    t.attention_backward = cpu_attention_backward
    t.gelu_forward = cpu_gelu_forward
    t.gelu_backward = cpu_gelu_backward
    t.residual_forward = cpu_residual_forward
    t.residual_backward = cpu_residual_backward
    t.softmax_forward = cpu_softmax_forward
    t.crossentropy_forward = cpu_crossentropy_forward
    t.crossentropy_softmax_backward = cpu_crossentropy_softmax_backward
    t.embedding_forward = cpu_embedding_forward
    t.embedding_backward = cpu_embedding_backward
    t.rmsnorm_forward = cpu_rmsnorm_forward
    t.rmsnorm_backward = cpu_rmsnorm_backward
    t.rope_forward = cpu_rope_forward
    t.rope_backward = cpu_rope_backward
    t.swiglu_forward = cpu_swiglu_forward
    t.swiglu_backward = cpu_swiglu_backward
    t.attention_gqa_forward = cpu_attention_gqa_forward
    t.attention_gqa_backward = cpu_attention_gqa_backward
    t.classifier_forward = cpu_classifier_forward
    t.classifier_backward = cpu_classifier_backward
    if flash:
        t.flash_attention_forward = cpu_flash_attention_forward
        t.flash_attention_backward = cpu_flash_attention_backward
    if fault == "gelu_forward":
        t.gelu_forward = faulty_gelu_forward
    elif fault == "layernorm_backward":
        t.layernorm_backward = faulty_layernorm_backward
    elif fault == "rope_backward":
        t.rope_backward = faulty_rope_backward
    elif fault == "flash_attention_backward":
        t.flash_attention_backward = faulty_flash_attention_backward
    elif fault is not None:
        raise ValueError(f"no planted fault for {fault!r} (there are: "
                         f"{', '.join(FAULTS + LLAMA_FAULTS)})")
    backend.validate()
    return backend
