"""
The ANE's static pipeline in training (accel/ane/table.pyx, accel/ane/hooks.py):
weights baked into the programs and rebuilt after each update, the compiles counted against
the one CompileBudget, the process replaced by exec() before a step that would pass it and
resumed from the run's checkpoint; and the weight gradients' GEMMs on a CPU worker thread
while the engine runs.  On the interpreter and the mock runtime, Linux.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import needs

needs.emulator("ane-emu")

from accel.ane import runtime, table  # noqa: E402
from accel.backend import BackendError  # noqa: E402
from llmc.formats.llmc import write_shard  # noqa: E402
from test_train import ROOT, run_train, step_losses  # noqa: E402
from train_llama2 import Llama2, LlamaConfig  # noqa: E402

STEPS = 5
RESTART_LINE = re.compile(r"^ANE static pipeline: (\d+) compiles in this process, step (\d+) "
                          r"needs (\d+) more, past .*: checkpoint at step (\d+), exec\(\) "
                          r"restart (\d+)$", re.M)


@pytest.fixture
def shard(tmp_path):
    """Data a d2 Llama learns in a few steps (a repeating sequence): the steps matter."""
    path = tmp_path / "train_000.bin"
    write_shard(path, np.tile(np.arange(37) * 7 % 300, 200))
    return path


def common(shard):
    return ["--model", "d2", "--family", "llama", "--vocab-size", 300, "-b", 2, "-t", 16,
            "-i", shard, "-j", shard, "-m", 1, "-s", 0, "-x", STEPS, "-l", 3e-3]


def train_records(path):
    return [r for r in map(json.loads, open(path)) if r["type"] == "train"]


def run_static(shard, out, *extra, env=None, status=0):
    args = [sys.executable, os.path.join(ROOT, "train.py"), *map(str, common(shard)),
            "--backend", "ane-emu", "--ane-pipeline", "static", "-o", str(out), "--json-log",
            *map(str, extra)]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env=dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent", **(env or {})))
    assert run.returncode == status, run.stderr
    assert "Traceback" not in run.stderr
    return run


def test_restarts_give_the_losses_of_a_run_without_them(shard, tmp_path):
    """d2 (2 layers: 12 static programs a step, 6 a layer, and the 2 weight-free attention ones
    once a process) under a budget of 30 (20 usable) restarts before every step but the first: the
    losses, main.log and the JSON log's losses are those of the same run with a budget that
    never restarts, both within fp16 of the CPU's (1e-3 relative, as tests/test_ane_emu.py's
    dynamic run), and the compiles each step made are what the hooks predicted."""
    whole = run_static(shard, tmp_path / "whole", "--ane-budget", 1000)
    split = run_static(shard, tmp_path / "split", "--ane-budget", 30)
    cpu = step_losses(run_train(*common(shard), "--backend", "cpu", "-o", tmp_path / "cpu"))

    assert not RESTART_LINE.search(whole.stdout)
    restarts = RESTART_LINE.findall(split.stdout)
    assert [(int(c), int(s), int(n), int(at), int(k)) for c, s, n, at, k in restarts] == [
        (14, step + 1, 12, step, step) for step in range(1, STEPS)]
    # the restarted processes print nothing else twice: one settings table, one memory line
    assert split.stdout.count("| max_steps ") == 1 and split.stdout.count("memory allocated") == 1
    assert step_losses(split.stdout) == step_losses(whole.stdout)
    assert sorted(step_losses(split.stdout)) == list(range(1, STEPS + 1))
    for name in ("main.log",):
        assert open(tmp_path / "split" / name).read() == open(tmp_path / "whole" / name).read()
    split_log, whole_log = (train_records(tmp_path / d / "log.jsonl") for d in ("split", "whole"))
    assert [r["loss"] for r in split_log] == [r["loss"] for r in whole_log]
    assert [r["step"] for r in split_log] == list(range(STEPS))
    assert [r["ane_compiles"] for r in whole_log] == [14] + [12] * (STEPS - 1)
    assert [r["ane_compiles"] for r in split_log] == [14] * STEPS
    assert [r["restarts"] for r in split_log] == list(range(STEPS))
    run_records = [r for r in map(json.loads, open(tmp_path / "split" / "log.jsonl"))
                   if r["type"] == "run"]
    assert len(run_records) == 1
    # only the newest restart's checkpoint is left beside the final one (no -n): the run
    # folder does not fill up
    assert sorted(os.listdir(tmp_path / "split")) == sorted(
        ["DONE_00000004", "model_00000004.bin", "state_00000004_00000.bin", "DONE_00000005",
         "model_00000005.bin", "state_00000005_00000.bin", "run.json", "main.log", "log.jsonl",
         "loss.png", ".gitignore"])

    ane = np.array([float(split_log[k]["loss"]) for k in range(STEPS)])
    reference = np.array([float(cpu[k + 1]) for k in range(STEPS)])
    assert reference[-1] < reference[0] - 0.1   # it learns, so the steps matter
    np.testing.assert_allclose(ane, reference, rtol=1e-3)
    # between steps the static pipeline evaluates on the CPU (no compiles): step 0's val loss
    # is the CPU run's, to the bit
    val = lambda out: re.findall(r"^val loss (\S+)$", out, re.M)  # noqa: E731
    cpu_val = val(run_train(*common(shard), "--backend", "cpu", "-x", 1))
    assert val(split.stdout)[0] == cpu_val[0]


def test_a_kill_between_the_save_and_the_exec_loses_nothing(shard, tmp_path):
    """SIGKILL right after the restart's checkpoint is written (LLMPYX_KILL_BEFORE_RESTART):
    running the command again with -y 1 (what the exec would have run) resumes at that step
    and ends with the losses and main.log of a run never stopped."""
    whole = run_static(shard, tmp_path / "whole", "--ane-budget", 1000)
    out = tmp_path / "killed"
    killed = run_static(shard, out, "--ane-budget", 40, status=-signal.SIGKILL,
                        env={"LLMPYX_KILL_BEFORE_RESTART": "1"})
    (restart,) = RESTART_LINE.findall(killed.stdout)
    at = int(restart[3])
    assert at == 2 and sorted(step_losses(killed.stdout)) == [1, 2]
    assert os.path.exists(out / f"DONE_{at:08d}")
    resumed = run_static(shard, out, "--ane-budget", 40, "-y", 1)
    assert "resuming from the checkpoint at step 2" in resumed.stdout
    assert sorted(step_losses(resumed.stdout)) == [3, 4, 5]
    losses = {**step_losses(killed.stdout), **step_losses(resumed.stdout)}
    assert losses == step_losses(whole.stdout)
    assert open(out / "main.log").read() == open(tmp_path / "whole" / "main.log").read()


def test_the_mock_runtime_restarts_alike_and_fails_where_the_budget_is_ignored(shard, tmp_path):
    """On MockRuntime (LLMPYX_ANE_RUNTIME=mock: float32 storage) the restarts give the same
    losses too (3 steps: the restarts' losses are the interpreter's test above); and the same
    static steps on a mock that does not refuse at the budget fail where the ANE compiler would,
    in one line."""
    mock = {"LLMPYX_ANE_RUNTIME": "mock"}
    whole = run_static(shard, tmp_path / "whole", "--ane-budget", 1000, "-x", 3, env=mock)
    split = run_static(shard, tmp_path / "split", "--ane-budget", 30, "-x", 3, env=mock)
    assert len(RESTART_LINE.findall(split.stdout)) == 2
    assert sorted(step_losses(split.stdout)) == [1, 2, 3]
    assert step_losses(split.stdout) == step_losses(whole.stdout)

    config = LlamaConfig.from_name("d2", vocab_size=300)
    naive = runtime.MockRuntime(runtime.CompileBudget(19, 10), enforce_budget=False)
    model = Llama2.random(config, seed=0, backend=table.create(naive, pipeline="static"))
    x = np.arange(32).reshape(2, 16) % 300
    model.forward(x, x)
    model.backward()
    model.update(1e-2, 0.9, 0.95, 1e-8, 0.0, 1)
    # the first step's 14 compiles, then the next forward's 6 (the weighted programs of 2 layers)
    with pytest.raises(BackendError, match=r"mock ANE compiler: compile 20 of a process that "
                                           r"allows 19") as e:
        model.forward(x, x)
    assert "\n" not in str(e.value)


def test_a_step_past_the_budget_and_a_restart_without_a_folder_are_one_line(shard, tmp_path):
    cases = [(["--ane-budget", 20, "-o", tmp_path / "a"], "--ane-pipeline static: a step of this "
              "model compiles 14 programs .* more than a process gets .*use --ane-pipeline "
              "dynamic.*"),
             (["--ane-budget", 45], "--backend ane-emu runs 2 steps of this model in a process, the "
              "run 5: it goes on in fresh processes from its checkpoints, give it -o DIR")]
    for extra, message in cases:
        run = subprocess.run([sys.executable, "train.py", *map(str, common(shard)), "--backend",
                              "ane-emu", "--ane-pipeline", "static", *map(str, extra)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 1
        assert re.fullmatch(f"train.py: error: {message}\n", run.stderr), run.stderr


# ----------------------------------------------------------------------------
# a step compiles what the planner counts (accel/ane/plan.py, the dry run)

@pytest.mark.parametrize("pipeline", ["static", "dynamic"])
@pytest.mark.parametrize("name", ["stories15M", "stories110M"])
def test_a_step_compiles_what_the_dry_run_plans(name, pipeline):
    """Two training steps of stories15M and stories110M (B=1, T=32: the counts do not depend
    on them) in one process compile what the planner counts for them under the same budget:
    static 6 L a step (the fused blocks' and wo's forward and dx of each layer) and the 2
    weight-free attention programs in the first; dynamic the 8 kernels, in the first step only.
    The classifier's matmul runs on the CPU, as in the plan."""
    from accel.ane.plan import make_plan, static_step_compiles
    from llmc.recompute import RecomputePlan
    from train_llama2 import PRESETS
    config = PRESETS[name]
    budget = runtime.CompileBudget(1000, 10)   # no restart: one process
    plan = make_plan(config, pipeline, budget, RecomputePlan("all", config.n_layers), B=1, T=32,
                     steps=2)
    backend = table.create(pipeline=pipeline, budget=budget, parallel_dw=False)
    model = Llama2.random(config, seed=0, backend=backend)
    assert model.fused
    rng = np.random.default_rng(0)
    counts = []
    for step in range(2):
        x, y = rng.integers(0, config.vocab_size, (2, 1, 32))
        before = backend.emulator.builds
        if pipeline == "static":
            assert backend.emulator.static_step_compiles(config) == (
                plan.first_step_compiles if step == 0 else plan.compiles_per_step)
        model.forward(x, y)
        model.zero_grad()
        model.backward()
        model.update(1e-3, 0.9, 0.95, 1e-8, 0.0, step + 1)
        counts.append(backend.emulator.builds - before)
    L = config.n_layers
    assert counts == [plan.first_step_compiles, plan.compiles_per_step]
    assert counts == ([6 * L + 2, 6 * L] if pipeline == "static" else [8, 0])
    assert static_step_compiles(config) == 6 * L + 2 and static_step_compiles(
        config, ("attention_forward", "attention_backward")) == 6 * L


