/*
accel/hip/gpt2.hip — the GPT-2 training step in HIP: every entry of the backend table
(accel/backend.pxd) behind a C ABI that accel/hip/device.pyx loads at run time, each export
compiled against its declaration from accel/spec.py (accel/generated/backend.h).

One source, three builds (accel/hip/Makefile), each at two precisions:
    hipcc   AMD GPUs, hipBLAS
    nvcc    NVIDIA GPUs, cuBLAS, through accel/hip/cuda/ (HIP names mapped onto CUDA's)
    g++     the CPU emulator (accel/emu): every kernel run thread by thread, checked in CI

Precision, llm.c's way: floatX is float, or with -DACCEL_HIP_BF16 bf16 (__hip_bfloat16), in a
library of its own with the same symbols (libgpt2_hip[_emu]_bf16.so). The table's arguments
declared floatX in accel/spec.py are floatX here; those declared float (statistics, losses,
probabilities, parameter gradients, AdamW's state) are float at both. A bf16 entry reads bf16,
computes in float32, and rounds each output once, to nearest even: a gradient it adds into is
read, the contribution added in float32, and the sum rounded; intermediates an entry keeps
between its own steps (attention's scores, its gradients) stay float32 in scratch memory. So a
bf16 entry computes what the CPU's bf16 table does (accel/cpu.pyx: the fp32 kernel on widened
copies, each output rounded once), up to float32's reordering. GEMMs on bf16 operands go through
hipblasGemmEx (float32 compute; C bf16, rounded once in the GEMM's float32 epilogue, or float32
for the parameter gradients); matmul's bias is added in that epilogue (out is set to the bias
first, then beta = 1), dbias is summed in float32. The elementwise kernels load and store two bf16
at once where their pointers allow. narrow_params rounds the float32 master weights into the bf16
parameters with kernels/bf16.pxd's arithmetic and hash, bit for bit.

Semantics are those of the CPU kernels (kernels/NAME.pxd): outputs first, backward entries ADD
into their gradients. Parameters, gradients, AdamW state and activations live in device memory
from alloc; per step only tokens go in (copy_to_backend) and the loss comes out (mean).

Kernels are written for any warp size (warpSize: 32 on NVIDIA and RDNA, 64 on CDNA): blocks
are multiples of 64 threads (whole warps for either), warp-per-row kernels loop over rows, and
block reductions keep one partial per warp (at most 1024 / 32 = 32). GEMMs go to the vendor
BLAS (column-major: a row-major (R, C) matrix is a column-major (C, R) one).

Dimension letters: B batch, T time, C channels, OC output channels, NH heads, hs = C / NH head
size, V vocabulary, Vp padded vocabulary (row stride of logits, probs and wte), N or n elements.

Planted faults, for tests/test_hip.py and test_hip_bf16.py only (a -D in a test build; never in
a real one):
    ACCEL_HIP_PLANT_MISSING_BARRIER   matmul_backward's bias reduction without its barrier
    ACCEL_HIP_PLANT_WARP32            layernorm_forward's warp sums assume 32 lanes
    ACCEL_HIP_PLANT_OUT_OF_BOUNDS     residual_forward writes one element past its output
    ACCEL_HIP_PLANT_BF16_TRUNCATE     (bf16) gelu_forward's stores truncate instead of rounding
*/
#include <hip/hip_runtime.h>
#define HIPBLAS_V2  // hipblasGemmEx with hipDataType and hipblasComputeType_t (ROCm 6; ROCm 7's default)
#include <hipblas/hipblas.h>
#ifdef ACCEL_HIP_BF16
#include <hip/hip_bf16.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#define ACCEL_HIP_API extern "C" __attribute__((visibility("default")))

// threads per block of the elementwise and warp-per-row kernels
constexpr int BLOCK = 256;
// threads per block of the kernels that reduce a whole vocabulary row
constexpr int ROW_BLOCK = 512;
// the most warps a block can hold (1024 threads, warps of at least 32)
constexpr int MAX_WARPS = 32;

// ----------------------------------------------------------------------------
// precision: floatX, and where values are widened to float32 and rounded back

#ifdef ACCEL_HIP_BF16
typedef __hip_bfloat16 floatX;
constexpr const char* PRECISION = "bf16";
#else
typedef float floatX;
constexpr const char* PRECISION = "fp32";
#endif
#if defined(ACCEL_HIP_PLANT_BF16_TRUNCATE) && !defined(ACCEL_HIP_BF16)
#error "ACCEL_HIP_PLANT_BF16_TRUNCATE plants a fault in the bf16 build (-DACCEL_HIP_BF16)"
#endif

// Every export declared from accel/spec.py (accel/generated/backend.h): a definition below (or in
// the .hip files included) whose signature differs from the spec's fails to compile.
#define ACCEL_API ACCEL_HIP_API
#define ACCEL_ENTRY(name) accel_hip_##name
#include "../generated/backend.h"
constexpr bool BF16 = sizeof(floatX) == 2;

__device__ __forceinline__ float to_float(float x) { return x; }
#ifdef ACCEL_HIP_BF16
__device__ __forceinline__ float to_float(__hip_bfloat16 x) { return __bfloat162float(x); }
#endif

// x in T (float, or floatX): at bf16 rounded to nearest even
template <class T>
__device__ __forceinline__ T to_type(float x) {
#ifdef ACCEL_HIP_BF16
    if constexpr (!std::is_same<T, float>::value)
        return __float2bfloat16(x);
    else
#endif
        return x;
}

__device__ __forceinline__ floatX to_floatX(float x) { return to_type<floatX>(x); }

// Elements handled together by the elementwise kernels: two bf16 (one 4-byte load or store) where
// the host has checked that every pointer of the call is 4-byte aligned, else one.
constexpr int PACK = BF16 ? 2 : 1;

// W neighbouring elements of floatX as float32: pack i is elements W i .. W i + W - 1
template <int W>
struct Elements {
    float v[W];

    __device__ __forceinline__ void load(const floatX* p, long i) {
#ifdef ACCEL_HIP_BF16
        if constexpr (W == 2) {
            const __hip_bfloat162 pair = reinterpret_cast<const __hip_bfloat162*>(p)[i];
            v[0] = __low2float(pair);
            v[1] = __high2float(pair);
        } else
#endif
            for (int j = 0; j < W; ++j) v[j] = to_float(p[i * W + j]);
    }

    __device__ __forceinline__ void store(floatX* p, long i) const {
#ifdef ACCEL_HIP_BF16
        if constexpr (W == 2)
            reinterpret_cast<__hip_bfloat162*>(p)[i] = __floats2bfloat162_rn(v[0], v[1]);
        else
#endif
            for (int j = 0; j < W; ++j) p[i * W + j] = to_floatX(v[j]);
    }

#ifdef ACCEL_HIP_PLANT_BF16_TRUNCATE
    // the planted fault: the low 16 bits dropped (rounding toward zero) instead of rounded
    __device__ void store_truncated(floatX* p, long i) const {
        for (int j = 0; j < W; ++j) p[i * W + j] = __ushort_as_bfloat16((unsigned short)(__float_as_uint(v[j]) >> 16));
    }
#endif
};

