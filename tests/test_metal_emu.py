"""accel/metal on Linux: its kernels (gpt2.metal, which #includes llama.metal and flash.metal) on
the CPU emulator of MSL (backend metal-emu).

Every entry of the table (GPT-2's, Llama's, the classifier's, flash attention's) through check:metal-emu against
the CPU oracle at odd shapes, under every schedule of the emulator and with simdgroups of 32 and
64; planted faults (a removed barrier, a barrier only some threads reach, a write past an
output as llm.metal's layernorm does, wrong Llama kernels) caught; both whole models through
test_gpt2.py and test_llama2.py. The faults are planted in patched copies of
the .metal files in a temporary folder (tests/metal_sources.py), built by `make metal-emu
METAL_SOURCE=...`; a compile error is reported at the line of the file it was written in.
"""
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import builds
import needs
from accel import instrument
from accel.backend import BackendError, get_backend
from accel.spec import BY_NAME, entries_of
from entries import D12_WIDTHS, SMALL, run_every_entry
from metal_sources import SOURCE, patched

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "accel" / "metal" / "build" / "libmetal_emu.so"
SCHEDULES = [("lockstep", 1), ("lockstep-reverse", 1), ("warp-ahead", 1), ("warp-ahead-reverse", 1),
             ("shuffled", 1), ("shuffled", 2)]
KERNELS = {name for name in entries_of(("core", "linear", "gpt2", "llama", "classifier", "flash")) if BY_NAME[name].wrap}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Metal emulator runs on Linux")
needs.tool("g++")
needs.tool("make")


def build(source, library, asan=False):
    """`make metal-emu` of a .metal file into library: the finished process."""
    command = ["make", "-s", "-C", str(ROOT), "metal-emu", f"METAL_SOURCE={source}", f"METAL_EMU_LIB={library}",
               f"PYTHON={sys.executable}"] + (["ASAN=1"] if asan else [])
    return subprocess.run(builds.locked(command), capture_output=True, text=True)


def make_library(source=SOURCE, library=LIBRARY, asan=False):
    """Build the emulator library of a .metal file (`make metal-emu`); its path."""
    result = build(source, library, asan)
    assert result.returncode == 0, result.stderr
    return library


def configure(library, schedule, seed=1, simdgroup_size=32):
    """The emulator's schedule for the library's next dispatches (the library loaded by the
    backend: dlopen hands back the same one)."""
    lib = ctypes.CDLL(str(library))
    lib.metal_emu_configure.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
    assert lib.metal_emu_configure(schedule.encode(), seed, simdgroup_size) == 0


@pytest.fixture(scope="module")
def library():
    return make_library()


@pytest.fixture(autouse=True)
def default_schedule(library):
    yield
    configure(library, "lockstep")


def checked(library=None, name="metal-emu"):
    from accel.metal import metal
    return instrument.create("check", metal.create(str(library or LIBRARY), name))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
def test_every_entry_matches_the_cpu_oracle(library, schedule):
    configure(library, *schedule)
    backend = checked()
    run_every_entry(backend, seed=len(schedule[0]) + schedule[1])
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert all(report["entries"][k]["compared"] > 0 for k in KERNELS), KERNELS - set(report["entries"])


def test_every_entry_with_simdgroups_of_64(library):
    # AMD GPUs in Macs run simdgroups of 64: the kernels read the layout, never assume 32
    configure(library, "shuffled", 3, simdgroup_size=64)
    backend = checked()
    run_every_entry(backend, seed=5)
    assert backend.report()["mismatches"] == 0, backend.summary()


def test_rows_and_tiles_larger_than_a_threadgroup(library):
    # several simdgroups per row, rows longer than a threadgroup, many matmul tiles
    configure(library, "warp-ahead-reverse")
    backend = checked()
    rng = np.random.default_rng(1)
    B, T, C, OC, V, Vp = 2, 5, 300, 35, 601, 608

    def buf(*shape):
        b = backend.alloc(4 * int(np.prod(shape)))
        b.load(rng.standard_normal(shape).astype(np.float32))
        return b

    backend.call("layernorm_forward", buf(B, T, C), buf(B, T), buf(B, T), buf(B, T, C), buf(C), buf(C), B, T, C)
    backend.call("layernorm_backward", buf(B, T, C), buf(C), buf(C), buf(B, T, C), buf(B, T, C), buf(C),
                 buf(B, T), buf(B, T), B, T, C)
    backend.call("matmul_forward", buf(B, T, OC), buf(B, T, C), buf(OC, C), buf(OC), B, T, C, OC)
    backend.call("matmul_backward", buf(B, T, C), buf(OC, C), buf(OC), buf(B, T, OC), buf(B, T, C), buf(OC, C),
                 B, T, C, OC)
    backend.call("softmax_forward", buf(B, T, Vp), buf(B, T, Vp), B, T, V, Vp)
    n = 70001
    assert backend.call("global_norm_squared", buf(n), n) > 0
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert report["entries"]["layernorm_forward"]["compared"] == 3


