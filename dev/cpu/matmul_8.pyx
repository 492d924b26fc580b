# matmul variant 8: kernels.matmul (its forward cimported, not copied), with backward's two GEMMs
# on two halves of the threads instead of each GEMM split over all of them.
#   backward: dinp (B,T,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias += sum(dout)
# Backward's two GEMMs have the same FLOPs (2*B*T*C*OC each).  With an even number of threads,
# the first half share dinp's and the second half dweight's (and dbias): on 2 threads each runs
# one whole GEMM, instead of two half GEMMs that each pack all of dout (dinp's columns) or all
# of inp (dweight's rows) again.  With an odd number, or without dinp, every thread takes a
# block of each.  Measured (dev/BENCHMARKS.md section 10): 1-3% on the backward GEMMs at best,
# nothing visible in a step, so it stays here.
from cython.parallel cimport prange

from kernels.matmul cimport block_start, dinp_block, dweight_block, matmul_forward  # forward: kernels'
from kernels.parallel cimport blas_single_threaded, max_threads

include "kernels/matmul_wrappers.pxi"


cdef void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T, parts = max_threads(), part
    cdef bint halves = dinp != NULL and parts % 2 == 0
    cdef int dinp_parts = parts // 2 if halves else parts      # dinp's: threads 0 .. dinp_parts-1
    cdef int dweight_part0 = parts // 2 if halves else 0       # dweight's: dweight_part0 .. parts-1
    cdef int dweight_parts = parts - dweight_part0
    blas_single_threaded()
    for part in prange(parts, schedule="static", num_threads=parts):
        if dinp != NULL and part < dinp_parts:
            dinp_block(dinp, dout, weight, BT, C, OC,
                       block_start(part, dinp_parts, C), block_start(part + 1, dinp_parts, C))
        if part >= dweight_part0:
            dweight_block(dweight, dbias, dout, inp, BT, C, OC,
                          block_start(part - dweight_part0, dweight_parts, OC),
                          block_start(part - dweight_part0 + 1, dweight_parts, OC))
