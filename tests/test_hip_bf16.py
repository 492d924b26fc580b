"""accel/hip at bf16: gpt2.hip built with -DACCEL_HIP_BF16 for the CPU emulator
(libgpt2_hip_emu_bf16.so), against the CPU's bf16 table (accel/cpu.pyx) on the same inputs: the
one check: compares with (create(oracle=True)), whose flash attention is the fp32 kernel on
widened copies, not the CPU's bf16 kernel, which rounds its probabilities to bf16 inside.

check: compares fp32 tables only, so the comparison is here: every entry of the bf16 table is
called on both backends with the same bf16 inputs (bf16 buffers hold uint16 bits; the arguments
come from accel/spec.py as tests/entries.py makes them) under every schedule of the emulator at
warp sizes 32 and 64, and at d12's widths; a GPT-2 d2 trains 3 steps at bf16 on both;
narrow_params rounds bit for bit as the CPU does; a planted fault (gelu_forward's stores
truncating instead of rounding) is caught; the AddressSanitizer build runs every entry cleanly.

The tolerance. Both sides compute a bf16 entry in float32 from the same bf16 values and round each
output once to nearest even (gpt2.hip; accel/cpu.pyx's bf16 table), so before the rounding they
differ by float32's reordering only: check:'s error model, spec.tolerance(K) of the output's
largest magnitude for a reduction of K terms. Rounding to bf16 turns that into a difference only
where the two float32 values straddle a rounding midpoint, and then by one bf16 step of the
element (2^-8 of it at most). So each element of a bf16 output may differ by one bf16 step of its
own value plus float32's reordering error, and the elements whose bits differ at all must be few
(ONE_IN: at most 1 in 50; seen: none at the small shapes under every schedule and warp size, at
most 1 in 5,900 at d12's widths). A store that truncates instead of rounding stays within one
step too, but changes about half the elements: the count is what catches it. float32 outputs
(statistics, probabilities, losses, parameter gradients) are compared as check: does, within
spec.tolerance(K).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from accel import cpu, instrument
from accel.backend import BackendError, get_backend
from accel.hip import EMU_LIBRARY_BF16
from accel.spec import BY_NAME, ORDER, evaluate, tolerance
from entries import D12_WIDTHS, SMALL, host_data, numbers, run_every_entry
from hip_emu import adamw_steps, CXX, device, finish, make, SCHEDULES, WARP_SIZES
from kernels.bf16 import to_bf16, to_float32
from train_gpt2 import GPT2, GPT2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# at most one element in ONE_IN of a bf16 output may have other bits than the CPU's (see above)
ONE_IN = 50
KERNELS = [name for name in ORDER if BY_NAME[name].wrap and BY_NAME[name].group in (
    "core", "linear", "gpt2", "llama", "classifier", "flash", "cache", "bf16")]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The emulated bf16 build where the backends look for it, one with the planted fault, and one
    under AddressSanitizer, built side by side."""
    truncating = str(tmp_path_factory.mktemp("hip_bf16_truncate"))
    asan = str(tmp_path_factory.mktemp("hip_bf16_asan"))
    paths = {"emu": EMU_LIBRARY_BF16, "truncate": f"{truncating}/libgpt2_hip_emu_bf16.so",
             "asan": f"{asan}/libgpt2_hip_emu_bf16.asan.so"}
    jobs = [make("emu-bf16"), make(paths["truncate"], build=truncating, defines="-DACCEL_HIP_PLANT_BF16_TRUNCATE"),
            make(paths["asan"], build=asan)]
    finish(*jobs)
    return paths


def emulated(library, schedule=("lockstep", 1), warp_size=32, compute_units=64):
    """A fresh bf16 context of the emulated build at `library`, the emulator configured first."""
    device.configure_emulator(schedule[0], schedule[1], warp_size, compute_units, library=library)
    return device.load(library, "hip-emu", "bf16")


# --- every entry on both backends ---------------------------------------------------------------

