/*
accel/hip/gpt2.hip — the GPT-2 training step in HIP: every entry of the backend table
(accel/backend.pxd) behind a C ABI that accel/hip/device.pyx loads at run time.

One source, three builds (accel/hip/Makefile):
    hipcc   AMD GPUs, hipBLAS
    nvcc    NVIDIA GPUs, cuBLAS, through accel/hip/cuda/ (HIP names mapped onto CUDA's)
    g++     the CPU emulator (accel/emu): every kernel run thread by thread, checked in CI

Semantics are those of the CPU kernels (kernels/NAME.pxd): outputs first, backward entries ADD
into their gradients. Parameters, gradients, AdamW state and activations live in device memory
from alloc; per step only tokens go in (copy_to_backend) and the loss comes out (mean).

Kernels are written for any warp size (warpSize: 32 on NVIDIA and RDNA, 64 on CDNA): blocks
are multiples of 64 threads (whole warps for either), warp-per-row kernels loop over rows, and
block reductions keep one partial per warp (at most 1024 / 32 = 32). GEMMs go to the vendor
BLAS (column-major: a row-major (R, C) matrix is a column-major (C, R) one).

Dimension letters: B batch, T time, C channels, OC output channels, NH heads, hs = C / NH head
size, V vocabulary, Vp padded vocabulary (row stride of logits, probs and wte), N or n elements.

Planted faults, for tests/test_hip.py only (a -D in a test build; never in a real one):
    ACCEL_HIP_PLANT_MISSING_BARRIER   matmul_backward's bias reduction without its barrier
    ACCEL_HIP_PLANT_WARP32            layernorm_forward's warp sums assume 32 lanes
    ACCEL_HIP_PLANT_OUT_OF_BOUNDS     residual_forward writes one element past its output
*/
#include <hip/hip_runtime.h>
#include <hipblas/hipblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#define ACCEL_HIP_API extern "C" __attribute__((visibility("default")))

// threads per block of the elementwise and warp-per-row kernels
constexpr int BLOCK = 256;
// threads per block of the kernels that reduce a whole vocabulary row
constexpr int ROW_BLOCK = 512;
// the most warps a block can hold (1024 threads, warps of at least 32)
constexpr int MAX_WARPS = 32;

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

__global__ void encoder_forward_kernel(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                                       int C) {
    // out (B,T,C); inp (B,T); wte (Vp,C); wpe (maxT,C)
    const long N = long(B) * T * C;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const long bt = i / C;
        const int c = int(i % C), t = int(bt % T);
        out[i] = wte[long(inp[bt]) * C + c] + wpe[long(t) * C + c];
    }
}

// dwte (Vp,C) += dout at each position's token row: positions may share a token, so atomically
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* inp, long N, int C) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        atomicAdd(&dwte[long(inp[i / C]) * C + i % C], dout[i]);
}

// dwpe (maxT,C) += the sum over the batch of dout (B,T,C): one thread per (t, c), no atomics
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    const long TC = long(T) * C;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < TC; i += long(gridDim.x) * blockDim.x) {
        float sum = 0.0f;
        for (int b = 0; b < B; ++b) sum += dout[b * TC + i];
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

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, long N, int C) {
    // out, inp (N,C); mean, rstd (N,); weight, bias (C,)
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const float* x = inp + row * C;
        float sum = 0.0f;
        for (int i = lane; i < C; i += warpSize) sum += x[i];
        const float m = layernorm_warp_sum(sum) / C;
        // the variance from the shifted values (two passes), as the CPU kernel
        float var = 0.0f;
        for (int i = lane; i < C; i += warpSize) {
            const float d = x[i] - m;
            var += d * d;
        }
        const float s = 1.0f / sqrtf(layernorm_warp_sum(var) / C + 1e-5f);
        float* o = out + row * C;
        for (int i = lane; i < C; i += warpSize) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = s;
        }
    }
}

