"""
Backends that wrap another backend NAME and watch every call of its table:

    check:NAME     each call runs on NAME and on the CPU oracle, from the same inputs (the
                   oracle keeps its own copy of every buffer); each output is compared within
                   its tolerance; the first call out of tolerance is reported (kernel, step,
                   layer, max abs and relative error) and NAME's output is replaced by the
                   oracle's, so one bad kernel does not blur the ones after it.
    profile:NAME   each call timed (NAME synchronized before the clock stops).
    guard:NAME     NAME's memory (page-aligned host memory: cpu) is mprotect-ed unreadable
                   except while NAME's own entries run: a model that touches a buffer outside
                   the table dies with SIGSEGV on the spot.

Relative error is max |NAME - oracle| / max |oracle| over one output (the scale of the
parity check's gradients); a NaN or inf where the oracle has none is always out of tolerance.
"""
import numpy as np

cimport cython
from accel.backend cimport Backend, BackendTable
from libc.math cimport fabs, isnan, isinf
from libc.stdio cimport fprintf, stderr, fflush
from libc.stdlib cimport abort, free, malloc, realloc
from libc.string cimport memcpy
from posix.mman cimport mprotect, PROT_NONE, PROT_READ, PROT_WRITE
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef enum Mode:
    CHECK = 1
    PROFILE = 2
    GUARD = 4

# the entries counted, in this order (ENTRIES names them for Python, entry_names for C)
cdef enum Entry:
    E_ZERO, E_COPY_TO_BACKEND, E_COPY_TO_HOST, E_FILL, E_MEAN, E_ADAMW_UPDATE,
    E_GLOBAL_NORM_SQUARED, E_ENCODER_FORWARD, E_ENCODER_BACKWARD, E_LAYERNORM_FORWARD,
    E_LAYERNORM_BACKWARD, E_MATMUL_FORWARD, E_MATMUL_BACKWARD, E_ATTENTION_FORWARD,
    E_ATTENTION_BACKWARD, E_GELU_FORWARD, E_GELU_BACKWARD, E_RESIDUAL_FORWARD,
    E_RESIDUAL_BACKWARD, E_SOFTMAX_FORWARD, E_CROSSENTROPY_FORWARD,
    E_CROSSENTROPY_SOFTMAX_BACKWARD,
    E_EMBEDDING_FORWARD, E_EMBEDDING_BACKWARD, E_RMSNORM_FORWARD, E_RMSNORM_BACKWARD,
    E_ROPE_FORWARD, E_ROPE_BACKWARD, E_SWIGLU_FORWARD, E_SWIGLU_BACKWARD,
    E_ATTENTION_GQA_FORWARD, E_ATTENTION_GQA_BACKWARD, E_CLASSIFIER_FORWARD,
    E_CLASSIFIER_BACKWARD,
    E_FLASH_ATTENTION_FORWARD, E_FLASH_ATTENTION_BACKWARD, NUM_ENTRIES

ENTRIES = ("zero", "copy_to_backend", "copy_to_host", "fill", "mean", "adamw_update",
           "global_norm_squared", "encoder_forward", "encoder_backward", "layernorm_forward",
           "layernorm_backward", "matmul_forward", "matmul_backward", "attention_forward",
           "attention_backward", "gelu_forward", "gelu_backward", "residual_forward",
           "residual_backward", "softmax_forward", "crossentropy_forward",
           "crossentropy_softmax_backward",
           "embedding_forward", "embedding_backward", "rmsnorm_forward", "rmsnorm_backward",
           "rope_forward", "rope_backward", "swiglu_forward", "swiglu_backward",
           "attention_gqa_forward", "attention_gqa_backward", "classifier_forward",
           "classifier_backward",
           "flash_attention_forward", "flash_attention_backward")
assert len(ENTRIES) == NUM_ENTRIES
cdef list _entry_bytes = [name.encode() for name in ENTRIES]   # entry_names points into these
cdef const char* entry_names[<int>NUM_ENTRIES]
cdef bytes _name
for _i, _name in enumerate(_entry_bytes):
    entry_names[_i] = _name

# the default tolerance of every output (relative to the oracle output's largest magnitude)
DEFAULT_TOLERANCE = 1e-5
cdef double default_tolerance = DEFAULT_TOLERANCE


ctypedef struct Allocation:
    char* base
    size_t nbytes
    char* oracle_base       # NULL unless checking

ctypedef struct EntryStats:
    long calls
    double seconds
    long outputs_compared
    long mismatches
    double worst_error      # the largest relative error seen

ctypedef struct Instrument:
    BackendTable target
    BackendTable oracle
    int mode
    Allocation* allocations
    int num_allocations, capacity
    float* scratch          # host copy of one target output, for comparing
    size_t scratch_bytes
    int step, layer
    double tolerance[<int>NUM_ENTRIES]
    EntryStats stats[<int>NUM_ENTRIES]
    int first_entry         # the first call out of tolerance, -1 until there is one
    int first_step, first_layer
    double first_abs, first_rel


