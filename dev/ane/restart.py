"""
The lab of restarts INSIDE a step past the ANE compile budget (the planner's layer groups,
accel/ane/plan.py), which training does not do yet (it restarts between steps, from train.py's
checkpoints): a state file, the exec() restart and an executor that runs a plan's phases on a
runtime (accel/ane/runtime.py), restarting where the plan does and resuming by itself.

The state file (one file, memory-mapped when read; written whole or not at all by
llmc/formats/common.py's atomic_write):

    bytes 0..63     header: b"ANESTATE", uint32 version (1), uint32 metadata bytes,
                    uint64 array bytes, uint32 CRC-32 of the metadata and the arrays, zeros
    then            the metadata, JSON (step, phase, data position, the RNG's state, the run's
                    key, each array's name, dtype, shape and offset), padded to 64 bytes
    then            the arrays (weights, AdamW m and v, and inside a step the gradients and the
                    kept activations), each at a multiple of 64 bytes

A truncated file (its length is not the header's), a damaged one (the CRC), one of another run
(the key: model, pipeline, budget, policy) or not a state file at all is refused in one line
(llmc/formats/common.py's FormatError).  Why not llm.c's training state file: it holds AdamW
and the data loader but not the weights (they go to a model file beside it), nor a step's gradients
and activations, and is read whole rather than mapped; this is one file per restart.

    python -m dev.ane.restart --state S.bin --out W.npy --steps 3 --limit 20 --headroom 2

runs a fake workload (a few layers of NumPy "kernels" with baked-in weights, a stand-in for a
model's ANE kernels) under the static pipeline on the mock runtime, exec()ing itself whenever
the plan says, and writes the final weights: the same bits however many restarts it took
(tests/test_ane_plan.py).
"""
import argparse
import json
import os
import sys
import zlib
from dataclasses import dataclass

import numpy as np

from accel.ane.plan import BACKWARD, FORWARD, Process, kernel_id, make_plan, step_fits
from accel.ane.runtime import CompileBudget, MockRuntime, NumpyProgram
from llmc.formats.common import FormatError, atomic_write
from llmc.recompute import RecomputePlan

__all__ = ["MAGIC", "exec_restart", "execute", "read_state", "write_state"]

MAGIC = b"ANESTATE"
VERSION = 1
HEADER = 64
ALIGN = 64


def _pad(n):
    return -n % ALIGN


def write_state(path, meta, arrays):
    """Write arrays ({name: array}) and meta (JSON-able) to path, atomically."""
    layout, offset = [], 0
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    for name, a in arrays.items():
        layout.append(dict(name=name, dtype=a.dtype.str, shape=list(a.shape), offset=offset))
        offset += a.nbytes + _pad(a.nbytes)
    body = json.dumps(dict(meta, arrays=layout)).encode()
    body += b" " * _pad(len(body))
    crc = zlib.crc32(body)
    chunks = []
    for a in arrays.values():
        raw = a.view(np.uint8).reshape(-1).data
        crc = zlib.crc32(raw, crc)
        chunks += [raw, b"\0" * _pad(a.nbytes)]
        crc = zlib.crc32(b"\0" * _pad(a.nbytes), crc)
    header = (MAGIC + np.array([VERSION, len(body)], "<u4").tobytes() +
              np.array([offset], "<u8").tobytes() + np.array([crc], "<u4").tobytes())
    header += b"\0" * (HEADER - len(header))
    atomic_write(path, [header, body] + chunks)


