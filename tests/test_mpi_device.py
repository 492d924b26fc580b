"""
Many processes on a device backend: the collectives group (accel/spec.py) of accel/hip, run on
its emulated build (each rank a process, the emulated RCCL of accel/emu/rccl), and
llmc/distributed.py's use of it in train.py.

- the entries: one rank (no MPI), errors in one line; a build without them (no NCCL) leaves
  the group out; 2 and 3 ranks through mpiexec, every
  collective bit for bit the sum in rank order (values chosen so that any other order differs),
  whatever order the ranks arrive in, at lengths with equal and unequal spans and across the
  emulation's chunks;
- a rank that ends while another waits for it: the waiting one fails with a line naming it;
  train.py with a rank killed: the job ends within seconds;
- train.py on 2 hip-emu ranks equals 1 rank accumulating 2 micro-batches (losses within 1e-5,
  norms within 1e-4, 5 steps), -z 0 and -z 1, fp32 and bf16, on the device and, with
  LLMPYX_HOST_COLLECTIVES=1, through host copies; the table says which path ran; -z 1 at bf16
  on the device resumes bit for bit;
- make hip-check-nvcc compiles the NCCL calls (where nvcc and NCCL's headers are).
"""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import needs
from accel.backend import BackendError
from test_mpi import (COMMON, MPI_ENV, data, kill_one_rank_and_see_the_job_end, losses,  # noqa: F401
                      needs_mpi, run_train)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

needs.emulator("hip-emu")
needs.emulator("hip-emu", "bf16")

CHUNK = 1 << 18   # accel/emu/rccl/rccl_emu.cpp's floats per rank and round
DEVICE_PATH = "on the device (hip-emu's collectives: NCCL / RCCL)"
HOST_PATH = "MPI through host copies"


def emulated():
    from accel.backend import get_backend
    return get_backend("hip-emu")


# --- one process ---------------------------------------------------------------------------

def test_one_rank_communicator_and_its_errors():
    backend = emulated()
    assert backend.supports("collectives")
    x = backend.alloc(4 * 11)
    with pytest.raises(BackendError, match=r"all_reduce_sum: no communicator \(comm_init first\)$"):
        backend.call("all_reduce_sum", x, 11)
    backend = emulated()   # a context keeps its first error: a new one
    unique_id = np.zeros(128, np.uint8)
    with pytest.raises(ValueError, match="argument 'unique_id' is host memory: a contiguous, writable NumPy array"):
        backend.call("comm_unique_id", x)
    with pytest.raises(ValueError, match="argument 'unique_id' has 64 bytes, the call touches 128"):
        backend.call("comm_unique_id", np.zeros(64, np.uint8))
    with pytest.raises(BackendError, match=r"comm_init: invalid argument$"):
        backend.call("comm_init", unique_id, 0, 1)   # not an id comm_unique_id made
    backend = emulated()
    backend.call("comm_unique_id", unique_id)
    assert unique_id.any()
    backend.call("comm_init", unique_id, 0, 1)
    values = np.arange(11, dtype=np.float32)
    x = backend.alloc(4 * 11)
    x.load(values)
    for entry in ("all_reduce_sum", "reduce_scatter_sum", "all_gather"):
        backend.call(entry, x, 11)
        assert np.array_equal(x.to_numpy(), values), entry
    with pytest.raises(BackendError, match="comm_init: this context has a communicator already"):
        backend.call("comm_init", unique_id, 0, 1)
    # nothing left in /dev/shm by the communicator (rank 0 unlinks its name once all joined)
    if os.path.isdir("/dev/shm"):
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"llmpyx-rccl-emu-{os.getpid()}-")]


def test_a_build_without_nccl_lacks_the_group(tmp_path):
    """A GPU build made where no NCCL/RCCL was found (-DACCEL_HIP_NO_COLLECTIVES): the loader
    leaves the group out, so many processes sum through host copies."""
    from accel.hip import device
    build = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "accel", "hip"), "emu-fp32", f"BUILD={tmp_path}",
                            "DEFINES=-DACCEL_HIP_NO_COLLECTIVES"], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    backend = device.load(str(tmp_path / "libgpt2_hip_emu.so"), "hip-emu")
    assert "collectives" not in backend.groups and emulated().supports("collectives")
    with pytest.raises(BackendError, match=r"backend 'hip-emu' has no collectives kernels \(all_reduce_sum\)"):
        backend.call("all_reduce_sum", backend.alloc(4), 1)


# --- many processes: the entries ------------------------------------------------------------