def test_both_models_take_flash_attention_on_metal_emu(library):
    # so test_gpt2.py and test_llama2.py below run the flash kernels (no (B,NH,T,T) buffers)
    from train_gpt2 import GPT2
    from train_llama2 import Llama2
    backend = checked()
    assert GPT2.activation_options(backend)["flash"] and Llama2.activation_options(backend)["flash"]


def test_test_gpt2_passes_on_check_metal_emu(library):
    # check: compares every call with the CPU oracle and replaces nothing when all are within
    # tolerance, so "check OK" means the parity checks ran on metal-emu's own results; 3 of the
    # 10 steps (each calls every entry; the 50304-wide classifier costs seconds in the emulator)
    result = subprocess.run([sys.executable, "test_gpt2.py", "--backend", "check:metal-emu", "--steps", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "overall okay: 1" in result.stdout, result.stdout + result.stderr
    # (flash attention: 2 outputs per layer forward where llm.c's attention has 3)
    assert "check      OK      check:metal-emu: 294 outputs compared, all within tolerance" in result.stdout


def test_test_llama2_passes_on_check_metal_emu(library):
    # the committed GQA fixture (NH=4, NKV=2): every Llama kernel and the classifier
    result = subprocess.run([sys.executable, "test_llama2.py", "--backend", "check:metal-emu"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "overall okay: 1" in result.stdout, result.stdout + result.stderr
    assert "check      OK      check:metal-emu: 1580 outputs compared, all within tolerance" in result.stdout


def test_unbuilt_library_is_one_line_saying_how_to_build(tmp_path):
    from accel.metal import metal
    with pytest.raises(BackendError, match=r"is not built: run `make metal-emu`"):
        metal.create(str(tmp_path / "libmetal_emu.so"), "metal-emu")


def test_a_library_that_cannot_serve_is_one_line_saying_why(tmp_path, features):
    # the loader HIP shares (accel/loader.pyx): a file dlopen refuses, a library without the
    # host side's symbols, a runtime whose kernels lack the table's (msl_features.metal's)
    from accel.metal import metal
    not_a_library = tmp_path / "libmetal_emu.so"
    not_a_library.write_text("not an ELF file")
    no_host_side = tmp_path / "no_host_side.so"
    subprocess.run(["g++", "-shared", "-x", "c++", "/dev/null", "-o", str(no_host_side)], check=True)
    cases = [(not_a_library, r"^backend 'metal-emu' is unavailable: cannot load .*libmetal_emu\.so: "),
             (no_host_side, r"^backend 'metal-emu': .*no_host_side\.so has no accel_metal_destroy \(an old build\? "
                            r"run `make metal-emu` again\)$"),
             (features, r"^backend 'metal-emu' is unavailable: .*gpt2\.metal: no kernel 'fill'$")]
    for library, message in cases:
        with pytest.raises(BackendError, match=message) as error:
            metal.create(str(library), "metal-emu")
        assert "\n" not in str(error.value)


# --- planted faults ----------------------------------------------------------------------------

def test_removed_barrier_is_caught(tmp_path):
    # threadgroup_sum without the barrier between writing the simdgroup totals and reading them:
    # a thread reads a total not written yet (NaN: threadgroup memory starts poisoned)
    old = "    if (lane == 0) partial[simd] = v;\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n    float total = 0.0f;"
    without = old.replace("    threadgroup_barrier(mem_flags::mem_threadgroup);\n", "")
    source, _ = patched(tmp_path / "no-barrier", [(old, without)])
    library = make_library(source, tmp_path / "no-barrier.so")
    caught = set()
    for schedule in SCHEDULES:
        configure(library, *schedule)
        backend = checked(library)
        run_every_entry(backend)
        report = backend.report()
        caught |= {name for name, e in report["entries"].items() if e["mismatches"]}
        if schedule[0] == "lockstep":
            assert report["mismatches"] > 0   # rows of two simdgroups (softmax over V=37)
    # every kernel that sums over a threadgroup, and nothing else
    assert caught == {"mean", "global_norm_squared", "layernorm_forward", "layernorm_backward",
                      "attention_forward", "attention_backward", "softmax_forward", "rmsnorm_forward",
                      "rmsnorm_backward", "attention_gqa_forward", "attention_gqa_backward",
                      "classifier_forward"}, caught   # (classifier_backward reduces by max alone)


# Llama's and the classifier's kernels, each made wrong in a way a GPU would run silently:
# (what, the line(s) replaced, the replacement, the entries check: must flag)
LLAMA_FAULTS = [
    ("kv-group-of-one-head",     # dk, dv summed over the first query head of each group only
     "for (int h = kvh * group_size; h < (kvh + 1) * group_size; ++h) {",
     "for (int h = kvh * group_size; h < kvh * group_size + 1; ++h) {", {"attention_gqa_backward"}),
    ("kv-head-by-modulo",        # query head h reads key/value head h % NKV, not h / (NH/NKV)
     "int t2 = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);",
     "int t2 = pos.x, t = pos.y, bh = pos.z, b = bh / NH, h = bh % NH, kvh = h % NKV;",
     {"attention_gqa_forward"}),
    ("rope-backward-forward-rotation",   # backward rotates by +angle
     "out[at] = floatX(float(out[at]) + (x0 * c + x1 * s));\n        out[at + 1] = floatX(float(out[at + 1]) + (x1 * c - x0 * s));",
     "out[at] = floatX(float(out[at]) + (x0 * c - x1 * s));\n        out[at + 1] = floatX(float(out[at + 1]) + (x1 * c + x0 * s));",
     {"rope_backward"}),
    ("rmsnorm-unnormalised-mean-term",     # the mean term takes inp where it needs inp rstd
     "(float(weight[i]) * float(dout_bt[i]) - (float(x[i]) * s) * dnorm_norm_mean) * s);",
     "(float(weight[i]) * float(dout_bt[i]) - float(x[i]) * dnorm_norm_mean) * s);", {"rmsnorm_backward"}),
    ("classifier-without-the-target",      # the one-hot term of the gradient dropped
     "        if (i == target) value -= dloss;\n", "\n", {"classifier_backward"}),
    ("classifier-scores-a-masked-row",     # a target of -1 (not scored) still gets a gradient
     "    if (target < 0) return;   // the whole threadgroup, before its barriers\n", "",
     {"classifier_backward"}),
    ("classifier-loss-without-the-max",    # the loss forgets the shift by the row's max
     "(maxval - float(x[target])) + log_total;", "-float(x[target]) + log_total;",
     {"classifier_forward"}),
]


@pytest.mark.parametrize("name, old, new, expected", LLAMA_FAULTS, ids=[f[0] for f in LLAMA_FAULTS])
def test_wrong_llama_kernels_are_caught(tmp_path, name, old, new, expected):
    source, [(file, _)] = patched(tmp_path / name, [(old, new)])
    assert file.name == "llama.metal"   # (the classifier's kernels too, as accel/hip's llama.hip)
    backend = checked(make_library(source, tmp_path / f"{name}.so"))
    run_every_entry(backend, groups=("llama", "classifier"))
    report = backend.report()
    assert {n for n, e in report["entries"].items() if e["mismatches"]} == expected, backend.summary()


def test_barrier_only_some_threads_reach_is_reported_by_source_line(tmp_path):
    old = "        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are read before the next load"
    source, [(file, line)] = patched(tmp_path / "divergent", [(old, "        if (t < 8) " + old.lstrip())])
    library = make_library(source, tmp_path / "divergent.so")
    from accel.metal import metal
    backend = metal.create(str(library), "metal-emu")
    B, T, C, OC = 1, 3, 20, 24
    bufs = [backend.alloc(4 * n) for n in (B * T * OC, B * T * C, OC * C, OC)]
    with pytest.raises(BackendError) as error:
        backend.call("matmul_forward", *bufs, B, T, C, OC)
    message = str(error.value)
    assert "kernel 'matmul'" in message, message
    # (lanes 0-7 of a simdgroup at the barrier, the rest at the next simdgroup collective: a deadlock)
    assert "divergent barriers" in message or "exited while" in message or "deadlock" in message, message
    assert f"threadgroup_barrier at {file}:{line}" in message, message
    assert "\n" not in message


ASAN_SCRIPT = """
import sys
import numpy as np
from accel.metal import metal
sys.path.insert(0, "tests")
from entries import D12_WIDTHS, SMALL, run_every_entry
backend = metal.create(sys.argv[1], "metal-emu")
run_every_entry(backend)
backend.synchronize()
print("clean run")
"""


def run_under_asan(library):
    env = dict(os.environ, LD_PRELOAD=needs.asan_runtime(), ASAN_OPTIONS="detect_leaks=0")
    return subprocess.run([sys.executable, "-c", ASAN_SCRIPT, str(library)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_address_sanitizer_reports_a_write_past_the_output(tmp_path):
    needs.asan_runtime()
    clean = run_under_asan(make_library(SOURCE, tmp_path / "clean.so", asan=True))
    assert clean.returncode == 0 and "clean run" in clean.stdout, clean.stderr[-3000:]
    # llm.metal's layernorm bug: a grid rounded up to whole threadgroups and no bounds check, so
    # threads past C touch memory past the row (the first such access, reading dout past its
    # end in the last row, is the one reported; the writes past dweight would follow)
    old = "    if (c >= uint(C)) return;\n    float dw = 0.0f, db = 0.0f;\n"
    source, [(file, line)] = patched(tmp_path / "past-the-end", [(old, "\n    float dw = 0.0f, db = 0.0f;\n")])
    result = run_under_asan(make_library(source, tmp_path / "past-the-end.so", asan=True))
    assert result.returncode != 0
    summary = [s for s in result.stderr.splitlines() if s.startswith("SUMMARY: AddressSanitizer")]
    assert summary and "heap-buffer-overflow" in summary[0], result.stderr[-3000:]
    assert summary[0].endswith(" in layernorm_backward_params"), summary[0]
    reported = int(summary[0].split(f"{file}:")[1].split()[0])
    assert line < reported < line + 10, summary[0]   # a line of that kernel's loop


# --- the lint: what g++ accepts and Metal does not ---------------------------------------------

def test_lint_passes_gpt2_metal():
    # and the lab's variants (dev/metal), which a Mac compiles in gpt2.metal's place
    variants = sorted(str(p) for p in (ROOT / "dev" / "metal").glob("*.metal"))
    assert variants
    result = subprocess.run([sys.executable, "accel/metal/lint.py", str(SOURCE)] + variants, cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout


def test_lint_names_each_planted_problem_by_line():
    from accel.metal import lint
    source = "\n".join([
        "#include <metal_stdlib>",
        "#include <vector>",                                                   # 2: a C++ header
        "float helper(float* x, thread float& y) { return x[0] + y; }",         # 3: no address space
        "kernel void k(device float3* out [[buffer(0)]],",                      # 4: float3 in a buffer
        "              constant float* in [[buffer(1)]],",
        "              uint i [[thread_position_in_grid]]) {",
        "    double d = 1.0;  // a comment: new delete throw",                  # 7: double
        "    device float* p = new float[3];",                                  # 8: new
        "    out[i] = float3(in[i]);",
        "}",
    ])
    problems = lint.lint(source, "x.metal")
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4", "7", "8"], problems
    assert "helper: parameter 'float* x' has no address space" in problems[1]


def test_lint_reads_the_included_files_and_names_their_lines(tmp_path):
    # a double planted in llama.metal, found through gpt2.metal; the copies in a folder named
    # "new" (a word the lint refuses in code: the #line directives' file names are not code)
    old = "    float x0 = float(inp[at]), x1 = float(inp[at + 1]);"
    source, [(file, line)] = patched(tmp_path / "new", [(old, old.replace("float x0", "double x0"))])
    result = subprocess.run([sys.executable, "accel/metal/lint.py", str(source)], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert result.stdout == f"{file}:{line}: double: Apple GPUs have no double precision\n", result.stdout


# --- one source in three files: gpt2.metal #includes llama.metal and flash.metal ----------------

def test_splice_inlines_quoted_includes_between_line_directives(tmp_path):
    from accel.emu.msl_rewrite import Origins, RewriteError, splice
    folder = tmp_path / 'a "quoted" folder'
    folder.mkdir()
    (folder / "a.metal").write_text('first\n#include "b.metal"  // b\n/* not this one:\n#include "none.metal"\n*/\n'
                                    'last\n')
    (folder / "b.metal").write_text("b1\nb2")   # (no newline at its end)
    a, b = str(folder / "a.metal"), str(folder / "b.metal")
    for name, names in [(None, (a, b)), ("src/a.metal", ("src/a.metal", "src/b.metal"))]:
        text = splice(a, name)
        origins = Origins(text, "(unused)")
        assert [origins(text.index(s)) for s in ("first", "b1", "b2", "last")] == \
            [(names[0], 1), (names[1], 1), (names[1], 2), (names[0], 6)], text
        assert '\n#include "none.metal"\n' in text   # an include in a comment is a comment
    # an include that is not there, and one that comes back: one line each, naming where
    (folder / "c.metal").write_text('x\n#include "gone.metal"\n')
    with pytest.raises(RewriteError) as error:
        splice(str(folder / "c.metal"))
    assert str(error.value) == f'{folder / "c.metal"}:2: #include "gone.metal": no such file beside {folder / "c.metal"}'
    (folder / "d.metal").write_text('#include "e.metal"\n')
    (folder / "e.metal").write_text('\n#include "d.metal"\n')
    with pytest.raises(RewriteError, match=r"d\.metal: included again from within itself \(an include cycle\)$"):
        splice(str(folder / "d.metal"))


def test_a_compile_error_in_an_included_file_is_reported_at_its_own_line(tmp_path):
    # g++ compiles the rewritten text of gpt2.metal with llama.metal spliced in: its #line
    # directives make an error in llama.metal llama.metal's line, not one of the generated C++
    old = "    float x0 = float(inp[at]), x1 = float(inp[at + 1]);"
    source, [(file, line)] = patched(tmp_path / "compile-error", [(old, old.replace("inp[at + 1]", "inpt[at + 1]"))])
    assert file.name == "llama.metal"
    result = build(source, tmp_path / "compile-error.so")
    assert result.returncode != 0
    errors = [e for e in result.stderr.splitlines() if "error:" in e]
    assert errors and errors[0].startswith(f"{file}:{line}:") and "inpt" in errors[0], result.stderr


def test_an_edit_to_an_included_file_makes_the_library_out_of_date(tmp_path, library):
    # a build depends on the .metal files beside METAL_SOURCE, where its includes are found
    source, _ = patched(tmp_path / "copy", [])
    built = tmp_path / "copy.so"
    built.write_text("")   # stands for a build newer than everything it is made from

    def up_to_date():
        return subprocess.run(["make", "-q", "-C", str(ROOT), "metal-emu", f"METAL_SOURCE={source}",
                               f"METAL_EMU_LIB={built}", f"PYTHON={sys.executable}"]).returncode == 0
    later = time.time() + 100
    os.utime(built, (later, later))
    assert up_to_date()
    os.utime(source.parent / "llama.metal", (later + 100, later + 100))
    assert not up_to_date()


# a stand-in for macOS's libmetal_runtime.dylib: it records what metal.pyx hands the runtime
STUB_RUNTIME = r"""
#include <stdio.h>
#include <stdlib.h>
const char* accel_metal_precision(void) { return "fp32"; }
void accel_metal_destroy(void* ctx) { (void)ctx; }
const char* accel_metal_device_name(void* ctx) { (void)ctx; return "stub"; }
void* accel_metal_create(const char* kernels, const char* source, char* error, size_t error_size) {
    FILE* f = fopen(getenv("STUB_RUNTIME_SEEN"), "w");
    fprintf(f, "%s\n%s", kernels, source ? source : "(no source)");
    fclose(f);
    snprintf(error, error_size, "the stub makes no context");
    return NULL;
}
"""


def test_metal_is_given_the_source_with_its_includes_spliced_in(tmp_path, monkeypatch):
    # on a Mac, without a metallib, metal_runtime.m compiles gpt2.metal's text with
    # newLibraryWithSource, which resolves no include: metal.pyx hands it the text spliced as
    # the emulator's build splices it; a .metallib goes by its path alone
    from accel.emu.msl_rewrite import splice
    from accel.metal import metal
    (tmp_path / "stub.c").write_text(STUB_RUNTIME)
    runtime = tmp_path / "libmetal_runtime.dylib"   # (dlopen on Linux minds no suffix)
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "stub.c"), "-o", str(runtime)], check=True)
    seen = tmp_path / "seen"
    monkeypatch.setenv("STUB_RUNTIME_SEEN", str(seen))
    text = splice(str(SOURCE))
    assert all(f'#line 1 "{SOURCE.parent / name}"' in text for name in ("llama.metal", "flash.metal"))
    for kernels, expected in [(None, f"{SOURCE}\n{text}"),
                              (str(tmp_path / "gpt2.metallib"), f"{tmp_path / 'gpt2.metallib'}\n(no source)")]:
        with pytest.raises(BackendError, match="^backend 'metal' is unavailable: the stub makes no context$"):
            metal.create(str(runtime), "metal", kernels=kernels)
        assert seen.read_text() == expected
    # a copy whose include is missing: one line, before the runtime is asked
    copy, _ = patched(tmp_path / "no-flash", [])
    (copy.parent / "flash.metal").unlink()
    seen.unlink()
    with pytest.raises(BackendError, match=r'^backend \'metal\': .*gpt2\.metal:\d+: #include "flash\.metal": no such file'):
        metal.create(str(runtime), "metal", kernels=str(copy))
    assert not seen.exists()


# --- the MSL front-end and the C ABI, on sample kernels (accel/emu/tests/msl_features.metal) --

class MetalArg(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint32)]


class Runtime:
    """metal_runtime.h through ctypes, over an emulator library."""

    def __init__(self, library):
        lib = self.lib = ctypes.CDLL(str(library))
        lib.metal_open.restype = ctypes.c_void_p
        lib.metal_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                   ctypes.c_size_t]
        lib.metal_alloc.restype = ctypes.c_void_p
        lib.metal_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.metal_kernel.restype = ctypes.c_void_p
        lib.metal_kernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.metal_error.restype = ctypes.c_char_p
        lib.metal_error.argtypes = [ctypes.c_void_p]
        lib.metal_close.argtypes = [ctypes.c_void_p]
        lib.metal_dispatch_threads.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(MetalArg), ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                                               ctypes.POINTER(ctypes.c_uint32), ctypes.c_int]
        error = ctypes.create_string_buffer(256)
        self.rt = lib.metal_open(b"", None, b"fp32", error, 256)
        assert self.rt, error.value

    def array(self, values, dtype):
        values = np.asarray(values, dtype=dtype)
        ptr = self.lib.metal_alloc(self.rt, values.nbytes)
        view = np.ctypeslib.as_array((ctypes.c_char * values.nbytes).from_address(ptr)).view(dtype)
        view[:] = values.reshape(-1)
        return ptr, view

    def dispatch(self, kernel, args, threads, group, threadgroup_bytes=(), fails=False):
        """Run a kernel; its error (fails=True) or None (else an error fails the test)."""
        handle = self.lib.metal_kernel(self.rt, kernel.encode())
        assert handle, self.lib.metal_error(self.rt)
        bound = (MetalArg * len(args))()
        keep = []
        for i, a in enumerate(args):
            if isinstance(a, int):                       # a pointer from metal_alloc
                bound[i] = MetalArg(a, 0)
            else:                                        # bytes of a scalar
                keep.append(ctypes.create_string_buffer(a, len(a)))
                bound[i] = MetalArg(ctypes.addressof(keep[-1]), len(a))
        u32 = lambda values: (ctypes.c_uint32 * max(len(values), 1))(*values)
        self.lib.metal_dispatch_threads(self.rt, handle, bound, len(args), u32(threads), u32(group),
                                        u32(threadgroup_bytes), len(threadgroup_bytes))
        error = self.lib.metal_error(self.rt)
        assert fails or error is None, error.decode()
        return error and error.decode()


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    source = ROOT / "accel" / "emu" / "tests" / "msl_features.metal"
    return make_library(source, tmp_path_factory.mktemp("msl") / "msl_features.so")


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
def test_msl_features_through_the_c_abi(features, schedule):
    configure(features, *schedule)
    r = Runtime(features)

    counts, view = r.array([0, 0], np.uint32)
    r.dispatch("count", [counts], (1000, 1, 1), (64, 1, 1))
    assert view.tolist() == [1000, 999]

    # a threadgroup of 40: one full simdgroup of 32 lanes, one of 8
    out, view = r.array(np.zeros((40, 4)), np.float32)
    r.dispatch("shuffles", [out], (40, 1, 1), (40, 1, 1))
    expected = []
    for t in range(40):
        lane, width = t % 32, 32 if t < 32 else 8
        expected.append([lane + 1 if lane + 1 < width else lane, lane - 1 if lane >= 1 else lane,
                         lane ^ 1 if (lane ^ 1) < width else lane, 0, width - 32])
    assert view.reshape(40, 4).tolist() == [e[:3] + [e[3] + e[4]] for e in expected]

    a = np.linspace(-2, 3, 37, dtype=np.float32)
    out, view = r.array(np.zeros(37), np.float32)
    pa, _ = r.array(a, np.float32)
    r.dispatch("vectors", [out, pa, np.float32(0.5).tobytes()], (37, 1, 1), (16, 1, 1))
    halved = (a.astype(np.float16) * np.float16(2)).astype(np.float32)
    np.testing.assert_allclose(view, halved + a * a + 5 + 0.5, rtol=1e-6)

    x = np.arange(50, dtype=np.float32)
    out, view = r.array(np.zeros(50), np.float32)
    px, _ = r.array(x, np.float32)
    r.dispatch("reverse", [out, px], (50, 1, 1), (16, 1, 1), threadgroup_bytes=(16 * 4,))
    assert view.tolist() == [v for s in range(0, 50, 16) for v in reversed(x[s:s + 16].tolist())]

    grid, group = (5, 3, 2), (2, 2, 2)
    out, view = r.array(np.zeros(30), np.uint32)
    sizes, size_view = r.array(np.zeros(30), np.uint32)
    r.dispatch("positions", [out, sizes], grid, group)
    assert view.tolist() == list(range(1, 31))   # every position exactly once
    edge = lambda p, n, g: min(g, n - p // g * g)
    assert size_view.tolist() == [edge(x, 5, 2) * edge(y, 3, 2) * edge(z, 2, 2)
                                  for z in range(2) for y in range(3) for x in range(5)]
    r.lib.metal_close(r.rt)


def test_a_kernel_argument_left_unbound_is_reported(features):
    r = Runtime(features)
    out, _ = r.array(np.zeros((40, 4)), np.float32)
    handle = r.lib.metal_kernel(r.rt, b"shuffles")
    assert handle
    # no buffer bound at [[buffer(0)]]
    r.lib.metal_dispatch_threads(r.rt, handle, (MetalArg * 0)(), 0, (ctypes.c_uint32 * 3)(8, 1, 1),
                                 (ctypes.c_uint32 * 3)(8, 1, 1), None, 0)
    assert "no argument bound at [[buffer(0)]]" in r.lib.metal_error(r.rt).decode()


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
@pytest.mark.parametrize("simdgroup_size", [32, 64])
def test_simdgroup_matrices_through_the_c_abi(features, schedule, simdgroup_size):
    # out = a b + c^T through simdgroup_load (one of them transposed), multiply_accumulate and
    # store, whatever the schedule interleaves between the lanes' fragments
    configure(features, *schedule, simdgroup_size=simdgroup_size)
    r = Runtime(features)
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3))
    out, view = r.array(np.zeros(64), np.float32)
    args = [out] + [r.array(m, np.float32)[0] for m in (a, b, c)] + [np.int32(-1).tobytes()]
    r.dispatch("simdgroup_product", args, (simdgroup_size, 1, 1), (simdgroup_size, 1, 1))
    np.testing.assert_allclose(view.reshape(8, 8), a.astype(np.float64) @ b + c.T, rtol=1e-5, atol=1e-5)
    # a threadgroup smaller than a simdgroup: no simdgroup matrix there
    error = r.dispatch("simdgroup_product", args, (8, 1, 1), (8, 1, 1), fails=True)
    assert "simdgroup_load: a simdgroup matrix needs a full simdgroup (8 of" in error, error
    r.lib.metal_close(r.rt)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
def test_a_lane_that_skips_a_simdgroup_matrix_function_is_reported(features, schedule):
    configure(features, *schedule)
    r = Runtime(features)
    out, _ = r.array(np.zeros(64), np.float32)
    args = [out] + [r.array(np.ones(64), np.float32)[0] for _ in range(3)] + [np.int32(5).tobytes()]
    error = r.dispatch("simdgroup_product", args, (32, 1, 1), (32, 1, 1), fails=True)
    source = "accel/emu/tests/msl_features.metal"
    line = next(i for i, text in enumerate((ROOT / source).read_text().splitlines(), 1)
                if "if (int(lane) != skip) simdgroup_load(bm, b, 8);" in text)
    # reported at the next collective (loads wait for no one), naming the loads' lines
    assert "kernel 'simdgroup_product'" in error and "lane 5: 2 at lines" in error, error
    assert f"ran different simdgroup_loads before it (lane 0: 3 at lines {line - 1}, {line}, {line + 1}" in error, error
    assert "\n" not in error
    r.lib.metal_close(r.rt)


# --- the matmul on simdgroup matrices ------------------------------------------------------------

ODD_MATMUL_SHAPES = [dict(B=3, T=7, C=45, OC=67),      # M, K, N: no multiple of 8
                     dict(B=2, T=65, C=70, OC=9),      # two row tiles, K past a slice, N below a block
                     dict(B=1, T=1, C=1, OC=1)]


def run_matmuls(backend, rng):
    def buf(*shape):
        b = backend.alloc(4 * int(np.prod(shape)))
        b.load(rng.standard_normal(shape).astype(np.float32))
        return b
    for s in ODD_MATMUL_SHAPES:
        B, T, C, OC = s["B"], s["T"], s["C"], s["OC"]
        backend.call("matmul_forward", buf(B, T, OC), buf(B, T, C), buf(OC, C), buf(OC), B, T, C, OC)
        backend.call("matmul_forward", buf(B, T, OC), buf(B, T, C), buf(OC, C), None, B, T, C, OC)
        backend.call("matmul_backward", buf(B, T, C), buf(OC, C), buf(OC), buf(B, T, OC), buf(B, T, C),
                     buf(OC, C), B, T, C, OC)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
@pytest.mark.parametrize("simdgroup_size", [32, 64])
def test_matmul_at_odd_shapes(library, schedule, simdgroup_size):
    configure(library, *schedule, simdgroup_size=simdgroup_size)
    backend = checked()
    run_matmuls(backend, np.random.default_rng(7))
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    assert report["entries"]["matmul_backward"]["compared"] == 3 * len(ODD_MATMUL_SHAPES)


MATMUL_FAULTS = [
    ("no-barrier-between-staging-and-multiply",   # simdgroups load tiles other threads have not staged
     "        }\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n        // each slice summed",
     "        }\n        // each slice summed"),
    ("b-block-one-row-off",                       # the B block of k8 read from row k8 + 1
     "simdgroup_load(b_block, b_tile + k8 * TILE + c8, TILE);",
     "simdgroup_load(b_block, b_tile + (k8 + 1) * TILE + c8, TILE);"),
]


@pytest.mark.parametrize("name, old, new", MATMUL_FAULTS, ids=[f[0] for f in MATMUL_FAULTS])
def test_wrong_matmuls_are_caught_under_every_schedule(tmp_path, name, old, new):
    source, _ = patched(tmp_path / name, [(old, new)])
    library = make_library(source, tmp_path / f"{name}.so")
    for schedule in SCHEDULES:
        configure(library, *schedule)
        backend = checked(library)
        run_matmuls(backend, np.random.default_rng(7))
        report = backend.report()
        assert report["entries"]["matmul_forward"]["mismatches"] > 0, (schedule, backend.summary())
        assert report["entries"]["matmul_backward"]["mismatches"] > 0, (schedule, backend.summary())


def test_rewrite_keeps_threadgroup_pointers_plain():
    # a threadgroup array in a kernel is one per running threadgroup (static thread_local, poisoned
    # at each start); a pointer or reference to threadgroup memory is an ordinary local
    sys.path.insert(0, str(ROOT / "accel" / "emu"))
    from msl_rewrite import address_space
    text = "{\n    threadgroup float tile[4][4];\n    threadgroup float* row = tile[1];\n    threadgroup float& x = tile[0][0];\n"
    kinds = [address_space("threadgroup", text, text.index(d)) for d in
             ("threadgroup float tile", "threadgroup float* row", "threadgroup float& x")]
    assert kinds == ["static thread_local", "", ""]


# --- flash attention -----------------------------------------------------------------------------

# T past one tile of 16 and no multiple of it, NKV < NH, odd head sizes (GPT-2's form: C / NH);
# d12's widths (hs 64, the largest in tiles of 16 rows) at T within one tile and past two;
# head sizes 128 and 200 (tiles of 8 and 4 rows: host.c's choice)
FLASH_SHAPES = [dict(SMALL, B=2, T=37, C=42, NH=6, NKV=2, hs=7),
                dict(SMALL, B=1, T=17, C=15, NH=3, NKV=1, hs=5),
                D12_WIDTHS, dict(D12_WIDTHS, B=1, T=33),
                dict(SMALL, B=1, T=19, C=256, NH=2, NKV=1, hs=128),
                dict(SMALL, B=1, T=9, C=400, NH=2, NKV=1, hs=200)]
FLASH = ("flash",)


def run_flash(backend, seed=0):
    for dims in FLASH_SHAPES:
        run_every_entry(backend, dims=dims, seed=seed, groups=FLASH)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s}-{seed}" for s, seed in SCHEDULES])
