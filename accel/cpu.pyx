"""
The CPU backend: host memory and the Cython kernels of kernels/, gathered into the backend
table (accel/backend.pxd).  Most entries are the kernel itself behind a one-line adapter that
drops the context, which the CPU does not need; those are written from accel/spec.py
(accel/generated/cpu_table.pxi).  What is here is what is not a kernel: memory, the loss's fill
and mean, and the one entry that reports an error.

Three tables: fp32, bf16 and fp16 (create(precision=...)), whose floatX arguments point to
float32, bf16 or fp16; the bf16 one also with bf16 parameter gradients (grad_precision="bf16":
the floatG arguments, whose kernels add each call's float32 sum into them rounded once,
accel/generated/cpu_bf16_grads_table.pxi and two entries here).  A bf16 entry is a kernel
written once for both precisions, or else the fp32 entry run on float32 copies of its bf16
arguments made in the backend's scratch memory (both written from accel/spec.py into
accel/generated/cpu_bf16_table.pxi); the GEMMs run on bf16 operands (kernels/matmul_bf16.pyx:
AMX or AVX512_BF16 through oneMKL where the CPU has them), and the rounding of the parameters
(and AdamW without master weights) is written here.  So are two attentions' bf16 kernels
(OWN_BF16_KERNELS), for which check:'s oracle (create(oracle=True)) keeps the fp32 kernel on
widened copies: the KV cache's, which reads the bf16 cache as it is, and flash attention's,
which rounds its probabilities (and their gradients) to bf16 for those GEMMs, as a GPU's does
(ROUNDED_INSIDE: by more than its outputs' own rounding).  The fp16 table is check:'s oracle for
the GPUs' half precision (Metal's): every entry is the fp32 one on widened copies, its outputs
rounded to nearest once (accel/generated/cpu_fp16_table.pxi), slower than fp32 and never tuned.

Memory comes from mmap: page-aligned (so guard:cpu can protect it), zero pages until first
written, and large buffers advised to transparent huge pages as NumPy does for its arrays.
"""
from accel.backend cimport Backend, BackendTable
from kernels.adamw cimport adamw_update, adamw_update_narrow, adamw_update_rounded
from kernels.attention_cached cimport attention_cached_forward, attention_gqa_cached_forward
from kernels.attention_gqa cimport attention_gqa_backward
from kernels.bf16 cimport bf16, narrow, narrow_stochastic, widen
from kernels.embedding cimport embedding_forward
from kernels.flash_attention cimport (flash_attention_backward, flash_attention_forward,
                                     flash_attention_gqa_backward, flash_attention_gqa_forward)
from kernels.fp16 cimport fp16, fp16_to_float, float_to_fp16, narrow_fp16
from kernels.matmul_bf16 cimport matmul_backward_bf16, matmul_forward_bf16
from libc.stdint cimport uint32_t
from libc.stdlib cimport calloc, free
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

cdef void fail(const char* message) noexcept nogil:
    global pending_error
    if pending_error == NULL:   # the first failure is the one to report
        pending_error = message

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

# --- the entry whose kernel reports running out of memory ------------------------------

cdef void cpu_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv, const float* dout,
                                     const float* q, const float* k, const float* v,
                                     const float* att, int B, int T, int NH, int NKV,
                                     int hs) noexcept nogil:
    if attention_gqa_backward(dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, hs) != 0:
        fail("attention_gqa_backward: out of memory for its scratch buffers")


include "accel/generated/cpu_table.pxi"


# --- fused: a Llama layer's blocks as the unfused entries in the model's order ----------------
# (train_llama2.pyx's layer_forward and layer_backward, call for call: the oracle of check:'s
# fused entries; the model runs them only on a backend that prefers them, runs_fused)

cdef void cpu_qkv_forward(void* ctx, float* q, float* k, float* v, const float* inp,
                          const float* wq, const float* wk, const float* wv, int B, int T, int C,
                          int NH, int NKV, int hs) noexcept nogil:
    cpu_matmul_forward(ctx, q, inp, wq, NULL, B, T, C, NH * hs)
    cpu_matmul_forward(ctx, k, inp, wk, NULL, B, T, C, NKV * hs)
    cpu_matmul_forward(ctx, v, inp, wv, NULL, B, T, C, NKV * hs)