// Whether pointers can be read and written PACK elements at a time.
template <class... P>
bool packable(const P*... pointers) {
    return ((reinterpret_cast<uintptr_t>(pointers) % (PACK * sizeof(floatX)) == 0) && ...);
}

// ----------------------------------------------------------------------------
// reductions

struct Sum {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// op over the warp's values, in every lane
template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
    for (int offset = warpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor(v, offset));
    return v;
}

// op over the block's values, in every thread. blockDim.x is a multiple of warpSize; scratch is
// __shared__ T[MAX_WARPS], free for reuse when this returns.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity, T* scratch) {
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
    const int warps = blockDim.x / warpSize;
    v = warp_reduce(v, op);
    __syncthreads();  // an earlier call's reads of scratch are done
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_reduce(lane < warps ? scratch[lane] : identity, op);
}

// ----------------------------------------------------------------------------
// encoder: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]

__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B,
                                       int T, int C) {
    // out (B,T,C); inp (B,T); wte (Vp,C); wpe (maxT,C)
    const long N = long(B) * T * C;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const long bt = i / C;
        const int c = int(i % C), t = int(bt % T);
        out[i] = to_floatX(to_float(wte[long(inp[bt]) * C + c]) + to_float(wpe[long(t) * C + c]));
    }
}

// dwte (Vp,C) += dout at each position's token row: positions may share a token, so atomically
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* inp, long N, int C) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        atomicAdd(&dwte[long(inp[i / C]) * C + i % C], to_float(dout[i]));
}

// dwpe (maxT,C) += the sum over the batch of dout (B,T,C): one thread per (t, c), no atomics
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    const long TC = long(T) * C;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < TC; i += long(gridDim.x) * blockDim.x) {
        float sum = 0.0f;
        for (int b = 0; b < B; ++b) sum += to_float(dout[b * TC + i]);
        dwpe[i] += sum;
    }
}

// ----------------------------------------------------------------------------
// layernorm: one warp per row of C channels, eps 1e-5

// The warp sums of layernorm_forward. ACCEL_HIP_PLANT_WARP32 (a planted fault) assumes 32 lanes:
// right on NVIDIA and RDNA, half the row at warp size 64.
__device__ float layernorm_warp_sum(float v) {
#ifdef ACCEL_HIP_PLANT_WARP32
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor(v, offset);
    return v;
#else
    return warp_reduce(v, Sum());
#endif
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, long N, int C) {
    // out, inp (N,C); mean, rstd (N,); weight, bias (C,)
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const floatX* x = inp + row * C;
        float sum = 0.0f;
        for (int i = lane; i < C; i += warpSize) sum += to_float(x[i]);
        const float m = layernorm_warp_sum(sum) / C;
        // the variance from the shifted values (two passes), as the CPU kernel
        float var = 0.0f;
        for (int i = lane; i < C; i += warpSize) {
            const float d = to_float(x[i]) - m;
            var += d * d;
        }
        const float s = 1.0f / sqrtf(layernorm_warp_sum(var) / C + 1e-5f);
        floatX* o = out + row * C;
        for (int i = lane; i < C; i += warpSize)
            o[i] = to_floatX((s * (to_float(x[i]) - m)) * to_float(weight[i]) + to_float(bias[i]));
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    }
}

// dinp (N,C), dweight, dbias (C,) += ...: each warp takes rows, the block sums its rows' dweight
// and dbias in shared memory (2C floats, dynamic) and adds them to the outputs once
__global__ void layernorm_backward_kernel(floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                          const floatX* inp, const floatX* weight, const float* mean,
                                          const float* rstd, long N, int C) {
    HIP_DYNAMIC_SHARED(float, block_sums)
    float* dbias_block = block_sums;
    float* dweight_block = block_sums + C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) block_sums[i] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const floatX* dout_r = dout + row * C;
        const floatX* x = inp + row * C;
        const float m = mean[row], s = rstd[row];
        // the two reductions over the channels that every dinp[i] depends on
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = lane; i < C; i += warpSize) {
            const float dnorm = to_float(weight[i]) * to_float(dout_r[i]);
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * ((to_float(x[i]) - m) * s);
        }
        dnorm_mean = warp_reduce(dnorm_mean, Sum()) / C;
        dnorm_norm_mean = warp_reduce(dnorm_norm_mean, Sum()) / C;
        floatX* dinp_r = dinp + row * C;
        for (int i = lane; i < C; i += warpSize) {
            const float norm = (to_float(x[i]) - m) * s;
            const float d = to_float(dout_r[i]);
            const float dnorm = to_float(weight[i]) * d;
            dinp_r[i] = to_floatX(to_float(dinp_r[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
            atomicAdd(&dbias_block[i], d);
            atomicAdd(&dweight_block[i], norm * d);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(&dbias[i], dbias_block[i]);
        atomicAdd(&dweight[i], dweight_block[i]);
    }
}

// ----------------------------------------------------------------------------
// matmul: out = inp weight^T + bias, the product on the vendor BLAS

// out (N/OC, OC) = bias (OC,) on every row: the GEMM then adds the product (beta 1), so the bias
// is added in the GEMM's float32 epilogue and a bf16 out is rounded once
__global__ void broadcast_bias_kernel(floatX* out, const floatX* bias, long N, int OC) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        out[i] = bias[i % OC];
}

// dbias (OC,) += column sums of dout (rows, OC). A block takes 32 columns of a chunk of rows:
// 8 parts of 32 threads each sum every 8th row of the chunk (neighbouring threads read
// neighbouring columns), the parts meet in shared memory, and the chunk's sums go to dbias
constexpr int BIAS_COLUMNS = 32, BIAS_PARTS = BLOCK / BIAS_COLUMNS;

__global__ void matmul_backward_bias_kernel(float* dbias, const floatX* dout, long rows, int OC,
                                            long rows_per_chunk) {
    __shared__ float part_sums[BIAS_PARTS][BIAS_COLUMNS];
    const int column = threadIdx.x % BIAS_COLUMNS, part = threadIdx.x / BIAS_COLUMNS;
    const int oc = blockIdx.x * BIAS_COLUMNS + column;
    const long first = blockIdx.y * rows_per_chunk;
    const long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum = 0.0f;
    if (oc < OC)
        for (long r = first + part; r < last; r += BIAS_PARTS) sum += to_float(dout[r * OC + oc]);
    part_sums[part][column] = sum;
#ifndef ACCEL_HIP_PLANT_MISSING_BARRIER
    __syncthreads();
#endif
    if (part == 0 && oc < OC) {
        for (int p = 1; p < BIAS_PARTS; ++p) sum += part_sums[p][column];
        atomicAdd(&dbias[oc], sum);
    }
}

// ----------------------------------------------------------------------------
// attention, as llm.c's CUDA path: q, k, v permuted to (B,NH,T,hs), the scores and the
// weighted values as batched GEMMs over the B*NH heads, a causal softmax per row, and the
// heads put back side by side. preatt (B,NH,T,T) = q k^T / sqrt(hs) and att = its softmax,
// both zero above the diagonal, as the CPU kernel leaves them. At bf16 the scores and their
// gradients stay float32 in scratch between the steps (the CPU's bf16 entry rounds only what it
// writes), and the products of a float32 intermediate with q, k or v run in float32 (Sgemm).

// q, k, v (B,NH,T,hs) from inp (B,T,3C) = q, k, v with head h in channels h*hs .. (h+1)*hs; each
// of the permuted tensors float or floatX, as the GEMMs after need it (exact: no narrowing)
template <class Q, class K, class V>
__global__ void permute_kernel(Q* q, K* k, V* v, const floatX* inp, int B, int T, int NH, int hs) {
    const int C = NH * hs;
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), t = int(i / hs % T), h = int(i / (long(hs) * T) % NH);
        const long b = i / (long(hs) * T * NH);
        const long src = (b * T + t) * 3 * C + h * hs + d;
        q[i] = to_type<Q>(to_float(inp[src]));
        k[i] = to_type<K>(to_float(inp[src + C]));
        v[i] = to_type<V>(to_float(inp[src + 2 * C]));
    }
}

