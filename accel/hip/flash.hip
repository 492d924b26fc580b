/*
accel/hip/flash.hip — flash attention in HIP: causal self-attention that keeps each row's
log-sum-exp instead of the (B,NH,T,T) scores and probabilities (the table's "flash" group,
accel/spec.py). #included by gpt2.hip after its context, helpers and precision (floatX).

Two forms, one set of kernels (as kernels/flash_attention.pyx, the CPU oracle):
    GPT-2's   inp (B,T,3C) = q, k, v side by side; out (B,T,C); NH heads of hs = C/NH
    Llama's   q (B,T,NH,hs); k, v (B,T,NKV,hs), grouped-query: query head h reads key/value
              head h / (NH/NKV); out (B,T,NH,hs)
    both      lse (B,NH,T), float32 at both precisions
GPT-2's form is Llama's with NKV = NH and q, k, v strided views of inp (row stride 3C): the
kernels take each tensor's row stride.

Every kernel works on tiles of R query rows and R keys (R = 32, or fewer where the tiles of a
large head size would not fit in FLASH_SHARED_BYTES), staged in shared memory as float32 with a
row stride of hs + 1 (columns read by neighbouring threads fall in different banks):
    forward    one block per (query tile, head, batch), the last query tiles (most keys) first.
               For each key tile up to the diagonal: K, V staged; S = scale Q K^T (keys in the
               future -inf); online softmax per row (running max m and sum l; the row's
               output rescaled by exp(m_old - m_new)); O += P V. At the end out = O / l,
               lse = m + log l.
    backward   P = exp(scale Q K^T - lse) recomputed from the forward's lse; D = rowsum(dO out);
               dS = P (dO V^T - D). Two kernels, so that each gradient is summed in float32 in
               one block and added to its (floatX) output once (the CPU's bf16 semantics):
      dk, dv   one block per (key tile, key/value head, batch): every query head of the group
               and every query tile from the key tile's own on; dV += P^T dO, dK += scale dS^T Q
      dq       one block per (query tile, head, batch): every key tile up to the diagonal;
               dQ += scale dS K
All arithmetic in float32; floatX (bf16 with -DACCEL_HIP_BF16) only where tensors are read and
written. Blocks of FLASH_BLOCK threads (whole warps at 32 and 64), no warp collectives: the
kernels are the same at any warp size. The products are plain loops over shared memory: the
algorithm and its memory (no (B,NH,T,T) buffers) are llm.c's and FlashAttention-2's, the speed
of a tensor-core kernel is not claimed (never run on a GPU here).

Planted faults, for tests/test_hip.py only (a -D in a test build):
    ACCEL_HIP_PLANT_FLASH_MISSING_BARRIER  the forward's tile loop reads K, V before all are staged
    ACCEL_HIP_PLANT_FLASH_CAUSAL           the causal mask lets each query see one key of its future
    ACCEL_HIP_PLANT_FLASH_KV_HEAD          query head h reads key/value head h % NKV
*/

// threads per block of the flash kernels
constexpr int FLASH_BLOCK = 128;
// shared memory a flash kernel may take (the least of the devices' static per-block limit)
constexpr size_t FLASH_SHARED_BYTES = 48 * 1024;
// the largest tile: R query rows by R keys
constexpr int FLASH_MAX_ROWS = 32;

// Where the tensors' rows are (row strides in elements) and the tile size.
struct FlashShape {
    int B, T, NH, NKV, hs;
    long ldq;   // q, dq: GPT-2 3C, Llama NH hs
    long ldkv;  // k, v, dk, dv: GPT-2 3C, Llama NKV hs
    long ldo;   // out, dout: GPT-2 C, Llama NH hs
    int R;      // tile rows
};

__device__ __forceinline__ int flash_min(int a, int b) { return a < b ? a : b; }

// The key/value head query head h reads.
__host__ __device__ __forceinline__ int flash_kv_head(int h, int NH, int NKV) {
#ifdef ACCEL_HIP_PLANT_FLASH_KV_HEAD
    return h % NKV;
#else
    return h / (NH / NKV);
#endif
}

// Whether query t sees key t2 (causal).
__device__ __forceinline__ bool flash_visible(int t, int t2) {
#ifdef ACCEL_HIP_PLANT_FLASH_CAUSAL
    return t2 <= t + 1;
#else
    return t2 <= t;
#endif
}

