# The one interface between a model and its kernels: a table of C function pointers.
# The CPU kernels in this folder fill it (kernels/cpu.pyx); a backend in accel/ (HIP, Metal, ANE)
# fills the same table with kernels over its own buffers, and a model written against the table
# (GPT-2 here, a Llama-family model later) runs on it unchanged.  Signatures and tensor shapes
# are documented in each layer's .pxd.
ctypedef struct Kernels:
    void (*encoder_forward)(float* out, const int* inp, const float* wte, const float* wpe,
                            int B, int T, int C) noexcept nogil
    void (*encoder_backward)(float* dwte, float* dwpe, const float* dout, const int* inp,
                             int B, int T, int C) noexcept nogil
    void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) noexcept nogil
    void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int B, int T, int C) noexcept nogil
    void (*matmul_forward)(float* out, const float* inp, const float* weight, const float* bias,
                           int B, int T, int C, int OC) noexcept nogil
    void (*matmul_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil
    void (*attention_forward)(float* out, float* preatt, float* att, const float* inp,
                              int B, int T, int C, int NH) noexcept nogil
    void (*attention_backward)(float* dinp, float* dpreatt, float* datt, const float* dout,
                               const float* inp, const float* att, int B, int T, int C, int NH) noexcept nogil
    void (*gelu_forward)(float* out, const float* inp, Py_ssize_t N) noexcept nogil
    void (*gelu_backward)(float* dinp, const float* inp, const float* dout, Py_ssize_t N) noexcept nogil
    void (*residual_forward)(float* out, const float* inp1, const float* inp2, Py_ssize_t N) noexcept nogil
    void (*residual_backward)(float* dinp1, float* dinp2, const float* dout, Py_ssize_t N) noexcept nogil
    void (*softmax_forward)(float* probs, const float* logits, int B, int T, int V, int Vp) noexcept nogil
    void (*crossentropy_forward)(float* losses, const float* probs, const int* targets,
                                 int B, int T, int Vp) noexcept nogil
    void (*crossentropy_softmax_backward)(float* dlogits, const float* dlosses, const float* probs,
                                          const int* targets, int B, int T, int V, int Vp) noexcept nogil
    void (*adamw_update)(float* params, float* m, float* v, const float* grads, Py_ssize_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int t) noexcept nogil
    double (*global_norm_squared)(const float* x, Py_ssize_t n) noexcept nogil
