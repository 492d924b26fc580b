"""accel/hip: the HIP kernels of accel/hip/gpt2.hip, built for the CPU emulator (accel/emu) and
checked without a GPU.

Every entry of the table runs through check:hip-emu (compared with the CPU oracle) at odd shapes,
under every schedule of the emulator and at warp sizes 32 and 64; a model steps at shapes that
make every loop of the kernels wrap; test_gpt2.py --backend hip-emu passes on the committed fixture
and on a fresh d2 reference; --backend hip, the GPU build, refuses in one line naming hip-emu where
only the emulated build is there. Planted faults (built with -D ACCEL_HIP_PLANT_..., the source is not
edited) are caught: a missing barrier, a 32-lane assumption, a write past an output (by the
AddressSanitizer build); flash attention's three (a missing barrier in its tile loop, an
off-by-one causal mask, the wrong key/value head for a query head). The nvcc and hipcc builds are compile-checked where the compilers exist.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import needs
from accel.backend import BackendError, get_backend
from accel.hip import EMU_LIBRARY, NO_GPU_BUILD
from accel.spec import BY_NAME, entries_of
from entries import D12_WIDTHS, SMALL, call_entry, run_every_entry
from hip_emu import (checked, CXX, device, finish, first_mismatch, HIP, make, SCHEDULES,
                     WARP_SIZES)
from train_gpt2 import GPT2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

KERNELS = {name for name in entries_of(("core", "linear", "gpt2", "llama", "classifier", "flash", "cache"))
           if BY_NAME[name].wrap}
FLASH = entries_of(("flash",))
# what a GPT-2 step calls: its loss is the classifier's and its attention flash's (the backend has
# both), not llm.c's softmax and (B,NH,T,T) attention
GPT2_STEP = {name for name in entries_of(("core", "linear", "gpt2", "classifier", "flash")) if BY_NAME[name].wrap} - {
    "softmax_forward", "crossentropy_forward", "crossentropy_softmax_backward", "attention_forward",
    "attention_backward", "flash_attention_gqa_forward", "flash_attention_gqa_backward"}
PLANTS = {"missing_barrier": "ACCEL_HIP_PLANT_MISSING_BARRIER", "warp32": "ACCEL_HIP_PLANT_WARP32",
          "flash_barrier": "ACCEL_HIP_PLANT_FLASH_MISSING_BARRIER", "flash_causal": "ACCEL_HIP_PLANT_FLASH_CAUSAL",
          "flash_kv_head": "ACCEL_HIP_PLANT_FLASH_KV_HEAD"}
# flash attention's tiles (32 rows; 16 in the dk/dv kernel at hs = 64; 16 and 8 at hs = 128) several
# times over, the last one partial, with several query heads per key/value head: odd widths
# (hs = 3), d12's (hs = 64), and Llama's larger heads (hs = 128, multi-query)
FLASH_DIMS = [dict(SMALL, B=2, T=37, C=18, NH=6, NKV=2, hs=3), dict(D12_WIDTHS, B=1, T=67),
              dict(SMALL, B=1, T=20, C=256, NH=2, NKV=1, hs=128)]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The emulated build where the backends look for it, the planted ones, and the
    AddressSanitizer builds (clean, and with the out-of-bounds write), built side by side."""
    tmp = tmp_path_factory.mktemp("hip")
    asan = str(tmp / "asan")
    oob = str(tmp / "oob")
    jobs = [make("emu"), make(f"{asan}/libgpt2_hip_emu.asan.so", build=asan),
            make(f"{oob}/libgpt2_hip_emu.asan.so", build=oob, defines="-DACCEL_HIP_PLANT_OUT_OF_BOUNDS")]
    paths = {"emu": EMU_LIBRARY, "asan": f"{asan}/libgpt2_hip_emu.asan.so",
             "oob": f"{oob}/libgpt2_hip_emu.asan.so"}
    for plant, define in PLANTS.items():
        build = str(tmp / plant)
        jobs.append(make(f"{build}/libgpt2_hip_emu.so", build=build, defines=f"-D{define}"))
        paths[plant] = f"{build}/libgpt2_hip_emu.so"
    finish(*jobs)
    return paths


# --- every kernel against the CPU oracle -------------------------------------------------------

