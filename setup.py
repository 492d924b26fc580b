"""
Build of llm.pyx: each .pyx becomes an extension module built in place (beside its .pyx, where
Python imports it from), with one set of compiler flags and Cython directives; the C that Cython
generates, and the objects, go under build/ (build/cython/<path>.c).  Two parts, built separately:
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

Cython's utility code (typed memoryviews, most of each module's C) is generated and compiled once,
into a shared module of its own, llmc/_cyutility (Cython's shared utility module), that every other
module imports: each module's C is a third of what it was, and the build takes half the time.

Modules compile in parallel, one job per core (build_ext -j N sets another count).  It says what
it does: a line per module compiled ("[3/31] compiling accel.backend"), and one at the end
("llm.pyx: built 31 modules in 185 s, 0 compiler warnings"), the warnings counted in what the
compiler and the linker print as they go.

The backend table's generated code (accel/generated/, from accel/spec.py by accel/codegen.py) is
committed, and the build only checks it: it stops, in one line naming the file and `make
generate`, when a file is not what the spec makes now.  A tree built before Cython's C moved under
build/ holds that C beside each .pyx (and the old generated accel/_*.pxi): the build removes each
such file whose first line says a generator wrote it, in one line saying so.

The headers of CPython, NumPy and OpenBLAS are included as system headers (-isystem), so that
their own warnings (GCC's -Warray-bounds in CPython's inline functions, inlined into our modules)
are not ours; ours are errors to fix, not to hide.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings

import numpy as np
import scipy_openblas32
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("DEBUG", "0") not in ("", "0")
# the module holding Cython's utility code for all the others (the product builds it, the lab uses it)
SHARED_UTILITY = "llmc._cyutility"


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


def lab_sources():
    """The kernel lab's variants: dev/cpu/*.pyx."""
    return sorted(os.path.relpath(path, HERE) for path in glob.glob(os.path.join(HERE, "dev", "cpu", "*.pyx")))


def check_generated_code():
    """Stop, in one line, when accel/generated/ is not what accel/spec.py makes now."""
    sys.path.insert(0, os.path.join(HERE, "accel"))
    import codegen
    sys.path.pop(0)
    error = codegen.check()
    if error:
        sys.exit(error)


# the first line of a file that an older build wrote among the sources: Cython's C beside each
# .pyx, accel/codegen.py's tables as accel/_*.pxi
OLD_OUTPUT_FIRST_LINES = ("/* Generated by Cython ", "# Generated by accel/codegen.py ")


def remove_old_outputs():
    """Remove what a build before build/cython wrote beside the sources, each file only where its
    first line says a generator wrote it (a hand-written .c beside a .pyx stays)."""
    candidates = [source[:-len(".pyx")] + ".c" for source in product_sources() + lab_sources()]
    candidates += [os.path.relpath(path, HERE) for path in glob.glob(os.path.join(HERE, "accel", "_*.pxi"))]
    removed = []
    for path in candidates:
        full = os.path.join(HERE, path)
        if os.path.isfile(full):
            with open(full, errors="replace") as f:
                generated = f.readline().startswith(OLD_OUTPUT_FIRST_LINES)
            if generated:
                os.remove(full)
                removed.append(path)
    if removed:
        print(f"llm.pyx: removed {len(removed)} generated file{'s' if len(removed) != 1 else ''} that an "
              f"older build left beside the sources ({removed[0]}{', ...' if len(removed) > 1 else ''}): "
              f"Cython's C goes under build/cython now", flush=True)


def third_party_includes():
    """The include folders of CPython, NumPy and OpenBLAS."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["include"], paths["platinclude"], np.get_include(),
                               scipy_openblas32.get_include_dir()]))


def extensions():
    check_generated_code()
    remove_old_outputs()
    omp_compile, omp_link = openmp_flags()
    # -isystem: GCC and Clang then ignore setuptools' -I of CPython's folder
    system_includes = [flag for path in third_party_includes() for flag in ("-isystem", path)]
    cflags = compile_flags() + omp_compile + system_includes
    blas_lib_dir = scipy_openblas32.get_lib_dir()
    only = os.environ.get("LLMPYX_ONLY", "")
    lab = os.environ.get("LLMPYX_LAB", "0") not in ("", "0")
    sources = lab_sources() if lab else product_sources()
    names = [src[:-len(".pyx")].replace(os.sep, ".") for src in sources]
    chosen = [(name, [src]) for name, src in zip(names, sources) if only in name]
    if chosen and not lab:
        chosen.append((SHARED_UTILITY, []))   # cythonize writes its C
    exts = []
    for name, srcs in chosen:
        exts.append(Extension(
            name, srcs,
            include_dirs=[HERE],
            library_dirs=[blas_lib_dir],
            libraries=[scipy_openblas32.get_library()],
            runtime_library_dirs=[blas_lib_dir] if sys.platform != "win32" else [],
            extra_compile_args=cflags,
            extra_link_args=omp_link,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ))
    return exts


def counted(n, noun):
    """"1 module", "31 modules"."""
    return f"{n} {noun}{'s' if n != 1 else ''}"


class CompilerWarnings:
    """The warnings that the compiler and the linker print while a build runs, counted for its
    closing line: standard error (file descriptor 2, which each compile inherits: setuptools runs
    the compiler through functions that changed over its versions, the descriptor stays) goes
    through a pipe, and on to where it went, line by line as it comes; a line where GCC, Clang
    or ld warns ("file.c:12:5: warning: ...") counts one."""

    WARNING = re.compile(rb": warning: ")

    def __enter__(self):
        self.count = 0
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        self.stderr = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        self.reader = threading.Thread(target=self.pass_on, args=(read_end,))
        self.reader.start()
        return self

    def pass_on(self, read_end):
        with open(read_end, "rb") as pipe, open(self.stderr, "wb", closefd=False) as stderr:
            for line in pipe:
                stderr.write(line)
                stderr.flush()
                self.count += bool(self.WARNING.search(line))

    def __exit__(self, *exc_info):
        sys.stderr.flush()
        os.dup2(self.stderr, 2)   # closes the pipe's last write end: the reader reaches its end
        self.reader.join()
        os.close(self.stderr)


class BuildSayingWhat(build_ext):
    """build_ext that compiles the modules in parallel, one job per core unless -j says otherwise,
    and prints a line per module it compiles and at the end their number and the compiler's
    warnings (setup.py -q silences setuptools' own lines)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        self.to_compile = [ext.name for ext in self.extensions if self.force or self.stale(ext)]
        start = time.perf_counter()
        with CompilerWarnings() as warnings_printed:
            super().run()
        print(f"llm.pyx: built {counted(len(self.to_compile), 'module')} in "
              f"{time.perf_counter() - start:.0f} s, {counted(warnings_printed.count, 'compiler warning')}"
              if self.to_compile else f"llm.pyx: all {len(self.extensions)} modules up to date", flush=True)

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

# build_dir relative, as the sources are (setup.py runs in the repository's root): the objects then
# go to build/temp.*/build/cython/..., not under a copy of the absolute path
setup(
    name="llm.pyx",
    packages=[],
    ext_modules=cythonize(extensions(), compiler_directives=directives, nthreads=os.cpu_count() or 1,
                          include_path=[HERE], build_dir=os.path.join("build", "cython"),
                          shared_utility_qualified_name=SHARED_UTILITY),
    zip_safe=False,
    cmdclass={"build_ext": BuildSayingWhat},
)
