"""
The ANE backends' table: the Apple Neural Engine's share of a Llama training step, as the
anchor splits it, as the very MIL programs of accel/ane/mil.py (dynamic pipeline: weights are
inputs, one compile per shape) on one of accel/ane/runtime.py's runtimes:

  ane-emu   Linux: the NumPy interpreter (accel/ane/interp.py, InterpreterRuntime)
  ane       macOS: Core ML with CPU_AND_NE compute units (CoreMLRuntime) - written, UNRUN

  on the (emulated) ANE, fp16:  the fused group's blocks (qkv_forward and _backward's dx,
                                ffn_forward and _backward's dx, dh1, dh3, dhgated: one program
                                each), matmul_forward, matmul_backward's dinp (inside a layer:
                                the mark entry's), attention_gqa_forward and _backward (dq, dk,
                                dv; the softmax recomputed from q and k), swiglu_forward and
                                _backward
  on the CPU (kernels/), fp32:  everything else - embedding, RMSNorm, RoPE, the classifier's
                                matmul and loss, AdamW, the weight gradients (dweight, dbias),
                                memory - and GPT-2's own layers

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

Two pipelines (accel/ane/README.md): dynamic, the weights are inputs and a program of each
shape is compiled once per process; static, a matmul's weight is a constant baked into its
program, one program per weight (its forward and its dx), rebuilt when the weight has changed
(after each update: its fp16 copy is compared with the baked one), every compile counted
against the runtime's CompileBudget.  In the static pipeline only the training step runs on
the engine (the backend's hooks, accel/ane/device.py, switch it on around the step); the
evaluations and samples between steps run on the CPU, so that they compile nothing.

The weight gradients (matmul_backward's dweight, dbias) are the CPU's GEMMs; by default a
worker thread with its own queue runs them while the engine runs the dx programs (and the next
programs after them), on copies of their inputs, in the order they were queued, so the results
are those of the sequential order; parallel_dw=False runs them in place, one after the other.
The queue is drained before anything reads or writes a gradient or a buffer on the host's
behalf: last_error (the model checks it after every pass), synchronize, copy_to_host (check:'s
comparisons), zero, and embedding_backward (a shared classifier's gradient is the
embedding's).  engine, dW and their overlap are timed per step (step_times).
"""
import math
import os
import queue
import threading
import time

import numpy as np

from accel.backend cimport Backend, BackendTable
from kernels.parallel cimport max_threads, set_max_threads
from accel import cpu
from accel.ane.hooks import HOOKS, OPTIONS  # noqa: F401 (HOOKS: accel/hooks.py)

LOSS_SCALE_TARGET_LOG2 = 8
# check:ane-emu's tolerances for the entries that run in fp16 (relative to the largest oracle
# magnitude; fp16's unit roundoff is 2^-11 = 4.9e-4, a piece rounds several intermediates)
TOLERANCES = {"matmul_forward": 4e-3, "matmul_backward": 4e-3, "attention_gqa_forward": 4e-3,
              "attention_gqa_backward": 8e-3, "swiglu_forward": 4e-3, "swiglu_backward": 4e-3,
              "qkv_forward": 4e-3, "qkv_backward": 4e-3, "ffn_forward": 4e-3,
              "ffn_backward": 8e-3}


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