cdef double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


# --- the allocations: target pointer -> oracle pointer, and guarding ------------------------

cdef Allocation* find(Instrument* s, const void* ptr) noexcept nogil:
    cdef int i
    cdef const char* p = <const char*>ptr
    for i in range(s.num_allocations):
        if s.allocations[i].base <= p < s.allocations[i].base + s.allocations[i].nbytes:
            return &s.allocations[i]
    return NULL

cdef void* oracle_of(Instrument* s, const void* ptr) noexcept nogil:
    """The oracle's copy of the byte at ptr (NULL for NULL)."""
    if ptr == NULL:
        return NULL
    cdef Allocation* a = find(s, ptr)
    if a == NULL:
        # a model bug, not bad input: a pointer that was not allocated through the backend
        fprintf(stderr, "check: a kernel was passed a pointer not allocated through the backend\n")
        abort()
    return a.oracle_base + (<const char*>ptr - a.base)

cdef inline float* of(Instrument* s, const float* ptr) noexcept nogil:
    return <float*>oracle_of(s, ptr)

cdef inline int* of_int(Instrument* s, const int* ptr) noexcept nogil:
    return <int*>oracle_of(s, ptr)

cdef void protect(Instrument* s, int prot) noexcept nogil:
    cdef int i
    for i in range(s.num_allocations):
        mprotect(s.allocations[i].base, s.allocations[i].nbytes, prot)

cdef double enter(Instrument* s) noexcept nogil:
    """Before a target call: its memory opened (guard), the clock started (profile)."""
    if s.mode & GUARD:
        protect(s, PROT_READ | PROT_WRITE)
    if s.mode & PROFILE:
        s.target.synchronize(s.target.ctx)
        return now()
    return 0.0

cdef void leave(Instrument* s, Entry entry, double start) noexcept nogil:
    s.stats[<int>entry].calls += 1
    if s.mode & PROFILE:
        s.target.synchronize(s.target.ctx)
        s.stats[<int>entry].seconds += now() - start
    if s.mode & GUARD:
        protect(s, PROT_NONE)


# --- comparing an output with the oracle's ---------------------------------------------------

cdef void mismatch(Instrument* s, Entry entry, double abs_err, double rel_err) noexcept nogil:
    s.stats[<int>entry].mismatches += 1
    if s.first_entry < 0:
        s.first_entry, s.first_step, s.first_layer = entry, s.step, s.layer
        s.first_abs, s.first_rel = abs_err, rel_err
        fprintf(stderr, "check: %s out of tolerance at step %d, layer %d: max abs err %.3e, "
                "relative %.3e (tolerance %.1e); carrying on from the oracle's result\n",
                entry_names[<int>entry], s.step, s.layer, abs_err, rel_err, s.tolerance[<int>entry])
        fflush(stderr)