// dinp (N,C), dweight, dbias (C,) += ...: each warp takes rows, the block sums its rows' dweight
// and dbias in shared memory (2C floats, dynamic) and adds them to the outputs once
__global__ void layernorm_backward_kernel(float* dinp, float* dweight, float* dbias, const float* dout,
                                          const float* inp, const float* weight, const float* mean,
                                          const float* rstd, long N, int C) {
    HIP_DYNAMIC_SHARED(float, block_sums)
    float* dbias_block = block_sums;
    float* dweight_block = block_sums + C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) block_sums[i] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const float* dout_r = dout + row * C;
        const float* x = inp + row * C;
        const float m = mean[row], s = rstd[row];
        // the two reductions over the channels that every dinp[i] depends on
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = lane; i < C; i += warpSize) {
            const float dnorm = weight[i] * dout_r[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * ((x[i] - m) * s);
        }
        dnorm_mean = warp_reduce(dnorm_mean, Sum()) / C;
        dnorm_norm_mean = warp_reduce(dnorm_norm_mean, Sum()) / C;
        float* dinp_r = dinp + row * C;
        for (int i = lane; i < C; i += warpSize) {
            const float norm = (x[i] - m) * s;
            const float dnorm = weight[i] * dout_r[i];
            dinp_r[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            atomicAdd(&dbias_block[i], dout_r[i]);
            atomicAdd(&dweight_block[i], norm * dout_r[i]);
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

__global__ void add_bias_kernel(float* out, const float* bias, long N, int OC) {
    // out (N/OC, OC) += bias (OC,) on every row
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        out[i] += bias[i % OC];
}

// dbias (OC,) += column sums of dout (rows, OC). A block takes 32 columns of a chunk of rows:
// 8 parts of 32 threads each sum every 8th row of the chunk (neighbouring threads read
// neighbouring columns), the parts meet in shared memory, and the chunk's sums go to dbias
constexpr int BIAS_COLUMNS = 32, BIAS_PARTS = BLOCK / BIAS_COLUMNS;

__global__ void matmul_backward_bias_kernel(float* dbias, const float* dout, long rows, int OC, long rows_per_chunk) {
    __shared__ float part_sums[BIAS_PARTS][BIAS_COLUMNS];
    const int column = threadIdx.x % BIAS_COLUMNS, part = threadIdx.x / BIAS_COLUMNS;
    const int oc = blockIdx.x * BIAS_COLUMNS + column;
    const long first = blockIdx.y * rows_per_chunk;
    const long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum = 0.0f;
    if (oc < OC)
        for (long r = first + part; r < last; r += BIAS_PARTS) sum += dout[r * OC + oc];
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
// both zero above the diagonal, as the CPU kernel leaves them.

// q, k, v (B,NH,T,hs) from inp (B,T,3C) = q, k, v with head h in channels h*hs .. (h+1)*hs
__global__ void permute_kernel(float* q, float* k, float* v, const float* inp, int B, int T, int NH, int hs) {
    const int C = NH * hs;
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), t = int(i / hs % T), h = int(i / (long(hs) * T) % NH);
        const long b = i / (long(hs) * T * NH);
        const long src = (b * T + t) * 3 * C + h * hs + d;
        q[i] = inp[src];
        k[i] = inp[src + C];
        v[i] = inp[src + 2 * C];
    }
}

// dinp (B,T,3C) += dq, dk, dv (B,NH,T,hs): the transpose of permute_kernel
__global__ void permute_backward_kernel(float* dinp, const float* dq, const float* dk, const float* dv, int B, int T,
                                        int NH, int hs) {
    const int C = NH * hs;
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), t = int(i / hs % T), h = int(i / (long(hs) * T) % NH);
        const long b = i / (long(hs) * T * NH);
        const long dst = (b * T + t) * 3 * C + h * hs + d;
        dinp[dst] += dq[i];
        dinp[dst + C] += dk[i];
        dinp[dst + 2 * C] += dv[i];
    }
}

// out (B,T,C) = y (B,NH,T,hs) with the heads side by side; BACKWARD: y = out's layout undone
template <bool BACKWARD>
__global__ void unpermute_kernel(float* dst, const float* src, int B, int T, int NH, int hs) {
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        // i indexes (B,T,NH,hs) = (B,T,C)
        const int d = int(i % hs), h = int(i / hs % NH), t = int(i / (long(hs) * NH) % T);
        const long b = i / (long(hs) * NH * T);
        const long head_major = ((b * NH + h) * T + t) * hs + d;
        if (BACKWARD)
            dst[head_major] = src[i];
        else
            dst[i] = src[head_major];
    }
}

