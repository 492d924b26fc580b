/*
accel/hip/llama.hip — the Llama family's layers (the table's group "llama") and the classifier
without a probability buffer (group "classifier") in HIP. Not a translation unit of its own:
gpt2.hip #includes it after its helpers (floatX, Elements, warp and block reductions, the
context, launch sizing, scratch memory, gemm), so it builds the three ways and at the two
precisions gpt2.hip does, into the same libraries.

Semantics are the CPU kernels' (kernels/embedding, rmsnorm, rope, swiglu, attention_gqa,
classifier .pxd): outputs first, backward entries ADD into their gradients; at bf16 an entry
reads bf16, computes in float32 and rounds each output once (the CPU's bf16 table).

    embedding   grid-stride copy of token rows; backward: atomics into dwte (gpt2.hip's encoder
                kernel without the position table)
    RMSNorm     one warp per row, as layernorm; backward sums dweight per block in shared memory
    RoPE        one thread per channel pair, two bf16 in one load where the pointers allow
    SwiGLU      elementwise, a pack of elements per thread, as GELU
    GQA         attention over grouped-query heads as batched GEMMs: with q permuted to
                (B, NH, T, hs), the NH/NKV query heads of one key/value head are consecutive,
                so a group is one (NH/NKV T, hs) matrix against its (T, hs) keys and values;
                B NKV GEMMs per product, and backward's dk, dv sum the group's heads inside
                the GEMM (its reduction runs over the group's rows)
    classifier  one block per row of the vocabulary: forward keeps a running maximum and sum
                per thread (one pass over the logits, merged across the block), backward finds
                the row's maximum again and adds softmax - onehot times dloss in a second pass

Dimension letters: B batch, T time, C channels, NH query heads, NKV key/value heads (NKV divides
NH), hs head size, V vocabulary, Vp padded vocabulary (row stride of the logits), N elements.

Planted fault, for tests/test_hip_llama.py only (a -D in a test build; never in a real one):
    ACCEL_HIP_PLANT_GQA_HEAD   attention_gqa_forward pairs query head h with key/value head
                               h % NKV instead of h / (NH/NKV) (the same when NKV = 1 or NH):
                               the classic repeat_kv mix-up
*/

// ----------------------------------------------------------------------------
// embedding: out[b,t,:] = wte[inp[b,t],:]

__global__ void embedding_forward_kernel(floatX* out, const int* inp, const floatX* wte, long N, int C) {
    // out (B,T,C), N = B T C; inp (B,T); wte (Vp,C)
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x)
        out[i] = wte[long(inp[i / C]) * C + i % C];
}

// ----------------------------------------------------------------------------
// RMSNorm: one warp per row of C channels

__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight, float eps,
                                       long N, int C) {
    // out, inp (N,C); rstd (N,); weight (C,)
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const floatX* x = inp + row * C;
        float squares = 0.0f;
        for (int i = lane; i < C; i += warpSize) squares += to_float(x[i]) * to_float(x[i]);
        const float s = 1.0f / sqrtf(warp_reduce(squares, Sum()) / C + eps);
        floatX* o = out + row * C;
        for (int i = lane; i < C; i += warpSize) o[i] = to_floatX((to_float(x[i]) * s) * to_float(weight[i]));
        if (lane == 0) rstd[row] = s;
    }
}

