/* accel/metal/host.c — the host side of the Metal backend: every entry of the backend table
 * (accel/backend.pxd) as a C function accel_metal_<entry> with the table's signature, plus
 * accel_metal_create/destroy/device_name, over the runtime ABI of metal_runtime.h. Each is
 * compiled against its declaration from accel/spec.py (accel/generated/backend.h).
 *
 * Compiled into both runtime libraries (the Makefile's metal and metal-emu rules):
 *   libmetal_runtime.dylib   macOS: with metal_runtime.m, Metal itself
 *   libmetal_emu.so          Linux: with accel/emu/msl_runtime.cpp, the CPU emulator of MSL
 * accel/loader.pyx loads either one and fills the table by looking up one symbol per entry, as
 * it does for HIP's builds. Plain C, no Apple headers: the same file builds on both.
 *
 * Each entry picks the grid of its kernels (gpt2.metal, llama.metal, flash.metal) and binds their
 * arguments in the order of their [[buffer(n)]] attributes. Memory is Metal's shared storage,
 * but a dispatch may still be running when the host looks: the host touches memory (zero,
 * copies, the loss, the norm) only after metal_synchronize, and the backend is not
 * host_visible, so a model goes through copy_to_host too.
 *
 * Precision: one build per precision (the Makefile compiles this file, and gpt2.metal, with
 * -DACCEL_METAL_FP16 or -DACCEL_METAL_BF16 for the 2-byte ones; fp32 without). The arguments
 * accel/spec.py declares floatX are floatX here: float, or 16 bits of half or bfloat that the host
 * never computes on, only offsets into (so pointer arithmetic counts elements of the right size).
 * accel_metal_precision says which build this is (metal.pyx checks it); the 2-byte builds also
 * fill the table's mixed group (narrow_params, adamw_update_rounded).
 *
 * Dimension letters: B batch, T time, C channels, OC output channels, NH heads, NKV key/value heads,
 * hs head size (C / NH in GPT-2), V vocabulary, Vp padded vocabulary (row stride of logits, probs and wte), N or n elements.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metal_runtime.h"

#define ACCEL_METAL_API __attribute__((visibility("default")))

#if defined(ACCEL_METAL_FP16)
#define PRECISION "fp16"
typedef uint16_t floatX;   /* half */
#elif defined(ACCEL_METAL_BF16)
#define PRECISION "bf16"
typedef uint16_t floatX;   /* bfloat */
#else
#define PRECISION "fp32"
typedef float floatX;
#endif
/* every export declared from accel/spec.py: a definition below whose signature differs from the
 * spec's fails to compile (conflicting types) */
#define ACCEL_API ACCEL_METAL_API
#define ACCEL_ENTRY(name) accel_metal_##name
#include "../generated/backend.h"
/* whether floatX is narrower than float: attention's scores then go through a float scratch buffer */
#define NARROW (sizeof(floatX) < sizeof(float))

/* the kernels of gpt2.metal (and of llama.metal and flash.metal, which it includes), looked up
 * once by name (KERNEL_NAMES, in this order) */
enum Kernel {
    K_FILL, K_SUM_PARTIALS, K_ADAMW, K_ENCODER_FORWARD, K_ENCODER_BACKWARD_WTE,
    K_ENCODER_BACKWARD_WPE, K_LAYERNORM_FORWARD, K_LAYERNORM_BACKWARD_DINP,
    K_LAYERNORM_BACKWARD_PARAMS, K_MATMUL, K_BIAS_BACKWARD, K_ATTENTION_SCORES,
    K_ATTENTION_SOFTMAX, K_ATTENTION_VALUES, K_ATTENTION_BACKWARD_DATT, K_ATTENTION_BACKWARD_DV,
    K_ATTENTION_BACKWARD_DPREATT, K_ATTENTION_BACKWARD_DQ, K_ATTENTION_BACKWARD_DK,
    K_GELU_FORWARD, K_GELU_BACKWARD, K_RESIDUAL_FORWARD, K_RESIDUAL_BACKWARD, K_SOFTMAX_FORWARD,
    K_CROSSENTROPY_FORWARD, K_CROSSENTROPY_SOFTMAX_BACKWARD, K_RMSNORM_FORWARD, K_RMSNORM_BACKWARD_DINP,
    K_RMSNORM_BACKWARD_DWEIGHT, K_EMBEDDING_FORWARD, K_ROPE, K_SWIGLU_FORWARD, K_SWIGLU_BACKWARD,
    K_ATTENTION_GQA_SCORES, K_ATTENTION_GQA_VALUES, K_ATTENTION_GQA_BACKWARD_SCORES, K_ATTENTION_GQA_BACKWARD_DQ,
    K_ATTENTION_GQA_BACKWARD_DKV, K_CLASSIFIER_FORWARD, K_CLASSIFIER_BACKWARD, K_FLASH_FORWARD,
    K_FLASH_BACKWARD_DKV, K_FLASH_BACKWARD_DQ, K_MATMUL_FLOAT_OUT, K_NARROW_PARAMS, K_ADAMW_ROUNDED,
    NUM_KERNELS
};

static const char* const KERNEL_NAMES[NUM_KERNELS] = {
    "fill", "sum_partials", "adamw_update", "encoder_forward", "encoder_backward_wte",
    "encoder_backward_wpe", "layernorm_forward", "layernorm_backward_dinp",
    "layernorm_backward_params", "matmul", "bias_backward", "attention_scores",
    "attention_softmax", "attention_values", "attention_backward_datt",
    "attention_backward_dv", "attention_backward_dpreatt", "attention_backward_dq",
    "attention_backward_dk", "gelu_forward", "gelu_backward", "residual_forward",
    "residual_backward", "softmax_forward", "crossentropy_forward",
    "crossentropy_softmax_backward", "rmsnorm_forward", "rmsnorm_backward_dinp",
    "rmsnorm_backward_dweight", "embedding_forward", "rope", "swiglu_forward", "swiglu_backward",
    "attention_gqa_scores", "attention_gqa_values", "attention_gqa_backward_scores",
    "attention_gqa_backward_dq", "attention_gqa_backward_dkv", "classifier_forward", "classifier_backward",
    "flash_attention_forward", "flash_attention_backward_dkv", "flash_attention_backward_dq", "matmul_float_out",
    "narrow_params", "adamw_update_rounded"};

