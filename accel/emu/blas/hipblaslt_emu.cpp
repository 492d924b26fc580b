// accel/emu/blas/hipblaslt_emu.cpp — hipBLASLt's hipblasLtMatmul on the CPU with the epilogues
// dev/gpu's variants ask for (DEFAULT, BIAS, GELU[_AUX][_BIAS], BGRADA, BGRADB), for their emulated
// builds. The product is the emulated hipBLAS's (hipblasGemmEx, float32 compute) into a float32
// array that starts as beta C + bias, so that a bias is added in the GEMM's float32 sum exactly as
// gpt2.hip's plain path adds it (out set to the bias, beta 1); the epilogue then runs on those
// float32 values and rounds each output once into its type. hipBLASLt's argument checks: a
// descriptor that was never created, layouts whose shapes do not make a GEMM, an attribute of the
// wrong size, return HIPBLAS_STATUS_INVALID_VALUE (or NOT_INITIALIZED), as the library does.
#include "hipblaslt/hipblaslt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16_bits.h"

namespace {

constexpr uint32_t MAGIC = 0x68626c74;  // "hblt"

struct Handle {
    uint32_t magic = MAGIC;
    hipblasHandle_t blas = nullptr;
};

struct Layout {
    uint32_t magic = MAGIC;
    hipDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct Desc {
    uint32_t magic = MAGIC;
    hipblasComputeType_t compute;
    hipDataType scale;
    int32_t transa = HIPBLAS_OP_N, transb = HIPBLAS_OP_N;
    uint32_t epilogue = HIPBLASLT_EPILOGUE_DEFAULT;
    void* bias = nullptr;
    int32_t bias_type = -1;  // -1: D's type
    void* aux = nullptr;
    int64_t aux_ld = 0;
};

struct Preference {
    uint32_t magic = MAGIC;
    uint64_t max_workspace = 0;
};

template <class T, class P>
T* valid(P pointer) {
    T* p = reinterpret_cast<T*>(pointer);
    return p && p->magic == MAGIC ? p : nullptr;
}

template <class T, class P>
hipblasStatus_t destroy(P pointer) {
    T* p = valid<T>(pointer);
    if (!p) return HIPBLAS_STATUS_INVALID_VALUE;
    p->magic = 0;
    delete p;
    return HIPBLAS_STATUS_SUCCESS;
}

// attribute `buf` of `size` bytes into `field`, when the sizes agree
template <class F>
hipblasStatus_t set(F& field, const void* buf, size_t size) {
    if (!buf || size != sizeof(F)) return HIPBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, sizeof(F));
    return HIPBLAS_STATUS_SUCCESS;
}

bool f32_or_bf16(hipDataType type) { return type == HIP_R_32F || type == HIP_R_16BF; }

float load(const void* x, hipDataType type, size_t i) {
    return type == HIP_R_32F ? static_cast<const float*>(x)[i]
                             : emu_blas::bf16_to_float(static_cast<const uint16_t*>(x)[i]);
}

void store(void* x, hipDataType type, size_t i, float value) {
    if (type == HIP_R_32F)
        static_cast<float*>(x)[i] = value;
    else
        static_cast<uint16_t*>(x)[i] = emu_blas::float_to_bf16(value);
}

// GELU, the tanh form (hipBLASLt's and GPT-2's)
float gelu(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + std::tanh(u));
}

}  // namespace

hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle) {
    if (!handle) return HIPBLAS_STATUS_INVALID_VALUE;
    Handle* h = new Handle;
    if (hipblasCreate(&h->blas) != HIPBLAS_STATUS_SUCCESS) {
        delete h;
        return HIPBLAS_STATUS_ALLOC_FAILED;
    }
    *handle = h;
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle) {
    Handle* h = valid<Handle>(handle);
    if (!h) return HIPBLAS_STATUS_NOT_INITIALIZED;
    hipblasDestroy(h->blas);
    return destroy<Handle>(handle);
}

