// accel/metal/gpt2.metal — GPT-2 and Llama training in Metal, the kernels of the backend table
// (accel/backend.pxd) for both families: semantics and shapes are the CPU kernels' of
// kernels/*.pxd, backward kernels ADD into their gradients. The host side, which picks grids and
// binds arguments, is accel/metal/host.c. Split by what the kernels are, as accel/hip's:
//     gpt2.metal    what every kernel shares (floatX, the threadgroup reductions) and the groups
//                   core (fill, the sums to the host, AdamW), linear (matmul, residual), gpt2
//                   (encoder, LayerNorm, llm.c's attention, GELU, softmax and cross-entropy) and
//                   mixed (fp16 and bf16: the parameters from the float32 master weights)
//     llama.metal   the Llama family's layers (group llama) and the classifier (group classifier)
//     flash.metal   flash attention, GPT-2's form and Llama's (group flash)
// gpt2.metal #includes the other two at its end, so the three are one library (one translation
// unit): `xcrun metal -c gpt2.metal` follows the includes, and so does the CPU emulator
// (accel/emu/msl_rewrite.py); Metal compiling source at run time (metal_runtime.m's
// newLibraryWithSource) follows none, so metal.pyx hands it the text with the includes spliced
// in, by the emulator's own splice (#line directives keep every line's file and number).
//
// Dimension letters: B batch, T time, C channels, OC output channels, NH heads, NKV key/value
// heads, hs head size, V vocabulary, Vp padded vocabulary (row stride of logits and probs),
// BT = B * T.
//
// Metal compiles with fast math by default. Precise math where it matters to the oracle's
// tolerance: GELU's tanh, the exponentials of the softmaxes, SwiGLU and the classifier, the
// logs of the losses, the square roots of the norms. Sums run in a fixed order (no float
// atomics), so results are deterministic.
//
// Precision: floatX (below) is the element type of every argument accel/spec.py declares floatX
// (activations, the parameters the kernels read, activation gradients): float, or half
// (ACCEL_METAL_FP16) or bfloat (ACCEL_METAL_BF16, MSL 3.1), fixed when the library is compiled
// (metal_runtime.m passes the macro, `make metal` builds a metallib per precision). Everything
// declared float stays float at every precision: parameter gradients, statistics (mean, rstd),
// losses, probabilities, lse, AdamW's state and the master weights. Arithmetic is float at every
// precision: a kernel reads float(x[i]), computes in float and rounds each output once,
// floatX(value); a gradient it adds into is read, added to in float, and rounded once. At fp32
// every such conversion is the identity, so the fp32 kernels compute what they always did.
// What one kernel of an entry hands the next stays float (attention's scores, probabilities,
// datt and dpreatt: host.c's scratch). The mixed group's kernels are at the end, before the
// includes.
//
// Conventions: a buffer's [[buffer(n)]] follows the table entry's argument order, outputs
// first; scalars come after the buffers as `constant T&`. Kernels that sum over a row run one
// threadgroup per row and reduce through simdgroups (simd_sum) and threadgroup memory; never
// assume 32 lanes: the simdgroup layout comes in through attributes.
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

#if defined(ACCEL_METAL_FP16)
typedef half floatX;
#elif defined(ACCEL_METAL_BF16)
typedef bfloat floatX;
#else
typedef float floatX;
#endif

constant float LAYERNORM_EPS = 1e-5f;
constant float GELU_SCALING_FACTOR = 0.7978845608028654f;  // sqrt(2/pi)
constant float GELU_CUBIC = 0.044715f;

// ---- reductions over a threadgroup ---------------------------------------------------------

// The sum of v over the threadgroup, returned to every thread; every thread adds the simdgroup
// totals in the same order, so all get the same bits. partial: one float per simdgroup.
float threadgroup_sum(float v, threadgroup float* partial, uint simd, uint lane, uint num_simds) {
    v = simd_sum(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // readers of a previous call are done
    if (lane == 0) partial[simd] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < num_simds; ++s) total += partial[s];
    return total;
}

// The same with max.
float threadgroup_max(float v, threadgroup float* partial, uint simd, uint lane, uint num_simds) {
    v = simd_max(v);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) partial[simd] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = -INFINITY;
    for (uint s = 0; s < num_simds; ++s) total = max(total, partial[s]);
    return total;
}

// ---- memory and loss bookkeeping -----------------------------------------------------------

// out (n,) = value. Grid-stride: any grid covers any n.
kernel void fill(device float* out [[buffer(0)]],
                 constant float& value [[buffer(1)]],
                 constant uint& n [[buffer(2)]],
                 uint i [[thread_position_in_grid]],
                 uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) out[i] = value;
}

