"""The backend interface: the registry, the table's validation, check:/profile:/guard:, and the
model-generic core on a backend whose memory is not the host's (check:cpu)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from accel import cpu, instrument
from accel.backend import ENTRY_GROUPS, Backend, BackendError, backend_names, get_backend
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
    backend = get_backend("cpu")
    for entry in ENTRY_GROUPS["core"] + ENTRY_GROUPS["gpt2"] + ENTRY_GROUPS["flash"]:
        with pytest.raises(BackendError, match=f"its table has no entry '{entry}'"):
            backend._without_entry(entry)


def test_model_refuses_a_backend_without_its_family():
    with pytest.raises(BackendError, match="has no gpt2 kernels"):
        GPT2(GPT2Config.from_depth(1, max_seq_len=8, vocab_size=16),
             backend=Backend("memory-only", True, ()))


# --- every entry through check:, at odd shapes -----------------------------------------------

def run_every_entry(backend, seed=0):
    """Call each kernel entry of the table once on random data of odd sizes."""
    rng = np.random.default_rng(seed)
    B, T, C, NH, V, Vp, maxT = 3, 7, 20, 4, 37, 40, 9
    OC = 3 * C

    def buf(*shape, scale=1.0):
        b = backend.alloc(4 * int(np.prod(shape)))
        b.load((rng.standard_normal(shape) * scale).astype(np.float32))
        return b

    def tokens(high):
        b = backend.alloc(4 * B * T)
        b.load(rng.integers(0, high, (B, T)).astype(np.int32))
        return b

    inp, tgt = tokens(V), tokens(V)
    out = buf(B, T, C)
    backend.call("encoder_forward", out, inp, buf(Vp, C), buf(maxT, C), B, T, C)
    backend.call("encoder_backward", buf(Vp, C), buf(maxT, C), buf(B, T, C), inp, B, T, C, Vp)
    backend.call("layernorm_forward", buf(B, T, C), buf(B, T), buf(B, T), buf(B, T, C), buf(C),
                 buf(C), B, T, C)
    backend.call("layernorm_backward", buf(B, T, C), buf(C), buf(C), buf(B, T, C), buf(B, T, C),
                 buf(C), buf(B, T), buf(B, T, scale=0.1), B, T, C)
    backend.call("matmul_forward", buf(B, T, OC), buf(B, T, C), buf(OC, C), buf(OC), B, T, C, OC)
    backend.call("matmul_forward", buf(B, T, OC), buf(B, T, C), buf(OC, C), None, B, T, C, OC)
    backend.call("matmul_backward", buf(B, T, C), buf(OC, C), buf(OC), buf(B, T, OC),
                 buf(B, T, C), buf(OC, C), B, T, C, OC)
    att = backend.alloc(4 * B * NH * T * T)
    qkv = buf(B, T, 3 * C)
    backend.call("attention_forward", buf(B, T, C), backend.alloc(4 * B * NH * T * T), att, qkv,
                 B, T, C, NH)
    backend.call("attention_backward", buf(B, T, 3 * C), backend.alloc(4 * B * NH * T * T),
                 backend.alloc(4 * B * NH * T * T), buf(B, T, C), qkv, att, B, T, C, NH)
    if backend.supports("flash"):
        atty, lse = backend.alloc(4 * B * T * C), backend.alloc(4 * B * NH * T)
        backend.call("flash_attention_forward", atty, lse, qkv, B, T, C, NH)
        backend.call("flash_attention_backward", buf(B, T, 3 * C), buf(B, T, C), qkv, atty, lse,
                     B, T, C, NH)
    N = B * T * 4 * C
    backend.call("gelu_forward", buf(N), buf(N), N)
    backend.call("gelu_backward", buf(N), buf(N), buf(N), N)
    backend.call("residual_forward", buf(N), buf(N), buf(N), N)
    backend.call("residual_backward", buf(N), buf(N), buf(N), N)
    logits, probs = buf(B, T, Vp), buf(B, T, Vp)
    backend.call("softmax_forward", probs, logits, B, T, V, Vp)
    backend.call("crossentropy_forward", buf(B, T), probs, tgt, B, T, Vp)
    backend.call("crossentropy_softmax_backward", buf(B, T, Vp), buf(B, T), probs, tgt, B, T, V, Vp)
    n = 101
    backend.call("fill", buf(n), 0.25, n)
    assert np.isfinite(backend.call("mean", buf(n), n))
    assert backend.call("global_norm_squared", buf(n), n) > 0
    v = backend.alloc(4 * n)
    v.load(rng.random(n).astype(np.float32))   # AdamW's second moments are never negative
    backend.call("adamw_update", buf(n), buf(n), v, buf(n), n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, 3)


def test_every_entry_passes_check_cpu():
    backend = get_backend("check:cpu")
    run_every_entry(backend)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    kernels = (set(ENTRY_GROUPS["gpt2"]) | set(ENTRY_GROUPS["flash"])
               | {"fill", "mean", "adamw_update", "global_norm_squared"})
    assert kernels <= set(report["entries"]), kernels - set(report["entries"])
    assert all(report["entries"][k]["compared"] > 0 for k in kernels)


@pytest.mark.parametrize("fault", cpu.FAULTS)
def test_check_names_a_planted_fault_in_one_call(fault):
    backend = instrument.create("check", cpu.create(fault=fault))
    run_every_entry(backend)
    report = backend.report()
    assert report["first"]["entry"] == fault
    assert {name for name, e in report["entries"].items() if e["mismatches"]} == {fault}


# --- the model on check:, guard: and profile: --------------------------------------------------

def fixture_step(backend):
    config, params = read_checkpoint(FIXTURE_MODEL)
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
    model, _, _ = fixture_step(instrument.create("check", cpu.create(fault=fault)))
    first = model.backend.report()["first"]
    assert (first["entry"], first["step"], first["layer"]) == (fault, 0, layer)
    assert first["rel_error"] > 0.1
    assert fault in model.backend.summary()


def test_check_carries_on_from_the_oracle():
    """A broken gelu_forward is replaced by the oracle's output, so the loss stays right."""
    _, cpu_losses, _ = fixture_step("cpu")
    _, losses, _ = fixture_step(instrument.create("check", cpu.create(fault="gelu_forward")))
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