// dinp (N,C) += rstd (g - norm sum(g norm) / C) with g = weight dout, norm = inp rstd; dweight (C,)
// += the sum over rows of norm dout: each block sums its rows' share in shared memory (C floats,
// dynamic) and adds it to dweight once. DWEIGHT false: a frozen weight, dinp alone (no shared
// memory, no atomics)
template <bool DWEIGHT>
__global__ void rmsnorm_backward_kernel(floatX* dinp, float* dweight, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* rstd, long N, int C) {
    HIP_DYNAMIC_SHARED(float, dweight_block)
    if constexpr (DWEIGHT) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dweight_block[i] = 0.0f;
        __syncthreads();
    }
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < N; row += long(gridDim.x) * warps) {
        const floatX* dout_r = dout + row * C;
        const floatX* x = inp + row * C;
        const float s = rstd[row];
        // the one reduction over the channels that every dinp[i] depends on (through rstd)
        float dnorm_norm_mean = 0.0f;
        for (int i = lane; i < C; i += warpSize)
            dnorm_norm_mean += to_float(weight[i]) * to_float(dout_r[i]) * (to_float(x[i]) * s);
        dnorm_norm_mean = warp_reduce(dnorm_norm_mean, Sum()) / C;
        floatX* dinp_r = dinp + row * C;
        for (int i = lane; i < C; i += warpSize) {
            const float norm = to_float(x[i]) * s;
            const float d = to_float(dout_r[i]);
            dinp_r[i] = to_floatX(to_float(dinp_r[i]) + (to_float(weight[i]) * d - norm * dnorm_norm_mean) * s);
            if constexpr (DWEIGHT) atomicAdd(&dweight_block[i], norm * d);
        }
    }
    if constexpr (DWEIGHT) {
        __syncthreads();
        for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(&dweight[i], dweight_block[i]);
    }
}

// ----------------------------------------------------------------------------
// RoPE: the channel pair (2i, 2i+1) of each head at position t rotated by the angle whose cos and
// sin are freqs_cos[t, i], freqs_sin[t, i] (tables (>= T, hs/2)); one thread per pair. An odd
// head size leaves each head's last channel alone, as the CPU kernel does.

// elements e, e + 1 of x as float32: PAIRED (e even, x 4-byte aligned at bf16), in one load
template <bool PAIRED>
__device__ __forceinline__ void load_pair(const floatX* x, long e, float& first, float& second) {
    if constexpr (PAIRED) {
        Elements<2> pair;
        pair.load(x, e / 2);
        first = pair.v[0];
        second = pair.v[1];
    } else {
        first = to_float(x[e]);
        second = to_float(x[e + 1]);
    }
}

template <bool PAIRED>
__device__ __forceinline__ void store_pair(floatX* x, long e, float first, float second) {
    if constexpr (PAIRED) {
        Elements<2> pair{{first, second}};
        pair.store(x, e / 2);
    } else {
        x[e] = to_floatX(first);
        x[e + 1] = to_floatX(second);
    }
}

// out (B,T,NH,hs) = inp rotated; out may be inp (each thread reads its pair before writing it)
template <bool PAIRED>
__global__ void rope_forward_kernel(floatX* out, const floatX* inp, const float* freqs_cos, const float* freqs_sin,
                                    long pairs, int T, int NH, int hs) {
    const int half = hs / 2;
    for (long p = blockIdx.x * long(blockDim.x) + threadIdx.x; p < pairs; p += long(gridDim.x) * blockDim.x) {
        const int i = int(p % half);
        const long head = p / half, t = head / NH % T, e = head * hs + 2 * i;
        const float c = freqs_cos[t * half + i], s = freqs_sin[t * half + i];
        float x0, x1;
        load_pair<PAIRED>(inp, e, x0, x1);
        store_pair<PAIRED>(out, e, x0 * c - x1 * s, x0 * s + x1 * c);
    }
}

// dinp (B,T,NH,hs) += dout rotated back (by -angle)
template <bool PAIRED>
__global__ void rope_backward_kernel(floatX* dinp, const floatX* dout, const float* freqs_cos,
                                     const float* freqs_sin, long pairs, int T, int NH, int hs) {
    const int half = hs / 2;
    for (long p = blockIdx.x * long(blockDim.x) + threadIdx.x; p < pairs; p += long(gridDim.x) * blockDim.x) {
        const int i = int(p % half);
        const long head = p / half, t = head / NH % T, e = head * hs + 2 * i;
        const float c = freqs_cos[t * half + i], s = freqs_sin[t * half + i];
        float d0, d1, g0, g1;
        load_pair<PAIRED>(dout, e, d0, d1);
        load_pair<PAIRED>(dinp, e, g0, g1);
        store_pair<PAIRED>(dinp, e, g0 + (d0 * c + d1 * s), g1 + (d1 * c - d0 * s));
    }
}

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(a) b, silu(a) = a s, s = 1 / (1 + exp(-a)); W elements (a pack) at a time,
// N a multiple of W (gpt2.hip's elementwise() runs an odd last element as a launch of its own)

