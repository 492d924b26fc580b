"""
Backend ane (macOS): the ANE's share of a Llama step (accel/ane/table.pyx: matmul and its dx,
attention_gqa, SwiGLU; the rest on the CPU) as Core ML ML Programs with CPU_AND_NE compute units
(accel/ane/runtime.py's CoreMLRuntime), or with LLMPYX_ANE_RUNTIME=private on the private
in-memory ANE API, each kernel checked against Core ML's outputs before it is trusted.
Written and reviewed against Apple's documentation, UNRUN: there is no Mac here (README.md).
Its hooks into train.py (its flags, dry run, compile budget between steps) are ane-emu's too:
accel/ane/hooks.py.
"""
import os

from accel.ane import runtime
from accel.ane.hooks import HOOKS, OPTIONS  # noqa: F401 (HOOKS: the registry reads it here)


def create():
    from accel.ane import table   # not at the top: train.py imports this module for its hooks
    budget = OPTIONS["budget"]
    if os.environ.get("LLMPYX_ANE_RUNTIME", "coreml") == "private":
        chosen = runtime.PrivateANERuntime(budget, check_against=runtime.CoreMLRuntime(budget))
    else:
        chosen = runtime.CoreMLRuntime(budget)
    return table.create(chosen, name="ane")
