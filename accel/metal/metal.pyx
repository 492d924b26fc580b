"""
The Metal backend: the kernels of accel/metal/gpt2.metal behind the backend table
(accel/backend.pxd), run through a runtime with the C ABI of accel/metal/metal_runtime.h:

    metal       macOS: Metal itself, build/libmetal_runtime.dylib (`make metal`)
    metal-emu   Linux: the CPU emulator of MSL, build/libmetal_emu.so (`make metal-emu`)

Both are loaded with dlopen, so this module builds everywhere. This is the host side: each
table entry picks the grid of its kernels and binds their arguments in the order of their
[[buffer(n)]] attributes. Memory is Metal's shared storage, but a dispatch may still be running
when the host looks: the host touches memory (zero, copies, the loss, the norm) only after
synchronize, and the backend is not host_visible, so a model goes through copy_to_host too.
"""
import os
import sys

from accel.backend import BackendError
from accel.backend cimport Backend, BackendTable
from libc.math cimport powf, sqrtf
from libc.stdint cimport uint32_t
from libc.stdio cimport snprintf
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.dlfcn cimport dlopen, dlsym, dlerror, dlclose, RTLD_NOW, RTLD_LOCAL

cdef extern from "accel/metal/metal_runtime.h" nogil:
    ctypedef struct MetalRuntime:
        pass
    ctypedef struct MetalKernel:
        pass
    ctypedef struct MetalArg:
        const void* data
        uint32_t nbytes

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build")
EMULATOR_LIBRARY = os.path.join(BUILD, "libmetal_emu.so")
MACOS_RUNTIME = os.path.join(BUILD, "libmetal_runtime.dylib")
MACOS_METALLIB = os.path.join(BUILD, "gpt2.metallib")   # `make metal`; else the source is compiled at run time
SOURCE = os.path.join(HERE, "gpt2.metal")

# the kernels of gpt2.metal, in the order of Kernel
KERNEL_NAMES = ("fill", "sum_partials", "adamw_update", "encoder_forward", "encoder_backward_wte",
                "encoder_backward_wpe", "layernorm_forward", "layernorm_backward_dinp",
                "layernorm_backward_params", "matmul", "bias_backward", "attention_scores",
                "attention_softmax", "attention_values", "attention_backward_datt",
                "attention_backward_dv", "attention_backward_dpreatt", "attention_backward_dq",
                "attention_backward_dk", "gelu_forward", "gelu_backward", "residual_forward",
                "residual_backward", "softmax_forward", "crossentropy_forward",
                "crossentropy_softmax_backward")

cdef enum Kernel:
    K_FILL, K_SUM_PARTIALS, K_ADAMW, K_ENCODER_FORWARD, K_ENCODER_BACKWARD_WTE,
    K_ENCODER_BACKWARD_WPE, K_LAYERNORM_FORWARD, K_LAYERNORM_BACKWARD_DINP,
    K_LAYERNORM_BACKWARD_PARAMS, K_MATMUL, K_BIAS_BACKWARD, K_ATTENTION_SCORES,
    K_ATTENTION_SOFTMAX, K_ATTENTION_VALUES, K_ATTENTION_BACKWARD_DATT, K_ATTENTION_BACKWARD_DV,
    K_ATTENTION_BACKWARD_DPREATT, K_ATTENTION_BACKWARD_DQ, K_ATTENTION_BACKWARD_DK,
    K_GELU_FORWARD, K_GELU_BACKWARD, K_RESIDUAL_FORWARD, K_RESIDUAL_BACKWARD, K_SOFTMAX_FORWARD,
    K_CROSSENTROPY_FORWARD, K_CROSSENTROPY_SOFTMAX_BACKWARD, NUM_KERNELS

cdef enum:
    ROW_THREADS = 256            # most threads of a one-threadgroup-per-row kernel
    ELEMENTWISE_GROUP = 256
    ELEMENTWISE_THREADS = 1 << 18  # grid-stride kernels run at most this many threads
    MAX_PARTIALS = 64            # threadgroups of a sum (one partial sum each)
    TILE = 64                    # gpt2.metal's matmul: outputs per threadgroup side,
    TILE_THREADS = 16            # by threads per side
    LINEAR_GROUP = 64            # one thread per channel or row