enum {
    ROW_THREADS = 256,             /* most threads of a one-threadgroup-per-row kernel */
    ELEMENTWISE_GROUP = 256,
    ELEMENTWISE_THREADS = 1 << 18, /* grid-stride kernels run at most this many threads */
    MAX_PARTIALS = 64,             /* threadgroups of a sum (one partial sum each) */
    TILE = 64,                     /* gpt2.metal's matmul: outputs per threadgroup side, */
    TILE_THREADS = 16,             /* by threads per side */
    LINEAR_GROUP = 64,             /* one thread per channel or row */
    FLASH_MAX_ROWS = 16,           /* flash.metal's kernels: the most query rows and keys per tile, */
    FLASH_TILE = 16 * 65,          /* the floats of a tile of R rows of hs + 1, */
    FLASH_GROUP = 128              /* threads per threadgroup */
};

typedef struct {
    MetalRuntime* rt;
    const MetalKernel* kernels[NUM_KERNELS];
    float* partials;      /* (MAX_PARTIALS,) shared memory for mean and the norm */
    float* scores;        /* attention's (B,NH,T,T) float scores (GQA's backward; at fp16 and bf16
                             both forwards), grown on demand */
    size_t scores_bytes;
    char host_error[256]; /* a failure found on the host side, "" if none */
    ptrdiff_t live;       /* allocations not yet freed */
    int closing;          /* destroyed while allocations remain: close when the last one goes */
} Context;

static Context* context(void* ctx) { return (Context*)ctx; }

/* --- dispatch helpers ----------------------------------------------------------------------- */

/* a buffer argument: the allocation holding p, at its offset */
static MetalArg buf(const void* p) {
    MetalArg a = {p, 0};
    return a;
}

/* a scalar argument: the nbytes at p, copied into the command */
static MetalArg val(const void* p, uint32_t nbytes) {
    MetalArg a = {p, nbytes};
    return a;
}

static uint32_t cap(ptrdiff_t n, ptrdiff_t limit) { return (uint32_t)(n < limit ? n : limit); }

/* x*y*z threads in threadgroups of up to gx*gy (the edge ones smaller) */
static void threads(Context* c, enum Kernel k, const MetalArg* args, int num_args, ptrdiff_t x, ptrdiff_t y,
                    ptrdiff_t z, uint32_t gx, uint32_t gy) {
    const uint32_t grid[3] = {(uint32_t)x, (uint32_t)y, (uint32_t)z};
    const uint32_t group[3] = {cap(x, gx), cap(y, gy), 1};
    if (x > 0 && y > 0 && z > 0) metal_dispatch_threads(c->rt, c->kernels[k], args, num_args, grid, group, NULL, 0);
}

/* x*y whole threadgroups of gx*gy threads */
static void groups(Context* c, enum Kernel k, const MetalArg* args, int num_args, ptrdiff_t x, ptrdiff_t y,
                   uint32_t gx, uint32_t gy) {
    const uint32_t grid[3] = {(uint32_t)x, (uint32_t)y, 1};
    const uint32_t group[3] = {gx, gy, 1};
    if (x > 0 && y > 0) metal_dispatch_threadgroups(c->rt, c->kernels[k], args, num_args, grid, group, NULL, 0);
}

/* threads of a one-threadgroup-per-row kernel over rows of n: n up to ROW_THREADS (any count:
 * simdgroups may be partial) */
static uint32_t row_threads(ptrdiff_t n) { return cap(n > 0 ? n : 1, ROW_THREADS); }

/* whether a kernel's uint index covers n elements; else the host error says so */
static int fits(Context* c, ptrdiff_t n, const char* what) {
    if (n <= (ptrdiff_t)0xFFFFFFFF) return 1;
    if (c->host_error[0] == 0)
        snprintf(c->host_error, sizeof c->host_error, "%s: %td elements is more than a kernel indexes", what, n);
    return 0;
}

static void elementwise(Context* c, enum Kernel k, const MetalArg* args, int num_args, ptrdiff_t n) {
    threads(c, k, args, num_args, cap(n, ELEMENTWISE_THREADS), 1, 1, ELEMENTWISE_GROUP, 1);
}

/* --- the context -------------------------------------------------------------------------------- */

static void close_context(Context* c) {
    if (c->scores != NULL) metal_free(c->rt, c->scores);
    metal_free(c->rt, c->partials);
    metal_close(c->rt);
    free(c);
}

/* The precision of this build's floatX arguments: "fp32", "fp16" or "bf16". */
ACCEL_METAL_API const char* accel_metal_precision(void) { return PRECISION; }

/* A context over the runtime with the kernels of `kernels`, a .metallib file, or a .metal file
 * whose text (its includes spliced in) is `source`, compiled at this build's precision (the
 * emulator's are built into it: metal_open), or NULL with a one-line reason in `error`. */
ACCEL_METAL_API void* accel_metal_create(const char* kernels, const char* source, char* error, size_t error_size) {
    error[0] = 0;
    MetalRuntime* rt = metal_open(kernels, source, PRECISION, error, error_size);
    if (rt == NULL) {
        if (error[0] == 0) snprintf(error, error_size, "the runtime cannot open %s", kernels);
        return NULL;
    }
    Context* c = (Context*)calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(error, error_size, "out of memory");
        metal_close(rt);
        return NULL;
    }
    c->rt = rt;
    for (int k = 0; k < NUM_KERNELS; k++) {
        c->kernels[k] = metal_kernel(rt, KERNEL_NAMES[k]);
        if (c->kernels[k] == NULL) {
            snprintf(error, error_size, "%s: no kernel '%s'", kernels, KERNEL_NAMES[k]);
            metal_close(rt);
            free(c);
            return NULL;
        }
    }
    c->partials = (float*)metal_alloc(rt, MAX_PARTIALS * sizeof(float));
    if (c->partials == NULL) {
        snprintf(error, error_size, "out of memory");
        metal_close(rt);
        free(c);
        return NULL;
    }
    return c;
}