@pytest.mark.parametrize("simdgroup_size", [32, 64])
def test_flash_attention_at_odd_shapes_and_d12_widths(library, schedule, simdgroup_size):
    configure(library, *schedule, simdgroup_size=simdgroup_size)
    backend = checked()
    run_flash(backend, seed=len(schedule[0]))
    report = backend.report()
    assert report["mismatches"] == 0, backend.summary()
    for name in entries_of(FLASH):
        assert report["entries"][name]["compared"] >= len(FLASH_SHAPES), (name, report["entries"].get(name))


def test_flash_head_too_large_for_the_tiles_is_one_line(library):
    from accel.metal import metal
    backend = metal.create(str(LIBRARY), "metal-emu")
    B, T, NH, NKV, hs = 1, 3, 2, 1, 1040
    bufs = [backend.alloc(4 * n) for n in (B * T * NH * hs, B * NH * T, B * T * NH * hs, B * T * NKV * hs,
                                           B * T * NKV * hs)]
    with pytest.raises(BackendError, match=r"flash_attention_gqa_forward: head size 1040 .* the tiles hold head "
                                           r"sizes 1 to 1039") as error:
        backend.call("flash_attention_gqa_forward", *bufs, B, T, NH, NKV, hs)
    assert "\n" not in str(error.value)


