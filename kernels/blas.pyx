# The kernels' GEMM library, chosen once when the kernels are imported:
#   LLMPYX_BLAS=openblas   scipy-openblas32's sgemm (linked into every extension; always there)
#   LLMPYX_BLAS=mkl        Intel's oneMKL (libmkl_rt from the `mkl` wheel), its sequential layer
#   unset or auto          MKL on an Intel CPU where libmkl_rt is installed, else OpenBLAS
# Why two: on the step's shapes, called single-threaded from our two OpenMP threads, MKL ran
# 10-20% faster than OpenBLAS on an Intel Xeon (dev/BENCHMARKS.md section 9); on the AMD Zen 4,
# PyTorch's MKL was the slower library (section 8), so AMD keeps OpenBLAS.
# Both take the same row-major CBLAS arguments with 32-bit ints (MKL's LP64 interface layer).
#
# The bf16 GEMM (bf16 operands, float32 products summed in float32, float32 C), chosen here too:
#   LLMPYX_BF16_GEMM=mkl   oneMKL's cblas_gemm_bf16bf16f32 (AMX or AVX512_BF16 where the CPU has them)
#   LLMPYX_BF16_GEMM=fp32  the operands widened to float32 (exact) and the float32 sgemm above:
#                          the same numbers up to the order of the sums, at float32's speed or below
#   unset or auto          mkl where the CPU has bf16 dot products (AVX512_BF16, AMX-BF16) and
#                          libmkl_rt loads, else fp32
# (OpenBLAS's sbgemm would serve AMD's Zen 4, but scipy-openblas32 does not export it.)
import os
import re
import site
import sys

from kernels.cblas cimport CblasTrans, scipy_cblas_sgemm
from libc.stdlib cimport free, malloc

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

ctypedef void (*gemm_bf16_fn)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float,
                              const bf16*, int, const bf16*, int, float, float*, int) noexcept nogil

cdef sgemm_fn selected_sgemm = scipy_cblas_sgemm
cdef gemm_bf16_fn selected_gemm_bf16 = NULL   # NULL: through float32 (gemm_bf16_via_fp32)
cdef void* mkl_handle = NULL
mkl_version = None


cdef void sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) noexcept nogil:
    selected_sgemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)


cdef float* widened(CBLAS_TRANSPOSE trans, int rows, int cols, const bf16* X, int ldx,
                    int* ld) noexcept nogil:
    """op(X) (rows, cols) of a row-major bf16 matrix with leading dimension ldx, widened into a
    new float32 matrix stored as X is (ld: its row length), or NULL without memory."""
    cdef int r, c, stored_rows = cols if trans == CblasTrans else rows
    cdef int stored_cols = rows if trans == CblasTrans else cols
    cdef float* out = <float*>malloc(<size_t>stored_rows * stored_cols * sizeof(float) + 1)
    ld[0] = max(1, stored_cols)
    if out != NULL:
        for r in range(stored_rows):
            for c in range(stored_cols):
                out[<Py_ssize_t>r * stored_cols + c] = bf16_to_float(X[<Py_ssize_t>r * ldx + c])
    return out


cdef bint bf16_gemm_widens() noexcept nogil:
    return selected_gemm_bf16 == NULL


cdef int gemm_bf16_widened_b(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                             int M, int N, int K, float alpha, const bf16* A, int lda,
                             const float* B32, int ldb32, float beta, float* C,
                             int ldc) noexcept nogil:
    cdef int lda32
    cdef float* A32 = widened(transa, M, K, A, lda, &lda32)
    if A32 == NULL:
        return -1
    selected_sgemm(order, transa, transb, M, N, K, alpha, A32, lda32, B32, ldb32, beta, C, ldc)
    free(A32)
    return 0


