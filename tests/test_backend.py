"""The backend interface: the registry, the table's validation, check:/profile:/guard:, and the
model-generic core on a backend whose memory is not the host's (check:cpu)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from accel import instrument
from accel.backend import Backend, BackendError, backend_names, get_backend
from accel.spec import BY_NAME, ENTRIES, ENTRY_GROUPS, ORDER, entries_of
from entries import SMALL, host_data, numbers, run_every_entry
from kernels.bf16 import to_bf16
from kernels.fp16 import to_fp16
from faults import FAULTS, LLAMA_FAULTS, faulty_cpu
from llmc.formats.llmc import read_checkpoint, read_debug_state
from train_gpt2 import GPT2Config
from train_gpt2 import GPT2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURE_MODEL = os.path.join(HERE, "fixtures", "gpt2_tiny.bin")
FIXTURE_STATE = os.path.join(HERE, "fixtures", "gpt2_tiny_debug_state.bin")


# --- the registry ----------------------------------------------------------------------------

def test_unknown_backend_is_one_line_naming_what_is_available():
    with pytest.raises(BackendError) as e:
        get_backend("tpu")
    message = str(e.value)
    assert "\n" not in message and "unknown backend 'tpu'" in message and "cpu" in message


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal is a real option on macOS")
def test_unavailable_backend_says_why():
    with pytest.raises(BackendError, match=r"backend 'metal' is unavailable: Metal needs macOS"):
        get_backend("metal")
    assert ("metal", "Metal on Apple GPUs", "Metal needs macOS") in backend_names()


def test_unknown_wrapper_and_bad_inner_backend():
    with pytest.raises(BackendError, match="unknown backend wrapper 'trace:'"):
        get_backend("trace:cpu")
    with pytest.raises(BackendError, match="unknown backend 'nope'"):
        get_backend("check:nope")


def test_every_missing_entry_is_refused_by_name():
    backend = get_backend("cpu", "bf16")   # fills every group but the device collectives
    assert set(ORDER) - set(entries_of(backend.groups)) == set(ENTRY_GROUPS["collectives"])
    for entry in entries_of(backend.groups):   # the collectives: tests/test_mpi_device.py
        with pytest.raises(BackendError, match=f"its table has no entry '{entry}'"):
            backend._without_entry(entry)


def test_model_refuses_a_backend_without_its_kernels():
    with pytest.raises(BackendError, match="has no linear kernels, which the gpt2 family needs"):
        GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16),
             backend=Backend("memory-only", True, ()))


# --- every entry through check:, at odd shapes and at d12's widths ---------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_entry_passes_check_cpu(precision):
    backend = get_backend("check:cpu", precision)
    run_every_entry(backend)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    kernels = {e.name for e in ENTRIES if e.wrap and e.group in backend.groups}
    assert kernels <= set(report["entries"]), kernels - set(report["entries"])
    assert all(report["entries"][k]["compared"] > 0 for k in kernels)


@pytest.mark.parametrize("fault", FAULTS + LLAMA_FAULTS)
def test_check_names_a_planted_fault_in_one_call(fault):
    backend = instrument.create("check", faulty_cpu(fault))
    run_every_entry(backend)
    report = backend.report()
    assert report["first"]["entry"] == fault
    assert {name for name, e in report["entries"].items() if e["mismatches"]} == {fault}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name, frozen", [("matmul_backward", {"dweight"}),
                                          ("matmul_backward", {"dweight", "dbias"}),
                                          ("rmsnorm_backward", {"dweight"})])
def test_a_frozen_weight_leaves_the_rest_as_the_full_call(precision, name, frozen):
    """A weight gradient passed as NULL (a frozen weight: LoRA's base) is not computed, and
    what the call does write, dinp (and dbias), is the full call's bit for bit."""
    backend = get_backend("cpu", precision)
    entry, values = BY_NAME[name], numbers(name, SMALL)
    rng = np.random.default_rng(0)
    host = {a.name: host_data(a, values, rng) for a in entry.args if a.pointer}
    narrow = {"bf16": to_bf16, "fp16": to_fp16}.get(precision)

    def run(skipped):
        """The call without the skipped pointers: the bytes of each output it was given."""
        buffers = {}
        for a in entry.args:
            if a.pointer and a.name not in skipped:
                data = narrow(host[a.name]) if a.floatx and narrow else host[a.name]
                buffers[a.name] = backend.alloc(data.nbytes)
                buffers[a.name].load(data)
        backend.call(name, *[buffers.get(a.name) if a.pointer else values[a.name]
                             for a in entry.args])
        return {a.name: buffers[a.name].to_numpy(np.uint8) for a in entry.outputs
                if a.name in buffers}

    full, without = run(set()), run(frozen)
    assert set(without) == {a.name for a in entry.outputs} - frozen
    for output, got in without.items():
        np.testing.assert_array_equal(got, full[output], err_msg=output)
    # the full call did compute the weight gradient the other skipped
    assert not np.array_equal(full["dweight"].view(np.float32), host["dweight"])


def test_call_refuses_a_short_buffer_and_a_missing_pointer():
    backend = get_backend("cpu")
    B, T, C, OC = 2, 3, 4, 5
    short, inp, weight = backend.alloc(4 * B * T * OC - 4), backend.alloc(4 * B * T * C), backend.alloc(4 * OC * C)
    with pytest.raises(ValueError, match="matmul_forward: argument 'out' has 116 bytes, the call touches 120"):
        backend.call("matmul_forward", short, inp, weight, None, B, T, C, OC)
    with pytest.raises(ValueError, match="argument 'inp' cannot be None"):
        backend.call("matmul_forward", backend.alloc(4 * B * T * OC), None, weight, None, B, T, C, OC)
    with pytest.raises(TypeError, match="takes 8 arguments"):
        backend.call("matmul_forward", inp, B, T)


# --- the model on check:, guard: and profile: --------------------------------------------------

def fixture_step(backend):
    config, params = read_checkpoint(FIXTURE_MODEL, GPT2Config)
    state = read_debug_state(FIXTURE_STATE, config)
    model = GPT2(config, backend=backend)
    model.params = params
    losses = []
    for t in range(1, 3):
        losses.append(model.forward(state.x, state.y))
        model.zero_grad()
        model.backward()
        norm = model.grad_norm()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.01, t, grad_scale=0.5, decay_2d_only=True)
    return model, losses, norm