// rows (n, hs) of a tensor (row stride ld) into shared memory (row stride hs + 1), as float32
__device__ __forceinline__ void flash_stage(float* dst, const floatX* src, long ld, int n, int hs) {
    for (int i = threadIdx.x; i < n * hs; i += blockDim.x)
        dst[(i / hs) * (hs + 1) + i % hs] = to_float(src[(i / hs) * ld + i % hs]);
}

// dot product of two staged rows
__device__ __forceinline__ float flash_dot(const float* a, const float* b, int hs) {
    float sum = 0.0f;
    for (int d = 0; d < hs; ++d) sum += a[d] * b[d];
    return sum;
}

// The floats of each kernel's shared arrays at tile rows R: (R, hs + 1) arrays, (R, R) ones and
// (R,) ones.
struct FlashArrays {
    int tiles, squares, rows;
    size_t bytes(int R, int hs) const {
        return (size_t(tiles) * R * (hs + 1) + size_t(squares) * R * R + size_t(rows) * R) * sizeof(float);
    }
};
constexpr FlashArrays FLASH_FORWARD{4, 1, 3}, FLASH_BACKWARD_KV{6, 2, 2}, FLASH_BACKWARD_Q{5, 1, 2};

__global__ void flash_forward_kernel(floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                     FlashShape s) {
    HIP_DYNAMIC_SHARED(float, shared)
    const int R = s.R, hs = s.hs, P = hs + 1;
    float* Qs = shared;         // (R, P) this block's query rows
    float* Ks = Qs + R * P;     // (R, P) a key tile
    float* Vs = Ks + R * P;     // (R, P) its values
    float* Os = Vs + R * P;     // (R, P) each row's output, unnormalised
    float* S = Os + R * P;      // (R, R) scores, then probabilities
    float* m = S + R * R;       // (R,) each row's running max
    float* l = m + R;           // (R,) its running sum of exp(score - m)
    float* rescale = l + R;     // (R,) exp(m_old - m_new) of the current key tile
    const int tiles = (s.T + R - 1) / R;
    const int i0 = (tiles - 1 - int(blockIdx.x)) * R, h = blockIdx.y, b = blockIdx.z;
    const int rows = flash_min(R, s.T - i0);
    const int kvh = flash_kv_head(h, s.NH, s.NKV);
    const float scale = 1.0f / sqrtf(float(hs));
    const floatX* k_b = k + long(b) * s.T * s.ldkv + kvh * hs;
    const floatX* v_b = v + long(b) * s.T * s.ldkv + kvh * hs;
    flash_stage(Qs, q + (long(b) * s.T + i0) * s.ldq + h * hs, s.ldq, rows, hs);
    // Os, m, l: each element only ever touched by the thread that sets it here
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) Os[(i / hs) * P + i % hs] = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int j0 = 0; j0 < i0 + rows; j0 += R) {
        const int cols = flash_min(R, i0 + rows - j0);
        flash_stage(Ks, k_b + long(j0) * s.ldkv, s.ldkv, cols, hs);
        flash_stage(Vs, v_b + long(j0) * s.ldkv, s.ldkv, cols, hs);
#ifndef ACCEL_HIP_PLANT_FLASH_MISSING_BARRIER
        __syncthreads();  // K, V (and the first time Q) staged
#endif
        for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
            const int r = i / cols, c = i % cols;
            S[r * R + c] = flash_visible(i0 + r, j0 + c) ? scale * flash_dot(Qs + r * P, Ks + c * P, hs) : -INFINITY;
        }
        __syncthreads();
        // online softmax: every row sees key j0 <= i0 (tiles of R), so its max is finite
        for (int r = threadIdx.x; r < rows; r += blockDim.x) {
            float* row = S + r * R;
            float new_max = m[r];
            for (int c = 0; c < cols; ++c) new_max = fmaxf(new_max, row[c]);
            float sum = 0.0f;
            for (int c = 0; c < cols; ++c) {
                row[c] = expf(row[c] - new_max);  // 0 for the masked keys
                sum += row[c];
            }
            rescale[r] = expf(m[r] - new_max);  // 0 on the first tile
            l[r] = l[r] * rescale[r] + sum;
            m[r] = new_max;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
            const int r = i / hs, d = i % hs;
            float acc = Os[r * P + d] * rescale[r];
            for (int c = 0; c < cols; ++c) acc += S[r * R + c] * Vs[c * P + d];
            Os[r * P + d] = acc;
        }
        __syncthreads();  // the next key tile overwrites K, V, S and rescale
    }
    floatX* out_i = out + (long(b) * s.T + i0) * s.ldo + h * hs;
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
        const int r = i / hs, d = i % hs;
        out_i[r * s.ldo + d] = to_floatX(Os[r * P + d] / l[r]);
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        lse[(long(b) * s.NH + h) * s.T + i0 + r] = m[r] + logf(l[r]);
}