// dinp (B,T,3C) += dq, dk, dv (B,NH,T,hs): the transpose of permute_kernel
__global__ void permute_backward_kernel(floatX* dinp, const float* dq, const float* dk, const float* dv, int B,
                                        int T, int NH, int hs) {
    const int C = NH * hs;
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), t = int(i / hs % T), h = int(i / (long(hs) * T) % NH);
        const long b = i / (long(hs) * T * NH);
        const long dst = (b * T + t) * 3 * C + h * hs + d;
        dinp[dst] = to_floatX(to_float(dinp[dst]) + dq[i]);
        dinp[dst + C] = to_floatX(to_float(dinp[dst + C]) + dk[i]);
        dinp[dst + 2 * C] = to_floatX(to_float(dinp[dst + 2 * C]) + dv[i]);
    }
}

// out (B,T,C) = y (B,NH,T,hs) with the heads side by side; BACKWARD: y = out's layout undone
template <bool BACKWARD, class D, class S>
__global__ void unpermute_kernel(D* dst, const S* src, int B, int T, int NH, int hs) {
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        // i indexes (B,T,NH,hs) = (B,T,C)
        const int d = int(i % hs), h = int(i / hs % NH), t = int(i / (long(hs) * NH) % T);
        const long b = i / (long(hs) * NH * T);
        const long head_major = ((b * NH + h) * T + t) * hs + d;
        if (BACKWARD)
            dst[head_major] = to_type<D>(to_float(src[i]));
        else
            dst[i] = to_type<D>(to_float(src[head_major]));
    }
}

// dst (n,) = src (n,) widened to float32 (exact)
__global__ void widen_kernel(float* dst, const floatX* src, long n) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        dst[i] = to_float(src[i]);
}

// One warp per row of the B*NH*T rows: scores holds preatt's row t in float32; preatt gets it,
// and att and scores its softmax over t2 <= t; all three are set to zero above the diagonal. At
// fp32 scores is att itself.
__global__ void causal_softmax_forward_kernel(float* scores, floatX* preatt, floatX* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        float* s = scores + row * T;
        floatX* pre = preatt + row * T;
        floatX* a = att + row * T;
        float maxval = -INFINITY;
        for (int t2 = lane; t2 <= t; t2 += warpSize) maxval = fmaxf(maxval, s[t2]);
        maxval = warp_reduce(maxval, Max());
        float sum = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) {
            const float p = s[t2];
            pre[t2] = to_floatX(p);
            const float e = expf(p - maxval);
            s[t2] = e;
            sum += e;
        }
        const float inv = 1.0f / warp_reduce(sum, Sum());
        for (int t2 = lane; t2 <= t; t2 += warpSize) {
            const float value = s[t2] * inv;
            s[t2] = value;
            a[t2] = to_floatX(value);
        }
        for (int t2 = t + 1 + lane; t2 < T; t2 += warpSize) {
            s[t2] = 0.0f;
            pre[t2] = a[t2] = to_floatX(0.0f);
        }
    }
}

// dpreatt[t2] += att[t2] (datt[t2] - sum_t3 att[t3] datt[t3]) over t2 <= t, one warp per row, from
// datt_f, datt's float32 values (the old ones plus this call's); dpre_f gets dpreatt's float32
// values, datt its rounded ones. Above the diagonal all four are set to zero: the GEMMs around this
// read whole rows. At fp32 dpre_f is dpreatt and datt_f is datt.
__global__ void causal_softmax_backward_kernel(floatX* dpreatt, float* dpre_f, floatX* datt, float* datt_f,
                                               const floatX* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        const floatX* a = att + row * T;
        float* da = datt_f + row * T;
        floatX* da_out = datt + row * T;
        float* dpf = dpre_f + row * T;
        floatX* dpre = dpreatt + row * T;
        float dot = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) dot += to_float(a[t2]) * da[t2];
        dot = warp_reduce(dot, Sum());
        for (int t2 = lane; t2 <= t; t2 += warpSize) {
            const float d = to_float(dpre[t2]) + to_float(a[t2]) * (da[t2] - dot);
            dpf[t2] = d;
            dpre[t2] = to_floatX(d);
            da_out[t2] = to_floatX(da[t2]);
        }
        for (int t2 = t + 1 + lane; t2 < T; t2 += warpSize) {
            dpf[t2] = da[t2] = 0.0f;
            dpre[t2] = da_out[t2] = to_floatX(0.0f);
        }
    }
}

// ----------------------------------------------------------------------------
// GELU (tanh approximation), residual: elementwise, W elements (a pack) at a time; N elements,
// a multiple of W (the host runs an odd last element as a launch of its own)

constexpr float GELU_SCALING_FACTOR = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_CUBIC = 0.044715f;

// 0.5 x (1 + tanh(u)) = x s with s = 1 / (1 + exp(-2u)), as the CPU kernel writes it
template <int W>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> x;
        x.load(inp, i);
        for (int j = 0; j < W; ++j) {
            const float u = GELU_SCALING_FACTOR * (x.v[j] + GELU_CUBIC * x.v[j] * x.v[j] * x.v[j]);
            x.v[j] = x.v[j] / (1.0f + expf(-2.0f * u));
        }
#ifdef ACCEL_HIP_PLANT_BF16_TRUNCATE
        x.store_truncated(out, i);
#else
        x.store(out, i);
#endif
    }
}