cdef void cpu_qkv_backward(void* ctx, float* dinp, float* dwq, float* dwk, float* dwv,
                           const float* dq, const float* dk, const float* dv, const float* inp,
                           const float* wq, const float* wk, const float* wv, int B, int T,
                           int C, int NH, int NKV, int hs) noexcept nogil:
    cpu_matmul_backward(ctx, dinp, dwv, NULL, dv, inp, wv, B, T, C, NKV * hs)
    cpu_matmul_backward(ctx, dinp, dwk, NULL, dk, inp, wk, B, T, C, NKV * hs)
    cpu_matmul_backward(ctx, dinp, dwq, NULL, dq, inp, wq, B, T, C, NH * hs)


cdef void cpu_ffn_forward(void* ctx, float* out, float* h1, float* h3, float* hgated,
                          const float* inp, const float* w1, const float* w3, const float* w2,
                          int B, int T, int C, int H) noexcept nogil:
    cpu_matmul_forward(ctx, h1, inp, w1, NULL, B, T, C, H)
    cpu_matmul_forward(ctx, h3, inp, w3, NULL, B, T, C, H)
    cpu_swiglu_forward(ctx, hgated, h1, h3, <Py_ssize_t>B * T * H)
    cpu_matmul_forward(ctx, out, hgated, w2, NULL, B, T, H, C)


cdef void cpu_ffn_backward(void* ctx, float* dinp, float* dw1, float* dw3, float* dw2,
                           float* dh1, float* dh3, float* dhgated, const float* dout,
                           const float* inp, const float* h1, const float* h3,
                           const float* hgated, const float* w1, const float* w3, const float* w2,
                           int B, int T, int C, int H) noexcept nogil:
    cdef Py_ssize_t BTH = <Py_ssize_t>B * T * H
    zero_bytes(dh1, BTH * sizeof(float))   # written, not added into: the block's own
    zero_bytes(dh3, BTH * sizeof(float))
    zero_bytes(dhgated, BTH * sizeof(float))
    cpu_matmul_backward(ctx, dhgated, dw2, NULL, dout, hgated, w2, B, T, H, C)
    cpu_swiglu_backward(ctx, dh1, dh3, dhgated, h1, h3, BTH)
    cpu_matmul_backward(ctx, dinp, dw3, NULL, dh3, inp, w3, B, T, C, H)
    cpu_matmul_backward(ctx, dinp, dw1, NULL, dh1, inp, w1, B, T, C, H)


# --- bf16 --------------------------------------------------------------------------------

# A narrow (bf16, fp16) table's context: scratch memory for the float32 copies of an adapter's arguments,
# kept between calls and grown to the largest call's (its pages are the step's, not new ones)
ctypedef struct Scratch:
    float* base
    size_t nbytes

cdef float* reserve(Scratch* s, Py_ssize_t floats) noexcept nogil:
    """s's memory for this many floats, grown if need be; NULL where there is none."""
    cdef size_t nbytes = <size_t>floats * sizeof(float)
    if nbytes > s.nbytes:
        if s.base != NULL:
            munmap(s.base, s.nbytes)
        s.base = <float*>cpu_alloc(NULL, nbytes)
        s.nbytes = nbytes if s.base != NULL else 0
    return s.base


cdef class ScratchOwner:
    """Owns a narrow table's Scratch (its backend's keepalive)."""
    cdef Scratch* s

    def __dealloc__(self):
        if self.s != NULL:
            if self.s.base != NULL:
                munmap(self.s.base, self.s.nbytes)
            free(self.s)


cdef void bf16_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                              const float* bias, int B, int T, int C, int OC) noexcept nogil:
    if matmul_forward_bf16(<bf16*>out, <const bf16*>inp, <const bf16*>weight, <const bf16*>bias,
                           B, T, C, OC) != 0:
        fail("matmul_forward (bf16): out of memory for its float32 blocks")

