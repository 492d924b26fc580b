// accel/metal/llama.metal — the Llama family's layers (the table's group "llama") and the
// classifier without a probability buffer (group "classifier") in Metal. Not a translation unit
// of its own: gpt2.metal #includes it after what every kernel shares (floatX, threadgroup_sum and
// threadgroup_max, the conventions in its banner), so it builds at the three precisions
// gpt2.metal does, into the same library.
//
// Semantics are the CPU kernels' (kernels/embedding, rmsnorm, rope, swiglu, attention_gqa,
// classifier .pxd): outputs first, backward entries ADD into their gradients; at fp16 and bf16
// an entry reads floatX, computes in float and rounds each output once.
//
//     RMSNorm     one threadgroup per row, as layernorm; dweight one thread per channel
//     embedding   a gather of token rows; backward is gpt2.metal's encoder_backward_wte
//     RoPE        one thread per rotated pair (out may be inp); backward rotates by -angle, adds
//     SwiGLU      elementwise, grid-stride
//     GQA         llm.c's three kernels over grouped-query heads (scores, gpt2.metal's softmax,
//                 values), the backward's pre-softmax gradient in host.c's (B,NH,T,T) scratch;
//                 dk, dv sum over the group's query heads in head order (no atomics)
//     classifier  one threadgroup per row: the max and the sum of exp(logit - max), the loss
//                 max - logit[target] + logsum; backward recomputes the max, no probabilities
//
// Dimension letters: gpt2.metal's (NKV key/value heads divides NH).

// ---- Llama: RMSNorm ------------------------------------------------------------------------