// partials (groups,) = per threadgroup, the sum of x (or of x squared) over a grid-stride
// share of n; the host adds the partials in double.
kernel void sum_partials(device float* partials [[buffer(0)]],
                         device const float* x [[buffer(1)]],
                         constant uint& n [[buffer(2)]],
                         constant int& square [[buffer(3)]],
                         uint i [[thread_position_in_grid]],
                         uint stride [[threads_per_grid]],
                         uint group [[threadgroup_position_in_grid]],
                         uint simd [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float total = 0.0f;
    for (; i < n; i += stride) total += square ? x[i] * x[i] : x[i];
    total = threadgroup_sum(total, partial, simd, lane, num_simds);
    if (simd == 0 && lane == 0) partials[group] = total;
}

// One parameter's AdamW update; returns its new value. beta1_correction = 1 - beta1^t,
// beta2_correction = 1 - beta2^t.
float adamw_one(device float* params, device float* m, device float* v, device const float* grads, uint i,
                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                float beta1_correction, float beta2_correction) {
    float grad = grads[i] * grad_scale;
    float m_i = beta1 * m[i] + (1.0f - beta1) * grad;
    float v_i = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    m[i] = m_i;
    v[i] = v_i;
    float m_hat = m_i / beta1_correction;
    float v_hat = v_i / beta2_correction;
    params[i] = params[i] - lr * (m_hat / (precise::sqrt(v_hat) + eps) + weight_decay * params[i]);
    return params[i];
}

// AdamW over n parameters.
kernel void adamw_update(device float* params [[buffer(0)]],
                         device float* m [[buffer(1)]],
                         device float* v [[buffer(2)]],
                         device const float* grads [[buffer(3)]],
                         constant uint& n [[buffer(4)]],
                         constant float& lr [[buffer(5)]],
                         constant float& beta1 [[buffer(6)]],
                         constant float& beta2 [[buffer(7)]],
                         constant float& eps [[buffer(8)]],
                         constant float& weight_decay [[buffer(9)]],
                         constant float& grad_scale [[buffer(10)]],
                         constant float& beta1_correction [[buffer(11)]],
                         constant float& beta2_correction [[buffer(12)]],
                         uint i [[thread_position_in_grid]],
                         uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride)
        adamw_one(params, m, v, grads, i, lr, beta1, beta2, eps, weight_decay, grad_scale, beta1_correction,
                  beta2_correction);
}

// ---- encoder -------------------------------------------------------------------------------

// out (B,T,C) = wte[inp] + wpe[t]; grid (C, BT).
kernel void encoder_forward(device floatX* out [[buffer(0)]],
                            device const int* inp [[buffer(1)]],
                            device const floatX* wte [[buffer(2)]],
                            device const floatX* wpe [[buffer(3)]],
                            constant int& T [[buffer(4)]],
                            constant int& C [[buffer(5)]],
                            uint2 pos [[thread_position_in_grid]]) {
    uint c = pos.x, bt = pos.y;
    out[(ulong)bt * C + c] = floatX(float(wte[(ulong)inp[bt] * C + c]) + float(wpe[(ulong)(bt % T) * C + c]));
}

// dwte (Vp,C) += dout summed by token; grid (C): one thread per channel walks the positions in
// order, so positions sharing a token never race.
kernel void encoder_backward_wte(device float* dwte [[buffer(0)]],
                                 device const floatX* dout [[buffer(1)]],
                                 device const int* inp [[buffer(2)]],
                                 constant int& BT [[buffer(3)]],
                                 constant int& C [[buffer(4)]],
                                 uint c [[thread_position_in_grid]]) {
    for (int bt = 0; bt < BT; ++bt) dwte[(ulong)inp[bt] * C + c] += float(dout[(ulong)bt * C + c]);
}

// dwpe (maxT,C) += dout summed over the batch; grid (C, T).
kernel void encoder_backward_wpe(device float* dwpe [[buffer(0)]],
                                 device const floatX* dout [[buffer(1)]],
                                 constant int& B [[buffer(2)]],
                                 constant int& T [[buffer(3)]],
                                 constant int& C [[buffer(4)]],
                                 uint2 pos [[thread_position_in_grid]]) {
    uint c = pos.x, t = pos.y;
    float acc = dwpe[(ulong)t * C + c];
    for (int b = 0; b < B; ++b) acc += float(dout[((ulong)b * T + t) * C + c]);
    dwpe[(ulong)t * C + c] = acc;
}

// ---- layernorm -----------------------------------------------------------------------------

