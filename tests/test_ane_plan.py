"""The ANE pipeline planner, the runtime wrapper (mock; Core ML's conversion), and the lab's
state file and exec() restart inside a step (accel/ane/plan.py, runtime.py, dev/ane/restart.py)
- all on Linux, no Mac."""
import os
import subprocess
import sys

import numpy as np
import pytest

import needs
from accel.ane.plan import PlanError, format_pipeline_plan, make_plan, memory
from accel.ane.runtime import (BudgetExceeded, CompileBudget, CompileLimitError, MockRuntime,
                               NumpyProgram)
from dev.ane import restart
from llmc.dry_run import memory_plan
from llmc.formats import FormatError
from llmc.recompute import RecomputePlan
from train_llama2 import PRESETS, Llama2, LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama(name, **overrides):
    """A Llama config by preset name or dN: the planner takes its caller's config."""
    return LlamaConfig.from_name(name, **overrides)


def plan_of(config, pipeline="static", budget=None, policy="all", **options):
    """make_plan under the recompute plan of policy, as train.py's dry run gives it."""
    return make_plan(config, pipeline, budget, RecomputePlan(policy, config.n_layers), **options)


def identity_program(name="k"):
    return NumpyProgram(name, {"x": (2, 3)}, {"y": (2, 3)}, lambda x: {"y": x + 1})


# ----------------------------------------------------------------------------
# the mock runtime and the budget

def test_mock_fails_past_its_limit_like_the_compiler():
    runtime = MockRuntime(CompileBudget(12, 2), enforce_budget=False)
    for _ in range(12):
        runtime.compile(identity_program())
    with pytest.raises(CompileLimitError, match="compile 13 of a process that allows 12"):
        runtime.compile(identity_program())


def test_runtime_refuses_at_the_budgets_usable_part():
    runtime = MockRuntime(CompileBudget(12, 2))
    kernel = None
    for _ in range(10):
        kernel = runtime.compile(identity_program())
    assert runtime.needs_restart(1) and not runtime.needs_restart(0)
    with pytest.raises(BudgetExceeded, match="restart the process"):
        runtime.compile(identity_program())
    out = runtime.run(kernel, {"x": np.zeros((2, 3), np.float32)})
    assert np.array_equal(out["y"], np.ones((2, 3)))


def test_static_schedule_avoids_the_compiler_failure():
    """Running every phase of 3 steps in one process fails on the mock compiler; the plan's
    restarts keep each process under its budget."""
    budget = CompileBudget(30, 4)
    plan = plan_of(llama("d4"), "static", budget, "all", T=16, steps=3)
    naive = MockRuntime(budget, enforce_budget=False)
    with pytest.raises(CompileLimitError):
        for _ in range(3):
            for phase in plan.phases:
                for _ in phase.kernels:
                    naive.compile(identity_program())
    per_process = {}
    for _, _, number, n in plan.events:
        per_process[number] = per_process.get(number, 0) + n
    assert plan.restarts and max(per_process.values()) <= budget.usable


def test_dynamic_pipeline_compiles_once():
    plan = plan_of(llama("stories110M"), "dynamic", None, "sqrt", T=256, steps=5)
    assert plan.first_step_compiles == 8 and plan.compiles_per_step == 0
    assert plan.restarts == [] and plan.steps_per_process is None


def test_static_stories110m_matches_the_anchor():
    """72 weighted kernels per step (the anchor's 60 + 12 split differently) + 2 attention:
    one step per process of 109 compiles, 1 restart per step."""
    plan = plan_of(llama("stories110M"), "static", None, "all", T=256)
    assert plan.first_step_compiles == 74 and plan.steps_per_process == 1


# ----------------------------------------------------------------------------
# the PR review's bugs

@pytest.mark.parametrize("L, n, expected", [(6, 3, [2, 5]), (7, 3, [2, 5, 6]), (4, 1, [0, 1, 2, 3]),
                                            (4, 4, [3]), (1, 1, [0])])