def test_check_cpu_model_matches_cpu_and_reports_nothing():
    cpu_model, cpu_losses, cpu_norm = fixture_step("cpu")
    model, losses, norm = fixture_step("check:cpu")
    assert losses == cpu_losses and norm == cpu_norm
    np.testing.assert_array_equal(model.params, cpu_model.params)
    np.testing.assert_array_equal(model.m, cpu_model.m)
    np.testing.assert_array_equal(model.logits, cpu_model.logits)
    assert model.backend.report()["mismatches"] == 0


@pytest.mark.parametrize("fault, layer", [("gelu_forward", 0), ("layernorm_backward", -1)])
def test_check_names_the_broken_kernel_its_step_and_layer(fault, layer):
    model, _, _ = fixture_step(instrument.create("check", faulty_cpu(fault)))
    first = model.backend.report()["first"]
    assert (first["entry"], first["step"], first["layer"]) == (fault, 0, layer)
    assert first["rel_error"] > 0.1
    assert fault in model.backend.summary()


def test_check_carries_on_from_the_oracle():
    """A broken gelu_forward is replaced by the oracle's output, so the loss stays right."""
    _, cpu_losses, _ = fixture_step("cpu")
    _, losses, _ = fixture_step(instrument.create("check", faulty_cpu("gelu_forward")))
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-6)


def test_device_memory_views_are_read_only_copies():
    model, _, _ = fixture_step("check:cpu")
    with pytest.raises(ValueError, match="read-only"):
        model.params[0] = 1.0
    with pytest.raises(ValueError, match="must have shape"):
        model.params = np.zeros(3, np.float32)
    params = model.params.copy()
    params[0] = 42.0
    model.params = params
    assert model.params[0] == 42.0


def test_guard_cpu_runs_a_whole_step():
    """guard:cpu leaves the backend's memory unreadable outside its calls: the model's steps
    run to the end, so the model touches no buffer outside the table."""
    _, cpu_losses, cpu_norm = fixture_step("cpu")
    _, losses, norm = fixture_step("guard:cpu")
    assert losses == cpu_losses and norm == cpu_norm


def test_guard_cpu_kills_a_read_outside_the_table():
    """The planted fault: a direct read of a guarded buffer dies with SIGSEGV."""
    code = ("import ctypes; from accel.backend import get_backend\n"
            "b = get_backend('guard:cpu').alloc(4096)\n"
            "print(ctypes.c_float.from_address(b.address).value)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True)
    assert done.returncode == -11, done


def test_profile_counts_and_times_every_call():
    model, _, _ = fixture_step("profile:cpu")
    entries = model.backend.report()["entries"]
    L = model.config.num_layers
    assert entries["matmul_forward"]["calls"] == 2 * (4 * L + 1)
    assert entries["adamw_update"]["calls"] == 2 * len(model._decay_spans(True))
    assert all(e["seconds"] > 0 for e in entries.values())


def test_decay_spans_cover_the_buffer_in_runs():
    model = GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16))
    spans = model._decay_spans(True)
    assert spans[0] == (0, model.param_layout.size - sum(s for _, s, _ in spans[1:]), True)
    assert sum(size for _, size, _ in spans) == model.num_parameters
    decayed = {name for name, start in zip(model.param_layout.names, model.param_layout.offsets)
               if any(s <= start < s + n and d for s, n, d in spans)}
    assert decayed == GPT2.MATRICES
    assert model._decay_spans(False) == [(0, model.num_parameters, True)]


@pytest.mark.parametrize("backend", ["check:cpu", "guard:cpu"])
def test_parity_check_passes_on_wrapped_backends(backend):
    done = subprocess.run([sys.executable, "test_gpt2.py", "--backend", backend], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overall okay: 1" in done.stdout
