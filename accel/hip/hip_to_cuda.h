// accel/hip/hip_to_cuda.h — the HIP names accel/hip/gpt2.hip uses, on CUDA and cuBLAS, so that
// nvcc builds the HIP source for NVIDIA GPUs. (anthonix/llm.c went the other way, CUDA source
// hipified for AMD; here HIP is the source.) Only what gpt2.hip uses is mapped: a new HIP call
// there fails the nvcc build until it is added here. The nvcc build puts accel/hip/cuda on the
// include path, where hip/hip_runtime.h and hipblas/hipblas.h include this file.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

// ---- runtime ------------------------------------------------------------------------------

typedef cudaError_t hipError_t;
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaMemcpyKind hipMemcpyKind;
typedef cudaStream_t hipStream_t;
constexpr hipError_t hipSuccess = cudaSuccess;
constexpr hipMemcpyKind hipMemcpyHostToDevice = cudaMemcpyHostToDevice;
constexpr hipMemcpyKind hipMemcpyDeviceToHost = cudaMemcpyDeviceToHost;

inline hipError_t hipGetLastError() { return cudaGetLastError(); }
inline const char* hipGetErrorString(hipError_t e) { return cudaGetErrorString(e); }
inline hipError_t hipGetDeviceCount(int* count) { return cudaGetDeviceCount(count); }
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
    return cudaGetDeviceProperties(prop, device);
}
inline hipError_t hipDeviceSynchronize() { return cudaDeviceSynchronize(); }
inline hipError_t hipSetDevice(int device) { return cudaSetDevice(device); }
template <class T>
hipError_t hipMalloc(T** pointer, size_t bytes) {
    return cudaMalloc(pointer, bytes);
}
inline hipError_t hipFree(void* pointer) { return cudaFree(pointer); }
inline hipError_t hipMemset(void* dst, int value, size_t bytes) { return cudaMemset(dst, value, bytes); }
inline hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t stream) {
    return cudaMemsetAsync(dst, value, bytes, stream);
}
inline hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind kind) {
    return cudaMemcpy(dst, src, bytes, kind);
}

// ---- bfloat16 (hip/hip_bf16.h): the functions have CUDA's names already ----------------------

typedef __nv_bfloat16 __hip_bfloat16;
typedef __nv_bfloat162 __hip_bfloat162;

// ---- kernels ------------------------------------------------------------------------------

#define hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, ...) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define HIP_KERNEL_NAME(...) __VA_ARGS__
#define HIP_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[];
// HIP's shuffles take the whole warp and no mask; CUDA's have only the _sync form since Volta
#define __shfl_xor(var, lane_mask) __shfl_xor_sync(0xffffffffu, (var), (lane_mask))

// ---- BLAS ---------------------------------------------------------------------------------

typedef cublasHandle_t hipblasHandle_t;
typedef cublasStatus_t hipblasStatus_t;
typedef cublasOperation_t hipblasOperation_t;
typedef long long hipblasStride;
constexpr hipblasStatus_t HIPBLAS_STATUS_SUCCESS = CUBLAS_STATUS_SUCCESS;
constexpr hipblasOperation_t HIPBLAS_OP_N = CUBLAS_OP_N;
constexpr hipblasOperation_t HIPBLAS_OP_T = CUBLAS_OP_T;
// the mixed-precision GEMMs (hipBLAS's V2 API: hipDataType, hipblasComputeType_t)
typedef cudaDataType hipDataType;
typedef cublasComputeType_t hipblasComputeType_t;
typedef cublasGemmAlgo_t hipblasGemmAlgo_t;
constexpr hipDataType HIP_R_32F = CUDA_R_32F;
constexpr hipDataType HIP_R_16BF = CUDA_R_16BF;
constexpr hipblasComputeType_t HIPBLAS_COMPUTE_32F = CUBLAS_COMPUTE_32F;
constexpr hipblasGemmAlgo_t HIPBLAS_GEMM_DEFAULT = CUBLAS_GEMM_DEFAULT;

inline hipblasStatus_t hipblasCreate(hipblasHandle_t* handle) { return cublasCreate(handle); }
inline hipblasStatus_t hipblasDestroy(hipblasHandle_t handle) { return cublasDestroy(handle); }
inline hipblasStatus_t hipblasSgemm(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb,
                                    int m, int n, int k, const float* alpha, const float* A, int lda, const float* B,
                                    int ldb, const float* beta, float* C, int ldc) {
    return cublasSgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline hipblasStatus_t hipblasSgemmStridedBatched(hipblasHandle_t handle, hipblasOperation_t transa,
                                                  hipblasOperation_t transb, int m, int n, int k, const float* alpha,
                                                  const float* A, int lda, hipblasStride strideA, const float* B,
                                                  int ldb, hipblasStride strideB, const float* beta, float* C,
                                                  int ldc, hipblasStride strideC, int batchCount) {
    return cublasSgemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C,
                                     ldc, strideC, batchCount);
}
inline hipblasStatus_t hipblasGemmEx(hipblasHandle_t handle, hipblasOperation_t transa, hipblasOperation_t transb, int m,
                                     int n, int k, const void* alpha, const void* A, hipDataType a_type, int lda,
                                     const void* B, hipDataType b_type, int ldb, const void* beta, void* C,
                                     hipDataType c_type, int ldc, hipblasComputeType_t compute_type,
                                     hipblasGemmAlgo_t algo) {
    return cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc,
                        compute_type, algo);
}
inline hipblasStatus_t hipblasGemmStridedBatchedEx(hipblasHandle_t handle, hipblasOperation_t transa,
                                                   hipblasOperation_t transb, int m, int n, int k, const void* alpha,
                                                   const void* A, hipDataType a_type, int lda, hipblasStride strideA,
                                                   const void* B, hipDataType b_type, int ldb, hipblasStride strideB,
                                                   const void* beta, void* C, hipDataType c_type, int ldc,
                                                   hipblasStride strideC, int batchCount,
                                                   hipblasComputeType_t compute_type, hipblasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, a_type, lda, strideA, B, b_type, ldb,
                                      strideB, beta, C, c_type, ldc, strideC, batchCount, compute_type, algo);
}
