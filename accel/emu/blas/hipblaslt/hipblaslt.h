// accel/emu/blas/hipblaslt/hipblaslt.h — the part of hipBLASLt's API that dev/gpu's GEMM-epilogue
// variants use (dev/gpu/matmul_epilogues.hip), declared as ROCm's hipBLASLt declares it (names,
// enum values, signatures), for the emulated build: hipblaslt_emu.cpp implements these on the CPU
// from hipBLASLt's documented semantics. The nvcc build finds accel/hip/cuda/hipblaslt/hipblaslt.h
// instead (these names on cuBLASLt's, whose enum values differ).
//
// hipblasLtMatmul: D = alpha op(A) op(B) + beta C, column-major, then the epilogue, in the compute
// type (float32), with D rounded once into its type:
//   DEFAULT         nothing more
//   BIAS            + bias[i] on every column of D (bias: rows of D, BIAS_POINTER)
//   GELU_BIAS       + bias, then D = gelu(the sum), GELU's tanh form (GELU: without the bias)
//   GELU_AUX_BIAS   + bias, the pre-activation written to EPILOGUE_AUX_POINTER (D's type, leading
//                   dimension EPILOGUE_AUX_LD), D = gelu(pre-activation) (GELU_AUX: without the bias)
//   BGRADB          D as DEFAULT; the bias gradient, the sums of op(B) over the GEMM's k (one per
//                   column of D), WRITTEN (not added) to BIAS_POINTER in the bias's type; BGRADA
//                   the sums of op(A) over k (one per row of D)
// BIAS_DATA_TYPE defaults to D's type. Other epilogues return HIPBLAS_STATUS_NOT_SUPPORTED.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hipblas/hipblas.h"

typedef struct ihipStream_t* hipStream_t;

typedef enum {
    HIPBLASLT_EPILOGUE_DEFAULT = 1,
    HIPBLASLT_EPILOGUE_RELU = 2,
    HIPBLASLT_EPILOGUE_BIAS = 4,
    HIPBLASLT_EPILOGUE_RELU_BIAS = 6,
    HIPBLASLT_EPILOGUE_GELU = 32,
    HIPBLASLT_EPILOGUE_GELU_BIAS = 36,
    HIPBLASLT_EPILOGUE_GELU_AUX = 160,
    HIPBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    HIPBLASLT_EPILOGUE_DGELU = 192,
    HIPBLASLT_EPILOGUE_DGELU_BGRAD = 208,
    HIPBLASLT_EPILOGUE_BGRADA = 256,
    HIPBLASLT_EPILOGUE_BGRADB = 512,
} hipblasLtEpilogue_t;

typedef enum {
    HIPBLASLT_MATMUL_DESC_TRANSA = 0,                 // int32_t, a hipblasOperation_t
    HIPBLASLT_MATMUL_DESC_TRANSB = 1,                 // int32_t
    HIPBLASLT_MATMUL_DESC_EPILOGUE = 2,               // uint32_t, a hipblasLtEpilogue_t
    HIPBLASLT_MATMUL_DESC_BIAS_POINTER = 3,           // void*
    HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 4,         // int32_t, a hipDataType
    HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 10,  // void*
    HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 11,       // int64_t
} hipblasLtMatmulDescAttributes_t;

typedef enum {
    HIPBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
    HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,  // uint64_t
} hipblasLtMatmulPreferenceAttributes_t;

typedef void* hipblasLtHandle_t;
typedef struct {
    uint64_t data[4];
} hipblasLtMatmulDescOpaque_t;
typedef struct {
    uint64_t data[4];
} hipblasLtMatrixLayoutOpaque_t;
typedef struct {
    uint64_t data[5];
} hipblasLtMatmulPreferenceOpaque_t;
typedef hipblasLtMatmulDescOpaque_t* hipblasLtMatmulDesc_t;
typedef hipblasLtMatrixLayoutOpaque_t* hipblasLtMatrixLayout_t;
typedef hipblasLtMatmulPreferenceOpaque_t* hipblasLtMatmulPreference_t;

typedef struct _hipblasLtMatmulAlgo_t {
    uint8_t data[16] = {0};
    size_t max_workspace_bytes = 0;
} hipblasLtMatmulAlgo_t;

typedef struct _hipblasLtMatmulHeuristicResult_t {
    hipblasLtMatmulAlgo_t algo;
    size_t workspaceSize = 0;
    hipblasStatus_t state = HIPBLAS_STATUS_SUCCESS;
    float wavesCount = 1.0;
    int reserved[4];
} hipblasLtMatmulHeuristicResult_t;

hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle);
hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle);

// A matrix of `type` elements, `rows` x `cols` stored column-major with leading dimension ld
// (before op(): A of op T is k x m here).
hipblasStatus_t hipblasLtMatrixLayoutCreate(hipblasLtMatrixLayout_t* matLayout, hipDataType type, uint64_t rows,
                                            uint64_t cols, int64_t ld);
hipblasStatus_t hipblasLtMatrixLayoutDestroy(const hipblasLtMatrixLayout_t matLayout);

hipblasStatus_t hipblasLtMatmulDescCreate(hipblasLtMatmulDesc_t* matmulDesc, hipblasComputeType_t computeType,
                                          hipDataType scaleType);
hipblasStatus_t hipblasLtMatmulDescDestroy(const hipblasLtMatmulDesc_t matmulDesc);
// sizeInBytes must be the attribute's size (HIPBLAS_STATUS_INVALID_VALUE otherwise)
hipblasStatus_t hipblasLtMatmulDescSetAttribute(hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatmulDescAttributes_t attr, const void* buf,
                                                size_t sizeInBytes);

hipblasStatus_t hipblasLtMatmulPreferenceCreate(hipblasLtMatmulPreference_t* pref);
hipblasStatus_t hipblasLtMatmulPreferenceDestroy(const hipblasLtMatmulPreference_t pref);
hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(hipblasLtMatmulPreference_t pref,
                                                      hipblasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                      size_t sizeInBytes);

// The emulation has one algorithm: the first result, needing no workspace.
hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatrixLayout_t Adesc, hipblasLtMatrixLayout_t Bdesc,
                                                hipblasLtMatrixLayout_t Cdesc, hipblasLtMatrixLayout_t Ddesc,
                                                hipblasLtMatmulPreference_t pref, int requestedAlgoCount,
                                                hipblasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                int* returnAlgoCount);

// D (Ddesc) = epilogue(alpha op(A) op(B) + beta C); C may be D (in place), alpha and beta on the host.
hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc, const void* alpha,
                                const void* A, hipblasLtMatrixLayout_t Adesc, const void* B,
                                hipblasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                hipblasLtMatrixLayout_t Cdesc, void* D, hipblasLtMatrixLayout_t Ddesc,
                                const hipblasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
                                hipStream_t stream);