cdef void bf16_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight,
                               int B, int T, int C, int OC) noexcept nogil:
    if matmul_backward_bf16(<bf16*>dinp, dweight, dbias, <const bf16*>dout, <const bf16*>inp,
                            <const bf16*>weight, B, T, C, OC) != 0:
        fail("matmul_backward (bf16): out of memory for its float32 blocks")

cdef void bf16g_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                                const float* dout, const float* inp, const float* weight,
                                int B, int T, int C, int OC) noexcept nogil:
    if matmul_backward_bf16(<bf16*>dinp, <bf16*>dweight, <bf16*>dbias, <const bf16*>dout,
                            <const bf16*>inp, <const bf16*>weight, B, T, C, OC) != 0:
        fail("matmul_backward (bf16): out of memory for its float32 blocks")

cdef void bf16_narrow_params(void* ctx, float* params, const float* master, Py_ssize_t n,
                             Py_ssize_t first, int seed) noexcept nogil:
    if seed < 0:
        narrow(<bf16*>params, master, n)
    else:
        narrow_stochastic(<bf16*>params, master, n, first, <uint32_t>seed)


cdef void bf16_adamw_update_rounded(void* ctx, float* params, float* master, float* m, float* v,
                                    const float* grads, Py_ssize_t n, float lr, float beta1,
                                    float beta2, float eps, float weight_decay, float grad_scale,
                                    int t, Py_ssize_t first) noexcept nogil:
    adamw_update_rounded(<bf16*>params, master, m, v, grads, n, lr, beta1, beta2, eps,
                         weight_decay, grad_scale, t, first)


cdef void bf16g_adamw_update_rounded(void* ctx, float* params, float* master, float* m,
                                     float* v, const float* grads, Py_ssize_t n, float lr,
                                     float beta1, float beta2, float eps, float weight_decay,
                                     float grad_scale, int t, Py_ssize_t first) noexcept nogil:
    adamw_update_rounded(<bf16*>params, master, m, v, <const bf16*>grads, n, lr, beta1, beta2,
                         eps, weight_decay, grad_scale, t, first)


# the no_master group: AdamW on the bf16 parameters themselves (llm.c's -w 0)
cdef void bf16_adamw_update_narrow(void* ctx, float* params, float* m, float* v,
                                   const float* grads, Py_ssize_t n, float lr, float beta1,
                                   float beta2, float eps, float weight_decay, float grad_scale,
                                   int t, Py_ssize_t first) noexcept nogil:
    adamw_update_narrow(<bf16*>params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay,
                        grad_scale, t, first)

cdef void bf16g_adamw_update_narrow(void* ctx, float* params, float* m, float* v,
                                    const float* grads, Py_ssize_t n, float lr, float beta1,
                                    float beta2, float eps, float weight_decay, float grad_scale,
                                    int t, Py_ssize_t first) noexcept nogil:
    adamw_update_narrow(<bf16*>params, m, v, <const bf16*>grads, n, lr, beta1, beta2, eps,
                        weight_decay, grad_scale, t, first)


# flash attention's bf16 kernel (the generated bf16_flash_* run the fp32 one on widened copies)
cdef void bf16_kernel_flash_attention_forward(void* ctx, float* out, float* lse, const float* inp,
                                              int B, int T, int C, int NH) noexcept nogil:
    if flash_attention_forward(<bf16*>out, lse, <const bf16*>inp, B, T, C, NH) != 0:
        fail("flash_attention_forward (bf16): out of memory for its scratch tiles")

cdef void bf16_kernel_flash_attention_backward(void* ctx, float* dinp, const float* dout,
                                               const float* inp, const float* out,
                                               const float* lse, int B, int T, int C,
                                               int NH) noexcept nogil:
    if flash_attention_backward(<bf16*>dinp, <const bf16*>dout, <const bf16*>inp,
                                <const bf16*>out, lse, B, T, C, NH) != 0:
        fail("flash_attention_backward (bf16): out of memory for its scratch tiles")

cdef void bf16_kernel_flash_attention_gqa_forward(void* ctx, float* out, float* lse,
                                                  const float* q, const float* k, const float* v,
                                                  int B, int T, int NH, int NKV,
                                                  int hs) noexcept nogil:
    if flash_attention_gqa_forward(<bf16*>out, lse, <const bf16*>q, <const bf16*>k,
                                   <const bf16*>v, B, T, NH, NKV, hs) != 0:
        fail("flash_attention_gqa_forward (bf16): out of memory for its scratch tiles")