def test_checkpointed_layers_when_the_last_layer_is_a_boundary(L, n, expected):
    plan = plan_of(llama(f"d{L}"), "static", None, f"every-{n}", T=16, steps=1)
    assert plan.checkpointed_layers() == expected
    # the layer outputs the recompute layout keeps: the segments' chain + one per segment
    assert plan.rplan.outputs == plan.rplan.slots - 1 + len(expected)


def test_planner_and_runtime_share_the_headroom(tmp_path):
    """The executor refuses a runtime whose budget is not the plan's; with the plan's own it
    restarts exactly where the plan says (the demo prints where each process starts)."""
    state, out = tmp_path / "s.bin", tmp_path / "w.npy"
    args = [sys.executable, "-m", "dev.ane.restart", "--state", str(state), "--out", str(out),
            "--steps", "2", "--limit", "20", "--headroom", "2"]
    bad = subprocess.run(args + ["--runtime-headroom", "0"], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "is not the plan's" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_budget_smaller_than_a_phase_is_rejected():
    with pytest.raises(PlanError, match="smaller than the backward of layer 10 needs: 38"):
        plan_of(llama("stories110M"), "static", 40, "none", T=64)
    with pytest.raises(PlanError, match="unknown pipeline"):
        plan_of(llama("stories15M"), "fused")
    with pytest.raises(PlanError, match="a recompute plan of 3 layers for a model of 6"):
        make_plan(llama("stories15M"), "static", None, RecomputePlan("all", 3))


# ----------------------------------------------------------------------------
# the state file and the exec() restart

def test_state_round_trip_and_truncation(tmp_path):
    path = tmp_path / "state.bin"
    arrays = dict(W=np.arange(10, dtype=np.float32), m=np.ones((3, 5), np.float32),
                  empty=np.zeros(0, np.float32))
    restart.write_state(path, dict(key="k", step=7, rng={"a": 1}), arrays)
    meta, back = restart.read_state(path, key="k")
    assert meta["step"] == 7 and meta["rng"] == {"a": 1}
    for name, a in arrays.items():
        assert np.array_equal(back[name], a) and back[name].dtype == a.dtype
    raw = path.read_bytes()
    path.write_bytes(raw[:-4])
    with pytest.raises(FormatError, match="truncated or damaged ANE state") as e:
        restart.read_state(path)
    assert "\n" not in str(e.value)
    path.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    with pytest.raises(FormatError, match="CRC-32"):
        restart.read_state(path)
    path.write_bytes(raw)
    with pytest.raises(FormatError, match="ANE state of another run"):
        restart.read_state(path, key="other")
    path.write_bytes(b"GPT2" + raw[4:])
    with pytest.raises(FormatError, match="not an ANE state file"):
        restart.read_state(path)


def test_exec_restart_resumes_to_the_same_weights(tmp_path):
    """A fake workload restarts itself (exec) at every planned point and ends with the same
    bits as a run that never restarts; a state file from elsewhere is refused."""
    def run(limit, out, steps=3, policy="every-2"):
        state = tmp_path / "state.bin"
        args = [sys.executable, "-m", "dev.ane.restart", "--state", str(state), "--out",
                str(out), "--steps", str(steps), "--limit", str(limit), "--headroom", "2",
                "--policy", policy]
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert not state.exists()
        return [line for line in done.stdout.splitlines() if "starts at" in line]

    starts = run(20, tmp_path / "restarted.npy")
    plan = plan_of(restart.FakeWorkload(3).config, "static", CompileBudget(20, 2), "every-2",
                     steps=3)
    assert [f"step {s} phase {i}" for s, i in plan.restarts] == [
        line.split("starts at ")[1] for line in starts[1:]]
    assert len(starts) >= 3   # restarts inside steps and between them
    assert run(1000, tmp_path / "straight.npy") == ["process 1: starts at step 0 phase 0"]
    assert np.array_equal(np.load(tmp_path / "restarted.npy"), np.load(tmp_path / "straight.npy"))


# ----------------------------------------------------------------------------
# the dry run: every preset, both pipelines, any policy, well under a second each

@pytest.mark.parametrize("model", list(PRESETS) + ["d2"])
def test_dry_run_every_preset(model, capsys):
    import train
    for pipeline in ("static", "dynamic"):
        for policy in ("all", "every-3", "sqrt", "boundary", "none"):
            argv = ["--model", model, "--family", "llama", "--backend", "ane", "--dry-run",
                    "--ane-pipeline", pipeline, "--recompute", policy]
            try:
                train.main(argv)
            except train.TrainError as e:   # none recomputes too much for a static 7B
                assert (pipeline, policy) == ("static", "none") and "smaller than" in str(e)
                continue
            text = capsys.readouterr().out
            assert f"{pipeline} pipeline, recompute {policy}" in text
            assert "schedule of a step" in text and "state file of a restart" in text


def test_train_py_gets_the_ane_flags_check_and_plan_from_its_hooks(capsys):
    """train.py names no backend (accel/hooks.py): --help lists the ANE's flags, --backend ane
    refuses a bad --ane-budget in one line when the arguments are parsed (another backend
    ignores the flag), a wrapped name has no hooks, and the ANE's dry run refuses GPT-2."""
    import train
    from accel.hooks import NO_HOOKS, backend_hooks
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--ane-pipeline {static,dynamic}" in text and "--ane-budget INT" in text
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--backend", "ane", "--ane-budget", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "train.py: error: argument --ane-budget: compile budget: need limit >= 1 and 0 <= "
        "headroom < limit, got limit 0, headroom 0 (see --help)"]
    assert train.parse_args(["--backend", "ane", "--ane-budget", "10"]).ane_budget == \
        CompileBudget(10, 5)
    assert train.parse_args(["--backend", "cpu", "--ane-budget", "0"]).ane_budget == 0
    assert backend_hooks("check:ane") is NO_HOOKS and backend_hooks("ane") is not NO_HOOKS
    with pytest.raises(train.TrainError, match="--backend ane trains Llama models"):
        train.main(["-e", "d2", "--backend", "ane", "--dry-run"])


