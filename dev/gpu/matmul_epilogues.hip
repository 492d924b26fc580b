/*
dev/gpu/matmul_epilogues.hip — accel/hip/gpt2.hip with its GEMMs' bias work moved into hipBLASLt's
(cuBLASLt's, on NVIDIA) epilogues: variants to A/B against the plain path (dev/gpu/ab_epilogues.py),
each built into a library of its own with every entry of gpt2.hip (accel/hip/Makefile, dev-epilogues):

    EPILOGUE_VARIANT=1  matmul_forward: one hipblasLtMatmul with the BIAS epilogue, instead of
                        broadcast_bias_kernel writing out and an Sgemm adding into it (one pass
                        over out fewer); backward plain
    EPILOGUE_VARIANT=2  matmul_backward: dbias from the dweight GEMM's BGRADB epilogue (the sums of
                        dout over B*T, read while the GEMM reads dout anyway) instead of
                        matmul_backward_bias_kernel's pass over dout; the epilogue WRITES the bias
                        gradient, so it lands in scratch and a kernel of OC threads adds it into
                        dbias (our table's backward adds); forward plain

and in both, accel_hip_dev_matmul_gelu_forward: GPT-2's fc matmul and its GELU as one GEMM with the
GELU_AUX_BIAS epilogue, writing the pre-activation (which gelu_backward reads) and the GELU, where
the plain path is matmul_forward then gelu_forward (a write and a read of the pre-activation fewer).

The plain functions stay in the library as accel_hip_plain_matmul_forward / _backward (gpt2.hip is
#included with its two matmul entries renamed); a variant calls them for what it leaves alone.

Planted faults (tests/test_gpu_epilogues.py): EPILOGUE_PLANT_MISSING_BIAS (variant 1: the DEFAULT
epilogue, the bias forgotten), EPILOGUE_PLANT_BGRADA (variant 2: the bias gradient of A, inp's sums
over the wrong dimension, instead of B's), EPILOGUE_PLANT_NO_AUX (GELU_BIAS: the pre-activation
not written).
*/
#define accel_hip_matmul_forward accel_hip_plain_matmul_forward
#define accel_hip_matmul_backward accel_hip_plain_matmul_backward
#include "../../accel/hip/gpt2.hip"
#undef accel_hip_matmul_forward
#undef accel_hip_matmul_backward
// the exports declared again, now under their own names: the variants' matmul entries below are
// checked against the spec as gpt2.hip's are (it declares only functions, so a second time is harmless)
#include "../../accel/generated/backend.h"

#include <hipblaslt/hipblaslt.h>

#if !defined(EPILOGUE_VARIANT) || EPILOGUE_VARIANT < 1 || EPILOGUE_VARIANT > 2
#error "EPILOGUE_VARIANT must be 1 (bias epilogue forward) or 2 (bias-gradient epilogue backward)"
#endif

namespace {

// cuBLASLt's and hipBLASLt's epilogues want a workspace; llm.c gives cuBLASLt 32 MiB on Hopper
constexpr size_t LT_WORKSPACE_BYTES = size_t(32) << 20;

// The process's hipBLASLt handle and workspace, made on first use (a GPU context is one device).
struct Lt {
    hipblasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::string error;
};

Lt& lt() {
    static Lt state = [] {
        Lt s;
        if (hipblasLtCreate(&s.handle) != HIPBLAS_STATUS_SUCCESS)
            s.error = "hipblasLtCreate failed";
        else if (hipMalloc(&s.workspace, LT_WORKSPACE_BYTES) != hipSuccess)
            s.error = "no device memory for hipBLASLt's workspace";
        return s;
    }();
    return state;
}

// D (m x n, column-major, ld m) = op(A) op(B) + beta D, then `epilogue` with `bias` (and `aux`, the
// pre-activation, for GELU_AUX_BIAS); A, B floatX, D of TD; float32 compute. A is (transa ? k x m :
// m x k) in memory, B (transb ? n x k : k x n).
template <class TD>
void lt_matmul(Context* c, const char* where, bool transa, bool transb, int m, int n, int k, const floatX* A,
               const floatX* B, float beta, TD* D, hipblasLtEpilogue_t epilogue, void* bias, hipDataType bias_type,
               floatX* aux) {
    Lt& state = lt();
    if (!state.error.empty()) {
        if (c->error.empty()) c->error = std::string(where) + ": " + state.error;
        return;
    }
    hipblasLtMatmulDesc_t desc = nullptr;
    hipblasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    hipblasLtMatmulPreference_t pref = nullptr;
    const int32_t op_a = transa ? HIPBLAS_OP_T : HIPBLAS_OP_N, op_b = transb ? HIPBLAS_OP_T : HIPBLAS_OP_N;
    const uint32_t epilogue_value = epilogue;
    const int32_t bias_type_value = bias_type;
    const int64_t aux_ld = m;
    const uint64_t workspace_bytes = LT_WORKSPACE_BYTES;
    hipblasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    hipblasStatus_t s = hipblasLtMatmulDescCreate(&desc, HIPBLAS_COMPUTE_32F, HIP_R_32F);
    auto step = [&](hipblasStatus_t next) {
        if (s == HIPBLAS_STATUS_SUCCESS) s = next;
    };
    step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_EPILOGUE, &epilogue_value,
                                         sizeof epilogue_value));
    if (bias) {
        step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type_value,
                                             sizeof bias_type_value));
    }
    if (aux) {
        step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        step(hipblasLtMatmulDescSetAttribute(desc, HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    step(hipblasLtMatrixLayoutCreate(&a, blas_type<floatX>(), transa ? k : m, transa ? m : k, transa ? k : m));
    step(hipblasLtMatrixLayoutCreate(&b, blas_type<floatX>(), transb ? n : k, transb ? k : n, transb ? n : k));
    step(hipblasLtMatrixLayoutCreate(&d, blas_type<TD>(), m, n, m));
    step(hipblasLtMatmulPreferenceCreate(&pref));
    step(hipblasLtMatmulPreferenceSetAttribute(pref, HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof workspace_bytes));
    step(hipblasLtMatmulAlgoGetHeuristic(state.handle, desc, a, b, d, d, pref, 1, &heuristic, &found));
    const float alpha = 1.0f;
    if (s == HIPBLAS_STATUS_SUCCESS && found == 0) {
        if (c->error.empty()) c->error = std::string(where) + ": the BLAS has no algorithm for this epilogue";
    } else {
        step(hipblasLtMatmul(state.handle, desc, &alpha, A, a, B, b, &beta, D, d, D, d, &heuristic.algo,
                             state.workspace, LT_WORKSPACE_BYTES, 0));
    }
    if (pref) hipblasLtMatmulPreferenceDestroy(pref);
    if (d) hipblasLtMatrixLayoutDestroy(d);
    if (b) hipblasLtMatrixLayoutDestroy(b);
    if (a) hipblasLtMatrixLayoutDestroy(a);
    if (desc) hipblasLtMatmulDescDestroy(desc);
    check_blas(c, s, where);
}

#if EPILOGUE_VARIANT == 2
// dbias (OC,) += gradient (OC,): the bias-gradient epilogue writes, our table's backward adds
__global__ void add_bias_gradient_kernel(float* dbias, const float* gradient, int OC) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < OC; i += gridDim.x * blockDim.x) dbias[i] += gradient[i];
}
#endif

}  // namespace