// out (B,T,C) = inp rstd weight, rstd (B,T) = 1 / sqrt(mean of inp^2 + eps); one threadgroup
// per position.
kernel void rmsnorm_forward(device floatX* out [[buffer(0)]],
                            device float* rstd [[buffer(1)]],
                            device const floatX* inp [[buffer(2)]],
                            device const floatX* weight [[buffer(3)]],
                            constant float& eps [[buffer(4)]],
                            constant int& C [[buffer(5)]],
                            uint bt [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint num_threads [[threads_per_threadgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const floatX* x = inp + (ulong)bt * C;
    device floatX* out_bt = out + (ulong)bt * C;
    float ss = 0.0f;
    for (int i = tid; i < C; i += num_threads) ss += float(x[i]) * float(x[i]);
    ss = threadgroup_sum(ss, partial, simd, lane, num_simds);
    float s = 1.0f / precise::sqrt(ss / C + eps);
    for (int i = tid; i < C; i += num_threads) out_bt[i] = floatX((float(x[i]) * s) * float(weight[i]));
    if (tid == 0) rstd[bt] = s;
}

// dinp (B,T,C) += rstd (weight dout - norm mean(weight dout norm)), norm = inp rstd; one
// threadgroup per position.
kernel void rmsnorm_backward_dinp(device floatX* dinp [[buffer(0)]],
                                  device const floatX* dout [[buffer(1)]],
                                  device const floatX* inp [[buffer(2)]],
                                  device const floatX* weight [[buffer(3)]],
                                  device const float* rstd [[buffer(4)]],
                                  constant int& C [[buffer(5)]],
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
    float s = rstd[bt];
    float dnorm_norm_sum = 0.0f;
    for (int i = tid; i < C; i += num_threads) dnorm_norm_sum += float(weight[i]) * float(dout_bt[i]) * (float(x[i]) * s);
    float dnorm_norm_mean = threadgroup_sum(dnorm_norm_sum, partial, simd, lane, num_simds) / C;
    for (int i = tid; i < C; i += num_threads)
        dinp_bt[i] = floatX(float(dinp_bt[i]) + (float(weight[i]) * float(dout_bt[i]) - (float(x[i]) * s) * dnorm_norm_mean) * s);
}

// dweight (C,) += sum over the positions of inp rstd dout; one thread per channel, in whole
// threadgroups (threads past C have nothing to do).
kernel void rmsnorm_backward_dweight(device float* dweight [[buffer(0)]],
                                     device const floatX* dout [[buffer(1)]],
                                     device const floatX* inp [[buffer(2)]],
                                     device const float* rstd [[buffer(3)]],
                                     constant int& BT [[buffer(4)]],
                                     constant int& C [[buffer(5)]],
                                     uint c [[thread_position_in_grid]]) {
    if (c >= uint(C)) return;
    float dw = 0.0f;
    for (int bt = 0; bt < BT; ++bt) dw += (float(inp[(ulong)bt * C + c]) * rstd[bt]) * float(dout[(ulong)bt * C + c]);
    dweight[c] += dw;
}

// ---- Llama: embedding, RoPE, SwiGLU --------------------------------------------------------
// (the embedding's backward is encoder_backward_wte: the same scatter by token)

// out (B,T,C) = wte[inp]; grid (C, BT).
kernel void embedding_forward(device floatX* out [[buffer(0)]],
                              device const int* inp [[buffer(1)]],
                              device const floatX* wte [[buffer(2)]],
                              constant int& C [[buffer(3)]],
                              uint2 pos [[thread_position_in_grid]]) {
    uint c = pos.x, bt = pos.y;
    out[(ulong)bt * C + c] = wte[(ulong)inp[bt] * C + c];
}

// The pair (2i, 2i+1) of every head rotated by the angle of position t: out (B,T,NH,hs) = inp
// rotated by +angle (forward), or dinp += dout rotated by -angle (backward, `backward` 1);
// cos, sin (T, hs/2). Grid (hs/2, NH, BT): a thread reads its pair before writing it, so out
// may be inp.
kernel void rope(device floatX* out [[buffer(0)]],
                 device const floatX* inp [[buffer(1)]],
                 device const float* freqs_cos [[buffer(2)]],
                 device const float* freqs_sin [[buffer(3)]],
                 constant int& T [[buffer(4)]],
                 constant int& NH [[buffer(5)]],
                 constant int& hs [[buffer(6)]],
                 constant int& backward [[buffer(7)]],
                 uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, h = pos.y, bt = pos.z, half_hs = hs / 2;
    float c = freqs_cos[(bt % T) * half_hs + i], s = freqs_sin[(bt % T) * half_hs + i];
    ulong at = ((ulong)bt * NH + h) * hs + 2 * i;
    float x0 = float(inp[at]), x1 = float(inp[at + 1]);
    if (backward) {
        out[at] = floatX(float(out[at]) + (x0 * c + x1 * s));
        out[at + 1] = floatX(float(out[at + 1]) + (x1 * c - x0 * s));
    } else {
        out[at] = floatX(x0 * c - x1 * s);
        out[at + 1] = floatX(x0 * s + x1 * c);
    }
}

// out (N,) = silu(a) b, silu(a) = a / (1 + exp(-a)).
kernel void swiglu_forward(device floatX* out [[buffer(0)]],
                           device const floatX* a [[buffer(1)]],
                           device const floatX* b [[buffer(2)]],
                           constant uint& n [[buffer(3)]],
                           uint i [[thread_position_in_grid]],
                           uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) {
        float x = float(a[i]);
        out[i] = floatX(x / (1.0f + precise::exp(-x)) * float(b[i]));
    }
}

// da += dout b s (1 + a (1 - s)), db += dout a s, s = sigmoid(a).
kernel void swiglu_backward(device floatX* da [[buffer(0)]],
                            device floatX* db [[buffer(1)]],
                            device const floatX* dout [[buffer(2)]],
                            device const floatX* a [[buffer(3)]],
                            device const floatX* b [[buffer(4)]],
                            constant uint& n [[buffer(5)]],
                            uint i [[thread_position_in_grid]],
                            uint stride [[threads_per_grid]]) {
    for (; i < n; i += stride) {
        float x = float(a[i]), d = float(dout[i]);
        float s = 1.0f / (1.0f + precise::exp(-x));
        da[i] = floatX(float(da[i]) + d * float(b[i]) * s * (1.0f + x * (1.0f - s)));
        db[i] = floatX(float(db[i]) + d * x * s);
    }
}

// ---- Llama: grouped-query attention --------------------------------------------------------
// q (B,T,NH,hs), k, v (B,T,NKV,hs): query head h reads key/value head h / (NH/NKV).
// att (B,NH,T,T): the softmax's rows, t2 <= t (causal), zero above. The forward's scores (at fp16
// and bf16) and the backward's (the gradient of the pre-softmax scores) live in a (B,NH,T,T)
// float scratch buffer of host.c's.

// scores = scale q k^T, zero above the diagonal (then attention_softmax: at fp32 in place, the
// scores being att); grid (T [t2], T [t], B*NH).
kernel void attention_gqa_scores(device float* scores [[buffer(0)]],
                                 device const floatX* q [[buffer(1)]],
                                 device const floatX* k [[buffer(2)]],
                                 constant int& T [[buffer(3)]],
                                 constant int& NH [[buffer(4)]],
                                 constant int& NKV [[buffer(5)]],
                                 constant int& hs [[buffer(6)]],
                                 constant float& scale [[buffer(7)]],
                                 uint3 pos [[thread_position_in_grid]]) {
    int t2 = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    float score = 0.0f;
    if (t2 <= t) {
        device const floatX* q_t = q + (((ulong)b * T + t) * NH + h) * hs;
        device const floatX* k_t2 = k + (((ulong)b * T + t2) * NKV + kvh) * hs;
        for (int i = 0; i < hs; ++i) score += float(q_t[i]) * float(k_t2[i]);
        score *= scale;
    }
    scores[((ulong)bh * T + t) * T + t2] = score;
}

// out (B,T,NH,hs) = att v, att the probabilities in float; grid (hs, T, B*NH).
kernel void attention_gqa_values(device floatX* out [[buffer(0)]],
                                 device const float* att [[buffer(1)]],
                                 device const floatX* v [[buffer(2)]],
                                 constant int& T [[buffer(3)]],
                                 constant int& NH [[buffer(4)]],
                                 constant int& NKV [[buffer(5)]],
                                 constant int& hs [[buffer(6)]],
                                 uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    device const float* att_t = att + ((ulong)bh * T + t) * T;
    device const floatX* v_i = v + (ulong)b * T * NKV * hs + kvh * hs + i;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += att_t[t2] * float(v_i[(ulong)t2 * NKV * hs]);
    out[(((ulong)b * T + t) * NH + h) * hs + i] = floatX(acc);
}

// scores[t][t2] = att[t][t2] (s[t2] - sum_t3 att[t][t3] s[t3]), s[t2] = dout_t . v_t2, for
// t2 <= t: the gradient of the scores before the softmax (above the diagonal: not written,
// never read); one threadgroup per row, grid (T, B*NH).
kernel void attention_gqa_backward_scores(device float* scores [[buffer(0)]],
                                          device const floatX* dout [[buffer(1)]],
                                          device const floatX* v [[buffer(2)]],
                                          device const floatX* att [[buffer(3)]],
                                          constant int& T [[buffer(4)]],
                                          constant int& NH [[buffer(5)]],
                                          constant int& NKV [[buffer(6)]],
                                          constant int& hs [[buffer(7)]],
                                          uint2 group [[threadgroup_position_in_grid]],
                                          uint tid [[thread_index_in_threadgroup]],
                                          uint num_threads [[threads_per_threadgroup]],
                                          uint simd [[simdgroup_index_in_threadgroup]],
                                          uint lane [[thread_index_in_simdgroup]],
                                          uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    int t = group.x, bh = group.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    ulong row = ((ulong)bh * T + t) * T;
    device const floatX* dout_t = dout + (((ulong)b * T + t) * NH + h) * hs;
    float dot = 0.0f;
    for (int t2 = tid; t2 <= t; t2 += num_threads) {
        device const floatX* v_t2 = v + (((ulong)b * T + t2) * NKV + kvh) * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; ++i) s += float(dout_t[i]) * float(v_t2[i]);
        scores[row + t2] = s;
        dot += float(att[row + t2]) * s;
    }
    dot = threadgroup_sum(dot, partial, simd, lane, num_simds);
    for (int t2 = tid; t2 <= t; t2 += num_threads) scores[row + t2] = float(att[row + t2]) * (scores[row + t2] - dot);
}

// dq[t] += scale sum over t2 <= t of scores[t][t2] k_t2; grid (hs, T, B*NH).
kernel void attention_gqa_backward_dq(device floatX* dq [[buffer(0)]],
                                      device const float* scores [[buffer(1)]],
                                      device const floatX* k [[buffer(2)]],
                                      constant int& T [[buffer(3)]],
                                      constant int& NH [[buffer(4)]],
                                      constant int& NKV [[buffer(5)]],
                                      constant int& hs [[buffer(6)]],
                                      constant float& scale [[buffer(7)]],
                                      uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    device const float* scores_t = scores + ((ulong)bh * T + t) * T;
    device const floatX* k_i = k + (ulong)b * T * NKV * hs + kvh * hs + i;
    float acc = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) acc += scores_t[t2] * float(k_i[(ulong)t2 * NKV * hs]);
    const ulong at = (((ulong)b * T + t) * NH + h) * hs + i;
    dq[at] = floatX(float(dq[at]) + scale * acc);
}