# the runtime's functions (metal_runtime.h), looked up by name
ctypedef MetalRuntime* (*open_f)(const char*, char*, size_t) noexcept nogil
ctypedef void (*close_f)(MetalRuntime*) noexcept nogil
ctypedef const char* (*name_f)(MetalRuntime*) noexcept nogil
ctypedef void* (*alloc_f)(MetalRuntime*, size_t) noexcept nogil
ctypedef void (*free_f)(MetalRuntime*, void*) noexcept nogil
ctypedef const MetalKernel* (*kernel_f)(MetalRuntime*, const char*) noexcept nogil
ctypedef void (*dispatch_f)(MetalRuntime*, const MetalKernel*, const MetalArg*, int, const uint32_t*,
                            const uint32_t*, const uint32_t*, int) noexcept nogil
ctypedef void (*sync_f)(MetalRuntime*) noexcept nogil

ctypedef struct Context:
    MetalRuntime* rt
    close_f close
    alloc_f alloc
    free_f free
    dispatch_f dispatch_threads
    dispatch_f dispatch_threadgroups
    sync_f synchronize
    name_f error
    const MetalKernel* kernels[<int>NUM_KERNELS]
    float* partials              # (MAX_PARTIALS,) shared memory for mean and the norm
    char host_error[256]         # a failure found on the host side, "" if none


# --- dispatch helpers ------------------------------------------------------------------------

cdef inline MetalArg buf(const void* p) noexcept nogil:
    cdef MetalArg a
    a.data = p
    a.nbytes = 0
    return a

cdef inline MetalArg val(const void* p, uint32_t nbytes) noexcept nogil:
    cdef MetalArg a
    a.data = p
    a.nbytes = nbytes
    return a

cdef inline uint32_t cap(Py_ssize_t n, Py_ssize_t limit) noexcept nogil:
    return <uint32_t>(n if n < limit else limit)

cdef void threads(Context* c, Kernel k, MetalArg* args, int num_args, Py_ssize_t x, Py_ssize_t y,
                  Py_ssize_t z, uint32_t gx, uint32_t gy) noexcept nogil:
    """x*y*z threads in threadgroups of up to gx*gy (the edge ones smaller)."""
    cdef uint32_t grid[3]
    cdef uint32_t group[3]
    grid[0], grid[1], grid[2] = <uint32_t>x, <uint32_t>y, <uint32_t>z
    group[0], group[1], group[2] = cap(x, gx), cap(y, gy), 1
    if x > 0 and y > 0 and z > 0:
        c.dispatch_threads(c.rt, c.kernels[<int>k], args, num_args, grid, group, NULL, 0)

cdef void groups(Context* c, Kernel k, MetalArg* args, int num_args, Py_ssize_t x, Py_ssize_t y,
                 uint32_t gx, uint32_t gy) noexcept nogil:
    """x*y whole threadgroups of gx*gy threads."""
    cdef uint32_t grid[3]
    cdef uint32_t group[3]
    grid[0], grid[1], grid[2] = <uint32_t>x, <uint32_t>y, 1
    group[0], group[1], group[2] = gx, gy, 1
    if x > 0 and y > 0:
        c.dispatch_threadgroups(c.rt, c.kernels[<int>k], args, num_args, grid, group, NULL, 0)

cdef inline uint32_t row_threads(Py_ssize_t n) noexcept nogil:
    """Threads of a one-threadgroup-per-row kernel over rows of n: n up to ROW_THREADS (any
    count: simdgroups may be partial)."""
    return cap(n if n > 0 else 1, ROW_THREADS)

cdef bint fits(Context* c, Py_ssize_t n, const char* what) noexcept nogil:
    if n <= <Py_ssize_t>0xFFFFFFFF:
        return True
    if c.host_error[0] == 0:
        snprintf(c.host_error, sizeof(c.host_error), "%s: %zd elements is more than a kernel indexes", what, n)
    return False

