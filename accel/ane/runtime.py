"""
The ANE runtime wrapper: one interface over the three ways a MIL program (a coremltools MIL
`Program`, as accel/ane/mil.py builds them) becomes a kernel that runs.

    runtime.compile(program, weights=None) -> Kernel     counts against the compile budget
    runtime.run(kernel, inputs) -> outputs               {name: array} in, {name: array} out
    runtime.compile_count, runtime.budget                 compiles so far in this process
    runtime.needs_restart(n)                               would n more compiles pass the budget

    InterpreterRuntime   Linux: accel/ane/interp.py runs the program itself in fp16 (what the
                         ane-emu backend runs on; no compile limit)
    MockRuntime          Linux, the tests: counts compiles and fails past `limit` as the ANE
                         compiler does (about 119 per process); runs a kernel with the
                         interpreter in float32 (the data flow), or only records the call
    CoreMLRuntime        the supported path: coremltools.convert to an ML Program with
                         compute_units CPU_AND_NE, MLModel.predict (predict needs macOS; the
                         conversion and the saved .mlpackage work on Linux too)
    PrivateANERuntime    macOS only, opt-in: the private in-memory model API the anchor uses
                         (accel/ane/ane_private.m, `make ane-private`), compiled from MIL text and
                         a weight blob, IOSurface I/O; every kernel checked against CoreMLRuntime's
                         outputs before it is trusted (it can return zeros silently)

The budget: the ANE compiler refuses compiles past about 119 in one process (the anchor
measured it). CompileBudget holds that limit and the headroom kept below it; the planner
(accel/ane/plan.py) plans restarts and the runtime refuses compiles by the same object's
`usable`, so the two cannot disagree about where a process ends.
"""
import copy
import os
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["ANE_LIMIT", "ANE_HEADROOM", "ANE_INNER_MULTIPLE", "BudgetExceeded", "CompileBudget",
           "CompileLimitError", "CoreMLRuntime", "InterpreterRuntime", "Kernel", "MockRuntime",
           "NumpyProgram",
           "PrivateANERuntime",
           "RuntimeUnavailable", "inner_dims", "misaligned_inner_dims"]

ANE_LIMIT = 119          # compiles one process gets from the ANE compiler (the anchor's measure)
ANE_HEADROOM = 10        # kept below it: the private path's check compiles, retries, surprises
ANE_INNER_MULTIPLE = 32  # a matmul / 1x1 conv inner dimension the private path computes right


class BudgetExceeded(RuntimeError):
    """The wrapper refused a compile: the process has used its budget; restart it (exec)."""


class CompileLimitError(RuntimeError):
    """The compiler itself failed a compile past its limit (what the real ANE does; the mock)."""


class RuntimeUnavailable(RuntimeError):
    """This runtime cannot run here (not macOS, not built, no coremltools); one line."""