/* The context goes when its last allocation does: a garbage collector's cycle may free a
 * backend before its buffers. */
ACCEL_METAL_API void accel_metal_destroy(void* ctx) {
    Context* c = context(ctx);
    if (c->live == 0)
        close_context(c);
    else
        c->closing = 1;
}

ACCEL_METAL_API const char* accel_metal_device_name(void* ctx) { return metal_device_name(context(ctx)->rt); }

/* --- core: memory ------------------------------------------------------------------------------- */

ACCEL_METAL_API void* accel_metal_alloc(void* ctx, size_t nbytes) {
    Context* c = context(ctx);
    void* ptr = metal_alloc(c->rt, nbytes);
    if (ptr != NULL) c->live += 1;
    return ptr;
}

ACCEL_METAL_API void accel_metal_free(void* ctx, void* ptr, size_t nbytes) {
    Context* c = context(ctx);
    (void)nbytes;
    metal_synchronize(c->rt);
    metal_free(c->rt, ptr);
    c->live -= 1;
    if (c->closing && c->live == 0) close_context(c);
}

ACCEL_METAL_API void accel_metal_zero(void* ctx, void* ptr, size_t nbytes) {
    metal_synchronize(context(ctx)->rt);
    memset(ptr, 0, nbytes);
}

/* shared storage: both directions are a copy after the queued work is done */
ACCEL_METAL_API void accel_metal_copy_to_backend(void* ctx, void* dst, const void* host_src, size_t nbytes) {
    metal_synchronize(context(ctx)->rt);
    memcpy(dst, host_src, nbytes);
}

ACCEL_METAL_API void accel_metal_copy_to_host(void* ctx, void* host_dst, const void* src, size_t nbytes) {
    metal_synchronize(context(ctx)->rt);
    memcpy(host_dst, src, nbytes);
}

ACCEL_METAL_API void accel_metal_synchronize(void* ctx) { metal_synchronize(context(ctx)->rt); }

ACCEL_METAL_API const char* accel_metal_last_error(void* ctx) {
    Context* c = context(ctx);
    return c->host_error[0] != 0 ? c->host_error : metal_error(c->rt);
}

ACCEL_METAL_API void accel_metal_mark(void* ctx, int step, int layer) {
    (void)ctx, (void)step, (void)layer;
}

/* --- core: loss bookkeeping and the optimizer ---------------------------------------------------- */

ACCEL_METAL_API void accel_metal_fill(void* ctx, float* out, float value, ptrdiff_t n) {
    Context* c = context(ctx);
    const uint32_t n32 = (uint32_t)n;
    if (!fits(c, n, "fill")) return;
    const MetalArg args[] = {buf(out), val(&value, 4), val(&n32, 4)};
    elementwise(c, K_FILL, args, 3, n);
}

/* The sum of x (or of its squares): partial sums by threadgroup, added here in double. */
static double sum_on_device(Context* c, const float* x, ptrdiff_t n, int square) {
    const uint32_t n32 = (uint32_t)n;
    ptrdiff_t num_groups = (n + ROW_THREADS - 1) / ROW_THREADS;
    double total = 0.0;
    if (!fits(c, n, "sum") || n <= 0) return 0.0;
    if (num_groups > MAX_PARTIALS) num_groups = MAX_PARTIALS;
    const MetalArg args[] = {buf(c->partials), buf(x), val(&n32, 4), val(&square, 4)};
    groups(c, K_SUM_PARTIALS, args, 4, num_groups, 1, ROW_THREADS, 1);
    metal_synchronize(c->rt);
    for (ptrdiff_t i = 0; i < num_groups; i++) total += c->partials[i];
    return total;
}

ACCEL_METAL_API float accel_metal_mean(void* ctx, const float* x, ptrdiff_t n) {
    return (float)(sum_on_device(context(ctx), x, n, 0) / (double)n);
}

ACCEL_METAL_API double accel_metal_global_norm_squared(void* ctx, const float* x, ptrdiff_t n) {
    return sum_on_device(context(ctx), x, n, 1);
}

ACCEL_METAL_API void accel_metal_adamw_update(void* ctx, float* params, float* m, float* v, const float* grads,
                                              ptrdiff_t n, float lr, float beta1, float beta2, float eps,
                                              float weight_decay, float grad_scale, int t) {
    Context* c = context(ctx);
    const uint32_t n32 = (uint32_t)n;
    /* as the CPU kernel computes them, in float */
    const float beta1_correction = (float)(1.0 - powf(beta1, (float)t));
    const float beta2_correction = (float)(1.0 - powf(beta2, (float)t));
    if (!fits(c, n, "adamw_update")) return;
    const MetalArg args[] = {buf(params), buf(m), buf(v), buf(grads), val(&n32, 4), val(&lr, 4),
                             val(&beta1, 4), val(&beta2, 4), val(&eps, 4), val(&weight_decay, 4),
                             val(&grad_scale, 4), val(&beta1_correction, 4), val(&beta2_correction, 4)};
    elementwise(c, K_ADAMW, args, 13, n);
}

/* --- gpt2: its layers ------------------------------------------------------------------------------ */

ACCEL_METAL_API void accel_metal_encoder_forward(void* ctx, floatX* out, const int* inp, const floatX* wte,
                                                 const floatX* wpe, int B, int T, int C) {
    const MetalArg args[] = {buf(out), buf(inp), buf(wte), buf(wpe), val(&T, 4), val(&C, 4)};
    threads(context(ctx), K_ENCODER_FORWARD, args, 6, C, (ptrdiff_t)B * T, 1, 32, 8);
}