def test_train_py_stories15M_compiles_and_restarts_as_its_dry_run_says(tmp_path):
    """train.py on stories15M, the default budget (109 usable): its JSON log's compiles per
    step, and its restart, are those its dry run prints: static 36 a step, 38 in a process's
    first, exec() every 2 steps; dynamic 8 in the first step, then none."""
    shard = tmp_path / "train_000.bin"
    write_shard(shard, np.tile(np.arange(37) * 7 % 300, 200))
    args = ["--model", "stories15M", "-b", 1, "-t", 32, "-i", shard, "-j", shard, "-m", 0,
            "-s", 0, "--backend", "ane-emu"]
    for pipeline, steps, plan_says, compiles in [
            ("static", 3, ("compiles per step: 36 (first step 38)", "exec() every 2 steps "),
             [38, 36, 38]),
            ("dynamic", 2, ("compiles per step: 0 (first step 8)", "restarts: none"), [8, 0])]:
        command = [*args, "-x", steps, "--ane-pipeline", pipeline]
        plan = run_train(*command, "--dry-run")
        assert all(line in plan for line in plan_says), plan
        out = tmp_path / pipeline
        run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                              *map(str, command), "-o", str(out), "--json-log"],
                             capture_output=True, text=True, timeout=600, cwd=ROOT,
                             env=dict(os.environ, LLMPYX_CACHE_DIR="/nonexistent"))
        assert run.returncode == 0, run.stderr
        assert [r["ane_compiles"] for r in train_records(out / "log.jsonl")] == compiles
        restarts = [(int(c), int(s), int(n)) for c, s, n, _, _ in RESTART_LINE.findall(run.stdout)]
        assert restarts == ([(74, 3, 36)] if pipeline == "static" else [])


