# The sgemm every kernel calls: OpenBLAS (scipy-openblas32, linked into every extension) or
# Intel's oneMKL (the `mkl` wheel, loaded at import), chosen once per process (kernels/blas.pyx).
# Row-major CBLAS arguments; always called from inside the kernels' own OpenMP threads, so the
# library runs single-threaded (OpenBLAS set to 1 thread, MKL's sequential layer).
from kernels.cblas cimport CBLAS_ORDER, CBLAS_TRANSPOSE

cdef void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) noexcept nogil
