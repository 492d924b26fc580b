"""
dev/mpi_scaling.py: the step time of data-parallel training (train.py under mpirun) at N
processes, on paper, and checked against what 1 and 2 processes measure on this machine.

    python dev/mpi_scaling.py                  the model at the stated bandwidths (instant)
    python dev/mpi_scaling.py --measure        also measures here: 1 and 2 processes, the
                                               all-reduce alone, memory per rank (minutes)

The model (weak scaling: each process trains on its own B*T*grad_accum tokens per step, so the
total batch grows with N; with a fixed -d, grad_accum falls as N grows instead):

    t(N) = t_compute + t_allreduce(N)
    t_allreduce(N) = 2 (N-1)/N * G / bw + 2 (N-1) * latency      a ring all-reduce
    tokens/s(N) = N * tokens_per_process / t(N)

t_compute is the measured step of one process (forward, backward, AdamW); G = 4 * num_parameters
bytes of float32 gradient; a ring all-reduce sends and receives 2 (N-1)/N of G per process in
2 (N-1) rounds.  ZeRO-1 (-z 1) is a reduce-scatter and an all-gather, the same bytes and rounds,
so the same time on paper; it divides AdamW's m and v by N (the memory table).  Nothing is
overlapped with the backward pass (train.py reduces after it, as written; llm.c overlaps it on
GPUs).

--measure runs, with d12 B=4 T=64 on random tokens and OMP_NUM_THREADS set per run:
    1 process x 1 thread             t_compute of one process's work (B*T tokens)
    2 processes x 1 thread, -d 512   the data-parallel step and its MPI share (train.py prints it)
    1 process x 2 threads, -d 512    the same total batch on one process (grad accumulation)
    the all-reduce alone, 2 ranks    this machine's bandwidth (shared memory), for the model
and compares the model's t(2) with the measured one.  On this 2-core machine the two processes
also share caches and memory bandwidth, which the model leaves out: that difference is printed.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# stated bandwidths per process (bytes/s) and latencies (s) of an all-reduce's link
LINKS = {
    "100 Gb/s InfiniBand": (12e9, 5e-6),
    "25 Gb/s Ethernet": (2.8e9, 30e-6),
}
D12_PARAMETERS = 124_475_904  # GPT-2 124M, padded vocab (train_gpt2.GPT2Config.from_depth(12))
B, T = 4, 64


def t_allreduce(N, grad_bytes, bandwidth, latency):
    """A ring all-reduce of grad_bytes over N processes."""
    return 0.0 if N == 1 else 2 * (N - 1) / N * grad_bytes / bandwidth + 2 * (N - 1) * latency


def model_table(t_compute, grad_bytes, tokens_per_process, bandwidth, latency, counts):
    print(f"{'N':>5} {'step ms':>9} {'all-reduce ms':>14} {'share':>6} {'tok/s':>9} "
          f"{'efficiency':>10}")
    for N in counts:
        ar = t_allreduce(N, grad_bytes, bandwidth, latency)
        step = t_compute + ar
        print(f"{N:5d} {step * 1e3:9.1f} {ar * 1e3:14.1f} {ar / step:6.1%} "
              f"{N * tokens_per_process / step:9.0f} {t_compute / step:10.1%}")


# ----------------------------------------------------------------------------
# measuring here

def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec") or shutil.which("mpirun")


def run_train(processes, threads, data, steps, total_batch):
    train = [sys.executable, os.path.join(ROOT, "train.py"), "-e", "d12", "-b", str(B), "-t",
             str(T), "-d", str(total_batch), "-x", str(steps), "-s", "0", "-m", "0",
             "-i", os.path.join(data, "train_*.bin"), "-j", os.path.join(data, "val.bin")]
    command = train if processes == 1 else [mpiexec(), "-n", str(processes), *train]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print(f"  $ OMP_NUM_THREADS={threads} {' '.join(command[:3] if processes > 1 else [])} "
          f"python train.py {' '.join(train[2:])}", flush=True)
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    step = float(re.search(r"total average iteration time: (\S+) ms", out).group(1)) / 1e3
    mpi = re.search(r"of it in collectives: (\S+) ms", out)
    return step, float(mpi.group(1)) / 1e3 if mpi else 0.0


ALLREDUCE_BENCH = """
import sys, time
import numpy as np
from mpi4py import MPI
comm, n, reps = MPI.COMM_WORLD, int(sys.argv[1]), int(sys.argv[2])
grads = np.ones(n, dtype=np.float32)
comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)  # first touch, connections
times = []
for _ in range(reps):
    comm.Barrier()
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
    times.append(time.perf_counter() - start)
if comm.Get_rank() == 0:
    print(min(times), np.median(times))
