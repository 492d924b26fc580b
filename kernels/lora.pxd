# LoRA, a low-rank update beside a frozen linear layer:  out += scale * (inp @ A^T) @ B^T
# N = B*T rows, IN = C, OUT = OC as matmul's
from kernels.blas cimport sgemm
from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans

cdef void lora_forward(float* out, float* hidden, const float* inp, const float* A,
                       const float* Bm, float scale, int B, int T, int IN, int OUT,
                       int R) noexcept nogil
# out (N,OUT) +=;  hidden (N,R) written (kept for backward);  inp (N,IN), A (R,IN), Bm (OUT,R)
cdef void lora_backward(float* dinp, float* dA, float* dB, float* dhidden, const float* dout,
                        const float* inp, const float* hidden, const float* A, const float* Bm,
                        float scale, int B, int T, int IN, int OUT, int R) noexcept nogil
# dinp (N,IN), dA (R,IN), dB (OUT,R) +=;  dhidden (N,R) written (scratch);  dout (N,OUT)
