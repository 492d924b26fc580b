"""check:'s error model (accel/spec.py) at the shapes users run: every GPU backend passes at
GPT-2 d12's widths with room to spare, and a fault as small as a bf16 store is still named."""
import os
import subprocess
import sys

import pytest

import needs
from accel import instrument
from accel.spec import CHECK_UNITS, UNIT_ROUNDOFF, tolerance
from entries import D12_WIDTHS, SMALL, run_every_entry
from faults import SUBTLE_FAULTS, faulty_cpu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the worst error of a correct kernel may use this share of its tolerance (the margin)
MARGIN = 0.5


def test_tolerance_grows_with_the_reduction_length():
    assert tolerance(1) == 2 * CHECK_UNITS * UNIT_ROUNDOFF
    assert tolerance(768) < tolerance(3072) < 1e-4   # d12's channels and its MLP's


@pytest.mark.parametrize("name", ["hip-emu", "metal-emu"])
@pytest.mark.parametrize("dims", [SMALL, D12_WIDTHS], ids=["odd", "d12-widths"])
def test_every_gpu_entry_is_within_half_its_tolerance(name, dims):
    backend = needs.emulated("check:" + name)
    run_every_entry(backend, dims=dims, seed=3)
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    worst = {k: e["worst_ratio"] for k, e in report["entries"].items() if e["compared"]}
    assert max(worst.values()) < MARGIN, worst


@pytest.mark.parametrize("dims", [SMALL, D12_WIDTHS], ids=["odd", "d12-widths"])
@pytest.mark.parametrize("fault", SUBTLE_FAULTS)
def test_a_bf16_store_is_named_at_every_width(fault, dims):
    backend = instrument.create("check", faulty_cpu(fault))
    run_every_entry(backend, dims=dims, groups=("linear",))
    report = backend.report()
    assert report["first"]["entry"] == fault
    assert report["first"]["rel_error"] > 10 * report["first"]["tolerance"]


@pytest.mark.parametrize("name", ["hip-emu", "metal-emu"])
def test_parity_at_d12_widths_on_a_fresh_reference(name, tmp_path):
    """A 1-layer GPT-2 at C=768 written by PyTorch at B=3, T=7 (the tests never saw it):
    test_gpt2.py passes on check:NAME, every output compared (one layer calls every entry a
    layer calls: what matters here is the widths; metal-emu's simdgroup GEMM costs seconds a
    step in the emulator, so it runs 2 of the 10 steps, each calling every entry)."""
    needs.package("torch")   # the reference is written by PyTorch
    needs.emulator(name)
    subprocess.run([sys.executable, "train_gpt2_torch.py", "-e", "d1", "--channels", "768",
                    "--heads", "12", "--vocab-size", "2003", "--max-seq-len", "64", "-b", "3",
                    "-t", "7", "-o", str(tmp_path), "--name", "w768"], cwd=ROOT, check=True,
                   capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    done = subprocess.run([sys.executable, "test_gpt2.py", "--backend", "check:" + name,
                           *(["--steps", "2"] if name == "metal-emu" else []),
                           "--model", str(tmp_path / "w768.bin"),
                           "--state", str(tmp_path / "w768_debug_state.bin")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "overall okay: 1" in done.stdout, done.stdout[-2000:]
    assert "all within tolerance" in done.stdout
