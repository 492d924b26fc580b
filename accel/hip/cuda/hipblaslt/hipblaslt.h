// accel/hip/cuda/hipblaslt/hipblaslt.h — for the nvcc builds of dev/gpu/matmul_epilogues.hip: the
// hipBLASLt names it uses, on cuBLASLt, as accel/hip/hip_to_cuda.h maps hipBLAS onto cuBLAS. The
// names are parallel (hipblasLtX -> cublasLtX, HIPBLASLT_Y -> CUBLASLT_Y) but several enum values
// differ (HIPBLASLT_MATMUL_DESC_EPILOGUE is 2, CUBLASLT_MATMUL_DESC_EPILOGUE 7), so each is mapped by
// name, never by value. Only what the variants use is mapped.
#pragma once

#include <cublasLt.h>

#include "../../hip_to_cuda.h"

typedef cublasLtHandle_t hipblasLtHandle_t;
typedef cublasLtMatmulDesc_t hipblasLtMatmulDesc_t;
typedef cublasLtMatrixLayout_t hipblasLtMatrixLayout_t;
typedef cublasLtMatmulPreference_t hipblasLtMatmulPreference_t;
typedef cublasLtMatmulAlgo_t hipblasLtMatmulAlgo_t;
typedef cublasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t;
typedef cublasLtEpilogue_t hipblasLtEpilogue_t;
typedef cublasLtMatmulDescAttributes_t hipblasLtMatmulDescAttributes_t;
typedef cublasLtMatmulPreferenceAttributes_t hipblasLtMatmulPreferenceAttributes_t;

constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_DEFAULT = CUBLASLT_EPILOGUE_DEFAULT;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_BIAS = CUBLASLT_EPILOGUE_BIAS;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_GELU = CUBLASLT_EPILOGUE_GELU;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_GELU_BIAS = CUBLASLT_EPILOGUE_GELU_BIAS;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_GELU_AUX = CUBLASLT_EPILOGUE_GELU_AUX;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_GELU_AUX_BIAS = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_BGRADA = CUBLASLT_EPILOGUE_BGRADA;
constexpr hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_BGRADB = CUBLASLT_EPILOGUE_BGRADB;

constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_TRANSA = CUBLASLT_MATMUL_DESC_TRANSA;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_TRANSB = CUBLASLT_MATMUL_DESC_TRANSB;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_EPILOGUE = CUBLASLT_MATMUL_DESC_EPILOGUE;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_BIAS_POINTER = CUBLASLT_MATMUL_DESC_BIAS_POINTER;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER =
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER;
constexpr hipblasLtMatmulDescAttributes_t HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD;
constexpr hipblasLtMatmulPreferenceAttributes_t HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES =
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;

inline hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle) { return cublasLtCreate(handle); }
inline hipblasStatus_t hipblasLtDestroy(hipblasLtHandle_t handle) { return cublasLtDestroy(handle); }
inline hipblasStatus_t hipblasLtMatrixLayoutCreate(hipblasLtMatrixLayout_t* layout, hipDataType type, uint64_t rows,
                                                   uint64_t cols, int64_t ld) {
    return cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld);
}
inline hipblasStatus_t hipblasLtMatrixLayoutDestroy(hipblasLtMatrixLayout_t layout) {
    return cublasLtMatrixLayoutDestroy(layout);
}
inline hipblasStatus_t hipblasLtMatmulDescCreate(hipblasLtMatmulDesc_t* desc, hipblasComputeType_t compute_type,
                                                 hipDataType scale_type) {
    return cublasLtMatmulDescCreate(desc, compute_type, scale_type);
}
inline hipblasStatus_t hipblasLtMatmulDescDestroy(hipblasLtMatmulDesc_t desc) {
    return cublasLtMatmulDescDestroy(desc);
}
inline hipblasStatus_t hipblasLtMatmulDescSetAttribute(hipblasLtMatmulDesc_t desc, hipblasLtMatmulDescAttributes_t attr,
                                                       const void* buf, size_t size) {
    return cublasLtMatmulDescSetAttribute(desc, attr, buf, size);
}
inline hipblasStatus_t hipblasLtMatmulPreferenceCreate(hipblasLtMatmulPreference_t* pref) {
    return cublasLtMatmulPreferenceCreate(pref);
}
inline hipblasStatus_t hipblasLtMatmulPreferenceDestroy(hipblasLtMatmulPreference_t pref) {
    return cublasLtMatmulPreferenceDestroy(pref);
}
inline hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(hipblasLtMatmulPreference_t pref,
                                                             hipblasLtMatmulPreferenceAttributes_t attr,
                                                             const void* buf, size_t size) {
    return cublasLtMatmulPreferenceSetAttribute(pref, attr, buf, size);
}
inline hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t desc,
                                                       hipblasLtMatrixLayout_t a, hipblasLtMatrixLayout_t b,
                                                       hipblasLtMatrixLayout_t c, hipblasLtMatrixLayout_t d,
                                                       hipblasLtMatmulPreference_t pref, int requested,
                                                       hipblasLtMatmulHeuristicResult_t results[], int* returned) {
    return cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, d, pref, requested, results, returned);
}
inline hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t desc, const void* alpha,
                                       const void* A, hipblasLtMatrixLayout_t a, const void* B,
                                       hipblasLtMatrixLayout_t b, const void* beta, const void* C,
                                       hipblasLtMatrixLayout_t c, void* D, hipblasLtMatrixLayout_t d,
                                       const hipblasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                       hipStream_t stream) {
    return cublasLtMatmul(handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace, workspace_bytes, stream);
}
