"""accel/generated/backend.h: every GPU build's host side compiles against the declarations that
accel/spec.py makes, so an export whose signature drifts from the spec does not compile.

Each test plants one drift in a copy of the sources (an element count made an int, a pointer
made non-const), compiles the copy as a build does and sees it refused, naming the export; the
unplanted copy compiles.  A drift stops the compiler's front end, so these take seconds:
    the emulator build   g++ with `make hip-emu`'s flags, -fsyntax-only (the same front end)
    nvcc, hipcc          accel/hip's compile checks (make hip-check-nvcc, hip-check-amd); the
                         unplanted tree's are tests/test_hip.py's
    Metal's host side    the root Makefile's rule for accel/metal/build/host_fp32.o
"""
import os
import shutil
import subprocess

import pytest

import needs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "accel", "emu")

# (file, its text, the drifted text, the export): each a definition that stops matching the spec
GELU_INT = ("accel/hip/gpt2.hip",
            "accel_hip_gelu_forward(void* ctx, floatX* out, const floatX* inp, ptrdiff_t N)",
            "accel_hip_gelu_forward(void* ctx, floatX* out, const floatX* inp, int N)",
            "accel_hip_gelu_forward")
RMSNORM_NOT_CONST = ("accel/hip/llama.hip",
                     "accel_hip_rmsnorm_forward(void* ctx, floatX* out, float* rstd, const floatX* inp,",
                     "accel_hip_rmsnorm_forward(void* ctx, floatX* out, float* rstd, floatX* inp,",
                     "accel_hip_rmsnorm_forward")
# dev/gpu's variant of gpt2.hip: its own matmul_forward, declared by a second include
EPILOGUE_LONG = ("dev/gpu/matmul_epilogues.hip",
                 "const floatX* bias, int B, int T, int C, int OC) {",
                 "const floatX* bias, int B, int T, int C, long OC) {",
                 "accel_hip_matmul_forward")
METAL_GELU_INT = ("accel/metal/host.c",
                  "accel_metal_gelu_forward(void* ctx, floatX* out, const floatX* inp, ptrdiff_t N)",
                  "accel_metal_gelu_forward(void* ctx, floatX* out, const floatX* inp, int N)",
                  "accel_metal_gelu_forward")
METAL_RMSNORM_NOT_CONST = ("accel/metal/host.c",
                           "accel_metal_rmsnorm_forward(void* ctx, floatX* out, float* rstd, const floatX* inp,",
                           "accel_metal_rmsnorm_forward(void* ctx, floatX* out, float* rstd, floatX* inp,",
                           "accel_metal_rmsnorm_forward")

# what each compiler says of a definition that conflicts with a declaration of C linkage
CONFLICT = {"g++": "conflicting declaration of C function", "nvcc": 'has "C" linkage',
            "hipcc": "conflicting types", "cc": "conflicting types"}


def copy_of_the_sources(tmp_path, plant=None):
    """The GPU builds' host sources and the generated header, copied under tmp_path (accel/emu, only
    read, linked), with `plant` (file, text, drifted text, export) applied; tmp_path."""
    for folder in ("accel/hip", "accel/metal", "accel/generated", "dev/gpu"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("build", "wheels", "*.py", "*.pyx"))
    os.symlink(EMU, tmp_path / "accel" / "emu")
    shutil.copy(os.path.join(ROOT, "Makefile"), tmp_path / "Makefile")
    if plant:
        path, text, drifted, _ = plant
        source = (tmp_path / path).read_text()
        assert source.count(text) == 1, f"{path} no longer holds {text!r}: update the plant"
        (tmp_path / path).write_text(source.replace(text, drifted))
    return tmp_path


# the emulator builds' defines (accel/hip/Makefile: emu-fp32; dev-epilogues, variant 1)
EMULATOR_DEFINES = {"accel/hip/gpt2.hip": [],
                    "dev/gpu/matmul_epilogues.hip": ["-DACCEL_HIP_NO_COLLECTIVES", "-DEPILOGUE_VARIANT=1"]}