cdef void elementwise(Context* c, Kernel k, MetalArg* args, int num_args, Py_ssize_t n) noexcept nogil:
    threads(c, k, args, num_args, cap(n, ELEMENTWISE_THREADS), 1, 1, ELEMENTWISE_GROUP, 1)


# --- memory ------------------------------------------------------------------------------------

cdef void* m_alloc(void* ctx, size_t nbytes) noexcept nogil:
    cdef Context* c = <Context*>ctx
    return c.alloc(c.rt, nbytes)

cdef void m_free(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    cdef Context* c = <Context*>ctx
    c.synchronize(c.rt)
    c.free(c.rt, ptr)

cdef void m_zero(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    cdef Context* c = <Context*>ctx
    c.synchronize(c.rt)
    memset(ptr, 0, nbytes)

cdef void m_copy(void* ctx, void* dst, const void* src, size_t nbytes) noexcept nogil:
    cdef Context* c = <Context*>ctx
    c.synchronize(c.rt)
    memcpy(dst, src, nbytes)

cdef void m_synchronize(void* ctx) noexcept nogil:
    cdef Context* c = <Context*>ctx
    c.synchronize(c.rt)

cdef const char* m_last_error(void* ctx) noexcept nogil:
    cdef Context* c = <Context*>ctx
    if c.host_error[0] != 0:
        return c.host_error
    return c.error(c.rt)

cdef void m_mark(void* ctx, int step, int layer) noexcept nogil:
    pass

# --- loss bookkeeping and the optimizer --------------------------------------------------------

cdef void m_fill(void* ctx, float* out, float value, Py_ssize_t n) noexcept nogil:
    cdef Context* c = <Context*>ctx
    cdef uint32_t n32 = <uint32_t>n
    cdef MetalArg args[3]
    if not fits(c, n, "fill"):
        return
    args[0], args[1], args[2] = buf(out), val(&value, 4), val(&n32, 4)
    elementwise(c, K_FILL, args, 3, n)

cdef double sum_on_device(Context* c, const float* x, Py_ssize_t n, int square) noexcept nogil:
    """The sum of x (or of its squares): partial sums by threadgroup, added here in double."""
    cdef uint32_t n32 = <uint32_t>n
    cdef MetalArg args[4]
    cdef Py_ssize_t num_groups = (n + ROW_THREADS - 1) // ROW_THREADS, i
    cdef double total = 0.0
    if not fits(c, n, "sum") or n <= 0:
        return 0.0
    num_groups = min(num_groups, <Py_ssize_t>MAX_PARTIALS)
    args[0], args[1], args[2], args[3] = buf(c.partials), buf(x), val(&n32, 4), val(&square, 4)
    groups(c, K_SUM_PARTIALS, args, 4, num_groups, 1, ROW_THREADS, 1)
    c.synchronize(c.rt)
    for i in range(num_groups):
        total += c.partials[i]
    return total

cdef float m_mean(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    return <float>(sum_on_device(<Context*>ctx, x, n, 0) / n)

cdef double m_global_norm_squared(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    return sum_on_device(<Context*>ctx, x, n, 1)

cdef void m_adamw_update(void* ctx, float* params, float* m, float* v, const float* grads,
                         Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int t) noexcept nogil:
    cdef Context* c = <Context*>ctx
    cdef uint32_t n32 = <uint32_t>n
    # as the CPU kernel computes them, in float
    cdef float beta1_correction = 1.0 - powf(beta1, t)
    cdef float beta2_correction = 1.0 - powf(beta2, t)
    cdef MetalArg args[13]
    if not fits(c, n, "adamw_update"):
        return
    args[0], args[1], args[2], args[3] = buf(params), buf(m), buf(v), buf(grads)
    args[4], args[5], args[6], args[7] = val(&n32, 4), val(&lr, 4), val(&beta1, 4), val(&beta2, 4)
    args[8], args[9], args[10] = val(&eps, 4), val(&weight_decay, 4), val(&grad_scale, 4)
    args[11], args[12] = val(&beta1_correction, 4), val(&beta2_correction, 4)
    elementwise(c, K_ADAMW, args, 13, n)

# --- GPT-2's layers ------------------------------------------------------------------------------

cdef void m_encoder_forward(void* ctx, float* out, const int* inp, const float* wte,
                            const float* wpe, int B, int T, int C) noexcept nogil:
    cdef MetalArg args[6]
    args[0], args[1], args[2], args[3] = buf(out), buf(inp), buf(wte), buf(wpe)
    args[4], args[5] = val(&T, 4), val(&C, 4)
    threads(<Context*>ctx, K_ENCODER_FORWARD, args, 6, C, <Py_ssize_t>B * T, 1, 32, 8)

cdef void m_encoder_backward(void* ctx, float* dwte, float* dwpe, const float* dout,
                             const int* inp, int B, int T, int C, int Vp) noexcept nogil:
    cdef int BT = B * T
    cdef MetalArg args[5]
    args[0], args[1], args[2], args[3], args[4] = buf(dwte), buf(dout), buf(inp), val(&BT, 4), val(&C, 4)
    threads(<Context*>ctx, K_ENCODER_BACKWARD_WTE, args, 5, C, 1, 1, LINEAR_GROUP, 1)
    args[0], args[1], args[2], args[3], args[4] = buf(dwpe), buf(dout), val(&B, 4), val(&T, 4), val(&C, 4)
    threads(<Context*>ctx, K_ENCODER_BACKWARD_WPE, args, 5, C, T, 1, 32, 8)

cdef void m_layernorm_forward(void* ctx, float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) noexcept nogil:
    cdef MetalArg args[7]
    args[0], args[1], args[2], args[3] = buf(out), buf(mean), buf(rstd), buf(inp)
    args[4], args[5], args[6] = buf(weight), buf(bias), val(&C, 4)
    groups(<Context*>ctx, K_LAYERNORM_FORWARD, args, 7, <Py_ssize_t>B * T, 1, row_threads(C), 1)

cdef void m_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight,
                               const float* mean, const float* rstd, int B, int T, int C) noexcept nogil:
    cdef int BT = B * T
    cdef MetalArg args[8]
    args[0], args[1], args[2], args[3] = buf(dinp), buf(dout), buf(inp), buf(weight)
    args[4], args[5], args[6] = buf(mean), buf(rstd), val(&C, 4)
    groups(<Context*>ctx, K_LAYERNORM_BACKWARD_DINP, args, 7, BT, 1, row_threads(C), 1)
    args[0], args[1], args[2], args[3] = buf(dweight), buf(dbias), buf(dout), buf(inp)
    args[4], args[5], args[6], args[7] = buf(mean), buf(rstd), val(&BT, 4), val(&C, 4)
    groups(<Context*>ctx, K_LAYERNORM_BACKWARD_PARAMS, args, 8, (C + LINEAR_GROUP - 1) // LINEAR_GROUP, 1,
           LINEAR_GROUP, 1)

cdef void gemm(Context* c, float* out, const float* a, const float* b, const float* bias,
               int M, int N, int K, int a_row, int a_k, int b_k, int b_col, int accumulate) noexcept nogil:
    """out (M,N) = A B (+ bias) or +=, with A(m,k) = a[m*a_row + k*a_k], B(k,n) = b[k*b_k + n*b_col]."""
    cdef int has_bias = bias != NULL
    cdef MetalArg args[13]
    args[0], args[1], args[2] = buf(out), buf(a), buf(b)
    args[3] = buf(bias if has_bias else out)   # bound but unread without a bias
    args[4], args[5], args[6] = val(&M, 4), val(&N, 4), val(&K, 4)
    args[7], args[8], args[9], args[10] = val(&a_row, 4), val(&a_k, 4), val(&b_k, 4), val(&b_col, 4)
    args[11], args[12] = val(&accumulate, 4), val(&has_bias, 4)
    groups(c, K_MATMUL, args, 13, (N + TILE - 1) // TILE, (M + TILE - 1) // TILE, TILE_THREADS, TILE_THREADS)

cdef void m_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                           const float* bias, int B, int T, int C, int OC) noexcept nogil:
    # out (BT,OC) = inp (BT,C) weight (OC,C)^T + bias
    gemm(<Context*>ctx, out, inp, weight, bias, B * T, OC, C, C, 1, 1, C, 0)

cdef void m_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* weight,
                            int B, int T, int C, int OC) noexcept nogil:
    cdef int BT = B * T
    cdef MetalArg args[4]
    gemm(<Context*>ctx, dinp, dout, weight, NULL, BT, C, OC, OC, 1, C, 1, 1)      # += dout weight
    gemm(<Context*>ctx, dweight, dout, inp, NULL, OC, C, BT, 1, OC, C, 1, 1)      # += dout^T inp
    if dbias != NULL:
        args[0], args[1], args[2], args[3] = buf(dbias), buf(dout), val(&BT, 4), val(&OC, 4)
        threads(<Context*>ctx, K_BIAS_BACKWARD, args, 4, OC, 1, 1, LINEAR_GROUP, 1)

cdef void m_attention_forward(void* ctx, float* out, float* preatt, float* att,
                              const float* inp, int B, int T, int C, int NH) noexcept nogil:
    cdef Context* c = <Context*>ctx
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t BNH = <Py_ssize_t>B * NH
    cdef MetalArg args[6]
    args[0], args[1], args[2], args[3], args[4], args[5] = buf(preatt), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4), val(&scale, 4)
    threads(c, K_ATTENTION_SCORES, args, 6, T, T, BNH, 16, 16)
    args[0], args[1], args[2] = buf(att), buf(preatt), val(&T, 4)
    groups(c, K_ATTENTION_SOFTMAX, args, 3, T, BNH, row_threads(T), 1)
    args[0], args[1], args[2], args[3], args[4], args[5] = buf(out), buf(att), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4)
    threads(c, K_ATTENTION_VALUES, args, 6, hs, T, BNH, 32, 8)