// out (B,T,C), mean, rstd (B,T); one threadgroup per position.
kernel void layernorm_forward(device floatX* out [[buffer(0)]],
                              device float* mean [[buffer(1)]],
                              device float* rstd [[buffer(2)]],
                              device const floatX* inp [[buffer(3)]],
                              device const floatX* weight [[buffer(4)]],
                              device const floatX* bias [[buffer(5)]],
                              constant int& C [[buffer(6)]],
                              uint bt [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint num_threads [[threads_per_threadgroup]],
                              uint simd [[simdgroup_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]],
                              uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const floatX* x = inp + (ulong)bt * C;
    device floatX* out_bt = out + (ulong)bt * C;
    float sum = 0.0f;
    for (int i = tid; i < C; i += num_threads) sum += float(x[i]);
    float m = threadgroup_sum(sum, partial, simd, lane, num_simds) / C;
    // variance from the shifted values (two passes), as the CPU kernel
    float var = 0.0f;
    for (int i = tid; i < C; i += num_threads) {
        float shift = float(x[i]) - m;
        var += shift * shift;
    }
    var = threadgroup_sum(var, partial, simd, lane, num_simds) / C;
    float s = 1.0f / precise::sqrt(var + LAYERNORM_EPS);
    for (int i = tid; i < C; i += num_threads) out_bt[i] = floatX((s * (float(x[i]) - m)) * float(weight[i]) + float(bias[i]));
    if (tid == 0) {
        mean[bt] = m;
        rstd[bt] = s;
    }
}

// dinp (B,T,C) += ...; one threadgroup per position.
kernel void layernorm_backward_dinp(device floatX* dinp [[buffer(0)]],
                                    device const floatX* dout [[buffer(1)]],
                                    device const floatX* inp [[buffer(2)]],
                                    device const floatX* weight [[buffer(3)]],
                                    device const float* mean [[buffer(4)]],
                                    device const float* rstd [[buffer(5)]],
                                    constant int& C [[buffer(6)]],
                                    uint bt [[threadgroup_position_in_grid]],
                                    uint tid [[thread_index_in_threadgroup]],
                                    uint num_threads [[threads_per_threadgroup]],
                                    uint simd [[simdgroup_index_in_threadgroup]],
                                    uint lane [[thread_index_in_simdgroup]],
                                    uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const floatX* x = inp + (ulong)bt * C;
    device const floatX* dout_bt = dout + (ulong)bt * C;
    device floatX* dinp_bt = dinp + (ulong)bt * C;
    float m = mean[bt], s = rstd[bt];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int i = tid; i < C; i += num_threads) {
        float dnorm = float(weight[i]) * float(dout_bt[i]);
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((float(x[i]) - m) * s);
    }
    float dnorm_mean = threadgroup_sum(dnorm_sum, partial, simd, lane, num_simds) / C;
    float dnorm_norm_mean = threadgroup_sum(dnorm_norm_sum, partial, simd, lane, num_simds) / C;
    for (int i = tid; i < C; i += num_threads) {
        float norm = (float(x[i]) - m) * s;
        float dnorm = float(weight[i]) * float(dout_bt[i]);
        dinp_bt[i] = floatX(float(dinp_bt[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
}

// dweight, dbias (C,) += sums over the positions; one thread per channel, in whole
// threadgroups (the grid is rounded up: threads past C have nothing to do).
kernel void layernorm_backward_params(device float* dweight [[buffer(0)]],
                                      device float* dbias [[buffer(1)]],
                                      device const floatX* dout [[buffer(2)]],
                                      device const floatX* inp [[buffer(3)]],
                                      device const float* mean [[buffer(4)]],
                                      device const float* rstd [[buffer(5)]],
                                      constant int& BT [[buffer(6)]],
                                      constant int& C [[buffer(7)]],
                                      uint c [[thread_position_in_grid]]) {
    if (c >= uint(C)) return;
    float dw = 0.0f, db = 0.0f;
    for (int bt = 0; bt < BT; ++bt) {
        float d = float(dout[(ulong)bt * C + c]);
        db += d;
        dw += (float(inp[(ulong)bt * C + c]) - mean[bt]) * rstd[bt] * d;
    }
    dweight[c] += dw;
    dbias[c] += db;
}

// ---- matmul --------------------------------------------------------------------------------
// (dev/metal/ab.py replaces this section, up to bias_backward, with a variant of dev/metal/)

enum {
    TILE = 64,          // outputs per threadgroup side
    TILE_K = 32,        // the K-slice of A and B held in threadgroup memory at a time
    TILE_THREADS = 16,  // threads per threadgroup side: 256 threads, 8 simdgroups of 32
    SUBTILES = (TILE / 8) * (TILE / 8),  // 8x8 blocks of outputs in a tile
    SUBTILES_PER_SIMDGROUP_MAX = 16      // 64 blocks over 8 simdgroups of 32 (or 4 of 64)
};

// out (M,N) = A B (+ bias), or += with accumulate, where A(m,k) = a[m*a_row + k*a_k] and
// B(k,n) = b[k*b_k + n*b_col]: the strides give every transpose the layers need. A threadgroup
// of 16 x 16 threads computes a 64 x 64 tile of out as 64 blocks of 8 x 8 in simdgroup matrices,
// simdgroup s taking blocks s, s + (simdgroups), ...; the K-slices of A and B are staged in
// threadgroup memory (zeros past M, N or K, so any shape and any strides), and the finished
// tile goes out through the same threadgroup memory, which masks the edges and adds bias and out.
// Threadgroup memory: 16 KB of staging, under the 32 KB every Metal GPU has. A and B are floatX,
// staged as float: the products and sums are float32 at every precision (simdgroup_float8x8),
// and out (floatX, or float for a parameter gradient: OutT) is rounded once.
template <typename OutT>
void matmul_tile(device OutT* out, device const floatX* a, device const floatX* b, device const floatX* bias, int M,
                 int N, int K, int a_row, int a_k, int b_k, int b_col, int accumulate, int has_bias, uint2 group,
                 uint t, uint simd, uint num_simds, threadgroup float* staging, threadgroup float* identity_tile) {
    threadgroup float* a_tile = staging;                   // a_tile[row * TILE_K + k]
    threadgroup float* b_tile = staging + TILE * TILE_K;   // b_tile[k * TILE + col]
    threadgroup float* out_tile = staging;                 // out_tile[row * TILE + col], after the slices
    int row0 = group.y * TILE, col0 = group.x * TILE;
    int blocks = SUBTILES / num_simds;
    if (t < 64) identity_tile[t] = t / 8 == t % 8 ? 1.0f : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_float8x8 identity;  // adds a slice's sum into the total: I s + acc
    simdgroup_load(identity, identity_tile, 8);
    simdgroup_float8x8 acc[SUBTILES_PER_SIMDGROUP_MAX];
    for (int j = 0; j < blocks; ++j) acc[j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        for (int e = t; e < TILE * TILE_K; e += TILE_THREADS * TILE_THREADS) {
            int r = e / TILE_K, k = e % TILE_K;  // A: neighbouring threads, neighbouring k
            a_tile[e] = row0 + r < M && k0 + k < K ? float(a[(long)(row0 + r) * a_row + (long)(k0 + k) * a_k]) : 0.0f;
            int kb = e / TILE, c = e % TILE;     // B: neighbouring threads, neighbouring columns
            b_tile[e] = k0 + kb < K && col0 + c < N ? float(b[(long)(k0 + kb) * b_k + (long)(col0 + c) * b_col]) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // each slice summed on its own, then added: two-level summation keeps the rounding
        // error of long sums (K = 50304 for the logits' dinp) within the oracle's tolerance
        for (int j = 0; j < blocks; ++j) {
            int block = simd + j * num_simds, r8 = block / (TILE / 8) * 8, c8 = block % (TILE / 8) * 8;
            simdgroup_float8x8 slice = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            for (int k8 = 0; k8 < TILE_K; k8 += 8) {
                simdgroup_float8x8 a_block, b_block;
                simdgroup_load(a_block, a_tile + r8 * TILE_K + k8, TILE_K);
                simdgroup_load(b_block, b_tile + k8 * TILE + c8, TILE);
                simdgroup_multiply_accumulate(slice, a_block, b_block, slice);
            }
            simdgroup_multiply_accumulate(acc[j], identity, slice, acc[j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are read before the next load
    }
    for (int j = 0; j < blocks; ++j) {
        int block = simd + j * num_simds;
        simdgroup_store(acc[j], out_tile + block / (TILE / 8) * 8 * TILE + block % (TILE / 8) * 8, TILE);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = t; e < TILE * TILE; e += TILE_THREADS * TILE_THREADS) {
        int row = row0 + e / TILE, col = col0 + e % TILE;
        if (row < M && col < N) {
            device OutT* o = out + (long)row * N + col;
            float v = has_bias ? out_tile[e] + float(bias[col]) : out_tile[e];
            *o = OutT(accumulate ? float(*o) + v : v);
        }
    }
}

// out floatX: the forward's output, dinp
kernel void matmul(device floatX* out [[buffer(0)]],
                   device const floatX* a [[buffer(1)]],
                   device const floatX* b [[buffer(2)]],
                   device const floatX* bias [[buffer(3)]],
                   constant int& M [[buffer(4)]],
                   constant int& N [[buffer(5)]],
                   constant int& K [[buffer(6)]],
                   constant int& a_row [[buffer(7)]],
                   constant int& a_k [[buffer(8)]],
                   constant int& b_k [[buffer(9)]],
                   constant int& b_col [[buffer(10)]],
                   constant int& accumulate [[buffer(11)]],
                   constant int& has_bias [[buffer(12)]],
                   uint2 group [[threadgroup_position_in_grid]],
                   uint t [[thread_index_in_threadgroup]],
                   uint simd [[simdgroup_index_in_threadgroup]],
                   uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float staging[TILE * TILE];  // A's slice then B's (TILE x TILE_K each), then out's tile
    threadgroup float identity_tile[8 * 8];
    matmul_tile(out, a, b, bias, M, N, K, a_row, a_k, b_k, b_col, accumulate, has_bias, group, t, simd, num_simds,
                staging, identity_tile);
}

// out float: dweight (the parameter gradients are float32 at every precision)
kernel void matmul_float_out(device float* out [[buffer(0)]],
                             device const floatX* a [[buffer(1)]],
                             device const floatX* b [[buffer(2)]],
                             device const floatX* bias [[buffer(3)]],
                             constant int& M [[buffer(4)]],
                             constant int& N [[buffer(5)]],
                             constant int& K [[buffer(6)]],
                             constant int& a_row [[buffer(7)]],
                             constant int& a_k [[buffer(8)]],
                             constant int& b_k [[buffer(9)]],
                             constant int& b_col [[buffer(10)]],
                             constant int& accumulate [[buffer(11)]],
                             constant int& has_bias [[buffer(12)]],
                             uint2 group [[threadgroup_position_in_grid]],
                             uint t [[thread_index_in_threadgroup]],
                             uint simd [[simdgroup_index_in_threadgroup]],
                             uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float staging[TILE * TILE];
    threadgroup float identity_tile[8 * 8];
    matmul_tile(out, a, b, bias, M, N, K, a_row, a_k, b_k, b_col, accumulate, has_bias, group, t, simd, num_simds,
                staging, identity_tile);
}

// dbias (OC,) += dout (BT,OC) summed over the rows; one thread per output channel.
kernel void bias_backward(device float* dbias [[buffer(0)]],
                          device const floatX* dout [[buffer(1)]],
                          constant int& BT [[buffer(2)]],
                          constant int& OC [[buffer(3)]],
                          uint o [[thread_position_in_grid]]) {
    float acc = 0.0f;
    for (int bt = 0; bt < BT; ++bt) acc += float(dout[(ulong)bt * OC + o]);
    dbias[o] += acc;
}

// ---- attention -----------------------------------------------------------------------------
// inp (B,T,3C) holds q, k, v; head h's part of a row is [h*hs, (h+1)*hs) of each third.
// preatt, att (B,NH,T,T): row t of head bh holds columns t2 <= t (causal), zero above.
// What one kernel of an entry hands the next goes through float: the scores, the probabilities
// the values kernel reads, the backward's datt and dpreatt (host.c: at fp32 the outputs
// themselves, at fp16 and bf16 a float scratch buffer), so each output is the float32 value the
// CPU computes, rounded once.

// scores = scale q k^T (zero above the diagonal); grid (T [t2], T [t], B*NH).
kernel void attention_scores(device float* scores [[buffer(0)]],
                             device const floatX* inp [[buffer(1)]],
                             constant int& T [[buffer(2)]],
                             constant int& C [[buffer(3)]],
                             constant int& NH [[buffer(4)]],
                             constant float& scale [[buffer(5)]],
                             uint3 pos [[thread_position_in_grid]]) {
    int t2 = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    float score = 0.0f;
    if (t2 <= t) {
        device const floatX* q = inp + ((ulong)b * T + t) * 3 * C + h * hs;
        device const floatX* k = inp + ((ulong)b * T + t2) * 3 * C + C + h * hs;
        for (int i = 0; i < hs; ++i) score += float(q[i]) * float(k[i]);
        score *= scale;
    }
    scores[((ulong)bh * T + t) * T + t2] = score;
}

// att = softmax of the scores over t2 <= t (zero above); with write_preatt also preatt = the
// scores rounded, with keep_probs the scores replaced by the probabilities in float (both at fp16
// and bf16, where the scores are host.c's float scratch; at fp32 the scores are preatt, or att
// itself: in place, each thread reading its elements before it writes them); one threadgroup per
// row, grid (T, B*NH).
kernel void attention_softmax(device floatX* att [[buffer(0)]],
                              device floatX* preatt [[buffer(1)]],
                              device float* scores [[buffer(2)]],
                              constant int& T [[buffer(3)]],
                              constant int& write_preatt [[buffer(4)]],
                              constant int& keep_probs [[buffer(5)]],
                              uint2 group [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint num_threads [[threads_per_threadgroup]],
                              uint simd [[simdgroup_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]],
                              uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    int t = group.x;
    ulong row = ((ulong)group.y * T + t) * T;
    device float* pre_t = scores + row;
    device floatX* att_t = att + row;
    float maxval = -INFINITY;
    for (int t2 = tid; t2 <= t; t2 += num_threads) maxval = max(maxval, pre_t[t2]);
    maxval = threadgroup_max(maxval, partial, simd, lane, num_simds);
    float sum = 0.0f;
    for (int t2 = tid; t2 <= t; t2 += num_threads) sum += precise::exp(pre_t[t2] - maxval);
    float inv = 1.0f / threadgroup_sum(sum, partial, simd, lane, num_simds);
    for (int t2 = tid; t2 < T; t2 += num_threads) {
        float score = pre_t[t2];
        float p = t2 <= t ? precise::exp(score - maxval) * inv : 0.0f;
        if (write_preatt) preatt[row + t2] = floatX(score);
        if (keep_probs) pre_t[t2] = p;
        att_t[t2] = floatX(p);
    }
}

// out (B,T,C) = att v, att the probabilities in float; grid (hs, T, B*NH).
kernel void attention_values(device floatX* out [[buffer(0)]],
                             device const float* att [[buffer(1)]],
                             device const floatX* inp [[buffer(2)]],
                             constant int& T [[buffer(3)]],
                             constant int& C [[buffer(4)]],
                             constant int& NH [[buffer(5)]],
                             uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    device const float* att_t = att + ((ulong)bh * T + t) * T;
    device const floatX* v = inp + (ulong)b * T * 3 * C + 2 * C + h * hs + i;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += att_t[t2] * float(v[(ulong)t2 * 3 * C]);
    out[((ulong)b * T + t) * C + h * hs + i] = floatX(acc);
}

// datt[t][t2] += dout_t . v_t2 (t2 <= t), and with keep_float datt_float the same unrounded;
// grid (T [t2], T [t], B*NH).
kernel void attention_backward_datt(device floatX* datt [[buffer(0)]],
                                    device float* datt_float [[buffer(1)]],
                                    device const floatX* dout [[buffer(2)]],
                                    device const floatX* inp [[buffer(3)]],
                                    constant int& T [[buffer(4)]],
                                    constant int& C [[buffer(5)]],
                                    constant int& NH [[buffer(6)]],
                                    constant int& keep_float [[buffer(7)]],
                                    uint3 pos [[thread_position_in_grid]]) {
    int t2 = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    if (t2 > t) return;
    device const floatX* dout_t = dout + ((ulong)b * T + t) * C + h * hs;
    device const floatX* v = inp + ((ulong)b * T + t2) * 3 * C + 2 * C + h * hs;
    float acc = 0.0f;
    for (int i = 0; i < hs; ++i) acc += float(dout_t[i]) * float(v[i]);
    const ulong at = ((ulong)bh * T + t) * T + t2;
    const float d = float(datt[at]) + acc;
    datt[at] = floatX(d);
    if (keep_float) datt_float[at] = d;
}

// dv[t2] += sum over t >= t2 of att[t][t2] dout_t; grid (hs, T [t2], B*NH).
kernel void attention_backward_dv(device floatX* dinp [[buffer(0)]],
                                  device const floatX* dout [[buffer(1)]],
                                  device const floatX* att [[buffer(2)]],
                                  constant int& T [[buffer(3)]],
                                  constant int& C [[buffer(4)]],
                                  constant int& NH [[buffer(5)]],
                                  uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t2 = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    device const floatX* att_bh = att + (ulong)bh * T * T;
    float acc = 0.0f;
    for (int t = t2; t < T; ++t) acc += float(att_bh[(ulong)t * T + t2]) * float(dout[((ulong)b * T + t) * C + h * hs + i]);
    const ulong at = ((ulong)b * T + t2) * 3 * C + 2 * C + h * hs + i;
    dinp[at] = floatX(float(dinp[at]) + acc);
}

// dpreatt[t][t2] += att[t][t2] (datt[t][t2] - sum_t3 att[t][t3] datt[t][t3]), datt in float,
// and with keep_float dpreatt_float the same unrounded; one threadgroup per row, grid (T, B*NH).
kernel void attention_backward_dpreatt(device floatX* dpreatt [[buffer(0)]],
                                       device float* dpreatt_float [[buffer(1)]],
                                       device const float* datt [[buffer(2)]],
                                       device const floatX* att [[buffer(3)]],
                                       constant int& T [[buffer(4)]],
                                       constant int& keep_float [[buffer(5)]],
                                       uint2 group [[threadgroup_position_in_grid]],
                                       uint tid [[thread_index_in_threadgroup]],
                                       uint num_threads [[threads_per_threadgroup]],
                                       uint simd [[simdgroup_index_in_threadgroup]],
                                       uint lane [[thread_index_in_simdgroup]],
                                       uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    int t = group.x;
    ulong row = ((ulong)group.y * T + t) * T;
    float dot = 0.0f;
    for (int t2 = tid; t2 <= t; t2 += num_threads) dot += float(att[row + t2]) * datt[row + t2];
    dot = threadgroup_sum(dot, partial, simd, lane, num_simds);
    for (int t2 = tid; t2 <= t; t2 += num_threads) {
        const float d = float(dpreatt[row + t2]) + float(att[row + t2]) * (datt[row + t2] - dot);
        dpreatt[row + t2] = floatX(d);
        if (keep_float) dpreatt_float[row + t2] = d;
    }
}

// dq[t] += scale sum over t2 <= t of dpreatt[t][t2] k_t2 (dpreatt in float); grid (hs, T, B*NH).
kernel void attention_backward_dq(device floatX* dinp [[buffer(0)]],
                                  device const float* dpreatt [[buffer(1)]],
                                  device const floatX* inp [[buffer(2)]],
                                  constant int& T [[buffer(3)]],
                                  constant int& C [[buffer(4)]],
                                  constant int& NH [[buffer(5)]],
                                  constant float& scale [[buffer(6)]],
                                  uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    device const float* dpre_t = dpreatt + ((ulong)bh * T + t) * T;
    device const floatX* k = inp + (ulong)b * T * 3 * C + C + h * hs + i;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += dpre_t[t2] * float(k[(ulong)t2 * 3 * C]);
    const ulong at = ((ulong)b * T + t) * 3 * C + h * hs + i;
    dinp[at] = floatX(float(dinp[at]) + scale * acc);
}

// dk[t2] += scale sum over t >= t2 of dpreatt[t][t2] q_t (dpreatt in float); grid (hs, T [t2], B*NH).
kernel void attention_backward_dk(device floatX* dinp [[buffer(0)]],
                                  device const float* dpreatt [[buffer(1)]],
                                  device const floatX* inp [[buffer(2)]],
                                  constant int& T [[buffer(3)]],
                                  constant int& C [[buffer(4)]],
                                  constant int& NH [[buffer(5)]],
                                  constant float& scale [[buffer(6)]],
                                  uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t2 = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, hs = C / NH;
    device const float* dpre_bh = dpreatt + (ulong)bh * T * T;
    device const floatX* q = inp + (ulong)b * T * 3 * C + h * hs + i;
    float acc = 0.0f;
    for (int t = t2; t < T; ++t) acc += dpre_bh[(ulong)t * T + t2] * float(q[(ulong)t * 3 * C]);
    const ulong at = ((ulong)b * T + t2) * 3 * C + C + h * hs + i;
    dinp[at] = floatX(float(dinp[at]) + scale * acc);
}

// ---- GELU and residual (elementwise, grid-stride) ------------------------------------------

kernel void gelu_forward(device floatX* out [[buffer(0)]],
                         device const floatX* inp [[buffer(1)]],
                         constant uint& n [[buffer(2)]],
                         uint i [[thread_position_in_grid]],
                         uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) {
        float x = float(inp[i]);
        // precise::tanh: fast math's tanh is far off for large |x| (llm.c's Metal note)
        out[i] = floatX(0.5f * x * (1.0f + precise::tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x))));
    }
}

kernel void gelu_backward(device floatX* dinp [[buffer(0)]],
                          device const floatX* inp [[buffer(1)]],
                          device const floatX* dout [[buffer(2)]],
                          constant uint& n [[buffer(3)]],
                          uint i [[thread_position_in_grid]],
                          uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) {
        float x = float(inp[i]);
        float tanh_out = precise::tanh(GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x));
        float sech2 = 1.0f - tanh_out * tanh_out;
        float local_grad = 0.5f * (1.0f + tanh_out) +
                           x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBIC * x * x);
        dinp[i] = floatX(float(dinp[i]) + local_grad * float(dout[i]));
    }
}

kernel void residual_forward(device floatX* out [[buffer(0)]],
                             device const floatX* inp1 [[buffer(1)]],
                             device const floatX* inp2 [[buffer(2)]],
                             constant uint& n [[buffer(3)]],
                             uint i [[thread_position_in_grid]],
                             uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) out[i] = floatX(float(inp1[i]) + float(inp2[i]));
}

kernel void residual_backward(device floatX* dinp1 [[buffer(0)]],
                              device floatX* dinp2 [[buffer(1)]],
                              device const floatX* dout [[buffer(2)]],
                              constant uint& n [[buffer(3)]],
                              uint i [[thread_position_in_grid]],
                              uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) {
        float d = float(dout[i]);
        dinp1[i] = floatX(float(dinp1[i]) + d);
        dinp2[i] = floatX(float(dinp2[i]) + d);
    }
}

// ---- softmax and cross-entropy -------------------------------------------------------------

// probs (B,T,Vp) = softmax of logits over the first V entries, zero in the padding; one
// threadgroup per position.
kernel void softmax_forward(device float* probs [[buffer(0)]],
                            device const floatX* logits [[buffer(1)]],
                            constant int& V [[buffer(2)]],
                            constant int& Vp [[buffer(3)]],
                            uint bt [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint num_threads [[threads_per_threadgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const floatX* x = logits + (ulong)bt * Vp;
    device float* p = probs + (ulong)bt * Vp;
    float maxval = -INFINITY;
    for (int i = tid; i < V; i += num_threads) maxval = max(maxval, float(x[i]));
    maxval = threadgroup_max(maxval, partial, simd, lane, num_simds);
    float sum = 0.0f;
    for (int i = tid; i < V; i += num_threads) {
        float e = precise::exp(float(x[i]) - maxval);
        p[i] = e;
        sum += e;
    }
    float inv = 1.0f / threadgroup_sum(sum, partial, simd, lane, num_simds);
    for (int i = tid; i < Vp; i += num_threads) p[i] = i < V ? p[i] * inv : 0.0f;
}

// losses (B,T) = -log probs[target], 0 where the target is -1 (not scored); grid (BT).
kernel void crossentropy_forward(device float* losses [[buffer(0)]],
                                 device const float* probs [[buffer(1)]],
                                 device const int* targets [[buffer(2)]],
                                 constant int& Vp [[buffer(3)]],
                                 uint bt [[thread_position_in_grid]]) {
    int target = targets[bt];
    losses[bt] = target < 0 ? 0.0f : -precise::log(probs[(ulong)bt * Vp + target]);
}

// dlogits (B,T,Vp) += (probs - onehot(target)) dlosses, over the first V entries, nothing in a
// row whose target is -1 (not scored); grid (V, BT).
kernel void crossentropy_softmax_backward(device floatX* dlogits [[buffer(0)]],
                                          device const float* dlosses [[buffer(1)]],
                                          device const float* probs [[buffer(2)]],
                                          device const int* targets [[buffer(3)]],
                                          constant int& Vp [[buffer(4)]],
                                          uint2 pos [[thread_position_in_grid]]) {
    uint i = pos.x, bt = pos.y;
    int target = targets[bt];
    if (target < 0) return;
    ulong at = (ulong)bt * Vp + i;
    float dloss = dlosses[bt];
    float d = float(dlogits[at]) + probs[at] * dloss;
    if (i == uint(target)) d -= dloss;
    dlogits[at] = floatX(d);
}

// ---- mixed precision: the parameters the kernels read, from the float32 master weights --------
// (the table's "mixed" group; host.c exports it at fp16 and bf16 only)
#if defined(ACCEL_METAL_BF16)
// 16 uniform bits from (index, seed), kernels/bf16.pxd's noise16: for each seed a bijection of
// the index's low 32 bits (a multiply by an odd constant, then murmur3's finaliser)
uint noise16(ulong index, uint seed) {
    uint h = uint(index) * 0x9E3779B1u;
    h += uint(index >> 32) * 0x85EBCA77u + seed * 0xC2B2AE3Du;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h & 0xffffu;
}

// value rounded to bfloat: to nearest even when seed < 0, else stochastically (up with
// probability the dropped fraction, the bits from (index, seed)); a NaN stays a quiet NaN. The
// bit arithmetic of kernels/bf16.pxd's float_to_bf16 and float_to_bf16_stochastic, bit for bit.
floatX rounded_param(float value, ulong index, int seed) {
    const uint bits = as_type<uint>(value);
    uint rounded;
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        rounded = (bits >> 16) | 0x40u;
    else if (seed < 0)
        rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    else
        rounded = (bits + noise16(index, uint(seed))) >> 16;
    return as_type<floatX>(ushort(rounded));
}
#else
// fp16: to nearest even, whatever the seed (the master weights keep what rounding drops)
floatX rounded_param(float value, ulong index, int seed) { return floatX(value); }
#endif

// params (n,) = master (n,) rounded, element i as parameter first + i
kernel void narrow_params(device floatX* params [[buffer(0)]],
                          device const float* master [[buffer(1)]],
                          constant uint& n [[buffer(2)]],
                          constant ulong& first [[buffer(3)]],
                          constant int& seed [[buffer(4)]],
                          uint i [[thread_position_in_grid]],
                          uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) params[i] = rounded_param(master[i], first + i, seed);
}

// AdamW on the master weights, each new one rounded into params as narrow_params does with seed t
kernel void adamw_update_rounded(device floatX* params [[buffer(0)]],
                                 device float* master [[buffer(1)]],
                                 device float* m [[buffer(2)]],
                                 device float* v [[buffer(3)]],
                                 device const float* grads [[buffer(4)]],
                                 constant uint& n [[buffer(5)]],
                                 constant float& lr [[buffer(6)]],
                                 constant float& beta1 [[buffer(7)]],
                                 constant float& beta2 [[buffer(8)]],
                                 constant float& eps [[buffer(9)]],
                                 constant float& weight_decay [[buffer(10)]],
                                 constant float& grad_scale [[buffer(11)]],
                                 constant float& beta1_correction [[buffer(12)]],
                                 constant float& beta2_correction [[buffer(13)]],
                                 constant int& t [[buffer(14)]],
                                 constant ulong& first [[buffer(15)]],
                                 uint i [[thread_position_in_grid]],
                                 uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride)
        params[i] = rounded_param(adamw_one(master, m, v, grads, i, lr, beta1, beta2, eps, weight_decay, grad_scale,
                                            beta1_correction, beta2_correction),
                                  first + i, t);
}

#include "llama.metal"  // the Llama family's layers and the classifier (groups llama, classifier)
#include "flash.metal"  // the flash group: flash attention, both forms