// att = softmax over t2 <= t of preatt's row t, one warp per row of the B*NH*T rows; both are
// set to zero above the diagonal
__global__ void causal_softmax_forward_kernel(float* preatt, float* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        float* pre = preatt + row * T;
        float* a = att + row * T;
        float maxval = -INFINITY;
        for (int t2 = lane; t2 <= t; t2 += warpSize) maxval = fmaxf(maxval, pre[t2]);
        maxval = warp_reduce(maxval, Max());
        float sum = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) {
            const float e = expf(pre[t2] - maxval);
            a[t2] = e;
            sum += e;
        }
        const float inv = 1.0f / warp_reduce(sum, Sum());
        for (int t2 = lane; t2 <= t; t2 += warpSize) a[t2] *= inv;
        for (int t2 = t + 1 + lane; t2 < T; t2 += warpSize) pre[t2] = a[t2] = 0.0f;
    }
}

// dpreatt[t2] += att[t2] (datt[t2] - sum_t3 att[t3] datt[t3]) over t2 <= t, one warp per row.
// Above the diagonal dpreatt and datt are set to zero: the GEMMs around this read whole rows.
__global__ void causal_softmax_backward_kernel(float* dpreatt, float* datt, const float* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        const float* a = att + row * T;
        float* da = datt + row * T;
        float* dpre = dpreatt + row * T;
        float dot = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) dot += a[t2] * da[t2];
        dot = warp_reduce(dot, Sum());
        for (int t2 = lane; t2 <= t; t2 += warpSize) dpre[t2] += a[t2] * (da[t2] - dot);
        for (int t2 = t + 1 + lane; t2 < T; t2 += warpSize) dpre[t2] = da[t2] = 0.0f;
    }
}

// ----------------------------------------------------------------------------
// GELU (tanh approximation), residual: elementwise

constexpr float GELU_SCALING_FACTOR = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float GELU_CUBIC = 0.044715f;

// 0.5 x (1 + tanh(u)) = x s with s = 1 / (1 + exp(-2u)), as the CPU kernel writes it
__global__ void gelu_forward_kernel(float* out, const float* inp, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const float x = inp[i];
        const float u = GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * u));
    }
}

// dinp += gelu'(inp) dout, gelu'(x) = s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 0.044715 x^2)
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const float x = inp[i];
        const float u = GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x);
        const float s = 1.0f / (1.0f + expf(-2.0f * u));
        const float local_grad =
            s + x * s * (1.0f - s) * (2.0f * GELU_SCALING_FACTOR) * (1.0f + 3.0f * GELU_CUBIC * x * x);
        dinp[i] += local_grad * dout[i];
    }
}

__global__ void residual_forward_kernel(float* out, const float* inp1, const float* inp2, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        out[i] = inp1[i] + inp2[i];
#ifdef ACCEL_HIP_PLANT_OUT_OF_BOUNDS
    if (blockIdx.x == 0 && threadIdx.x == 0) out[N] = 0.0f;  // the planted fault: one past the end
#endif
}

__global__ void residual_backward_kernel(float* dinp1, float* dinp2, const float* dout, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

// ----------------------------------------------------------------------------
// softmax over the vocabulary, cross-entropy: one block per position (row of Vp)

// probs (rows,Vp) = softmax of logits over the first V entries, zero in the padding
__global__ void softmax_forward_kernel(float* probs, const float* logits, int V, int Vp) {
    __shared__ float scratch[MAX_WARPS];
    const float* x = logits + long(blockIdx.x) * Vp;
    float* p = probs + long(blockIdx.x) * Vp;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, x[i]);
    maxval = block_reduce(maxval, Max(), -INFINITY, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - maxval);
    const float scale = 1.0f / block_reduce(sum, Sum(), 0.0f, scratch);
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(x[i] - maxval) * scale;
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) p[i] = 0.0f;
}

// losses (N,) = -log probs[target] of each row of probs (N,Vp)
__global__ void crossentropy_forward_kernel(float* losses, const float* probs, const int* targets, long N, int Vp) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        losses[i] = -logf(probs[i * Vp + targets[i]]);
}

