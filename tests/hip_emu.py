"""What the tests of accel/hip's emulated builds share: the builds (make, in parallel), the
emulator's schedules and warp sizes, and check: around a configured emulated context.

Imported by tests/test_hip*.py and tests/test_gpu_epilogues.py: a test module importing it is
skipped where there is no C++ compiler or make (the tests build the emulated libraries).
"""
import os
import subprocess

import numpy as np

import builds
import needs
from accel import instrument
from accel.hip import device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIP = os.path.join(ROOT, "accel", "hip")
CXX = needs.cxx()
needs.tool("make")

# the orders the emulator runs a block's threads in (accel/emu/README.md), with their seeds: a
# missing barrier shows under some and not others, which is why every one runs
SCHEDULES = [("lockstep", 1), ("lockstep-reverse", 1), ("warp-ahead", 1), ("warp-ahead-reverse", 1),
             ("shuffled", 1), ("shuffled", 2)]
WARP_SIZES = (32, 64)


def make(*targets, build=None, defines=""):
    """accel/hip's Makefile in the background: BUILD= a folder of its own, DEFINES= a planted
    fault's -D; finish() waits for it."""
    args = ["make", "-s", "-C", HIP, f"CXX={CXX}"] + ([f"BUILD={build}"] if build else [])
    args += [f"DEFINES={defines}"] + list(targets)
    return subprocess.Popen(args if build else builds.locked(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*processes):
    for process in processes:
        out, err = process.communicate()
        assert process.returncode == 0, err or out


def checked(library, schedule=("lockstep", 1), warp_size=32, compute_units=64):
    """check: around a fresh context of the emulated build at `library`, configured first."""
    device.configure_emulator(schedule[0], schedule[1], warp_size, compute_units, library=library)
    return instrument.create("check", device.load(library, "hip-emu"))


def first_mismatch(backend):
    """The entry check: found wrong first, or None."""
    first = backend.report()["first"]
    return None if first is None else first["entry"]


def adamw_steps(model, tokens, steps):
    """[(loss, gradients, parameters after the update)] of `steps` AdamW steps on one batch."""
    history = []
    for step in range(1, steps + 1):
        loss = model.forward(tokens[:, :-1], tokens[:, 1:])
        model.zero_grad()
        model.backward()
        grads = np.array(model.grads)
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, step)
        history.append((loss, grads, np.array(model.params)))
    return history