def busy_overlap(a, b):
    """Seconds during which both span lists [(start, end)] (each list's spans disjoint) are
    busy at once."""
    a, b = sorted(a), sorted(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class Emulator:
    """The ANE's entries: programs built and compiled on a runtime (accel/ane/runtime.py; the
    interpreter unless told), run there: once per shape (dynamic), or per weight and rebuilt
    when it changes (static).  on_cpu: the entries run the CPU's kernels instead (the static
    pipeline between training steps)."""

    def __init__(self, loss_scale=True, runtime=None, pipeline="dynamic"):
        from accel.ane import mil
        from accel.ane.runtime import InterpreterRuntime
        if pipeline not in ("dynamic", "static"):
            raise ValueError(f"ANE pipeline {pipeline!r}: dynamic or static")
        self.mil = mil
        self.runtime = runtime if runtime is not None else InterpreterRuntime()
        self.loss_scale = loss_scale
        self.pipeline = pipeline
        self.on_cpu = False
        self.kernels = {}
        self.baked = {}              # static: (piece, dims, weight address) -> (fp16 W, kernel)
        self.compile_seconds = 0.0   # building and compiling programs (llmc/report.py reads it)
        self.engine_spans = []       # (start, end) of each program run since step_times

    @property
    def builds(self):
        """Programs compiled so far (one per piece and shape, and per weight when static)."""
        return self.runtime.compile_count

    def _compile(self, program_of):
        start = time.perf_counter()
        kernel = self.runtime.compile(program_of())
        self.compile_seconds += time.perf_counter() - start
        return kernel

    def _run(self, kernel, x):
        start = time.perf_counter()
        out = self.runtime.run(kernel, {"x": x})["out"]
        self.engine_spans.append((start, time.perf_counter()))
        return out

    def run(self, piece, dims, x):
        key = (piece, dims)
        if key not in self.kernels:
            self.kernels[key] = self._compile(lambda: getattr(self.mil, piece)(*dims))
        return self._run(self.kernels[key], x)

    def run_static(self, piece, dims, weights, x):
        """piece with its weights (a tuple of matrices) baked in: its program is rebuilt when
        their fp16 values are not those baked into it."""
        key = (piece, dims, tuple(w.ctypes.data for w in weights))
        w16 = [w.astype(np.float16) for w in weights]
        baked = self.baked.get(key)
        if baked is None or not all(np.array_equal(a, b) for a, b in zip(baked[0], w16)):
            kernel = self._compile(lambda: getattr(self.mil, piece)(
                *dims, "static", *(w.copy() for w in weights)))
            baked = self.baked[key] = (w16, kernel)
        return self._run(baked[1], x)

    def run_block(self, piece, d, acts, weights):
        """A fused block's program (mil.py's qkv_* and ffn_*) at dims d on the activations
        acts {name: (S, channels)}, weights {name: (out, in)} (mil.feeds' names): its outputs,
        in CPU layout (mil.unpack)."""
        mil = self.mil
        x = mil.feeds(piece, self.pipeline, acts, weights)
        if self.pipeline == "static":
            out = self.run_static(piece, (d,), tuple(weights.values()), x)
        else:
            out = self.run(piece, (d,), x)
        return mil.unpack(piece, d, out)

    def static_step_compiles(self, config):
        """The compiles a training step of the Llama config makes in this process, static
        pipeline: the planner's (accel/ane/plan.py's static_step_compiles), the weight-free
        programs counted when not yet compiled here; measured equal by tests/test_ane_static.py."""
        from accel.ane.plan import static_step_compiles
        return static_step_compiles(config, {piece for piece, _ in self.kernels})

    def step_times(self, dw_spans):
        """{engine_ms, dw_ms, overlap_ms} since the last call: the engine's busy time, the
        CPU's weight-gradient GEMMs' (dw_spans) and the time both ran at once."""
        engine, self.engine_spans = self.engine_spans, []
        ms = lambda spans: 1e3 * sum(b - a for a, b in spans)
        return dict(engine_ms=ms(engine), dw_ms=ms(dw_spans),
                    overlap_ms=1e3 * busy_overlap(engine, dw_spans))

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
        if self.pipeline == "static":
            y = self.run_static("linear_forward", (C, OC, S), (weight,),
                                mil.to_ane(pad_rows(inp, S)))
        else:
            y = self.run("linear_forward", (C, OC, S), mil.pack(pad_rows(inp, S).T, weight.T))
        out[:] = mil.from_ane(y)[:BT]
        if bias is not None:
            out += bias

    def matmul_dinp(self, dinp, dout, weight, int BT, int C, int OC):
        """dinp (BT, C) += dout (BT, OC) @ weight (OC, C)."""
        mil, S = self.mil, padded(BT)
        scale = self.scale_of(dout)
        if self.pipeline == "static":
            dx = self.run_static("linear_backward", (C, OC, S), (weight,),
                                 mil.to_ane(pad_rows(dout, S) * scale))
        else:
            dx = self.run("linear_backward", (C, OC, S),
                          mil.pack(pad_rows(dout, S).T * scale, weight))
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

    def qkv_forward(self, q, k, v, inp, wq, wk, wv, int BT, int C, int NH, int NKV, int hs):
        """q (BT, NH*hs), k, v (BT, NKV*hs) = inp (BT, C) by wq, wk, wv: one program."""
        S = padded(BT)
        d = self.mil.Dims(C, NH, NKV, hs, 1, S)
        parts = self.run_block("qkv_forward", d, {"x": pad_rows(inp, S)},
                               {"wq": wq, "wk": wk, "wv": wv})
        for total, part in zip((q, k, v), parts):
            total[:] = part[:BT]

    def qkv_dinp(self, dinp, dq, dk, dv, wq, wk, wv, int BT, int C, int NH, int NKV, int hs):
        """dinp (BT, C) += dq wq + dk wk + dv wv: one program."""
        S = padded(BT)
        d = self.mil.Dims(C, NH, NKV, hs, 1, S)
        scale = min(self.scale_of(g) for g in (dq, dk, dv))
        acts = {name: pad_rows(g, S) * scale for name, g in (("dq", dq), ("dk", dk), ("dv", dv))}
        dx, = self.run_block("qkv_backward", d, acts, {"wq": wq, "wk": wk, "wv": wv})
        dinp += dx[:BT] / scale

    def ffn_forward(self, out, h1, h3, hgated, inp, w1, w3, w2, int BT, int C, int H):
        """out (BT, C) = w2 (silu(h1) * h3), h1 = w1 inp, h3 = w3 inp and the gated product
        hgated (BT, H), from inp (BT, C): one program."""
        S = padded(BT)
        d = self.mil.Dims(C, 1, 1, 1, H, S)
        parts = self.run_block("ffn_forward", d, {"x": pad_rows(inp, S)},
                               {"w1": w1, "w3": w3, "w2": w2})
        for result, part in zip((out, h1, h3, hgated), parts):
            result[:] = part[:BT]

    def ffn_dinp(self, dinp, dh1, dh3, dhgated, dout, inp, w1, w3, w2, int BT, int C, int H):
        """dinp (BT, C) += the FFN's input gradient; dh1, dh3, dhgated (BT, H) = the gradients
        of w1 inp, w3 inp and the gated product (h1, h3 recomputed from inp): one program."""
        S = padded(BT)
        d = self.mil.Dims(C, 1, 1, 1, H, S)
        scale = self.scale_of(dout)
        parts = self.run_block("ffn_backward", d, {"x": pad_rows(inp, S),
                                                   "dout": pad_rows(dout, S) * scale},
                               {"w1": w1, "w3": w3, "w2": w2})
        dinp += parts[0][:BT] / scale
        for result, part in zip((dh1, dh3, dhgated), parts[1:]):
            result[:] = part[:BT] / scale

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

    cdef readonly object dw            # the DWeights: matmul's weight gradients on the CPU
    cdef int layer                     # the model's layer (mark), -1 outside one: the classifier

    runs_fused = True                  # a Llama runs the fused group: one program per block

    @property
    def compile_seconds(self):
        return self.emulator.compile_seconds

    def step_times(self):
        """{engine_ms, dw_ms, overlap_ms} since the last call (Emulator.step_times)."""
        return self.emulator.step_times(self.dw.take_spans())


def host_dweight(ANEBackend backend, size_t dweight, size_t dbias, float[:, ::1] dout,
                 float[:, ::1] inp, size_t weight, int B, int T, int C, int OC):
    """The CPU's matmul_backward without its dinp: dweight (OC, C) += dout^T inp, dbias (OC)
    += dout's column sums (each skipped where NULL), without the GIL (the worker's GEMMs overlap
    the engine's runs)."""
    cdef BackendTable* host = &backend.host.table
    with nogil:
        host.matmul_backward(host.ctx, NULL, <float*>dweight, <float*>dbias, &dout[0, 0],
                             &inp[0, 0], <const float*>weight, B, T, C, OC)


class DWeights:
    """matmul's weight gradients on the CPU: in a worker thread with its own queue (parallel,
    on copies of dout and inp: the model reuses those buffers) or in place at once
    (sequential).  One worker, first in first out: a gradient summed over several calls adds
    them in the order the sequential run does, so the bits are the same.  Each job runs on the
    OpenMP thread count of the thread that submitted it (the worker's own would be the
    default, whatever limit the caller set), which splits the GEMMs, and so orders their sums,
    as the sequential run does."""

    def __init__(self, backend, parallel=True):
        self.backend, self.parallel = backend, parallel
        self.jobs = queue.Queue()
        self.thread = None
        self.spans = []      # (start, end) of each GEMM since take_spans
        self.failure = None  # the first exception of a queued job, until drain reports it

    def submit(self, size_t dweight, size_t dbias, dout, inp, size_t weight, int B, int T,
               int C, int OC):
        if not self.parallel:
            return self._run((dweight, dbias, dout, inp, weight, B, T, C, OC))
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="ane-dweight", daemon=True)
            self.thread.start()
        self.jobs.put((max_threads(), (dweight, dbias, dout.copy(), inp.copy(), weight, B, T, C,
                                       OC)))

    def _run(self, job):
        start = time.perf_counter()
        host_dweight(self.backend, *job)
        self.spans.append((start, time.perf_counter()))

    def _work(self):
        while True:
            threads, job = self.jobs.get()
            try:
                set_max_threads(threads)
                self._run(job)
            except BaseException as e:
                self.failure = self.failure or e
            finally:
                self.jobs.task_done()

    def drain(self):
        """Wait for the queued GEMMs; raise the first one's failure."""
        if self.thread is not None:
            self.jobs.join()
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def take_spans(self):
        spans, self.spans = self.spans, []
        return spans


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