// dlogits (rows,Vp) += (probs - onehot(target)) dlosses over the first V entries
__global__ void crossentropy_softmax_backward_kernel(float* dlogits, const float* dlosses, const float* probs,
                                                     const int* targets, int V, int Vp) {
    const long row = blockIdx.x;
    const float dloss = dlosses[row];
    const int target = targets[row];
    float* dl = dlogits + row * Vp;
    const float* p = probs + row * Vp;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float d = dl[i] + p[i] * dloss;
        if (i == target) d -= dloss;
        dl[i] = d;
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

// AdamW as kernels/adamw.pxd: grads scaled first, bias corrections 1 - beta^t from the host
__global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, long n, float lr, float beta1,
                             float beta2, float beta1_correction, float beta2_correction, float eps,
                             float weight_decay, float grad_scale) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
        const float grad = grads[i] * grad_scale;
        const float m_i = beta1 * m[i] + (1.0f - beta1) * grad;
        const float v_i = beta2 * v[i] + (1.0f - beta2) * grad * grad;
        m[i] = m_i;
        v[i] = v_i;
        const float m_hat = m_i / beta1_correction, v_hat = v_i / beta2_correction;
        params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
    }
}

// ----------------------------------------------------------------------------
// the context: one device, its BLAS handle, scratch memory, the first error

namespace {

struct Context {
    hipblasHandle_t blas = nullptr;
    int warp_size = 32;
    unsigned max_blocks = 1;    // grid of the grid-stride kernels: enough to fill the device
    double* partials = nullptr;  // (max_blocks,) sum_kernel's per-block sums
    std::vector<double> host_partials;
    float* scratch = nullptr;   // attention's permuted tensors, grown on demand
    size_t scratch_floats = 0;
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

// the scratch memory, at least `floats` of it
float* scratch(Context* c, size_t floats, const char* where) {
    if (c->scratch_floats < floats) {
        if (c->scratch) (void)hipFree(c->scratch);
        c->scratch = nullptr;
        c->scratch_floats = 0;
        if (!ok(c, hipMalloc(&c->scratch, floats * sizeof(float)), where)) return nullptr;
        c->scratch_floats = floats;
    }
    return c->scratch;
}

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

const float ONE = 1.0f, ZERO = 0.0f;

}  // namespace

// ----------------------------------------------------------------------------
// the C ABI: the context, then one function per table entry, with the table's signatures

// A context on the first device, or NULL with the reason in `error`.
ACCEL_HIP_API void* accel_hip_create(char* error, size_t error_size) {
    int devices = 0;
    const hipError_t e = hipGetDeviceCount(&devices);
    if (e != hipSuccess || devices == 0) {
        std::snprintf(error, error_size, "no GPU found (%s)", e != hipSuccess ? hipGetErrorString(e) : "no devices");
        (void)hipGetLastError();
        return nullptr;
    }
    hipDeviceProp_t prop;
    if (hipGetDeviceProperties(&prop, 0) != hipSuccess) {
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
    (void)hipFree(c->scratch);
    (void)hipFree(c->partials);
    hipblasDestroy(c->blas);
    delete c;
}

ACCEL_HIP_API const char* accel_hip_device_name(void* ctx) { return context(ctx)->name.c_str(); }

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

// --- gpt2: its layers -----------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_encoder_forward(void* ctx, float* out, const int* inp, const float* wte,
                                             const float* wpe, int B, int T, int C) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(encoder_forward_kernel, dim3(grid_for(c, long(B) * T * C)), dim3(BLOCK), 0, 0, out, inp, wte,
                       wpe, B, T, C);
    check_launch(c, "encoder_forward");
}

ACCEL_HIP_API void accel_hip_encoder_backward(void* ctx, float* dwte, float* dwpe, const float* dout, const int* inp,
                                              int B, int T, int C, int /* Vp */) {
    Context* c = context(ctx);
    const long N = long(B) * T * C;
    hipLaunchKernelGGL(encoder_backward_wte_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, dwte, dout, inp, N, C);
    hipLaunchKernelGGL(encoder_backward_wpe_kernel, dim3(grid_for(c, long(T) * C)), dim3(BLOCK), 0, 0, dwpe, dout, B,
                       T, C);
    check_launch(c, "encoder_backward");
}