cdef void bf16_kernel_flash_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv,
                                                   const float* dout, const float* q,
                                                   const float* k, const float* v,
                                                   const float* out, const float* lse, int B,
                                                   int T, int NH, int NKV, int hs) noexcept nogil:
    if flash_attention_gqa_backward(<bf16*>dq, <bf16*>dk, <bf16*>dv, <const bf16*>dout,
                                    <const bf16*>q, <const bf16*>k, <const bf16*>v,
                                    <const bf16*>out, lse, B, T, NH, NKV, hs) != 0:
        fail("flash_attention_gqa_backward (bf16): out of memory for its scratch tiles")

# the KV cache's attention in bf16 (the generated bf16_attention_*cached_forward widen the
# whole cache at every generated token)
cdef void bf16_kernel_attention_cached_forward(void* ctx, float* out, float* att, float* k_cache,
                                               float* v_cache, const float* inp, int T, int P,
                                               int C, int NH) noexcept nogil:
    if attention_cached_forward(<bf16*>out, <bf16*>att, <bf16*>k_cache, <bf16*>v_cache,
                                <const bf16*>inp, T, P, C, NH) != 0:
        fail("attention_cached_forward (bf16): out of memory for its float32 scratch")

cdef void bf16_kernel_attention_gqa_cached_forward(void* ctx, float* out, float* att,
                                                   float* k_cache, float* v_cache, const float* q,
                                                   const float* k, const float* v, int T, int P,
                                                   int NH, int NKV, int hs) noexcept nogil:
    if attention_gqa_cached_forward(<bf16*>out, <bf16*>att, <bf16*>k_cache, <bf16*>v_cache,
                                    <const bf16*>q, <const bf16*>k, <const bf16*>v, T, P, NH,
                                    NKV, hs) != 0:
        fail("attention_gqa_cached_forward (bf16): out of memory for its float32 scratch")

# the bf16 entries that round an intermediate to bf16, not only their outputs (above)
ROUNDED_INSIDE = ("flash_attention_forward", "flash_attention_backward",
                  "flash_attention_gqa_forward", "flash_attention_gqa_backward")
# the bf16 entries whose kernels are set here over the generated ones (fp32 kernels on widened
# copies), which check:'s oracle keeps (create(oracle=True))
OWN_BF16_KERNELS = ROUNDED_INSIDE + ("attention_cached_forward", "attention_gqa_cached_forward")


include "accel/generated/cpu_bf16_table.pxi"


# --- fp16: what is not an adapter -------------------------------------------------------

cdef void fp16_encoder_forward(void* ctx, float* out, const int* inp, const float* wte,
                               const float* wpe, int B, int T, int C) noexcept nogil:
    # wte's rows are looked up by token: an adapter could not size its copy
    cdef const fp16* wte_h = <const fp16*>wte
    cdef const fp16* wpe_h = <const fp16*>wpe
    cdef fp16* out_h = <fp16*>out
    cdef Py_ssize_t bt, i
    for bt in range(<Py_ssize_t>B * T):
        for i in range(C):
            out_h[bt * C + i] = float_to_fp16(fp16_to_float(wte_h[<Py_ssize_t>inp[bt] * C + i]) +
                                              fp16_to_float(wpe_h[(bt % T) * C + i]))


cdef void fp16_embedding_forward(void* ctx, float* out, const int* inp, const float* wte,
                                 int B, int T, int C) noexcept nogil:
    # a copy of rows: the bf16 kernel moves 2-byte elements whatever they hold
    embedding_forward(<bf16*>out, inp, <const bf16*>wte, B, T, C)


cdef void fp16_narrow_params(void* ctx, float* params, const float* master, Py_ssize_t n,
                             Py_ssize_t first, int seed) noexcept nogil:
    narrow_fp16(<fp16*>params, master, n)   # to nearest: the master weights keep the rest


