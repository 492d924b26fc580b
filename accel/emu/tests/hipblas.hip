// accel/emu/tests/hipblas.hip — the emulated hipBLAS (accel/emu/blas) against a plain double
// loop: every op(A) op(B) combination, alpha and beta, strided batches, beta = 0 ignoring the
// NaNs in C, and bad arguments refused with HIPBLAS_STATUS_INVALID_VALUE as hipBLAS does; the
// mixed-precision hipblasGemmEx (bf16 A and B, float32 compute, C float32 or bf16 rounded once
// to nearest even) against the same loop on the bf16 values, and its unsupported types refused.
// Prints one line per check; exits 1 when one fails.
#include <hip/hip_bf16.h>
#include <hip/hip_runtime.h>
#include <hipblas/hipblas.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

bool all_ok = true;

void report(const char* what, bool ok) {
    std::printf("%-48s %s\n", what, ok ? "ok" : "WRONG");
    all_ok &= ok;
}

// element (i, j) of op(X), X column-major with leading dimension ld
float op_at(const std::vector<float>& X, int ld, bool trans, int i, int j) {
    return trans ? X[j + size_t(i) * ld] : X[i + size_t(j) * ld];
}

// C (m x n, leading dimension ldc) = alpha op(A) op(B) + beta C, in double
void reference(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& A, int lda,
               const std::vector<float>& B, int ldb, float beta, std::vector<float>& C, int ldc) {
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double sum = 0.0;
            for (int l = 0; l < k; ++l) sum += double(op_at(A, lda, ta, i, l)) * op_at(B, ldb, tb, l, j);
            float& c = C[i + size_t(j) * ldc];
            c = float(alpha * sum + (beta == 0.0f ? 0.0 : double(beta) * c));
        }
}

std::vector<float> random_matrix(size_t n, unsigned seed) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float((seed * 2654435761u + i * 40503u) % 2001) / 1000.0f - 1.0f;
    return x;
}

bool close(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i)
        if (!(std::fabs(a[i] - b[i]) <= 1e-5f * (1.0f + std::fabs(b[i])))) return false;
    return true;
}

std::vector<__hip_bfloat16> to_bf16(const std::vector<float>& x) {
    std::vector<__hip_bfloat16> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(x[i]);
    return out;
}

std::vector<float> to_float(const std::vector<__hip_bfloat16>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
    return out;
}

// hipblasGemmEx with bf16 A and B (m x k and k x n, op N; C m x n): C float32 within float32's
// error of the double loop on the widened values; C bf16 (beta = 1 onto its bf16 values) that
// loop's result rounded to nearest even: within one bf16 step, and bit for bit nearly always
// (they differ only where float32 sums land on opposite sides of a rounding midpoint)
void check_gemm_ex(hipblasHandle_t handle) {
    const int m = 70, n = 9, k = 131;
    const float alpha = 0.5f, one = 1.0f, zero = 0.0f;
    const std::vector<__hip_bfloat16> A = to_bf16(random_matrix(size_t(m) * k, 6));
    const std::vector<__hip_bfloat16> B = to_bf16(random_matrix(size_t(k) * n, 7));
    const std::vector<float> Af = to_float(A), Bf = to_float(B);
    std::vector<float> C(size_t(m) * n, NAN), expected(size_t(m) * n);
    reference(false, false, m, n, k, alpha, Af, m, Bf, k, zero, expected, m);
    hipblasStatus_t status = hipblasGemmEx(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &alpha, A.data(), HIP_R_16BF, m,
                                           B.data(), HIP_R_16BF, k, &zero, C.data(), HIP_R_32F, m, HIPBLAS_COMPUTE_32F,
                                           HIPBLAS_GEMM_DEFAULT);
    report("GemmEx bf16 x bf16 -> float32", status == HIPBLAS_STATUS_SUCCESS && close(C, expected));

    std::vector<__hip_bfloat16> Cx = to_bf16(random_matrix(size_t(m) * n, 8));
    std::vector<float> exact = to_float(Cx);
    reference(false, false, m, n, k, alpha, Af, m, Bf, k, one, exact, m);
    status = hipblasGemmEx(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &alpha, A.data(), HIP_R_16BF, m, B.data(),
                           HIP_R_16BF, k, &one, Cx.data(), HIP_R_16BF, m, HIPBLAS_COMPUTE_32F, HIPBLAS_GEMM_DEFAULT);
    size_t same = 0;
    bool within = true;
    for (size_t i = 0; i < exact.size(); ++i) {
        const __hip_bfloat16 rounded = __float2bfloat16(exact[i]);
        same += __bfloat16_as_ushort(rounded) == __bfloat16_as_ushort(Cx[i]);
        within &= std::fabs(__bfloat162float(Cx[i]) - exact[i]) <= std::ldexp(std::fabs(exact[i]), -8) + 1e-6f;
    }
    report("GemmEx bf16 C: rounded once to nearest even",
           status == HIPBLAS_STATUS_SUCCESS && within && same * 100 >= exact.size() * 99);

    report("GemmEx float32 A with a bf16 C not supported",
           hipblasGemmEx(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &alpha, Af.data(), HIP_R_32F, m, Bf.data(),
                         HIP_R_32F, k, &zero, Cx.data(), HIP_R_16BF, m, HIPBLAS_COMPUTE_32F,
                         HIPBLAS_GEMM_DEFAULT) == HIPBLAS_STATUS_NOT_SUPPORTED);
    report("GemmEx with TF32 compute not supported",
           hipblasGemmEx(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &alpha, Af.data(), HIP_R_32F, m, Bf.data(),
                         HIP_R_32F, k, &zero, C.data(), HIP_R_32F, m, HIPBLAS_COMPUTE_32F_FAST_TF32,
                         HIPBLAS_GEMM_DEFAULT) == HIPBLAS_STATUS_NOT_SUPPORTED);
}

}  // namespace

