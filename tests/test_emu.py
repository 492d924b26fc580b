"""accel/emu: the CPU emulator of GPU kernels.

The HIP sample kernels in accel/emu/tests/ are compiled by g++ against the emulator (through
accel/emu/Makefile) and run under every schedule and both warp sizes: correct kernels give the
same, right answer under all of them; planted faults (a missing barrier, 32 lanes assumed, a
thread leaving before a barrier, an out-of-bounds write) are caught. The emulated hipBLAS is
checked against a double-precision loop.
"""
import os
import subprocess
from pathlib import Path

import pytest

import needs

EMU = Path(__file__).resolve().parent.parent / "accel" / "emu"
CXX = needs.cxx()
needs.tool("make")
SAMPLES = ["block_reduce", "warp_reduce", "faults", "atomics", "out_of_bounds.asan", "block_reduce.ucontext",
           "hipblas"]
# (EMU_SCHEDULE, EMU_SEED): every schedule, the shuffled one with several seeds.
SCHEDULES = [("lockstep", 1), ("lockstep-reverse", 1), ("warp-ahead", 1), ("warp-ahead-reverse", 1)] + [
    ("shuffled", seed) for seed in (1, 2, 3)
]
WARP_SIZES = (32, 64)
LAUNCH_FAILED = 3  # the samples' exit status when the emulator reported a fault


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("emu")
    result = subprocess.run(
        ["make", "-s", "-j2", "-C", str(EMU), f"BUILD={out}", f"CXX={CXX}"] + [str(out / s) for s in SAMPLES],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    return out


def run(build, sample, *args, schedule=("lockstep", 1), warp_size=32):
    env = dict(os.environ, EMU_SCHEDULE=schedule[0], EMU_SEED=str(schedule[1]), EMU_WARP_SIZE=str(warp_size),
               ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run([str(build / sample), *args], env=env, capture_output=True, text=True, timeout=60)


def source_line(sample, text, after=""):
    """`file:line` of the first line containing `text` that follows the line containing `after`."""
    lines = (EMU / "tests" / f"{sample}.hip").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    line = next(i for i in range(start, len(lines)) if text in lines[i]) + 1
    return f"tests/{sample}.hip:{line}"


def test_block_reduction_passes_every_schedule_and_warp_size(build):
    outputs = set()
    for warp_size in WARP_SIZES:
        for schedule in SCHEDULES:
            result = run(build, "block_reduce", "correct", schedule=schedule, warp_size=warp_size)
            assert result.returncode == 0, (schedule, warp_size, result.stdout, result.stderr)
            outputs.add(result.stdout)
    assert len(outputs) == 1


def test_missing_barrier_after_store_reads_poisoned_shared_memory(build):
    result = run(build, "block_reduce", "no-barrier-after-store")
    assert result.returncode == 1
    assert "nan" in result.stdout  # thread 0 read partial[64] before thread 64 wrote it


def test_missing_barrier_in_loop_is_caught_by_comparing_schedules(build):
    results = [run(build, "block_reduce", "no-barrier-in-loop", schedule=s) for s in SCHEDULES]
    assert len({r.stdout for r in results}) > 1
    assert any(r.returncode == 1 for r in results)
    # Highest thread first happens to be an order in which the tree is right: one schedule is not enough.
    assert results[1].returncode == 0


def test_warp_shuffle_reduction_scan_and_ballot_pass_with_both_warp_sizes(build):
    for warp_size in WARP_SIZES:
        outputs = set()
        for schedule in SCHEDULES:
            result = run(build, "warp_reduce", "correct", schedule=schedule, warp_size=warp_size)
            assert result.returncode == 0, (schedule, warp_size, result.stdout, result.stderr)
            outputs.add(result.stdout)
        assert len(outputs) == 1


def test_kernel_assuming_32_lanes_fails_at_warp_size_64(build):
    assert run(build, "warp_reduce", "offsets-from-16", warp_size=32).returncode == 0
    assert run(build, "warp_reduce", "offsets-from-16", warp_size=64).returncode == 1  # wrong sums

    assert run(build, "warp_reduce", "mask-32", warp_size=32).returncode == 0
    result = run(build, "warp_reduce", "mask-32", warp_size=64)
    assert result.returncode == LAUNCH_FAILED
    assert "__shfl_xor_sync with mask 0xffffffff, which leaves out lanes" in result.stderr
    assert source_line("warp_reduce", "__shfl_xor_sync(0xffffffffu") in result.stderr


def test_thread_returning_before_barrier_is_reported(build):
    for schedule in SCHEDULES:
        result = run(build, "faults", "early-return", schedule=schedule)
        assert result.returncode == LAUNCH_FAILED
        report = result.stderr
        assert "kernel 'scale_early_return' block (1,0,0): thread (" in report  # threads 44.. of block 1 leave
        assert "exited while 44 threads wait at __syncthreads() at" in report
        assert source_line("faults", "__syncthreads();", after="void scale_early_return") in report


def test_barriers_at_different_lines_are_reported(build):
    result = run(build, "faults", "divergent-barriers")
    assert result.returncode == LAUNCH_FAILED
    assert "kernel 'divergent_barriers' block (0,0,0): divergent barriers:" in result.stderr
    first = source_line("faults", "__syncthreads();", after="void divergent_barriers")
    second = source_line("faults", "__syncthreads();", after="else")
    assert first in result.stderr and second in result.stderr


def test_lane_leaving_before_warp_shuffle_is_reported(build):
    result = run(build, "faults", "exit-before-shuffle")
    assert result.returncode == LAUNCH_FAILED
    assert "exited while 20 lanes of its warp wait at __shfl_xor at" in result.stderr
    assert source_line("faults", "__shfl_xor(") in result.stderr


def test_atomics_give_exact_totals_under_every_schedule(build):
    outputs = set()
    for schedule in SCHEDULES + [("shuffled", seed) for seed in (4, 5, 6)]:
        result = run(build, "atomics", schedule=schedule)
        assert result.returncode == 0, (schedule, result.stdout)
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_address_sanitizer_build_reports_out_of_bounds_write(build):
    clean = run(build, "out_of_bounds.asan", "in-bounds")  # fibers, shared memory, shuffles: no false alarm
    assert clean.returncode == 0 and "AddressSanitizer" not in clean.stderr, clean.stderr
    result = run(build, "out_of_bounds.asan", "one-past-the-end")
    assert result.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in result.stderr
    assert source_line("out_of_bounds", "out[i] = 1.0f") in result.stderr


def test_ucontext_fibers_agree_with_the_native_switch(build):
    native = run(build, "block_reduce", "correct").stdout
    for schedule in SCHEDULES:
        result = run(build, "block_reduce.ucontext", "correct", schedule=schedule, warp_size=64)
        assert result.returncode == 0 and result.stdout == native


def test_emulated_hipblas_matches_a_double_loop_and_refuses_bad_arguments(build):
    result = run(build, "hipblas")
    assert result.returncode == 0, result.stdout
    assert result.stdout.count(" ok\n") == 13