// dinp += gelu'(inp) dout, gelu'(x) = s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 0.044715 x^2)
template <int W>
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> x, d, g;
        x.load(inp, i);
        d.load(dout, i);
        g.load(dinp, i);
        for (int j = 0; j < W; ++j) {
            const float xj = x.v[j];
            const float u = GELU_SCALING_FACTOR * (xj + GELU_CUBIC * xj * xj * xj);
            const float s = 1.0f / (1.0f + expf(-2.0f * u));
            const float local_grad =
                s + xj * s * (1.0f - s) * (2.0f * GELU_SCALING_FACTOR) * (1.0f + 3.0f * GELU_CUBIC * xj * xj);
            g.v[j] += local_grad * d.v[j];
        }
        g.store(dinp, i);
    }
}

template <int W>
__global__ void residual_forward_kernel(floatX* out, const floatX* inp1, const floatX* inp2, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> a, b;
        a.load(inp1, i);
        b.load(inp2, i);
        for (int j = 0; j < W; ++j) a.v[j] += b.v[j];
        a.store(out, i);
    }
#ifdef ACCEL_HIP_PLANT_OUT_OF_BOUNDS
    if (blockIdx.x == 0 && threadIdx.x == 0) out[N] = to_floatX(0.0f);  // the planted fault: one past the end
#endif
}

template <int W>
__global__ void residual_backward_kernel(floatX* dinp1, floatX* dinp2, const floatX* dout, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> d, g1, g2;
        d.load(dout, i);
        g1.load(dinp1, i);
        g2.load(dinp2, i);
        for (int j = 0; j < W; ++j) {
            g1.v[j] += d.v[j];
            g2.v[j] += d.v[j];
        }
        g1.store(dinp1, i);
        g2.store(dinp2, i);
    }
}

// ----------------------------------------------------------------------------
// softmax over the vocabulary, cross-entropy: one block per position (row of Vp)

// probs (rows,Vp) = softmax of logits over the first V entries, zero in the padding
__global__ void softmax_forward_kernel(float* probs, const floatX* logits, int V, int Vp) {
    __shared__ float scratch[MAX_WARPS];
    const floatX* x = logits + long(blockIdx.x) * Vp;
    float* p = probs + long(blockIdx.x) * Vp;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, to_float(x[i]));
    maxval = block_reduce(maxval, Max(), -INFINITY, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(to_float(x[i]) - maxval);
    const float scale = 1.0f / block_reduce(sum, Sum(), 0.0f, scratch);
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(to_float(x[i]) - maxval) * scale;
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) p[i] = 0.0f;
}

// losses (N,) = -log probs[target] of each row of probs (N,Vp); 0 where the target is -1 (not
// scored)
__global__ void crossentropy_forward_kernel(float* losses, const float* probs, const int* targets, long N, int Vp) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        losses[i] = targets[i] < 0 ? 0.0f : -logf(probs[i * Vp + targets[i]]);
}

// dlogits (rows,Vp) += (probs - onehot(target)) dlosses over the first V entries; a row whose
// target is -1 (not scored) is left as it was
__global__ void crossentropy_softmax_backward_kernel(floatX* dlogits, const float* dlosses, const float* probs,
                                                     const int* targets, int V, int Vp) {
    const long row = blockIdx.x;
    const int target = targets[row];
    if (target < 0) return;   // the whole block: no barrier below
    const float dloss = dlosses[row];
    floatX* dl = dlogits + row * Vp;
    const float* p = probs + row * Vp;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float d = to_float(dl[i]) + p[i] * dloss;
        if (i == target) d -= dloss;
        dl[i] = to_floatX(d);
    }
}

// ----------------------------------------------------------------------------
// the loss, the gradient norm, the optimizer

__global__ void fill_kernel(float* out, float value, long n) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        out[i] = value;
}

// partials[block] = sum of x (SQUARES: of x^2) over this block's share, in double
template <bool SQUARES>
__global__ void sum_kernel(double* partials, const float* x, long n) {
    __shared__ double scratch[MAX_WARPS];
    double sum = 0.0;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        sum += SQUARES ? double(x[i]) * x[i] : double(x[i]);
    sum = block_reduce(sum, Sum(), 0.0, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// AdamW as kernels/adamw.pxd: grads scaled first, bias corrections 1 - beta^t from the host;
// parameter i's update, returning its new value
__device__ __forceinline__ float adamw_one(float* params, float* m, float* v, const float* grads, long i,
                                           float lr, float beta1, float beta2, float beta1_correction,
                                           float beta2_correction, float eps, float weight_decay,
                                           float grad_scale) {
    const float grad = grads[i] * grad_scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * grad;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    m[i] = m_i;
    v[i] = v_i;
    const float m_hat = m_i / beta1_correction, v_hat = v_i / beta2_correction;
    params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
    return params[i];
}

__global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, long n, float lr, float beta1,
                             float beta2, float beta1_correction, float beta2_correction, float eps,
                             float weight_decay, float grad_scale) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        adamw_one(params, m, v, grads, i, lr, beta1, beta2, beta1_correction, beta2_correction, eps,
                  weight_decay, grad_scale);
}

#ifdef ACCEL_HIP_BF16
// ----------------------------------------------------------------------------
// bf16: the parameters from the float32 master weights, as kernels/bf16.pxd rounds them

// 16 uniform bits from (index, seed), kernels/bf16.pxd's noise16: for each seed a bijection of
// the index's low 32 bits (a multiply by an odd constant, then murmur3's finaliser), 32-bit
// arithmetic throughout
__device__ __forceinline__ uint32_t noise16(uint64_t index, uint32_t seed) {
    uint32_t h = uint32_t(index) * 0x9E3779B1u;
    h += uint32_t(index >> 32) * 0x85EBCA77u + seed * 0xC2B2AE3Du;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h & 0xffffu;
}

// params (n,) bf16 = master (n,) rounded: to nearest even when seed < 0, else stochastically, up
// with probability the dropped fraction, element i's bits from (first + i, seed); a NaN stays a
// quiet NaN. The bit arithmetic of float_to_bf16 and float_to_bf16_stochastic (kernels/bf16.pxd).
__device__ __forceinline__ floatX rounded_param(float value, long index, int seed) {
    const uint32_t bits = __float_as_uint(value);
    uint32_t rounded;
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        rounded = (bits >> 16) | 0x40u;
    else if (seed < 0)
        rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    else
        rounded = (bits + noise16(uint64_t(index), uint32_t(seed))) >> 16;
    return __ushort_as_bfloat16((unsigned short)rounded);
}

__global__ void narrow_params_kernel(floatX* params, const float* master, long n, long first, int seed) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        params[i] = rounded_param(master[i], first + i, seed);
}

// AdamW on the master weights, each new one rounded into params as narrow_params does with seed t
__global__ void adamw_rounded_kernel(floatX* params, float* master, float* m, float* v, const float* grads, long n,
                                     float lr, float beta1, float beta2, float beta1_correction,
                                     float beta2_correction, float eps, float weight_decay, float grad_scale,
                                     int t, long first) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
        params[i] = rounded_param(adamw_one(master, m, v, grads, i, lr, beta1, beta2, beta1_correction,
                                            beta2_correction, eps, weight_decay, grad_scale),
                                  first + i, t);
}
#endif

