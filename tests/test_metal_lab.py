"""dev/metal: the Metal kernel lab (dev/metal/README.md) on the emulator. Its A/B table checks
every variant and gpt2.metal's own kernel (check only: times are measured on a Mac), and a
variant that is wrong makes it fail; dev/metal/check_and_time.sh's dry run says what a Mac user's
run would do."""
import os
import subprocess
import sys

import pytest

import builds
import needs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dev.metal import ab  # noqa: E402


@pytest.fixture
def metal_emulator():
    """What the Metal emulator needs: Linux (a platform skip), g++ and make."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the Metal emulator runs on Linux")
    needs.tool("g++")
    needs.tool("make")


needs_emulator = pytest.mark.usefixtures("metal_emulator")


@needs_emulator
def test_ab_checks_every_matmul_variant():
    result = subprocess.run([sys.executable, "dev/metal/ab.py", "matmul", "--backend", "metal-emu",
                             "--shapes", "small"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert rows == [name for name, _ in ab.variants("matmul")] == ["matmul_1", "gpt2.metal"], result.stdout
    assert result.stdout.count("check OK") == 2, result.stdout


@needs_emulator
def test_ab_flags_a_wrong_variant(tmp_path):
    # matmul_1 with its K-slice loop stopping one slice early
    variant = tmp_path / "matmul_9.metal"
    text = open(os.path.join(ROOT, "dev", "metal", "matmul_1.metal")).read()
    assert text.count("for (int k0 = 0; k0 < K; k0 += TILE_K)") == 1
    variant.write_text(text.replace("for (int k0 = 0; k0 < K; k0 += TILE_K)",
                                    "for (int k0 = 0; k0 + TILE_K < K; k0 += TILE_K)"))
    backend, emulator = ab.backend_of(ab.spliced("matmul", str(variant), str(tmp_path)), "metal-emu",
                                      str(tmp_path))
    worst, ok = ab.check(backend, emulator, ab.SHAPES["small"])
    assert not ok and worst > 1000, worst


@needs_emulator
def test_bench_metal_times_each_side_at_fp16_on_the_emulator():
    """The Mac script's timing (dev/metal/bench_metal.py) run for real, on metal-emu and
    PyTorch's CPU: one step of d1 at fp16 (llm.pyx's half precision, PyTorch's float16
    autocast), both sides starting from the same parameters."""
    needs.package("torch")   # PyTorch is the peer
    needs.emulator("metal-emu", "fp16")
    result = subprocess.run([sys.executable, "dev/metal/bench_metal.py", "--backend", "metal-emu",
                             "--torch-device", "cpu", "-e", "1", "-b", "1", "-t", "8", "--steps", "1",
                             "--warmup", "0", "--no-mlx", "--precision", "fp16"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-1]
            for line in result.stdout.splitlines() if line.startswith(("llm.pyx fp16 ", "PyTorch fp16 "))
            and ".." in line}
    assert set(rows) == {"llm.pyx fp16", "PyTorch fp16"}, result.stdout
    assert abs(float(rows["llm.pyx fp16"]) - float(rows["PyTorch fp16"])) < 1e-3, result.stdout
    assert "llm.pyx fp16 / PyTorch fp16: " in result.stdout


def test_mac_script_dry_run_lists_every_step(tmp_path):
    script = os.path.join(ROOT, "dev", "metal", "check_and_time.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    done = subprocess.run(["bash", script], env=dict(os.environ, DRY_RUN="1", OUT=str(tmp_path)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    steps = [line.split(":", 1)[0][3:] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert steps == ["build-product", "build-metal", "parity-gpt2", "check-gpt2", "parity-llama", "check-llama",
                     "train-llama", "train-gpt2", "bench", "ab-matmul", "check-gpt2-fp16", "check-llama-fp16",
                     "check-gpt2-bf16", "check-llama-bf16"]
    for command in ("make metal", "test_gpt2.py --backend check:metal", "test_llama2.py --backend check:metal",
                    "train.py --model stories15M --backend metal -b 4 -t 256 -x 20",
                    "bench_metal.py -e 12 -b 4 -t 1024", "ab.py matmul --backend metal",
                    "test_gpt2.py --backend check:metal --precision bf16"):
        assert command in done.stdout, command
    if sys.platform != "darwin":   # the missing tools, one line each, and nothing run
        assert "check_and_time.sh: Metal needs macOS" in done.stderr
        assert not any(f.endswith(".log") for f in os.listdir(tmp_path))


@needs_emulator
def test_the_mac_scripts_llama_run_plans_on_the_emulator():
    # the flags a Mac would run parse here: train.py plans the same Llama run on metal-emu
    built = subprocess.run(builds.locked(["make", "-s", "-C", ROOT, "metal-emu", f"PYTHON={sys.executable}"]),
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    plan = subprocess.run([sys.executable, "train.py", "--model", "stories15M", "--backend", "metal-emu", "-b", "4",
                           "-t", "256", "-x", "20", "-v", "10", "-m", "2", "-s", "0", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr


# --- metal_runtime.m on Linux: clang against stub declarations (make metal-syntax) ---------------

# the clangs the Makefile's metal-syntax looks for
CLANGS = ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14")
RUNTIME = os.path.join(ROOT, "accel", "metal", "metal_runtime.m")


def syntax_check(source, clang):
    return subprocess.run(builds.locked(["make", "-s", "-C", ROOT, "metal-syntax",
                                         f"METAL_RUNTIME_SOURCE={source}", f"METAL_CLANG={clang}"]),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name, old, new, message", [
    (None, None, None, None),
    ("no-bridge", "(__bridge id<MTLDevice>)rt->device", "(id<MTLDevice>)rt->device", "bridged cast"),
    ("misspelt-selector", "[command_buffer waitUntilCompleted]", "[command_buffer waitUntilComplete]",
     "waitUntilComplete"),
], ids=["as-is", "no-bridge", "misspelt-selector"])
def test_metal_runtime_compiles_against_the_stubs(tmp_path, name, old, new, message):
    clang = needs.tool(*CLANGS)
    source = RUNTIME
    if name is not None:   # a planted fault: ARC's bridging cast missing, a selector Metal lacks
        text = open(RUNTIME).read()
        assert text.count(old) >= 1, old
        source = tmp_path / "metal_runtime.m"
        source.write_text(text.replace(old, new, 1))
        (tmp_path / "metal_runtime.h").write_text(open(os.path.join(ROOT, "accel", "metal", "metal_runtime.h")).read())
    result = syntax_check(source, clang)
    if name is None:
        assert result.returncode == 0 and "metal_runtime.m: clean under" in result.stdout, result.stderr
    else:
        assert result.returncode != 0 and message in result.stderr, result.stderr