ACCEL_HIP_API void accel_hip_matmul_forward(void* ctx, floatX* out, const floatX* inp, const floatX* weight,
                                            const floatX* bias, int B, int T, int C, int OC) {
#if EPILOGUE_VARIANT == 1
    // out^T (OC, BT) = weight (C, OC)^T inp^T (C, BT) + bias on every column, in the GEMM's epilogue
#ifdef EPILOGUE_PLANT_MISSING_BIAS
    const hipblasLtEpilogue_t epilogue = HIPBLASLT_EPILOGUE_DEFAULT;
#else
    const hipblasLtEpilogue_t epilogue = bias ? HIPBLASLT_EPILOGUE_BIAS : HIPBLASLT_EPILOGUE_DEFAULT;
#endif
    lt_matmul(context(ctx), "matmul_forward", true, false, OC, B * T, C, weight, inp, 0.0f, out, epilogue,
              const_cast<floatX*>(bias), blas_type<floatX>(), nullptr);
#else
    accel_hip_plain_matmul_forward(ctx, out, inp, weight, bias, B, T, C, OC);
#endif
}

ACCEL_HIP_API void accel_hip_matmul_backward(void* ctx, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                             const floatX* inp, const floatX* weight, int B, int T, int C, int OC) {
#if EPILOGUE_VARIANT == 2
    Context* c = context(ctx);
    if (!dbias || !dweight) {   // no epilogue without both (a frozen weight: no dweight GEMM)
        accel_hip_plain_matmul_backward(ctx, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
        return;
    }
    const int BT = B * T;
    if (dinp)
        gemm(c, "matmul_backward", HIPBLAS_OP_N, HIPBLAS_OP_N, C, BT, OC, 1.0f, weight, C, 0, dout, OC, 0, 1.0f, dinp,
             C, 0);
    // dweight (C, OC) += inp^T (C, BT) dout (BT, OC)^T, the sums of dout over BT (B's columns of
    // op(B), one per column of dweight) into scratch, then added into dbias
    float* gradient = reinterpret_cast<float*>(scratch(c, size_t(OC) * sizeof(float), "matmul_backward"));
    if (!gradient) return;
#ifdef EPILOGUE_PLANT_BGRADA
    const hipblasLtEpilogue_t epilogue = HIPBLASLT_EPILOGUE_BGRADA;
#else
    const hipblasLtEpilogue_t epilogue = HIPBLASLT_EPILOGUE_BGRADB;
#endif
    lt_matmul(c, "matmul_backward", false, true, C, OC, BT, inp, dout, 1.0f, dweight, epilogue, gradient, HIP_R_32F,
              nullptr);
    hipLaunchKernelGGL(add_bias_gradient_kernel, dim3((OC + BLOCK - 1) / BLOCK), dim3(BLOCK), 0, 0, dbias, gradient,
                       OC);
    check_launch(c, "matmul_backward");
#else
    accel_hip_plain_matmul_backward(ctx, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
#endif
}

// pre (B,T,OC) = inp (B,T,C) weight^T (+ bias); out (B,T,OC) = gelu(pre): one GEMM, GELU_AUX[_BIAS]
ACCEL_HIP_API void accel_hip_dev_matmul_gelu_forward(void* ctx, floatX* out, floatX* pre, const floatX* inp,
                                                     const floatX* weight, const floatX* bias, int B, int T, int C,
                                                     int OC) {
#ifdef EPILOGUE_PLANT_NO_AUX
    const hipblasLtEpilogue_t epilogue = bias ? HIPBLASLT_EPILOGUE_GELU_BIAS : HIPBLASLT_EPILOGUE_GELU;
    floatX* aux = nullptr;
#else
    const hipblasLtEpilogue_t epilogue = bias ? HIPBLASLT_EPILOGUE_GELU_AUX_BIAS : HIPBLASLT_EPILOGUE_GELU_AUX;
    floatX* aux = pre;
#endif
    lt_matmul(context(ctx), "matmul_gelu_forward", true, false, OC, B * T, C, weight, inp, 0.0f, out, epilogue,
              const_cast<floatX*>(bias), blas_type<floatX>(), aux);
}