cdef void m_attention_backward(void* ctx, float* dinp, float* dpreatt, float* datt,
                               const float* dout, const float* inp, const float* att,
                               int B, int T, int C, int NH) noexcept nogil:
    cdef Context* c = <Context*>ctx
    cdef int hs = C // NH
    cdef float scale = 1.0 / sqrtf(hs)
    cdef Py_ssize_t BNH = <Py_ssize_t>B * NH
    cdef MetalArg args[7]
    args[0], args[1], args[2], args[3], args[4], args[5] = buf(datt), buf(dout), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4)
    threads(c, K_ATTENTION_BACKWARD_DATT, args, 6, T, T, BNH, 16, 16)
    args[0], args[1], args[2] = buf(dinp), buf(dout), buf(att)
    threads(c, K_ATTENTION_BACKWARD_DV, args, 6, hs, T, BNH, 32, 8)
    args[0], args[1], args[2], args[3] = buf(dpreatt), buf(datt), buf(att), val(&T, 4)
    groups(c, K_ATTENTION_BACKWARD_DPREATT, args, 4, T, BNH, row_threads(T), 1)
    args[0], args[1], args[2], args[3], args[4], args[5], args[6] = buf(dinp), buf(dpreatt), buf(inp), val(&T, 4), val(&C, 4), val(&NH, 4), val(&scale, 4)
    threads(c, K_ATTENTION_BACKWARD_DQ, args, 7, hs, T, BNH, 32, 8)
    threads(c, K_ATTENTION_BACKWARD_DK, args, 7, hs, T, BNH, 32, 8)

