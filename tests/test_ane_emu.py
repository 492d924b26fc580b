"""
The ane-emu backend (accel/ane/table.pyx): every entry through check:ane-emu at fp16
tolerances, loss scaling against fp16 underflow, programs built once per shape, a failure as one
line, and train.py on a tiny Llama tracking the CPU run's losses.
"""
import json
import re

import numpy as np
import pytest

import needs

needs.emulator("ane-emu")

from accel.ane import table  # noqa: E402
from accel.backend import BackendError, get_backend  # noqa: E402
from entries import D12_WIDTHS, run_every_entry  # noqa: E402
from llmc.formats.llmc import write_shard  # noqa: E402
from test_train import run_train, step_losses  # noqa: E402
from train_llama2 import LlamaConfig  # noqa: E402

ANE_ENTRIES = sorted(table.TOLERANCES)


def test_every_entry_passes_check_ane_emu():
    backend = get_backend("check:ane-emu")
    run_every_entry(backend)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert all(report["entries"][name]["compared"] > 0 for name in ANE_ENTRIES)
    # the fp16 entries really are the emulator's: they miss the CPU's fp32 answers by more than
    # the default tolerance of 1e-5, and stay within their own
    worst = {name: report["entries"][name]["worst_error"] for name in ANE_ENTRIES}
    assert all(1e-5 < worst[name] <= table.TOLERANCES[name] for name in ANE_ENTRIES), worst


def test_loss_scaling_keeps_a_small_gradient_from_underflowing():
    """A gradient of 1e-9 (below fp16's smallest subnormal, 6e-8) through matmul's dinp: lost
    without scaling, within fp16 accuracy with the dynamic power-of-two scale."""
    rng = np.random.default_rng(0)
    BT, C, OC = 5, 6, 7
    dout = (rng.standard_normal((BT, OC)) * 1e-9).astype(np.float32)
    weight = rng.standard_normal((OC, C)).astype(np.float32) * 0.3
    want = dout.astype(np.float64) @ weight
    for loss_scale in (False, True):
        emulator = table.Emulator(loss_scale=loss_scale)
        dinp = np.zeros((BT, C), np.float32)
        emulator.matmul_dinp(dinp, dout, weight, BT, C, OC)
        if loss_scale:
            scale = emulator.scale_of(dout)
            assert np.log2(scale) % 1 == 0 and 128 < np.abs(dout).max() * scale <= 256
            np.testing.assert_allclose(dinp, want, atol=2e-3 * np.abs(want).max())
        else:
            assert not dinp.any()


def test_programs_are_built_once_per_shape_and_a_failure_is_one_line():
    from train_llama2 import Llama2
    config = LlamaConfig.from_name("d1", vocab_size=40)
    backend = get_backend("ane-emu")
    model = Llama2.random(config, seed=0, backend=backend)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 40, (2, 5)), rng.integers(0, 40, (2, 5))
    emulator = backend.emulator
    builds = []
    for step in range(2):
        model.forward(x, y)
        model.zero_grad()
        model.backward()
        model.update(1e-3, 0.9, 0.999, 1e-8, 0.0, step + 1)
        builds.append(emulator.builds)
    # the dynamic plan's 8 kernels (accel/ane/plan.py), in the first step only: the fused
    # blocks, wo's matmul and attention, forward and dx; the classifier runs on the CPU
    assert model.fused and builds == [8, 8]
    assert sorted(piece for piece, _ in emulator.kernels) == sorted(
        ["qkv_forward", "attention_forward", "linear_forward", "ffn_forward", "ffn_backward",
         "linear_backward", "attention_backward", "qkv_backward"])

    def broken(*args, **kwargs):
        raise RuntimeError("the interpreter fell over")
    emulator.run = broken
    with pytest.raises(BackendError, match=r"ane-emu \w+_forward: RuntimeError: the "
                                           "interpreter fell over") as e:
        model.forward(x, y)
    assert "\n" not in str(e.value)


