"""kernels.blas: the GEMM library the kernels call, chosen by LLMPYX_BLAS (openblas, mkl, auto).

Each choice runs in its own process (the library is chosen once, at import): kernels.matmul's
forward and backward against the float64 reference at an odd shape, on both libraries where
MKL is installed, and the one-line errors of a bad choice."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = r"""
import numpy as np
from kernels import blas, matmul
from kernels import reference as R
rng = np.random.default_rng(0)
B, T, C, OC = 3, 37, 29, 53
inp = rng.standard_normal((B, T, C), dtype=np.float32)
weight = rng.standard_normal((OC, C), dtype=np.float32)
bias = rng.standard_normal(OC, dtype=np.float32)
dout = rng.standard_normal((B, T, OC), dtype=np.float32)
out = np.empty((B, T, OC), np.float32)
matmul.forward(out, inp, weight, bias)
dinp = np.ones((B, T, C), np.float32)
dweight = np.ones((OC, C), np.float32)
dbias = np.ones(OC, np.float32)
matmul.backward(dinp, dweight, dbias, dout, inp, weight)
want = R.matmul_forward(inp, weight, bias)
dinp_w, dweight_w, dbias_w = R.matmul_backward(np.ones((B, T, C)), np.ones((OC, C)), np.ones(OC),
                                              dout, inp, weight)
for got, ref in ((out, want), (dinp, dinp_w), (dweight, dweight_w), (dbias, dbias_w)):
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), np.abs(got - ref).max()
print(blas.LIBRARY)
"""


def run(choice, code=CHECK):
    env = dict(os.environ, LLMPYX_BLAS=choice, OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_openblas_is_always_there_and_right():
    done = run("openblas")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OpenBLAS (scipy-openblas32)"


def test_mkl_when_installed_is_right():
    done = run("mkl")
    if done.returncode != 0 and "no libmkl_rt was found" in done.stderr:
        pytest.skip("MKL is not installed here (requirements.txt installs it on x86_64 Linux)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("MKL ") and "(sequential)" in done.stdout


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU vendor from Linux's /proc/cpuinfo")
def test_auto_takes_mkl_on_intel_cpus_only():
    done = run("auto")
    assert done.returncode == 0, done.stderr
    with open("/proc/cpuinfo") as f:
        intel = "GenuineIntel" in f.read()
    has_mkl = run("mkl").returncode == 0
    want = "MKL " if intel and has_mkl else "OpenBLAS "
    assert done.stdout.strip().startswith(want)


def test_a_bad_choice_is_one_clear_error():
    done = run("atlas")
    assert done.returncode != 0
    assert "LLMPYX_BLAS='atlas': expected openblas, mkl or auto" in done.stderr.strip().splitlines()[-1]


def test_train_py_reports_a_bad_choice_in_one_line(tmp_path):
    env = dict(os.environ, LLMPYX_BLAS="atlas")
    done = subprocess.run([sys.executable, "train.py", "-e", "d2", "-x", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: kernels.blas: LLMPYX_BLAS=")


THREADED_FIRST = r"""
import ctypes, os, sys
mkl = ctypes.CDLL(os.path.join(sys.prefix, "lib", "libmkl_rt.so.3"))
mkl.MKL_Set_Threading_Layer(0)   # MKL_THREADING_INTEL: threads of its own
x = (ctypes.c_double * 4)(1, 2, 3, 4)
mkl.cblas_ddot(4, x, 1, x, 1)    # MKL has run: its layers are fixed for the process
from kernels import blas
print(blas.LIBRARY)
"""


def test_mkl_already_threaded_in_the_process_is_not_used():
    """MKL running its own threads inside our OpenMP threads would oversubscribe the cores:
    auto falls back to OpenBLAS, LLMPYX_BLAS=mkl says why in one line."""
    if not os.path.exists(os.path.join(sys.prefix, "lib", "libmkl_rt.so.3")):
        pytest.skip("the mkl wheel is not installed in this environment")
    done = run("auto", THREADED_FIRST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OpenBLAS (scipy-openblas32)"
    done = run("mkl", THREADED_FIRST)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(
        "MKL already runs with threads of its own in this process; or use LLMPYX_BLAS=openblas")