ACCEL_METAL_API void accel_metal_encoder_backward(void* ctx, float* dwte, float* dwpe, const floatX* dout,
                                                  const int* inp, int B, int T, int C, int Vp) {
    const int BT = B * T;
    (void)Vp;
    const MetalArg wte_args[] = {buf(dwte), buf(dout), buf(inp), val(&BT, 4), val(&C, 4)};
    threads(context(ctx), K_ENCODER_BACKWARD_WTE, wte_args, 5, C, 1, 1, LINEAR_GROUP, 1);
    const MetalArg wpe_args[] = {buf(dwpe), buf(dout), val(&B, 4), val(&T, 4), val(&C, 4)};
    threads(context(ctx), K_ENCODER_BACKWARD_WPE, wpe_args, 5, C, T, 1, 32, 8);
}

ACCEL_METAL_API void accel_metal_layernorm_forward(void* ctx, floatX* out, float* mean, float* rstd, const floatX* inp,
                                                   const floatX* weight, const floatX* bias, int B, int T, int C) {
    const MetalArg args[] = {buf(out), buf(mean), buf(rstd), buf(inp), buf(weight), buf(bias), val(&C, 4)};
    groups(context(ctx), K_LAYERNORM_FORWARD, args, 7, (ptrdiff_t)B * T, 1, row_threads(C), 1);
}

ACCEL_METAL_API void accel_metal_layernorm_backward(void* ctx, floatX* dinp, float* dweight, float* dbias,
                                                    const floatX* dout, const floatX* inp, const floatX* weight,
                                                    const float* mean, const float* rstd, int B, int T, int C) {
    const int BT = B * T;
    const MetalArg dinp_args[] = {buf(dinp), buf(dout), buf(inp), buf(weight), buf(mean), buf(rstd), val(&C, 4)};
    groups(context(ctx), K_LAYERNORM_BACKWARD_DINP, dinp_args, 7, BT, 1, row_threads(C), 1);
    const MetalArg params_args[] = {buf(dweight), buf(dbias), buf(dout), buf(inp),
                                    buf(mean), buf(rstd), val(&BT, 4), val(&C, 4)};
    groups(context(ctx), K_LAYERNORM_BACKWARD_PARAMS, params_args, 8, (C + LINEAR_GROUP - 1) / LINEAR_GROUP, 1,
           LINEAR_GROUP, 1);
}

/* out (M,N) = A B (+ bias) or +=, with A(m,k) = a[m*a_row + k*a_k], B(k,n) = b[k*b_k + n*b_col] */
static void gemm(Context* c, enum Kernel kernel, void* out, const floatX* a, const floatX* b, const floatX* bias,
                 int M, int N, int K, int a_row, int a_k, int b_k, int b_col, int accumulate) {
    const int has_bias = bias != NULL;
    const MetalArg args[] = {buf(out), buf(a), buf(b),
                             buf(has_bias ? (const void*)bias : out),   /* bound but unread without a bias */
                             val(&M, 4), val(&N, 4), val(&K, 4), val(&a_row, 4), val(&a_k, 4),
                             val(&b_k, 4), val(&b_col, 4), val(&accumulate, 4), val(&has_bias, 4)};
    groups(c, kernel, args, 13, (N + TILE - 1) / TILE, (M + TILE - 1) / TILE, TILE_THREADS, TILE_THREADS);
}

ACCEL_METAL_API void accel_metal_matmul_forward(void* ctx, floatX* out, const floatX* inp, const floatX* weight,
                                                const floatX* bias, int B, int T, int C, int OC) {
    /* out (BT,OC) = inp (BT,C) weight (OC,C)^T + bias */
    gemm(context(ctx), K_MATMUL, out, inp, weight, bias, B * T, OC, C, C, 1, 1, C, 0);
}

ACCEL_METAL_API void accel_metal_matmul_backward(void* ctx, floatX* dinp, float* dweight, float* dbias,
                                                 const floatX* dout, const floatX* inp, const floatX* weight,
                                                 int B, int T, int C, int OC) {
    Context* c = context(ctx);
    const int BT = B * T;
    gemm(c, K_MATMUL, dinp, dout, weight, NULL, BT, C, OC, OC, 1, C, 1, 1);           /* += dout weight */
    if (dweight != NULL)   /* none for a frozen weight */
        gemm(c, K_MATMUL_FLOAT_OUT, dweight, dout, inp, NULL, OC, C, BT, 1, OC, C, 1, 1);  /* += dout^T inp */
    if (dbias != NULL) {
        const MetalArg args[] = {buf(dbias), buf(dout), val(&BT, 4), val(&OC, 4)};
        threads(c, K_BIAS_BACKWARD, args, 4, OC, 1, 1, LINEAR_GROUP, 1);
    }
}

/* The (B,NH,T,T) float scratch of attention's scores, at least nbytes; NULL (and the host error,
 * naming `where`) without memory. */
static float* attention_scores(Context* c, size_t nbytes, const char* where) {
    if (c->scores_bytes >= nbytes) return c->scores;
    if (c->scores != NULL) {
        metal_synchronize(c->rt);   /* no queued dispatch still uses it */
        metal_free(c->rt, c->scores);
    }
    c->scores = (float*)metal_alloc(c->rt, nbytes);
    c->scores_bytes = c->scores != NULL ? nbytes : 0;
    if (c->scores == NULL && c->host_error[0] == 0)
        snprintf(c->host_error, sizeof c->host_error,
                 "%s: out of memory for its %zu-byte scratch buffer", where, nbytes);
    return c->scores;
}

