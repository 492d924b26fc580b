"""
Teardown: whatever order the cyclic garbage collector picks, freeing a model, its buffers and
its backend never touches what is already gone (accel/backend.pyx, "Teardown").

The exit crash of issue 20: offline, tinyshakespeare's failed download left its exception in a
local (get_text's `reason` in dev/data/tinyshakespeare.py) whose traceback holds that frame, a
reference cycle that holds train.py's main frame too (through the frames' f_back) and so the
model.  At interpreter exit the collector cleared a Buffer of that garbage (Cython's tp_clear set
its backend to None) before the frame whose clearing freed the model, and the Buffer's
__dealloc__ then called free through None.

Each case runs in a fresh interpreter (the failure is a segmentation fault) with the automatic
collector off, so the collector meets the objects in the order the case makes them.
"""
import os
import subprocess
import sys

import pytest

import needs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# profile:guard:cpu: a wrapper whose target's context is another wrapper's state
BACKENDS = ["cpu", "check:cpu", "guard:cpu", "profile:cpu", "profile:guard:cpu", "hip-emu",
            "metal-emu", "ane-emu"]

# a GPT-2 of one layer on the backend, one step run so that every buffer is allocated
MODEL = """
import gc
import numpy as np
from accel.backend import get_backend
from train_gpt2 import GPT2Config
from train_gpt2 import GPT2
gc.disable()
backend = get_backend({backend!r})

def train_a_step(model):
    tokens = np.arange(8, dtype=np.int32).reshape(2, 4)
    model.forward(tokens, tokens)
    model.zero_grad()
    model.backward()
    model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, 1)

def new_model():
    return GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16), backend=backend)
"""

CASES = {
    # the smallest faulty order: a Buffer, then the cycle holding its last reference
    "buffer before its holder": """
buffer = backend.alloc(64)
holder = [buffer]
holder.append(holder)
del buffer, holder
""",
    # train.py's: the model's parameters a generation older than the frame kept by an
    # exception, the step's buffers younger (a full collection takes the oldest generation
    # first, then the youngest: the step's buffers, the frame, the model)
    "model in a kept exception's frame": """
def run():
    model = new_model()
    gc.collect(0)
    train_a_step(model)
    try:
        raise OSError("cannot download")
    except OSError as e:
        reason = e

run()
""",
    # the backend made before everything else, so cleared first: its context must stay
    "backend before its model": """
model = new_model()
train_a_step(model)
holder = [backend, model]
holder.append(holder)
del backend, model, holder
""",
}


def teardown(backend, case):
    code = MODEL.format(backend=backend) + CASES[case] + "gc.collect()\nprint('collected')\n"
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_collector_frees_a_model_in_any_order(backend, case):
    if backend.endswith("-emu"):
        needs.emulator(backend)
    result = teardown(backend, case)
    assert result.returncode == 0 and result.stdout == "collected\n", result.stderr[-2000:]
