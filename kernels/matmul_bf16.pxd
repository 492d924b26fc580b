# Linear layer in bf16 (kernels/matmul.pxd's, with bf16 activations and weights): the products
# of bf16 operands summed in float32 by kernels.blas's gemm_bf16, the bias added in float32,
# each output rounded to bf16 once.  The weight gradients stay float32: the GEMM adds into
# them directly, so the many small per-batch contributions are not rounded away.
from kernels.bf16 cimport bf16

cdef int matmul_forward_bf16(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                             int B, int T, int C, int OC) noexcept nogil
# out (B,T,OC) bf16; inp (B,T,C) bf16; weight (OC,C) bf16; bias (OC,) bf16 or NULL
cdef int matmul_backward_bf16(bf16* dinp, float* dweight, float* dbias, const bf16* dout,
                              const bf16* inp, const bf16* weight, int B, int T, int C,
                              int OC) noexcept nogil
# dinp (B,T,C) bf16, dweight (OC,C) float32, dbias (OC,) float32, each NULL where not wanted
# (dweight: a frozen weight, its GEMM skipped): all += ...;
# dout (B,T,OC) bf16.  Both return -1 where a GEMM or a block found no scratch memory, else 0.