def dtype_of(arg):
    return {"float32": np.float32, "bfloat16": np.uint16, "int32": np.int32}[arg.dtype("bf16")]


def host_input(arg, values, rng):
    """An input as entries.fill makes it, on the host: bf16 arguments as their bits."""
    data = host_data(arg, values, rng)
    return to_bf16(data) if arg.floatx else data


def call(backend, name, host, values):
    """The entry on backend from host arrays: (what it returns, {output name: host copy})."""
    entry = BY_NAME[name]
    buffers = {}
    for a in entry.args:
        if a.pointer and host.get(a.name) is not None:
            buffers[a.name] = backend.alloc(host[a.name].nbytes)
            buffers[a.name].load(host[a.name])
    result = backend.call(name, *[buffers.get(a.name) if a.pointer else values[a.name] for a in entry.args])
    backend.check_error()
    outputs = {a.name: buffers[a.name].to_numpy(dtype_of(a)) for a in entry.outputs if a.name in buffers}
    return result, outputs


def cases(cpu, seed=0, dims=SMALL, names=KERNELS):
    """Each entry's call (and a second without its optional pointers where it has some) with its
    inputs, and what the CPU's bf16 table makes of them: [(name, values, host inputs, (result,
    outputs))]. A backward's saved activations (init=forward) are the CPU forward's outputs."""
    rng = np.random.default_rng(seed)
    made = []
    for name in names:
        entry = BY_NAME[name]
        for with_optional in (True, False) if any(a.optional for a in entry.args) else (True,):
            values = dict(numbers(name, dims), first=1000, seed=5)
            host = {a.name: host_input(a, values, rng) for a in entry.args
                    if a.pointer and a.init != "forward" and (with_optional or not a.optional)}
            if any(a.init == "forward" for a in entry.args):
                forward = BY_NAME[name.replace("_backward", "_forward")]
                inputs = {a.name: host.get(a.name) if a.name in host else host_input(a, values, rng)
                          for a in forward.args if a.pointer}
                _, saved = call(cpu, forward.name, inputs, values)
                for a in entry.args:
                    if a.init == "forward":
                        host[a.name] = saved[a.name]
            made.append((name, values, host, call(cpu, name, host, values)))
    return made


