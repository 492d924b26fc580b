"""
The ANE backends' table: the Apple Neural Engine's share of a Llama training step, as the
anchor splits it, as the very MIL programs of accel/ane/mil.py (dynamic pipeline: weights are
inputs, one compile per shape) on one of accel/ane/runtime.py's runtimes:

  ane-emu   Linux: the NumPy interpreter (accel/ane/interp.py, InterpreterRuntime)
  ane       macOS: Core ML with CPU_AND_NE compute units (CoreMLRuntime) - written, UNRUN

  on the (emulated) ANE, fp16:  matmul_forward, matmul_backward's dinp, attention_gqa_forward
                                and _backward (dq, dk, dv; the softmax recomputed from q and k),
                                swiglu_forward and _backward
  on the CPU (kernels/), fp32:  everything else - embedding, RMSNorm, RoPE, the classifier's
                                loss, AdamW, the weight gradients (matmul_backward's dweight,
                                dbias), memory - and GPT-2's own layers

An ANEBackend owns two things, by name: `host`, a CPU backend, whose table it starts from (the
CPU's adapters ignore ctx, so they serve this table unchanged) and to which the replaced
entries hand the CPU's part of their work (matmul's weight gradients, last_error), and
`emulator`, the Emulator that compiles each program once through its runtime and runs it
there.  Its ctx is the ANEBackend itself: each replaced entry takes the GIL and reaches both
through it.  A failure inside one (a runtime's error, a compile past the budget) is reported
by last_error as one line.

Loss scaling against fp16 underflow: every dx entry multiplies its incoming gradient by a
power of two before casting it to fp16 and divides the results by it after casting back
(exact: powers of two).  The scale is dynamic, chosen per call so that the gradient's largest
magnitude lands at 2^LOSS_SCALE_TARGET_LOG2 (far below fp16's 65504, leaving room for the
growth inside the program): a loss gradient of 1/(B*T) times small weights is below fp16's
smallest subnormal (6e-8) long before training ends.  Emulator(loss_scale=False) turns it off
(the test that shows the underflow).
"""
import math
import time

import numpy as np

from accel.backend cimport Backend, BackendTable
from accel import cpu

LOSS_SCALE_TARGET_LOG2 = 8
# check:ane-emu's tolerances for the entries that run in fp16 (relative to the largest oracle
# magnitude; fp16's unit roundoff is 2^-11 = 4.9e-4, a piece rounds several intermediates)
TOLERANCES = {"matmul_forward": 4e-3, "matmul_backward": 4e-3, "attention_gqa_forward": 4e-3,
              "attention_gqa_backward": 8e-3, "swiglu_forward": 4e-3, "swiglu_backward": 4e-3}


def padded(n):
    """The length a program is built for: n rounded up to a power of two, at least 32.  The
    ANE compiles about 119 programs per process and each shape is a program, so the spatial
    axis (rows of a matmul, a sequence's positions, SwiGLU's elements) comes in a few sizes
    whatever the run asks for (training, evaluation, sampling's growing prompts); the padding
    is zeros, sliced off after, and attention is causal, so real rows never see it."""
    return max(32, 1 << (n - 1).bit_length())


def pad_rows(x, n):
    """(S, ...) -> (n, ...): zero rows after x's."""
    out = np.zeros((n,) + x.shape[1:], np.float32)
    out[:len(x)] = x
    return out