def test_every_entry_matches_the_oracle_under_every_schedule_and_both_warp_sizes(builds):
    for warp_size in WARP_SIZES:
        for schedule in SCHEDULES:
            backend = checked(builds["emu"], schedule, warp_size)
            run_every_entry(backend)
            report = backend.report()
            assert report["mismatches"] == 0, (schedule, warp_size, backend.summary())
            assert all(report["entries"][k]["compared"] > 0 for k in KERNELS), KERNELS - set(report["entries"])


def step_at_wrapping_shapes(backend, seed=0):
    """A forward and backward of a random GPT-2, then the optimizer's entries, at shapes where
    the kernels' loops take several turns on a small device (1 compute unit: grids of at most 8
    blocks of 256 threads): T = 67 score rows (more than a warp's lanes), B T = 268 rows (more
    than a bias chunk's 256), C = 36 channels (more than 32 lanes, not a multiple of 4), 3 heads
    of 12, V = 601 (more than a vocabulary block's 512 threads), arrays longer than 2048."""
    from train_gpt2 import GPT2
    config = GPT2Config(max_seq_len=72, vocab_size=601, padded_vocab_size=640, num_layers=1,
                        num_heads=3, channels=36)
    model = GPT2.random(config, seed=seed, backend=backend)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (4, 68)).astype(np.int32)
    model.forward(tokens[:, :-1], tokens[:, 1:])
    model.zero_grad()
    model.backward()
    # The optimizer from identical inputs on both sides: the model's own update would start from
    # gradients that differ in their last bits, and AdamW divides each gradient by its magnitude,
    # so pure-rounding gradients (the key bias's, exactly zero in exact arithmetic) differ wholly.
    n = 5001
    buffers = []
    for scale in (1.0, 1.0, 0.0, 1.0):   # params, m, v (non-negative), grads
        buffer = backend.alloc(4 * n)
        buffer.load((np.abs(rng.standard_normal(n)) if scale == 0.0 else rng.standard_normal(n)).astype(np.float32))
        buffers.append(buffer)
    backend.call("adamw_update", *buffers, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, 2)
    backend.call("fill", buffers[0], 0.5, n)
    backend.call("mean", buffers[3], n)
    backend.call("global_norm_squared", buffers[3], n)


@pytest.mark.parametrize("warp_size", WARP_SIZES)
def test_every_kernel_at_shapes_where_its_loops_wrap(builds, warp_size):
    backend = checked(builds["emu"], ("shuffled", 3), warp_size, compute_units=1)
    step_at_wrapping_shapes(backend)
    # what the step (flash attention's GPT-2 form) does not call: llm.c's attention, and the
    # grouped-query form, at the step's shapes (3 query heads on 1 key/value head)
    rng = np.random.default_rng(1)
    dims = dict(B=4, T=67, C=36, NH=3, NKV=1, hs=12)
    for name in ("attention_backward", "flash_attention_gqa_backward"):
        call_entry(backend, name, dims, rng)   # and its forward first
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert GPT2_STEP <= set(report["entries"]), GPT2_STEP - set(report["entries"])


def test_flash_attention_across_tiles_under_every_schedule_and_both_warp_sizes(builds):
    """The four flash entries where T spans several query and key tiles (the online softmax
    rescales, the dk/dv blocks visit several query tiles of every head of their group)."""
    for dims in FLASH_DIMS:
        for warp_size in WARP_SIZES:
            for schedule in SCHEDULES if dims is FLASH_DIMS[0] else SCHEDULES[:1] + SCHEDULES[-1:]:
                backend = checked(builds["emu"], schedule, warp_size)
                run_every_entry(backend, dims=dims, groups=("flash",))
                report = backend.report()
                assert report["mismatches"] == 0, (dims, schedule, warp_size, backend.summary())
                assert all(report["entries"][k]["compared"] > 0 for k in FLASH)
                worst = max(report["entries"][k]["worst_ratio"] for k in FLASH)
                assert worst < 0.5, (dims, schedule, warp_size, worst)   # test_check_tolerance's margin


def test_models_run_flash_attention_on_hip():
    """GPT-2 on hip takes the flash path: no (B,NH,T,T) buffers on the device."""
    backend = get_backend("hip-emu")
    assert backend.supports("flash")
    from train_gpt2 import GPT2
    model = GPT2.random(GPT2Config.from_depth(1, max_seq_len=16, vocab_size=50), backend=backend)
    assert model.flash