@dataclass(frozen=True)
class CompileBudget:
    """The compiles one process may make: the compiler's limit less a headroom."""
    limit: int = ANE_LIMIT
    headroom: int = ANE_HEADROOM

    def __post_init__(self):
        if self.limit < 1 or self.headroom < 0 or self.headroom >= self.limit:
            raise ValueError(f"compile budget: need limit >= 1 and 0 <= headroom < limit, got "
                             f"limit {self.limit}, headroom {self.headroom}")

    @classmethod
    def for_limit(cls, limit=ANE_LIMIT):
        """The budget of a compiler limit, with the usual headroom (at most half of it)."""
        return cls(int(limit), min(ANE_HEADROOM, int(limit) // 2))

    @property
    def usable(self):
        return self.limit - self.headroom

    def __str__(self):
        return f"{self.usable} compiles per process ({self.limit} less {self.headroom} headroom)"


@dataclass
class Kernel:
    """A compiled program: its inputs' and outputs' names and shapes, and the runtime's handle."""
    program: object
    inputs: dict        # name -> shape
    outputs: dict       # name -> shape
    handle: object = None
    index: int = 0      # the compile that made it, 1-based, in this process


class NumpyProgram:
    """A stand-in for a MIL program where coremltools is not worth its import (seconds): named
    input and output shapes and a NumPy function; MockRuntime runs it (the restart tests)."""

    def __init__(self, name, inputs, outputs, function):
        self.name, self.inputs, self.outputs, self.function = name, inputs, outputs, function


def _function(program):
    return program.functions["main"]


def _signature(program):
    if isinstance(program, NumpyProgram):
        return dict(program.inputs), dict(program.outputs)
    f = _function(program)
    inputs = {name: tuple(int(d) for d in var.shape) for name, var in f.inputs.items()}
    outputs = {var.name: tuple(int(d) for d in var.shape) for var in f.outputs}
    return inputs, outputs


def inner_dims(program):
    """[(op name, op type, inner dimension)] of every matmul, linear and conv in the program:
    the dimension each output element sums over (a conv's input channels per group)."""
    dims = []
    for op in _function(program).operations:
        if op.op_type == "matmul":
            x = op.x.shape
            transposed = op.transpose_x is not None and bool(op.transpose_x.val)
            dims.append((op.name, "matmul", int(x[-2] if transposed else x[-1])))
        elif op.op_type == "linear":
            dims.append((op.name, "linear", int(op.x.shape[-1])))
        elif op.op_type == "conv":
            dims.append((op.name, "conv", int(op.weight.shape[1])))
    return dims


def misaligned_inner_dims(program, multiple=ANE_INNER_MULTIPLE):
    """The inner_dims not a multiple of `multiple`: shapes the private path may get wrong
    (zeros, silently); pad them (accel/ane/plan.py says by how much) or use Core ML."""
    return [d for d in inner_dims(program) if d[2] % multiple]


class Runtime:
    """The interface; the subclasses compile and run."""
    name = "runtime"

    def __init__(self, budget=None, enforce_budget=True):
        self.budget = budget or CompileBudget()
        self.enforce_budget = enforce_budget   # False: only the compiler's own limit stops it
        self.compile_count = 0

    def needs_restart(self, compiles):
        """Whether `compiles` more would pass the budget's usable part (the planner's rule)."""
        return self.compile_count + compiles > self.budget.usable

    def compile(self, program, weights=None):
        if self.enforce_budget and self.needs_restart(1):
            raise BudgetExceeded(f"{self.name}: compile {self.compile_count + 1} would pass the "
                                 f"budget of {self.budget}: restart the process")
        inputs, outputs = _signature(program)
        handle = self._compile(program, weights)
        self.compile_count += 1
        return Kernel(program, inputs, outputs, handle, self.compile_count)

    def run(self, kernel, inputs):
        missing = set(kernel.inputs) - set(inputs)
        if missing:
            raise ValueError(f"{self.name}: kernel inputs missing: {', '.join(sorted(missing))}")
        for name, shape in kernel.inputs.items():
            if tuple(np.shape(inputs[name])) != shape:
                raise ValueError(f"{self.name}: input {name} has shape "
                                 f"{tuple(np.shape(inputs[name]))}, the kernel takes {shape}")
        return self._run(kernel, inputs)

    def _compile(self, program, weights):
        raise NotImplementedError

    def _run(self, kernel, inputs):
        raise NotImplementedError


# ----------------------------------------------------------------------------
# the interpreter: Linux, the ane-emu backend

class InterpreterRuntime(Runtime):
    """The NumPy interpreter of accel/ane/interp.py as a runtime: compile keeps the program,
    run interprets it (fp16 storage, as the ANE). Counts compiles; with `limit` it also refuses
    past its budget and fails past `limit` compiles as the ANE compiler (and MockRuntime) do
    (ane-emu's static pipeline), without it it has no limit (the dynamic one)."""
    name = "interp"

    def __init__(self, budget=None, limit=None):
        super().__init__(budget, enforce_budget=limit is not None)
        from accel.ane import interp
        self.interp = interp
        self.limit = limit

    def _compile(self, program, weights):
        if self.limit is not None and self.compile_count >= self.limit:
            raise CompileLimitError(f"interpreter as the ANE compiler: compile "
                                    f"{self.compile_count + 1} of a process that allows "
                                    f"{self.limit}")
        return program

    def _run(self, kernel, inputs):
        return self.interp.run(kernel.handle, **inputs)


# ----------------------------------------------------------------------------
# the mock: Linux, the tests

class MockRuntime(Runtime):
    """Compiles nothing: counts, and fails like the ANE compiler past `limit` compiles (the
    budget's limit unless given), so a schedule that ignores the budget (enforce_budget=False:
    the wrapper does not refuse first) fails here as on a Mac.
    run() evaluates the program with accel/ane/interp.py in float32 (evaluate=True: the data
    flow without the ANE's fp16 rounding) or returns zeros of the outputs' shapes; every call is recorded in `calls` as (kind, kernel index, program name)."""
    name = "mock"

    def __init__(self, budget=None, limit=None, evaluate=True, enforce_budget=True):
        super().__init__(budget, enforce_budget)
        self.limit = self.budget.limit if limit is None else limit
        self.evaluate = evaluate
        self.calls = []

    def _compile(self, program, weights):
        if self.compile_count >= self.limit:
            raise CompileLimitError(f"mock ANE compiler: compile {self.compile_count + 1} of a "
                                    f"process that allows {self.limit}")
        self.calls.append(("compile", self.compile_count + 1, _program_name(program)))
        return None

    def _run(self, kernel, inputs):
        self.calls.append(("run", kernel.index, _program_name(kernel.program)))
        if not self.evaluate:
            return {name: np.zeros(shape, np.float32) for name, shape in kernel.outputs.items()}
        if isinstance(kernel.program, NumpyProgram):
            return kernel.program.function(**inputs)
        from accel.ane import interp
        return interp.run(kernel.program, storage=np.float32, **inputs)


def _program_name(program):
    if isinstance(program, NumpyProgram):
        return program.name
    return _function(program).outputs[0].name


# ----------------------------------------------------------------------------
# Core ML: the supported path

class CoreMLRuntime(Runtime):
    """coremltools.convert(program) to an ML Program for CPU_AND_NE (the ANE where Core ML
    places an op there, else the CPU), predict with it. On Linux compile() converts (and
    `save` writes the .mlpackage) but run() needs macOS: Core ML itself is Apple's."""
    name = "coreml"

    def __init__(self, budget=None, precision="fp16"):
        super().__init__(budget)
        try:
            import coremltools as ct
        except ImportError as e:
            raise RuntimeUnavailable(f"coreml runtime: coremltools is not installed ({e}): "
                                     f"pip install -r requirements.txt") from None
        self.ct = ct
        self.precision = precision

    def convert(self, program):
        """The MLModel of a copy of program (convert rewrites the program it is given)."""
        ct = self.ct
        return ct.convert(copy.deepcopy(program), convert_to="mlprogram",
                          compute_units=ct.ComputeUnit.CPU_AND_NE,
                          compute_precision=(ct.precision.FLOAT16 if self.precision == "fp16"
                                             else ct.precision.FLOAT32),
                          minimum_deployment_target=ct.target.iOS17,
                          skip_model_load=sys.platform != "darwin")

    def _compile(self, program, weights):
        if weights:
            raise ValueError("coreml runtime: the weights go into the program as constants "
                             "(static) or come as inputs (dynamic), not beside it")
        return self.convert(program)

    def save(self, kernel, path):
        """Write the kernel's model as an .mlpackage (works on Linux)."""
        kernel.handle.save(os.fspath(path))
        return path

    def _run(self, kernel, inputs):
        if sys.platform != "darwin":
            raise RuntimeUnavailable("coreml runtime: predict needs macOS (Core ML)")
        outputs = kernel.handle.predict({name: np.asarray(value, np.float16 if self.precision ==
                                         "fp16" else np.float32) for name, value in inputs.items()})
        return {name: np.asarray(outputs[name], np.float32) for name in kernel.outputs}


# ----------------------------------------------------------------------------
# the private in-memory ANE API: macOS, opt-in, UNRUN here (no Mac)

class PrivateANERuntime(Runtime):
    """The anchor's fast path over accel/ane/ane_private.m (ctypes, accel/ane/private.py):
    compile from the program's MIL text and weight blob (accel/ane/milt.py, accel/ane/blob.py),
    run through IOSurfaces. Refuses programs with an inner dimension that is not a multiple of
    32 (the ANE returns zeros for them, silently), and checks every kernel's first outputs
    against CoreMLRuntime's before trusting it (check_against=CoreMLRuntime(...))."""
    name = "ane-private"

    def __init__(self, budget=None, check_against=None, rtol=2e-2, atol=2e-2, lib=None):
        super().__init__(budget)
        if lib is None:
            from accel.ane import private
            if private.unavailable():   # off macOS, or not built
                raise RuntimeUnavailable(private.unavailable())
            lib = private.Library(private.LIBRARY)
        self.lib = lib   # compile(text, blob, inputs, outputs), run(handle, inputs, outputs)
        self.reference = check_against
        self.rtol, self.atol = rtol, atol
        self.trusted = set()

    def _compile(self, program, weights):
        bad = misaligned_inner_dims(program)
        if bad:
            name, kind, dim = bad[0]
            raise ValueError(f"ane-private: {kind} {name} sums over {dim}, not a multiple of "
                             f"{ANE_INNER_MULTIPLE} (the ANE returns zeros): pad it "
                             f"(accel/ane/plan.py) or use the coreml runtime")
        if weights is None:   # the program's MIL text and BLOBFILE (accel/ane/milt.py)
            from accel.ane import blob, milt
            text, arrays = milt.to_text(program)
            weights = (text, blob.layout(arrays)[0])
        text, blob = weights
        inputs, outputs = _signature(program)
        return self.lib.compile(text, blob, inputs, outputs)

    def _run(self, kernel, inputs):
        outputs = self.lib.run(kernel.handle, inputs, kernel.outputs)
        if self.reference is not None and kernel.index not in self.trusted:
            expected = self.reference.run(self.reference.compile(kernel.program), inputs)
            for name, value in outputs.items():
                if not np.allclose(value, expected[name], rtol=self.rtol, atol=self.atol):
                    raise RuntimeError(f"ane-private: output {name} of kernel {kernel.index} "
                                       f"differs from the reference's (max |diff| "
                                       f"{np.max(np.abs(value - expected[name])):.3g}): not "
                                       f"trusted")
            self.trusted.add(kernel.index)
        return outputs