// ----------------------------------------------------------------------------
// the context: one device, its BLAS handle, scratch memory, the first error

namespace {

struct Context {
    hipblasHandle_t blas = nullptr;
    int warp_size = 32;
    unsigned max_blocks = 1;    // grid of the grid-stride kernels: enough to fill the device
    double* partials = nullptr;  // (max_blocks,) sum_kernel's per-block sums
    std::vector<double> host_partials;
    char* scratch = nullptr;    // attention's permuted tensors (and at bf16 its float32 scores), grown on demand
    size_t scratch_bytes = 0;
    std::string error;          // the first failure, kept: a GPU context does not recover
    std::string name;
};

Context* context(void* ctx) { return static_cast<Context*>(ctx); }

bool ok(Context* c, hipError_t e, const char* where) {
    if (e == hipSuccess) return true;
    if (c->error.empty()) c->error = std::string(where) + ": " + hipGetErrorString(e);
    return false;
}

void check_launch(Context* c, const char* where) { ok(c, hipGetLastError(), where); }

void check_blas(Context* c, hipblasStatus_t status, const char* where) {
    if (status != HIPBLAS_STATUS_SUCCESS && c->error.empty())
        c->error = std::string(where) + ": a BLAS call failed with status " + std::to_string(int(status));
}

// blocks for a grid-stride loop over n elements
unsigned grid_for(const Context* c, long n) {
    return unsigned(std::max(1L, std::min(long(c->max_blocks), (n + BLOCK - 1) / BLOCK)));
}

// blocks for a warp-per-row loop over rows
unsigned grid_for_rows(const Context* c, long rows) {
    const long rows_per_block = BLOCK / c->warp_size;
    return unsigned(std::max(1L, std::min(long(c->max_blocks), (rows + rows_per_block - 1) / rows_per_block)));
}

// the scratch memory, at least `bytes` of it
char* scratch(Context* c, size_t bytes, const char* where) {
    if (c->scratch_bytes < bytes) {
        if (c->scratch) (void)hipFree(c->scratch);
        c->scratch = nullptr;
        c->scratch_bytes = 0;
        if (!ok(c, hipMalloc(&c->scratch, bytes), where)) return nullptr;
        c->scratch_bytes = bytes;
    }
    return c->scratch;
}

// Arrays carved one after another out of scratch memory, each 256-byte aligned: first on no
// memory at all (base 0) to learn the size, then on the scratch memory itself.
struct Carver {
    uintptr_t base;
    size_t used = 0;
    template <class T>
    T* take(long n) {
        T* p = reinterpret_cast<T*>(base + used);
        used += (size_t(n) * sizeof(T) + 255) / 256 * 256;
        return p;
    }
};

// sum of x (or of x^2) over n elements, in double, to the host
double sum_to_host(Context* c, const float* x, long n, bool squares, const char* where) {
    const unsigned grid = grid_for(c, n);
    if (squares)
        hipLaunchKernelGGL(HIP_KERNEL_NAME(sum_kernel<true>), dim3(grid), dim3(BLOCK), 0, 0, c->partials, x, n);
    else
        hipLaunchKernelGGL(HIP_KERNEL_NAME(sum_kernel<false>), dim3(grid), dim3(BLOCK), 0, 0, c->partials, x, n);
    check_launch(c, where);
    if (!ok(c, hipMemcpy(c->host_partials.data(), c->partials, grid * sizeof(double), hipMemcpyDeviceToHost), where))
        return NAN;
    double total = 0.0;
    for (unsigned b = 0; b < grid; ++b) total += c->host_partials[b];
    return total;
}

// The BLAS's type of an operand's elements.
template <class T>
constexpr hipDataType blas_type() {
#ifdef ACCEL_HIP_BF16
    if constexpr (!std::is_same<T, float>::value) return HIP_R_16BF;
#endif
    return HIP_R_32F;
}

// C (m x n) = alpha op(A) op(B) + beta C, column-major, batch GEMMs at strides (one: batch 1,
// strides 0), float32 compute. float operands: Sgemm; bf16 operands: GemmEx, C bf16 (rounded
// once in the GEMM's float32 epilogue) or float32.
template <class AB, class TC>
void gemm(Context* c, const char* where, hipblasOperation_t transa, hipblasOperation_t transb, int m, int n, int k,
          float alpha, const AB* A, int lda, long long stride_a, const AB* B, int ldb, long long stride_b, float beta,
          TC* C, int ldc, long long stride_c, int batch = 1) {
    hipblasStatus_t status;
    if constexpr (std::is_same<AB, float>::value && std::is_same<TC, float>::value) {
        if (batch == 1)
            status = hipblasSgemm(c->blas, transa, transb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc);
        else
            status = hipblasSgemmStridedBatched(c->blas, transa, transb, m, n, k, &alpha, A, lda, stride_a, B, ldb,
                                                stride_b, &beta, C, ldc, stride_c, batch);
    } else {
        static_assert(!std::is_same<AB, float>::value, "float32 operands with a bf16 C: not a GEMM hipBLAS has");
        if (batch == 1)
            status = hipblasGemmEx(c->blas, transa, transb, m, n, k, &alpha, A, blas_type<AB>(), lda, B,
                                   blas_type<AB>(), ldb, &beta, C, blas_type<TC>(), ldc, HIPBLAS_COMPUTE_32F,
                                   HIPBLAS_GEMM_DEFAULT);
        else
            status = hipblasGemmStridedBatchedEx(c->blas, transa, transb, m, n, k, &alpha, A, blas_type<AB>(), lda,
                                                 stride_a, B, blas_type<AB>(), ldb, stride_b, &beta, C,
                                                 blas_type<TC>(), ldc, stride_c, batch, HIPBLAS_COMPUTE_32F,
                                                 HIPBLAS_GEMM_DEFAULT);
    }
    check_blas(c, status, where);
}

// An elementwise kernel over N elements: PACK at a time where every pointer allows it, then an
// odd last element as a launch of its own (its pointers moved to it); else one at a time.
template <class Launch>
void elementwise(Context* c, long N, bool packed, Launch launch) {
    if (packed && PACK > 1) {
        const long whole = N / PACK * PACK;
        if (whole > 0) launch(std::integral_constant<int, PACK>(), 0L, whole, grid_for(c, whole / PACK));
        if (whole < N) launch(std::integral_constant<int, 1>(), whole, N - whole, 1u);
    } else if (N > 0) {
        launch(std::integral_constant<int, 1>(), 0L, N, grid_for(c, N));
    }
}

}  // namespace

#include "collectives.hip"  // the collectives group: NCCL / RCCL (llmc/distributed.py)

// ----------------------------------------------------------------------------
// the C ABI: the context, then one function per table entry, with the table's signatures as
// accel/generated/backend.h declares them (a floatX* here is the table's float*: the ABI passes
// pointers, whatever they point to)