class Emulator:
    """The ANE's entries: programs built and compiled once per shape on a runtime
    (accel/ane/runtime.py; the interpreter unless told), run there."""

    def __init__(self, loss_scale=True, runtime=None):
        from accel.ane import mil
        from accel.ane.runtime import InterpreterRuntime
        self.mil = mil
        self.runtime = runtime if runtime is not None else InterpreterRuntime()
        self.loss_scale = loss_scale
        self.kernels = {}
        self.compile_seconds = 0.0   # building and compiling programs (llmc/report.py reads it)

    @property
    def builds(self):
        """Programs compiled so far (one per piece and shape)."""
        return len(self.kernels)

    def run(self, piece, dims, x):
        key = (piece, dims)
        if key not in self.kernels:
            start = time.perf_counter()
            self.kernels[key] = self.runtime.compile(getattr(self.mil, piece)(*dims))
            self.compile_seconds += time.perf_counter() - start
        return self.runtime.run(self.kernels[key], {"x": x})["out"]

    def scale_of(self, dout):
        """The power of two the gradient dout is multiplied by before it becomes fp16."""
        peak = float(np.max(np.abs(dout))) if dout.size else 0.0
        if not self.loss_scale or peak == 0.0 or not math.isfinite(peak):
            return 1.0
        return 2.0 ** (LOSS_SCALE_TARGET_LOG2 - math.ceil(math.log2(peak)))

    # --- the entries (CPU layouts in, results written into the given arrays) -----------------

    def matmul_forward(self, out, inp, weight, bias, int BT, int C, int OC):
        """out (BT, OC) = inp (BT, C) @ weight (OC, C)^T (+ bias on the CPU)."""
        mil, S = self.mil, padded(BT)
        y = self.run("linear_forward", (C, OC, S), mil.pack(pad_rows(inp, S).T, weight.T))
        out[:] = mil.from_ane(y)[:BT]
        if bias is not None:
            out += bias

    def matmul_dinp(self, dinp, dout, weight, int BT, int C, int OC):
        """dinp (BT, C) += dout (BT, OC) @ weight (OC, C)."""
        mil, S = self.mil, padded(BT)
        scale = self.scale_of(dout)
        dx = self.run("linear_backward", (C, OC, S), mil.pack(pad_rows(dout, S).T * scale, weight))
        dinp += mil.from_ane(dx)[:BT] / scale

    def attention_forward(self, out, att, q, k, v, int B, int T, int NH, int NKV, int hs):
        """out (B,T,NH*hs), att (B,NH,T,T) from q (B,T,NH*hs), k, v (B,T,NKV*hs): one sequence
        per program run."""
        mil, S = self.mil, padded(T)
        d = mil.Dims(NH * hs, NH, NKV, hs, 1, S)
        for b in range(B):
            x = mil.stack(*(pad_rows(part, S) for part in (q[b], k[b], v[b])))
            y, probs = mil.unpack("attention_forward", d, self.run("attention_forward", (d,), x))
            out[b], att[b] = y[:T], probs[:, :T, :T]

    def attention_backward(self, dq, dk, dv, dout, q, k, v, int B, int T, int NH, int NKV,
                           int hs):
        mil, S = self.mil, padded(T)
        d = mil.Dims(NH * hs, NH, NKV, hs, 1, S)
        for b in range(B):
            scale = self.scale_of(dout[b])
            x = mil.stack(*(pad_rows(part, S) for part in (q[b], k[b], v[b], dout[b] * scale)))
            grads = mil.unpack("attention_backward", d, self.run("attention_backward", (d,), x))
            for total, part in zip((dq[b], dk[b], dv[b]), grads):
                total += part[:T] / scale

    def swiglu_forward(self, out, a, b):
        n = padded(a.size)
        x = np.stack([pad_rows(a, n), pad_rows(b, n)])[None, :, None, :]
        out[:] = self.run("swiglu_forward", (n,), x).ravel()[:a.size]

    def swiglu_backward(self, da, db, dout, a, b):
        n = padded(a.size)
        scale = self.scale_of(dout)
        x = np.stack([pad_rows(a, n), pad_rows(b, n), pad_rows(dout * scale, n)])[None, :, None, :]
        y = self.run("swiglu_backward", (n,), x).astype(np.float32)
        da += y[0, 0, 0, :a.size] / scale
        db += y[0, 1, 0, :a.size] / scale


# --- the C entries: views of the table's pointers, then the Emulator with the GIL ---------------

cdef class ANEBackend(Backend):
    """A Backend whose table is its host's (a CPU backend) with the ANE's entries, run by its
    emulator; with the tolerances check:ane-emu compares the fp16 entries at, and the time its
    programs took to build and compile (the efficiency report's compile share)."""
    cdef readonly Backend host        # the CPU backend: the rest of the table, and the CPU's part
    cdef readonly object emulator     # the Emulator: the ANE's entries
    cdef bytes failure                # the last failed entry's message, until last_error reads it
    cdef bytes reported               # the message last_error returned: alive until its next call

    @property
    def compile_seconds(self):
        return self.emulator.compile_seconds


cdef object view(const float* p, Py_ssize_t n, shape=None):
    if p == NULL:
        return None
    if n == 0:
        return np.zeros(shape if shape is not None else 0, np.float32)
    a = np.asarray(<float[:n]> <float*> p)
    return a if shape is None else a.reshape(shape)


cdef void failed(void* ctx, str entry, exception) noexcept:
    cdef ANEBackend backend = <ANEBackend>ctx
    backend.failure = f"{backend.name} {entry}: {type(exception).__name__}: {exception}".encode()


cdef object emulator_of(void* ctx):
    return (<ANEBackend>ctx).emulator


cdef BackendTable* host_table(void* ctx) noexcept with gil:
    return &(<ANEBackend>ctx).host.table