def test_private_path_shape_check_in_the_plan():
    plan = plan_of(llama("stories15M"), "static", None, "all", T=256)
    text = format_pipeline_plan(plan, memory_plan(Llama2, plan.config, 1, 256), "stories15M")
    assert "hs (head size)=48 -> 64" in text


# ----------------------------------------------------------------------------
# with coremltools: the mock runs a Builder program; Core ML converts and saves it

def linear_program(C=32, OC=16, S=8, inner_ok=True):
    ct = needs.package("coremltools")
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types
    W = np.random.default_rng(0).standard_normal((OC, C, 1, 1)).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, C, 1, S), dtype=types.fp16)],
                opset_version=ct.target.iOS17)
    def program(x):
        return mb.silu(x=mb.conv(x=x, weight=W, name="proj"), name="out")
    return program, W


def test_mock_evaluates_a_builder_program_and_checks_inner_dims():
    from accel.ane.runtime import misaligned_inner_dims
    program, W = linear_program()
    runtime = MockRuntime()
    kernel = runtime.compile(program)
    x = np.random.default_rng(1).standard_normal((1, 32, 1, 8)).astype(np.float32)
    y = runtime.run(kernel, {"x": x})["out"]
    ref = np.einsum("oc,bchw->bohw", W[:, :, 0, 0].astype(np.float32), x)
    np.testing.assert_allclose(y, ref / (1 + np.exp(-ref)), rtol=1e-5, atol=1e-5)
    assert misaligned_inner_dims(program) == []
    assert misaligned_inner_dims(linear_program(C=48)[0]) == [("proj", "conv", 48)]