// A context on the first device, or NULL with the reason in `error`. With many processes on a
// machine (llmc/distributed.py sets LLMPYX_LOCAL_RANK), each takes its own: that local rank's
// device, modulo the count.
ACCEL_HIP_API void* accel_hip_create(char* error, size_t error_size) {
    int devices = 0;
    const hipError_t e = hipGetDeviceCount(&devices);
    if (e != hipSuccess || devices == 0) {
        std::snprintf(error, error_size, "no GPU found (%s)", e != hipSuccess ? hipGetErrorString(e) : "no devices");
        (void)hipGetLastError();
        return nullptr;
    }
    const char* local_rank = std::getenv("LLMPYX_LOCAL_RANK");
    const int device = local_rank ? std::atoi(local_rank) % devices : 0;
    hipDeviceProp_t prop;
    if (hipSetDevice(device) != hipSuccess || hipGetDeviceProperties(&prop, device) != hipSuccess) {
        std::snprintf(error, error_size, "cannot read the GPU's properties (%s)", hipGetErrorString(hipGetLastError()));
        return nullptr;
    }
    Context* c = new Context;
    c->warp_size = prop.warpSize;
    c->max_blocks = unsigned(std::max(1, prop.multiProcessorCount)) * (2048 / BLOCK);
    c->host_partials.resize(c->max_blocks);
    c->name = prop.name;
    const hipblasStatus_t status = hipblasCreate(&c->blas);
    if (status != HIPBLAS_STATUS_SUCCESS || hipMalloc(&c->partials, c->max_blocks * sizeof(double)) != hipSuccess) {
        std::snprintf(error, error_size, "cannot set up %s: %s", c->name.c_str(),
                      status != HIPBLAS_STATUS_SUCCESS ? "the BLAS handle" : "out of device memory");
        if (c->blas) hipblasDestroy(c->blas);
        (void)hipGetLastError();
        delete c;
        return nullptr;
    }
    return c;
}

ACCEL_HIP_API void accel_hip_destroy(void* ctx) {
    Context* c = context(ctx);
    (void)hipDeviceSynchronize();
    release_communicator(c);
    (void)hipFree(c->scratch);
    (void)hipFree(c->partials);
    hipblasDestroy(c->blas);
    delete c;
}

ACCEL_HIP_API const char* accel_hip_device_name(void* ctx) { return context(ctx)->name.c_str(); }

// The precision of this build's floatX arguments: "fp32" or "bf16" (device.pyx checks that a
// library loaded for a precision is built for it).
ACCEL_HIP_API const char* accel_hip_precision() { return PRECISION; }

// --- core: memory ---------------------------------------------------------------------------

ACCEL_HIP_API void* accel_hip_alloc(void* ctx, size_t nbytes) {
    void* p = nullptr;
    if (hipMalloc(&p, nbytes) != hipSuccess) {
        (void)hipGetLastError();  // out of memory is the caller's to report (alloc returns NULL)
        return nullptr;
    }
    if (!ok(context(ctx), hipMemset(p, 0, nbytes), "alloc")) {
        (void)hipFree(p);
        return nullptr;
    }
    return p;
}

ACCEL_HIP_API void accel_hip_free(void* ctx, void* ptr, size_t) { ok(context(ctx), hipFree(ptr), "free"); }

ACCEL_HIP_API void accel_hip_zero(void* ctx, void* ptr, size_t nbytes) {
    ok(context(ctx), hipMemsetAsync(ptr, 0, nbytes, 0), "zero");
}

ACCEL_HIP_API void accel_hip_copy_to_backend(void* ctx, void* dst, const void* host_src, size_t nbytes) {
    ok(context(ctx), hipMemcpy(dst, host_src, nbytes, hipMemcpyHostToDevice), "copy_to_backend");
}

ACCEL_HIP_API void accel_hip_copy_to_host(void* ctx, void* host_dst, const void* src, size_t nbytes) {
    ok(context(ctx), hipMemcpy(host_dst, src, nbytes, hipMemcpyDeviceToHost), "copy_to_host");
}

ACCEL_HIP_API void accel_hip_synchronize(void* ctx) { ok(context(ctx), hipDeviceSynchronize(), "synchronize"); }

ACCEL_HIP_API const char* accel_hip_last_error(void* ctx) {
    Context* c = context(ctx);
    check_launch(c, "a kernel launch");
    return c->error.empty() ? nullptr : c->error.c_str();
}

ACCEL_HIP_API void accel_hip_mark(void*, int, int) {}

// --- core: loss bookkeeping and the optimizer ---------------------------------------------

ACCEL_HIP_API void accel_hip_fill(void* ctx, float* out, float value, ptrdiff_t n) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(fill_kernel, dim3(grid_for(c, n)), dim3(BLOCK), 0, 0, out, value, long(n));
    check_launch(c, "fill");
}

ACCEL_HIP_API float accel_hip_mean(void* ctx, const float* x, ptrdiff_t n) {
    return float(sum_to_host(context(ctx), x, n, false, "mean") / n);
}

ACCEL_HIP_API void accel_hip_adamw_update(void* ctx, float* params, float* m, float* v, const float* grads,
                                          ptrdiff_t n, float lr, float beta1, float beta2, float eps,
                                          float weight_decay, float grad_scale, int t) {
    Context* c = context(ctx);
    const float beta1_correction = 1.0f - powf(beta1, float(t)), beta2_correction = 1.0f - powf(beta2, float(t));
    hipLaunchKernelGGL(adamw_kernel, dim3(grid_for(c, n)), dim3(BLOCK), 0, 0, params, m, v, grads, long(n), lr,
                       beta1, beta2, beta1_correction, beta2_correction, eps, weight_decay, grad_scale);
    check_launch(c, "adamw_update");
}

ACCEL_HIP_API double accel_hip_global_norm_squared(void* ctx, const float* x, ptrdiff_t n) {
    return sum_to_host(context(ctx), x, n, true, "global_norm_squared");
}

// --- linear -----------------------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_matmul_forward(void* ctx, floatX* out, const floatX* inp, const floatX* weight,
                                            const floatX* bias, int B, int T, int C, int OC) {
    // out (B,T,OC) = inp (B,T,C) weight^T (+ bias); column-major: out^T (OC, BT) = weight (C, OC)^T inp^T (C, BT)
    Context* c = context(ctx);
    const int BT = B * T;
    if (bias) {
        const long N = long(BT) * OC;
        hipLaunchKernelGGL(broadcast_bias_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, out, bias, N, OC);
        check_launch(c, "matmul_forward");
    }
    gemm(c, "matmul_forward", HIPBLAS_OP_T, HIPBLAS_OP_N, OC, BT, C, 1.0f, weight, C, 0, inp, C, 0, bias ? 1.0f : 0.0f,
         out, OC, 0);
}