"""


def measure_allreduce(num_floats, reps=5):
    """(best, median) seconds of an in-place float32 all-reduce of num_floats on 2 ranks."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", ALLREDUCE_BENCH,
                          str(num_floats), str(reps)], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def memory_per_rank(counts):
    """Model.memory() of rank 0 of N under ZeRO-1, d12 after a step at B=4 T=64 (MiB)."""
    from train_gpt2 import GPT2, GPT2Config
    model = GPT2.random(GPT2Config.from_depth(12), seed=0)
    tokens = np.random.default_rng(0).integers(0, 50257, (B, T + 1))
    model.forward(tokens[:, :-1], tokens[:, 1:])
    model.zero_grad()
    model.backward()
    print(f"{'N':>5} {'params':>8} {'grads':>8} {'AdamW':>8} {'acts':>8} {'total MiB':>10}")
    for N in counts:
        model.optimizer_shard = (0, model.num_parameters // N)
        model.update(1e-4, 0.9, 0.95, 1e-8, 0.0, 1)
        mem = {k: v / 2**20 for k, v in model.memory().items()}
        print(f"{N:5d} {mem['params']:8.0f} {mem['grads']:8.0f} {mem['adamw']:8.0f} "
              f"{mem['activations']:8.0f} {sum(mem.values()):10.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measure", action="store_true", help="measure 1 and 2 processes here")
    p.add_argument("--steps", type=int, default=8, help="train.py steps per measured run")
    p.add_argument("--t-compute", type=float, default=None,
                   help="ms of one process's step for the model (default: measured, or 1500)")
    args = p.parse_args()
    grad_bytes = 4 * D12_PARAMETERS
    tokens = B * T
    print(f"d12 (GPT-2 124M): gradient {grad_bytes / 2**20:.0f} MiB float32; per process "
          f"B*T = {tokens} tokens per step")

    t_compute = None if args.t_compute is None else args.t_compute / 1e3
    if args.measure:
        if mpiexec() is None:
            sys.exit("dev/mpi_scaling.py: --measure needs mpi4py and mpiexec (pip install "
                     "mpi4py mpich)")
        print("\nmeasured on this machine (the CPU may be shared: noisy):")
        with tempfile.TemporaryDirectory() as data:
            from llmc.formats.llmc import write_shard
            rng = np.random.default_rng(0)
            for i in range(2):
                write_shard(os.path.join(data, f"train_{i}.bin"),
                            rng.integers(0, 50257, 64 * 2 * tokens + 1))
            write_shard(os.path.join(data, "val.bin"), rng.integers(0, 50257, 2 * tokens + 1))
            one_1, _ = run_train(1, 1, data, args.steps, tokens)
            two_1, two_mpi = run_train(2, 1, data, args.steps, 2 * tokens)
            one_2, _ = run_train(1, 2, data, args.steps, 2 * tokens)
        best, median = measure_allreduce(D12_PARAMETERS)
        bandwidth = t_allreduce(2, grad_bytes, 1.0, 0.0) / best  # bytes/s it moved
        t_compute = one_1
        print(f"  1 process  x 1 thread,  -d {tokens}:  {one_1 * 1e3:8.1f} ms/step (t_compute)")
        print(f"  2 processes x 1 thread, -d {2 * tokens}:  {two_1 * 1e3:8.1f} ms/step, of it "
              f"MPI collectives {two_mpi * 1e3:.1f} ms ({two_mpi / two_1:.1%})")
        print(f"  1 process  x 2 threads, -d {2 * tokens}:  {one_2 * 1e3:8.1f} ms/step "
              f"(2 processes / this: {two_1 / one_2:.2f})")
        print(f"  all-reduce of the gradient alone, 2 ranks: best {best * 1e3:.1f} ms, median "
              f"{median * 1e3:.1f} ms: {bandwidth / 1e9:.2f} GB/s per process")
        predicted = t_compute + t_allreduce(2, grad_bytes, bandwidth, 0.0)
        print(f"  model t(2) = {t_compute * 1e3:.1f} + {(predicted - t_compute) * 1e3:.1f} = "
              f"{predicted * 1e3:.1f} ms, measured {two_1 * 1e3:.1f} ms "
              f"({two_1 / predicted - 1:+.0%}: the two processes' compute contending for this "
              f"machine's 2 cores, caches and memory bandwidth, and waiting for each other)")
        print("\nmemory per rank, ZeRO-1 (Model.memory() of rank 0 of N):")
        memory_per_rank((1, 2, 4, 8))
        LINKS["measured here"] = (bandwidth, 0.0)
    if t_compute is None:
        t_compute = 1.5
        print("t_compute: a stated 1500 ms (run --measure, or give --t-compute)")

    for name, (bandwidth, latency) in LINKS.items():
        print(f"\nmodel, {name}: {bandwidth / 1e9:.1f} GB/s per process, {latency * 1e6:.0f} us "
              f"latency, t_compute {t_compute * 1e3:.0f} ms")
        model_table(t_compute, grad_bytes, tokens, bandwidth, latency, (1, 2, 4, 8, 16, 64))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