cdef void compare(Instrument* s, Entry entry, float* out, Py_ssize_t n, int causal_T=0) noexcept nogil:
    """Compare n floats of a target output with the oracle's; on a mismatch, overwrite the
    target's with the oracle's.  causal_T > 0: (..., T, T) scores, compared at t2 <= t only."""
    if out == NULL or n <= 0:
        return
    cdef const float* expected = of(s, out)
    cdef size_t nbytes = n * sizeof(float)
    cdef Py_ssize_t i, row, col
    cdef double a, e, diff, max_diff = 0.0, max_expected = 0.0, rel
    cdef bint broken = False
    if nbytes > s.scratch_bytes:
        free(s.scratch)
        s.scratch = <float*>malloc(nbytes)
        s.scratch_bytes = nbytes if s.scratch != NULL else 0
        if s.scratch == NULL:
            fprintf(stderr, "check: out of memory for a comparison\n")
            abort()
    s.target.copy_to_host(s.target.ctx, s.scratch, out, nbytes)
    for i in range(n):
        if causal_T > 0:
            row, col = (i // causal_T) % causal_T, i % causal_T
            if col > row:
                continue
        a, e = s.scratch[i], expected[i]
        if isnan(e) or isinf(e):
            if not (a == e or (isnan(a) and isnan(e))):
                broken = True
            continue
        if isnan(a) or isinf(a):
            broken = True
            continue
        diff = fabs(a - e)
        if diff > max_diff:
            max_diff = diff
        if fabs(e) > max_expected:
            max_expected = fabs(e)
    rel = max_diff / max_expected if max_expected > 0.0 else max_diff
    if broken:
        rel = 1.0 / 0.0
    s.stats[<int>entry].outputs_compared += 1
    if rel > s.stats[<int>entry].worst_error:
        s.stats[<int>entry].worst_error = rel
    if rel > s.tolerance[<int>entry]:
        mismatch(s, entry, max_diff, rel)
        s.target.copy_to_backend(s.target.ctx, out, expected, nbytes)
    elif s.tolerance[<int>entry] > default_tolerance:
        # a lower-precision entry within its tolerance (ane-emu's fp16): the oracle carries on
        # from the target's result, so the next kernels are judged on the same inputs
        memcpy(<void*>expected, s.scratch, nbytes)

cdef double compare_scalar(Instrument* s, Entry entry, double got, double expected) noexcept nogil:
    """The value to carry on with: the target's, or the oracle's if out of tolerance."""
    cdef double diff = fabs(got - expected)
    cdef double rel = diff / fabs(expected) if expected != 0.0 else diff
    if isnan(got) and not isnan(expected):
        rel = 1.0 / 0.0
    s.stats[<int>entry].outputs_compared += 1
    if rel > s.stats[<int>entry].worst_error:
        s.stats[<int>entry].worst_error = rel
    if rel > s.tolerance[<int>entry]:
        mismatch(s, entry, diff, rel)
        return expected
    return got


# --- memory ---------------------------------------------------------------------------------

cdef void* w_alloc(void* ctx, size_t nbytes) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef Allocation* grown
    cdef char* oracle_base = NULL
    if s.num_allocations == s.capacity:
        grown = <Allocation*>realloc(s.allocations, (2 * s.capacity + 8) * sizeof(Allocation))
        if grown == NULL:
            return NULL
        s.allocations, s.capacity = grown, 2 * s.capacity + 8
    cdef char* base = <char*>s.target.alloc(s.target.ctx, nbytes)
    if base == NULL:
        return NULL
    if s.mode & CHECK:
        oracle_base = <char*>s.oracle.alloc(s.oracle.ctx, nbytes)
        if oracle_base == NULL:
            s.target.free(s.target.ctx, base, nbytes)
            return NULL
    s.allocations[s.num_allocations] = Allocation(base, nbytes, oracle_base)
    s.num_allocations += 1
    if s.mode & GUARD:
        mprotect(base, nbytes, PROT_NONE)
    return base

cdef void w_free(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef Allocation* a = find(s, ptr)
    if a == NULL:
        return
    if s.mode & GUARD:
        mprotect(a.base, a.nbytes, PROT_READ | PROT_WRITE)
    s.target.free(s.target.ctx, a.base, a.nbytes)
    if a.oracle_base != NULL:
        s.oracle.free(s.oracle.ctx, a.oracle_base, a.nbytes)
    s.num_allocations -= 1
    a[0] = s.allocations[s.num_allocations]

cdef void w_zero(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.zero(s.target.ctx, ptr, nbytes)
    leave(s, E_ZERO, start)
    if s.mode & CHECK:
        s.oracle.zero(s.oracle.ctx, oracle_of(s, ptr), nbytes)

cdef void w_copy_to_backend(void* ctx, void* dst, const void* src, size_t nbytes) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.copy_to_backend(s.target.ctx, dst, src, nbytes)
    leave(s, E_COPY_TO_BACKEND, start)
    if s.mode & CHECK:
        s.oracle.copy_to_backend(s.oracle.ctx, oracle_of(s, dst), src, nbytes)

cdef void w_copy_to_host(void* ctx, void* dst, const void* src, size_t nbytes) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.copy_to_host(s.target.ctx, dst, src, nbytes)
    leave(s, E_COPY_TO_HOST, start)

cdef void w_synchronize(void* ctx) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    s.target.synchronize(s.target.ctx)

cdef const char* w_last_error(void* ctx) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    return s.target.last_error(s.target.ctx)

cdef void w_mark(void* ctx, int step, int layer) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    s.step, s.layer = step, layer
    s.target.mark(s.target.ctx, step, layer)

# --- loss bookkeeping and the optimizer -------------------------------------------------------

cdef void w_fill(void* ctx, float* out, float value, Py_ssize_t n) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.fill(s.target.ctx, out, value, n)
    leave(s, E_FILL, start)
    if s.mode & CHECK:
        s.oracle.fill(s.oracle.ctx, of(s, out), value, n)
        compare(s, E_FILL, out, n)

cdef float w_mean(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    cdef float result = s.target.mean(s.target.ctx, x, n)
    leave(s, E_MEAN, start)
    if s.mode & CHECK:
        result = <float>compare_scalar(s, E_MEAN, result, s.oracle.mean(s.oracle.ctx, of(s, x), n))
    return result

cdef void w_adamw_update(void* ctx, float* params, float* m, float* v, const float* grads,
                         Py_ssize_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int t) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.adamw_update(s.target.ctx, params, m, v, grads, n, lr, beta1, beta2, eps,
                          weight_decay, grad_scale, t)
    leave(s, E_ADAMW_UPDATE, start)
    if s.mode & CHECK:
        s.oracle.adamw_update(s.oracle.ctx, of(s, params), of(s, m), of(s, v), of(s, grads), n,
                              lr, beta1, beta2, eps, weight_decay, grad_scale, t)
        compare(s, E_ADAMW_UPDATE, params, n)
        compare(s, E_ADAMW_UPDATE, m, n)
        compare(s, E_ADAMW_UPDATE, v, n)

cdef double w_global_norm_squared(void* ctx, const float* x, Py_ssize_t n) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    cdef double result = s.target.global_norm_squared(s.target.ctx, x, n)
    leave(s, E_GLOBAL_NORM_SQUARED, start)
    if s.mode & CHECK:
        result = compare_scalar(s, E_GLOBAL_NORM_SQUARED, result,
                                s.oracle.global_norm_squared(s.oracle.ctx, of(s, x), n))
    return result

# --- GPT-2's layers ---------------------------------------------------------------------------

cdef void w_encoder_forward(void* ctx, float* out, const int* inp, const float* wte,
                            const float* wpe, int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.encoder_forward(s.target.ctx, out, inp, wte, wpe, B, T, C)
    leave(s, E_ENCODER_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.encoder_forward(s.oracle.ctx, of(s, out), of_int(s, inp), of(s, wte), of(s, wpe), B, T, C)
        compare(s, E_ENCODER_FORWARD, out, <Py_ssize_t>B * T * C)

cdef void w_encoder_backward(void* ctx, float* dwte, float* dwpe, const float* dout,
                             const int* inp, int B, int T, int C, int Vp) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.encoder_backward(s.target.ctx, dwte, dwpe, dout, inp, B, T, C, Vp)
    leave(s, E_ENCODER_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.encoder_backward(s.oracle.ctx, of(s, dwte), of(s, dwpe), of(s, dout),
                                  of_int(s, inp), B, T, C, Vp)
        compare(s, E_ENCODER_BACKWARD, dwte, <Py_ssize_t>Vp * C)
        compare(s, E_ENCODER_BACKWARD, dwpe, <Py_ssize_t>T * C)

cdef void w_layernorm_forward(void* ctx, float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.layernorm_forward(s.target.ctx, out, mean, rstd, inp, weight, bias, B, T, C)
    leave(s, E_LAYERNORM_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.layernorm_forward(s.oracle.ctx, of(s, out), of(s, mean), of(s, rstd), of(s, inp),
                                   of(s, weight), of(s, bias), B, T, C)
        compare(s, E_LAYERNORM_FORWARD, out, <Py_ssize_t>B * T * C)
        compare(s, E_LAYERNORM_FORWARD, mean, <Py_ssize_t>B * T)
        compare(s, E_LAYERNORM_FORWARD, rstd, <Py_ssize_t>B * T)

cdef void w_layernorm_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight,
                               const float* mean, const float* rstd, int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.layernorm_backward(s.target.ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C)
    leave(s, E_LAYERNORM_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.layernorm_backward(s.oracle.ctx, of(s, dinp), of(s, dweight), of(s, dbias),
                                    of(s, dout), of(s, inp), of(s, weight), of(s, mean),
                                    of(s, rstd), B, T, C)
        compare(s, E_LAYERNORM_BACKWARD, dinp, <Py_ssize_t>B * T * C)
        compare(s, E_LAYERNORM_BACKWARD, dweight, C)
        compare(s, E_LAYERNORM_BACKWARD, dbias, C)

cdef void w_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                           const float* bias, int B, int T, int C, int OC) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.matmul_forward(s.target.ctx, out, inp, weight, bias, B, T, C, OC)
    leave(s, E_MATMUL_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.matmul_forward(s.oracle.ctx, of(s, out), of(s, inp), of(s, weight), of(s, bias),
                                B, T, C, OC)
        compare(s, E_MATMUL_FORWARD, out, <Py_ssize_t>B * T * OC)

cdef void w_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                            const float* dout, const float* inp, const float* weight,
                            int B, int T, int C, int OC) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.matmul_backward(s.target.ctx, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC)
    leave(s, E_MATMUL_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.matmul_backward(s.oracle.ctx, of(s, dinp), of(s, dweight), of(s, dbias),
                                 of(s, dout), of(s, inp), of(s, weight), B, T, C, OC)
        compare(s, E_MATMUL_BACKWARD, dinp, <Py_ssize_t>B * T * C)
        compare(s, E_MATMUL_BACKWARD, dweight, <Py_ssize_t>OC * C)
        compare(s, E_MATMUL_BACKWARD, dbias, OC)

cdef void w_attention_forward(void* ctx, float* out, float* preatt, float* att,
                              const float* inp, int B, int T, int C, int NH) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.attention_forward(s.target.ctx, out, preatt, att, inp, B, T, C, NH)
    leave(s, E_ATTENTION_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.attention_forward(s.oracle.ctx, of(s, out), of(s, preatt), of(s, att), of(s, inp),
                                   B, T, C, NH)
        compare(s, E_ATTENTION_FORWARD, out, <Py_ssize_t>B * T * C)
        compare(s, E_ATTENTION_FORWARD, preatt, <Py_ssize_t>B * NH * T * T, T)
        compare(s, E_ATTENTION_FORWARD, att, <Py_ssize_t>B * NH * T * T, T)

cdef void w_attention_backward(void* ctx, float* dinp, float* dpreatt, float* datt,
                               const float* dout, const float* inp, const float* att,
                               int B, int T, int C, int NH) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.attention_backward(s.target.ctx, dinp, dpreatt, datt, dout, inp, att, B, T, C, NH)
    leave(s, E_ATTENTION_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.attention_backward(s.oracle.ctx, of(s, dinp), of(s, dpreatt), of(s, datt),
                                    of(s, dout), of(s, inp), of(s, att), B, T, C, NH)
        compare(s, E_ATTENTION_BACKWARD, dinp, <Py_ssize_t>B * T * 3 * C)
        compare(s, E_ATTENTION_BACKWARD, dpreatt, <Py_ssize_t>B * NH * T * T, T)
        compare(s, E_ATTENTION_BACKWARD, datt, <Py_ssize_t>B * NH * T * T, T)

cdef void w_gelu_forward(void* ctx, float* out, const float* inp, Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.gelu_forward(s.target.ctx, out, inp, N)
    leave(s, E_GELU_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.gelu_forward(s.oracle.ctx, of(s, out), of(s, inp), N)
        compare(s, E_GELU_FORWARD, out, N)

cdef void w_gelu_backward(void* ctx, float* dinp, const float* inp, const float* dout,
                          Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.gelu_backward(s.target.ctx, dinp, inp, dout, N)
    leave(s, E_GELU_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.gelu_backward(s.oracle.ctx, of(s, dinp), of(s, inp), of(s, dout), N)
        compare(s, E_GELU_BACKWARD, dinp, N)

cdef void w_residual_forward(void* ctx, float* out, const float* inp1, const float* inp2,
                             Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.residual_forward(s.target.ctx, out, inp1, inp2, N)
    leave(s, E_RESIDUAL_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.residual_forward(s.oracle.ctx, of(s, out), of(s, inp1), of(s, inp2), N)
        compare(s, E_RESIDUAL_FORWARD, out, N)

cdef void w_residual_backward(void* ctx, float* dinp1, float* dinp2, const float* dout,
                              Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.residual_backward(s.target.ctx, dinp1, dinp2, dout, N)
    leave(s, E_RESIDUAL_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.residual_backward(s.oracle.ctx, of(s, dinp1), of(s, dinp2), of(s, dout), N)
        compare(s, E_RESIDUAL_BACKWARD, dinp1, N)
        compare(s, E_RESIDUAL_BACKWARD, dinp2, N)

cdef void w_softmax_forward(void* ctx, float* probs, const float* logits,
                            int B, int T, int V, int Vp) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.softmax_forward(s.target.ctx, probs, logits, B, T, V, Vp)
    leave(s, E_SOFTMAX_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.softmax_forward(s.oracle.ctx, of(s, probs), of(s, logits), B, T, V, Vp)
        compare(s, E_SOFTMAX_FORWARD, probs, <Py_ssize_t>B * T * Vp)

cdef void w_crossentropy_forward(void* ctx, float* losses, const float* probs,
                                 const int* targets, int B, int T, int Vp) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.crossentropy_forward(s.target.ctx, losses, probs, targets, B, T, Vp)
    leave(s, E_CROSSENTROPY_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.crossentropy_forward(s.oracle.ctx, of(s, losses), of(s, probs), of_int(s, targets),
                                      B, T, Vp)
        compare(s, E_CROSSENTROPY_FORWARD, losses, <Py_ssize_t>B * T)

cdef void w_crossentropy_softmax_backward(void* ctx, float* dlogits, const float* dlosses,
                                          const float* probs, const int* targets,
                                          int B, int T, int V, int Vp) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.crossentropy_softmax_backward(s.target.ctx, dlogits, dlosses, probs, targets, B, T, V, Vp)
    leave(s, E_CROSSENTROPY_SOFTMAX_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.crossentropy_softmax_backward(s.oracle.ctx, of(s, dlogits), of(s, dlosses),
                                               of(s, probs), of_int(s, targets), B, T, V, Vp)
        compare(s, E_CROSSENTROPY_SOFTMAX_BACKWARD, dlogits, <Py_ssize_t>B * T * Vp)

# --- flash attention --------------------------------------------------------------------------

cdef void w_flash_attention_forward(void* ctx, float* out, float* lse, const float* inp,
                                    int B, int T, int C, int NH) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.flash_attention_forward(s.target.ctx, out, lse, inp, B, T, C, NH)
    leave(s, E_FLASH_ATTENTION_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.flash_attention_forward(s.oracle.ctx, of(s, out), of(s, lse), of(s, inp), B, T, C, NH)
        compare(s, E_FLASH_ATTENTION_FORWARD, out, <Py_ssize_t>B * T * C)
        compare(s, E_FLASH_ATTENTION_FORWARD, lse, <Py_ssize_t>B * NH * T)

cdef void w_flash_attention_backward(void* ctx, float* dinp, const float* dout, const float* inp,
                                     const float* out, const float* lse,
                                     int B, int T, int C, int NH) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.flash_attention_backward(s.target.ctx, dinp, dout, inp, out, lse, B, T, C, NH)
    leave(s, E_FLASH_ATTENTION_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.flash_attention_backward(s.oracle.ctx, of(s, dinp), of(s, dout), of(s, inp),
                                          of(s, out), of(s, lse), B, T, C, NH)
        compare(s, E_FLASH_ATTENTION_BACKWARD, dinp, <Py_ssize_t>B * T * 3 * C)


# --- Llama's layers ----------------------------------------------------------------------------

cdef void w_embedding_forward(void* ctx, float* out, const int* inp, const float* wte,
                              int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.embedding_forward(s.target.ctx, out, inp, wte, B, T, C)
    leave(s, E_EMBEDDING_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.embedding_forward(s.oracle.ctx, of(s, out), of_int(s, inp), of(s, wte), B, T, C)
        compare(s, E_EMBEDDING_FORWARD, out, <Py_ssize_t>B * T * C)

cdef void w_embedding_backward(void* ctx, float* dwte, const float* dout, const int* inp,
                               int B, int T, int C, int V) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.embedding_backward(s.target.ctx, dwte, dout, inp, B, T, C, V)
    leave(s, E_EMBEDDING_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.embedding_backward(s.oracle.ctx, of(s, dwte), of(s, dout), of_int(s, inp),
                                    B, T, C, V)
        compare(s, E_EMBEDDING_BACKWARD, dwte, <Py_ssize_t>V * C)

cdef void w_rmsnorm_forward(void* ctx, float* out, float* rstd, const float* inp,
                            const float* weight, float eps, int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.rmsnorm_forward(s.target.ctx, out, rstd, inp, weight, eps, B, T, C)
    leave(s, E_RMSNORM_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.rmsnorm_forward(s.oracle.ctx, of(s, out), of(s, rstd), of(s, inp), of(s, weight),
                                 eps, B, T, C)
        compare(s, E_RMSNORM_FORWARD, out, <Py_ssize_t>B * T * C)
        compare(s, E_RMSNORM_FORWARD, rstd, <Py_ssize_t>B * T)

cdef void w_rmsnorm_backward(void* ctx, float* dinp, float* dweight, const float* dout,
                             const float* inp, const float* weight, const float* rstd,
                             int B, int T, int C) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.rmsnorm_backward(s.target.ctx, dinp, dweight, dout, inp, weight, rstd, B, T, C)
    leave(s, E_RMSNORM_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.rmsnorm_backward(s.oracle.ctx, of(s, dinp), of(s, dweight), of(s, dout),
                                  of(s, inp), of(s, weight), of(s, rstd), B, T, C)
        compare(s, E_RMSNORM_BACKWARD, dinp, <Py_ssize_t>B * T * C)
        compare(s, E_RMSNORM_BACKWARD, dweight, C)

cdef void w_rope_forward(void* ctx, float* out, const float* inp, const float* freqs_cos,
                         const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.rope_forward(s.target.ctx, out, inp, freqs_cos, freqs_sin, B, T, NH, hs)
    leave(s, E_ROPE_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.rope_forward(s.oracle.ctx, of(s, out), of(s, inp), of(s, freqs_cos),
                              of(s, freqs_sin), B, T, NH, hs)
        compare(s, E_ROPE_FORWARD, out, <Py_ssize_t>B * T * NH * hs)

cdef void w_rope_backward(void* ctx, float* dinp, const float* dout, const float* freqs_cos,
                          const float* freqs_sin, int B, int T, int NH, int hs) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.rope_backward(s.target.ctx, dinp, dout, freqs_cos, freqs_sin, B, T, NH, hs)
    leave(s, E_ROPE_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.rope_backward(s.oracle.ctx, of(s, dinp), of(s, dout), of(s, freqs_cos),
                               of(s, freqs_sin), B, T, NH, hs)
        compare(s, E_ROPE_BACKWARD, dinp, <Py_ssize_t>B * T * NH * hs)

cdef void w_swiglu_forward(void* ctx, float* out, const float* a, const float* b,
                           Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.swiglu_forward(s.target.ctx, out, a, b, N)
    leave(s, E_SWIGLU_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.swiglu_forward(s.oracle.ctx, of(s, out), of(s, a), of(s, b), N)
        compare(s, E_SWIGLU_FORWARD, out, N)

cdef void w_swiglu_backward(void* ctx, float* da, float* db, const float* dout, const float* a,
                            const float* b, Py_ssize_t N) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.swiglu_backward(s.target.ctx, da, db, dout, a, b, N)
    leave(s, E_SWIGLU_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.swiglu_backward(s.oracle.ctx, of(s, da), of(s, db), of(s, dout), of(s, a),
                                 of(s, b), N)
        compare(s, E_SWIGLU_BACKWARD, da, N)
        compare(s, E_SWIGLU_BACKWARD, db, N)

cdef void w_attention_gqa_forward(void* ctx, float* out, float* att, const float* q,
                                  const float* k, const float* v,
                                  int B, int T, int NH, int NKV, int hs) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.attention_gqa_forward(s.target.ctx, out, att, q, k, v, B, T, NH, NKV, hs)
    leave(s, E_ATTENTION_GQA_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.attention_gqa_forward(s.oracle.ctx, of(s, out), of(s, att), of(s, q), of(s, k),
                                       of(s, v), B, T, NH, NKV, hs)
        compare(s, E_ATTENTION_GQA_FORWARD, out, <Py_ssize_t>B * T * NH * hs)
        compare(s, E_ATTENTION_GQA_FORWARD, att, <Py_ssize_t>B * NH * T * T, T)

cdef void w_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv, const float* dout,
                                   const float* q, const float* k, const float* v,
                                   const float* att, int B, int T, int NH, int NKV,
                                   int hs) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.attention_gqa_backward(s.target.ctx, dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, hs)
    leave(s, E_ATTENTION_GQA_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.attention_gqa_backward(s.oracle.ctx, of(s, dq), of(s, dk), of(s, dv), of(s, dout),
                                        of(s, q), of(s, k), of(s, v), of(s, att),
                                        B, T, NH, NKV, hs)
        compare(s, E_ATTENTION_GQA_BACKWARD, dq, <Py_ssize_t>B * T * NH * hs)
        compare(s, E_ATTENTION_GQA_BACKWARD, dk, <Py_ssize_t>B * T * NKV * hs)
        compare(s, E_ATTENTION_GQA_BACKWARD, dv, <Py_ssize_t>B * T * NKV * hs)

cdef void w_classifier_forward(void* ctx, float* losses, float* logsum, const float* logits,
                               const int* targets, int B, int T, int V) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.classifier_forward(s.target.ctx, losses, logsum, logits, targets, B, T, V)
    leave(s, E_CLASSIFIER_FORWARD, start)
    if s.mode & CHECK:
        s.oracle.classifier_forward(s.oracle.ctx, of(s, losses), of(s, logsum), of(s, logits),
                                    of_int(s, targets), B, T, V)
        compare(s, E_CLASSIFIER_FORWARD, losses, <Py_ssize_t>B * T)
        compare(s, E_CLASSIFIER_FORWARD, logsum, <Py_ssize_t>B * T)

cdef void w_classifier_backward(void* ctx, float* dlogits, const float* dlosses,
                                const float* logits, const float* logsum, const int* targets,
                                int B, int T, int V) noexcept nogil:
    cdef Instrument* s = <Instrument*>ctx
    cdef double start = enter(s)
    s.target.classifier_backward(s.target.ctx, dlogits, dlosses, logits, logsum, targets, B, T, V)
    leave(s, E_CLASSIFIER_BACKWARD, start)
    if s.mode & CHECK:
        s.oracle.classifier_backward(s.oracle.ctx, of(s, dlogits), of(s, dlosses), of(s, logits),
                                     of(s, logsum), of_int(s, targets), B, T, V)
        compare(s, E_CLASSIFIER_BACKWARD, dlogits, <Py_ssize_t>B * T * V)


# --- the Python side ----------------------------------------------------------------------------

@cython.no_gc_clear   # s holds target's and oracle's tables: they go after it (accel/backend.pyx)
cdef class InstrumentedBackend(Backend):
    """A Backend whose table is this module's wrappers around `target`'s (and the oracle's)."""
    cdef Instrument* s
    cdef readonly Backend target, oracle

    def __dealloc__(self):
        if self.s != NULL:
            free(self.s.allocations)
            free(self.s.scratch)
            free(self.s)

    def set_tolerance(self, double tolerance, entry=None):
        """The relative tolerance of one entry's outputs (of all, with entry None)."""
        for i, name in enumerate(ENTRIES):
            if entry is None or entry == name:
                self.s.tolerance[i] = tolerance
        if entry is not None and entry not in ENTRIES:
            raise ValueError(f"no entry {entry!r}")

    def reset(self):
        """Forget the counts, times and mismatches so far."""
        cdef int i
        for i in range(<int>NUM_ENTRIES):
            self.s.stats[i] = EntryStats(0, 0.0, 0, 0, 0.0)
        self.s.first_entry = -1

    def report(self):
        """{"entries": {name: {calls, seconds, compared, mismatches, worst_error}}, "first":
        None or {entry, step, layer, abs_error, rel_error}, "mismatches": total}."""
        entries = {}
        for i, name in enumerate(ENTRIES):
            st = self.s.stats[i]
            if st["calls"]:
                entries[name] = dict(calls=st["calls"], seconds=st["seconds"],
                                     compared=st["outputs_compared"], mismatches=st["mismatches"],
                                     worst_error=st["worst_error"])
        first = None
        if self.s.first_entry >= 0:
            first = dict(entry=ENTRIES[self.s.first_entry], step=self.s.first_step,
                         layer=self.s.first_layer, abs_error=self.s.first_abs,
                         rel_error=self.s.first_rel)
        return dict(entries=entries, first=first,
                    mismatches=sum(e["mismatches"] for e in entries.values()))

    def summary(self):
        """One line: what was compared and how it went (check:), or the time spent (profile:)."""
        r = self.report()
        if self.s.mode & CHECK:
            compared = sum(e["compared"] for e in r["entries"].values())
            if r["first"] is None:
                return f"{self.name}: {compared} outputs compared, all within tolerance"
            f = r["first"]
            return (f"{self.name}: {r['mismatches']} of {compared} outputs out of tolerance; the "
                    f"first: {f['entry']} at step {f['step']}, layer {f['layer']} (relative "
                    f"error {f['rel_error']:.2e})")
        total = sum(e["seconds"] for e in r["entries"].values())
        return f"{self.name}: {total * 1e3:.1f} ms in {sum(e['calls'] for e in r['entries'].values())} calls"


def create(str wrapper, Backend target):
    """wrapper:target ("check", "profile" or "guard")."""
    from accel.backend import BackendError, get_backend
    cdef int mode = {"check": CHECK, "profile": PROFILE, "guard": GUARD}[wrapper]
    if mode == GUARD and not target.host_visible:
        raise BackendError(f"guard:{target.name}: guarding needs host memory (guard:cpu)")
    oracle = get_backend("cpu") if mode == CHECK else None
    # check: claims only the families the oracle can check too
    families = tuple(f for f in target.families if oracle is None or oracle.supports(f))
    cdef InstrumentedBackend b = InstrumentedBackend(
        f"{wrapper}:{target.name}", target.host_visible and mode == PROFILE, families)
    b.target = target
    b.oracle = oracle
    b.s = <Instrument*>malloc(sizeof(Instrument))
    if b.s == NULL:
        raise MemoryError()
    b.s.target = target.table
    if b.oracle is not None:
        b.s.oracle = b.oracle.table
    b.s.mode = mode
    b.s.allocations, b.s.num_allocations, b.s.capacity = NULL, 0, 0
    b.s.scratch, b.s.scratch_bytes = NULL, 0
    b.s.step, b.s.layer = 0, -1
    b.reset()
    b.set_tolerance(DEFAULT_TOLERANCE)
    for entry, tolerance in getattr(target, "tolerances", {}).items():   # e.g. fp16 entries
        b.set_tolerance(tolerance, entry)
    b.keepalive = (target, b.oracle)

    cdef BackendTable* t = &b.table
    t.ctx = b.s
    t.alloc = w_alloc
    t.free = w_free
    t.zero = w_zero
    t.copy_to_backend = w_copy_to_backend
    t.copy_to_host = w_copy_to_host
    t.synchronize = w_synchronize
    t.last_error = w_last_error
    t.mark = w_mark
    t.fill = w_fill
    t.mean = w_mean
    t.adamw_update = w_adamw_update
    t.global_norm_squared = w_global_norm_squared
    t.encoder_forward = w_encoder_forward
    t.encoder_backward = w_encoder_backward
    t.layernorm_forward = w_layernorm_forward
    t.layernorm_backward = w_layernorm_backward
    t.matmul_forward = w_matmul_forward
    t.matmul_backward = w_matmul_backward
    t.attention_forward = w_attention_forward
    t.attention_backward = w_attention_backward
    t.gelu_forward = w_gelu_forward
    t.gelu_backward = w_gelu_backward
    t.residual_forward = w_residual_forward
    t.residual_backward = w_residual_backward
    t.softmax_forward = w_softmax_forward
    t.crossentropy_forward = w_crossentropy_forward
    t.crossentropy_softmax_backward = w_crossentropy_softmax_backward
    t.embedding_forward = w_embedding_forward
    t.embedding_backward = w_embedding_backward
    t.rmsnorm_forward = w_rmsnorm_forward
    t.rmsnorm_backward = w_rmsnorm_backward
    t.rope_forward = w_rope_forward
    t.rope_backward = w_rope_backward
    t.swiglu_forward = w_swiglu_forward
    t.swiglu_backward = w_swiglu_backward
    t.attention_gqa_forward = w_attention_gqa_forward
    t.attention_gqa_backward = w_attention_gqa_backward
    t.classifier_forward = w_classifier_forward
    t.classifier_backward = w_classifier_backward
    if "flash" in families:
        t.flash_attention_forward = w_flash_attention_forward
        t.flash_attention_backward = w_flash_attention_backward
    b.validate()
    return b