def test_train_py_on_ane_emu_tracks_the_cpu_losses(tmp_path):
    """5 steps of a tiny GQA Llama (d2: 2 query heads, 1 kv head) on data it can learn (a
    repeating sequence): the losses match the CPU run's to 1e-3 relative.  Why that bound: the
    logits come out of fp16 matmuls (relative rounding 2^-11 = 4.9e-4 of each term, a few
    terms' worth in the sum), and the loss, a log-sum-exp of them, moves by less than that
    relative error times the logits' spread; updates from the fp16 dx stay as close."""
    tokens = np.tile(np.arange(37) * 7 % 300, 200)
    write_shard(tmp_path / "train_000.bin", tokens)
    common = ["--model", "d2", "--family", "llama", "--vocab-size", 300, "-b", 2, "-t", 16,
              "-i", tmp_path / "train_*.bin", "-j", tmp_path / "train_*.bin", "-m", 0, "-s", 0,
              "-x", 5, "-l", 3e-3]
    cpu = step_losses(run_train(*common, "--backend", "cpu", "-o", tmp_path / "cpu"))
    # under check: every call of the whole run is also compared with the CPU's, at its tolerance
    stdout = run_train(*common, "--backend", "check:ane-emu", "-o", tmp_path / "ane", "--json-log")
    assert re.search(r"^check:ane-emu: \d+ outputs compared, all within tolerance$", stdout, re.M)
    # the efficiency report's compile share: the programs are built in the first step only
    lines = [json.loads(line) for line in open(tmp_path / "ane" / "log.jsonl")]
    compile_ms = [line["compile_ms"] for line in lines if line["type"] == "train"]
    assert len(compile_ms) == 5 and compile_ms[0] > 0 and compile_ms[1:] == [0.0] * 4
    ane = step_losses(stdout)
    assert sorted(cpu) == sorted(ane) == [1, 2, 3, 4, 5]
    cpu, ane = (np.array([float(s[k]) for k in sorted(s)]) for s in (cpu, ane))
    assert cpu[-1] < cpu[0] - 0.1                   # it learns, so the steps matter
    np.testing.assert_allclose(ane, cpu, rtol=1e-3)


def test_check_names_a_planted_fault_in_an_ane_program(monkeypatch):
    """The planted fault: a causal mask that also hides the diagonal - a program the Builder
    accepts and the interpreter runs - is named by check:ane-emu, and nothing else is."""
    from accel.ane import mil
    monkeypatch.setattr(mil, "causal_mask", lambda S, G: np.where(
        np.arange(S)[None, :] >= (np.arange(G * S) % S)[:, None], mil.MASK_VALUE, 0).astype(
        np.float16))
    backend = get_backend("check:ane-emu")
    run_every_entry(backend, groups=("llama",))
    report = backend.report()
    assert report["first"]["entry"] == "attention_gqa_forward"
    assert {name for name, e in report["entries"].items() if e["mismatches"]} == {
        "attention_gqa_forward", "attention_gqa_backward"}


def test_the_fused_entries_at_d12_widths_and_a_planted_fault_in_one(monkeypatch):
    """The fused blocks (qkv_*, ffn_*: one program each) pass check:ane-emu at d12's widths
    against the CPU's unfused kernels in turn; the planted fault - the FFN's dx program
    dropping dh3, so dx misses its w3 term - is named there, in ffn_backward alone."""
    from accel.ane import mil
    fused = ("qkv_forward", "qkv_backward", "ffn_forward", "ffn_backward")
    backend = get_backend("check:ane-emu")
    run_every_entry(backend, dims=D12_WIDTHS, groups=("fused",))
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert all(report["entries"][name]["compared"] > 0 for name in fused)

    silu_backward = mil.silu_backward

    def dropped(h1, h3, dgated, name):
        dh1, dh3 = silu_backward(h1, h3, dgated, name)
        return dh1, mil.mb.mul(x=dh3, y=mil.FP16(0.0), name=name + "_dropped")
    monkeypatch.setattr(mil, "silu_backward", dropped)
    backend = get_backend("check:ane-emu")
    run_every_entry(backend, groups=("fused",))
    report = backend.report()
    assert report["first"]["entry"] == "ffn_backward"
    assert {name for name, e in report["entries"].items() if e["mismatches"]} == {"ffn_backward"}