ACCEL_HIP_API void accel_hip_layernorm_forward(void* ctx, float* out, float* mean, float* rstd, const float* inp,
                                               const float* weight, const float* bias, int B, int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(layernorm_forward_kernel, dim3(grid_for_rows(c, N)), dim3(BLOCK), 0, 0, out, mean, rstd, inp,
                       weight, bias, N, C);
    check_launch(c, "layernorm_forward");
}

ACCEL_HIP_API void accel_hip_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                                                const float* dout, const float* inp, const float* weight,
                                                const float* mean, const float* rstd, int B, int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(layernorm_backward_kernel, dim3(grid_for_rows(c, N)), dim3(BLOCK), 2 * C * sizeof(float), 0,
                       dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    check_launch(c, "layernorm_backward");
}

ACCEL_HIP_API void accel_hip_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                                            const float* bias, int B, int T, int C, int OC) {
    // out (B,T,OC) = inp (B,T,C) weight^T; column-major: out^T (OC, BT) = weight (C, OC)^T inp^T (C, BT)
    Context* c = context(ctx);
    const int BT = B * T;
    check_blas(c, hipblasSgemm(c->blas, HIPBLAS_OP_T, HIPBLAS_OP_N, OC, BT, C, &ONE, weight, C, inp, C, &ZERO, out, OC),
               "matmul_forward");
    if (bias) {
        const long N = long(BT) * OC;
        hipLaunchKernelGGL(add_bias_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, out, bias, N, OC);
        check_launch(c, "matmul_forward");
    }
}

ACCEL_HIP_API void accel_hip_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                                             const float* inp, const float* weight, int B, int T, int C, int OC) {
    Context* c = context(ctx);
    const int BT = B * T;
    // dinp (B,T,C) += dout (B,T,OC) weight (OC,C)
    if (dinp)
        check_blas(c, hipblasSgemm(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_N, C, BT, OC, &ONE, weight, C, dout, OC, &ONE,
                                   dinp, C),
                   "matmul_backward");
    // dweight (OC,C) += dout^T (OC, BT) inp (BT, C)
    check_blas(c, hipblasSgemm(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_T, C, OC, BT, &ONE, inp, C, dout, OC, &ONE, dweight,
                               C),
               "matmul_backward");
    if (dbias) {
        // chunks of rows: at least 256 rows each, at most 65535 chunks (the grid's y limit)
        const long rows_per_chunk = std::max(256L, (long(BT) + 65534) / 65535);
        const dim3 grid((OC + BIAS_COLUMNS - 1) / BIAS_COLUMNS, unsigned((BT + rows_per_chunk - 1) / rows_per_chunk));
        hipLaunchKernelGGL(matmul_backward_bias_kernel, grid, dim3(BLOCK), 0, 0, dbias, dout, long(BT), OC,
                           rows_per_chunk);
        check_launch(c, "matmul_backward");
    }
}

ACCEL_HIP_API void accel_hip_attention_forward(void* ctx, float* out, float* preatt, float* att, const float* inp,
                                               int B, int T, int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const long BTC = long(B) * T * C;
    float* q = scratch(c, 4 * BTC, "attention_forward");  // q, k, v, y: (B,NH,T,hs) each
    if (!q) return;
    float *k = q + BTC, *v = k + BTC, *y = v + BTC;
    hipLaunchKernelGGL(permute_kernel, dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, q, k, v, inp, B, T, NH, hs);
    check_launch(c, "attention_forward");
    // preatt[t, t2] = q_t . k_t2 / sqrt(hs) for every head: column-major preatt^T (T,T) = k^T q
    const float scale = 1.0f / sqrtf(float(hs));
    const long long qkv_stride = (long long)T * hs, att_stride = (long long)T * T;
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_T, HIPBLAS_OP_N, T, T, hs, &scale, k, hs, qkv_stride,
                                             q, hs, qkv_stride, &ZERO, preatt, T, att_stride, B * NH),
               "attention_forward");
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(causal_softmax_forward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, preatt, att,
                       rows, T);
    check_launch(c, "attention_forward");
    // y (T,hs) = att (T,T) v (T,hs) for every head: column-major y^T = v^T att^T
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_N, hs, T, T, &ONE, v, hs, qkv_stride,
                                             att, T, att_stride, &ZERO, y, hs, qkv_stride, B * NH),
               "attention_forward");
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<false>), dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, out, y,
                       B, T, NH, hs);
    check_launch(c, "attention_forward");
}