ACCEL_METAL_API void accel_metal_attention_forward(void* ctx, floatX* out, floatX* preatt, floatX* att,
                                                   const floatX* inp, int B, int T, int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const float scale = (float)(1.0 / (double)sqrtf((float)hs));
    const ptrdiff_t BNH = (ptrdiff_t)B * NH;
    const int narrow = NARROW;
    /* the scores, then the probabilities, in float: preatt, att at fp32, a scratch buffer else */
    float* scores = NARROW ? attention_scores(c, (size_t)BNH * T * T * sizeof(float), "attention_forward")
                           : (float*)preatt;
    if (scores == NULL || BNH == 0 || T == 0) return;
    const MetalArg scores_args[] = {buf(scores), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4), val(&scale, 4)};
    threads(c, K_ATTENTION_SCORES, scores_args, 6, T, T, BNH, 16, 16);
    const MetalArg softmax_args[] = {buf(att), buf(preatt), buf(scores), val(&T, 4), val(&narrow, 4), val(&narrow, 4)};
    groups(c, K_ATTENTION_SOFTMAX, softmax_args, 6, T, BNH, row_threads(T), 1);
    const MetalArg values_args[] = {buf(out), buf(NARROW ? (const void*)scores : att), buf(inp), val(&T, 4),
                                    val(&C, 4), val(&NH, 4)};
    threads(c, K_ATTENTION_VALUES, values_args, 6, hs, T, BNH, 32, 8);
}

ACCEL_METAL_API void accel_metal_attention_backward(void* ctx, floatX* dinp, floatX* dpreatt, floatX* datt,
                                                    const floatX* dout, const floatX* inp, const floatX* att,
                                                    int B, int T, int C, int NH) {
    Context* c = context(ctx);
    const int hs = C / NH;
    const float scale = (float)(1.0 / (double)sqrtf((float)hs));
    const ptrdiff_t BNH = (ptrdiff_t)B * NH;
    const int narrow = NARROW;
    /* datt and dpreatt as the next kernels read them, in float: the outputs themselves at fp32,
     * the two halves of a scratch buffer else */
    float* scratch = NARROW ? attention_scores(c, 2 * (size_t)BNH * T * T * sizeof(float), "attention_backward")
                            : NULL;
    if ((NARROW && scratch == NULL) || BNH == 0 || T == 0) return;
    float* datt_float = NARROW ? scratch : (float*)datt;
    float* dpreatt_float = NARROW ? scratch + (size_t)BNH * T * T : (float*)dpreatt;
    const MetalArg datt_args[] = {buf(datt), buf(datt_float), buf(dout), buf(inp), val(&T, 4), val(&C, 4),
                                  val(&NH, 4), val(&narrow, 4)};
    threads(c, K_ATTENTION_BACKWARD_DATT, datt_args, 8, T, T, BNH, 16, 16);
    const MetalArg dv_args[] = {buf(dinp), buf(dout), buf(att), val(&T, 4), val(&C, 4), val(&NH, 4)};
    threads(c, K_ATTENTION_BACKWARD_DV, dv_args, 6, hs, T, BNH, 32, 8);
    const MetalArg dpreatt_args[] = {buf(dpreatt), buf(dpreatt_float), buf(datt_float), buf(att), val(&T, 4),
                                     val(&narrow, 4)};
    groups(c, K_ATTENTION_BACKWARD_DPREATT, dpreatt_args, 6, T, BNH, row_threads(T), 1);
    const MetalArg dqk_args[] = {buf(dinp), buf(dpreatt_float), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4),
                                 val(&scale, 4)};
    threads(c, K_ATTENTION_BACKWARD_DQ, dqk_args, 7, hs, T, BNH, 32, 8);
    threads(c, K_ATTENTION_BACKWARD_DK, dqk_args, 7, hs, T, BNH, 32, 8);
}

ACCEL_METAL_API void accel_metal_gelu_forward(void* ctx, floatX* out, const floatX* inp, ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "gelu_forward")) return;
    const MetalArg args[] = {buf(out), buf(inp), val(&n32, 4)};
    elementwise(context(ctx), K_GELU_FORWARD, args, 3, N);
}

ACCEL_METAL_API void accel_metal_gelu_backward(void* ctx, floatX* dinp, const floatX* inp, const floatX* dout,
                                               ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "gelu_backward")) return;
    const MetalArg args[] = {buf(dinp), buf(inp), buf(dout), val(&n32, 4)};
    elementwise(context(ctx), K_GELU_BACKWARD, args, 4, N);
}

ACCEL_METAL_API void accel_metal_residual_forward(void* ctx, floatX* out, const floatX* inp1, const floatX* inp2,
                                                  ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "residual_forward")) return;
    const MetalArg args[] = {buf(out), buf(inp1), buf(inp2), val(&n32, 4)};
    elementwise(context(ctx), K_RESIDUAL_FORWARD, args, 4, N);
}

ACCEL_METAL_API void accel_metal_residual_backward(void* ctx, floatX* dinp1, floatX* dinp2, const floatX* dout,
                                                   ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "residual_backward")) return;
    const MetalArg args[] = {buf(dinp1), buf(dinp2), buf(dout), val(&n32, 4)};
    elementwise(context(ctx), K_RESIDUAL_BACKWARD, args, 4, N);
}

ACCEL_METAL_API void accel_metal_softmax_forward(void* ctx, float* probs, const floatX* logits, int B, int T, int V,
                                                 int Vp) {
    const MetalArg args[] = {buf(probs), buf(logits), val(&V, 4), val(&Vp, 4)};
    groups(context(ctx), K_SOFTMAX_FORWARD, args, 4, (ptrdiff_t)B * T, 1, row_threads(V), 1);
}

ACCEL_METAL_API void accel_metal_crossentropy_forward(void* ctx, float* losses, const float* probs,
                                                      const int* targets, int B, int T, int Vp) {
    const MetalArg args[] = {buf(losses), buf(probs), buf(targets), val(&Vp, 4)};
    threads(context(ctx), K_CROSSENTROPY_FORWARD, args, 4, (ptrdiff_t)B * T, 1, 1, LINEAR_GROUP, 1);
}

ACCEL_METAL_API void accel_metal_crossentropy_softmax_backward(void* ctx, floatX* dlogits, const float* dlosses,
                                                               const float* probs, const int* targets,
                                                               int B, int T, int V, int Vp) {
    const MetalArg args[] = {buf(dlogits), buf(dlosses), buf(probs), buf(targets), val(&Vp, 4)};
    threads(context(ctx), K_CROSSENTROPY_SOFTMAX_BACKWARD, args, 5, V, (ptrdiff_t)B * T, 1, ROW_THREADS, 1);
}