# flash attention made wrong in ways a GPU would run silently: (what, the line replaced, the
# replacement, the entries check: must flag under every schedule)
FLASH_FAULTS = [
    ("no-barrier-after-staging-keys",    # the forward's scores read K before all of it is staged
     "        threadgroup_barrier(mem_flags::mem_threadgroup);  // K, V (the first time Q too) staged\n", "",
     {"flash_attention_forward", "flash_attention_gqa_forward"}),
    ("no-barrier-after-staging-keys-dq", # dq's probabilities read K, V before all of them are staged
     "num_threads);\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n        flash_probabilities(dSs",
     "num_threads);\n        flash_probabilities(dSs",
     {"flash_attention_backward", "flash_attention_gqa_backward"}),
    ("causal-mask-one-key-late",         # each query also sees the next key
     "bool flash_visible(int t, int t2) { return t2 <= t; }",
     "bool flash_visible(int t, int t2) { return t2 <= t + 1; }", set(entries_of(FLASH))),
    ("kv-head-by-modulo",                # query head h reads key/value head h % NKV, not h / (NH/NKV)
     "int flash_kv_head(int h, int NH, int NKV) { return h / (NH / NKV); }",
     "int flash_kv_head(int h, int NH, int NKV) { return h % NKV; }",
     {"flash_attention_gqa_forward", "flash_attention_gqa_backward"}),
]


@pytest.mark.parametrize("name, old, new, expected", FLASH_FAULTS, ids=[f[0] for f in FLASH_FAULTS])
def test_wrong_flash_kernels_are_caught(tmp_path, name, old, new, expected):
    source, [(file, _)] = patched(tmp_path / name, [(old, new)])
    assert file.name == "flash.metal"
    library = make_library(source, tmp_path / f"{name}.so")
    for schedule in SCHEDULES:
        configure(library, *schedule)
        backend = checked(library)
        run_every_entry(backend, dims=FLASH_SHAPES[0], groups=FLASH)
        report = backend.report()
        flagged = {n for n, e in report["entries"].items() if e["mismatches"]}
        assert flagged == expected, (schedule, backend.summary())
