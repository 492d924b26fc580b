"""
dev/gpu/llmc_peer.py: llm.c's own CUDA trainer, built and timed as the peer of llm.pyx on a GPU.

llm.c (github.com/karpathy/llm.c) is not part of this repository: a checkout of it is given by
its path (--llmc DIR, or LLMC_DIR in dev/gpu/check_and_time.sh). On a lent GPU machine, which
fetches nothing, the checkout travels with the run: put it at shared/llm.c (the device tool
carries shared/), without its .git (`git -C LLM_C archive HEAD | tar -x -C shared/llm.c`,
a few MB); dev/gpu/README.md.

    python dev/gpu/llmc_peer.py build --llmc shared/llm.c        both builds, with llm.c's Makefile
    python dev/gpu/llmc_peer.py time --llmc shared/llm.c -b 8 -t 1024 --precision bf16
    DRY_RUN=1 python dev/gpu/llmc_peer.py build --llmc DIR       print the commands, run nothing

build: llm.c's Makefile makes its two trainers in DIR: train_gpt2fp32cu (train_gpt2_fp32.cu) and
train_gpt2cu (train_gpt2.cu with PRECISION=BF16), without cuDNN (USE_CUDNN=0), NCCL
(NO_MULTI_GPU=1) or MPI (NO_USE_MPI=1), for this GPU's compute capability (nvidia-smi, or
GPU_COMPUTE_CAPABILITY=90), against the cuBLAS accel/hip/toolchain.sh finds (the CUDA toolkit's,
else the nvidia-cublas wheel's: its include/ and its versioned libcublas and libcublasLt),
linking NVML only where nvml.h is beside nvcc (llm.c's mfu.h uses it only then), with
dev/gpu/llmc_cuda13.h force-included (CUDA 13 changed cudaMemAdvise, which llm.c calls the CUDA 12
way; the header adds the old form, and nothing on CUDA 12).

time: a GPT-2 d12 step of each trainer at B, T on random tokens (llm.c's token shard format),
from the parameters given (--params, a float32 .npy in GPT-2's layout: bench_gpu.py passes
llm.pyx's, so every side starts alike), written as the llm.c checkpoint each reads (version 3
for fp32, as gpt2_124M.bin in its working folder, where train_gpt2_fp32.cu looks; version 5
for bf16, through -e). The ms/step each prints per step (fp32: "step N/M: train loss L (X ms,
...)", bf16: "step N/M | loss L ... | X ms | ...") after the warm-up steps, the median.
What differs from llm.pyx's step, by llm.c's own design: its fp32 trainer turns TF32 on where
the GPU has it (compute capability 8 and up; it has no flag to turn it off) and its bf16 one
fuses GELU into the GEMM on sm_90 (-ge's default). Run with -r 0 (no recompute, llm.c's fastest)
so its time is a lower bound for llm.c.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# precision: (the Makefile's target, the binary it makes, the source it needs, extra make flags)
BUILDS = {"fp32": ("train_gpt2fp32cu", "train_gpt2_fp32.cu", []),
          "bf16": ("train_gpt2cu", "train_gpt2.cu", ["PRECISION=BF16"])}
MAKE_FLAGS = ["USE_CUDNN=0", "NO_MULTI_GPU=1", "NO_USE_MPI=1"]
# a step line of either trainer: its step number, its loss and its ms
STEP = re.compile(r"^step\s+(\d+)/\d+\s*(?::\s*train loss|\|\s*loss)\s+(\S+).*?([0-9.]+) ms\b")
VOCAB = 50257   # llm.c's trainers are GPT-2's: its vocabulary


class PeerError(Exception):
    """llm.c cannot be built or run here: one line saying why."""


def dry_run():
    return os.environ.get("DRY_RUN", "0") not in ("", "0")


def toolchain(what):
    """accel/hip/toolchain.sh's answer (cublas-include, cublas-library), or None."""
    done = subprocess.run([os.path.join(ROOT, "accel", "hip", "toolchain.sh"), what], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def compute_capability():
    """This GPU's compute capability as llm.c's Makefile wants it ("90"): GPU_COMPUTE_CAPABILITY,
    else nvidia-smi's lowest, else None."""
    if os.environ.get("GPU_COMPUTE_CAPABILITY"):
        return os.environ["GPU_COMPUTE_CAPABILITY"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout
    except OSError:
        return None
    caps = sorted(int(line.strip().replace(".", "")) for line in out.splitlines() if line.strip())
    return str(caps[0]) if caps else None


def nvcc_root():
    """The CUDA toolkit's root, as nvcc reports it (None without nvcc)."""
    try:
        out = subprocess.run(["nvcc", "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"],
                             capture_output=True, text=True).stderr
    except OSError:
        return None
    return next((line.split("=", 1)[1].strip() for line in out.splitlines() if line.startswith("#$ TOP=")), None)


def make_command(llmc, precision, arch, include, library):
    """The make command that builds one of llm.c's trainers in llmc (arch like "90")."""
    target, _, extra = BUILDS[precision]
    libdir, name = os.path.split(library)
    lt = name.replace("libcublas", "libcublasLt", 1)
    ldflags = [f"-L{libdir}", f"-l:{name}", f"-l:{lt}", "-Xlinker", f"-rpath,{libdir}"]
    root = nvcc_root()
    if root and os.path.exists(os.path.join(root, "include", "nvml.h")):
        ldflags += [f"-L{os.path.join(root, 'lib64', 'stubs')}", "-lnvidia-ml"]
    includes = f"-I{include} -include {os.path.join(HERE, 'llmc_cuda13.h')}"
    return ["make", "-C", llmc, target, *extra, *MAKE_FLAGS, f"GPU_COMPUTE_CAPABILITY={arch}",
            f"NVCC_INCLUDES={includes}", f"NVCC_LDFLAGS={' '.join(ldflags)}"]


def check_checkout(llmc):
    missing = [source for _, source, _ in BUILDS.values() if not os.path.exists(os.path.join(llmc, source))]
    if missing or not os.path.exists(os.path.join(llmc, "Makefile")):
        raise PeerError(f"{llmc} is not a checkout of llm.c (no {', '.join(missing) or 'Makefile'}): "
                        f"set LLMC_DIR / --llmc to one (dev/gpu/README.md)")


def build(llmc, precisions=("fp32", "bf16"), arch=None):
    """Build llm.c's trainers for these precisions in llmc; the binaries' paths."""
    check_checkout(llmc)
    arch = arch or compute_capability()
    include, library = toolchain("cublas-include"), toolchain("cublas-library")
    if dry_run():
        arch, include, library = arch or "ARCH", include or "CUBLAS_INCLUDE", library or "/CUBLAS_LIB/libcublas.so"
    elif arch is None:
        raise PeerError("no GPU's compute capability (nvidia-smi): set GPU_COMPUTE_CAPABILITY=90 to build anyway")
    elif include is None or library is None:
        raise PeerError("no cuBLAS found beside nvcc or in the PyPI wheels (accel/hip/toolchain.sh)")
    binaries = []
    for precision in precisions:
        command = make_command(llmc, precision, arch, include, library)
        print("llm.c:", shlex.join(command), flush=True)
        if not dry_run():
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise PeerError(f"llm.c's {BUILDS[precision][0]} did not build:\n"
                                f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
        binaries.append(os.path.join(llmc, BUILDS[precision][0]))
    return binaries


def step_times(output, warmup):
    """(losses, seconds per step) of a trainer's output: every step line's loss, and the times
    of those after the first `warmup` steps."""
    steps = [(int(m.group(1)), float(m.group(2)), float(m.group(3)) / 1e3)
             for m in map(STEP.match, output.splitlines()) if m]
    if not steps:
        raise PeerError("llm.c printed no step lines")
    return [loss for _, loss, _ in steps], [s for n, _, s in steps if n > warmup]


def time_steps(llmc, precision, params, batch, seq, steps, warmup, seed=0):
    """Run llm.c's trainer at this precision for warmup + steps steps of GPT-2 d12 from params
    (GPT-2 d12's layout, float32); dict(times, losses, command) as bench_gpu.py's workers give."""
    from llmc.formats.llmc import write_checkpoint, write_shard
    from train_gpt2 import GPT2Config
    binary = os.path.join(llmc, BUILDS[precision][0])
    if not os.path.exists(binary) and not dry_run():
        raise PeerError(f"{binary} is not built (python dev/gpu/llmc_peer.py build --llmc {llmc})")
    config = GPT2Config.from_depth(12)
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix="llmc_peer_") as work:
        rng = np.random.default_rng(seed)
        # fp32's trainer runs one epoch: exactly `total` batches of train tokens
        write_shard(os.path.join(work, "train.bin"), rng.integers(0, VOCAB, total * batch * seq + 1))
        write_shard(os.path.join(work, "val.bin"), rng.integers(0, VOCAB, batch * seq + 1))
        data = ["-i", "train.bin", "-j", "val.bin", "-b", str(batch), "-t", str(seq)]
        if precision == "fp32":   # it reads gpt2_124M.bin from its working folder; no step limit
            write_checkpoint(os.path.join(work, "gpt2_124M.bin"), config, params, "float32")
            command = [binary, *data, "-v", "1000000", "-m", "1", "-s", "1000000", "-g", "1"]
        else:
            write_checkpoint(os.path.join(work, "gpt2_d12_bf16.bin"), config, params, "bfloat16")
            command = [binary, "-e", "gpt2_d12_bf16.bin", *data, "-x", str(total), "-v", "1000000", "-m", "1",
                       "-s", "0", "-r", "0"]
        print("llm.c:", shlex.join(command), flush=True)
        if dry_run():
            return dict(times=[], losses=[], command=command)
        done = subprocess.run(command, cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            raise PeerError(f"{shlex.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        losses, times = step_times(done.stdout, warmup)
        device = re.search(r"^\|\s*device\s*\|\s*(.*?)\s*\|$", done.stdout, re.MULTILINE)
        return dict(times=times, losses=losses, command=command, device=device.group(1) if device else "")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["build", "time"])
    p.add_argument("--llmc", default=os.environ.get("LLMC_DIR", os.path.join(ROOT, "shared", "llm.c")),
                   help="llm.c's checkout (default: $LLMC_DIR, else shared/llm.c)")
    p.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    p.add_argument("-b", "--batch", type=int, default=8)
    p.add_argument("-t", "--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--params", help="GPT-2 d12's parameters (.npy, float32); default: random N(0, 0.02)")
    args = p.parse_args(argv)
    precisions = ("fp32", "bf16") if args.precision == "both" else (args.precision,)
    try:
        if args.what == "build":
            build(args.llmc, precisions)
            return 0
        from train_gpt2 import GPT2Config
        check_checkout(args.llmc)
        n = GPT2Config.from_depth(12).num_parameters()
        params = np.load(args.params) if args.params else \
            (np.random.default_rng(0).standard_normal(n) * 0.02).astype(np.float32)
        for precision in precisions:
            r = time_steps(args.llmc, precision, params, args.batch, args.seq, args.steps, args.warmup)
            if r["times"]:
                print(json.dumps(dict(precision=precision, ms=statistics.median(r["times"]) * 1e3,
                                      losses=[r["losses"][0], r["losses"][-1]], device=r["device"])))
    except PeerError as e:
        sys.exit(f"dev/gpu/llmc_peer.py: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