/* --- llama: its layers ----------------------------------------------------------------------------- */

ACCEL_METAL_API void accel_metal_embedding_forward(void* ctx, floatX* out, const int* inp, const floatX* wte, int B,
                                                   int T, int C) {
    const MetalArg args[] = {buf(out), buf(inp), buf(wte), val(&C, 4)};
    threads(context(ctx), K_EMBEDDING_FORWARD, args, 4, C, (ptrdiff_t)B * T, 1, 32, 8);
}

/* the scatter by token of GPT-2's encoder (one thread per channel walks the positions) */
ACCEL_METAL_API void accel_metal_embedding_backward(void* ctx, float* dwte, const floatX* dout, const int* inp,
                                                    int B, int T, int C, int V) {
    const int BT = B * T;
    (void)V;
    const MetalArg args[] = {buf(dwte), buf(dout), buf(inp), val(&BT, 4), val(&C, 4)};
    threads(context(ctx), K_ENCODER_BACKWARD_WTE, args, 5, C, 1, 1, LINEAR_GROUP, 1);
}

ACCEL_METAL_API void accel_metal_rmsnorm_forward(void* ctx, floatX* out, float* rstd, const floatX* inp,
                                                 const floatX* weight, float eps, int B, int T, int C) {
    const MetalArg args[] = {buf(out), buf(rstd), buf(inp), buf(weight), val(&eps, 4), val(&C, 4)};
    groups(context(ctx), K_RMSNORM_FORWARD, args, 6, (ptrdiff_t)B * T, 1, row_threads(C), 1);
}

ACCEL_METAL_API void accel_metal_rmsnorm_backward(void* ctx, floatX* dinp, float* dweight, const floatX* dout,
                                                  const floatX* inp, const floatX* weight, const float* rstd, int B,
                                                  int T, int C) {
    const int BT = B * T;
    const MetalArg dinp_args[] = {buf(dinp), buf(dout), buf(inp), buf(weight), buf(rstd), val(&C, 4)};
    groups(context(ctx), K_RMSNORM_BACKWARD_DINP, dinp_args, 6, BT, 1, row_threads(C), 1);
    if (dweight == NULL) return;   /* a frozen weight */
    const MetalArg dweight_args[] = {buf(dweight), buf(dout), buf(inp), buf(rstd), val(&BT, 4), val(&C, 4)};
    groups(context(ctx), K_RMSNORM_BACKWARD_DWEIGHT, dweight_args, 6, (C + LINEAR_GROUP - 1) / LINEAR_GROUP, 1,
           LINEAR_GROUP, 1);
}

static void rope(Context* c, floatX* out, const floatX* inp, const float* freqs_cos, const float* freqs_sin, int B,
                 int T, int NH, int hs, int backward) {
    const MetalArg args[] = {buf(out), buf(inp), buf(freqs_cos), buf(freqs_sin), val(&T, 4), val(&NH, 4),
                             val(&hs, 4), val(&backward, 4)};
    threads(c, K_ROPE, args, 8, hs / 2, NH, (ptrdiff_t)B * T, 32, 8);
}

ACCEL_METAL_API void accel_metal_rope_forward(void* ctx, floatX* out, const floatX* inp, const float* freqs_cos,
                                              const float* freqs_sin, int B, int T, int NH, int hs) {
    rope(context(ctx), out, inp, freqs_cos, freqs_sin, B, T, NH, hs, 0);
}

ACCEL_METAL_API void accel_metal_rope_backward(void* ctx, floatX* dinp, const floatX* dout, const float* freqs_cos,
                                               const float* freqs_sin, int B, int T, int NH, int hs) {
    rope(context(ctx), dinp, dout, freqs_cos, freqs_sin, B, T, NH, hs, 1);
}

ACCEL_METAL_API void accel_metal_swiglu_forward(void* ctx, floatX* out, const floatX* a, const floatX* b, ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "swiglu_forward")) return;
    const MetalArg args[] = {buf(out), buf(a), buf(b), val(&n32, 4)};
    elementwise(context(ctx), K_SWIGLU_FORWARD, args, 4, N);
}

ACCEL_METAL_API void accel_metal_swiglu_backward(void* ctx, floatX* da, floatX* db, const floatX* dout, const floatX* a,
                                                 const floatX* b, ptrdiff_t N) {
    const uint32_t n32 = (uint32_t)N;
    if (!fits(context(ctx), N, "swiglu_backward")) return;
    const MetalArg args[] = {buf(da), buf(db), buf(dout), buf(a), buf(b), val(&n32, 4)};
    elementwise(context(ctx), K_SWIGLU_BACKWARD, args, 6, N);
}

static float attention_scale(int hs) { return (float)(1.0 / (double)sqrtf((float)hs)); }

ACCEL_METAL_API void accel_metal_attention_gqa_forward(void* ctx, floatX* out, floatX* att, const floatX* q,
                                                       const floatX* k, const floatX* v, int B, int T, int NH,
                                                       int NKV, int hs) {
    Context* c = context(ctx);
    const float scale = attention_scale(hs);
    const ptrdiff_t BNH = (ptrdiff_t)B * NH;
    const int no_preatt = 0, narrow = NARROW;   /* att is the only (B,NH,T,T) output */
    /* the scores, then the probabilities, in float: att itself at fp32 (the softmax in place), a
     * scratch buffer else */
    float* scores = NARROW ? attention_scores(c, (size_t)BNH * T * T * sizeof(float), "attention_gqa_forward")
                           : (float*)att;
    if (scores == NULL || BNH == 0 || T == 0) return;
    const MetalArg scores_args[] = {buf(scores), buf(q), buf(k), val(&T, 4), val(&NH, 4), val(&NKV, 4), val(&hs, 4),
                                    val(&scale, 4)};
    threads(c, K_ATTENTION_GQA_SCORES, scores_args, 8, T, T, BNH, 16, 16);
    const MetalArg softmax_args[] = {buf(att), buf(att), buf(scores), val(&T, 4), val(&no_preatt, 4), val(&narrow, 4)};
    groups(c, K_ATTENTION_SOFTMAX, softmax_args, 6, T, BNH, row_threads(T), 1);
    const MetalArg values_args[] = {buf(out), buf(scores), buf(v), val(&T, 4), val(&NH, 4), val(&NKV, 4), val(&hs, 4)};
    threads(c, K_ATTENTION_GQA_VALUES, values_args, 7, hs, T, BNH, 32, 8);
}

