# matmul_gelu variant 1: GPT-2's fc layer and its GELU as the model runs them, two kernels one
# after the other: kernels.matmul's forward (the bias written into out first, then the GEMM
# adds onto it) and kernels.gelu's forward (a second pass over out).
#   inp (B,T,C), weight (OC,C), bias (OC,)  ->  out (B,T,OC) = inp weight^T + bias, out_gelu = gelu(out)
from kernels.gelu cimport gelu_forward
from kernels.matmul cimport matmul_forward

include "kernels/matmul_gelu_wrappers.pxi"


cdef void matmul_gelu_forward(float* out, float* out_gelu, const float* inp, const float* weight,
                              const float* bias, int B, int T, int C, int OC) noexcept nogil:
    matmul_forward(out, inp, weight, bias, B, T, C, OC)
    gelu_forward(out_gelu, out, <Py_ssize_t>B * T * OC)