// The rows i0 .. i0 + rows - 1 of head h: q and dout staged, their lse and D = rowsum(dout out)
__device__ void flash_stage_queries(float* Qs, float* dOs, float* lse_s, float* D, const floatX* q,
                                    const floatX* dout, const floatX* out, const float* lse, const FlashShape& s,
                                    int b, int h, int i0, int rows) {
    const long first = long(b) * s.T + i0;
    flash_stage(Qs, q + first * s.ldq + h * s.hs, s.ldq, rows, s.hs);
    flash_stage(dOs, dout + first * s.ldo + h * s.hs, s.ldo, rows, s.hs);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const floatX* dout_r = dout + (first + r) * s.ldo + h * s.hs;
        const floatX* out_r = out + (first + r) * s.ldo + h * s.hs;
        float sum = 0.0f;
        for (int d = 0; d < s.hs; ++d) sum += to_float(dout_r[d]) * to_float(out_r[d]);
        D[r] = sum;
        lse_s[r] = lse[(long(b) * s.NH + h) * s.T + i0 + r];
    }
}

// P and dS of query rows i0.. against key tile j0..: P = exp(scale q.k - lse) (0 for future
// keys), dS = P (dout.v - D), for each (r, c) by one thread
__device__ void flash_probabilities(float* Ps, float* dSs, const float* Qs, const float* dOs, const float* Ks,
                                    const float* Vs, const float* lse_s, const float* D, int R, int hs, int i0,
                                    int rows, int j0, int cols, float scale) {
    const int P = hs + 1;
    for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
        const int r = i / cols, c = i % cols;
        float p = 0.0f, ds = 0.0f;
        if (flash_visible(i0 + r, j0 + c)) {
            p = expf(scale * flash_dot(Qs + r * P, Ks + c * P, hs) - lse_s[r]);
            ds = p * (flash_dot(dOs + r * P, Vs + c * P, hs) - D[r]);
        }
        if (Ps) Ps[r * R + c] = p;
        dSs[r * R + c] = ds;
    }
}

// dk, dv (rows of stride ldkv) += the float32 sums dKs, dVs, each rounded once
__global__ void flash_backward_kv_kernel(floatX* dk, floatX* dv, const floatX* dout, const floatX* q, const floatX* k,
                                         const floatX* v, const floatX* out, const float* lse, FlashShape s) {
    HIP_DYNAMIC_SHARED(float, shared)
    const int R = s.R, hs = s.hs, P = hs + 1;
    float* Ks = shared;         // (R, P) this block's key tile
    float* Vs = Ks + R * P;     // (R, P) its values
    float* dKs = Vs + R * P;    // (R, P) their gradients, summed here
    float* dVs = dKs + R * P;   // (R, P)
    float* Qs = dVs + R * P;    // (R, P) a query tile
    float* dOs = Qs + R * P;    // (R, P) its output gradient
    float* Ps = dOs + R * P;    // (R, R) probabilities
    float* dSs = Ps + R * R;    // (R, R) the scores' gradient
    float* lse_s = dSs + R * R; // (R,)
    float* D = lse_s + R;       // (R,)
    const int j0 = blockIdx.x * R, kvh = blockIdx.y, b = blockIdx.z;  // the first key tiles see the most queries
    const int cols = flash_min(R, s.T - j0);
    const float scale = 1.0f / sqrtf(float(hs));
    const long first = (long(b) * s.T + j0) * s.ldkv + kvh * hs;
    flash_stage(Ks, k + first, s.ldkv, cols, hs);
    flash_stage(Vs, v + first, s.ldkv, cols, hs);
    // dKs, dVs: each element only ever touched by the thread that zeroes it here
    for (int i = threadIdx.x; i < cols * hs; i += blockDim.x) dKs[(i / hs) * P + i % hs] = dVs[(i / hs) * P + i % hs] = 0.0f;
    for (int h = 0; h < s.NH; ++h) {
        if (flash_kv_head(h, s.NH, s.NKV) != kvh) continue;
        for (int i0 = j0; i0 < s.T; i0 += R) {  // earlier queries see none of these keys
            const int rows = flash_min(R, s.T - i0);
            __syncthreads();  // the previous query tile is done with Q, dO, P, dS (the first: K, V staged)
            flash_stage_queries(Qs, dOs, lse_s, D, q, dout, out, lse, s, b, h, i0, rows);
            __syncthreads();
            flash_probabilities(Ps, dSs, Qs, dOs, Ks, Vs, lse_s, D, R, hs, i0, rows, j0, cols, scale);
            __syncthreads();
            for (int i = threadIdx.x; i < cols * hs; i += blockDim.x) {
                const int c = i / hs, d = i % hs;
                float sum_v = 0.0f, sum_k = 0.0f;
                for (int r = 0; r < rows; ++r) {
                    sum_v += Ps[r * R + c] * dOs[r * P + d];
                    sum_k += dSs[r * R + c] * Qs[r * P + d];
                }
                dVs[c * P + d] += sum_v;
                dKs[c * P + d] += scale * sum_k;
            }
        }
    }
    for (int i = threadIdx.x; i < cols * hs; i += blockDim.x) {
        const int c = i / hs, d = i % hs;
        floatX* dk_c = dk + first + c * s.ldkv;
        floatX* dv_c = dv + first + c * s.ldkv;
        dk_c[d] = to_floatX(to_float(dk_c[d]) + dKs[c * P + d]);
        dv_c[d] = to_floatX(to_float(dv_c[d]) + dVs[c * P + d]);
    }
}