template <int W>
__global__ void swiglu_forward_kernel(floatX* out, const floatX* a, const floatX* b, long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> x, y;
        x.load(a, i);
        y.load(b, i);
        for (int j = 0; j < W; ++j) x.v[j] = x.v[j] / (1.0f + expf(-x.v[j])) * y.v[j];
        x.store(out, i);
    }
}

// da += dout b s (1 + a (1 - s)),  db += dout a s
template <int W>
__global__ void swiglu_backward_kernel(floatX* da, floatX* db, const floatX* dout, const floatX* a, const floatX* b,
                                       long N) {
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N / W; i += long(gridDim.x) * blockDim.x) {
        Elements<W> x, y, d, ga, gb;
        x.load(a, i);
        y.load(b, i);
        d.load(dout, i);
        ga.load(da, i);
        gb.load(db, i);
        for (int j = 0; j < W; ++j) {
            const float s = 1.0f / (1.0f + expf(-x.v[j]));
            ga.v[j] += d.v[j] * y.v[j] * s * (1.0f + x.v[j] * (1.0f - s));
            gb.v[j] += d.v[j] * x.v[j] * s;
        }
        ga.store(da, i);
        gb.store(db, i);
    }
}

// ----------------------------------------------------------------------------
// grouped-query attention: q (B,T,NH,hs), k, v (B,T,NKV,hs) permuted head-major (gpt2.hip's
// unpermute_kernel<true>: (B,T,H,hs) to (B,H,T,hs)); query head h = g NH/NKV + r belongs to group
// (key/value head) g, so the group's query heads are NH/NKV consecutive (T, hs) blocks

#ifdef ACCEL_HIP_PLANT_GQA_HEAD
// The planted fault: query head h paired with key/value head h % NKV (Meta's repeat_kv order
// transposed), which the grouped GEMMs cannot express: dst (B,NH,T,hs) gets, for each query head,
// a copy of that key/value head of src (B,T,NKV,hs), and the groups are of one query head each
template <class D>
__global__ void planted_kv_per_query_head_kernel(D* dst, const floatX* src, int B, int T, int NH, int NKV, int hs) {
    const long N = long(B) * NH * T * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), t = int(i / hs % T), h = int(i / (long(hs) * T) % NH);
        const long b = i / (long(hs) * T * NH);
        dst[i] = to_type<D>(to_float(src[((b * T + t) * NKV + h % NKV) * hs + d]));
    }
}
#endif

// One warp per row of the B NH T rows: scores holds the row's scaled scores in float32 (t2 <= t);
// scores and att get their softmax, zero above the diagonal. At fp32 att is scores.
__global__ void gqa_softmax_forward_kernel(float* scores, floatX* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        float* s = scores + row * T;
        floatX* a = att + row * T;
        float maxval = -INFINITY;
        for (int t2 = lane; t2 <= t; t2 += warpSize) maxval = fmaxf(maxval, s[t2]);
        maxval = warp_reduce(maxval, Max());
        float sum = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) {
            const float e = expf(s[t2] - maxval);
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
            a[t2] = to_floatX(0.0f);
        }
    }
}