def read_state(path, key=None, check=True):
    """(meta, {name: array mapped from the file, copy-on-write}); FormatError in one line if
    the file is not a whole state file (of the run `key`, when given)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(HEADER)
        if len(header) < HEADER or header[:8] != MAGIC:
            raise FormatError(path, "not an ANE state file (no ANESTATE header)")
        version, meta_bytes = np.frombuffer(header, "<u4", 2, 8)
        array_bytes = int(np.frombuffer(header, "<u8", 1, 16)[0])
        crc = int(np.frombuffer(header, "<u4", 1, 24)[0])
        if version != VERSION:
            raise FormatError(path, f"ANE state version {version}, supported: {VERSION}")
        expected = HEADER + int(meta_bytes) + array_bytes
        if size != expected:
            raise FormatError(path, f"truncated or damaged ANE state: {size} bytes, its "
                              f"header says {expected}")
        body = f.read(int(meta_bytes))
    data = np.memmap(path, np.uint8, mode="c", offset=HEADER + int(meta_bytes),
                     shape=(array_bytes,)) if array_bytes else np.zeros(0, np.uint8)
    if check and zlib.crc32(data, zlib.crc32(body)) != crc:
        raise FormatError(path, "damaged ANE state: its CRC-32 does not match")
    try:
        meta = json.loads(body)
    except ValueError:
        raise FormatError(path, "damaged ANE state: its metadata is not JSON") from None
    if key is not None and meta.get("key") != key:
        raise FormatError(path, f"ANE state of another run ({meta.get('key')}), this run "
                          f"is {key}: remove it or run that command")
    arrays = {}
    for a in meta.pop("arrays"):
        dtype = np.dtype(a["dtype"])
        count = int(np.prod(a["shape"], dtype=np.int64))
        arrays[a["name"]] = data[a["offset"]:a["offset"] + count * dtype.itemsize].view(
            dtype).reshape(a["shape"])
    return meta, arrays


def exec_restart(state_path, meta, arrays):
    """Save the state and replace this process with the same command line (a fresh process:
    a fresh compile budget); it resumes from state_path by itself."""
    write_state(state_path, meta, arrays)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable] + sys.orig_argv[1:])


def execute(plan, workload, runtime, state_path, steps, restart=exec_restart):
    """Run `steps` steps of plan's phases on the runtime, compiling each phase's missing
    kernels through workload.program(kernel id) and running it with workload.run_phase(phase,
    kernels, runtime).  Restarts by the plan's rule (plan.place; the same budget object as the
    runtime's) and resumes from state_path when it exists.  Returns the process's number."""
    if runtime.budget != plan.budget:
        raise ValueError(f"the runtime's budget ({runtime.budget}) is not the plan's "
                         f"({plan.budget})")
    key = f"{plan.config.describe()} {plan.pipeline} {plan.policy} {plan.budget}"
    step, start, number = 0, 0, 1
    if os.path.exists(state_path):
        meta, arrays = read_state(state_path, key)
        step, start, number = meta["step"], meta["phase"], meta["process"] + 1
        workload.load(meta, arrays)
    print(f"process {number}: starts at step {step} phase {start}", flush=True)
    process, kernels = Process(plan.pipeline, plan.budget), {}
    whole_steps = step_fits(Process(plan.pipeline, plan.budget), plan.phases)

    def save_and_restart(step, phase):
        meta, arrays = workload.state()
        restart(state_path, dict(meta, key=key, step=step, phase=phase, process=number), arrays)

    while step < steps:
        if start == 0 and whole_steps and not step_fits(process, plan.phases):
            return save_and_restart(step, 0)
        for i in range(start, len(plan.phases)):
            phase = plan.phases[i]
            needed = process.needed(phase)
            if runtime.needs_restart(len(needed)):
                if process.compiles == 0:   # a fresh process would only restart again
                    raise ValueError(f"{phase} needs {len(needed)} compiles, more than a "
                                     f"process gets ({runtime.budget})")
                return save_and_restart(step, i)
            for kernel_id in needed:
                kernels[kernel_id] = runtime.compile(workload.program(kernel_id))
            process.enter(phase)
            assert process.compiles == runtime.compile_count
            workload.run_phase(phase, kernels, runtime)
            if phase.kind == "update":   # stale kernels are never run again
                kernels = {k: v for k, v in kernels.items() if k in process.resident}
        step, start = step + 1, 0
    return number


# ----------------------------------------------------------------------------
# the fake workload of the restart test

@dataclass(frozen=True)
class FakeConfig:
    """The fake workload's model, as the planner reads one: its layers and sequence length."""
    n_layers: int
    max_seq_len: int
    channels: int

    def describe(self):
        return f"fake workload: L={self.n_layers} C={self.channels} T={self.max_seq_len}"