// dq (rows of stride ldq) += the float32 sums dQs, each rounded once
__global__ void flash_backward_q_kernel(floatX* dq, const floatX* dout, const floatX* q, const floatX* k,
                                        const floatX* v, const floatX* out, const float* lse, FlashShape s) {
    HIP_DYNAMIC_SHARED(float, shared)
    const int R = s.R, hs = s.hs, P = hs + 1;
    float* Qs = shared;         // (R, P) this block's query rows
    float* dOs = Qs + R * P;    // (R, P) their output gradient
    float* dQs = dOs + R * P;   // (R, P) their gradient, summed here
    float* Ks = dQs + R * P;    // (R, P) a key tile
    float* Vs = Ks + R * P;     // (R, P) its values
    float* dSs = Vs + R * P;    // (R, R) the scores' gradient
    float* lse_s = dSs + R * R; // (R,)
    float* D = lse_s + R;       // (R,)
    const int tiles = (s.T + R - 1) / R;
    const int i0 = (tiles - 1 - int(blockIdx.x)) * R, h = blockIdx.y, b = blockIdx.z;
    const int rows = flash_min(R, s.T - i0);
    const int kvh = flash_kv_head(h, s.NH, s.NKV);
    const float scale = 1.0f / sqrtf(float(hs));
    const floatX* k_b = k + long(b) * s.T * s.ldkv + kvh * hs;
    const floatX* v_b = v + long(b) * s.T * s.ldkv + kvh * hs;
    flash_stage_queries(Qs, dOs, lse_s, D, q, dout, out, lse, s, b, h, i0, rows);
    // dQs: each element only ever touched by the thread that zeroes it here
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) dQs[(i / hs) * P + i % hs] = 0.0f;
    for (int j0 = 0; j0 < i0 + rows; j0 += R) {
        const int cols = flash_min(R, i0 + rows - j0);
        __syncthreads();  // the previous key tile is done with K, dS (the first: Q, dO, lse, D staged)
        flash_stage(Ks, k_b + long(j0) * s.ldkv, s.ldkv, cols, hs);
        flash_stage(Vs, v_b + long(j0) * s.ldkv, s.ldkv, cols, hs);
        __syncthreads();
        flash_probabilities(nullptr, dSs, Qs, dOs, Ks, Vs, lse_s, D, R, hs, i0, rows, j0, cols, scale);
        __syncthreads();
        for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
            const int r = i / hs, d = i % hs;
            float sum = 0.0f;
            for (int c = 0; c < cols; ++c) sum += dSs[r * R + c] * Ks[c * P + d];
            dQs[r * P + d] += scale * sum;
        }
    }
    floatX* dq_i = dq + (long(b) * s.T + i0) * s.ldq + h * hs;
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
        const int r = i / hs, d = i % hs;
        dq_i[r * s.ldq + d] = to_floatX(to_float(dq_i[r * s.ldq + d]) + dQs[r * P + d]);
    }
}

// --- the host side ------------------------------------------------------------------------------

// The largest tile (a power of two up to FLASH_MAX_ROWS) whose arrays fit; 0 when none does
int flash_rows(const FlashArrays& arrays, int hs) {
    for (int R = FLASH_MAX_ROWS; R >= 1; R /= 2)
        if (arrays.bytes(R, hs) <= FLASH_SHARED_BYTES) return R;
    return 0;
}

