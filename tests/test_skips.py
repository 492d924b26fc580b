"""
tests/needs.py's helpers: each skips for the absence it names, with a reason that says what is
absent and how to get it, and lets everything else fail: a package that is there but broken, a
module of ours that fails to import, an emulator build that is there but not a library, a
toolchain question that errs.
"""
import contextlib
import os
import sys

import pytest

import accel.backend
import accel.hip
import needs
from accel.backend import BackendError
from accel.hip import device as hip_device
from accel.metal import metal
from llmc import tokenizer

Skipped = pytest.skip.Exception


@contextlib.contextmanager
def fails(exception, match=None):
    """pytest.raises(exception), where a skip is a failure of the test (not a skip of it)."""
    try:
        with pytest.raises(exception, match=match):
            yield
    except Skipped as e:
        pytest.fail(f"skipped where it should fail: {e.msg}")


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder on sys.path to write modules into: write(name, source)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(source)
    return write


# --- an optional package ----------------------------------------------------------------------

def test_a_package_that_is_not_installed_skips_naming_it_and_its_install(monkeypatch):
    with pytest.raises(Skipped, match=r"^llmpyx_no_such_package is not installed \(pip install "
                                      r"llmpyx_no_such_package\)$"):
        needs.package("llmpyx_no_such_package")
    monkeypatch.setitem(needs.INSTALL, "llmpyx_no_such_package", "pip install 'llmpyx-thing[extra]'")
    with pytest.raises(Skipped, match=r"\(pip install 'llmpyx-thing\[extra\]'\)$"):
        needs.package("llmpyx_no_such_package")


def test_a_package_inside_a_missing_parent_skips():
    with pytest.raises(Skipped, match=r"^llmpyx_no_such_namespace\.sub is not installed"):
        needs.package("llmpyx_no_such_namespace.sub")


def test_a_package_that_raises_inside_fails(modules):
    modules("llmpyx_raises_inside", "raise ImportError('cannot import name x from y')\n")
    with fails(ImportError, match="cannot import name x from y"):
        needs.package("llmpyx_raises_inside")


def test_a_package_whose_own_dependency_is_missing_fails(modules):
    modules("llmpyx_broken_install", "import llmpyx_its_missing_dependency\n")
    with fails(ModuleNotFoundError, match="llmpyx_its_missing_dependency"):
        needs.package("llmpyx_broken_install")


def test_our_module_through_which_a_package_is_imported_skips_only_for_that_package(modules):
    modules("llmpyx_uses_absent", "import llmpyx_optional_absent\n")
    with pytest.raises(Skipped, match=r"^llmpyx_optional_absent is not installed"):
        needs.package("llmpyx_optional_absent", "llmpyx_uses_absent")
    # our module broken (accel.ane.mil's own ImportError): a failure, not "coremltools is missing"
    modules("llmpyx_ours_broken", "import os\nraise ImportError('our module is broken')\n")
    with fails(ImportError, match="our module is broken"):
        needs.package("os", "llmpyx_ours_broken")


def test_an_installed_package_is_returned():
    assert needs.package("os.path") is os.path


# --- an emulated backend ----------------------------------------------------------------------

@pytest.fixture(params=["hip-emu", "metal-emu"])
def emulator_build(request, tmp_path, monkeypatch):
    """(name, path): the emulated backend request.param with its fp32 build looked for at path
    (by the registry too), in tmp_path."""
    if request.param == "hip-emu":
        library = tmp_path / "libgpt2_hip_emu.so"
        monkeypatch.setattr(accel.hip, "EMU_LIBRARY", str(library))
        monkeypatch.setitem(hip_device.LIBRARIES, "fp32", (hip_device.GPU_LIBRARY, str(library)))
    else:
        library = tmp_path / "metal" / "build" / "libmetal_emu.so"
        library.parent.mkdir(parents=True)
        monkeypatch.setattr(accel.backend, "_ACCEL", str(tmp_path))
        monkeypatch.setattr(metal, "BUILD", str(library.parent))
    return request.param, library


def test_an_emulator_that_is_not_built_skips_naming_its_make_target(emulator_build):
    name, _ = emulator_build
    with pytest.raises(Skipped, match=rf"^{name} is not built at fp32: no .*\.so \(make {name}\)$"):
        needs.emulated("check:" + name)


def test_an_emulator_build_that_is_not_a_library_fails(emulator_build):
    name, library = emulator_build
    library.write_text("not an ELF file")
    with fails(BackendError, match=rf"^backend '{name}' is unavailable: cannot load {library}"):
        needs.emulated("check:" + name)


