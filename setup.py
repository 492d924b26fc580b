"""
Build of llm.pyx: each .pyx becomes an extension module built in place, with one set of
compiler flags and Cython directives.  Two parts, built separately:
    the product   every .pyx in the repository outside dev/ (train_gpt2.pyx, kernels/, and any
                  new folder of them), found by walking the tree
    the lab       dev/cpu/*.pyx, the kernel variants dev/ab.py compares (LLMPYX_LAB=1)

    python setup.py build_ext --inplace                 (what `make train_gpt2` runs)
    LLMPYX_LAB=1 python setup.py build_ext --inplace    (what `make dev` runs)

Environment switches:
    NO_OMP=1        build without OpenMP (single-threaded kernels)
    DEBUG=1         Cython bounds/wraparound/initialized checks on, -O0 -g (slow, for debugging)
    NO_NATIVE=1     do not tune for this CPU (-march=native); for binaries that travel
    LLMPYX_ONLY=s   build only the modules whose dotted name contains s (e.g. kernels.gelu)
    LLMPYX_LAB=1    build the lab instead of the product

It says what it does: a line per module compiled ("[3/28] compiling accel.backend"), and one at
the end ("llm.pyx: built 28 modules in 127 s"). The headers of CPython, NumPy and OpenBLAS are included as
system headers (-isystem), so that their own warnings (GCC's -Warray-bounds in CPython's inline
functions, inlined into our modules) are not ours; ours are errors to fix, not to hide.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings

import numpy as np
import scipy_openblas32
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") not in ("", "0")


def compiler_accepts(flags, link_flags=(), source="int main(void) { return 0; }\n"):
    """True if the C compiler compiles and links `source` with these flags."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        cmd = cc.split() + list(flags) + [src, "-o", os.path.join(tmp, "probe")] + list(link_flags)
        try:
            return subprocess.run(cmd, capture_output=True).returncode == 0
        except OSError:
            return False


def openmp_flags():
    """(compile flags, link flags) for OpenMP, or ([], []) with a warning where there is none."""
    if os.environ.get("NO_OMP", "0") not in ("", "0"):
        print("llm.pyx: NO_OMP set, building single-threaded")
        return [], []
    probe = "#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n"
    if compiler_accepts(["-fopenmp"], ["-fopenmp"], probe):
        return ["-fopenmp"], ["-fopenmp"]
    if sys.platform == "darwin":  # Apple clang: OpenMP only through Homebrew's libomp
        brew = shutil.which("brew")
        prefixes = ["/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"]
        if brew:
            out = subprocess.run([brew, "--prefix", "libomp"], capture_output=True, text=True)
            prefixes.insert(0, out.stdout.strip())
        for prefix in prefixes:
            cflags = ["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"]
            lflags = [f"-L{prefix}/lib", "-lomp", f"-Wl,-rpath,{prefix}/lib"]
            if prefix and compiler_accepts(cflags, lflags, probe):
                return cflags, lflags
    warnings.warn("llm.pyx: the compiler has no OpenMP (on macOS: brew install libomp); "
                  "building single-threaded kernels")
    return [], []


def compile_flags():
    flags = ["-O0", "-g"] if DEBUG else ["-O3"]
    # The safe part of -ffast-math: lets GCC/Clang vectorise float reductions, keeps inf/nan
    # semantics (never -ffast-math: finite-math-only breaks GELU's tanh in backward).
    flags += ["-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]
    if os.environ.get("NO_NATIVE", "0") in ("", "0") and compiler_accepts(["-march=native"]):
        flags.append("-march=native")
    flags += ["-Wno-unused-function", "-Wno-unreachable-code"]
    return flags


def product_sources():
    """Every .pyx below HERE outside dev/, skipping build output, hidden folders and any
    virtual environment kept in the tree (their packages may ship .pyx files)."""
    sources = []
    for root, dirs, files in os.walk(HERE):
        dirs[:] = sorted(d for d in dirs
                         if not d.startswith(".")
                         and not (root == HERE and d in ("dev", "build"))
                         and not os.path.exists(os.path.join(root, d, "pyvenv.cfg")))
        sources += [os.path.relpath(os.path.join(root, f), HERE)
                    for f in sorted(files) if f.endswith(".pyx")]
    return sources


def generate_table_code():
    """accel/codegen.py: the backend table's struct, wrappers and adapters from accel/spec.py."""
    sys.path.insert(0, os.path.join(HERE, "accel"))
    import codegen
    sys.path.pop(0)
    codegen.main()


def third_party_includes():
    """The include folders of CPython, NumPy and OpenBLAS."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["include"], paths["platinclude"], np.get_include(),
                               scipy_openblas32.get_include_dir()]))


def extensions():
    generate_table_code()
    omp_compile, omp_link = openmp_flags()
    # -isystem: GCC and Clang then ignore setuptools' -I of CPython's folder
    system_includes = [flag for path in third_party_includes() for flag in ("-isystem", path)]
    cflags = compile_flags() + omp_compile + system_includes
    blas_lib_dir = scipy_openblas32.get_lib_dir()
    only = os.environ.get("LLMPYX_ONLY", "")
    lab = os.environ.get("LLMPYX_LAB", "0") not in ("", "0")
    sources = sorted(glob.glob(os.path.join("dev", "cpu", "*.pyx"))) if lab else product_sources()
    exts = []
    for src in sources:
        name = src[:-len(".pyx")].replace(os.sep, ".")
        if only and only not in name:
            continue
        exts.append(Extension(
            name, [src],
            include_dirs=[HERE],
            library_dirs=[blas_lib_dir],
            libraries=[scipy_openblas32.get_library()],
            runtime_library_dirs=[blas_lib_dir] if sys.platform != "win32" else [],
            extra_compile_args=cflags,
            extra_link_args=omp_link,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ))
    return exts


class BuildSayingWhat(build_ext):
    """build_ext that prints a line per module it compiles and the total at the end (setup.py
    -q silences setuptools' own lines)."""

    def run(self):
        self.to_compile = [ext.name for ext in self.extensions if self.force or self.stale(ext)]
        start = time.perf_counter()
        super().run()
        n = len(self.to_compile)
        print(f"llm.pyx: built {n} module{'s' if n != 1 else ''} in "
              f"{time.perf_counter() - start:.0f} s" if n else
              f"llm.pyx: all {len(self.extensions)} modules up to date", flush=True)

    def stale(self, ext):
        """True when the module is missing or older than a source (setuptools' own test)."""
        module = self.get_ext_fullpath(ext.name)
        return not os.path.exists(module) or any(
            os.path.getmtime(src) > os.path.getmtime(module) for src in [*ext.sources, *ext.depends])

    def build_extension(self, ext):
        if ext.name in self.to_compile:
            print(f"[{self.to_compile.index(ext.name) + 1}/{len(self.to_compile)}] compiling "
                  f"{ext.name}", flush=True)
        super().build_extension(ext)


directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}

setup(
    name="llm.pyx",
    packages=[],
    ext_modules=cythonize(extensions(), compiler_directives=directives, nthreads=os.cpu_count() or 1,
                          include_path=[HERE]),
    zip_safe=False,
    cmdclass={"build_ext": BuildSayingWhat},
)