ACCEL_HIP_API void accel_hip_matmul_backward(void* ctx, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                             const floatX* inp, const floatX* weight, int B, int T, int C, int OC) {
    Context* c = context(ctx);
    const int BT = B * T;
    // dinp (B,T,C) += dout (B,T,OC) weight (OC,C)
    if (dinp)
        gemm(c, "matmul_backward", HIPBLAS_OP_N, HIPBLAS_OP_N, C, BT, OC, 1.0f, weight, C, 0, dout, OC, 0, 1.0f, dinp,
             C, 0);
    // dweight (OC,C) += dout^T (OC, BT) inp (BT, C), into float32; none for a frozen weight
    if (dweight)
        gemm(c, "matmul_backward", HIPBLAS_OP_N, HIPBLAS_OP_T, C, OC, BT, 1.0f, inp, C, 0, dout, OC, 0, 1.0f,
             dweight, C, 0);
    if (dbias) {
        // chunks of rows: at least 256 rows each, at most 65535 chunks (the grid's y limit)
        const long rows_per_chunk = std::max(256L, (long(BT) + 65534) / 65535);
        const dim3 grid((OC + BIAS_COLUMNS - 1) / BIAS_COLUMNS, unsigned((BT + rows_per_chunk - 1) / rows_per_chunk));
        hipLaunchKernelGGL(matmul_backward_bias_kernel, grid, dim3(BLOCK), 0, 0, dbias, dout, long(BT), OC,
                           rows_per_chunk);
        check_launch(c, "matmul_backward");
    }
}

ACCEL_HIP_API void accel_hip_residual_forward(void* ctx, floatX* out, const floatX* inp1, const floatX* inp2,
                                              ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(out, inp1, inp2), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(residual_forward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0, 0,
                           out + first, inp1 + first, inp2 + first, n);
    });
    check_launch(c, "residual_forward");
}

ACCEL_HIP_API void accel_hip_residual_backward(void* ctx, floatX* dinp1, floatX* dinp2, const floatX* dout,
                                               ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(dinp1, dinp2, dout), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(residual_backward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0,
                           0, dinp1 + first, dinp2 + first, dout + first, n);
    });
    check_launch(c, "residual_backward");
}

// --- gpt2: its layers -----------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_encoder_forward(void* ctx, floatX* out, const int* inp, const floatX* wte,
                                             const floatX* wpe, int B, int T, int C) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(encoder_forward_kernel, dim3(grid_for(c, long(B) * T * C)), dim3(BLOCK), 0, 0, out, inp, wte,
                       wpe, B, T, C);
    check_launch(c, "encoder_forward");
}

ACCEL_HIP_API void accel_hip_encoder_backward(void* ctx, float* dwte, float* dwpe, const floatX* dout, const int* inp,
                                              int B, int T, int C, int /* Vp */) {
    Context* c = context(ctx);
    const long N = long(B) * T * C;
    hipLaunchKernelGGL(encoder_backward_wte_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, dwte, dout, inp, N, C);
    hipLaunchKernelGGL(encoder_backward_wpe_kernel, dim3(grid_for(c, long(T) * C)), dim3(BLOCK), 0, 0, dwpe, dout, B,
                       T, C);
    check_launch(c, "encoder_backward");
}

ACCEL_HIP_API void accel_hip_layernorm_forward(void* ctx, floatX* out, float* mean, float* rstd, const floatX* inp,
                                               const floatX* weight, const floatX* bias, int B, int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(layernorm_forward_kernel, dim3(grid_for_rows(c, N)), dim3(BLOCK), 0, 0, out, mean, rstd, inp,
                       weight, bias, N, C);
    check_launch(c, "layernorm_forward");
}

ACCEL_HIP_API void accel_hip_layernorm_backward(void* ctx, floatX* dinp, float* dweight, float* dbias,
                                                const floatX* dout, const floatX* inp, const floatX* weight,
                                                const float* mean, const float* rstd, int B, int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(layernorm_backward_kernel, dim3(grid_for_rows(c, N)), dim3(BLOCK), 2 * C * sizeof(float), 0,
                       dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    check_launch(c, "layernorm_backward");
}

// attention_forward's scratch: q, k (B,NH,T,hs) for the scores' GEMM (floatX: GemmEx at bf16);
// v and y (B,NH,T,hs) float32 for y = att v (att's float32 values); at bf16 the float32 scores
// (B,NH,T,T) too (at fp32 they are att itself)
struct ForwardScratch {
    floatX *q, *k;
    float *v, *y, *scores;
    void carve(Carver& carver, long BTC, long scores_n) {
        q = carver.take<floatX>(BTC);
        k = carver.take<floatX>(BTC);
        v = carver.take<float>(BTC);
        y = carver.take<float>(BTC);
        scores = BF16 ? carver.take<float>(scores_n) : nullptr;
    }
};

ACCEL_HIP_API void accel_hip_attention_forward(void* ctx, floatX* out, floatX* preatt, floatX* att, const floatX* inp,
                                               int B, int T, int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const long BTC = long(B) * T * C, scores_n = long(B) * NH * T * T;
    ForwardScratch s;
    Carver size{0};
    s.carve(size, BTC, scores_n);
    char* base = scratch(c, size.used, "attention_forward");
    if (!base) return;
    Carver carver{reinterpret_cast<uintptr_t>(base)};
    s.carve(carver, BTC, scores_n);
    float* scores = BF16 ? s.scores : reinterpret_cast<float*>(att);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(permute_kernel<floatX, floatX, float>), dim3(grid_for(c, BTC)), dim3(BLOCK), 0,
                       0, s.q, s.k, s.v, inp, B, T, NH, hs);
    check_launch(c, "attention_forward");
    // scores[t, t2] = q_t . k_t2 / sqrt(hs) for every head: column-major scores^T (T,T) = k^T q
    const float scale = 1.0f / sqrtf(float(hs));
    const long long qkv_stride = (long long)T * hs, att_stride = (long long)T * T;
    gemm(c, "attention_forward", HIPBLAS_OP_T, HIPBLAS_OP_N, T, T, hs, scale, s.k, hs, qkv_stride, s.q, hs, qkv_stride,
         0.0f, scores, T, att_stride, B * NH);
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(causal_softmax_forward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, scores, preatt,
                       att, rows, T);
    check_launch(c, "attention_forward");
    // y (T,hs) = att (T,T) v (T,hs) for every head: column-major y^T = v^T att^T
    gemm(c, "attention_forward", HIPBLAS_OP_N, HIPBLAS_OP_N, hs, T, T, 1.0f, s.v, hs, qkv_stride, scores, T,
         att_stride, 0.0f, s.y, hs, qkv_stride, B * NH);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<false, floatX, float>), dim3(grid_for(c, BTC)), dim3(BLOCK), 0,
                       0, out, s.y, B, T, NH, hs);
    check_launch(c, "attention_forward");
}