# ----------------------------------------------------------------------------
# the weight gradients on the CPU's worker thread

def two_steps(parallel_dw, pipeline):
    config = LlamaConfig.from_name("d2", vocab_size=300)
    backend = table.create(pipeline=pipeline, parallel_dw=parallel_dw,
                           budget=runtime.CompileBudget(1000, 10))
    model = Llama2.random(config, seed=3, backend=backend)
    rng = np.random.default_rng(0)
    times = []
    for step in range(2):
        x, y = rng.integers(0, 300, (2, 16)), rng.integers(0, 300, (2, 16))
        model.zero_grad()
        for _ in range(2):   # two micro-batches: the queued GEMMs add into the same gradients
            model.forward(x, y)
            model.backward()
        # AdamW reads the gradients straight after the backward, as train.py's step does
        model.update(1e-2, 0.9, 0.95, 1e-8, 0.1, step + 1)
        times.append(backend.step_times())
    return model.grads.copy(), model.params.copy(), times


@pytest.mark.parametrize("pipeline", ["dynamic", "static"])
def test_parallel_weight_gradients_are_the_sequential_ones(pipeline, monkeypatch):
    """The weight gradients computed on the worker while the engine runs the dx programs are
    those of the sequential order, bit for bit; both orders are timed (engine, dW, overlap).
    The worker is slowed down (each GEMM starts 3 ms late) so that a gradient read before the
    queue is drained, or a job's input changed under it, shows."""
    run = table.DWeights._run

    def late(self, job):
        if self.parallel:
            time.sleep(0.003)
        run(self, job)
    monkeypatch.setattr(table.DWeights, "_run", late)
    par_grads, par_params, par_times = two_steps(True, pipeline)
    seq_grads, seq_params, seq_times = two_steps(False, pipeline)
    assert np.array_equal(par_grads, seq_grads) and np.array_equal(par_params, seq_params)
    assert np.any(par_grads != 0)
    for times in par_times + seq_times:
        assert times["engine_ms"] > 0 and times["dw_ms"] > 0
        assert 0 <= times["overlap_ms"] <= min(times["engine_ms"], times["dw_ms"])
    assert all(t["overlap_ms"] == 0 for t in seq_times)   # one thread: nothing overlaps