cdef bint on_cpu(void* ctx) noexcept with gil:
    """Whether the ANE's entries run the CPU's kernels now (static pipeline, between steps)."""
    return (<ANEBackend>ctx).emulator.on_cpu


cdef bint matmul_on_cpu(void* ctx) noexcept with gil:
    """Whether a matmul runs on the CPU: between static steps, and outside a layer (the
    classifier, as the planner has it: accel/ane/plan.py's kernels are the layers')."""
    return (<ANEBackend>ctx).emulator.on_cpu or (<ANEBackend>ctx).layer < 0


cdef void set_layer(void* ctx, int layer) noexcept with gil:
    (<ANEBackend>ctx).layer = layer


cdef void ane_mark(void* ctx, int step, int layer) noexcept nogil:
    cdef BackendTable* host = host_table(ctx)
    set_layer(ctx, layer)
    host.mark(host.ctx, step, layer)


cdef void drain(void* ctx, str entry) noexcept with gil:
    """Wait for the weight gradients queued on the CPU; a failure is the entry's."""
    try:
        (<ANEBackend>ctx).dw.drain()
    except BaseException as e:
        failed(ctx, entry, e)


cdef const char* take_failure(void* ctx) noexcept with gil:
    """The last failed entry's message, or NULL; alive until the next call."""
    cdef ANEBackend backend = <ANEBackend>ctx
    backend.reported, backend.failure = backend.failure, None
    if backend.reported is None:
        return NULL
    return backend.reported


