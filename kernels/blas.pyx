# The kernels' GEMM library, chosen once when the kernels are imported:
#   LLMPYX_BLAS=openblas   scipy-openblas32's sgemm (linked into every extension; always there)
#   LLMPYX_BLAS=mkl        Intel's oneMKL (libmkl_rt from the `mkl` wheel), its sequential layer
#   unset or auto          MKL on an Intel CPU where libmkl_rt is installed, else OpenBLAS
# Why two: on the step's shapes, called single-threaded from our two OpenMP threads, MKL ran
# 10-20% faster than OpenBLAS on an Intel Xeon (dev/BENCHMARKS.md section 9); on the AMD Zen 4,
# PyTorch's MKL was the slower library (section 8), so AMD keeps OpenBLAS.
# Both take the same row-major CBLAS arguments with 32-bit ints (MKL's LP64 interface layer).
import os
import re
import site
import sys

from kernels.cblas cimport scipy_cblas_sgemm

cdef extern from "dlfcn.h" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_LOCAL

ctypedef void (*sgemm_fn)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float,
                          const float*, int, const float*, int, float, float*, int) noexcept nogil
ctypedef int (*set_layer_fn)(int) noexcept nogil
ctypedef void (*version_fn)(char*, int) noexcept nogil

cdef enum:
    MKL_THREADING_SEQUENTIAL = 1   # mkl_service.h: no threads of MKL's own
    MKL_INTERFACE_LP64 = 0         # 32-bit ints, as OpenBLAS's CBLAS

cdef sgemm_fn selected_sgemm = scipy_cblas_sgemm


cdef void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) noexcept nogil:
    selected_sgemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)


def _intel_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:   # not Linux: no mkl wheel is used there
        return False


def _mkl_paths():
    """Where the mkl wheel puts libmkl_rt (the environment's lib/, or the user's), then the
    loader's own search path (a system MKL)."""
    names = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so")
    dirs = [os.path.join(sys.prefix, "lib"), os.path.join(site.getuserbase(), "lib")]
    return [os.path.join(d, n) for d in dirs for n in names] + list(names)


cdef tuple load_mkl():
    """Point sgemm at MKL's: (its version, None), or (None, why not) with sgemm left alone."""
    global selected_sgemm
    cdef void* handle = NULL
    cdef char version[200]
    for path in _mkl_paths():
        if os.sep in path and not os.path.exists(path):
            continue
        handle = dlopen(os.fsencode(path), RTLD_NOW | RTLD_LOCAL)
        if handle != NULL:
            break
    if handle == NULL:
        return None, "no libmkl_rt was found (pip install mkl)"
    cdef sgemm_fn mkl_sgemm = <sgemm_fn>dlsym(handle, b"cblas_sgemm")
    cdef set_layer_fn set_threading = <set_layer_fn>dlsym(handle, b"MKL_Set_Threading_Layer")
    cdef set_layer_fn set_interface = <set_layer_fn>dlsym(handle, b"MKL_Set_Interface_Layer")
    cdef version_fn get_version = <version_fn>dlsym(handle, b"MKL_Get_Version_String")
    if mkl_sgemm == NULL or set_threading == NULL or set_interface == NULL or get_version == NULL:
        return None, "the libmkl_rt found lacks cblas_sgemm or MKL's service functions"
    # before MKL's first call: they choose the libraries libmkl_rt dispatches to; each returns
    # the layer in force, another one where MKL already ran in this process
    if set_interface(MKL_INTERFACE_LP64) != MKL_INTERFACE_LP64:
        return None, "MKL already runs with 64-bit ints in this process"
    if set_threading(MKL_THREADING_SEQUENTIAL) != MKL_THREADING_SEQUENTIAL:
        return None, "MKL already runs with threads of its own in this process"
    get_version(version, sizeof(version))
    selected_sgemm = mkl_sgemm
    # "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..." -> "2026.2"
    found = re.search(r"Version ([0-9][0-9.]*)", version.decode(errors="replace"))
    return (found.group(1) if found else "version unknown"), None


cdef str choose():
    choice = os.environ.get("LLMPYX_BLAS", "auto").strip().lower() or "auto"
    if choice not in ("auto", "openblas", "mkl"):
        raise ImportError(f"kernels.blas: LLMPYX_BLAS={choice!r}: expected openblas, mkl or auto")
    if choice == "mkl" or (choice == "auto" and _intel_cpu()):
        version, problem = load_mkl()
        if version is not None:
            return f"MKL {version} (sequential)"
        if choice == "mkl":
            raise ImportError(f"kernels.blas: LLMPYX_BLAS=mkl, but {problem}; "
                              "or use LLMPYX_BLAS=openblas")
    return "OpenBLAS (scipy-openblas32)"


LIBRARY = choose()   # what the kernels' GEMMs run on, in words (train.py and dev/ print it)
