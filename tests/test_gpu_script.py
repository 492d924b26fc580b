"""
dev/gpu: the check a lent GPU machine runs (check_and_time.sh), its list of wheels, and llm.c as
the peer (llmc_peer.py), checked without a GPU: the dry runs list every step with the commands
the issue asks for, llm.c's build is llm.c's own Makefile with cuDNN, NCCL and MPI off, its step
lines are read as its two trainers print them, and a fake llm.c checkout's trainers are run the
way the real ones are (their working folder, their checkpoints, their flags).
"""
import os
import re
import stat
import subprocess
import sys

import numpy as np
import pytest

import needs
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPU = os.path.join(ROOT, "dev", "gpu")
sys.path.insert(0, os.path.join(ROOT, "dev"))
import ensure_requirements  # noqa: E402
from dev.gpu import llmc_peer  # noqa: E402

STEPS = ["wheels", "build-product", "build-hip", "build-llmc", "reference-gpt2", "parity-gpt2", "parity-gpt2-bf16",
         "reference-llama", "parity-llama", "parity-llama-bf16", "data", "train-gpt2", "train-llama", "bench-gpt2",
         "bench-llama"]


def check_and_time(tmp_path, **env):
    script = os.path.join(GPU, "check_and_time.sh")
    return subprocess.run(["bash", script], env=dict(os.environ, DRY_RUN="1", OUT=str(tmp_path / "out"), **env),
                          capture_output=True, text=True, timeout=120)


def steps_of(stdout):
    return [line.split(":", 1)[0][3:] for line in stdout.splitlines() if line.startswith("== ")]


@pytest.fixture
def fake_llmc(tmp_path):
    """A folder that looks like llm.c's checkout: its Makefile and the two trainers' sources."""
    llmc = tmp_path / "llm.c"
    llmc.mkdir()
    for name in ("Makefile", "train_gpt2.cu", "train_gpt2_fp32.cu"):
        (llmc / name).write_text("")
    return llmc