def emulator_compile(tree, source):
    """g++ on a .hip file of the copy with its emulator build's flags (accel/hip/Makefile's
    EMU_CXXFLAGS, EMU_INCLUDES), front end only."""
    includes = [flag for folder in ("include", "blas", "rccl", "") for flag in ("-I", os.path.join(EMU, folder))]
    return subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-fsyntax-only", *includes,
                           *EMULATOR_DEFINES[source], "-x", "c++", str(tree / source)], capture_output=True, text=True)


def refused(done, plant, compiler):
    """The build failed on the planted export, as that compiler says a drift."""
    output = done.stdout + done.stderr
    return done.returncode != 0 and plant[3] in output and CONFLICT[compiler] in output


@pytest.mark.parametrize("plant", [GELU_INT, RMSNORM_NOT_CONST, EPILOGUE_LONG], ids=lambda p: p[3])
def test_the_emulator_build_refuses_an_export_that_drifts_from_the_spec(tmp_path, plant):
    needs.tool("g++")   # the emulator build's compiler
    source = "dev/gpu/matmul_epilogues.hip" if plant is EPILOGUE_LONG else "accel/hip/gpt2.hip"
    done = emulator_compile(copy_of_the_sources(tmp_path, plant), source)
    assert refused(done, plant, "g++"), done.stderr[-3000:]


@pytest.mark.parametrize("source", sorted(EMULATOR_DEFINES))
def test_the_unplanted_copy_compiles_for_the_emulator(tmp_path, source):
    needs.tool("g++")
    done = emulator_compile(copy_of_the_sources(tmp_path), source)
    assert done.returncode == 0, done.stderr[-3000:]


def toolchain(*args):
    return subprocess.run([os.path.join(ROOT, "accel", "hip", "toolchain.sh"), *args], capture_output=True, text=True)


def test_the_nvcc_compile_check_refuses_an_export_that_drifts_from_the_spec(tmp_path):
    needs.tool("nvcc")
    needs.headers("cuBLAS")
    tree = copy_of_the_sources(tmp_path / "tree", GELU_INT)
    done = subprocess.run(["make", "-s", "-C", str(tree / "accel" / "hip"), "check-nvcc", f"BUILD={tmp_path / 'build'}"],
                          capture_output=True, text=True)
    assert refused(done, GELU_INT, "nvcc"), done.stderr[-3000:]


def test_the_hipcc_compile_check_refuses_an_export_that_drifts_from_the_spec(tmp_path):
    needs.tool("hipcc")
    archs = toolchain("amd-archs", "gfx90a")
    if archs.returncode != 0:   # toolchain.sh says why (hipcc's first error)
        pytest.skip(" / ".join(archs.stderr.strip().splitlines()))
    tree = copy_of_the_sources(tmp_path / "tree", RMSNORM_NOT_CONST)
    done = subprocess.run(["make", "-s", "-C", str(tree / "accel" / "hip"), "check-amd", "AMD_ARCHS=gfx90a",
                           f"BUILD={tmp_path / 'build'}"], capture_output=True, text=True)
    assert refused(done, RMSNORM_NOT_CONST, "hipcc"), done.stderr[-3000:]


def metal_host_build(tree):
    """The root Makefile's rule for Metal's host side (fp32), in the copy."""
    return subprocess.run(["make", "-s", "-C", str(tree), "accel/metal/build/host_fp32.o"], capture_output=True,
                          text=True)


@pytest.fixture
def metal_host_tools():
    """What building Metal's host side needs: a C compiler and make."""
    needs.cc()
    needs.tool("make")


@pytest.mark.usefixtures("metal_host_tools")
@pytest.mark.parametrize("plant", [METAL_GELU_INT, METAL_RMSNORM_NOT_CONST], ids=lambda p: p[3])
def test_metal_host_side_refuses_an_export_that_drifts_from_the_spec(tmp_path, plant):
    done = metal_host_build(copy_of_the_sources(tmp_path, plant))
    assert refused(done, plant, "cc"), done.stderr[-3000:]


@pytest.mark.usefixtures("metal_host_tools")
def test_the_unplanted_metal_host_side_builds(tmp_path):
    done = metal_host_build(copy_of_the_sources(tmp_path))
    assert done.returncode == 0 and (tmp_path / "accel/metal/build/host_fp32.o").exists(), done.stderr[-3000:]