class FakeWorkload:
    """Layers of C channels on a stream of S positions; every weighted kernel of layer l is
    y = tanh(W_l x) with W_l baked in when it is compiled (a stale kernel gives other numbers),
    the weight-free ones y = x / 2.  A step draws its input from the RNG and the data position,
    runs the phases, and AdamW-updates the W_l from gradients the backward kernels make."""

    def __init__(self, layers, C=8, S=16, seed=0):
        rng = np.random.default_rng(seed)
        self.W = (0.3 * rng.standard_normal((layers, C, C))).astype(np.float32)
        self.m, self.v = np.zeros_like(self.W), np.zeros_like(self.W)
        self.G = np.zeros_like(self.W)
        self.acts = np.zeros((layers + 1, C, S), np.float32)
        self.dstream = np.zeros((C, S), np.float32)
        self.rng, self.data_pos, self.t, self.C, self.S = rng, 0, 0, C, S

    @property
    def config(self):
        return FakeConfig(len(self.W), self.S, self.C)

    def state(self):
        meta = dict(data_pos=self.data_pos, t=self.t, rng=self.rng.bit_generator.state)
        return meta, dict(W=self.W, m=self.m, v=self.v, G=self.G, acts=self.acts,
                          dstream=self.dstream)

    def load(self, meta, arrays):
        self.data_pos, self.t = meta["data_pos"], meta["t"]
        self.rng.bit_generator.state = meta["rng"]
        for name, array in arrays.items():
            getattr(self, name)[...] = array

    def program(self, kernel_id):
        C, S = self.C, self.S
        name, _, layer = kernel_id.partition("[")
        if not layer:
            return NumpyProgram(name, {"x": (C, S)}, {"y": (C, S)}, lambda x: {"y": x / 2})
        W = self.W[int(layer[:-1])].copy()   # baked in: static
        return NumpyProgram(kernel_id, {"x": (C, S)}, {"y": (C, S)},
                            lambda x: {"y": np.tanh(W @ x)})

    def _forward(self, l, kernels, runtime):
        x = self.acts[l]
        for k, w in FORWARD:
            x = x + 0.1 * runtime.run(kernels[kernel_id("static", k, w, l)], {"x": x})["y"]
        return x

    def run_phase(self, phase, kernels, runtime):
        if phase.kind == "forward":
            if phase.layer == 0:
                self.acts[0] = self.rng.standard_normal((self.C, self.S)) + 0.01 * self.data_pos
                self.data_pos += 1
            self.acts[phase.layer + 1] = self._forward(phase.layer, kernels, runtime)
            if phase.layer == len(self.W) - 1:
                self.dstream[...] = self.acts[-1]
        elif phase.kind == "backward":
            for r in phase.recomputed:   # the stream kept is all layers' here: recompute checks
                assert np.array_equal(self._forward(r, kernels, runtime), self.acts[r + 1])
            l, d = phase.layer, self.dstream
            for k, w in BACKWARD:
                y = runtime.run(kernels[kernel_id("static", k, w, l)], {"x": self.acts[l]})["y"]
                self.G[l] += (d @ y.T) / self.S
                d = d + 0.1 * y
            self.dstream[...] = d
        else:   # AdamW
            self.t += 1
            b1, b2, lr = 0.9, 0.95, 1e-2
            self.m[...] = b1 * self.m + (1 - b1) * self.G
            self.v[...] = b2 * self.v + (1 - b2) * self.G * self.G
            mhat, vhat = self.m / (1 - b1 ** self.t), self.v / (1 - b2 ** self.t)
            self.W -= (lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
            self.G[...] = 0


def main(argv=None):
    p = argparse.ArgumentParser(description="The restart test's fake workload (see the docstring).")
    p.add_argument("--state", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--headroom", type=int, default=2)
    p.add_argument("--policy", default="all")
    p.add_argument("--runtime-headroom", type=int, default=None,
                   help="a runtime budget other than the plan's (the test of their agreement)")
    args = p.parse_args(argv)
    budget = CompileBudget(args.limit, args.headroom)
    workload = FakeWorkload(args.layers)
    plan = make_plan(workload.config, "static", budget,
                     RecomputePlan(args.policy, workload.config.n_layers))
    runtime = MockRuntime(budget if args.runtime_headroom is None else
                          CompileBudget(args.limit, args.runtime_headroom))
    try:
        number = execute(plan, workload, runtime, args.state, args.steps)
    except (FormatError, ValueError) as e:
        sys.exit(f"restart: error: {e}")
    print(f"process {number}: done, {runtime.compile_count} compiles in this one")
    np.save(args.out, workload.W)
    if os.path.exists(args.state):   # done: the next run starts afresh
        os.remove(args.state)


if __name__ == "__main__":
    main()