// ds (B NH T, T) = att (ds - sum_t2 att ds) over t2 <= t, in place, zero above the diagonal (the
// GEMMs after read whole rows); one warp per row
__global__ void gqa_softmax_backward_kernel(float* ds, const floatX* att, long rows, int T) {
    const int lane = threadIdx.x % warpSize, warps = blockDim.x / warpSize;
    for (long row = blockIdx.x * long(warps) + threadIdx.x / warpSize; row < rows; row += long(gridDim.x) * warps) {
        const int t = int(row % T);
        const floatX* a = att + row * T;
        float* d = ds + row * T;
        float dot = 0.0f;
        for (int t2 = lane; t2 <= t; t2 += warpSize) dot += to_float(a[t2]) * d[t2];
        dot = warp_reduce(dot, Sum());
        for (int t2 = lane; t2 <= t; t2 += warpSize) d[t2] = to_float(a[t2]) * (d[t2] - dot);
        for (int t2 = t + 1 + lane; t2 < T; t2 += warpSize) d[t2] = 0.0f;
    }
}

// dst (B,T,H,hs) += src (B,H,T,hs): the head-major gradients added back, each element rounded once
__global__ void add_heads_back_kernel(floatX* dst, const float* src, int B, int T, int H, int hs) {
    const long N = long(B) * T * H * hs;
    for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
        const int d = int(i % hs), h = int(i / hs % H), t = int(i / (long(hs) * H) % T);
        const long b = i / (long(hs) * H * T);
        dst[i] = to_floatX(to_float(dst[i]) + src[((b * H + h) * T + t) * hs + d]);
    }
}

// ----------------------------------------------------------------------------
// the classifier: one block per row of Vp logits, the first V of them the vocabulary

// (max, sum of exp(x - max)) of two parts of a row as one; a part with no elements is (-inf, 0)
__device__ __forceinline__ void merge_softmax_parts(float& maxval, float& sum, float other_max, float other_sum) {
    const float m = fmaxf(maxval, other_max);
    if (m == -INFINITY) return;  // both empty
    sum = sum * expf(maxval - m) + other_sum * expf(other_max - m);
    maxval = m;
}

// logsum (rows,) = log sum exp(logits - max) over the first V; losses (rows,) = max - logits[target]
// + logsum where both losses and targets are given (0 where the target is -1: not scored). Each
// thread keeps a running maximum and sum
// over its elements (one pass over the row), merged across the warp, then across the block.
__global__ void classifier_forward_kernel(float* losses, float* logsum, const floatX* logits, const int* targets,
                                          int V, int Vp) {
    __shared__ float part_max[MAX_WARPS], part_sum[MAX_WARPS];
    const floatX* x = logits + long(blockIdx.x) * Vp;
    float maxval = -INFINITY, sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float value = to_float(x[i]);
        if (value > maxval) {
            sum = sum * expf(maxval - value) + 1.0f;
            maxval = value;
        } else {
            sum += expf(value - maxval);
        }
    }
    for (int offset = warpSize / 2; offset > 0; offset /= 2)
        merge_softmax_parts(maxval, sum, __shfl_xor(maxval, offset), __shfl_xor(sum, offset));
    const int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
    if (lane == 0) {
        part_max[warp] = maxval;
        part_sum[warp] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / warpSize); ++w) merge_softmax_parts(maxval, sum, part_max[w], part_sum[w]);
        const float row_logsum = logf(sum);
        logsum[blockIdx.x] = row_logsum;
        if (losses && targets) {
            const int target = targets[blockIdx.x];
            losses[blockIdx.x] = target < 0 ? 0.0f : (maxval - to_float(x[target])) + row_logsum;
        }
    }
}