cdef const char* ane_last_error(void* ctx) noexcept nogil:
    drain(ctx, "matmul_backward")
    cdef const char* message = take_failure(ctx)
    cdef BackendTable* host
    if message != NULL:
        return message
    host = host_table(ctx)
    return host.last_error(host.ctx)


cdef void ane_synchronize(void* ctx) noexcept nogil:
    drain(ctx, "matmul_backward")


cdef void ane_copy_to_host(void* ctx, void* host_dst, const void* src,
                           size_t nbytes) noexcept nogil:
    cdef BackendTable* host = host_table(ctx)
    drain(ctx, "matmul_backward")
    host.copy_to_host(host.ctx, host_dst, src, nbytes)


cdef void ane_zero(void* ctx, void* ptr, size_t nbytes) noexcept nogil:
    cdef BackendTable* host = host_table(ctx)
    drain(ctx, "matmul_backward")
    host.zero(host.ctx, ptr, nbytes)


cdef void ane_embedding_backward(void* ctx, float* dwte, const float* dout, const int* inp,
                                 int B, int T, int C, int V) noexcept nogil:
    cdef BackendTable* host = host_table(ctx)
    drain(ctx, "matmul_backward")
    host.embedding_backward(host.ctx, dwte, dout, inp, B, T, C, V)


cdef void ane_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                             const float* bias, int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    cdef BackendTable* host
    if matmul_on_cpu(ctx):
        host = host_table(ctx)
        host.matmul_forward(host.ctx, out, inp, weight, bias, B, T, C, OC)
        return
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
    if matmul_on_cpu(ctx):
        drain(ctx, "matmul_backward")
        host.matmul_backward(host.ctx, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC)
        return
    with gil:
        try:
            # the weight gradients on the CPU (queued first: they run while the engine runs dx);
            # none for a frozen weight without a bias (dweight, dbias NULL)
            if dweight != NULL or dbias != NULL:
                (<ANEBackend>ctx).dw.submit(<size_t>dweight, <size_t>dbias,
                                            view(dout, BT * OC, (BT, OC)),
                                            view(inp, BT * C, (BT, C)), <size_t>weight, B, T, C, OC)
            emulator_of(ctx).matmul_dinp(view(dinp, BT * C, (BT, C)), view(dout, BT * OC, (BT, OC)),
                                         view(weight, <Py_ssize_t>OC * C, (OC, C)), BT, C, OC)
        except BaseException as e:
            failed(ctx, "matmul_backward", e)


