"""
The ane-emu backend: the Apple Neural Engine's share of a Llama training step, as the anchor
splits it, run on Linux by the NumPy interpreter (accel/ane/interp.py) over the very MIL
programs of accel/ane/mil.py (dynamic pipeline: weights are inputs, one build per shape).

  on the (emulated) ANE, fp16:  matmul_forward, matmul_backward's dinp, attention_gqa_forward
                                and _backward (dq, dk, dv; the softmax recomputed from q and k),
                                swiglu_forward and _backward
  on the CPU (kernels/), fp32:  everything else - embedding, RMSNorm, RoPE, the classifier's
                                loss, AdamW, the weight gradients (matmul_backward's dweight,
                                dbias), memory - and GPT-2's own layers

The table is the CPU backend's with those entries replaced; each replacement takes the GIL and
calls the Emulator (ctx).  A failure inside one is reported by last_error as one line.

Loss scaling against fp16 underflow: every dx entry multiplies its incoming gradient by a
power of two before casting it to fp16 and divides the results by it after casting back
(exact: powers of two).  The scale is dynamic, chosen per call so that the gradient's largest
magnitude lands at 2^LOSS_SCALE_TARGET_LOG2 (far below fp16's 65504, leaving room for the
growth inside the program): a loss gradient of 1/(B*T) times small weights is below fp16's
smallest subnormal (6e-8) long before training ends.  Emulator(loss_scale=False) turns it off
(the test that shows the underflow).
"""
import math

import numpy as np

from accel.backend cimport Backend, BackendTable
from accel import cpu

LOSS_SCALE_TARGET_LOG2 = 8
# check:ane-emu's tolerances for the entries that run in fp16 (relative to the largest oracle
# magnitude; fp16's unit roundoff is 2^-11 = 4.9e-4, a piece rounds several intermediates)
TOLERANCES = {"matmul_forward": 4e-3, "matmul_backward": 4e-3, "attention_gqa_forward": 4e-3,
              "attention_gqa_backward": 8e-3, "swiglu_forward": 4e-3, "swiglu_backward": 4e-3}


class Emulator:
    """Programs built once per shape, run by the interpreter; counts the builds ("compiles")."""

    def __init__(self, loss_scale=True):
        from accel.ane import interp, mil
        self.mil, self.interp = mil, interp
        self.loss_scale = loss_scale
        self.programs = {}
        self.builds = 0

    def program(self, piece, *dims):
        """mil.piece(*dims), built on its first use only."""
        key = (piece, dims)
        if key not in self.programs:
            self.programs[key] = getattr(self.mil, piece)(*dims)
            self.builds += 1
        return self.programs[key]

    def run(self, piece, dims, x):
        return self.interp.run(self.program(piece, *dims), x=x)["out"]

    def scale_of(self, dout):
        """The power of two the gradient dout is multiplied by before it becomes fp16."""
        peak = float(np.max(np.abs(dout))) if dout.size else 0.0
        if not self.loss_scale or peak == 0.0 or not math.isfinite(peak):
            return 1.0
        return 2.0 ** (LOSS_SCALE_TARGET_LOG2 - math.ceil(math.log2(peak)))

    # --- the entries (CPU layouts in, results written into the given arrays) -----------------

    def matmul_forward(self, out, inp, weight, bias, int BT, int C, int OC):
        """out (BT, OC) = inp (BT, C) @ weight (OC, C)^T (+ bias on the CPU)."""
        mil = self.mil
        out[:] = mil.from_ane(self.run("linear_forward", (C, OC, BT), mil.pack(inp.T, weight.T)))
        if bias is not None:
            out += bias

    def matmul_dinp(self, dinp, dout, weight, int BT, int C, int OC):
        """dinp (BT, C) += dout (BT, OC) @ weight (OC, C)."""
        mil = self.mil
        scale = self.scale_of(dout)
        dx = self.run("linear_backward", (C, OC, BT), mil.pack(dout.T * scale, weight))
        dinp += mil.from_ane(dx) / scale

    def attention_forward(self, out, att, q, k, v, int B, int T, int NH, int NKV, int hs):
        """out (B,T,NH*hs), att (B,NH,T,T) from q (B,T,NH*hs), k, v (B,T,NKV*hs): one sequence
        per program run."""
        mil = self.mil
        d = mil.Dims(NH * hs, NH, NKV, hs, 1, T)
        for b in range(B):
            y = self.run("attention_forward", (d,), mil.stack(q[b], k[b], v[b]))
            out[b], att[b] = mil.unpack("attention_forward", d, y)

    def attention_backward(self, dq, dk, dv, dout, q, k, v, int B, int T, int NH, int NKV,
                           int hs):
        mil = self.mil
        d = mil.Dims(NH * hs, NH, NKV, hs, 1, T)
        for b in range(B):
            scale = self.scale_of(dout[b])
            y = self.run("attention_backward", (d,), mil.stack(q[b], k[b], v[b], dout[b] * scale))
            grads = mil.unpack("attention_backward", d, y)
            for total, part in zip((dq[b], dk[b], dv[b]), grads):
                total += part / scale

    def swiglu_forward(self, out, a, b):
        x = np.stack([a, b])[None, :, None, :]
        out[:] = self.run("swiglu_forward", (a.size,), x).ravel()

    def swiglu_backward(self, da, db, dout, a, b):
        scale = self.scale_of(dout)
        x = np.stack([a, b, dout * scale])[None, :, None, :]
        y = self.run("swiglu_backward", (a.size,), x).astype(np.float32)
        da += y[0, 0, 0] / scale
        db += y[0, 1, 0] / scale