def test_parallel_weight_gradients_follow_the_callers_thread_limit():
    """A limit on the main thread's OpenMP threads (threadpoolctl, as dev/ab.py sets one) does
    not reach the worker thread by itself: each job runs on its submitter's count, so the
    GEMMs split, and their sums go, as in the sequential order (bit for bit again)."""
    threadpoolctl = needs.package("threadpoolctl")
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        par_grads, _, _ = two_steps(True, "dynamic")
        seq_grads, _, _ = two_steps(False, "dynamic")
    assert np.array_equal(par_grads, seq_grads)


def test_busy_overlap():
    assert table.busy_overlap([(0, 2), (5, 7)], [(1, 6)]) == 2
    assert table.busy_overlap([(0, 1)], [(1, 2)]) == 0
    assert table.busy_overlap([], [(0, 1)]) == 0


# ----------------------------------------------------------------------------
# dev/ane/check_and_time.sh, the Mac user's check: its dry run

def test_mac_script_dry_run_lists_every_step_and_runs_the_plans(tmp_path):
    script = os.path.join(ROOT, "dev", "ane", "check_and_time.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    done = subprocess.run(["bash", script], env=dict(os.environ, DRY_RUN="1", OUT=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = [line.split(":", 1)[0][3:] for line in done.stdout.splitlines()
             if line.startswith("== ")]
    runs = [f"{kind}-{runtime}-{model}-{pipeline}" for runtime in ("coreml", "private")
            for model in ("stories15M", "stories110M") for pipeline in ("dynamic", "static")
            for kind in ("plan", "train")]
    assert steps == ["build", "build-product", "build-private", "parity-coreml",
                     *runs[:8], "parity-private", *runs[8:]]
    assert ("train.py --model stories110M --backend ane --ane-pipeline static -b 1 -t 256 -x 20"
            in done.stdout)
    # the plans ran (train.py --dry-run, any machine) and say what a step compiles (what the
    # step compiles, test_a_step_compiles_what_the_dry_run_plans)
    plan = open(tmp_path / "plan-coreml-stories110M-static.log").read()
    assert "compiles per step: 74 (first step 74)" in plan and "exec() every 1 step " in plan
    plan = open(tmp_path / "plan-private-stories15M-static.log").read()
    assert "compiles per step: 36 (first step 38)" in plan and "exec() every 2 steps " in plan