// s with its tile for these arrays, or false (the error kept) when the head is too large
bool flash_tile(Context* c, FlashShape& s, const FlashArrays& arrays, const char* where) {
    s.R = flash_rows(arrays, s.hs);
    if (s.R == 0 && c->error.empty())
        c->error = std::string(where) + ": head size " + std::to_string(s.hs) + " does not fit in shared memory";
    return s.R > 0;
}

dim3 flash_grid(const FlashShape& s, int heads) {
    return dim3(unsigned((s.T + s.R - 1) / s.R), unsigned(heads), unsigned(s.B));
}

void flash_forward(Context* c, floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v,
                   FlashShape s, const char* where) {
    if (long(s.B) * s.T * s.NH * s.hs == 0 || !flash_tile(c, s, FLASH_FORWARD, where)) return;
    hipLaunchKernelGGL(flash_forward_kernel, flash_grid(s, s.NH), dim3(FLASH_BLOCK), FLASH_FORWARD.bytes(s.R, s.hs), 0,
                       out, lse, q, k, v, s);
    check_launch(c, where);
}

void flash_backward(Context* c, floatX* dq, floatX* dk, floatX* dv, const floatX* dout, const floatX* q,
                    const floatX* k, const floatX* v, const floatX* out, const float* lse, FlashShape s,
                    const char* where) {
    if (long(s.B) * s.T * s.NH * s.hs == 0 || !flash_tile(c, s, FLASH_BACKWARD_KV, where)) return;
    hipLaunchKernelGGL(flash_backward_kv_kernel, flash_grid(s, s.NKV), dim3(FLASH_BLOCK),
                       FLASH_BACKWARD_KV.bytes(s.R, s.hs), 0, dk, dv, dout, q, k, v, out, lse, s);
    check_launch(c, where);
    if (!flash_tile(c, s, FLASH_BACKWARD_Q, where)) return;
    hipLaunchKernelGGL(flash_backward_q_kernel, flash_grid(s, s.NH), dim3(FLASH_BLOCK),
                       FLASH_BACKWARD_Q.bytes(s.R, s.hs), 0, dq, dout, q, k, v, out, lse, s);
    check_launch(c, where);
}

// --- flash: the table's entries ------------------------------------------------------------------

ACCEL_HIP_API void accel_hip_flash_attention_forward(void* ctx, floatX* out, float* lse, const floatX* inp, int B,
                                                     int T, int C, int NH) {
    // GPT-2's form: q, k, v the thirds of inp's rows
    const FlashShape s{B, T, NH, NH, C / NH, 3L * C, 3L * C, C, 0};
    flash_forward(context(ctx), out, lse, inp, inp + C, inp + 2 * C, s, "flash_attention_forward");
}

ACCEL_HIP_API void accel_hip_flash_attention_backward(void* ctx, floatX* dinp, const floatX* dout, const floatX* inp,
                                                      const floatX* out, const float* lse, int B, int T, int C,
                                                      int NH) {
    const FlashShape s{B, T, NH, NH, C / NH, 3L * C, 3L * C, C, 0};
    flash_backward(context(ctx), dinp, dinp + C, dinp + 2 * C, dout, inp, inp + C, inp + 2 * C, out, lse, s,
                   "flash_attention_backward");
}

ACCEL_HIP_API void accel_hip_flash_attention_gqa_forward(void* ctx, floatX* out, float* lse, const floatX* q,
                                                         const floatX* k, const floatX* v, int B, int T, int NH,
                                                         int NKV, int hs) {
    const FlashShape s{B, T, NH, NKV, hs, long(NH) * hs, long(NKV) * hs, long(NH) * hs, 0};
    flash_forward(context(ctx), out, lse, q, k, v, s, "flash_attention_gqa_forward");
}

ACCEL_HIP_API void accel_hip_flash_attention_gqa_backward(void* ctx, floatX* dq, floatX* dk, floatX* dv,
                                                          const floatX* dout, const floatX* q, const floatX* k,
                                                          const floatX* v, const floatX* out, const float* lse, int B,
                                                          int T, int NH, int NKV, int hs) {
    const FlashShape s{B, T, NH, NKV, hs, long(NH) * hs, long(NKV) * hs, long(NH) * hs, 0};
    flash_backward(context(ctx), dq, dk, dv, dout, q, k, v, out, lse, s, "flash_attention_gqa_backward");
}