cdef void ane_attention_gqa_forward(void* ctx, float* out, float* att, const float* q,
                                    const float* k, const float* v, int B, int T, int NH,
                                    int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.attention_gqa_forward(host.ctx, out, att, q, k, v, B, T, NH, NKV, hs)
        return
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
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.attention_gqa_backward(host.ctx, dq, dk, dv, dout, q, k, v, att, B, T, NH, NKV, hs)
        return
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
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.swiglu_forward(host.ctx, out, a, b, N)
        return
    with gil:
        try:
            emulator_of(ctx).swiglu_forward(view(out, N), view(a, N), view(b, N))
        except BaseException as e:
            failed(ctx, "swiglu_forward", e)


cdef void ane_swiglu_backward(void* ctx, float* da, float* db, const float* dout, const float* a,
                              const float* b, Py_ssize_t N) noexcept nogil:
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.swiglu_backward(host.ctx, da, db, dout, a, b, N)
        return
    with gil:
        try:
            emulator_of(ctx).swiglu_backward(view(da, N), view(db, N), view(dout, N), view(a, N),
                                             view(b, N))
        except BaseException as e:
            failed(ctx, "swiglu_backward", e)


cdef void ane_qkv_forward(void* ctx, float* q, float* k, float* v, const float* inp,
                          const float* wq, const float* wk, const float* wv, int B, int T, int C,
                          int NH, int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.qkv_forward(host.ctx, q, k, v, inp, wq, wk, wv, B, T, C, NH, NKV, hs)
        return
    with gil:
        try:
            emulator_of(ctx).qkv_forward(
                view(q, BT * QD, (BT, QD)), view(k, BT * KVD, (BT, KVD)),
                view(v, BT * KVD, (BT, KVD)), view(inp, BT * C, (BT, C)),
                view(wq, QD * C, (QD, C)), view(wk, KVD * C, (KVD, C)),
                view(wv, KVD * C, (KVD, C)), BT, C, NH, NKV, hs)
        except BaseException as e:
            failed(ctx, "qkv_forward", e)


cdef void ane_qkv_backward(void* ctx, float* dinp, float* dwq, float* dwk, float* dwv,
                           const float* dq, const float* dk, const float* dv, const float* inp,
                           const float* wq, const float* wk, const float* wv, int B, int T,
                           int C, int NH, int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    cdef BackendTable* host
    if on_cpu(ctx):
        drain(ctx, "qkv_backward")
        host = host_table(ctx)
        host.qkv_backward(host.ctx, dinp, dwq, dwk, dwv, dq, dk, dv, inp, wq, wk, wv, B, T, C,
                          NH, NKV, hs)
        return
    with gil:
        try:
            a = view(inp, BT * C, (BT, C))
            grads = (view(dq, BT * QD, (BT, QD)), view(dk, BT * KVD, (BT, KVD)),
                     view(dv, BT * KVD, (BT, KVD)))
            weights = (view(wq, QD * C, (QD, C)), view(wk, KVD * C, (KVD, C)),
                       view(wv, KVD * C, (KVD, C)))
            dw = (<ANEBackend>ctx).dw   # the weight gradients on the CPU, in the model's order
            dw.submit(<size_t>dwv, 0, grads[2], a, <size_t>wv, B, T, C, <int>KVD)
            dw.submit(<size_t>dwk, 0, grads[1], a, <size_t>wk, B, T, C, <int>KVD)
            dw.submit(<size_t>dwq, 0, grads[0], a, <size_t>wq, B, T, C, <int>QD)
            emulator_of(ctx).qkv_dinp(view(dinp, BT * C, (BT, C)), *grads, *weights, BT, C, NH,
                                      NKV, hs)
        except BaseException as e:
            failed(ctx, "qkv_backward", e)


cdef void ane_ffn_forward(void* ctx, float* out, float* h1, float* h3, float* hgated,
                          const float* inp, const float* w1, const float* w3, const float* w2,
                          int B, int T, int C, int H) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, CH = <Py_ssize_t>C * H
    cdef BackendTable* host
    if on_cpu(ctx):
        host = host_table(ctx)
        host.ffn_forward(host.ctx, out, h1, h3, hgated, inp, w1, w3, w2, B, T, C, H)
        return
    with gil:
        try:
            emulator_of(ctx).ffn_forward(
                view(out, BT * C, (BT, C)), view(h1, BT * H, (BT, H)), view(h3, BT * H, (BT, H)),
                view(hgated, BT * H, (BT, H)), view(inp, BT * C, (BT, C)),
                view(w1, CH, (H, C)), view(w3, CH, (H, C)), view(w2, CH, (C, H)), BT, C, H)
        except BaseException as e:
            failed(ctx, "ffn_forward", e)


cdef void ane_ffn_backward(void* ctx, float* dinp, float* dw1, float* dw3, float* dw2,
                           float* dh1, float* dh3, float* dhgated, const float* dout,
                           const float* inp, const float* h1, const float* h3,
                           const float* hgated, const float* w1, const float* w3, const float* w2,
                           int B, int T, int C, int H) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, CH = <Py_ssize_t>C * H
    cdef BackendTable* host
    if on_cpu(ctx):
        drain(ctx, "ffn_backward")
        host = host_table(ctx)
        host.ffn_backward(host.ctx, dinp, dw1, dw3, dw2, dh1, dh3, dhgated, dout, inp, h1, h3,
                          hgated, w1, w3, w2, B, T, C, H)
        return
    with gil:
        try:
            a, g = view(inp, BT * C, (BT, C)), view(dout, BT * C, (BT, C))
            grads = (view(dh1, BT * H, (BT, H)), view(dh3, BT * H, (BT, H)),
                     view(dhgated, BT * H, (BT, H)))
            dw = (<ANEBackend>ctx).dw   # the weight gradients on the CPU, in the model's order
            dw.submit(<size_t>dw2, 0, g, view(hgated, BT * H, (BT, H)), <size_t>w2, B, T, H, C)
            emulator_of(ctx).ffn_dinp(view(dinp, BT * C, (BT, C)), *grads, g, a,
                                      view(w1, CH, (H, C)), view(w3, CH, (H, C)),
                                      view(w2, CH, (C, H)), BT, C, H)
            dw.submit(<size_t>dw3, 0, grads[1], a, <size_t>w3, B, T, C, H)
            dw.submit(<size_t>dw1, 0, grads[0], a, <size_t>w1, B, T, C, H)
        except BaseException as e:
            failed(ctx, "ffn_backward", e)


def create(runtime=None, name="ane-emu", pipeline=None, budget=None, parallel_dw=None):
    """The ane-emu backend, or with runtime=CoreMLRuntime() the ane one (families llama and
    gpt2: GPT-2's own layers run on the CPU).  pipeline, budget (a CompileBudget) and
    parallel_dw default to what train.py's flags set (accel/ane/hooks.py's OPTIONS: dynamic,
    119 compiles, parallel); ane-emu's static pipeline runs on an interpreter that refuses
    compiles past the budget and fails past its limit as the ANE compiler does (or with
    LLMPYX_ANE_RUNTIME=mock on MockRuntime: the same, float32 storage)."""
    from accel.ane.runtime import InterpreterRuntime, MockRuntime
    pipeline = OPTIONS["pipeline"] if pipeline is None else pipeline
    budget = OPTIONS["budget"] if budget is None else budget
    parallel_dw = OPTIONS["parallel_dw"] if parallel_dw is None else parallel_dw
    if runtime is None:
        if os.environ.get("LLMPYX_ANE_RUNTIME") == "mock":
            runtime = MockRuntime(budget)
        else:
            runtime = InterpreterRuntime(budget, budget.limit if pipeline == "static" else None)
    cdef ANEBackend backend = ANEBackend(name, True, ("linear", "gpt2", "llama", "classifier",
                                                     "fused"))
    backend.host = cpu.create(flash=False)
    backend.emulator = Emulator(runtime=runtime, pipeline=pipeline)
    backend.dw = DWeights(backend, parallel_dw)
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
    t.qkv_forward = ane_qkv_forward
    t.qkv_backward = ane_qkv_backward
    t.ffn_forward = ane_ffn_forward
    t.ffn_backward = ane_ffn_backward
    t.mark = ane_mark
    t.synchronize = ane_synchronize
    t.copy_to_host = ane_copy_to_host
    t.zero = ane_zero
    t.embedding_backward = ane_embedding_backward
    backend.validate()
    return backend