int main() {
    hipblasHandle_t handle;
    if (hipblasCreate(&handle) != HIPBLAS_STATUS_SUCCESS) return 1;
    // odd sizes, leading dimensions larger than the rows, more rows than a row block (64)
    const int m = 70, n = 9, k = 131, batches = 3;
    const hipblasOperation_t ops[] = {HIPBLAS_OP_N, HIPBLAS_OP_T};
    for (hipblasOperation_t ta : ops)
        for (hipblasOperation_t tb : ops) {
            const bool trans_a = ta == HIPBLAS_OP_T, trans_b = tb == HIPBLAS_OP_T;
            const int lda = (trans_a ? k : m) + 3, ldb = (trans_b ? n : k) + 2, ldc = m + 1;
            const int a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
            const long stride_a = long(lda) * a_cols, stride_b = long(ldb) * b_cols, stride_c = long(ldc) * n;
            std::vector<float> A = random_matrix(stride_a * batches, 1), B = random_matrix(stride_b * batches, 2);
            std::vector<float> C = random_matrix(stride_c * batches, 3), expected = C;
            const float alpha = 0.5f, beta = -2.0f;
            for (int b = 0; b < batches; ++b) {
                std::vector<float> Ab(A.begin() + b * stride_a, A.begin() + (b + 1) * stride_a);
                std::vector<float> Bb(B.begin() + b * stride_b, B.begin() + (b + 1) * stride_b);
                std::vector<float> Cb(expected.begin() + b * stride_c, expected.begin() + (b + 1) * stride_c);
                reference(trans_a, trans_b, m, n, k, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
                std::copy(Cb.begin(), Cb.end(), expected.begin() + b * stride_c);
            }
            const hipblasStatus_t status =
                hipblasSgemmStridedBatched(handle, ta, tb, m, n, k, &alpha, A.data(), lda, stride_a, B.data(), ldb,
                                           stride_b, &beta, C.data(), ldc, stride_c, batches);
            char what[64];
            std::snprintf(what, sizeof what, "strided batched, op(A)=%c op(B)=%c", trans_a ? 'T' : 'N',
                          trans_b ? 'T' : 'N');
            report(what, status == HIPBLAS_STATUS_SUCCESS && close(C, expected));
        }

    // beta = 0: C is written, never read (NaNs in it stay out of the result)
    std::vector<float> A = random_matrix(size_t(m) * k, 4), B = random_matrix(size_t(k) * n, 5);
    std::vector<float> C(size_t(m) * n, NAN), expected(size_t(m) * n);
    const float one = 1.0f, zero = 0.0f;
    reference(false, false, m, n, k, one, A, m, B, k, zero, expected, m);
    hipblasStatus_t status =
        hipblasSgemm(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &one, A.data(), m, B.data(), k, &zero, C.data(), m);
    report("beta = 0 ignores NaNs in C", status == HIPBLAS_STATUS_SUCCESS && close(C, expected));

    // bad arguments: refused, C untouched
    std::fill(C.begin(), C.end(), 7.0f);
    status = hipblasSgemm(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &one, A.data(), m - 1, B.data(), k, &zero,
                          C.data(), m);
    report("lda < m refused", status == HIPBLAS_STATUS_INVALID_VALUE && C[0] == 7.0f);
    status = hipblasSgemm(handle, HIPBLAS_OP_T, HIPBLAS_OP_N, m, n, k, &one, A.data(), k - 1, B.data(), k, &zero,
                          C.data(), m);
    report("transposed A with lda < k refused", status == HIPBLAS_STATUS_INVALID_VALUE);
    status = hipblasSgemm(handle, HIPBLAS_OP_N, HIPBLAS_OP_N, -1, n, k, &one, A.data(), m, B.data(), k, &zero,
                          C.data(), m);
    report("negative m refused", status == HIPBLAS_STATUS_INVALID_VALUE);
    report("a handle never created refused", hipblasSgemm(nullptr, HIPBLAS_OP_N, HIPBLAS_OP_N, m, n, k, &one,
                                                          A.data(), m, B.data(), k, &zero, C.data(), m) ==
                                                 HIPBLAS_STATUS_NOT_INITIALIZED);
    check_gemm_ex(handle);
    hipblasDestroy(handle);
    return all_ok ? 0 : 1;
}