def test_coreml_converts_and_saves_an_mlpackage(tmp_path):
    from accel.ane.runtime import CoreMLRuntime, RuntimeUnavailable
    program, _ = linear_program()
    runtime = CoreMLRuntime(CompileBudget(3, 1))
    kernel = runtime.compile(program)
    path = runtime.save(kernel, tmp_path / "linear.mlpackage")
    assert (path / "Manifest.json").exists()
    spec = kernel.handle.get_spec()
    assert spec.WhichOneof("Type") == "mlProgram"
    assert [i.name for i in spec.description.input] == ["x"]
    assert runtime.compile_count == 1
    if sys.platform != "darwin":
        with pytest.raises(RuntimeUnavailable, match="needs macOS"):
            runtime.run(kernel, {"x": np.zeros((1, 32, 1, 8), np.float32)})


class StubANE:
    """The private library's interface over the mock evaluator; zeros=True returns zeros, as the
    ANE does for some shapes, silently."""

    def __init__(self, zeros):
        self.zeros, self.mock = zeros, MockRuntime()

    def compile(self, text, blob, inputs, outputs):
        return text

    def run(self, handle, inputs, outputs):
        kernel = self.mock.compile(handle)
        out = self.mock.run(kernel, inputs)
        return {k: np.zeros_like(v) for k, v in out.items()} if self.zeros else out


def test_private_runtime_checks_shapes_and_outputs_before_trusting():
    from accel.ane.runtime import PrivateANERuntime, RuntimeUnavailable
    if sys.platform != "darwin":
        with pytest.raises(RuntimeUnavailable, match="needs macOS"):
            PrivateANERuntime()
    program, _ = linear_program()
    x = {"x": np.random.default_rng(2).standard_normal((1, 32, 1, 8)).astype(np.float32)}
    bad = PrivateANERuntime(check_against=MockRuntime(), lib=StubANE(zeros=True))
    with pytest.raises(ValueError, match="conv proj sums over 48, not a multiple of 32"):
        bad.compile(linear_program(C=48)[0], weights=("mil text", b""))
    kernel = bad.compile(program, weights=(program, b""))   # the stub "compiles" the program
    with pytest.raises(RuntimeError, match="differs from the reference's"):
        bad.run(kernel, x)
    good = PrivateANERuntime(check_against=MockRuntime(), lib=StubANE(zeros=False))
    kernel = good.compile(program, weights=(program, b""))
    good.run(kernel, x)
    assert good.trusted == {kernel.index}


def test_steps_per_process_of_a_small_static_model():
    """d2 static: 14 compiles in the first step (12 weighted + 2 attention), 12 in each next:
    8 steps in 109 compiles; micro-batches (gradient accumulation) reuse the kernels."""
    plan = plan_of(llama("d2"), "static", None, "all", T=16)
    assert (plan.first_step_compiles, plan.compiles_per_step) == (14, 12)
    assert plan.steps_per_process == 8
    accumulated = plan_of(llama("stories110M"), "static", None, "all", T=256, accum=10)
    assert accumulated.compiles_per_step == 74 and accumulated.steps_per_process == 1


def test_resume_from_a_truncated_state_file_fails_in_one_line(tmp_path):
    state = tmp_path / "state.bin"
    meta = dict(key="x", step=1, phase=0, process=1)
    restart.write_state(state, meta, dict(W=np.zeros(100, np.float32)))
    state.write_bytes(state.read_bytes()[:-100])
    done = subprocess.run([sys.executable, "-m", "dev.ane.restart", "--state", str(state),
                           "--out", str(tmp_path / "w.npy")], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"restart: error: {state}: truncated or damaged ANE state: "
        f"{state.stat().st_size} bytes, its header says {state.stat().st_size + 100}"]


def test_memory_counts_one_layers_matrices():
    """The fp16 copy the ANE holds of a layer is its matrices at 2 bytes each (planted: the
    count divided by the layers once more said 1.1 MiB for stories110M's 13.5)."""
    config = llama("stories110M")
    mem = memory(plan_of(config, "static"), memory_plan(Llama2, config, 1, config.max_seq_len))
    dim, hidden = config.dim, config.hidden_dim
    assert mem["layer_matrix_elements"] == 4 * dim * dim + 3 * dim * hidden
