"""
Backends that wrap another backend NAME and watch every call of its table:

    check:NAME     each call runs on NAME and on the CPU oracle, from the same inputs (the
                   oracle keeps its own copy of every buffer); each output is compared within
                   its tolerance; the first call out of tolerance is reported (kernel, step,
                   layer, max abs and relative error) and NAME's output is replaced by the
                   oracle's, so one bad kernel does not blur the ones after it.  An output
                   within tolerance is copied to the oracle: each kernel is judged on the very
                   inputs NAME gave it, and only on its own rounding.
    profile:NAME   each call timed (NAME synchronized before the clock stops).
    guard:NAME     NAME's memory (page-aligned host memory: cpu) is mprotect-ed unreadable
                   except while NAME's own entries run: a model that touches a buffer outside
                   the table dies with SIGSEGV on the spot.

Relative error is max |NAME - oracle| / max |oracle| over one output (the scale of the
parity check's gradients); a NaN or inf where the oracle has none is always out of tolerance.
The tolerance is accel/spec.py's error model, from each output's reduction length at the
call's shapes, unless the backend declares a lower-precision entry's own (ane-emu's fp16).
The wrappers themselves are written from accel/spec.py (accel/generated/wrappers.pxi); the
memory entries, which every wrapper treats alike, are here.
"""
import numpy as np

cimport cython
from accel.backend cimport Backend, BackendTable
from kernels.bf16 cimport bf16, bf16_to_float
from kernels.fp16 cimport fp16, fp16_to_float
from libc.math cimport fabs, frexp, isnan, isinf, sqrt
from libc.stdio cimport fprintf, stderr, fflush
from libc.stdlib cimport abort, calloc, free, malloc, realloc
from libc.string cimport memcpy
from posix.mman cimport mprotect, PROT_NONE, PROT_READ, PROT_WRITE
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef enum Mode:
    CHECK = 1
    PROFILE = 2
    GUARD = 4

from accel.spec import ORDER as ENTRIES, UNIT_ROUNDOFF, CHECK_UNITS

include "accel/generated/entry_enum.pxi"

assert len(ENTRIES) == NUM_ENTRIES
cdef list _entry_bytes = [name.encode() for name in ENTRIES]   # entry_names points into these
cdef const char* entry_names[<int>NUM_ENTRIES]
cdef bytes _name
for _i, _name in enumerate(_entry_bytes):
    entry_names[_i] = _name
cdef double check_units = CHECK_UNITS
cdef double unit_roundoff = UNIT_ROUNDOFF
# Narrow (bf16, fp16) outputs: both sides round a float32 result once to nearest, so where the
# two float32 results straddle a rounding boundary they differ by one ulp, at most 2^-7 (bf16:
# 8 significant bits) or 2^-10 (fp16: 11) of the largest element; and the mean signed
# difference, in ulps of each element, stays near 0, where a store that truncates (or rounds one
# way) moves it to about -0.5 ulp of every inexact element
cdef enum Narrow:
    FLOAT32 = 0
    BF16 = 1
    FP16 = 2
cdef double NARROW_ULP[3]
NARROW_ULP[:] = [0.0, 2.0 ** -7, 2.0 ** -10]
cdef int MANTISSA_BITS[3]
MANTISSA_BITS[:] = [23, 7, 10]
cdef double BIAS_LIMIT = 0.05


cdef inline double narrow_at(Narrow format, const void* p, Py_ssize_t i) noexcept nogil:
    if format == BF16:
        return bf16_to_float((<const bf16*>p)[i])
    return fp16_to_float((<const fp16*>p)[i])


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
    double worst_ratio      # the largest relative error over its tolerance

ctypedef struct Instrument:
    BackendTable target
    BackendTable oracle
    int mode
    Narrow narrow           # what the tables' floatX outputs are (compare's narrow outputs)
    Narrow grad_narrow      # what their floatG outputs (parameter gradients) are
    Allocation* allocations
    int num_allocations, capacity
    float* scratch          # host copy of one target output, for comparing
    size_t scratch_bytes
    int step, layer
    double tolerance[<int>NUM_ENTRIES]   # the backend's own (lower precision), 0: the error model's
    EntryStats stats[<int>NUM_ENTRIES]
    int first_entry         # the first call out of tolerance, -1 until there is one
    int first_step, first_layer
    double first_abs, first_rel, first_tolerance


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