cdef int gemm_bf16(CBLAS_ORDER order, CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb,
                   int M, int N, int K, float alpha, const bf16* A, int lda,
                   const bf16* B, int ldb, float beta, float* C, int ldc) noexcept nogil:
    if selected_gemm_bf16 != NULL:
        selected_gemm_bf16(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
        return 0
    # without bf16 hardware: the exact float32 values of the operands through sgemm (a bf16
    # product is exact in float32, so only the order of the sums differs)
    cdef int ldb32
    cdef float* B32 = widened(transb, K, N, B, ldb, &ldb32)
    if B32 == NULL:
        return -1
    cdef int failed = gemm_bf16_widened_b(order, transa, transb, M, N, K, alpha, A, lda, B32,
                                          ldb32, beta, C, ldc)
    free(B32)
    return failed


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


cdef tuple open_mkl():
    """libmkl_rt, loaded once and set to LP64 and its sequential layer: (its version, None), or
    (None, why not)."""
    global mkl_handle, mkl_version
    if mkl_handle != NULL:
        return mkl_version, None
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
    cdef set_layer_fn set_threading = <set_layer_fn>dlsym(handle, b"MKL_Set_Threading_Layer")
    cdef set_layer_fn set_interface = <set_layer_fn>dlsym(handle, b"MKL_Set_Interface_Layer")
    cdef version_fn get_version = <version_fn>dlsym(handle, b"MKL_Get_Version_String")
    if set_threading == NULL or set_interface == NULL or get_version == NULL:
        return None, "the libmkl_rt found lacks MKL's service functions"
    # before MKL's first call: they choose the libraries libmkl_rt dispatches to; each returns
    # the layer in force, another one where MKL already ran in this process
    if set_interface(MKL_INTERFACE_LP64) != MKL_INTERFACE_LP64:
        return None, "MKL already runs with 64-bit ints in this process"
    if set_threading(MKL_THREADING_SEQUENTIAL) != MKL_THREADING_SEQUENTIAL:
        return None, "MKL already runs with threads of its own in this process"
    get_version(version, sizeof(version))
    # "Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ..." -> "2026.2"
    found = re.search(r"Version ([0-9][0-9.]*)", version.decode(errors="replace"))
    mkl_handle, mkl_version = handle, (found.group(1) if found else "version unknown")
    return mkl_version, None


cdef tuple load_mkl():
    """Point sgemm at MKL's: (its version, None), or (None, why not) with sgemm left alone."""
    global selected_sgemm
    version, problem = open_mkl()
    if version is None:
        return None, problem
    cdef sgemm_fn mkl_sgemm = <sgemm_fn>dlsym(mkl_handle, b"cblas_sgemm")
    if mkl_sgemm == NULL:
        return None, "the libmkl_rt found lacks cblas_sgemm"
    selected_sgemm = mkl_sgemm
    return version, None


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


def cpu_bf16_features():
    """The CPU's bf16 dot-product extensions this machine reports ("avx512_bf16", "amx_bf16")."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]


cdef str choose_bf16():
    global selected_gemm_bf16
    choice = os.environ.get("LLMPYX_BF16_GEMM", "auto").strip().lower() or "auto"
    if choice not in ("auto", "mkl", "fp32"):
        raise ImportError(f"kernels.blas: LLMPYX_BF16_GEMM={choice!r}: expected mkl, fp32 or auto")
    features = cpu_bf16_features()
    if choice == "mkl" or (choice == "auto" and features):
        version, problem = open_mkl()
        gemm = <gemm_bf16_fn>dlsym(mkl_handle, b"cblas_gemm_bf16bf16f32") if version else NULL
        if gemm != NULL:
            selected_gemm_bf16 = gemm
            return f"MKL {version} gemm_bf16bf16f32 ({', '.join(features) or 'no bf16 hardware'})"
        if choice == "mkl":
            raise ImportError(f"kernels.blas: LLMPYX_BF16_GEMM=mkl, but "
                              f"{problem or 'libmkl_rt lacks cblas_gemm_bf16bf16f32'}; or use "
                              "LLMPYX_BF16_GEMM=fp32")
    return f"float32 GEMMs on widened bf16 ({LIBRARY})"


# what the bf16 GEMMs run on, in words; HARDWARE_BF16: whether bf16 dot products run in hardware
BF16_LIBRARY = choose_bf16()
HARDWARE_BF16 = selected_gemm_bf16 != NULL and bool(cpu_bf16_features())