cdef const char* take_failure(void* ctx) noexcept with gil:
    """The last failed entry's message, or NULL; alive until the next call."""
    cdef ANEBackend backend = <ANEBackend>ctx
    backend.reported, backend.failure = backend.failure, None
    if backend.reported is None:
        return NULL
    return backend.reported


cdef const char* ane_last_error(void* ctx) noexcept nogil:
    cdef const char* message = take_failure(ctx)
    cdef BackendTable* host
    if message != NULL:
        return message
    host = host_table(ctx)
    return host.last_error(host.ctx)


cdef void ane_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                             const float* bias, int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    with gil:
        try:
            emulator_of(ctx).matmul_forward(view(out, BT * OC, (BT, OC)),
                                            view(inp, BT * C, (BT, C)),
                                            view(weight, <Py_ssize_t>OC * C, (OC, C)),
                                            view(bias, OC), BT, C, OC)
        except BaseException as e:
            failed(ctx, "matmul_forward", e)


cdef void ane_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight,
                              int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef BackendTable* host = host_table(ctx)
    with gil:
        try:
            # the weight gradients on the CPU: its kernel, without its dinp (NULL)
            host.matmul_backward(host.ctx, NULL, dweight, dbias, dout, inp, weight, B, T, C, OC)
            emulator_of(ctx).matmul_dinp(view(dinp, BT * C, (BT, C)), view(dout, BT * OC, (BT, OC)),
                                         view(weight, <Py_ssize_t>OC * C, (OC, C)), BT, C, OC)
        except BaseException as e:
            failed(ctx, "matmul_backward", e)


cdef void ane_attention_gqa_forward(void* ctx, float* out, float* att, const float* q,
                                    const float* k, const float* v, int B, int T, int NH,
                                    int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    with gil:
        try:
            emulator_of(ctx).attention_forward(
                view(out, BT * QD, (B, T, QD)), view(att, BT * NH * T, (B, NH, T, T)),
                view(q, BT * QD, (B, T, QD)), view(k, BT * KVD, (B, T, KVD)),
                view(v, BT * KVD, (B, T, KVD)), B, T, NH, NKV, hs)
        except BaseException as e:
            failed(ctx, "attention_gqa_forward", e)


cdef void ane_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv,
                                     const float* dout, const float* q, const float* k,
                                     const float* v, const float* att, int B, int T, int NH,
                                     int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    with gil:
        try:
            emulator_of(ctx).attention_backward(
                view(dq, BT * QD, (B, T, QD)), view(dk, BT * KVD, (B, T, KVD)),
                view(dv, BT * KVD, (B, T, KVD)), view(dout, BT * QD, (B, T, QD)),
                view(q, BT * QD, (B, T, QD)), view(k, BT * KVD, (B, T, KVD)),
                view(v, BT * KVD, (B, T, KVD)), B, T, NH, NKV, hs)
        except BaseException as e:
            failed(ctx, "attention_gqa_backward", e)


cdef void ane_swiglu_forward(void* ctx, float* out, const float* a, const float* b,
                             Py_ssize_t N) noexcept nogil:
    with gil:
        try:
            emulator_of(ctx).swiglu_forward(view(out, N), view(a, N), view(b, N))
        except BaseException as e:
            failed(ctx, "swiglu_forward", e)


cdef void ane_swiglu_backward(void* ctx, float* da, float* db, const float* dout, const float* a,
                              const float* b, Py_ssize_t N) noexcept nogil:
    with gil:
        try:
            emulator_of(ctx).swiglu_backward(view(da, N), view(db, N), view(dout, N), view(a, N),
                                             view(b, N))
        except BaseException as e:
            failed(ctx, "swiglu_backward", e)


def create(runtime=None, name="ane-emu"):
    """The ane-emu backend, or with runtime=CoreMLRuntime() the ane one (families llama and
    gpt2: GPT-2's own layers run on the CPU)."""
    cdef ANEBackend backend = ANEBackend(name, True, ("linear", "gpt2", "llama", "classifier"))
    backend.host = cpu.create(flash=False)
    backend.emulator = Emulator(runtime=runtime)
    backend.tolerances = dict(TOLERANCES)
    backend.table = backend.host.table   # the CPU's adapters ignore ctx: they serve it as is
    cdef BackendTable* t = &backend.table
    t.ctx = <void*>backend            # borrowed: the backend outlives every call of its table
    t.last_error = ane_last_error
    t.matmul_forward = ane_matmul_forward
    t.matmul_backward = ane_matmul_backward
    t.attention_gqa_forward = ane_attention_gqa_forward
    t.attention_gqa_backward = ane_attention_gqa_backward
    t.swiglu_forward = ane_swiglu_forward
    t.swiglu_backward = ane_swiglu_backward
    backend.validate()
    return backend