COLLECTIVES = """
import sys, time
import numpy as np
from mpi4py import MPI
from accel.backend import get_backend
comm = MPI.COMM_WORLD
rank, N = comm.Get_rank(), comm.Get_size()
backend = get_backend("hip-emu")
unique_id = np.zeros(128, np.uint8)
if rank == 0:
    backend.call("comm_unique_id", unique_id)
comm.Bcast(unique_id, root=0)
backend.call("comm_init", unique_id, rank, N)
wait = np.random.default_rng(int(sys.argv[1]) * 10 + rank)
for n in (10, 11, 6, {long}):
    # every rank's x: rank 0 +big, rank 1 +1, rank 2 -big (then repeating): in float32,
    # (big + 1) - big is 0 and (big - big) + 1 is 1, so the order of the sum shows
    x = np.random.default_rng(n + rank).standard_normal(n).astype(np.float32)
    x[::2] = (1e8, 1.0, -1e8)[rank % 3]
    rows = comm.allgather(x)
    want = rows[0].copy()
    for row in rows[1:]:
        want += row   # in rank order, in float32
    counts = [n // N + (r < n % N) for r in range(N)]
    first = np.concatenate(([0], np.cumsum(counts)))
    own = slice(first[rank], first[rank + 1])
    buffer = backend.alloc(4 * n)
    for entry in ("all_reduce_sum", "reduce_scatter_sum", "all_gather"):
        mine = x.copy()
        if entry == "all_gather":
            mine[own] = rank + 1
        buffer.load(mine)
        time.sleep(wait.random() * 0.05)   # the ranks arrive in another order each time
        backend.call(entry, buffer, n)
        got = buffer.to_numpy()
        if entry == "all_reduce_sum":
            assert np.array_equal(got, want), (entry, n)
        elif entry == "reduce_scatter_sum":   # its own span summed, the rest as it was
            assert np.array_equal(got[own], want[own]), (entry, n)
            assert np.array_equal(np.delete(got, np.r_[own]), np.delete(x, np.r_[own])), (entry, n)
        else:
            assert np.array_equal(got, np.repeat(np.arange(1, N + 1, dtype=np.float32), counts)), (entry, n)
done = comm.gather(rank)
if rank == 0:
    print("collectives ok on ranks", *done)
"""


@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_sum_in_rank_order_whatever_the_arrival(ranks, mpiexec):
    """Lengths with spans equal (6, 10 at 2 ranks: NCCL's reduce-scatter and all-gather) and not
    (11: a group of reduces and broadcasts rooted at each span's rank), and one longer than the
    emulation's chunk (several rounds through the shared memory)."""
    script = COLLECTIVES.format(long=CHUNK * ranks + 5)
    for seed in (1, 2):
        run = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-c", script, str(seed)],
                             capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env=dict(os.environ, **MPI_ENV, PYTHONPATH=ROOT))
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert run.stdout == f"collectives ok on ranks {' '.join(map(str, range(ranks)))}\n", run.stdout


# a rank of the emulated RCCL, with no MPI: its id, rank and what to do come in argv
RANK = """
import sys, time
import numpy as np
from accel.backend import BackendError, get_backend
unique_id = np.frombuffer(bytes.fromhex(sys.argv[1]), np.uint8).copy()
rank, what = int(sys.argv[2]), sys.argv[3]
backend = get_backend("hip-emu")
backend.call("comm_init", unique_id, rank, 2)
print("joined", flush=True)
if what == "leave":
    sys.exit(0)
time.sleep(0.5)
x = backend.alloc(4 * 5)
try:
    backend.call("all_reduce_sum", x, 5)
except BackendError as e:
    print(e)
"""


def test_a_rank_that_ends_fails_the_one_waiting_for_it():
    """Rank 1 joins and leaves; rank 0's all-reduce fails within seconds, naming it, where NCCL
    without a launcher would wait for it forever."""
    unique_id = np.zeros(128, np.uint8)
    emulated().call("comm_unique_id", unique_id)
    env = dict(os.environ, PYTHONPATH=ROOT)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, unique_id.tobytes().hex(), str(rank), what],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for rank, what in ((0, "sum"), (1, "leave"))]
    try:
        started = time.monotonic()
        outs = [rank.communicate(timeout=60) for rank in ranks]
        assert time.monotonic() - started < 30
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    assert outs[1][0] == "joined\n" and ranks[1].returncode == 0, outs[1]
    lines = outs[0][0].splitlines()
    assert lines[0] == "joined" and len(lines) == 2, outs[0]
    assert re.fullmatch(r"backend 'hip-emu': all_reduce_sum: remote process exited or there was a network "
                        r"error \(rank 1 \(pid \d+\) of the communicator ended while rank 0 waited for it\)",
                        lines[1]), lines[1]


@needs_mpi
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's pid in /proc")
def test_killing_one_rank_ends_a_device_job(data):
    kill_one_rank_and_see_the_job_end(f"kill-device-{os.getpid()}", data, "--backend", "hip-emu")


# --- many processes: train.py ---------------------------------------------------------------

