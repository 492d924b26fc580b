# The backend interface: the one way a model reaches memory and kernels.
#
# A backend is a context (`ctx`, whatever the backend needs: a device, a stream, its own
# bookkeeping) plus one table of C function pointers, each taking the context first.  A model
# allocates its buffers through the table, moves tokens in and losses out through it, and runs
# every layer, the loss bookkeeping and the optimizer through it, so it never dereferences a
# backend pointer: the same model runs on host memory (cpu), device memory (hip, metal) or a
# checking wrapper (check:NAME) unchanged.
#
# Pointers returned by alloc are the backend's; a model may offset them (a tensor inside a
# buffer) and pass them back, nothing else.  Entries are grouped: "core" every backend has,
# then one group per model family (gpt2, llama) or optional kernel set (flash); Backend.validate
# refuses a table with an entry of its families' groups missing (a llama backend needs the gpt2
# group too).  Kernel semantics and shapes are those of the CPU kernels, declared
# in kernels/*.pxd (backward entries add into their gradients).
#
# Dimension letters: B batch, T time, C channels, OC output channels, NH heads, V vocabulary,
# Vp padded vocabulary (row stride of logits, probs and wte), N or n elements.

ctypedef struct BackendTable:
    void* ctx
    # --- core: memory -------------------------------------------------------------------
    void* (*alloc)(void* ctx, size_t nbytes) noexcept nogil        # zeroed; NULL when out of memory
    void (*free)(void* ctx, void* ptr, size_t nbytes) noexcept nogil
    void (*zero)(void* ctx, void* ptr, size_t nbytes) noexcept nogil
    void (*copy_to_backend)(void* ctx, void* dst, const void* host_src, size_t nbytes) noexcept nogil
    void (*copy_to_host)(void* ctx, void* host_dst, const void* src, size_t nbytes) noexcept nogil
    void (*synchronize)(void* ctx) noexcept nogil
    const char* (*last_error)(void* ctx) noexcept nogil           # NULL when all went well
    void (*mark)(void* ctx, int step, int layer) noexcept nogil    # where the model is (-1: no layer)
    # --- core: loss bookkeeping and the optimizer ---------------------------------------
    void (*fill)(void* ctx, float* out, float value, Py_ssize_t n) noexcept nogil
    float (*mean)(void* ctx, const float* x, Py_ssize_t n) noexcept nogil        # to the host
    void (*adamw_update)(void* ctx, float* params, float* m, float* v, const float* grads,
                         Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int t) noexcept nogil
    double (*global_norm_squared)(void* ctx, const float* x, Py_ssize_t n) noexcept nogil  # to the host
    # --- gpt2: its layers ----------------------------------------------------------------
    void (*encoder_forward)(void* ctx, float* out, const int* inp, const float* wte,
                            const float* wpe, int B, int T, int C) noexcept nogil
    void (*encoder_backward)(void* ctx, float* dwte, float* dwpe, const float* dout,
                             const int* inp, int B, int T, int C, int Vp) noexcept nogil
    void (*layernorm_forward)(void* ctx, float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) noexcept nogil
    void (*layernorm_backward)(void* ctx, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight,
                               const float* mean, const float* rstd, int B, int T, int C) noexcept nogil
    void (*matmul_forward)(void* ctx, float* out, const float* inp, const float* weight,
                           const float* bias, int B, int T, int C, int OC) noexcept nogil
    void (*matmul_backward)(void* ctx, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* weight,
                            int B, int T, int C, int OC) noexcept nogil
    void (*attention_forward)(void* ctx, float* out, float* preatt, float* att,
                              const float* inp, int B, int T, int C, int NH) noexcept nogil
    void (*attention_backward)(void* ctx, float* dinp, float* dpreatt, float* datt,
                               const float* dout, const float* inp, const float* att,
                               int B, int T, int C, int NH) noexcept nogil
    void (*gelu_forward)(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil
    void (*gelu_backward)(void* ctx, float* dinp, const float* inp, const float* dout,
                          Py_ssize_t N) noexcept nogil
    void (*residual_forward)(void* ctx, float* out, const float* inp1, const float* inp2,
                             Py_ssize_t N) noexcept nogil
    void (*residual_backward)(void* ctx, float* dinp1, float* dinp2, const float* dout,
                              Py_ssize_t N) noexcept nogil
    void (*softmax_forward)(void* ctx, float* probs, const float* logits,
                            int B, int T, int V, int Vp) noexcept nogil
    void (*crossentropy_forward)(void* ctx, float* losses, const float* probs,
                                 const int* targets, int B, int T, int Vp) noexcept nogil
    void (*crossentropy_softmax_backward)(void* ctx, float* dlogits, const float* dlosses,
                                          const float* probs, const int* targets,
                                          int B, int T, int V, int Vp) noexcept nogil
    # --- llama: its layers (it also runs on gpt2's matmul without bias and residual entries);
    # letters as above plus NKV key/value heads, hs head size ------------------------------
    void (*embedding_forward)(void* ctx, float* out, const int* inp, const float* wte,
                              int B, int T, int C) noexcept nogil
    void (*embedding_backward)(void* ctx, float* dwte, const float* dout, const int* inp,
                               int B, int T, int C, int V) noexcept nogil     # dwte (V, C)
    void (*rmsnorm_forward)(void* ctx, float* out, float* rstd, const float* inp,
                            const float* weight, float eps, int B, int T, int C) noexcept nogil
    void (*rmsnorm_backward)(void* ctx, float* dinp, float* dweight, const float* dout,
                             const float* inp, const float* weight, const float* rstd,
                             int B, int T, int C) noexcept nogil
    void (*rope_forward)(void* ctx, float* out, const float* inp, const float* freqs_cos,
                         const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil
    void (*rope_backward)(void* ctx, float* dinp, const float* dout, const float* freqs_cos,
                          const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil
    void (*swiglu_forward)(void* ctx, float* out, const float* a, const float* b,
                           Py_ssize_t N) noexcept nogil
    void (*swiglu_backward)(void* ctx, float* da, float* db, const float* dout, const float* a,
                            const float* b, Py_ssize_t N) noexcept nogil
    void (*attention_gqa_forward)(void* ctx, float* out, float* att, const float* q,
                                  const float* k, const float* v,
                                  int B, int T, int NH, int NKV, int hs) noexcept nogil
    void (*attention_gqa_backward)(void* ctx, float* dq, float* dk, float* dv, const float* dout,
                                   const float* q, const float* k, const float* v,
                                   const float* att, int B, int T, int NH, int NKV,
                                   int hs) noexcept nogil   # last_error says if it ran out of memory
    void (*classifier_forward)(void* ctx, float* losses, float* logsum, const float* logits,
                               const int* targets, int B, int T, int V) noexcept nogil
    void (*classifier_backward)(void* ctx, float* dlogits, const float* dlosses,
                                const float* logits, const float* logsum, const int* targets,
                                int B, int T, int V) noexcept nogil
    # --- flash: attention that keeps only each row's log-sum-exp (kernels/flash_attention.pxd);
    # a model uses it when the backend has it, else gpt2's attention with its (B,NH,T,T) buffers
    void (*flash_attention_forward)(void* ctx, float* out, float* lse, const float* inp,
                                    int B, int T, int C, int NH) noexcept nogil
    void (*flash_attention_backward)(void* ctx, float* dinp, const float* dout, const float* inp,
                                     const float* out, const float* lse,
                                     int B, int T, int C, int NH) noexcept nogil


cdef class Backend:
    cdef BackendTable table
    cdef readonly str name
    cdef readonly bint host_visible   # alloc's pointers are host memory the caller may view
    cdef readonly tuple families      # the model families whose entries the table fills
    cdef object keepalive             # what owns ctx (and anything the table's functions use)
    cdef void validate(self) except *


cdef class Buffer:
    """Memory allocated through a backend; freed with it."""
    cdef readonly Backend backend
    cdef void* ptr
    cdef readonly size_t nbytes
    cdef Py_ssize_t shape[1]