// attention_backward's scratch: q, k (B,NH,T,hs) float32 for the products with dpreatt's float32
// values; v, dy floatX for the products with att (GemmEx at bf16); dq, dk, dv float32; at bf16
// datt's and dpreatt's float32 values (B,NH,T,T) too (at fp32 they are datt and dpreatt)
struct BackwardScratch {
    float *q, *k;
    floatX *v, *dy;
    float *dq, *dk, *dv, *datt, *dpreatt;
    void carve(Carver& carver, long BTC, long scores_n) {
        q = carver.take<float>(BTC);
        k = carver.take<float>(BTC);
        v = carver.take<floatX>(BTC);
        dy = carver.take<floatX>(BTC);
        dq = carver.take<float>(BTC);
        dk = carver.take<float>(BTC);
        dv = carver.take<float>(BTC);
        datt = BF16 ? carver.take<float>(scores_n) : nullptr;
        dpreatt = BF16 ? carver.take<float>(scores_n) : nullptr;
    }
};

ACCEL_HIP_API void accel_hip_attention_backward(void* ctx, floatX* dinp, floatX* dpreatt, floatX* datt,
                                                const floatX* dout, const floatX* inp, const floatX* att, int B, int T,
                                                int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const long BTC = long(B) * T * C, scores_n = long(B) * NH * T * T;
    BackwardScratch s;
    Carver size{0};
    s.carve(size, BTC, scores_n);
    char* base = scratch(c, size.used, "attention_backward");
    if (!base) return;
    Carver carver{reinterpret_cast<uintptr_t>(base)};
    s.carve(carver, BTC, scores_n);
    float* datt_f = BF16 ? s.datt : reinterpret_cast<float*>(datt);
    float* dpreatt_f = BF16 ? s.dpreatt : reinterpret_cast<float*>(dpreatt);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(permute_kernel<float, float, floatX>), dim3(grid_for(c, BTC)), dim3(BLOCK), 0,
                       0, s.q, s.k, s.v, inp, B, T, NH, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, floatX, floatX>), dim3(grid_for(c, BTC)), dim3(BLOCK),
                       0, 0, s.dy, dout, B, T, NH, hs);
    if (BF16)  // datt's float32 values, which the GEMM below adds onto
        hipLaunchKernelGGL(widen_kernel, dim3(grid_for(c, scores_n)), dim3(BLOCK), 0, 0, datt_f, datt, scores_n);
    check_launch(c, "attention_backward");
    const float scale = 1.0f / sqrtf(float(hs));
    const long long qkv_stride = (long long)T * hs, att_stride = (long long)T * T;
    // y = att v:  datt (T,T) += dy v^T,  dv = att^T dy
    gemm(c, "attention_backward", HIPBLAS_OP_T, HIPBLAS_OP_N, T, T, hs, 1.0f, s.v, hs, qkv_stride, s.dy, hs,
         qkv_stride, 1.0f, datt_f, T, att_stride, B * NH);
    gemm(c, "attention_backward", HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, T, 1.0f, s.dy, hs, qkv_stride, att, T, att_stride,
         0.0f, s.dv, hs, qkv_stride, B * NH);
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(causal_softmax_backward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, dpreatt,
                       dpreatt_f, datt, datt_f, att, rows, T);
    check_launch(c, "attention_backward");
    // preatt = scale q k^T:  dq = scale dpreatt k,  dk = scale dpreatt^T q
    gemm(c, "attention_backward", HIPBLAS_OP_N, HIPBLAS_OP_N, hs, T, T, scale, s.k, hs, qkv_stride, dpreatt_f, T,
         att_stride, 0.0f, s.dq, hs, qkv_stride, B * NH);
    gemm(c, "attention_backward", HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, T, scale, s.q, hs, qkv_stride, dpreatt_f, T,
         att_stride, 0.0f, s.dk, hs, qkv_stride, B * NH);
    hipLaunchKernelGGL(permute_backward_kernel, dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, dinp, s.dq, s.dk, s.dv, B, T,
                       NH, hs);
    check_launch(c, "attention_backward");
}

ACCEL_HIP_API void accel_hip_gelu_forward(void* ctx, floatX* out, const floatX* inp, ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(out, inp), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(gelu_forward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0, 0,
                           out + first, inp + first, n);
    });
    check_launch(c, "gelu_forward");
}

ACCEL_HIP_API void accel_hip_gelu_backward(void* ctx, floatX* dinp, const floatX* inp, const floatX* dout,
                                           ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(dinp, inp, dout), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(gelu_backward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0, 0,
                           dinp + first, inp + first, dout + first, n);
    });
    check_launch(c, "gelu_backward");
}

ACCEL_HIP_API void accel_hip_softmax_forward(void* ctx, float* probs, const floatX* logits, int B, int T, int V,
                                             int Vp) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(softmax_forward_kernel, dim3(B * T), dim3(ROW_BLOCK), 0, 0, probs, logits, V, Vp);
    check_launch(c, "softmax_forward");
}

ACCEL_HIP_API void accel_hip_crossentropy_forward(void* ctx, float* losses, const float* probs, const int* targets,
                                                  int B, int T, int Vp) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(crossentropy_forward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, losses, probs, targets,
                       N, Vp);
    check_launch(c, "crossentropy_forward");
}

ACCEL_HIP_API void accel_hip_crossentropy_softmax_backward(void* ctx, floatX* dlogits, const float* dlosses,
                                                           const float* probs, const int* targets, int B, int T,
                                                           int V, int Vp) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(crossentropy_softmax_backward_kernel, dim3(B * T), dim3(ROW_BLOCK), 0, 0, dlogits, dlosses,
                       probs, targets, V, Vp);
    check_launch(c, "crossentropy_softmax_backward");
}

#ifdef ACCEL_HIP_BF16
// --- bf16: the parameters from the master weights ---------------------------------------------

ACCEL_HIP_API void accel_hip_narrow_params(void* ctx, floatX* params, const float* master, ptrdiff_t n,
                                           ptrdiff_t first, int seed) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(narrow_params_kernel, dim3(grid_for(c, n)), dim3(BLOCK), 0, 0, params, master, long(n),
                       long(first), seed);
    check_launch(c, "narrow_params");
}

ACCEL_HIP_API void accel_hip_adamw_update_rounded(void* ctx, floatX* params, float* master, float* m, float* v,
                                                  const float* grads, ptrdiff_t n, float lr, float beta1,
                                                  float beta2, float eps, float weight_decay, float grad_scale,
                                                  int t, ptrdiff_t first) {
    Context* c = context(ctx);
    const float beta1_correction = 1.0f - powf(beta1, float(t)), beta2_correction = 1.0f - powf(beta2, float(t));
    hipLaunchKernelGGL(adamw_rounded_kernel, dim3(grid_for(c, n)), dim3(BLOCK), 0, 0, params, master, m, v, grads,
                       long(n), lr, beta1, beta2, beta1_correction, beta2_correction, eps, weight_decay,
                       grad_scale, t, long(first));
    check_launch(c, "adamw_update_rounded");
}
#endif

#include "llama.hip"  // the Llama family's layers and the classifier (groups llama, classifier)
#include "flash.hip"  // the flash group: flash attention, both forms
#include "cache.hip"  // the cache group: generation's attention over a KV cache, both forms
