// accel/emu/blas/hipblas/hipblas.h — the part of hipBLAS's API that accel/hip uses, declared
// as ROCm's hipBLAS declares it (names, enum values, signatures), for two builds:
//   - the emulated one (`make hip-emu`): hipblas_emu.cpp implements these on the CPU;
//   - the AMD compile check (`make hip-check-amd`) where no hipBLAS is installed (Debian
//     bookworm packages hipcc but not hipBLAS): the kernels compile for the GPU and the calls
//     into hipBLAS are checked against these declarations.
// Builds put accel/emu/blas on the include path, so `#include <hipblas/hipblas.h>` lands here.
// The mixed-precision GEMMs are declared in hipBLAS's V2 form (hipDataType, hipblasComputeType_t:
// the default from ROCm 7, HIPBLAS_V2 before), which is also cuBLAS's.
#pragma once

#include <cstdint>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#include <hip/library_types.h>  // ROCm's hipDataType
#else
// hip/library_types.h's values (CUDA's cudaDataType's), the ones used here
typedef enum {
    HIP_R_32F = 0,
    HIP_R_64F = 1,
    HIP_R_16F = 2,
    HIP_R_16BF = 14,
} hipDataType;
#endif

typedef void* hipblasHandle_t;
typedef int64_t hipblasStride;

typedef enum {
    HIPBLAS_STATUS_SUCCESS = 0,
    HIPBLAS_STATUS_NOT_INITIALIZED = 1,
    HIPBLAS_STATUS_ALLOC_FAILED = 2,
    HIPBLAS_STATUS_INVALID_VALUE = 3,
    HIPBLAS_STATUS_NOT_SUPPORTED = 7,
} hipblasStatus_t;

typedef enum {
    HIPBLAS_OP_N = 111,
    HIPBLAS_OP_T = 112,
    HIPBLAS_OP_C = 113,
} hipblasOperation_t;

typedef enum {
    HIPBLAS_COMPUTE_16F = 0,
    HIPBLAS_COMPUTE_32F = 2,
    HIPBLAS_COMPUTE_32F_FAST_TF32 = 6,
    HIPBLAS_COMPUTE_64F = 7,
} hipblasComputeType_t;

typedef enum {
    HIPBLAS_GEMM_DEFAULT = 160,
} hipblasGemmAlgo_t;

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

// The mixed-precision GEMM: A and B of a_type == b_type, C of c_type, alpha and beta of the
// compute type's (float for HIPBLAS_COMPUTE_32F). The emulation has hipBLAS's combinations with
// float32 compute: A, B, C float32 (Sgemm's), A and B bf16 with C bf16 or float32. Products and
// sums are float32 or better, alpha op(A) op(B) + beta C is formed in float32 and rounded once
// into C's type (to nearest even for bf16); others return HIPBLAS_STATUS_NOT_SUPPORTED.
hipblasStatus_t hipblasGemmEx(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m, int n,
                              int k, const void* alpha, const void* A, hipDataType a_type, int lda, const void* B,
                              hipDataType b_type, int ldb, const void* beta, void* C, hipDataType c_type, int ldc,
                              hipblasComputeType_t compute_type, hipblasGemmAlgo_t algo);

hipblasStatus_t hipblasGemmStridedBatchedEx(hipblasHandle_t handle, hipblasOperation_t transa,
                                            hipblasOperation_t transb, int m, int n, int k, const void* alpha,
                                            const void* A, hipDataType a_type, int lda, hipblasStride strideA,
                                            const void* B, hipDataType b_type, int ldb, hipblasStride strideB,
                                            const void* beta, void* C, hipDataType c_type, int ldc,
                                            hipblasStride strideC, int batchCount, hipblasComputeType_t compute_type,
                                            hipblasGemmAlgo_t algo);