def test_ane_emu_needs_coremltools_through_our_mil_module(monkeypatch):
    asked = []
    monkeypatch.setattr(needs, "package", lambda *args: asked.append(args))
    assert needs.emulator("check:ane-emu") is None
    assert asked == [("coremltools", "accel.ane.mil")]


# --- tools, header sets, files, the lab, llama2.c, MPI --------------------------------------------

def test_a_missing_tool_skips_naming_it_and_its_alternatives():
    with pytest.raises(Skipped, match=r"^no llmpyx-cc \(nor llmpyx-cc-19\) on PATH \(get it here\)$"):
        needs.tool("llmpyx-cc", "llmpyx-cc-19", how="get it here")
    assert needs.tool("llmpyx-cc", "sh") == needs.shutil.which("sh")


def fake_program(folder, name, script):
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def test_asan_runtime_skips_where_gpp_has_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_program(tmp_path, "g++", "echo libasan.so\n")   # what g++ prints where it has no such file
    with pytest.raises(Skipped, match=r"^g\+\+ has no AddressSanitizer runtime"):
        needs.asan_runtime()
    fake_program(tmp_path, "g++", "echo /usr/lib/libasan.so\n")
    assert needs.asan_runtime() == "/usr/lib/libasan.so"
    fake_program(tmp_path, "g++", "exit 4\n")             # g++ itself failing: a failure
    with fails(needs.subprocess.CalledProcessError):
        needs.asan_runtime()


def test_headers_skip_only_where_the_toolchain_finds_none(tmp_path, monkeypatch):
    monkeypatch.setattr(needs, "TOOLCHAIN", str(fake_program(tmp_path, "toolchain.sh", "exit 1\n")))
    with pytest.raises(Skipped, match=r"^no cuBLAS headers \(pip install nvidia-cublas"):
        needs.headers("cuBLAS")
    monkeypatch.setattr(needs, "TOOLCHAIN", str(fake_program(tmp_path, "toolchain.sh", "echo /x/include\n")))
    assert needs.headers("NCCL") == "/x/include"
    monkeypatch.setattr(needs, "TOOLCHAIN", str(fake_program(tmp_path, "toolchain.sh", "echo broken >&2; exit 2\n")))
    with fails(AssertionError, match="broken"):
        needs.headers("NCCL")


def test_a_missing_shared_file_skips_naming_it():
    with pytest.raises(Skipped, match=r"^no \.\./shared/data/nothing\.bin \(llm\.c's data"):
        needs.shared(os.path.join(needs.SHARED, "data", "nothing.bin"))


def test_the_lab_skips_only_where_none_of_its_modules_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(needs, "LAB", str(tmp_path))
    (tmp_path / "matmul_1.pyx").write_text("")
    with pytest.raises(Skipped, match=r"^the kernel lab is not built: .*\(make dev\)$"):
        needs.lab()
    (tmp_path / "matmul_1.cpython-311-x86_64-linux-gnu.so").write_text("")
    needs.lab()   # built: a variant that then does not import fails its own test


def test_llama2c_skips_where_llama2c_dir_is_unset(monkeypatch):
    monkeypatch.delenv("LLAMA2C_DIR", raising=False)
    with pytest.raises(Skipped, match=r"^LLAMA2C_DIR does not name a llama2\.c checkout"):
        needs.llama2c()
    monkeypatch.setenv("LLAMA2C_DIR", "/somewhere/llama2.c")
    assert needs.llama2c() == "/somewhere/llama2.c"


def test_mpiexec_skips_where_there_is_none(tmp_path, monkeypatch):
    needs.package("mpi4py")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(Skipped, match=r"^no mpiexec or mpirun beside .* or on PATH \(pip install mpich\)$"):
        needs.mpiexec()
    launcher = fake_program(tmp_path, "mpirun", "")
    assert needs.mpiexec() == str(launcher)


def test_gpt2_ranks_skip_only_where_none_can_be_had(monkeypatch):
    def failing(error):
        def gpt2_encoding():
            raise error
        monkeypatch.setattr(tokenizer, "gpt2_encoding", gpt2_encoding)
    failing(tokenizer.TokenizerError("cannot get GPT-2's BPE ranks: tiktoken's download failed ..."))
    with pytest.raises(Skipped, match=r"^no GPT-2 ranks here: cannot get GPT-2's BPE ranks"):
        needs.gpt2_encoding()
    failing(tokenizer.TokenizerError("some other tokenizer failure"))
    with fails(tokenizer.TokenizerError, match="some other"):
        needs.gpt2_encoding()
    failing(ValueError("a bad cache file"))
    with fails(ValueError):
        needs.gpt2_encoding()