def test_fused_and_unfused_steps_give_the_same_losses_within_fp16():
    """d2 (GQA) trained 4 steps on ane-emu with the fused blocks (one program per block) and
    without them (the table's pieces: a program per matrix, SwiGLU apart): the same losses to
    fp16's accuracy (1e-3 relative, as the CPU's in test_train_py_on_ane_emu_tracks...), and
    the unfused run compiles more programs."""
    from train_llama2 import Llama2
    config = LlamaConfig.from_name("d2", vocab_size=300)
    losses, builds = {}, {}
    for fused in (True, False):
        ane = backend = get_backend("ane-emu")
        if not fused:
            backend = ane._with_groups(tuple(g for g in ane.groups if g != "fused"))
        model = Llama2.random(config, seed=0, backend=backend)
        assert model.fused == fused
        rng = np.random.default_rng(0)
        losses[fused] = []
        for step in range(4):
            x, y = rng.integers(0, 300, (2, 2, 16))
            losses[fused].append(model.forward(x, y))
            model.zero_grad()
            model.backward()
            model.update(3e-3, 0.9, 0.95, 1e-8, 0.0, step + 1)
        builds[fused] = ane.emulator.builds
    assert losses[True] != losses[False]   # different programs, different fp16 roundings
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-3)
    assert builds[True] == 8 < builds[False]
    # the CPU's fused entries are the pieces in turn: its models run the pieces themselves
    assert not Llama2(config).fused and not Llama2(config, backend="check:cpu").fused


def test_dynamic_programs_take_their_weights_as_inputs():
    """Dynamic: no weight is a constant (one build serves every update); static: all are."""
    from accel.ane import mil
    d = mil.Dims(C=8, NH=2, NKV=1, hs=4, H=6, S=3)
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal(s) for n, s in dict(wq=(8, 8), wk=(4, 8), wv=(4, 8), wo=(8, 8),
                                                  w1=(6, 8), w3=(6, 8), w2=(8, 6)).items()}

    def const_elements(program):
        return sum(np.size(op.outputs[0].val) for op in program.functions["main"].operations
                   if op.op_type == "const" and op.outputs[0].dtype == mil.types.fp16)
    dynamic, static = mil.programs(d, "dynamic"), mil.programs(d, "static", w)
    for piece in ("qkv_forward", "wo_forward", "ffn_forward", "ffn_backward", "wo_backward",
                  "qkv_backward"):
        assert const_elements(dynamic[piece]) < 10, piece            # fp16 scalars only
        assert const_elements(static[piece]) >= min(np.size(v) for v in w.values()), piece


def test_growing_prompts_compile_a_few_shapes_and_the_budget_is_one_line():
    """Sampling runs forward on prompts of 1, 2, ... tokens: the programs are built for lengths
    rounded up to powers of two (at least 32), so 40 lengths make two sets of programs, and
    each result is what the CPU gives at the real length.  On a runtime whose compile budget
    runs out (the ANE's ~119 per process) the entry fails in one line saying so."""
    from accel.ane import runtime
    from train_llama2 import Llama2
    config = LlamaConfig.from_name("d1", vocab_size=40, max_seq_len=48)
    backend = get_backend("ane-emu")
    model = Llama2.random(config, seed=0, backend=backend)
    reference = Llama2.random(config, seed=0)
    tokens = np.random.default_rng(1).integers(0, 40, (1, 40))
    emulator = backend.emulator
    for t in range(1, 41):
        model.forward(tokens[:, :t])
        reference.forward(tokens[:, :t])
        np.testing.assert_allclose(model.probs, reference.probs, atol=2e-3)
        if t == 1:
            first = set(emulator.kernels)
    # the forward's programs (the fused blocks, wo's matmul, attention): once for 32 rows, once
    # for 64 (the classifier runs on the CPU)
    assert len(first) == 4 and len(emulator.kernels) == 2 * len(first)
    assert [table.padded(n) for n in (1, 32, 33, 64, 65, 1000)] == [32, 32, 64, 64, 128, 1024]

    class Budgeted(runtime.InterpreterRuntime):
        def __init__(self):
            super().__init__(runtime.CompileBudget(limit=4, headroom=1))
            self.enforce_budget = True
    small = table.create(runtime=Budgeted())
    model = Llama2.random(config, seed=0, backend=small)
    with pytest.raises(BackendError, match=r"compile 4 would pass the budget of .*restart the "
                                           r"process") as e:
        model.forward(tokens[:, :8])
    assert "\n" not in str(e.value)


def test_ane_needs_macos_here():
    with pytest.raises(BackendError, match="the Neural Engine needs macOS"):
        get_backend("ane")