cdef void fp16_adamw_update_rounded(void* ctx, float* params, float* master, float* m, float* v,
                                    const float* grads, Py_ssize_t n, float lr, float beta1,
                                    float beta2, float eps, float weight_decay, float grad_scale,
                                    int t, Py_ssize_t first) noexcept nogil:
    adamw_update(master, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t)
    narrow_fp16(<fp16*>params, master, n)


include "accel/generated/cpu_bf16_grads_table.pxi"


include "accel/generated/cpu_fp16_table.pxi"


PRECISIONS = ("fp32", "bf16", "fp16")
GRAD_PRECISIONS = ("fp32", "bf16")   # bf16 gradients at bf16 alone


def create(bint flash=True, str precision="fp32", bint oracle=False, str grad_precision="fp32"):
    """The CPU backend at a precision (PRECISIONS), its parameter gradients float32 or, at bf16,
    bf16 (grad_precision); with flash=False without the flash group (as a backend that has no
    flash attention), for tests; with oracle=True check:'s oracle, whose OWN_BF16_KERNELS
    entries are the fp32 kernels on widened copies."""
    if precision not in PRECISIONS:
        raise ValueError(f"accel.cpu: precision {precision!r} is not one of {PRECISIONS}")
    if grad_precision != "fp32" and (grad_precision not in GRAD_PRECISIONS or
                                     precision != grad_precision):
        raise ValueError(f"accel.cpu: {grad_precision} gradients need precision "
                         f"{grad_precision} (the parameters and activations in it), not "
                         f"{precision}")
    groups = ("linear", "gpt2", "llama", "classifier") + (("flash",) if flash else ()) + \
        ("fused", "cache", "lora") + (("mixed",) if precision != "fp32" else ()) + \
        (("no_master",) if precision == "bf16" else ())
    cdef ScratchOwner owner = ScratchOwner()
    if precision != "fp32":
        owner.s = <Scratch*>calloc(1, sizeof(Scratch))
        if owner.s == NULL:
            raise MemoryError()
    cdef Backend backend = Backend("cpu" if flash else "cpu-without-flash", True, groups,
                                   owner, precision, grad_precision)
    cdef BackendTable* t = &backend.table
    t.ctx = owner.s
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
    fill_kernels(t)
    t.attention_gqa_backward = cpu_attention_gqa_backward
    t.qkv_forward = cpu_qkv_forward
    t.qkv_backward = cpu_qkv_backward
    t.ffn_forward = cpu_ffn_forward
    t.ffn_backward = cpu_ffn_backward
    if precision == "bf16":
        fill_bf16(t)
        t.matmul_forward = bf16_matmul_forward
        t.matmul_backward = bf16_matmul_backward
        t.narrow_params = bf16_narrow_params
        t.adamw_update_rounded = bf16_adamw_update_rounded
        t.adamw_update_narrow = bf16_adamw_update_narrow
        if not oracle:
            t.flash_attention_forward = bf16_kernel_flash_attention_forward
            t.flash_attention_backward = bf16_kernel_flash_attention_backward
            t.flash_attention_gqa_forward = bf16_kernel_flash_attention_gqa_forward
            t.flash_attention_gqa_backward = bf16_kernel_flash_attention_gqa_backward
            t.attention_cached_forward = bf16_kernel_attention_cached_forward
            t.attention_gqa_cached_forward = bf16_kernel_attention_gqa_cached_forward
        if grad_precision == "bf16":
            fill_bf16_grads(t)
            t.matmul_backward = bf16g_matmul_backward
            t.adamw_update_rounded = bf16g_adamw_update_rounded
            t.adamw_update_narrow = bf16g_adamw_update_narrow
    elif precision == "fp16":
        fill_fp16(t)
        t.encoder_forward = fp16_encoder_forward
        t.embedding_forward = fp16_embedding_forward
        t.narrow_params = fp16_narrow_params
        t.adamw_update_rounded = fp16_adamw_update_rounded
    if not flash:
        t.flash_attention_forward = NULL
        t.flash_attention_backward = NULL
        t.flash_attention_gqa_forward = NULL
        t.flash_attention_gqa_backward = NULL
    backend.validate()
    return backend