def test_dry_run_lists_every_step_with_the_issues_shapes(tmp_path):
    assert subprocess.run(["bash", "-n", os.path.join(GPU, "check_and_time.sh")]).returncode == 0
    done = check_and_time(tmp_path, LLMC_DIR=str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    assert steps_of(done.stdout) == [s for s in STEPS if s != "build-llmc"]
    assert f"llm.c: no checkout at {tmp_path / 'none'}" in done.stdout
    out = done.stdout
    assert "pip install --no-index --find-links dev/gpu/wheels -r dev/gpu/wheels.txt" in out
    assert "== build-hip: make hip" in out and "NVCC_ARCH=" in out
    assert "train_gpt2_torch.py -e d12 -b 4 -t 64" in out and "train_llama2_torch.py -e stories110M" in out
    assert re.search(r"== parity-gpt2-bf16: \S+ test_gpt2.py --backend hip --precision bf16", out)
    assert re.search(r"== parity-llama: \S+ test_llama2.py --backend hip --model", out)
    assert re.search(r"train.py -e d12 --backend hip -b 8 -t 1024 -x 20 .*--precision bf16", out)
    assert re.search(r"train.py --model stories110M --backend hip -b 8 -t 1024 -x 20 .*--precision bf16", out)
    assert "bench_gpu.py -e 12 -b 8 -t 1024 --json" in out
    assert "bench_gpu.py --model stories110M -b 8 -t 1024" in out


def test_dry_run_with_an_llmc_checkout_builds_and_times_it(tmp_path, fake_llmc):
    done = check_and_time(tmp_path, LLMC_DIR=str(fake_llmc), STEPS="build-llmc bench-gpt2 bench-llama")
    assert done.returncode == 0, done.stderr
    assert steps_of(done.stdout) == ["build-llmc", "bench-gpt2", "bench-llama"]
    assert f"llmc_peer.py build --llmc {fake_llmc}" in done.stdout
    assert f"bench_gpu.py -e 12 -b 8 -t 1024 --llmc {fake_llmc}" in done.stdout
    assert "--llmc" not in done.stdout.split("== bench-llama")[1]


def test_bench_flags_pass_through(tmp_path):
    done = check_and_time(tmp_path, STEPS="bench-gpt2 bench-llama", BENCH_FLAGS="--no-compile --steps 5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("-b 8 -t 1024 --no-compile --steps 5") == 2


def test_an_unknown_step_is_one_line(tmp_path):
    done = check_and_time(tmp_path, STEPS="build-product parity")
    assert done.returncode == 2 and done.stderr.startswith("check_and_time.sh: no step 'parity' (steps: wheels ")
    assert done.stderr.count("\n") == 1


def test_the_wheels_and_what_the_machine_has_cover_every_required_package():
    with open(os.path.join(GPU, "wheels.txt")) as f:
        text = f.read()
    has = next(line for line in text.splitlines() if line.startswith("# has:")).split()[2:]
    brought = [line for line, _ in ensure_requirements.requirements(os.path.join(GPU, "wheels.txt"))]
    names = {ensure_requirements.REQUIREMENT.match(line).group(1).lower() for line in brought}
    names |= {n.lower() for n in has}
    required = [line for line, optional in ensure_requirements.requirements(os.path.join(ROOT, "requirements.txt"))
                if not optional]
    assert required
    for line in required:
        assert ensure_requirements.REQUIREMENT.match(line).group(1).lower() in names, line
    assert "mkl" not in names and "nvidia-cublas" not in names   # too big to travel


# --- llm.c as the peer ------------------------------------------------------------------------------

def test_llmc_build_is_llmcs_makefile_without_cudnn_nccl_or_mpi(fake_llmc):
    done = subprocess.run([sys.executable, os.path.join(GPU, "llmc_peer.py"), "build", "--llmc", str(fake_llmc)],
                          env=dict(os.environ, DRY_RUN="1", GPU_COMPUTE_CAPABILITY="90"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fp32, bf16 = [line for line in done.stdout.splitlines() if line.startswith("llm.c: make")]
    for line in (fp32, bf16):
        assert f"make -C {fake_llmc}" in line
        assert "USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90" in line
        assert "-include " + os.path.join(GPU, "llmc_cuda13.h") in line
        assert "-l:libcublasLt" in line
    assert " train_gpt2fp32cu " in fp32 and "PRECISION" not in fp32
    assert " train_gpt2cu PRECISION=BF16 " in bf16


def test_llmc_peer_refuses_what_is_not_a_checkout_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, os.path.join(GPU, "llmc_peer.py"), "build", "--llmc", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == (f"dev/gpu/llmc_peer.py: {tmp_path} is not a checkout of llm.c (no train_gpt2_fp32.cu, "
                           f"train_gpt2.cu): set LLMC_DIR / --llmc to one (dev/gpu/README.md)\n")


# the step lines as llm.c's trainers print them (train_gpt2_fp32.cu, train_gpt2.cu's printf formats)
FP32_LINES = "val loss 10.9\nstep    1/4: train loss 10.950000 (120.500000 ms, 34000 tok/s)\n" \
             "step    2/4: train loss 10.800000 (100.250000 ms, 40000 tok/s)\n" \
             "step    3/4: train loss 10.700000 (101.000000 ms, 40000 tok/s)\n" \
             "step    4/4: train loss 10.600000 (99.000000 ms, 41000 tok/s)\ntotal average iteration time: 105 ms\n"
BF16_LINES = "step    1/3 | loss 10.985000 (+0.00z)| norm 15.2000 (+0.00z)| lr 3.00e-04 | 80.10 ms | 30.1% bf16 MFU " \
             "| 100000 tok/s\nstep    2/3 | loss 10.900000 (+0.00z)| norm 14.1000 (-0.71z)| lr 3.00e-04 | 40.50 ms | " \
             "45.0% bf16 MFU | 200000 tok/s\nstep    3/3 | loss 10.800000 (-1.00z)| norm 13.0000 (-1.00z)| " \
             "lr 3.00e-04 | 41.00 ms | 45.0% bf16 MFU | 199000 tok/s\n"


def test_llmc_step_lines_of_both_trainers():
    losses, times = llmc_peer.step_times(FP32_LINES, warmup=1)
    assert losses == [10.95, 10.8, 10.7, 10.6] and times == pytest.approx([0.10025, 0.101, 0.099])
    losses, times = llmc_peer.step_times(BF16_LINES, warmup=2)
    assert losses == [10.985, 10.9, 10.8] and times == pytest.approx([0.041])
    with pytest.raises(llmc_peer.PeerError, match="no step lines"):
        llmc_peer.step_times("val loss 10.9\n", warmup=0)


def fake_trainer(path, lines, record):
    """A script in place of one of llm.c's trainers: it records its flags and the header of the
    checkpoint it would read (its working folder's gpt2_124M.bin, or -e's), and prints lines."""
    path.write_text(f"""#!/usr/bin/env bash
printf '%s ' "$@" > {record}.args
ckpt=gpt2_124M.bin
while [ $# -gt 0 ]; do [ "$1" = -e ] && ckpt=$2; shift; done
head -c 16 "$ckpt" > {record}.header
printf '| device                | Fake GPU                                           |\\n'
printf '%s' '{lines}'
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_llmc_trainers_run_from_the_parameters_given(tmp_path, fake_llmc):
    from llmc.formats.llmc import MODEL_MAGIC
    from train_gpt2 import GPT2Config
    params = np.zeros(GPT2Config.from_depth(12).num_parameters(), np.float32)
    fake_trainer(fake_llmc / "train_gpt2fp32cu", FP32_LINES, tmp_path / "fp32")
    fake_trainer(fake_llmc / "train_gpt2cu", BF16_LINES, tmp_path / "bf16")
    fp32 = llmc_peer.time_steps(str(fake_llmc), "fp32", params, 2, 16, steps=3, warmup=1)
    bf16 = llmc_peer.time_steps(str(fake_llmc), "bf16", params, 2, 16, steps=1, warmup=2)
    assert fp32["times"] == pytest.approx([0.10025, 0.101, 0.099]) and fp32["device"] == "Fake GPU"
    assert bf16["times"] == pytest.approx([0.041]) and bf16["losses"][0] == 10.985
    # fp32: gpt2_124M.bin in its folder, version 3; bf16: -e a version 5 file, -x the steps, no recompute
    for name, version in (("fp32", 3), ("bf16", 5)):
        assert list(np.fromfile(tmp_path / f"{name}.header", np.int32)[:2]) == [MODEL_MAGIC, version]
    assert (tmp_path / "fp32.args").read_text().split()[:6] == ["-i", "train.bin", "-j", "val.bin", "-b", "2"]
    bf16_args = (tmp_path / "bf16.args").read_text()
    assert "-e gpt2_d12_bf16.bin" in bf16_args and "-x 3 " in bf16_args and "-r 0" in bf16_args


def test_the_build_steps_pass_with_only_the_machines_packages_and_the_wheels():
    """dev/gpu/bare_box.py, one module built (the whole product: run it by hand, dev/gpu/README.md)."""
    wheels = os.path.join(GPU, "wheels")
    if not any(name.endswith(".whl") for name in os.listdir(wheels)):
        pytest.skip("no wheels in dev/gpu/wheels (bash dev/gpu/check_and_time.sh --download)")
    done = subprocess.run([sys.executable, os.path.join(GPU, "bare_box.py"), "--only", "kernels.blas"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("dev/ensure_requirements.py: optional")]
    assert len(skipped) == 1 and "skipped (PIP_NO_INDEX: pip reaches no index)" in skipped[0]
    assert "kernels.blas: OpenBLAS (scipy-openblas32)" in done.stdout


def test_bench_gpu_puts_llmc_beside_llmpyx_and_pytorch(tmp_path, fake_llmc):
    """bench_gpu.py --llmc's whole flow, on the CPU: llm.pyx's CPU backend, PyTorch on the CPU,
    and a fake llm.c checkout's trainers (the rows, the ratios, issue 22's targets)."""
    needs.package("torch")   # the bench's other side is PyTorch
    fake_trainer(fake_llmc / "train_gpt2fp32cu", FP32_LINES, tmp_path / "fp32")
    fake_trainer(fake_llmc / "train_gpt2cu", BF16_LINES, tmp_path / "bf16")
    done = subprocess.run([sys.executable, os.path.join(GPU, "bench_gpu.py"), "--backend", "cpu",
                           "--torch-device", "cpu",
                           "-e", "12", "-b", "1", "-t", "8", "--steps", "1", "--warmup", "1", "--no-compile",
                           "--llmc", str(fake_llmc), "--json", str(tmp_path / "bench.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^(llm\.pyx|PyTorch eager|llm\.c) (fp32|bf16) +[0-9.]+ ", done.stdout, re.MULTILINE)
    assert sorted(rows) == sorted((side, p) for side in ("llm.pyx", "PyTorch eager", "llm.c") for p in ("fp32", "bf16"))
    assert re.search(r"^llm\.c fp32 +100\.2 .*\(TF32 on: llm\.c's own choice\)$", done.stdout, re.MULTILINE)
    assert re.search(r"^llm\.pyx bf16 / llm\.c bf16: .*issue 22's target: at most 1\.0, (met|NOT met)$", done.stdout,
                     re.MULTILINE)
    assert re.search(r"^llm\.pyx fp32 / llm\.c fp32: ", done.stdout, re.MULTILINE)
    assert "-e 12" not in done.stdout


def test_bench_gpu_refuses_llmc_for_another_model():
    done = subprocess.run([sys.executable, os.path.join(GPU, "bench_gpu.py"), "--model", "stories110M", "--llmc", "x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--llmc times GPT-2 d12 only" in done.stderr
