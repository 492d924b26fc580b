// accel/emu/blas/hipblas/hipblas.h — the part of hipBLAS's API that accel/hip uses, declared
// as ROCm's hipBLAS declares it (names, enum values, signatures), for two builds:
//   - the emulated one (`make hip-emu`): hipblas_emu.cpp implements these on the CPU;
//   - the AMD compile check (`make hip-check-amd`) where no hipBLAS is installed (Debian
//     bookworm packages hipcc but not hipBLAS): the kernels compile for the GPU and the calls
//     into hipBLAS are checked against these declarations.
// Builds put accel/emu/blas on the include path, so `#include <hipblas/hipblas.h>` lands here.
#pragma once

#include <cstdint>

typedef void* hipblasHandle_t;
typedef int64_t hipblasStride;

typedef enum {
    HIPBLAS_STATUS_SUCCESS = 0,
    HIPBLAS_STATUS_NOT_INITIALIZED = 1,
    HIPBLAS_STATUS_ALLOC_FAILED = 2,
    HIPBLAS_STATUS_INVALID_VALUE = 3,
} hipblasStatus_t;

typedef enum {
    HIPBLAS_OP_N = 111,
    HIPBLAS_OP_T = 112,
    HIPBLAS_OP_C = 113,
} hipblasOperation_t;

hipblasStatus_t hipblasCreate(hipblasHandle_t* handle);
hipblasStatus_t hipblasDestroy(hipblasHandle_t handle);

// C = alpha op(A) op(B) + beta C, column-major; op(A) is m x k, op(B) k x n, C m x n. With
// beta == 0, C is not read (it may hold NaNs), as BLAS specifies.
hipblasStatus_t hipblasSgemm(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m,
                             int n, int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                             const float* beta, float* C, int ldc);

// batchCount independent GEMMs, the i-th on A + i strideA, B + i strideB, C + i strideC.
hipblasStatus_t hipblasSgemmStridedBatched(hipblasHandle_t handle, hipblasOperation_t transa,
                                           hipblasOperation_t transb, int m, int n, int k, const float* alpha,
                                           const float* A, int lda, hipblasStride strideA, const float* B, int ldb,
                                           hipblasStride strideB, const float* beta, float* C, int ldc,
                                           hipblasStride strideC, int batchCount);