// dlogits (rows,Vp) += (exp(logits - max) / exp(logsum) - onehot(target)) dlosses over the first V,
// the row's max found again; each element rounded once; a row whose target is -1 (not scored) is
// left as it was
__global__ void classifier_backward_kernel(floatX* dlogits, const float* dlosses, const floatX* logits,
                                           const float* logsum, const int* targets, int V, int Vp) {
    __shared__ float scratch[MAX_WARPS];
    const long row = blockIdx.x;
    const int target = targets[row];
    if (target < 0) return;   // the whole block, before its reduction's barriers
    const floatX* x = logits + row * Vp;
    floatX* dl = dlogits + row * Vp;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, to_float(x[i]));
    maxval = block_reduce(maxval, Max(), -INFINITY, scratch);
    const float dloss = dlosses[row];
    const float scale = expf(-logsum[row]) * dloss;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float value = to_float(dl[i]) + expf(to_float(x[i]) - maxval) * scale;
        if (i == target) value -= dloss;
        dl[i] = to_floatX(value);
    }
}

// ----------------------------------------------------------------------------
// the C ABI of the two groups

// --- llama ------------------------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_embedding_forward(void* ctx, floatX* out, const int* inp, const floatX* wte, int B,
                                               int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T * C;
    hipLaunchKernelGGL(embedding_forward_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, out, inp, wte, N, C);
    check_launch(c, "embedding_forward");
}

ACCEL_HIP_API void accel_hip_embedding_backward(void* ctx, float* dwte, const floatX* dout, const int* inp, int B,
                                                int T, int C, int /* V */) {
    Context* c = context(ctx);
    const long N = long(B) * T * C;
    hipLaunchKernelGGL(encoder_backward_wte_kernel, dim3(grid_for(c, N)), dim3(BLOCK), 0, 0, dwte, dout, inp, N, C);
    check_launch(c, "embedding_backward");
}

ACCEL_HIP_API void accel_hip_rmsnorm_forward(void* ctx, floatX* out, float* rstd, const floatX* inp,
                                             const floatX* weight, float eps, int B, int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    hipLaunchKernelGGL(rmsnorm_forward_kernel, dim3(grid_for_rows(c, N)), dim3(BLOCK), 0, 0, out, rstd, inp, weight,
                       eps, N, C);
    check_launch(c, "rmsnorm_forward");
}

ACCEL_HIP_API void accel_hip_rmsnorm_backward(void* ctx, floatX* dinp, float* dweight, const floatX* dout,
                                              const floatX* inp, const floatX* weight, const float* rstd, int B,
                                              int T, int C) {
    Context* c = context(ctx);
    const long N = long(B) * T;
    if (dweight)
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rmsnorm_backward_kernel<true>), dim3(grid_for_rows(c, N)), dim3(BLOCK),
                           C * sizeof(float), 0, dinp, dweight, dout, inp, weight, rstd, N, C);
    else   // a frozen weight: no shared memory
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rmsnorm_backward_kernel<false>), dim3(grid_for_rows(c, N)), dim3(BLOCK), 0,
                           0, dinp, dweight, dout, inp, weight, rstd, N, C);
    check_launch(c, "rmsnorm_backward");
}

ACCEL_HIP_API void accel_hip_rope_forward(void* ctx, floatX* out, const floatX* inp, const float* freqs_cos,
                                          const float* freqs_sin, int B, int T, int NH, int hs) {
    Context* c = context(ctx);
    const long pairs = long(B) * T * NH * (hs / 2);
    if (hs % 2 == 0 && packable(out, inp))
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_forward_kernel<true>), dim3(grid_for(c, pairs)), dim3(BLOCK), 0, 0,
                           out, inp, freqs_cos, freqs_sin, pairs, T, NH, hs);
    else
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_forward_kernel<false>), dim3(grid_for(c, pairs)), dim3(BLOCK), 0, 0,
                           out, inp, freqs_cos, freqs_sin, pairs, T, NH, hs);
    check_launch(c, "rope_forward");
}