ACCEL_HIP_API void accel_hip_attention_backward(void* ctx, float* dinp, float* dpreatt, float* datt,
                                                const float* dout, const float* inp, const float* att, int B, int T,
                                                int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const long BTC = long(B) * T * C;
    float* q = scratch(c, 7 * BTC, "attention_backward");  // q, k, v, dy, dq, dk, dv: (B,NH,T,hs) each
    if (!q) return;
    float *k = q + BTC, *v = k + BTC, *dy = v + BTC, *dq = dy + BTC, *dk = dq + BTC, *dv = dk + BTC;
    hipLaunchKernelGGL(permute_kernel, dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, q, k, v, inp, B, T, NH, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true>), dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, dy, dout,
                       B, T, NH, hs);
    check_launch(c, "attention_backward");
    const float scale = 1.0f / sqrtf(float(hs));
    const long long qkv_stride = (long long)T * hs, att_stride = (long long)T * T;
    // y = att v:  datt (T,T) += dy v^T,  dv = att^T dy
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_T, HIPBLAS_OP_N, T, T, hs, &ONE, v, hs, qkv_stride,
                                             dy, hs, qkv_stride, &ONE, datt, T, att_stride, B * NH),
               "attention_backward");
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, T, &ONE, dy, hs, qkv_stride,
                                             att, T, att_stride, &ZERO, dv, hs, qkv_stride, B * NH),
               "attention_backward");
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(causal_softmax_backward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, dpreatt, datt,
                       att, rows, T);
    check_launch(c, "attention_backward");
    // preatt = scale q k^T:  dq = scale dpreatt k,  dk = scale dpreatt^T q
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_N, hs, T, T, &scale, k, hs, qkv_stride,
                                             dpreatt, T, att_stride, &ZERO, dq, hs, qkv_stride, B * NH),
               "attention_backward");
    check_blas(c, hipblasSgemmStridedBatched(c->blas, HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, T, &scale, q, hs, qkv_stride,
                                             dpreatt, T, att_stride, &ZERO, dk, hs, qkv_stride, B * NH),
               "attention_backward");
    hipLaunchKernelGGL(permute_backward_kernel, dim3(grid_for(c, BTC)), dim3(BLOCK), 0, 0, dinp, dq, dk, dv, B, T, NH,
                       hs);
    check_launch(c, "attention_backward");
}

ACCEL_HIP_API void accel_hip_gelu_forward(void* ctx, float* out, const float* inp, ptrdiff_t N) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(gelu_forward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, out, inp, long(N));
    check_launch(c, "gelu_forward");
}

ACCEL_HIP_API void accel_hip_gelu_backward(void* ctx, float* dinp, const float* inp, const float* dout, ptrdiff_t N) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(gelu_backward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, dinp, inp, dout, long(N));
    check_launch(c, "gelu_backward");
}

ACCEL_HIP_API void accel_hip_residual_forward(void* ctx, float* out, const float* inp1, const float* inp2,
                                              ptrdiff_t N) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(residual_forward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, out, inp1, inp2, long(N));
    check_launch(c, "residual_forward");
}

ACCEL_HIP_API void accel_hip_residual_backward(void* ctx, float* dinp1, float* dinp2, const float* dout, ptrdiff_t N) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(residual_backward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, dinp1, dinp2, dout,
                       long(N));
    check_launch(c, "residual_backward");
}

ACCEL_HIP_API void accel_hip_softmax_forward(void* ctx, float* probs, const float* logits, int B, int T, int V,
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

ACCEL_HIP_API void accel_hip_crossentropy_softmax_backward(void* ctx, float* dlogits, const float* dlosses,
                                                           const float* probs, const int* targets, int B, int T,
                                                           int V, int Vp) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(crossentropy_softmax_backward_kernel, dim3(B * T), dim3(ROW_BLOCK), 0, 0, dlogits, dlosses,
                       probs, targets, V, Vp);
    check_launch(c, "crossentropy_softmax_backward");
}
