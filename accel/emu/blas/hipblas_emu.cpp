// accel/emu/blas/hipblas_emu.cpp — hipBLAS's GEMMs on the CPU (single precision; bf16 operands
// with float32 compute through hipblasGemmEx), for the emulated build of accel/hip: a vendor
// BLAS is not a kernel of ours to emulate thread by thread, so this is plain C++ with hipBLAS's
// semantics (column-major operands, op(A)/op(B), C not read when beta is 0) and its argument
// checks (a bad dimension or leading dimension returns HIPBLAS_STATUS_INVALID_VALUE, as the
// real library does, instead of reading astray).
// Single-threaded: the emulator runs one launch at a time anyway.
#include "hipblas/hipblas.h"

#include "bf16_bits.h"

#include <algorithm>
#include <cstdint>
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

// The element types an operand can have: float32, or bf16 (its bits, the upper half of a float32).
enum class Type { f32, bf16 };

float element(const void* X, Type type, size_t i) {
    if (type == Type::f32) return static_cast<const float*>(X)[i];
    return emu_blas::bf16_to_float(static_cast<const uint16_t*>(X)[i]);
}

// One GEMM, column-major: C (m x n) = alpha op(A) op(B) + beta C. For each block of rows, op(A)
// is read (or for a transposed or bf16 A, packed as float32) as a column-major panel, and each
// column of C is the sum over l of the panel's column l times op(B)[l, j] (a bf16 column of B
// widened first): a contiguous inner loop over the rows, which the compiler vectorises without
// reordering any sum. Sums run in float over chunks of K_CHUNK terms and in double across
// chunks, so that what check:hip-emu reports against OpenBLAS is the kernels' error, not this
// GEMM's: one float sum in this order over K = 50304 (the logits' backward) drifts past 1e-5.
// Each result is alpha total + beta C in float32, rounded once more into a bf16 C: the float32
// epilogue of a GPU's GEMM, then its conversion. Widening bf16 is exact, so bf16 operands give
// the products and sums of their float32 values.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))  // AVX2 where the CPU has it
#endif
void gemm(bool transa, bool transb, int m, int n, int k, float alpha, const void* A, Type a_type, int lda,
          const void* B, Type b_type, int ldb, float beta, void* C, Type c_type, int ldc) {
    const bool pack = transa || a_type != Type::f32;
    std::vector<float> panel(pack ? size_t(ROW_BLOCK) * k : 0);
    std::vector<float> column(b_type != Type::f32 ? size_t(k) : 0);
    float partial[ROW_BLOCK];
    double total[ROW_BLOCK];
    for (int i0 = 0; i0 < m; i0 += ROW_BLOCK) {
        const int rows = std::min(ROW_BLOCK, m - i0);
        const float* a = static_cast<const float*>(A) + i0;  // op(A)[i0 + i, l] = a[i + l * a_ld]
        long a_ld = lda;
        if (pack) {
            for (int l = 0; l < k; ++l)
                for (int i = 0; i < rows; ++i)
                    panel[i + size_t(l) * rows] =
                        element(A, a_type, transa ? l + size_t(i0 + i) * lda : i0 + i + size_t(l) * lda);
            a = panel.data();
            a_ld = rows;
        }
        for (int j = 0; j < n; ++j) {
            // op(B)[l, j] = b[l * b_step]
            const float* b;
            size_t b_step;
            if (b_type != Type::f32) {
                for (int l = 0; l < k; ++l)
                    column[l] = element(B, b_type, transb ? j + size_t(l) * ldb : l + size_t(j) * ldb);
                b = column.data();
                b_step = 1;
            } else {
                b = static_cast<const float*>(B) + (transb ? size_t(j) : size_t(j) * ldb);
                b_step = transb ? size_t(ldb) : 1;
            }
            std::fill(total, total + rows, 0.0);
            for (int l0 = 0; l0 < k; l0 += K_CHUNK) {
                std::fill(partial, partial + rows, 0.0f);
                for (int l = l0; l < std::min(k, l0 + K_CHUNK); ++l) {
                    const float b_l = b[l * b_step];
                    const float* a_l = a + size_t(l) * a_ld;
                    for (int i = 0; i < rows; ++i) partial[i] += a_l[i] * b_l;
                }
                for (int i = 0; i < rows; ++i) total[i] += partial[i];
            }
            const size_t c0 = i0 + size_t(j) * ldc;
            for (int i = 0; i < rows; ++i) {
                const float value = beta == 0.0f ? float(alpha * total[i])
                                                 : float(alpha * total[i] + double(beta) * element(C, c_type, c0 + i));
                if (c_type == Type::f32)
                    static_cast<float*>(C)[c0 + i] = value;
                else
                    static_cast<uint16_t*>(C)[c0 + i] = emu_blas::float_to_bf16(value);
            }
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
        gemm(transa != HIPBLAS_OP_N, transb != HIPBLAS_OP_N, m, n, k, *alpha, A + i * strideA, Type::f32, lda,
             B + i * strideB, Type::f32, ldb, *beta, C + i * strideC, Type::f32, ldc);
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasGemmEx(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m,
                              int n, int k, const void* alpha, const void* A, hipDataType a_type, int lda,
                              const void* B, hipDataType b_type, int ldb, const void* beta, void* C,
                              hipDataType c_type, int ldc, hipblasComputeType_t compute_type,
                              hipblasGemmAlgo_t algo) {
    return hipblasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, a_type, lda, 0, B, b_type, ldb, 0,
                                       beta, C, c_type, ldc, 0, 1, compute_type, algo);
}

hipblasStatus_t hipblasGemmStridedBatchedEx(hipblasHandle_t handle, hipblasOperation_t transa,
                                            hipblasOperation_t transb, int m, int n, int k, const void* alpha,
                                            const void* A, hipDataType a_type, int lda, hipblasStride strideA,
                                            const void* B, hipDataType b_type, int ldb, hipblasStride strideB,
                                            const void* beta, void* C, hipDataType c_type, int ldc,
                                            hipblasStride strideC, int batchCount, hipblasComputeType_t compute_type,
                                            hipblasGemmAlgo_t algo) {
    const float* alpha_f = static_cast<const float*>(alpha);
    const float* beta_f = static_cast<const float*>(beta);
    const hipblasStatus_t status = check(handle, transa, transb, m, n, k, alpha_f, lda, ldb, beta_f, ldc, batchCount);
    if (status != HIPBLAS_STATUS_SUCCESS) return status;
    if (algo != HIPBLAS_GEMM_DEFAULT) return HIPBLAS_STATUS_INVALID_VALUE;
    // hipBLAS's float32-compute combinations that this emulation has (hipblasGemmEx's table)
    const bool f32 = a_type == HIP_R_32F && b_type == HIP_R_32F && c_type == HIP_R_32F;
    const bool bf16 = a_type == HIP_R_16BF && b_type == HIP_R_16BF && (c_type == HIP_R_16BF || c_type == HIP_R_32F);
    if (compute_type != HIPBLAS_COMPUTE_32F || !(f32 || bf16)) return HIPBLAS_STATUS_NOT_SUPPORTED;
    const Type ab = bf16 ? Type::bf16 : Type::f32, c = c_type == HIP_R_16BF ? Type::bf16 : Type::f32;
    const size_t ab_size = bf16 ? 2 : 4, c_size = c == Type::bf16 ? 2 : 4;
    for (int i = 0; i < batchCount; ++i)
        gemm(transa != HIPBLAS_OP_N, transb != HIPBLAS_OP_N, m, n, k, *alpha_f,
             static_cast<const char*>(A) + i * strideA * ab_size, ab, lda,
             static_cast<const char*>(B) + i * strideB * ab_size, ab, ldb, *beta_f,
             static_cast<char*>(C) + i * strideC * c_size, c, ldc);
    return HIPBLAS_STATUS_SUCCESS;
}