ACCEL_METAL_API void accel_metal_attention_gqa_backward(void* ctx, floatX* dq, floatX* dk, floatX* dv,
                                                        const floatX* dout, const floatX* q, const floatX* k,
                                                        const floatX* v, const floatX* att, int B, int T, int NH,
                                                        int NKV, int hs) {
    Context* c = context(ctx);
    const float scale = attention_scale(hs);
    const ptrdiff_t BNH = (ptrdiff_t)B * NH;
    float* scores = attention_scores(c, (size_t)BNH * T * T * sizeof(float), "attention_gqa_backward");
    if (scores == NULL || BNH == 0 || T == 0) return;
    const MetalArg scores_args[] = {buf(scores), buf(dout), buf(v), buf(att), val(&T, 4), val(&NH, 4),
                                    val(&NKV, 4), val(&hs, 4)};
    groups(c, K_ATTENTION_GQA_BACKWARD_SCORES, scores_args, 8, T, BNH, row_threads(T), 1);
    const MetalArg dq_args[] = {buf(dq), buf(scores), buf(k), val(&T, 4), val(&NH, 4), val(&NKV, 4), val(&hs, 4),
                                val(&scale, 4)};
    threads(c, K_ATTENTION_GQA_BACKWARD_DQ, dq_args, 8, hs, T, BNH, 32, 8);
    const MetalArg dkv_args[] = {buf(dk), buf(dv), buf(scores), buf(att), buf(q), buf(dout), val(&T, 4),
                                 val(&NH, 4), val(&NKV, 4), val(&hs, 4), val(&scale, 4)};
    threads(c, K_ATTENTION_GQA_BACKWARD_DKV, dkv_args, 11, hs, T, (ptrdiff_t)B * NKV, 32, 8);
}

/* --- classifier ------------------------------------------------------------------------------------ */

ACCEL_METAL_API void accel_metal_classifier_forward(void* ctx, float* losses, float* logsum, const floatX* logits,
                                                    const int* targets, int B, int T, int V, int Vp) {
    const int with_loss = losses != NULL && targets != NULL;
    /* without a loss, losses and targets are bound to logsum, unread */
    const MetalArg args[] = {buf(with_loss ? (const void*)losses : logsum), buf(logsum), buf(logits),
                             buf(with_loss ? (const void*)targets : logsum), val(&V, 4), val(&Vp, 4),
                             val(&with_loss, 4)};
    groups(context(ctx), K_CLASSIFIER_FORWARD, args, 7, (ptrdiff_t)B * T, 1, row_threads(V), 1);
}

ACCEL_METAL_API void accel_metal_classifier_backward(void* ctx, floatX* dlogits, const float* dlosses,
                                                     const floatX* logits, const float* logsum, const int* targets,
                                                     int B, int T, int V, int Vp) {
    const MetalArg args[] = {buf(dlogits), buf(dlosses), buf(logits), buf(logsum), buf(targets), val(&V, 4),
                             val(&Vp, 4)};
    groups(context(ctx), K_CLASSIFIER_BACKWARD, args, 7, (ptrdiff_t)B * T, 1, row_threads(V), 1);
}

/* --- flash ------------------------------------------------------------------------------------- */

/* Where the tensors' rows are (row strides in elements): GPT-2's q, k, v are the thirds of inp's
 * rows (ldq = ldkv = 3C), Llama's separate tensors (NKV key/value heads). */
typedef struct {
    int B, T, NH, NKV, hs, ldq, ldkv, ldo;
    int R;   /* query rows and keys per tile */
} FlashShape;

/* s's tile rows R: the largest of FLASH_MAX_ROWS, ..., 2, 1 whose tile of R rows of hs + 1 fits
 * in FLASH_TILE floats; 0 (and the host error) when none does or the heads do not group */
static int flash_tile(Context* c, FlashShape* s, const char* where) {
    s->R = 0;
    for (int R = FLASH_MAX_ROWS; R >= 1 && s->hs > 0 && s->NKV > 0 && s->NH % s->NKV == 0; R /= 2)
        if (R * (s->hs + 1) <= FLASH_TILE) {
            s->R = R;
            break;
        }
    if (s->R == 0) {
        if (c->host_error[0] == 0)
            snprintf(c->host_error, sizeof c->host_error,
                     "%s: head size %d with NH %d, NKV %d: the tiles hold head sizes 1 to %d and NH a multiple of NKV",
                     where, s->hs, s->NH, s->NKV, FLASH_TILE - 1);
        return 0;
    }
    return fits(c, (ptrdiff_t)s->B * s->T * s->ldq, where);
}

static void flash_forward(Context* c, floatX* out, float* lse, const floatX* q, const floatX* k, const floatX* v,
                          FlashShape s, const char* where) {
    const float scale = attention_scale(s.hs);
    if ((ptrdiff_t)s.B * s.T * s.NH == 0 || !flash_tile(c, &s, where)) return;
    const MetalArg args[] = {buf(out), buf(lse), buf(q), buf(k), buf(v), val(&s.T, 4), val(&s.NH, 4),
                             val(&s.NKV, 4), val(&s.hs, 4), val(&s.ldq, 4), val(&s.ldkv, 4), val(&s.ldo, 4),
                             val(&scale, 4), val(&s.R, 4)};
    groups(c, K_FLASH_FORWARD, args, 14, (s.T + s.R - 1) / s.R, (ptrdiff_t)s.B * s.NH, FLASH_GROUP, 1);
}