// The gradients of key/value head kvh at position t2, summed over the query heads of its group
// (in head order) and the positions t >= t2:
//   dk[t2] += scale sum scores[h][t][t2] q_h[t],  dv[t2] += sum att[h][t][t2] dout_h[t]
// grid (hs, T [t2], B*NKV).
kernel void attention_gqa_backward_dkv(device floatX* dk [[buffer(0)]],
                                       device floatX* dv [[buffer(1)]],
                                       device const float* scores [[buffer(2)]],
                                       device const floatX* att [[buffer(3)]],
                                       device const floatX* q [[buffer(4)]],
                                       device const floatX* dout [[buffer(5)]],
                                       constant int& T [[buffer(6)]],
                                       constant int& NH [[buffer(7)]],
                                       constant int& NKV [[buffer(8)]],
                                       constant int& hs [[buffer(9)]],
                                       constant float& scale [[buffer(10)]],
                                       uint3 pos [[thread_position_in_grid]]) {
    int i = pos.x, t2 = pos.y, bkv = pos.z, b = bkv / NKV, kvh = bkv % NKV, group_size = NH / NKV;
    float dk_acc = 0.0f, dv_acc = 0.0f;
    for (int h = kvh * group_size; h < (kvh + 1) * group_size; ++h) {
        ulong head = (ulong)b * NH + h;
        for (int t = t2; t < T; ++t) {
            ulong at = (head * T + t) * T + t2;
            ulong row = (((ulong)b * T + t) * NH + h) * hs + i;   // q and dout share the layout
            dk_acc += scores[at] * float(q[row]);
            dv_acc += float(att[at]) * float(dout[row]);
        }
    }
    ulong out = (((ulong)b * T + t2) * NKV + kvh) * hs + i;
    dk[out] = floatX(float(dk[out]) + scale * dk_acc);
    dv[out] = floatX(float(dv[out]) + dv_acc);
}