cdef void m_gelu_forward(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    cdef uint32_t n32 = <uint32_t>N
    cdef MetalArg args[3]
    if fits(<Context*>ctx, N, "gelu_forward"):
        args[0], args[1], args[2] = buf(out), buf(inp), val(&n32, 4)
        elementwise(<Context*>ctx, K_GELU_FORWARD, args, 3, N)

cdef void m_gelu_backward(void* ctx, float* dinp, const float* inp, const float* dout,
                          Py_ssize_t N) noexcept nogil:
    cdef uint32_t n32 = <uint32_t>N
    cdef MetalArg args[4]
    if fits(<Context*>ctx, N, "gelu_backward"):
        args[0], args[1], args[2], args[3] = buf(dinp), buf(inp), buf(dout), val(&n32, 4)
        elementwise(<Context*>ctx, K_GELU_BACKWARD, args, 4, N)

cdef void m_residual_forward(void* ctx, float* out, const float* inp1, const float* inp2,
                             Py_ssize_t N) noexcept nogil:
    cdef uint32_t n32 = <uint32_t>N
    cdef MetalArg args[4]
    if fits(<Context*>ctx, N, "residual_forward"):
        args[0], args[1], args[2], args[3] = buf(out), buf(inp1), buf(inp2), val(&n32, 4)
        elementwise(<Context*>ctx, K_RESIDUAL_FORWARD, args, 4, N)

cdef void m_residual_backward(void* ctx, float* dinp1, float* dinp2, const float* dout,
                              Py_ssize_t N) noexcept nogil:
    cdef uint32_t n32 = <uint32_t>N
    cdef MetalArg args[4]
    if fits(<Context*>ctx, N, "residual_backward"):
        args[0], args[1], args[2], args[3] = buf(dinp1), buf(dinp2), buf(dout), val(&n32, 4)
        elementwise(<Context*>ctx, K_RESIDUAL_BACKWARD, args, 4, N)

cdef void m_softmax_forward(void* ctx, float* probs, const float* logits,
                            int B, int T, int V, int Vp) noexcept nogil:
    cdef MetalArg args[4]
    args[0], args[1], args[2], args[3] = buf(probs), buf(logits), val(&V, 4), val(&Vp, 4)
    groups(<Context*>ctx, K_SOFTMAX_FORWARD, args, 4, <Py_ssize_t>B * T, 1, row_threads(V), 1)

cdef void m_crossentropy_forward(void* ctx, float* losses, const float* probs,
                                 const int* targets, int B, int T, int Vp) noexcept nogil:
    cdef MetalArg args[4]
    args[0], args[1], args[2], args[3] = buf(losses), buf(probs), buf(targets), val(&Vp, 4)
    threads(<Context*>ctx, K_CROSSENTROPY_FORWARD, args, 4, <Py_ssize_t>B * T, 1, 1, LINEAR_GROUP, 1)

cdef void m_crossentropy_softmax_backward(void* ctx, float* dlogits, const float* dlosses,
                                          const float* probs, const int* targets,
                                          int B, int T, int V, int Vp) noexcept nogil:
    cdef MetalArg args[5]
    args[0], args[1], args[2], args[3], args[4] = buf(dlogits), buf(dlosses), buf(probs), buf(targets), val(&Vp, 4)
    threads(<Context*>ctx, K_CROSSENTROPY_SOFTMAX_BACKWARD, args, 5, V, <Py_ssize_t>B * T, 1, ROW_THREADS, 1)


# --- the runtime: loading it, and the backend over it --------------------------------------------

cdef class Runtime:
    """A loaded runtime library and its open context, closed when the backend goes: its buffers
    hold the backend, so they are all freed by then (accel/backend.pyx, "Teardown")."""
    cdef void* handle
    cdef Context* ctx
    cdef readonly str device_name

    def __cinit__(self):
        self.ctx = <Context*>calloc(1, sizeof(Context))
        if self.ctx == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.ctx.rt != NULL:
            if self.ctx.partials != NULL:
                self.ctx.free(self.ctx.rt, self.ctx.partials)
            self.ctx.close(self.ctx.rt)
        free(self.ctx)
        # the library stays loaded: a runtime's code may still be referenced (atexit, TLS)


cdef void* symbol(void* handle, str name, str path) except NULL:
    cdef void* f = dlsym(handle, name.encode())
    if f == NULL:
        raise BackendError(f"{path} has no function {name}: rebuild it")
    return f


def open_runtime(str library, str kernels):
    """A Runtime over the runtime library at `library` (metal_runtime.h), its kernels from
    `kernels` (a .metallib or .metal file; the emulator's are built into it)."""
    cdef Runtime r = Runtime()
    cdef char error[512]
    cdef int i
    cdef name_f device_name
    cdef open_f open_
    cdef kernel_f kernel
    r.handle = dlopen(library.encode(), RTLD_NOW | RTLD_LOCAL)
    if r.handle == NULL:
        raise BackendError(f"cannot load {library}: {(<bytes>dlerror()).decode(errors='replace')}")
    open_ = <open_f>symbol(r.handle, "metal_open", library)
    r.ctx[0].close = <close_f>symbol(r.handle, "metal_close", library)
    device_name = <name_f>symbol(r.handle, "metal_device_name", library)
    r.ctx[0].alloc = <alloc_f>symbol(r.handle, "metal_alloc", library)
    r.ctx[0].free = <free_f>symbol(r.handle, "metal_free", library)
    kernel = <kernel_f>symbol(r.handle, "metal_kernel", library)
    r.ctx[0].dispatch_threads = <dispatch_f>symbol(r.handle, "metal_dispatch_threads", library)
    r.ctx[0].dispatch_threadgroups = <dispatch_f>symbol(r.handle, "metal_dispatch_threadgroups", library)
    r.ctx[0].synchronize = <sync_f>symbol(r.handle, "metal_synchronize", library)
    r.ctx[0].error = <name_f>symbol(r.handle, "metal_error", library)
    error[0] = 0
    r.ctx[0].rt = open_(kernels.encode(), error, sizeof(error))
    if r.ctx[0].rt == NULL:
        raise BackendError(error.decode(errors="replace") or f"{library}: metal_open failed")
    r.device_name = device_name(r.ctx[0].rt).decode(errors="replace")
    for i, name in enumerate(KERNEL_NAMES):
        r.ctx[0].kernels[i] = kernel(r.ctx[0].rt, name.encode())
        if r.ctx[0].kernels[i] == NULL:
            raise BackendError(f"{kernels}: no kernel '{name}'")
    r.ctx[0].partials = <float*>r.ctx[0].alloc(r.ctx[0].rt, MAX_PARTIALS * sizeof(float))
    if r.ctx[0].partials == NULL:
        raise BackendError("out of memory")
    return r


def create(library=None, str name="metal"):
    """The backend `name` over the runtime library (default: the Metal runtime on macOS, the
    emulator elsewhere); tests pass other builds of the emulator (planted faults, ASan)."""
    if library is None:
        library, name = (MACOS_RUNTIME, "metal") if sys.platform == "darwin" else (EMULATOR_LIBRARY, "metal-emu")
    if not os.path.exists(library):
        raise BackendError(f"{library} is not built: run `make {'metal' if library.endswith('.dylib') else 'metal-emu'}`")
    kernels = MACOS_METALLIB if library.endswith(".dylib") and os.path.exists(MACOS_METALLIB) else SOURCE
    cdef Runtime runtime = open_runtime(library, kernels)
    cdef Backend backend = Backend(name, False, ("gpt2",), runtime)
    cdef BackendTable* t = &backend.table
    t.ctx = runtime.ctx
    t.alloc = m_alloc
    t.free = m_free
    t.zero = m_zero
    t.copy_to_backend = m_copy
    t.copy_to_host = m_copy
    t.synchronize = m_synchronize
    t.last_error = m_last_error
    t.mark = m_mark
    t.fill = m_fill
    t.mean = m_mean
    t.adamw_update = m_adamw_update
    t.global_norm_squared = m_global_norm_squared
    t.encoder_forward = m_encoder_forward
    t.encoder_backward = m_encoder_backward
    t.layernorm_forward = m_layernorm_forward
    t.layernorm_backward = m_layernorm_backward
    t.matmul_forward = m_matmul_forward
    t.matmul_backward = m_matmul_backward
    t.attention_forward = m_attention_forward
    t.attention_backward = m_attention_backward
    t.gelu_forward = m_gelu_forward
    t.gelu_backward = m_gelu_backward
    t.residual_forward = m_residual_forward
    t.residual_backward = m_residual_backward
    t.softmax_forward = m_softmax_forward
    t.crossentropy_forward = m_crossentropy_forward
    t.crossentropy_softmax_backward = m_crossentropy_softmax_backward
    backend.validate()
    return backend


def create_emulated():
    """Backend metal-emu: the emulator library (`make metal-emu`)."""
    return create(EMULATOR_LIBRARY, "metal-emu")