static void flash_backward(Context* c, floatX* dq, floatX* dk, floatX* dv, const floatX* dout, const floatX* q,
                           const floatX* k, const floatX* v, const floatX* out, const float* lse, FlashShape s,
                           const char* where) {
    const float scale = attention_scale(s.hs);
    if ((ptrdiff_t)s.B * s.T * s.NH == 0 || !flash_tile(c, &s, where)) return;
    const ptrdiff_t tiles = (s.T + s.R - 1) / s.R;
    const MetalArg dkv_args[] = {buf(dk), buf(dv), buf(dout), buf(q), buf(k), buf(v), buf(out), buf(lse),
                                 val(&s.T, 4), val(&s.NH, 4), val(&s.NKV, 4), val(&s.hs, 4), val(&s.ldq, 4),
                                 val(&s.ldkv, 4), val(&s.ldo, 4), val(&scale, 4), val(&s.R, 4)};
    groups(c, K_FLASH_BACKWARD_DKV, dkv_args, 17, tiles, (ptrdiff_t)s.B * s.NKV, FLASH_GROUP, 1);
    const MetalArg dq_args[] = {buf(dq), buf(dout), buf(q), buf(k), buf(v), buf(out), buf(lse), val(&s.T, 4),
                                val(&s.NH, 4), val(&s.NKV, 4), val(&s.hs, 4), val(&s.ldq, 4), val(&s.ldkv, 4),
                                val(&s.ldo, 4), val(&scale, 4), val(&s.R, 4)};
    groups(c, K_FLASH_BACKWARD_DQ, dq_args, 16, tiles, (ptrdiff_t)s.B * s.NH, FLASH_GROUP, 1);
}

ACCEL_METAL_API void accel_metal_flash_attention_forward(void* ctx, floatX* out, float* lse, const floatX* inp, int B,
                                                         int T, int C, int NH) {
    /* GPT-2's form: q, k, v the thirds of inp's rows */
    const FlashShape s = {B, T, NH, NH, NH > 0 ? C / NH : 0, 3 * C, 3 * C, C, 0};
    flash_forward(context(ctx), out, lse, inp, inp + C, inp + 2 * C, s, "flash_attention_forward");
}

ACCEL_METAL_API void accel_metal_flash_attention_backward(void* ctx, floatX* dinp, const floatX* dout, const floatX* inp,
                                                          const floatX* out, const float* lse, int B, int T, int C,
                                                          int NH) {
    const FlashShape s = {B, T, NH, NH, NH > 0 ? C / NH : 0, 3 * C, 3 * C, C, 0};
    flash_backward(context(ctx), dinp, dinp + C, dinp + 2 * C, dout, inp, inp + C, inp + 2 * C, out, lse, s,
                   "flash_attention_backward");
}

ACCEL_METAL_API void accel_metal_flash_attention_gqa_forward(void* ctx, floatX* out, float* lse, const floatX* q,
                                                             const floatX* k, const floatX* v, int B, int T, int NH,
                                                             int NKV, int hs) {
    const FlashShape s = {B, T, NH, NKV, hs, NH * hs, NKV * hs, NH * hs, 0};
    flash_forward(context(ctx), out, lse, q, k, v, s, "flash_attention_gqa_forward");
}

ACCEL_METAL_API void accel_metal_flash_attention_gqa_backward(void* ctx, floatX* dq, floatX* dk, floatX* dv,
                                                              const floatX* dout, const floatX* q, const floatX* k,
                                                              const floatX* v, const floatX* out, const float* lse,
                                                              int B, int T, int NH, int NKV, int hs) {
    const FlashShape s = {B, T, NH, NKV, hs, NH * hs, NKV * hs, NH * hs, 0};
    flash_backward(context(ctx), dq, dk, dv, dout, q, k, v, out, lse, s, "flash_attention_gqa_backward");
}

/* --- mixed: the parameters the kernels read, from the float32 master weights (fp16, bf16) ------- */

#if defined(ACCEL_METAL_FP16) || defined(ACCEL_METAL_BF16)
/* params = master rounded: at bf16 stochastically (seed >= 0, element i's bits from (first + i,
 * seed)) or to nearest even (seed -1), at fp16 always to nearest even (gpt2.metal's rounded_param) */
ACCEL_METAL_API void accel_metal_narrow_params(void* ctx, floatX* params, const float* master, ptrdiff_t n,
                                               ptrdiff_t first, int seed) {
    Context* c = context(ctx);
    const uint32_t n32 = (uint32_t)n;
    const uint64_t first64 = (uint64_t)first;
    if (!fits(c, n, "narrow_params")) return;
    const MetalArg args[] = {buf(params), buf(master), val(&n32, 4), val(&first64, 8), val(&seed, 4)};
    elementwise(c, K_NARROW_PARAMS, args, 5, n);
}

ACCEL_METAL_API void accel_metal_adamw_update_rounded(void* ctx, floatX* params, float* master, float* m, float* v,
                                                      const float* grads, ptrdiff_t n, float lr, float beta1,
                                                      float beta2, float eps, float weight_decay, float grad_scale,
                                                      int t, ptrdiff_t first) {
    Context* c = context(ctx);
    const uint32_t n32 = (uint32_t)n;
    const uint64_t first64 = (uint64_t)first;
    /* as the CPU kernel computes them, in float */
    const float beta1_correction = (float)(1.0 - powf(beta1, (float)t));
    const float beta2_correction = (float)(1.0 - powf(beta2, (float)t));
    if (!fits(c, n, "adamw_update_rounded")) return;
    const MetalArg args[] = {buf(params), buf(master), buf(m), buf(v), buf(grads), val(&n32, 4), val(&lr, 4),
                             val(&beta1, 4), val(&beta2, 4), val(&eps, 4), val(&weight_decay, 4),
                             val(&grad_scale, 4), val(&beta1_correction, 4), val(&beta2_correction, 4), val(&t, 4),
                             val(&first64, 8)};
    elementwise(c, K_ADAMW_ROUNDED, args, 16, n);
}
#endif