cdef double tolerance_of(Instrument* s, Entry entry, double reduction) noexcept nogil:
    """An output's relative tolerance: the backend's own for its entry, else accel/spec.py's
    error model for this reduction length."""
    if s.tolerance[<int>entry] > 0.0:
        return s.tolerance[<int>entry]
    return check_units * unit_roundoff * (1.0 + sqrt(reduction if reduction > 1.0 else 1.0))

cdef void record(Instrument* s, Entry entry, double abs_err, double rel_err, double tol) noexcept nogil:
    """Count one compared output; report the first out of tolerance."""
    cdef EntryStats* st = &s.stats[<int>entry]
    st.outputs_compared += 1
    if rel_err > st.worst_error:
        st.worst_error = rel_err
    if rel_err / tol > st.worst_ratio:
        st.worst_ratio = rel_err / tol
    if rel_err <= tol:
        return
    st.mismatches += 1
    if s.first_entry < 0:
        s.first_entry, s.first_step, s.first_layer = entry, s.step, s.layer
        s.first_abs, s.first_rel, s.first_tolerance = abs_err, rel_err, tol
        fprintf(stderr, "check: %s out of tolerance at step %d, layer %d: max abs err %.3e, "
                "relative %.3e (tolerance %.1e); carrying on from the oracle's result\n",
                entry_names[<int>entry], s.step, s.layer, abs_err, rel_err, tol)
        fflush(stderr)

cdef void compare(Instrument* s, Entry entry, float* out, Py_ssize_t n, double reduction,
                  int causal_T, Narrow narrow) noexcept nogil:
    """Compare n elements of a target output with the oracle's, each element a sum of
    `reduction` terms; on a mismatch, overwrite the target's with the oracle's.
    causal_T > 0: (..., T, T) scores, compared at t2 <= t only.  narrow: what the output's
    elements are (s.narrow for a floatX output, s.grad_narrow for a floatG one; bf16, fp16:
    compared as NARROW_ULP says)."""
    if out == NULL or n <= 0:
        return
    cdef const float* expected = of(s, out)
    cdef size_t nbytes = n * (sizeof(float) if narrow == FLOAT32 else sizeof(bf16))
    cdef Py_ssize_t i, row, col, differ = 0, compared = 0
    cdef double a, e, diff, max_diff = 0.0, max_expected = 0.0, rel, bias = 0.0, ulps
    cdef double tol = tolerance_of(s, entry, reduction)
    cdef bint broken = False
    cdef int exponent
    tol += NARROW_ULP[<int>narrow]
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
        if narrow != FLOAT32:
            a, e = narrow_at(narrow, s.scratch, i), narrow_at(narrow, expected, i)
            compared += 1
            if a != e and not (isnan(a) or isinf(a) or isnan(e) or isinf(e)) and e != 0.0:
                # the difference in ulps of e, signed away from zero: rounding to nearest
                # leaves these at +-1 in both directions, truncation always toward zero.
                # Further apart, the float32 values differ themselves (an element that
                # cancels to far below the output's scale, exactly 0 on one side): not a
                # rounding's doing, and the error test below judges it
                frexp(e, &exponent)
                exponent -= 1 + MANTISSA_BITS[<int>narrow]
                if narrow == FP16 and exponent < -24:   # a subnormal's ulp
                    exponent = -24
                ulps = (a - e) / (fabs(e) / e) / (2.0 ** exponent)
                if fabs(ulps) <= 1.0:
                    differ += 1
                    bias += ulps
        else:
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
    if compared > 0:
        bias /= compared
        if fabs(bias) > BIAS_LIMIT + 4.0 * sqrt(<double>differ) / compared:
            fprintf(stderr, "check: %s's %s output is rounded with a bias of %.3f ulp over "
                    "%zd elements (%zd differ): not to nearest\n", entry_names[<int>entry],
                    "bf16" if narrow == BF16 else "fp16", bias, compared, differ)
            broken = True
    if broken:
        rel = 1.0 / 0.0
    record(s, entry, max_diff, rel, tol)
    if rel > tol:
        s.target.copy_to_backend(s.target.ctx, out, expected, nbytes)
    else:
        # within tolerance, the oracle carries on from the target's result: each kernel is
        # judged on the very inputs the target gave it, so the error model's one rounding
        # holds, and no ill-conditioned kernel (AdamW on gradients of rounding size) inherits
        # the differences of the kernels before it
        memcpy(<void*>expected, s.scratch, nbytes)

