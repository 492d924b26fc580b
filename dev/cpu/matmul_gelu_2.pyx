# matmul_gelu variant 2: bias and GELU fused into the GEMM's output pass.
#   inp (B,T,C), weight (OC,C), bias (OC,)  ->  out (B,T,OC) = inp weight^T + bias, out_gelu = gelu(out)
# Each OpenMP thread takes a block of output columns, as kernels.matmul does, and walks it in
# chunks of NC columns: one single-threaded sgemm with beta = 0 (no bias pre-fill pass for it to
# read back), then, while the chunk (B*T x NC floats) is still in the core's L2, one pass that
# adds the bias, keeps the pre-activation for the backward and writes its GELU.  Variant 1 makes
# two more passes over out (the bias fill, GELU's read) from further away.
from cython.parallel cimport prange

from kernels.cblas cimport CblasNoTrans, CblasRowMajor, CblasTrans
from kernels.blas cimport sgemm
from kernels.matmul cimport block_start
from kernels.parallel cimport blas_single_threaded, max_threads
from kernels.vexp cimport vexpf

include "kernels/matmul_gelu_wrappers.pxi"

cdef enum:
    NC = 256                     # columns per chunk: 256 KB of out at B*T = 256

cdef float GELU_SCALING_FACTOR = 0.7978845608028654   # sqrt(2/pi)
cdef float GELU_CUBIC = 0.044715


cdef void matmul_gelu_forward(float* out, float* out_gelu, const float* inp, const float* weight,
                              const float* bias, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part, o0, o1, c0, c1
    cdef Py_ssize_t bt, o
    cdef float* out_bt
    cdef float* gelu_bt
    cdef float x, u
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        o0 = block_start(part, parts, OC)
        o1 = block_start(part + 1, parts, OC)
        c0 = o0
        while c0 < o1:
            c1 = min(o1, c0 + NC)
            # out[:, c0:c1] = inp (BT,C) @ weight[c0:c1] (c1-c0, C)^T
            sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, c1 - c0, C,
                  1.0, inp, C, weight + <Py_ssize_t>c0 * C, C, 0.0, out + c0, OC)
            for bt in range(BT):
                out_bt = out + bt * OC
                gelu_bt = out_gelu + bt * OC
                for o in range(c0, c1):
                    x = out_bt[o] + bias[o]
                    out_bt[o] = x
                    u = GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x)
                    gelu_bt[o] = x / (1.0 + vexpf(-2.0 * u))
            c0 = c1
