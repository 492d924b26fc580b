# The sgemm every kernel calls: OpenBLAS (scipy-openblas32, linked into every extension) or
# Intel's oneMKL (the `mkl` wheel, loaded at import), chosen once per process (kernels/blas.pyx).
# Row-major CBLAS arguments; always called from inside the kernels' own OpenMP threads, so the
# library runs single-threaded (OpenBLAS set to 1 thread, MKL's sequential layer).
from kernels.bf16 cimport bf16, bf16_to_float
from kernels.cblas cimport CBLAS_ORDER, CBLAS_TRANSPOSE

cdef void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) noexcept nogil

# C (M,N) float32 = alpha op(A) op(B) + beta C with A, B bf16 and the products summed in float32:
# MKL's gemm_bf16bf16f32 (AMX, AVX512_BF16), or the operands widened and sgemm (kernels/blas.pyx
# says which).  Returns -1 where the widened copies found no memory, else 0.
cdef int gemm_bf16(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                   int M, int N, int K, float alpha, const bf16* A, int lda,
                   const bf16* B, int ldb, float beta, float* C, int ldc) noexcept nogil
# Where gemm_bf16 widens (no bf16 hardware), a caller that multiplies many A by one B widens B
# once (widened: op(X) (rows, cols) as a new float32 matrix, ld its row length; NULL without
# memory; free it) and calls gemm_bf16_widened_b with it, which widens A alone.
cdef bint bf16_gemm_widens() noexcept nogil
cdef float* widened(CBLAS_TRANSPOSE trans, int rows, int cols, const bf16* X, int ldx,
                    int* ld) noexcept nogil
cdef int gemm_bf16_widened_b(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                             int M, int N, int K, float alpha, const bf16* A, int lda,
                             const float* B32, int ldb32, float beta, float* C,
                             int ldc) noexcept nogil