hipblasStatus_t hipblasLtMatrixLayoutCreate(hipblasLtMatrixLayout_t* matLayout, hipDataType type, uint64_t rows,
                                            uint64_t cols, int64_t ld) {
    if (!matLayout) return HIPBLAS_STATUS_INVALID_VALUE;
    *matLayout = reinterpret_cast<hipblasLtMatrixLayout_t>(new Layout{MAGIC, type, rows, cols, ld});
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasLtMatrixLayoutDestroy(const hipblasLtMatrixLayout_t matLayout) {
    return destroy<Layout>(matLayout);
}

hipblasStatus_t hipblasLtMatmulDescCreate(hipblasLtMatmulDesc_t* matmulDesc, hipblasComputeType_t computeType,
                                          hipDataType scaleType) {
    if (!matmulDesc) return HIPBLAS_STATUS_INVALID_VALUE;
    Desc* d = new Desc;
    d->compute = computeType;
    d->scale = scaleType;
    *matmulDesc = reinterpret_cast<hipblasLtMatmulDesc_t>(d);
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasLtMatmulDescDestroy(const hipblasLtMatmulDesc_t matmulDesc) {
    return destroy<Desc>(matmulDesc);
}

hipblasStatus_t hipblasLtMatmulDescSetAttribute(hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatmulDescAttributes_t attr, const void* buf,
                                                size_t sizeInBytes) {
    Desc* d = valid<Desc>(matmulDesc);
    if (!d) return HIPBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case HIPBLASLT_MATMUL_DESC_TRANSA: return set(d->transa, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_TRANSB: return set(d->transb, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_EPILOGUE: return set(d->epilogue, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_BIAS_POINTER: return set(d->bias, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(d->bias_type, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set(d->aux, buf, sizeInBytes);
    case HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set(d->aux_ld, buf, sizeInBytes);
    }
    return HIPBLAS_STATUS_INVALID_VALUE;
}

hipblasStatus_t hipblasLtMatmulPreferenceCreate(hipblasLtMatmulPreference_t* pref) {
    if (!pref) return HIPBLAS_STATUS_INVALID_VALUE;
    *pref = reinterpret_cast<hipblasLtMatmulPreference_t>(new Preference);
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasLtMatmulPreferenceDestroy(const hipblasLtMatmulPreference_t pref) {
    return destroy<Preference>(pref);
}

hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(hipblasLtMatmulPreference_t pref,
                                                      hipblasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                      size_t sizeInBytes) {
    Preference* p = valid<Preference>(pref);
    if (!p || attr != HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return HIPBLAS_STATUS_INVALID_VALUE;
    return set(p->max_workspace, buf, sizeInBytes);
}

hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatrixLayout_t Adesc, hipblasLtMatrixLayout_t Bdesc,
                                                hipblasLtMatrixLayout_t Cdesc, hipblasLtMatrixLayout_t Ddesc,
                                                hipblasLtMatmulPreference_t pref, int requestedAlgoCount,
                                                hipblasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                int* returnAlgoCount) {
    if (!valid<Handle>(handle)) return HIPBLAS_STATUS_NOT_INITIALIZED;
    if (!valid<Desc>(matmulDesc) || !valid<Layout>(Adesc) || !valid<Layout>(Bdesc) || !valid<Layout>(Cdesc) ||
        !valid<Layout>(Ddesc) || !valid<Preference>(pref) || requestedAlgoCount < 1 || !heuristicResultsArray ||
        !returnAlgoCount)
        return HIPBLAS_STATUS_INVALID_VALUE;
    heuristicResultsArray[0] = hipblasLtMatmulHeuristicResult_t();
    *returnAlgoCount = 1;
    return HIPBLAS_STATUS_SUCCESS;
}

hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc, const void* alpha,
                                const void* A, hipblasLtMatrixLayout_t Adesc, const void* B,
                                hipblasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                hipblasLtMatrixLayout_t Cdesc, void* D, hipblasLtMatrixLayout_t Ddesc,
                                const hipblasLtMatmulAlgo_t* algo, void*, size_t, hipStream_t) {
    const Handle* h = valid<Handle>(handle);
    if (!h) return HIPBLAS_STATUS_NOT_INITIALIZED;
    const Desc* d = valid<Desc>(matmulDesc);
    const Layout *a = valid<Layout>(Adesc), *b = valid<Layout>(Bdesc), *c = valid<Layout>(Cdesc),
                 *dl = valid<Layout>(Ddesc);
    if (!d || !a || !b || !c || !dl || !alpha || !beta || !algo) return HIPBLAS_STATUS_INVALID_VALUE;
    if (d->compute != HIPBLAS_COMPUTE_32F || d->scale != HIP_R_32F) return HIPBLAS_STATUS_NOT_SUPPORTED;
    const bool ta = d->transa != HIPBLAS_OP_N, tb = d->transb != HIPBLAS_OP_N;
    const uint64_t m = dl->rows, n = dl->cols, k = ta ? a->rows : a->cols;
    if ((ta ? a->cols : a->rows) != m || (tb ? b->cols : b->rows) != k || (tb ? b->rows : b->cols) != n ||
        c->rows != m || c->cols != n || c->type != dl->type || c->ld < int64_t(m) || dl->ld < int64_t(m))
        return HIPBLAS_STATUS_INVALID_VALUE;
    if (!f32_or_bf16(a->type) || b->type != a->type || !f32_or_bf16(dl->type) ||
        (a->type == HIP_R_32F && dl->type != HIP_R_32F))
        return HIPBLAS_STATUS_NOT_SUPPORTED;
    // hipBLASLt's epilogues are bit sets: BIAS 4, GELU 32, AUX 128 (GELU_AUX_BIAS = 164)
    const uint32_t epilogue = d->epilogue;
    const bool bias_gradient = epilogue == HIPBLASLT_EPILOGUE_BGRADA || epilogue == HIPBLASLT_EPILOGUE_BGRADB;
    const bool adds_bias = epilogue & HIPBLASLT_EPILOGUE_BIAS, applies_gelu = epilogue & HIPBLASLT_EPILOGUE_GELU,
               aux = epilogue == HIPBLASLT_EPILOGUE_GELU_AUX || epilogue == HIPBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool supported = epilogue == HIPBLASLT_EPILOGUE_DEFAULT || epilogue == HIPBLASLT_EPILOGUE_BIAS ||
                           epilogue == HIPBLASLT_EPILOGUE_GELU || epilogue == HIPBLASLT_EPILOGUE_GELU_BIAS || aux ||
                           bias_gradient;
    if (!supported) return HIPBLAS_STATUS_NOT_SUPPORTED;
    const hipDataType bias_type = d->bias_type < 0 ? dl->type : hipDataType(d->bias_type);
    if ((adds_bias || bias_gradient) && (!d->bias || !f32_or_bf16(bias_type))) return HIPBLAS_STATUS_INVALID_VALUE;
    if (aux && (!d->aux || d->aux_ld < int64_t(m))) return HIPBLAS_STATUS_INVALID_VALUE;

    // the sum: beta C + bias, then + alpha op(A) op(B) by the emulated hipBLAS (float32 compute)
    const float beta_f = *static_cast<const float*>(beta);
    std::vector<float> sum(m * n);
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i)
            sum[i + j * m] = (beta_f != 0.0f ? beta_f * load(C, c->type, i + j * c->ld) : 0.0f) +
                             (adds_bias ? load(d->bias, bias_type, i) : 0.0f);
    const float one = 1.0f;
    const hipblasStatus_t status =
        hipblasGemmEx(h->blas, hipblasOperation_t(d->transa), hipblasOperation_t(d->transb), int(m), int(n), int(k),
                      alpha, A, a->type, int(a->ld), B, b->type, int(b->ld), &one, sum.data(), HIP_R_32F,
                      int(std::max<uint64_t>(m, 1)), HIPBLAS_COMPUTE_32F, HIPBLAS_GEMM_DEFAULT);
    if (status != HIPBLAS_STATUS_SUCCESS) return status;

    // the epilogue, each output rounded once
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i) {
            const float x = sum[i + j * m];
            if (aux) store(d->aux, dl->type, i + j * d->aux_ld, x);
            store(D, dl->type, i + j * dl->ld, applies_gelu ? gelu(x) : x);
        }
    // the bias gradient, written: BGRADA sums op(A) (m x k) over k, one per row of D; BGRADB
    // sums op(B) (k x n) over k, one per column of D; in double, rounded once
    if (bias_gradient) {
        const bool of_a = epilogue == HIPBLASLT_EPILOGUE_BGRADA;
        const Layout* x = of_a ? a : b;
        const void* X = of_a ? A : B;
        const bool transposed = of_a ? ta : tb;
        const uint64_t outputs = of_a ? m : n;
        for (uint64_t o = 0; o < outputs; ++o) {
            double total = 0.0;
            for (uint64_t l = 0; l < k; ++l) {
                // op(A)[o, l] or op(B)[l, o]
                const uint64_t row = of_a ? (transposed ? l : o) : (transposed ? o : l);
                const uint64_t col = of_a ? (transposed ? o : l) : (transposed ? l : o);
                total += load(X, x->type, row + col * x->ld);
            }
            store(d->bias, bias_type, o, float(total));
        }
    }
    return HIPBLAS_STATUS_SUCCESS;
}