ACCEL_HIP_API void accel_hip_rope_backward(void* ctx, floatX* dinp, const floatX* dout, const float* freqs_cos,
                                           const float* freqs_sin, int B, int T, int NH, int hs) {
    Context* c = context(ctx);
    const long pairs = long(B) * T * NH * (hs / 2);
    if (hs % 2 == 0 && packable(dinp, dout))
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_backward_kernel<true>), dim3(grid_for(c, pairs)), dim3(BLOCK), 0, 0,
                           dinp, dout, freqs_cos, freqs_sin, pairs, T, NH, hs);
    else
        hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_backward_kernel<false>), dim3(grid_for(c, pairs)), dim3(BLOCK), 0, 0,
                           dinp, dout, freqs_cos, freqs_sin, pairs, T, NH, hs);
    check_launch(c, "rope_backward");
}

ACCEL_HIP_API void accel_hip_swiglu_forward(void* ctx, floatX* out, const floatX* a, const floatX* b, ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(out, a, b), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(swiglu_forward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0, 0,
                           out + first, a + first, b + first, n);
    });
    check_launch(c, "swiglu_forward");
}

ACCEL_HIP_API void accel_hip_swiglu_backward(void* ctx, floatX* da, floatX* db, const floatX* dout, const floatX* a,
                                             const floatX* b, ptrdiff_t N) {
    Context* c = context(ctx);
    elementwise(c, N, packable(da, db, dout, a, b), [&](auto w, long first, long n, unsigned grid) {
        hipLaunchKernelGGL(HIP_KERNEL_NAME(swiglu_backward_kernel<decltype(w)::value>), dim3(grid), dim3(BLOCK), 0, 0,
                           da + first, db + first, dout + first, a + first, b + first, n);
    });
    check_launch(c, "swiglu_backward");
}

// The grouped GEMMs' shapes: B NKV groups of `rep` = NH/NKV query heads; a group's query rows
// (rep T, hs) and scores (rep T, T) at these strides, its keys and values (T, hs)
struct GqaShape {
    int group_rows, groups;
    long long q_stride, kv_stride, att_stride;
    GqaShape(int B, int T, int NH, int NKV, int hs)
        : group_rows(NH / NKV * T), groups(B * NKV), q_stride((long long)(NH / NKV) * T * hs),
          kv_stride((long long)T * hs), att_stride((long long)(NH / NKV) * T * T) {}
};

// attention_gqa_forward's scratch: q, k head-major floatX (the scores' GEMM: GemmEx at bf16), v
// and y float32 (y = att v from att's float32 values), at bf16 the float32 scores (at fp32 they
// are att itself)
struct GqaForwardScratch {
    floatX *q, *k;
    float *v, *y, *scores;
    void carve(Carver& carver, long q_n, long kv_n, long scores_n) {
        q = carver.take<floatX>(q_n);
        k = carver.take<floatX>(kv_n);
        v = carver.take<float>(kv_n);
        y = carver.take<float>(q_n);
        scores = BF16 ? carver.take<float>(scores_n) : nullptr;
    }
};

ACCEL_HIP_API void accel_hip_attention_gqa_forward(void* ctx, floatX* out, floatX* att, const floatX* q,
                                                   const floatX* k, const floatX* v, int B, int T, int NH, int NKV,
                                                   int hs) {
    Context* c = context(ctx);
#ifdef ACCEL_HIP_PLANT_GQA_HEAD
    const int kv_heads = NH;
#else
    const int kv_heads = NKV;
#endif
    const long q_n = long(B) * T * NH * hs, kv_n = long(B) * T * kv_heads * hs, scores_n = long(B) * NH * T * T;
    GqaForwardScratch s;
    Carver size{0};
    s.carve(size, q_n, kv_n, scores_n);
    char* base = scratch(c, size.used, "attention_gqa_forward");
    if (!base) return;
    Carver carver{reinterpret_cast<uintptr_t>(base)};
    s.carve(carver, q_n, kv_n, scores_n);
    float* scores = BF16 ? s.scores : reinterpret_cast<float*>(att);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, floatX, floatX>), dim3(grid_for(c, q_n)), dim3(BLOCK),
                       0, 0, s.q, q, B, T, NH, hs);