// ---- the classifier: loss and gradient from the logits and each row's log-sum-exp ----------
// logits (B,T,Vp), the first V of each row the vocabulary; no probability buffer.

// logsum (B,T) = log sum_i exp(logits_i - max), losses (B,T) = max - logits[target] + logsum,
// 0 where the target is -1 (not scored) (with_loss 0: no losses, no targets); one threadgroup
// per position.
kernel void classifier_forward(device float* losses [[buffer(0)]],
                               device float* logsum [[buffer(1)]],
                               device const floatX* logits [[buffer(2)]],
                               device const int* targets [[buffer(3)]],
                               constant int& V [[buffer(4)]],
                               constant int& Vp [[buffer(5)]],
                               constant int& with_loss [[buffer(6)]],
                               uint bt [[threadgroup_position_in_grid]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint num_threads [[threads_per_threadgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const floatX* x = logits + (ulong)bt * Vp;
    float maxval = -INFINITY;
    for (int i = tid; i < V; i += num_threads) maxval = max(maxval, float(x[i]));
    maxval = threadgroup_max(maxval, partial, simd, lane, num_simds);
    float sum = 0.0f;
    for (int i = tid; i < V; i += num_threads) sum += precise::exp(float(x[i]) - maxval);
    float log_total = precise::log(threadgroup_sum(sum, partial, simd, lane, num_simds));
    if (tid == 0) {
        logsum[bt] = log_total;
        if (with_loss) {
            int target = targets[bt];
            losses[bt] = target < 0 ? 0.0f : (maxval - float(x[target])) + log_total;
        }
    }
}

// dlogits (B,T,Vp) += (softmax - onehot(target)) dlosses over the first V entries, the softmax
// recomputed as exp(logits - max) exp(-logsum), nothing in a row whose target is -1 (not
// scored); one threadgroup per position.
kernel void classifier_backward(device floatX* dlogits [[buffer(0)]],
                                device const float* dlosses [[buffer(1)]],
                                device const floatX* logits [[buffer(2)]],
                                device const float* logsum [[buffer(3)]],
                                device const int* targets [[buffer(4)]],
                                constant int& V [[buffer(5)]],
                                constant int& Vp [[buffer(6)]],
                                uint bt [[threadgroup_position_in_grid]],
                                uint tid [[thread_index_in_threadgroup]],
                                uint num_threads [[threads_per_threadgroup]],
                                uint simd [[simdgroup_index_in_threadgroup]],
                                uint lane [[thread_index_in_simdgroup]],
                                uint num_simds [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    int target = targets[bt];
    if (target < 0) return;   // the whole threadgroup, before its barriers
    device const floatX* x = logits + (ulong)bt * Vp;
    device floatX* d = dlogits + (ulong)bt * Vp;
    float maxval = -INFINITY;
    for (int i = tid; i < V; i += num_threads) maxval = max(maxval, float(x[i]));
    maxval = threadgroup_max(maxval, partial, simd, lane, num_simds);
    float dloss = dlosses[bt];
    float scale = precise::exp(-logsum[bt]) * dloss;
    for (int i = tid; i < V; i += num_threads) {
        float value = float(d[i]) + precise::exp(float(x[i]) - maxval) * scale;
        if (i == target) value -= dloss;
        d[i] = floatX(value);
    }
}