def causal_mask(values, shape):
    """Where a (..., T, T) causal output is compared: t2 <= t."""
    T = values["T"]
    rows = np.arange(T)[:, None] >= np.arange(T)[None, :]
    return np.broadcast_to(rows, (shape[0] // (T * T), T, T)).reshape(-1)


def compare(name, arg, values, got, want):
    """Why a backend's output differs from the CPU's beyond the tolerance, or None; and the
    fraction of a bf16 output's elements whose bits differ."""
    if arg.causal:
        mask = causal_mask(values, want.shape)
        got, want = got[mask], want[mask]
    if want.size == 0:
        return None, 0.0
    bf16 = want.dtype == np.uint16
    g, w = (to_float32(got), to_float32(want)) if bf16 else (got, want)
    scale = float(np.max(np.abs(w)))
    allowed = tolerance(evaluate(arg.reduction, values)) * scale
    if bf16:
        exponent = np.frexp(np.abs(w))[1]
        allowed = allowed + np.where(w == 0, 0.0, np.ldexp(1.0, exponent - 8))   # one bf16 step of each
    error = np.abs(g.astype(np.float64) - w)
    differ = float(np.mean(got != want)) if bf16 else 0.0
    if not np.all(error <= allowed):
        worst = int(np.argmax(error - allowed))
        return (f"{name}.{arg.name}: element {worst} is {g[worst]!r}, the CPU's {w[worst]!r} (allowed "
                f"{allowed if np.isscalar(allowed) else allowed[worst]:.3g})"), differ
    if differ * ONE_IN > 1:
        return (f"{name}.{arg.name}: {differ:.1%} of its bf16 elements differ from the CPU's (at most "
                f"1 in {ONE_IN}: a rounding other than the CPU's nearest-even, once)"), differ
    return None, differ


def mismatches(backend, made):
    """Every entry of `made` on backend, compared: ([problems], {entry: largest fraction of bf16
    elements that differ})."""
    problems, differ = [], {}
    for name, values, host, (want_result, want) in made:
        result, got = call(backend, name, host, values)
        entry = BY_NAME[name]
        if entry.returns != "void":
            allowed = tolerance(evaluate(entry.reduction, values)) * abs(want_result)
            if not abs(result - want_result) <= allowed:
                problems.append(f"{name} returned {result!r}, the CPU {want_result!r}")
        for a in entry.outputs:
            if a.name in want:
                problem, fraction = compare(name, a, values, got[a.name], want[a.name])
                differ[name] = max(differ.get(name, 0.0), fraction)
                if problem:
                    problems.append(problem)
    return problems, differ


def oracle():
    """The CPU's bf16 table as check:'s oracle (accel/cpu.pyx's ROUNDED_INSIDE widened)."""
    return cpu.create(precision="bf16", oracle=True)


@pytest.fixture(scope="module")
def made():
    return cases(oracle())


def test_every_bf16_entry_matches_the_cpu_under_every_schedule_and_both_warp_sizes(builds, made):
    assert {name for name, *_ in made} == set(KERNELS)
    for warp_size in WARP_SIZES:
        for schedule in SCHEDULES:
            problems, _ = mismatches(emulated(builds["emu"], schedule, warp_size), made)
            assert not problems, (schedule, warp_size, problems)


def test_every_bf16_entry_matches_the_cpu_at_d12_widths(builds):
    """At GPT-2 d12's widths (C = 768, OC = 3072, V = 50257; B T = 15) the float32 sums are long
    and more elements land near a rounding midpoint: seen, at most 1 in 5,900 of an output's bits
    differ (matmul's, layernorm's)."""
    problems, _ = mismatches(emulated(builds["emu"]), cases(oracle(), dims=D12_WIDTHS))
    assert not problems, problems


FLASH = [name for name in KERNELS if BY_NAME[name].group == "flash"]
# flash attention's tiles (32 rows, 16 in the dk/dv kernel at hs = 64) several times over, the
# last one partial: T = 37 at odd widths (hs = 3, 6 heads on 2 key/value heads), T = 67 at d12's
FLASH_DIMS = [dict(SMALL, B=2, T=37, C=18, NH=6, NKV=2, hs=3), dict(D12_WIDTHS, B=1, T=67)]


@pytest.mark.parametrize("dims", FLASH_DIMS, ids=["odd", "d12"])
def test_bf16_flash_attention_across_tiles(builds, dims):
    """Flash attention's four entries where T spans several tiles, at both warp sizes: each
    gradient summed in float32 over every tile and rounded to bf16 once, as the CPU's."""
    made = cases(oracle(), dims=dims, names=FLASH)
    for warp_size in WARP_SIZES:
        problems, _ = mismatches(emulated(builds["emu"], ("shuffled", 6), warp_size), made)
        assert not problems, (warp_size, problems)


def test_a_truncating_bf16_store_is_caught(builds, made):
    """gelu_forward's stores drop the low 16 bits instead of rounding: each element within one bf16
    step of the CPU's, but about half of them one step off; every other entry still matches."""
    problems, differ = mismatches(emulated(builds["truncate"]), made)
    assert len(problems) == 1 and problems[0].startswith("gelu_forward.out: "), problems
    assert differ["gelu_forward"] > 0.3, differ
    assert "differ from the CPU's" in problems[0]


ASAN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_hip_bf16 as t
problems, _ = t.mismatches(t.emulated(sys.argv[1], ("shuffled", 3), 64, 1), t.cases(t.oracle()))
assert not problems, problems
print("every bf16 entry ran")
"""


def test_address_sanitizer_build_runs_every_bf16_entry_cleanly(builds):
    """The packed loads and stores, the odd last elements and the scratch arrays stay inside their
    buffers (one compute unit: the grid-stride loops wrap)."""
    libasan = subprocess.run([CXX, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    root = os.path.dirname(HERE)
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", ASAN_SCRIPT.format(tests=HERE), builds["asan"]], env=env,
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0 and "AddressSanitizer" not in done.stderr, done.stderr[-3000:]
    assert "every bf16 entry ran" in done.stdout


# --- narrow_params: the CPU's rounding, bit for bit ----------------------------------------------

def test_narrow_params_rounds_bit_for_bit_as_the_cpu(builds):
    rng = np.random.default_rng(3)
    n = 20011   # longer than the grid at one compute unit, odd
    master = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    # ties (to even, both ways), the largest finite values, infinities, zeros, subnormals, NaN
    special = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8), 3.3895314e38, -3.3895314e38,
                        np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, np.nan], dtype=np.float32)
    master[:special.size] = special
    backends = {"cpu": get_backend("cpu", "bf16"), "hip": emulated(builds["emu"], compute_units=1)}
    for seed, first in ((-1, 0), (0, 0), (7, 123456789)):
        got = {}
        for key, backend in backends.items():
            params, weights = backend.alloc(2 * n), backend.alloc(4 * n)
            weights.load(master)
            backend.call("narrow_params", params, weights, n, first, seed)
            backend.check_error()
            got[key] = params.to_numpy(np.uint16)
        np.testing.assert_array_equal(got["hip"], got["cpu"], err_msg=f"seed {seed}, first {first}")
        if seed < 0:
            np.testing.assert_array_equal(got["hip"][:-1], to_bf16(master[:-1]))   # nearest even
        else:
            assert np.mean(got["hip"] != to_bf16(master)) > 0.2   # stochastic: rounds up or down


# --- a model at bf16 ----------------------------------------------------------------------------

def train(backend, config, tokens, steps=3):
    """[(loss, grads, master weights after the update)] of `steps` AdamW steps of GPT-2 at bf16 on
    one batch, and the model."""
    model = GPT2.random(config, seed=0, backend=backend, precision="bf16")
    return adamw_steps(model, tokens, steps), model


def assert_trains_alike(hip, cpu):
    """Each step's loss within 2e-3 of the CPU's (seen: 4e-4 at a loss of 6), the gradients within
    2% in norm (seen: 0.8%), and after each update fewer than 1% of the master weights more than
    lr / 10 apart (seen: 0.25%: AdamW divides by a gradient's magnitude, so a weight whose gradient
    is rounding noise moves by +-lr on either side)."""
    for step, ((loss, grads, params), (cpu_loss, cpu_grads, cpu_params)) in enumerate(zip(hip, cpu), 1):
        assert abs(loss - cpu_loss) < 2e-3, (step, loss, cpu_loss)
        assert np.linalg.norm(grads - cpu_grads) < 0.02 * np.linalg.norm(cpu_grads), step
        assert np.mean(np.abs(params - cpu_params) > 1e-4) < 0.01, step


@pytest.mark.parametrize("warp_size", WARP_SIZES)
def test_gpt2_d2_trains_at_bf16_as_on_the_cpu(builds, warp_size):
    """GPT-2 d2 (C = 128, 2 heads, 2 layers; a vocabulary of 1000 rows, 1024 padded) at B = 2,
    T = 33, on a device of one compute unit (so the grid-stride loops wrap), shuffled: 3 AdamW
    steps with the master weights rounded stochastically into the bf16 parameters, as on the
    CPU's bf16 model. The two differ by the last bits of a few bf16 activations (float32's
    reordering across a rounding midpoint), so not bit for bit: see assert_trains_alike."""
    d2 = GPT2Config.from_depth(2, max_seq_len=64, vocab_size=1000)
    config = GPT2Config(max_seq_len=64, vocab_size=1000, padded_vocab_size=1024, num_layers=d2.num_layers,
                        num_heads=d2.num_heads, channels=d2.channels)
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, 34)).astype(np.int32)
    hip, _ = train(emulated(builds["emu"], ("shuffled", 4), warp_size, compute_units=1), config, tokens)
    cpu, _ = train(get_backend("cpu", "bf16"), config, tokens)
    assert_trains_alike(hip, cpu)
    assert hip[-1][0] < hip[0][0] - 0.5   # and it learns the batch


def test_odd_shapes_take_the_unpacked_paths(builds):
    """C = 33 and B T = 7: the elementwise kernels' lengths are odd (their last element a launch
    of its own) and activations start at odd bf16 offsets (not 4-byte aligned: one element at a
    time instead of two)."""
    config = GPT2Config(max_seq_len=16, vocab_size=101, padded_vocab_size=128, num_layers=1, num_heads=3,
                        channels=33)
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, (1, 8)).astype(np.int32)
    hip, model = train(emulated(builds["emu"], ("shuffled", 5), 64, compute_units=1), config, tokens, steps=2)
    cpu, _ = train(get_backend("cpu", "bf16"), config, tokens, steps=2)
    layout = model.act_layout
    assert any(size % 2 and itemsize == 2 for size, itemsize in zip(layout.sizes, layout.itemsizes))
    assert any(offset % 4 == 2 for offset in layout.byte_offsets)
    assert_trains_alike(hip, cpu)


# --- the builds -------------------------------------------------------------------------------

def test_registry_gives_the_bf16_build(builds):
    backend = get_backend("hip-emu", "bf16")
    assert backend.name == "hip-emu" and backend.precision == "bf16" and backend.itemsize == 2
    assert "mixed" in backend.groups and backend.library == EMU_LIBRARY_BF16
    assert get_backend("hip-emu").precision == "fp32"


def test_unbuilt_bf16_library_is_one_line_naming_the_target(monkeypatch, tmp_path):
    monkeypatch.setitem(device.LIBRARIES, "bf16", (str(tmp_path / "none.so"), str(tmp_path / "none_emu.so")))
    for create, target in ((device.create_emulated, "`make hip-emu`"), (device.create, "`make hip`")):
        with pytest.raises(BackendError, match=rf"unavailable at bf16: .*{target}") as e:
            create("bf16")
        assert "\n" not in str(e.value)


def test_a_library_of_the_other_precision_is_refused(builds):
    with pytest.raises(BackendError, match=r"is a bf16 build, not fp32"):
        device.load(builds["emu"], "hip-emu", "fp32")


# --- check: at bf16, and test_gpt2.py at bf16 ----------------------------------------------------

@pytest.mark.parametrize("dims", [SMALL, D12_WIDTHS], ids=["small", "d12"])
def test_check_hip_emu_at_bf16_is_clean_at_real_widths(builds, dims):
    """check: (accel/instrument.pyx) compares every bf16 entry with the CPU's bf16 table within an
    ulp and for a rounding bias; it does not cry wolf at d12's widths."""
    backend = instrument.create("check", emulated(builds["emu"]))
    run_every_entry(backend, dims=dims)
    assert backend.report()["mismatches"] == 0, backend.summary()


def test_check_names_the_truncating_store_by_its_bias(builds, capfd):
    backend = instrument.create("check", emulated(builds["truncate"]))
    run_every_entry(backend, dims=D12_WIDTHS)
    report = backend.report()
    assert report["first"]["entry"] == "gelu_forward", backend.summary()
    assert "rounded with a bias" in capfd.readouterr().err


def test_test_gpt2_passes_at_bf16_on_check_hip(builds):
    done = subprocess.run([sys.executable, "test_gpt2.py", "--backend", "check:hip-emu",
                           "--precision", "bf16"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "overall okay: 1" in done.stdout, done.stdout[-3000:]
    assert "outputs compared, all within tolerance" in done.stdout