cdef double compare_scalar(Instrument* s, Entry entry, double got, double expected,
                           double reduction) noexcept nogil:
    """The value to carry on with: the target's, or the oracle's if out of tolerance."""
    cdef double diff = fabs(got - expected)
    cdef double rel = diff / fabs(expected) if expected != 0.0 else diff
    cdef double tol = tolerance_of(s, entry, reduction)
    if isnan(got) and not isnan(expected):
        rel = 1.0 / 0.0
    record(s, entry, diff, rel, tol)
    return expected if rel > tol else got


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

# --- every other entry: written from accel/spec.py -----------------------------------------

include "accel/generated/wrappers.pxi"


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

    @property
    def peak_tflops(self):
        return self.target.peak_tflops

    @property
    def compile_seconds(self):
        return self.target.compile_seconds

    @property
    def runs_fused(self):
        return self.target.runs_fused and "fused" in self.groups

    def set_tolerance(self, str entry, double tolerance):
        """One entry's relative tolerance, in place of accel/spec.py's error model (0: the
        model's again)."""
        if entry not in ENTRIES:
            raise ValueError(f"no entry {entry!r}")
        self.s.tolerance[ENTRIES.index(entry)] = tolerance

    def reset(self):
        """Forget the counts, times and mismatches so far."""
        cdef int i
        for i in range(<int>NUM_ENTRIES):
            self.s.stats[i] = EntryStats(0, 0.0, 0, 0, 0.0, 0.0)
        self.s.first_entry = -1

    def report(self):
        """{"entries": {name: {calls, seconds, compared, mismatches, worst_error, worst_ratio}},
        "first": None or {entry, step, layer, abs_error, rel_error, tolerance}, "mismatches":
        total}; worst_ratio is the largest relative error over its tolerance."""
        entries = {}
        for i, name in enumerate(ENTRIES):
            st = self.s.stats[i]
            if st["calls"]:
                entries[name] = dict(calls=st["calls"], seconds=st["seconds"],
                                     compared=st["outputs_compared"], mismatches=st["mismatches"],
                                     worst_error=st["worst_error"], worst_ratio=st["worst_ratio"])
        first = None
        if self.s.first_entry >= 0:
            first = dict(entry=ENTRIES[self.s.first_entry], step=self.s.first_step,
                         layer=self.s.first_layer, abs_error=self.s.first_abs,
                         rel_error=self.s.first_rel, tolerance=self.s.first_tolerance)
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
    from accel.backend import BackendError
    cdef int mode = {"check": CHECK, "profile": PROFILE, "guard": GUARD}[wrapper]
    if mode == GUARD and not target.host_visible:
        raise BackendError(f"guard:{target.name}: guarding needs host memory (guard:cpu)")
    oracle = None
    if mode == CHECK:   # the CPU, with what rounds inside on widened copies (accel/cpu.pyx)
        from accel import cpu
        oracle = cpu.create(precision=target.precision, oracle=True,
                            grad_precision=target.grad_precision)
    # check: claims only the groups the oracle can check too
    groups = tuple(g for g in target.groups if oracle is None or oracle.supports(g))
    cdef InstrumentedBackend b = InstrumentedBackend(
        f"{wrapper}:{target.name}", target.host_visible and mode == PROFILE, groups,
        None, target.precision, target.grad_precision)
    b.target = target
    b.oracle = oracle
    b.s = <Instrument*>calloc(1, sizeof(Instrument))
    if b.s == NULL:
        raise MemoryError()
    b.s.target = target.table
    if b.oracle is not None:
        b.s.oracle = b.oracle.table
    b.s.mode = mode
    b.s.narrow = {"fp32": FLOAT32, "bf16": BF16, "fp16": FP16}[target.precision]
    b.s.grad_narrow = {"fp32": FLOAT32, "bf16": BF16}[target.grad_precision]
    b.s.step, b.s.layer = 0, -1
    b.reset()
    for entry, tolerance in target.tolerances.items():   # a lower-precision backend's own
        b.set_tolerance(entry, tolerance)
    b.tolerances = dict(target.tolerances)   # the wrapped backend computes at its precision
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
    install_wrappers(t, &target.table)
    b.validate()
    return b
