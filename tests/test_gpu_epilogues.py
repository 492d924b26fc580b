"""dev/gpu's GEMM-epilogue variants (dev/gpu/matmul_epilogues.hip, A/B'd by dev/gpu/ab_epilogues.py)
on the CPU emulator, with the emulated hipBLASLt (accel/emu/blas/hipblaslt_emu.cpp):

- each variant's library, plain and epilogue paths, against float64 NumPy at odd shapes and d12's
  widths, under several schedules at warp sizes 32 and 64, fp32 and bf16 (ab_epilogues.check);
- every entry of each variant's fp32 library through check:hip-emu against the CPU oracle (the
  epilogue paths replace matmul_forward / matmul_backward there), at odd shapes and d12's widths;
- planted faults, built with -D: the bias forgotten (DEFAULT epilogue), the bias gradient of the
  wrong operand (BGRADA: inp's sums, the wrong dimension), the pre-activation not kept (GELU_BIAS);
  each named by the check, and the first two by check:hip-emu too;
- the nvcc builds (cuBLASLt) compile for sm_90 and say there is no GPU (skipped without nvcc); the
  hipcc compile check for gfx90a (skipped without hipcc).
"""
import os
import shutil
import subprocess
import sys

import pytest

import needs
from accel import instrument
from entries import D12_WIDTHS, run_every_entry
from hip_emu import device, finish, HIP, make

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "dev", "gpu"))
import ab_epilogues as ab  # noqa: E402

# planted faults: (variant, defines)
PLANTS = {"missing_bias_no_aux": (1, "-DEPILOGUE_PLANT_MISSING_BIAS -DEPILOGUE_PLANT_NO_AUX"),
          "bgrada": (2, "-DEPILOGUE_PLANT_BGRADA")}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The variants where ab_epilogues.py looks for them, and the planted ones."""
    tmp = tmp_path_factory.mktemp("epilogues")
    jobs = [make("dev-epilogues")]
    paths = {}
    for plant, (variant, defines) in PLANTS.items():
        build = str(tmp / plant)
        paths[plant] = ab.library_path(variant, build=build)
        jobs.append(make(paths[plant], build=build, defines=defines))
    finish(*jobs)
    return paths


def failing(failures):
    """{(case, path, output)} of check()'s failures."""
    return {(row[0], row[2], row[3]) for _, _, _, row in failures}


def test_variants_match_the_reference_under_schedules_and_warp_sizes(builds):
    assert ab.check(precisions=("fp32",)) == []
    assert ab.check(precisions=("bf16",), schedules=ab.SCHEDULES[:1]) == []


@pytest.mark.parametrize("variant", ab.VARIANTS)
def test_every_entry_of_a_variant_through_check_hip_emu(builds, variant):
    path = ab.library_path(variant)
    for warp_size, schedule in ((32, ("lockstep", 1)), (64, ("warp-ahead-reverse", 1))):
        device.configure_emulator(schedule[0], schedule[1], warp_size, 64, library=path)
        backend = instrument.create("check", device.load(path, "hip-emu"))
        run_every_entry(backend)
        run_every_entry(backend, dims=D12_WIDTHS, groups=("linear",))
        report = backend.report()
        assert report["mismatches"] == 0, backend.summary()
        assert report["entries"]["matmul_forward"]["compared"] > 0
        assert report["entries"]["matmul_backward"]["compared"] > 0


def test_forgotten_bias_and_missing_pre_activation_are_caught(builds):
    """Variant 1 with the DEFAULT epilogue (no bias) and the fused GELU without its aux output:
    the epilogue paths fail (the plain ones, in the same library, pass), at odd shapes and d12's."""
    failures = ab.check(precisions=("fp32",), variants=(1,), schedules=ab.SCHEDULES[:1], warp_sizes=(32,),
                        paths={(1, "fp32"): builds["missing_bias_no_aux"]})
    assert failing(failures) == {("matmul_forward", "epilogue", "out"), ("matmul_gelu_forward", "epilogue", "pre")}
    shapes = {row[1] for _, _, _, row in failures}
    assert ab.shape_text(ab.ODD) in shapes and ab.shape_text(ab.D12[0]) in shapes
    backend = instrument.create("check", device.load(builds["missing_bias_no_aux"], "hip-emu"))
    run_every_entry(backend, dims=D12_WIDTHS, groups=("linear",))
    assert backend.report()["first"]["entry"] == "matmul_forward", backend.summary()


def test_bias_gradient_of_the_wrong_operand_is_caught(builds):
    """Variant 2 asking BGRADA (inp's sums: C of them, not dout's OC): dbias wrong, at both shapes."""
    failures = ab.check(precisions=("fp32",), variants=(2,), schedules=ab.SCHEDULES[:1], warp_sizes=(32,),
                        paths={(2, "fp32"): builds["bgrada"]})
    assert failing(failures) == {("matmul_backward", "epilogue", "dbias")}
    assert len({row[1] for _, _, _, row in failures}) == 1 + len(ab.D12)
    backend = instrument.create("check", device.load(builds["bgrada"], "hip-emu"))
    run_every_entry(backend)
    assert backend.report()["first"]["entry"] == "matmul_backward", backend.summary()


def test_emulated_run_of_the_script_checks_only(builds):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "gpu", "ab_epilogues.py"), "--emulated",
                           "--variant", "2", "--precision", "fp32"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checks only" in done.stdout and "ms" not in done.stdout


def test_timing_flow_runs_on_an_emulated_build(builds, capsys):
    """What a GPU run times, run once on the emulator at a small shape for its flow only (the
    script itself never times an emulated build): every case, both paths, a ratio each."""
    for variant in ab.VARIANTS:
        ab.time_library(ab.library_path(variant), variant, "fp32", repeats=1, warmup=1, shapes=[("fc", ab.ODD)])
    lines = [line for line in capsys.readouterr().out.splitlines() if "epilogue/plain" in line]
    assert len(lines) == len(ab.cases_of(1)) + len(ab.cases_of(2)), lines


def test_nvcc_builds_compile_against_cublaslt_and_say_no_gpu(tmp_path):
    needs.tool("nvcc")
    needs.headers("cuBLAS")
    build = subprocess.run(["make", "-s", "-C", HIP, "dev-epilogues-gpu", "HIP_PLATFORM=nvidia", "NVCC_ARCH=sm_90",
                            f"BUILD={tmp_path}"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has an NVIDIA GPU: python dev/gpu/ab_epilogues.py runs on it")
    for variant in ab.VARIANTS:
        for precision in ab.PRECISIONS:
            with pytest.raises(SystemExit, match=r"no GPU found \("):
                ab.Device(ab.library_path(variant, precision, emulated=False, build=str(tmp_path)), precision)


def test_hipcc_compile_check_for_amd(tmp_path):
    needs.tool("hipcc")
    check = subprocess.run(["make", "-s", "-C", HIP, "check-amd-epilogues", "AMD_ARCHS=gfx90a", f"BUILD={tmp_path}"],
                           capture_output=True, text=True)
    if "builds for none of" in check.stderr:   # toolchain.sh says why (hipcc's first error)
        pytest.skip(" / ".join(check.stderr.strip().splitlines()))
    assert check.returncode == 0, check.stderr[-3000:]
    assert "matmul_epilogues.hip (variants 1 2) compiles with hipcc for gfx90a" in check.stdout