# --- planted faults ---------------------------------------------------------------------------

def test_missing_barrier_is_caught_by_some_schedules(builds):
    """matmul_backward's bias reduction without its barrier: thread 0 of each column reads the
    other parts' sums before they are written (NaN-poisoned shared memory) when the lowest
    threads run first; highest first, the sums happen to be there: one schedule is not enough."""
    caught = {}
    for schedule in SCHEDULES:
        backend = checked(builds["missing_barrier"], schedule)
        run_every_entry(backend)
        caught[schedule] = first_mismatch(backend)
    assert caught[("lockstep", 1)] == caught[("warp-ahead", 1)] == "matmul_backward", caught
    assert caught[("lockstep-reverse", 1)] is None, caught
    # the correct build passes them all (test above)


def test_32_lane_assumption_is_caught_at_warp_size_64(builds):
    """layernorm_forward's warp sums from offset 16: right with 32 lanes; with 64, channels past
    the 32nd are left out of each row's mean (C = 36 here)."""
    for schedule in SCHEDULES[:2]:
        backend = checked(builds["warp32"], schedule, warp_size=32, compute_units=1)
        step_at_wrapping_shapes(backend)
        assert first_mismatch(backend) is None, backend.summary()
    backend = checked(builds["warp32"], warp_size=64, compute_units=1)
    step_at_wrapping_shapes(backend)
    assert first_mismatch(backend) == "layernorm_forward", backend.summary()


@pytest.mark.parametrize("plant, warp_size, entry", [("missing_barrier", 32, "matmul_backward"),
                                                     ("warp32", 64, "layernorm_forward")])
def test_planted_faults_are_named_at_d12_widths(builds, plant, warp_size, entry):
    """check:'s error model stays tight at d12's widths (C=768, OC=3072): both plants are named."""
    backend = checked(builds[plant], ("lockstep", 1), warp_size)
    run_every_entry(backend, dims=D12_WIDTHS)
    assert first_mismatch(backend) == entry, backend.summary()


def test_flash_missing_barrier_is_caught_under_every_schedule(builds):
    """The forward's tile loop without the barrier after staging K and V: a thread computes
    scores from shared rows other threads have not written yet (NaN-poisoned, or the previous
    tile's), whichever thread runs first."""
    for schedule in SCHEDULES:
        backend = checked(builds["flash_barrier"], schedule)
        run_every_entry(backend, groups=("flash",))
        assert first_mismatch(backend) == "flash_attention_forward", (schedule, backend.summary())


@pytest.mark.parametrize("dims", [SMALL, D12_WIDTHS], ids=["odd", "d12-widths"])
def test_flash_causal_off_by_one_is_caught(builds, dims):
    """Each query also sees the next key (t2 <= t + 1): one term more in every softmax row."""
    backend = checked(builds["flash_causal"], ("shuffled", 1), 64)
    run_every_entry(backend, dims=dims, groups=("flash",))
    assert first_mismatch(backend) == "flash_attention_forward", backend.summary()


@pytest.mark.parametrize("dims", [SMALL, D12_WIDTHS], ids=["odd", "d12-widths"])
def test_flash_wrong_key_value_head_is_caught(builds, dims):
    """Query head h reads key/value head h % NKV instead of h / (NH/NKV): the same when NKV = NH,
    so GPT-2's form passes and Llama's grouped-query form is named."""
    backend = checked(builds["flash_kv_head"])
    run_every_entry(backend, dims=dims, groups=("flash",))
    entries = backend.report()["entries"]
    assert first_mismatch(backend) == "flash_attention_gqa_forward", backend.summary()
    assert entries["flash_attention_forward"]["mismatches"] == entries["flash_attention_backward"]["mismatches"] == 0


ASAN_SCRIPT = """
import sys
from accel import instrument
from accel.hip import device
sys.path.insert(0, {tests!r})
from entries import run_every_entry
backend = instrument.create("check", device.load(sys.argv[1], "hip-emu"))
run_every_entry(backend)
for dims in {flash_dims!r}:   # flash attention's tiles several times over
    run_every_entry(backend, dims=dims, groups=("flash",))
print(backend.summary())
"""