# --- the C entries: views of the table's pointers, then the Emulator with the GIL ---------------

cdef BackendTable cpu_table        # the CPU backend's table: the entries this one delegates to
cdef object pending = None         # the message of the last failed entry (bytes), until read


cdef object view(const float* p, Py_ssize_t n, shape=None):
    if p == NULL:
        return None
    if n == 0:
        return np.zeros(shape if shape is not None else 0, np.float32)
    a = np.asarray(<float[:n]> <float*> p)
    return a if shape is None else a.reshape(shape)


cdef void failed(str entry, exception) noexcept:
    global pending
    pending = f"ane-emu {entry}: {type(exception).__name__}: {exception}".encode()


cdef const char* ane_last_error(void* ctx) noexcept nogil:
    global pending
    cdef const char* message
    with gil:
        if pending is not None:
            message = <const char*> pending   # kept alive by `kept` until the next call
            kept[:] = [pending]
            pending = None
            return message
    return cpu_table.last_error(ctx)

kept = []


cdef void ane_matmul_forward(void* ctx, float* out, const float* inp, const float* weight,
                             const float* bias, int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    with gil:
        try:
            (<object>ctx).matmul_forward(view(out, BT * OC, (BT, OC)), view(inp, BT * C, (BT, C)),
                                         view(weight, <Py_ssize_t>OC * C, (OC, C)),
                                         view(bias, OC), BT, C, OC)
        except BaseException as e:
            failed("matmul_forward", e)


cdef void ane_matmul_backward(void* ctx, float* dinp, float* dweight, float* dbias,
                              const float* dout, const float* inp, const float* weight,
                              int B, int T, int C, int OC) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T
    with gil:
        try:
            # the weight gradients on the CPU: its kernel, with a scratch dinp thrown away
            scratch = np.zeros((BT, C), np.float32)
            cpu_table.matmul_backward(ctx, <float*><Py_ssize_t>scratch.ctypes.data, dweight,
                                      dbias, dout, inp, weight, B, T, C, OC)
            (<object>ctx).matmul_dinp(view(dinp, BT * C, (BT, C)), view(dout, BT * OC, (BT, OC)),
                                      view(weight, <Py_ssize_t>OC * C, (OC, C)), BT, C, OC)
        except BaseException as e:
            failed("matmul_backward", e)


cdef void ane_attention_gqa_forward(void* ctx, float* out, float* att, const float* q,
                                    const float* k, const float* v, int B, int T, int NH,
                                    int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    with gil:
        try:
            (<object>ctx).attention_forward(
                view(out, BT * QD, (B, T, QD)), view(att, BT * NH * T, (B, NH, T, T)),
                view(q, BT * QD, (B, T, QD)), view(k, BT * KVD, (B, T, KVD)),
                view(v, BT * KVD, (B, T, KVD)), B, T, NH, NKV, hs)
        except BaseException as e:
            failed("attention_gqa_forward", e)


cdef void ane_attention_gqa_backward(void* ctx, float* dq, float* dk, float* dv,
                                     const float* dout, const float* q, const float* k,
                                     const float* v, const float* att, int B, int T, int NH,
                                     int NKV, int hs) noexcept nogil:
    cdef Py_ssize_t BT = <Py_ssize_t>B * T, QD = <Py_ssize_t>NH * hs, KVD = <Py_ssize_t>NKV * hs
    with gil:
        try:
            (<object>ctx).attention_backward(
                view(dq, BT * QD, (B, T, QD)), view(dk, BT * KVD, (B, T, KVD)),
                view(dv, BT * KVD, (B, T, KVD)), view(dout, BT * QD, (B, T, QD)),
                view(q, BT * QD, (B, T, QD)), view(k, BT * KVD, (B, T, KVD)),
                view(v, BT * KVD, (B, T, KVD)), B, T, NH, NKV, hs)
        except BaseException as e:
            failed("attention_gqa_backward", e)


cdef void ane_swiglu_forward(void* ctx, float* out, const float* a, const float* b,
                             Py_ssize_t N) noexcept nogil:
    with gil:
        try:
            (<object>ctx).swiglu_forward(view(out, N), view(a, N), view(b, N))
        except BaseException as e:
            failed("swiglu_forward", e)


cdef void ane_swiglu_backward(void* ctx, float* da, float* db, const float* dout, const float* a,
                              const float* b, Py_ssize_t N) noexcept nogil:
    with gil:
        try:
            (<object>ctx).swiglu_backward(view(da, N), view(db, N), view(dout, N), view(a, N),
                                          view(b, N))
        except BaseException as e:
            failed("swiglu_backward", e)


cdef class EmulatedBackend(Backend):
    """A Backend with the tolerances check:ane-emu compares its fp16 entries at."""
    cdef readonly dict tolerances


def create(loss_scale=True):
    """The ane-emu backend (families llama and gpt2: GPT-2's own layers run on the CPU)."""
    global cpu_table
    cdef Backend host = cpu.create(flash=False)
    emulator = Emulator(loss_scale)
    cdef EmulatedBackend backend = EmulatedBackend("ane-emu", True, ("gpt2", "llama"),
                                                   (host, emulator))
    backend.tolerances = dict(TOLERANCES)
    cpu_table = host.table
    backend.table = host.table          # the CPU's adapters ignore ctx: the Emulator rides in it
    cdef BackendTable* t = &backend.table
    t.ctx = <void*>emulator
    t.last_error = ane_last_error
    t.matmul_forward = ane_matmul_forward
    t.matmul_backward = ane_matmul_backward
    t.attention_gqa_forward = ane_attention_gqa_forward
    t.attention_gqa_backward = ane_attention_gqa_backward
    t.swiglu_forward = ane_swiglu_forward
    t.swiglu_backward = ane_swiglu_backward
    backend.validate()
    return backend


def emulator_of(Backend backend):
    """The Emulator behind an ane-emu backend (tests: its builds, its loss scaling)."""
    return <object>backend.table.ctx