def path_of(stdout):
    found = re.search(r"^\| all-reduce\s+\| (.+?)\s+\|$", stdout, re.M)
    return found and found.group(1)


@needs_mpi
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_emulated_ranks_equal_one_rank_accumulating(data, precision):
    """5 steps of GPT-2 d2 on hip-emu: 2 ranks (the device collectives, then host copies) give
    the losses and gradient norms of 1 rank with 2 micro-batches, with and without ZeRO-1."""
    common = [*COMMON, "-i", data.single, "-j", data.val, "-x", 5, "-v", 5, "--backend", "hip-emu",
              "--precision", precision]
    one = run_train(1, *common, "-m", 8)
    assert "grad_accum_steps=2" in one.stdout and path_of(one.stdout) is None
    expected = losses(one.stdout)
    assert sorted(expected) == [1, 2, 3, 4, 5]
    for zero_stage in (0, 1):
        for host, path in (("0", DEVICE_PATH), ("1", HOST_PATH)):
            os.environ["LLMPYX_HOST_COLLECTIVES"] = host
            try:
                two = run_train(2, *common, "-m", 4, "-z", zero_stage)
            finally:
                del os.environ["LLMPYX_HOST_COLLECTIVES"]
            assert path_of(two.stdout) == path, two.stdout
            assert re.search(rf"\| zero_stage\s+\| {zero_stage}\s+\|", two.stdout)
            got = losses(two.stdout)
            assert sorted(got) == sorted(expected), two.stdout
            for step, (loss, norm) in expected.items():
                assert abs(got[step][0] - loss) < 1e-5 and abs(got[step][1] - norm) < 1e-4, \
                    (zero_stage, path, step, got[step], (loss, norm))


@needs_mpi
def test_zero1_bf16_on_the_device_resumes_bit_for_bit(data, tmp_path):
    """-z 1 --precision bf16 on 2 hip-emu ranks, device path: a run stopped at step 2 and resumed
    (the all-gather of the master weights without rounding, llmc/checkpoint.py) writes the model
    and both ranks' state files of the run that went straight to step 4."""
    common = [*COMMON, "-i", data.train, "-j", data.val, "-m", 1, "-z", 1, "--precision", "bf16",
              "--backend", "hip-emu", "-n", 2]
    out, straight_dir = tmp_path / "out", tmp_path / "straight"
    first = run_train(2, *common, "-x", 2, "-o", out)
    resumed = run_train(2, *common, "-x", 4, "-o", out, "-y", 1)
    straight = run_train(2, *common, "-x", 4, "-o", straight_dir)
    assert path_of(straight.stdout) == DEVICE_PATH
    assert sorted(losses(resumed.stdout)) == [3, 4]
    assert {**losses(first.stdout), **losses(resumed.stdout)} == losses(straight.stdout)
    for name in ("model_00000004.bin", "state_00000004_00000.bin", "state_00000004_00001.bin"):
        assert (out / name).read_bytes() == (straight_dir / name).read_bytes(), name


def test_nvcc_compiles_the_nccl_calls(tmp_path):
    """make hip-check-nvcc with NCCL's headers (the PyPI wheel nvidia-nccl-cu13): collectives.hip
    compiles for sm_90 at both precisions."""
    needs.tool("nvcc")
    needs.headers("cuBLAS")
    needs.headers("NCCL")
    check = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "accel", "hip"), "check-nvcc", f"BUILD={tmp_path}"],
                           capture_output=True, text=True, timeout=900)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "gpt2.hip compiles with nvcc for sm_90, fp32 and bf16, with NCCL's collectives" in check.stdout


def test_the_ranks_agree_on_one_path(data, mpiexec):
    """Only rank 1 has LLMPYX_HOST_COLLECTIVES=1: rank 0 would take the device, but the ranks
    agree through MPI, so both go through host copies (each on the device alone: a hang)."""
    if "HYDRA" not in subprocess.run([mpiexec, "--version"], capture_output=True, text=True, check=True).stdout:
        pytest.skip(f"{mpiexec} is not MPICH's (hydra), whose -env starts ranks with different environments")
    train = [sys.executable, os.path.join(ROOT, "train.py"), *map(str, COMMON), "-i", data.single, "-j", data.val,
             "-x", 2, "-v", 5, "-m", 4, "--backend", "hip-emu"]
    train = list(map(str, train))
    env = {k: v for k, v in os.environ.items() if k != "LLMPYX_HOST_COLLECTIVES"}
    run = subprocess.run([mpiexec, "-n", "1", *train, ":", "-n", "1", "-env", "LLMPYX_HOST_COLLECTIVES", "1", *train],
                         capture_output=True, text=True, timeout=120, env=dict(env, **MPI_ENV))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert path_of(run.stdout) == HOST_PATH
    assert sorted(losses(run.stdout)) == [1, 2]