def run_under_asan(library):
    libasan = subprocess.run([CXX, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", ASAN_SCRIPT.format(tests=HERE, flash_dims=FLASH_DIMS), library], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_address_sanitizer_build_runs_every_entry_cleanly(builds):
    done = run_under_asan(builds["asan"])
    assert done.returncode == 0 and "AddressSanitizer" not in done.stderr, done.stderr[-3000:]
    assert "all within tolerance" in done.stdout


def test_address_sanitizer_build_reports_a_write_past_an_output(builds):
    done = run_under_asan(builds["oob"])
    assert done.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr
    assert "WRITE of size 4" in done.stderr
    line = next(i for i, text in enumerate(open(os.path.join(HIP, "gpt2.hip")), 1)
                if "out[N] = to_floatX(0.0f)" in text)
    assert re.search(r"#0 .* in (void )?residual_forward_kernel", done.stderr) and f"gpt2.hip:{line}" in done.stderr


# --- the whole model: test_gpt2.py --------------------------------------------------------------

def run_test_gpt2(*args):
    done = subprocess.run([sys.executable, "test_gpt2.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "overall okay: 1" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("backend", ["hip-emu", "check:hip-emu"])
def test_test_gpt2_passes_on_the_fixture(builds, backend):
    assert "[Backend] " + backend in run_test_gpt2("--backend", backend)


def test_test_gpt2_passes_on_a_fresh_d2_reference(builds, tmp_path):
    needs.package("torch")   # the d2 reference is written by PyTorch
    subprocess.run([sys.executable, "train_gpt2_torch.py", "-e", "d2", "-b", "2", "-t", "9", "-o", str(tmp_path),
                    "--name", "d2"], cwd=ROOT, check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    run_test_gpt2("--backend", "hip-emu", "--model", str(tmp_path / "d2.bin"),
                  "--state", str(tmp_path / "d2_debug_state.bin"))


# --- a bad environment: one line ---------------------------------------------------------------

def test_missing_or_broken_build_is_one_line(tmp_path):
    with pytest.raises(BackendError, match=r"^backend 'hip' is unavailable: cannot load .*nowhere\.so") as e:
        device.load(str(tmp_path / "nowhere.so"), "hip")
    assert "\n" not in str(e.value)
    not_a_library = tmp_path / "libgpt2_hip.so"
    not_a_library.write_text("not an ELF file")
    with pytest.raises(BackendError, match="backend 'hip' is unavailable: cannot load"):
        device.load(str(not_a_library), "hip")


def test_unbuilt_backends_say_how_to_build_them(monkeypatch, tmp_path):
    import accel.hip
    monkeypatch.setattr(accel.hip, "GPU_LIBRARY", str(tmp_path / "none.so"))
    monkeypatch.setattr(accel.hip, "EMU_LIBRARY", str(tmp_path / "none.so"))
    assert accel.hip.unavailable("hip") == NO_GPU_BUILD
    assert "`make hip` on a machine with hipcc or nvcc" in NO_GPU_BUILD
    assert "make hip-emu" in accel.hip.unavailable("hip-emu")


# train.py with the GPU builds looked for where there are none (as in CI, and on a machine that
# has them too): the emulated build is all there is
ONLY_EMULATED_SCRIPT = """
import runpy
import sys
import accel.hip
from accel.hip import device
accel.hip.GPU_LIBRARY = {nowhere!r}
for precision, (_, emulated) in list(device.LIBRARIES.items()):
    device.LIBRARIES[precision] = ({nowhere!r}, emulated)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_hip_with_only_the_emulated_build_refuses_naming_hip_emu(builds, monkeypatch, tmp_path):
    """hip is a GPU: the emulated build runs only as hip-emu, asked for by name, so that an
    emulated run is never taken for a GPU's. Refused in one line, by the registry, by the
    module at each precision, and by train.py (exit status 1)."""
    import accel.hip
    nowhere = str(tmp_path / "libgpt2_hip.so")
    monkeypatch.setattr(accel.hip, "GPU_LIBRARY", nowhere)
    for precision, (_, emulated) in list(device.LIBRARIES.items()):
        assert os.path.exists(emulated)
        monkeypatch.setitem(device.LIBRARIES, precision, (nowhere, emulated))
    refusal = "backend 'hip' is unavailable: " + NO_GPU_BUILD
    assert "--backend hip-emu" in refusal
    for name in ("hip", "check:hip"):
        with pytest.raises(BackendError) as e:
            get_backend(name)
        assert str(e.value).startswith(refusal)
    for precision in device.PRECISIONS:
        with pytest.raises(BackendError, match="no GPU build .*--backend hip-emu") as e:
            device.create(precision)
        assert "\n" not in str(e.value)
    done = subprocess.run([sys.executable, "-c", ONLY_EMULATED_SCRIPT.format(nowhere=nowhere), "train.py",
                           "-e", "d2", "-x", "1", "--backend", "hip"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert lines[0].startswith("train.py: error: " + refusal)


def test_registry_names_the_emulated_build(builds):
    backend = get_backend("hip-emu")
    assert backend.name == "hip-emu" and "emu" in backend.device and not backend.host_visible


# --- the GPU builds: compile checks, and a GPU build loaded where there is no GPU --------------

def toolchain(*args):
    return subprocess.run([os.path.join(HIP, "toolchain.sh"), *args], capture_output=True, text=True)


def test_nvcc_build_compiles_and_says_no_gpu_without_one(tmp_path):
    """Both precisions' libraries: compiled, linked against cuBLAS, loaded."""
    needs.tool("nvcc")
    needs.headers("cuBLAS")
    build = subprocess.run(["make", "-s", "-C", HIP, "gpu", "HIP_PLATFORM=nvidia", "NVCC_ARCH=sm_90",
                            f"BUILD={tmp_path}"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has an NVIDIA GPU: dev/gpu/check_and_time.sh tests the build on it")
    for library, precision in (("libgpt2_hip.so", "fp32"), ("libgpt2_hip_bf16.so", "bf16")):
        with pytest.raises(BackendError, match=r"^backend 'hip' is unavailable: no GPU found \(") as e:
            device.load(str(tmp_path / library), "hip", precision)
        assert "\n" not in str(e.value)


def test_hipcc_compile_check_for_amd(tmp_path):
    needs.tool("hipcc")
    archs = toolchain("amd-archs", "gfx90a")
    if archs.returncode != 0:   # toolchain.sh says why (hipcc's first error)
        pytest.skip(" / ".join(archs.stderr.strip().splitlines()))
    check = subprocess.run(["make", "-s", "-C", HIP, "check-amd", f"BUILD={tmp_path}"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "gpt2.hip compiles with hipcc for gfx90a" in check.stdout


# --- dev/gpu: the timing a real GPU runs (dev/gpu/check_and_time.sh: tests/test_gpu_script.py) ------

def test_gpu_bench_runs_its_whole_flow_on_the_emulator_and_cpu_torch(builds):
    """dev/gpu/bench_gpu.py at both precisions (its dry run and llm.c's side: tests/test_gpu_script.py)."""
    needs.package("torch")   # the bench's other side is PyTorch
    done = subprocess.run([sys.executable, os.path.join("dev", "gpu", "bench_gpu.py"), "--backend", "hip-emu",
                           "--torch-device", "cpu", "-e", "1", "-b", "1", "-t", "8", "--steps", "1", "--warmup", "1",
                           "--no-compile"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llm.pyx fp32 / PyTorch eager fp32:" in done.stdout
    assert re.search(r"^llm\.pyx bf16 / PyTorch eager bf16: .*issue 22's target: at most 0\.6, ", done.stdout, re.MULTILINE)
    # the table's rows end "first .. last" loss: same parameters, same batch, same first loss (at
    # fp32 to 1e-4; at bf16 loosely, llm.pyx's bf16 against autocast's)
    first = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(llm\.pyx (?:fp32|bf16)|PyTorch eager (?:fp32|bf16)) .* (\S+) \.\. \S+$", done.stdout, re.MULTILINE)}
    assert len(first) == 4, done.stdout
    assert abs(first["llm.pyx fp32"] - first["PyTorch eager fp32"]) < 1e-4, done.stdout
    assert abs(first["llm.pyx bf16"] - first["PyTorch eager bf16"]) < 0.05, done.stdout