#ifdef ACCEL_HIP_PLANT_GQA_HEAD
    hipLaunchKernelGGL(HIP_KERNEL_NAME(planted_kv_per_query_head_kernel<floatX>), dim3(grid_for(c, kv_n)),
                       dim3(BLOCK), 0, 0, s.k, k, B, T, NH, NKV, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(planted_kv_per_query_head_kernel<float>), dim3(grid_for(c, kv_n)),
                       dim3(BLOCK), 0, 0, s.v, v, B, T, NH, NKV, hs);
#else
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, floatX, floatX>), dim3(grid_for(c, kv_n)), dim3(BLOCK),
                       0, 0, s.k, k, B, T, NKV, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, float, floatX>), dim3(grid_for(c, kv_n)), dim3(BLOCK),
                       0, 0, s.v, v, B, T, NKV, hs);
#endif
    const GqaShape g(B, T, NH, kv_heads, hs);
    check_launch(c, "attention_gqa_forward");
    // a group's scores (rep T, T) = q (rep T, hs) k^T / sqrt(hs): column-major scores^T = k^T q
    const float scale = 1.0f / sqrtf(float(hs));
    gemm(c, "attention_gqa_forward", HIPBLAS_OP_T, HIPBLAS_OP_N, T, g.group_rows, hs, scale, s.k, hs, g.kv_stride, s.q,
         hs, g.q_stride, 0.0f, scores, T, g.att_stride, g.groups);
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(gqa_softmax_forward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, scores, att, rows,
                       T);
    check_launch(c, "attention_gqa_forward");
    // y (rep T, hs) = att (rep T, T) v (T, hs): column-major y^T = v^T att^T
    gemm(c, "attention_gqa_forward", HIPBLAS_OP_N, HIPBLAS_OP_N, hs, g.group_rows, T, 1.0f, s.v, hs, g.kv_stride,
         scores, T, g.att_stride, 0.0f, s.y, hs, g.q_stride, g.groups);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<false, floatX, float>), dim3(grid_for(c, q_n)), dim3(BLOCK),
                       0, 0, out, s.y, B, T, NH, hs);
    check_launch(c, "attention_gqa_forward");
}

// attention_gqa_backward's scratch, head-major: q, k float32 (their products with the scores'
// float32 gradient), v and dy floatX (the products of two stored tensors: GemmEx at bf16), dq,
// dk, dv float32, and the scores' gradient (B,NH,T,T) float32
struct GqaBackwardScratch {
    float *q, *k;
    floatX *v, *dy;
    float *dq, *dk, *dv, *ds;
    void carve(Carver& carver, long q_n, long kv_n, long scores_n) {
        q = carver.take<float>(q_n);
        k = carver.take<float>(kv_n);
        v = carver.take<floatX>(kv_n);
        dy = carver.take<floatX>(q_n);
        dq = carver.take<float>(q_n);
        dk = carver.take<float>(kv_n);
        dv = carver.take<float>(kv_n);
        ds = carver.take<float>(scores_n);
    }
};

