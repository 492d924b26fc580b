"""
Backend ane (macOS): the ANE's share of a Llama step (accel/ane/table.pyx: matmul and its dx,
attention_gqa, SwiGLU; the rest on the CPU) as Core ML ML Programs with CPU_AND_NE compute units
(accel/ane/runtime.py's CoreMLRuntime), or with LLMPYX_ANE_RUNTIME=private on the private
in-memory ANE API, each kernel checked against Core ML's outputs before it is trusted.
Written and reviewed against Apple's documentation, UNRUN: there is no Mac here (README.md).
"""
import os

from accel.ane import runtime, table


def create():
    if os.environ.get("LLMPYX_ANE_RUNTIME", "coreml") == "private":
        chosen = runtime.PrivateANERuntime(check_against=runtime.CoreMLRuntime())
    else:
        chosen = runtime.CoreMLRuntime()
    return table.create(chosen, name="ane")
