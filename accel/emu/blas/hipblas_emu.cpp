// accel/emu/blas/hipblas_emu.cpp — hipBLAS's single-precision GEMMs on the CPU, for the
// emulated build of accel/hip: a vendor BLAS is not a kernel of ours to emulate thread by
// thread, so this is plain C++ with hipBLAS's semantics (column-major operands, op(A)/op(B),
// C not read when beta is 0) and its argument checks (a bad dimension or leading dimension
// returns HIPBLAS_STATUS_INVALID_VALUE, as the real library does, instead of reading astray).
// Single-threaded: the emulator runs one launch at a time anyway.
#include "hipblas/hipblas.h"

#include <algorithm>
#include <vector>

namespace {

// What hipblasCreate hands out, so that a handle that was never created is refused.
struct Handle {
    unsigned magic = 0x68697062;  // "hipb"
};

bool valid(hipblasHandle_t handle) { return handle && static_cast<Handle*>(handle)->magic == 0x68697062; }

bool valid_op(hipblasOperation_t op) { return op == HIPBLAS_OP_N || op == HIPBLAS_OP_T || op == HIPBLAS_OP_C; }

// Rows of C computed together: a panel of op(A) with this many rows stays in cache while
// every column of C is formed from it.
constexpr int ROW_BLOCK = 64;
// Terms of a sum added in float before the partial sum joins the double total.
constexpr int K_CHUNK = 64;

// One GEMM, column-major: C (m x n) = alpha op(A) op(B) + beta C. For each block of rows, op(A)
// is read (or for a transposed A, packed) as a column-major panel, and each column of C is the
// sum over l of the panel's column l times op(B)[l, j]: a contiguous inner loop over the rows,
// which the compiler vectorises without reordering any sum. Sums run in float over chunks of
// K_CHUNK terms and in double across chunks, so that what check:hip-emu reports against
// OpenBLAS is the kernels' error, not this GEMM's: one float sum in this order over K = 50304
// (the logits' backward) drifts past 1e-5.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))  // AVX2 where the CPU has it
#endif
void gemm(bool transa, bool transb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
    std::vector<float> panel(transa ? size_t(ROW_BLOCK) * k : 0);
    float partial[ROW_BLOCK];
    double total[ROW_BLOCK];
    for (int i0 = 0; i0 < m; i0 += ROW_BLOCK) {
        const int rows = std::min(ROW_BLOCK, m - i0);
        const float* a = A + i0;  // op(A)[i0 + i, l] = a[i + l * a_ld]
        long a_ld = lda;
        if (transa) {
            for (int l = 0; l < k; ++l)
                for (int i = 0; i < rows; ++i) panel[i + size_t(l) * rows] = A[l + size_t(i0 + i) * lda];
            a = panel.data();
            a_ld = rows;
        }
        for (int j = 0; j < n; ++j) {
            std::fill(total, total + rows, 0.0);
            for (int l0 = 0; l0 < k; l0 += K_CHUNK) {
                std::fill(partial, partial + rows, 0.0f);
                for (int l = l0; l < std::min(k, l0 + K_CHUNK); ++l) {
                    const float b = transb ? B[j + size_t(l) * ldb] : B[l + size_t(j) * ldb];
                    const float* a_l = a + size_t(l) * a_ld;
                    for (int i = 0; i < rows; ++i) partial[i] += a_l[i] * b;
                }
                for (int i = 0; i < rows; ++i) total[i] += partial[i];
            }
            float* c = C + i0 + size_t(j) * ldc;
            if (beta == 0.0f)
                for (int i = 0; i < rows; ++i) c[i] = float(alpha * total[i]);
            else
                for (int i = 0; i < rows; ++i) c[i] = float(alpha * total[i] + double(beta) * c[i]);
        }
    }
}

hipblasStatus_t check(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m, int n,
                      int k, const float* alpha, int lda, int ldb, const float* beta, int ldc, int batch_count) {
    if (!valid(handle)) return HIPBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batch_count < 0 || !alpha || !beta)
        return HIPBLAS_STATUS_INVALID_VALUE;
    const int a_rows = transa == HIPBLAS_OP_N ? m : k, b_rows = transb == HIPBLAS_OP_N ? k : n;
    if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m))
        return HIPBLAS_STATUS_INVALID_VALUE;
    return HIPBLAS_STATUS_SUCCESS;
}

}  // namespace

hipblasStatus_t hipblasCreate(hipblasHandle_t* handle) {
    if (!handle) return HIPBLAS_STATUS_INVALID_VALUE;
    *handle = new Handle;
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasDestroy(hipblasHandle_t handle) {
    if (!valid(handle)) return HIPBLAS_STATUS_NOT_INITIALIZED;
    static_cast<Handle*>(handle)->magic = 0;
    delete static_cast<Handle*>(handle);
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasSgemm(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m,
                             int n, int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                             const float* beta, float* C, int ldc) {
    return hipblasSgemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                                      1);
}

hipblasStatus_t hipblasSgemmStridedBatched(hipblasHandle_t handle, hipblasOperation_t transa,
                                           hipblasOperation_t transb, int m, int n, int k, const float* alpha,
                                           const float* A, int lda, hipblasStride strideA, const float* B, int ldb,
                                           hipblasStride strideB, const float* beta, float* C, int ldc,
                                           hipblasStride strideC, int batchCount) {
    const hipblasStatus_t status = check(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc, batchCount);
    if (status != HIPBLAS_STATUS_SUCCESS) return status;
    for (int i = 0; i < batchCount; ++i)
        gemm(transa != HIPBLAS_OP_N, transb != HIPBLAS_OP_N, m, n, k, *alpha, A + i * strideA, lda, B + i * strideB,
             ldb, *beta, C + i * strideC, ldc);
    return HIPBLAS_STATUS_SUCCESS;
}
