"""
Data-parallel training through MPI (llmc/distributed.py), ZeRO-1 and the per-rank checkpoints.

Without MPI: the optimizer shard of the core (Model.optimizer_shard) updates exactly its span,
the DataLoader gives each process its part of every sample as llm.c's, the state files carry
the rank, and one process never imports mpi4py.
With MPI (mpi4py and its mpiexec; skipped otherwise): train.py on 2 ranks x 1 thread gives the
losses of 1 rank with the same total batch through gradient accumulation (-z 0 and -z 1); an
error on one rank, or one rank killed, ends the job within seconds; a 2-rank run resumes bit
for bit, and a different number of processes is refused in one line.
"""
import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import needs
from llmc import checkpoint, distributed
from llmc.dataloader import MT19937, DataLoader, random_permutation
from llmc.formats import FormatError
from llmc.formats.llmc import read_state, read_state_processes, write_shard, write_state
from train_gpt2 import GPT2, GPT2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss (\S+) \| norm (\S+) \|", re.M)
VAL_LINE = re.compile(r"^val loss (\S+)$", re.M)
B, T = 2, 16


# ----------------------------------------------------------------------------
# without MPI: the core's optimizer shard, the data split, the state files

def tiny_model():
    return GPT2.random(GPT2Config.from_depth(2, max_seq_len=T), seed=3)


def test_sharded_update_is_the_full_update_cut_in_spans():
    """Two models that each update one span of the same gradients (ZeRO-1 on 2 ranks, the
    spans cutting tensors and the weight-decay runs) together equal one that updates all."""
    full = tiny_model()
    P = full.num_parameters
    cut = P // 2 + 12345  # inside a tensor, uneven
    halves = [tiny_model(), tiny_model()]
    halves[0].optimizer_shard, halves[1].optimizer_shard = (0, cut), (cut, P)
    rng = np.random.default_rng(0)
    for t in (1, 2, 3):
        grads = rng.standard_normal(P).astype(np.float32)
        for model in (full, *halves):
            model.grads[:] = grads
            model.update(1e-3, 0.9, 0.95, 1e-8, 0.1, t, grad_scale=0.5, decay_2d_only=True)
    assert np.array_equal(halves[0].params[:cut], full.params[:cut])
    assert np.array_equal(halves[1].params[cut:], full.params[cut:])
    assert np.array_equal(np.concatenate([halves[0].m, halves[1].m]), full.m)
    assert np.array_equal(np.concatenate([halves[0].v, halves[1].v]), full.v)
    # outside its span a shard's model is not updated, and its AdamW state is its span's only
    assert np.array_equal(halves[0].params[cut:], tiny_model().params[cut:])
    assert halves[0].memory()["adamw"] == 2 * 4 * cut
    assert full.memory()["adamw"] == 2 * 4 * P
    # the norm of the shard's gradient: its part of the whole's squared norm
    norms = [model.grad_norm(shard_only=True) for model in halves]
    assert np.isclose(norms[0] ** 2 + norms[1] ** 2, full.grad_norm() ** 2, rtol=1e-6)
    with pytest.raises(ValueError, match="m must have shape"):
        halves[1].m = np.zeros(P, np.float32)
    with pytest.raises(ValueError, match="not a non-empty span"):
        full.optimizer_shard = (5, 5)


