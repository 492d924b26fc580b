# The part of OpenBLAS's CBLAS interface the kernels use, as the scipy-openblas32 wheel ships it
# (every symbol prefixed scipy_; setup.py links every extension against it).
cdef extern from "cblas.h" nogil:
    enum CBLAS_ORDER:
        CblasRowMajor
    enum CBLAS_TRANSPOSE:
        CblasNoTrans
        CblasTrans
    void scipy_cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                           int M, int N, int K, float alpha, const float* A, int lda,
                           const float* B, int ldb, float beta, float* C, int ldc)
    void scipy_openblas_set_num_threads(int num_threads)
    int scipy_openblas_get_num_threads()