ACCEL_HIP_API void accel_hip_attention_gqa_backward(void* ctx, floatX* dq, floatX* dk, floatX* dv,
                                                    const floatX* dout, const floatX* q, const floatX* k,
                                                    const floatX* v, const floatX* att, int B, int T, int NH, int NKV,
                                                    int hs) {
    Context* c = context(ctx);
    const GqaShape g(B, T, NH, NKV, hs);
    const long q_n = long(B) * T * NH * hs, kv_n = long(B) * T * NKV * hs, scores_n = long(B) * NH * T * T;
    GqaBackwardScratch s;
    Carver size{0};
    s.carve(size, q_n, kv_n, scores_n);
    char* base = scratch(c, size.used, "attention_gqa_backward");
    if (!base) return;
    Carver carver{reinterpret_cast<uintptr_t>(base)};
    s.carve(carver, q_n, kv_n, scores_n);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, float, floatX>), dim3(grid_for(c, q_n)), dim3(BLOCK), 0,
                       0, s.q, q, B, T, NH, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, floatX, floatX>), dim3(grid_for(c, q_n)), dim3(BLOCK), 0,
                       0, s.dy, dout, B, T, NH, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, float, floatX>), dim3(grid_for(c, kv_n)), dim3(BLOCK), 0,
                       0, s.k, k, B, T, NKV, hs);
    hipLaunchKernelGGL(HIP_KERNEL_NAME(unpermute_kernel<true, floatX, floatX>), dim3(grid_for(c, kv_n)), dim3(BLOCK),
                       0, 0, s.v, v, B, T, NKV, hs);
    check_launch(c, "attention_gqa_backward");
    const float scale = 1.0f / sqrtf(float(hs));
    // y = att v:  ds (rep T, T) = dy v^T;  dv (T, hs) = att^T dy, summed over the group's rep T rows
    gemm(c, "attention_gqa_backward", HIPBLAS_OP_T, HIPBLAS_OP_N, T, g.group_rows, hs, 1.0f, s.v, hs, g.kv_stride,
         s.dy, hs, g.q_stride, 0.0f, s.ds, T, g.att_stride, g.groups);
    gemm(c, "attention_gqa_backward", HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, g.group_rows, 1.0f, s.dy, hs, g.q_stride, att,
         T, g.att_stride, 0.0f, s.dv, hs, g.kv_stride, g.groups);
    const long rows = long(B) * NH * T;
    hipLaunchKernelGGL(gqa_softmax_backward_kernel, dim3(grid_for_rows(c, rows)), dim3(BLOCK), 0, 0, s.ds, att, rows,
                       T);
    check_launch(c, "attention_gqa_backward");
    // scores = scale q k^T:  dq (rep T, hs) = scale ds k;  dk (T, hs) = scale ds^T q
    gemm(c, "attention_gqa_backward", HIPBLAS_OP_N, HIPBLAS_OP_N, hs, g.group_rows, T, scale, s.k, hs, g.kv_stride,
         s.ds, T, g.att_stride, 0.0f, s.dq, hs, g.q_stride, g.groups);
    gemm(c, "attention_gqa_backward", HIPBLAS_OP_N, HIPBLAS_OP_T, hs, T, g.group_rows, scale, s.q, hs, g.q_stride,
         s.ds, T, g.att_stride, 0.0f, s.dk, hs, g.kv_stride, g.groups);
    hipLaunchKernelGGL(add_heads_back_kernel, dim3(grid_for(c, q_n)), dim3(BLOCK), 0, 0, dq, s.dq, B, T, NH, hs);
    hipLaunchKernelGGL(add_heads_back_kernel, dim3(grid_for(c, kv_n)), dim3(BLOCK), 0, 0, dk, s.dk, B, T, NKV, hs);
    hipLaunchKernelGGL(add_heads_back_kernel, dim3(grid_for(c, kv_n)), dim3(BLOCK), 0, 0, dv, s.dv, B, T, NKV, hs);
    check_launch(c, "attention_gqa_backward");
}

// --- classifier ---------------------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_classifier_forward(void* ctx, float* losses, float* logsum, const floatX* logits,
                                                const int* targets, int B, int T, int V, int Vp) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(classifier_forward_kernel, dim3(B * T), dim3(ROW_BLOCK), 0, 0, losses, logsum, logits, targets,
                       V, Vp);
    check_launch(c, "classifier_forward");
}

ACCEL_HIP_API void accel_hip_classifier_backward(void* ctx, floatX* dlogits, const float* dlosses,
                                                 const floatX* logits, const float* logsum, const int* targets, int B,
                                                 int T, int V, int Vp) {
    Context* c = context(ctx);
    hipLaunchKernelGGL(classifier_backward_kernel, dim3(B * T), dim3(ROW_BLOCK), 0, 0, dlogits, dlosses, logits,
                       logsum, targets, V, Vp);
    check_launch(c, "classifier_backward");
}