def write_tokens(path, tokens):
    write_shard(path, np.asarray(tokens, dtype=np.int64) % 50257)


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_process_reads_its_part_as_llmc(tmp_path, shuffle):
    """Process r of N reads the B*T+1 tokens at idx*N*B*T + r*B*T of sample idx, the samples in
    order, or shuffled by its own Mersenne Twister seeded 42 + r (llm.c's dataloader.h)."""
    N, BT = 3, B * T
    sizes = (5 * N * BT + 7, 3 * N * BT + 1)
    for i, n in enumerate(sizes):
        write_tokens(tmp_path / f"s_{i}.bin", np.arange(n) + 1000 * i)
    pattern = str(tmp_path / "s_*.bin")
    for rank in range(N):
        loader = DataLoader(pattern, B, T, shuffle, process_rank=rank, num_processes=N)
        rng = MT19937(42 + rank)
        expected, shards = [], [0, 1]
        for _epoch in range(2):
            if shuffle:  # the order of the last epoch, permuted again
                random_permutation(shards, rng)
            for shard in shards:
                samples = list(range((sizes[shard] - 1) // (N * BT)))
                if shuffle:
                    random_permutation(samples, rng)
                for idx in samples:
                    start = 1000 * shard + idx * N * BT + rank * BT
                    expected.append(np.arange(start, start + BT).reshape(B, T))
        for want in expected:
            inputs, targets = loader.next_batch()
            assert np.array_equal(inputs, want) and np.array_equal(targets, want + 1)
    with pytest.raises(Exception, match=r"x 3 processes needs 97"):
        write_tokens(tmp_path / "small.bin", np.arange(N * BT))
        DataLoader(str(tmp_path / "small.bin"), B, T, True, process_rank=0, num_processes=N)


def test_state_files_carry_the_rank(tmp_path):
    write_tokens(tmp_path / "s.bin", np.arange(4 * 2 * B * T + 1))
    loaders = [DataLoader(str(tmp_path / "s.bin"), B, T, True, process_rank=r, num_processes=2)
               for r in range(2)]
    rng = np.random.default_rng(0)
    for rank, loader in enumerate(loaders):
        m, v = rng.standard_normal((2, 100 + rank)).astype(np.float32)
        path = checkpoint.checkpoint_paths(str(tmp_path), 5, rank)[1]
        assert path.endswith(f"state_00000005_0000{rank}.bin")
        write_state(path, 5, m, v, loader.state(), num_processes=2, process_rank=rank)
        assert read_state_processes(path) == (2, rank)
        step, m2, v2, _ = read_state(path, 100 + rank, num_processes=2, process_rank=rank)
        assert step == 5 and np.array_equal(m, m2) and np.array_equal(v, v2)
    with pytest.raises(FormatError, match="written by process 1 of a run of 2, read by "
                                          "process 0 of 1"):
        read_state(path, 101)
    with pytest.raises(FormatError, match="does not fit an optimizer shard of 100"):
        read_state(path, 100, num_processes=2, process_rank=1)


def test_one_process_needs_no_mpi():
    """No launcher: SINGLE, every collective a no-op, and mpi4py is never imported."""
    env = {k: v for k, v in os.environ.items()
           if k not in distributed.LAUNCHER_SIZE_VARIABLES + distributed.LAUNCHER_RANK_VARIABLES}
    code = ("import sys; from llmc import distributed as d; c = d.init(); "
            "assert c is d.SINGLE and c.num_processes == 1 and c.mean(2.5) == 2.5; "
            "c.barrier(); c.reduce_gradients(None); c.gather_parameters(None); "
            "assert 'mpi4py' not in sys.modules; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.stdout.strip() == "ok", run.stderr
    env["PMI_SIZE"] = "1"  # a launcher of one process: the same
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.stdout.strip() == "ok", run.stderr


# ----------------------------------------------------------------------------
# with MPI: train.py on 2 ranks

# a test that starts ranks (conftest.py's mpiexec: a skip where MPI is absent)
needs_mpi = pytest.mark.usefixtures("mpiexec")
MPI_ENV = dict(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", LLMPYX_CACHE_DIR="/nonexistent-llmpyx-cache")


def train_command(num_processes, *args):
    train = [sys.executable, os.path.join(ROOT, "train.py"), *map(str, args)]
    if num_processes == 1:
        return train
    return [needs.mpiexec(), "-n", str(num_processes), *train]


def run_train(num_processes, *args, ok=True, timeout=300):
    env = {k: v for k, v in os.environ.items()
           if k not in distributed.LAUNCHER_SIZE_VARIABLES + distributed.LAUNCHER_RANK_VARIABLES}
    run = subprocess.run(train_command(num_processes, *args), capture_output=True, text=True,
                         env=dict(env, **MPI_ENV), timeout=timeout)
    if ok:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        assert "Traceback" not in run.stderr
    return run


def losses(stdout):
    return {int(m.group(1)): (float(m.group(2)), float(m.group(3)))
            for m in STEP_LINE.finditer(stdout)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """single: one train shard of exactly one sample of 2 ranks x B x T (so that the ranks,
    which shuffle with seeds of their own as llm.c's, read the same tokens at every step as one
    rank accumulating 2 micro-batches); val: 8 such samples; train: two shards of 3 samples
    each (the runs cross shards and epochs)."""
    d = tmp_path_factory.mktemp("mpi_data")
    rng = np.random.default_rng(0)
    write_tokens(d / "single.bin", rng.integers(0, 50257, 2 * B * T + 1))
    write_tokens(d / "val.bin", rng.integers(0, 50257, 8 * 2 * B * T + 1))
    for i in range(2):
        write_tokens(d / f"train_{i}.bin", rng.integers(0, 50257, 3 * 2 * B * T + 1))
    return types.SimpleNamespace(dir=d, single=str(d / "single.bin"), val=str(d / "val.bin"),
                                 train=str(d / "train_*.bin"))


COMMON = ["-e", "d2", "-b", B, "-t", T, "-d", 2 * B * T, "-s", 0, "-l", 1e-3, "-c", 0.1]


@needs_mpi
def test_two_ranks_equal_one_rank_accumulating(data):
    one = run_train(1, *COMMON, "-i", data.single, "-j", data.val, "-x", 5, "-v", 5, "-m", 8)
    assert "grad_accum_steps=2" in one.stdout
    expected = losses(one.stdout)
    assert sorted(expected) == [1, 2, 3, 4, 5]
    # guard:cpu's memory is not the host's: the collectives go through host copies
    for zero_stage, backend in ((0, "cpu"), (1, "cpu"), (1, "guard:cpu")):
        two = run_train(2, *COMMON, "-i", data.single, "-j", data.val, "-x", 5, "-v", 5,
                        "-m", 4, "-z", zero_stage, "--backend", backend)
        assert "num_processes=2 and total_batch_size=64 => grad_accum_steps=1" in two.stdout
        assert re.search(rf"\| zero_stage\s+\| {zero_stage}\s+\|", two.stdout)
        path = "MPI through host copies" if backend == "guard:cpu" else "MPI on the host memory, in place"
        assert re.search(rf"^\| all-reduce\s+\| {path}\s+\|$", two.stdout, re.M), two.stdout
        got = losses(two.stdout)
        assert sorted(got) == sorted(expected), two.stdout  # printed once, by rank 0
        for step, (loss, norm) in expected.items():
            assert abs(got[step][0] - loss) < 1e-5 and abs(got[step][1] - norm) < 1e-4, step
        # the val loss split across the ranks (4 batches each) is 1 rank's over 8
        assert np.allclose([float(x) for x in VAL_LINE.findall(two.stdout)],
                           [float(x) for x in VAL_LINE.findall(one.stdout)], atol=1e-5)
        assert "of it in collectives" in two.stdout


@needs_mpi
def test_two_ranks_with_bf16_gradients_track_one_rank(data):
    """--grad-precision bf16: each rank's bf16 gradients are summed as float32 copies and
    rounded once; one rank accumulating rounds after each micro-batch instead, so the two
    agree within bf16's rounding, not bit for bit."""
    common = [*COMMON, "-i", data.single, "-j", data.val, "-x", 5, "-v", 5, "-m", 8,
              "--precision", "bf16", "--grad-precision", "bf16"]
    expected = losses(run_train(1, *common).stdout)
    for zero_stage in (0, 1):
        two = run_train(2, *common, "-z", zero_stage)
        assert re.search(r"^\| all-reduce\s+\| MPI on float32 copies of the bf16 gradients",
                         two.stdout, re.M), two.stdout
        got = losses(two.stdout)
        assert sorted(got) == sorted(expected)
        for step, (loss, norm) in expected.items():
            assert abs(got[step][0] - loss) < 0.02 and abs(got[step][1] - norm) < 0.02 * norm, step


@needs_mpi
def test_zero1_without_master_weights_is_zero0_bit_for_bit(data):
    """-w 0: under ZeRO-1 each rank updates and rounds its span of the bf16 parameters (each
    element's rounding a hash of its index and the step, whoever rounds it), then gathers the
    others': the same parameters as every rank updating all of them."""
    common = [*COMMON, "-i", data.train, "-j", data.val, "-x", 4, "-v", 4, "-m", 2,
              "--precision", "bf16", "-w", 0]
    zero0, zero1 = (losses(run_train(2, *common, "-z", z).stdout) for z in (0, 1))
    assert sorted(zero0) == [1, 2, 3, 4] and zero0 == zero1


@needs_mpi
def test_resume_two_ranks_is_bit_identical(data, tmp_path):
    common = [*COMMON, "-i", data.train, "-j", data.val, "-m", 1, "-z", 1]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(2, *common, "-x", 3, "-n", 3, "-o", out)
    resumed = run_train(2, *common, "-x", 7, "-n", 3, "-o", out, "-y", 1)
    straight = run_train(2, *common, "-x", 7, "-n", 3, "-o", straight_dir)
    assert "resuming from the checkpoint at step 3" in resumed.stdout
    assert sorted(losses(resumed.stdout)) == [4, 5, 6, 7]
    assert {**losses(first.stdout), **losses(resumed.stdout)} == losses(straight.stdout)
    names = sorted(p.name for p in straight_dir.iterdir())
    assert "state_00000007_00001.bin" in names and "main.log" in names
    for name in ("model_00000007.bin", "state_00000007_00000.bin", "state_00000007_00001.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name
    train_log = [line for line in (out / "main.log").read_text().splitlines() if "trl:" in line]
    assert train_log == [line for line in (straight_dir / "main.log").read_text().splitlines()
                         if "trl:" in line]
    # ZeRO-1: each rank's state holds its half of AdamW's m and v
    P = GPT2Config.from_depth(2, max_seq_len=1024).num_parameters()
    for rank in (0, 1):
        size = (out / f"state_00000007_0000{rank}.bin").stat().st_size
        assert 1024 + 2 * 4 * (P // 2) < size < 1024 + 2 * 4 * (P // 2 + 1) + 4096

    # one process cannot continue it: one line, no traceback
    refused = run_train(1, *common, "-x", 9, "-o", out, "-y", 1, ok=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"train.py: error: {out}: the checkpoint at step 7 was written by 2 processes, this "
        f"run has 1: resume with as many (mpirun -np 2)"]


@needs_mpi
def test_zero1_at_bf16_rounds_the_gathered_master_weights_and_resumes(data, tmp_path):
    """-z 1 --precision bf16: after the all-gather of the float32 master weights every rank
    rounds all of its bf16 parameters from them with the update's seed, so that rank 0's model
    file (the bf16 parameters, gathered spans included) is the stochastic rounding of the two
    ranks' master weights, bit for bit as one process rounds them; a 2-rank bf16 run resumes
    bit for bit (each rank's state holds its span of the master weights)."""
    common = [*COMMON, "-i", data.train, "-j", data.val, "-m", 1, "-z", 1, "--precision", "bf16"]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(2, *common, "-x", 2, "-n", 2, "-o", out)
    resumed = run_train(2, *common, "-x", 4, "-n", 2, "-o", out, "-y", 1)
    straight = run_train(2, *common, "-x", 4, "-n", 2, "-o", straight_dir)
    assert sorted(losses(resumed.stdout)) == [3, 4]
    assert {**losses(first.stdout), **losses(resumed.stdout)} == losses(straight.stdout)
    for name in ("model_00000004.bin", "state_00000004_00000.bin", "state_00000004_00001.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name

    from llmc.formats.llmc import read_training_state
    model = GPT2.from_checkpoint(str(out / "model_00000004.bin"), precision="bf16")
    P = model.num_parameters
    shards = [read_training_state(str(out / f"state_00000004_0000{rank}.bin"),
                                  P // 2 + (rank < P % 2), num_processes=2, process_rank=rank)
              for rank in (0, 1)]
    assert [state.last_update for state in shards] == [4, 4]
    file_params = model.params_as_run()
    model.set_master_weights(np.concatenate([state.master for state in shards]))
    model.round_params(4)   # what one process's update at t = 4 rounds all of them to
    assert np.array_equal(model.params_as_run(), file_params)


def start_tagged(tag, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in distributed.LAUNCHER_SIZE_VARIABLES + distributed.LAUNCHER_RANK_VARIABLES}
    return subprocess.Popen(train_command(2, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(env, **MPI_ENV, LLMPYX_TEST_TAG=tag))


def rank_pid(tag, rank):
    """The pid of the train.py process of this rank in the job tagged so (from /proc)."""
    wanted = {f"LLMPYX_TEST_TAG={tag}".encode()}
    ranks = {f"{name}={rank}".encode() for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK",
                                                     "PMIX_RANK")}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if wanted <= env and env & ranks and b"train.py" in cmdline and b"mpiexec" not in cmdline:
            return int(pid)
    return None


@needs_mpi
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's pid in /proc")
def test_killing_one_rank_ends_the_job(data):
    kill_one_rank_and_see_the_job_end(f"kill-{os.getpid()}", data)


def kill_one_rank_and_see_the_job_end(tag, data, *flags):
    """Rank 1 killed once training has started: the job ends within 10 s, failing."""
    job = start_tagged(tag, *COMMON, "-i", data.train, "-j", data.val, "-m", 1, "-x", 100000, *flags)
    try:
        for line in job.stdout:  # training has started on both ranks
            if line.startswith("step    2/"):
                break
        pid = rank_pid(tag, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        job.communicate(timeout=30)
        assert time.monotonic() - killed < 10
        assert job.returncode != 0
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


@needs_mpi
def test_error_on_one_rank_ends_the_job_with_its_message(data, tmp_path):
    """A token id out of the vocabulary in the part only rank 1 reads: its one-line error, and
    rank 0, waiting for it in the val loss's all-reduce, ends too."""
    tokens = np.random.default_rng(1).integers(0, 50257, 4 * B * T + 1)
    tokens[B * T + 5] = 60000
    write_shard(tmp_path / "bad_val.bin", tokens)
    started = time.monotonic()
    run = run_train(2, *COMMON, "-i", data.train, "-j", tmp_path / "bad_val.bin", "-m", 1,
                    "-x", 3, ok=False, timeout=60)
    assert time.monotonic() - started < 30
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("train.py: error:")]
    assert errors == [f"train.py: error: {tmp_path / 'bad_val.bin'}: token id 60000 at position "
                      f"{B * T + 5} is outside the model's vocabulary of 50257 (rank 1)"]
    assert "val loss" not in run.stdout
