"""Build fp8mix: the C core (csrc/core, via `make core`) as a static library,
linked into one torch extension, fp8mix._C, made from the op layer csrc/torch/*.cpp
(its CUDA kernels' file csrc/torch/ops_cuda.cpp only in a CUDA build) and, in a
CUDA build, the CUDA kernels and the cuBLASLt GEMM (csrc/cuda/*.cu).

Which build:
  * CUDA (CUDAExtension, FP8MIX_WITH_CUDA defined, sm_89 + sm_90 code and
    compute_90 PTX, linked with cuBLASLt) when torch was built with CUDA
    (torch.version.cuda) and nvcc is found (CUDA_HOME / PATH);
  * otherwise CPU only (CppExtension).
  FP8MIX_FORCE_CPU=1 forces the CPU build; FP8MIX_FORCE_CUDA=1 forces the CUDA
  build and fails with a message when it cannot be done.
The C core is built by the Makefile because its SIMD variant files need their
own -m flags and it must also build alone (tests, sanitizers, fuzzers).
No fast-math anywhere (it breaks the NaN and rounding rules).
Environment: CC picks the C compiler; FP8MIX_MAKE the make program;
FP8MIX_CUDA_ARCHS (e.g. "89;90") overrides the GPU architectures.
"""
import glob
import importlib.util
import os
import shutil
import subprocess
import sys


def _toolkit_behind_wrapper():
    """CUDA_HOME for an nvcc on PATH that is a wrapper script (e.g. /usr/local/bin/nvcc running
    /usr/local/cuda-13.0/bin/nvcc): torch derives CUDA_HOME from nvcc's folder and would look
    for the CUDA headers and libraries in /usr/local. Asks nvcc itself for its toolkit (the
    TOP of `nvcc -v`); sets nothing when CUDA_HOME/CUDA_PATH is set or the folder above nvcc
    already holds the toolkit's headers."""
    nvcc = shutil.which("nvcc")
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or not nvcc:
        return
    if os.path.exists(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include", "cuda_runtime_api.h")):
        return
    try:
        out = subprocess.run([nvcc, "-v", "-E", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True,
                             text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return
    for line in out.splitlines():
        if line.startswith("#$ TOP="):
            top = os.path.realpath(line.split("=", 1)[1].strip())
            if os.path.exists(os.path.join(top, "include", "cuda_runtime_api.h")):
                os.environ["CUDA_HOME"] = top
            return


_toolkit_behind_wrapper()  # before torch.utils.cpp_extension reads CUDA_HOME

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_BUILD = os.path.join("build", "core-ext")
CORE_LIB = os.path.join(ROOT, CORE_BUILD, "libfp8mix_core.a")


class BuildWithCore(BuildExtension):
    def build_extensions(self):
        make = os.environ.get("FP8MIX_MAKE", "make")
        jobs = str(max(1, os.cpu_count() or 1))
        subprocess.check_call([make, "-C", ROOT, "-j", jobs, "core", f"BUILD={CORE_BUILD}"])
        super().build_extensions()


def _flag(name):
    return os.environ.get(name, "") not in ("", "0")


def _torch_sources(cuda):
    """The op layer's C++ files (csrc/torch): every one, except the CUDA kernels' file in a CPU build."""
    return [f for f in sorted(glob.glob("csrc/torch/*.cpp")) if cuda or os.path.basename(f) != "ops_cuda.cpp"]


def _nvcc():
    """Path of nvcc (the one torch's CUDA_HOME points at, else PATH), or None."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - very old torch
        CUDA_HOME = None
    if CUDA_HOME:
        p = os.path.join(CUDA_HOME, "bin", "nvcc")
        if os.path.exists(p):
            return p
    return shutil.which("nvcc")


def _nvidia_dirs(sub):
    """<site-packages>/nvidia/*/<sub> of the pip CUDA packages torch depends on
    (CUDA 13 wheels: nvidia/cu13/...; CUDA 12: nvidia/cublas/...)."""
    spec = importlib.util.find_spec("nvidia")
    out = []
    for base in (spec.submodule_search_locations if spec else []) or []:
        out += sorted(glob.glob(os.path.join(base, "*", sub)))
    return out


def _cublaslt(cuda_home):
    """(extra compile flags, link args) for cuBLASLt: the toolkit's, else the pip package's.

    The toolkit's own include folder is already on the path (torch adds CUDA_HOME/include), so a
    toolkit with cublasLt.h needs nothing more.  Otherwise only the pip folder holding cublasLt.h
    is added, with -isystem: searched after every -I folder, so the toolkit's runtime headers still
    win over the wheel's copies (nvidia/cu13/include also ships cuda_runtime*.h and crt/, which
    must not shadow nvcc's own when the two minor versions differ)."""
    flags = []
    tk_inc = os.path.join(cuda_home, "include") if cuda_home else None
    if not (tk_inc and os.path.exists(os.path.join(tk_inc, "cublasLt.h"))):
        incs = [d for d in _nvidia_dirs("include") if os.path.exists(os.path.join(d, "cublasLt.h"))]
        if not incs:
            sys.exit("fp8mix: CUDA build needs cublasLt.h (CUDA toolkit or the pip package nvidia-cublas); not found")
        flags = ["-isystem", incs[0]]
    for d in ([os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")] if cuda_home else []):
        if os.path.exists(os.path.join(d, "libcublasLt.so")):
            return flags, [f"-L{d}", "-lcublasLt"]
    for d in _nvidia_dirs("lib"):
        libs = sorted(glob.glob(os.path.join(d, "libcublasLt.so*")))
        if libs:
            return flags, [libs[0], f"-Wl,-rpath,{d}"]
    sys.exit("fp8mix: CUDA build needs libcublasLt (CUDA toolkit or the pip package nvidia-cublas); not found")


def _cuda_ext():
    from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension

    archs = [a.strip() for a in os.environ.get("FP8MIX_CUDA_ARCHS", "89;90").replace(",", ";").split(";") if a.strip()]
    gencode = []
    for a in archs:
        gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    gencode += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]  # PTX for newer GPUs
    blas_flags, link = _cublaslt(CUDA_HOME)
    return CUDAExtension(
        name="fp8mix._C",
        sources=_torch_sources(cuda=True) + sorted(glob.glob("csrc/cuda/*.cu")),
        include_dirs=[os.path.join(ROOT, "csrc", "include")],
        define_macros=[("FP8MIX_WITH_CUDA", None)],
        extra_objects=[CORE_LIB],
        extra_compile_args={
            "cxx": ["-O2", "-fno-fast-math"] + blas_flags + _openmp_flags(),
            "nvcc": ["-O3", "-std=c++17", "-Xcompiler", "-fno-fast-math"] + blas_flags + gencode,
        },
        extra_link_args=["-lpthread"] + link,
    )


def _openmp_flags():
    """-fopenmp for the op layer (csrc/torch) where torch runs its intra-op threads on OpenMP
    and the C++ compiler is GCC: at::parallel_for, which hands the C core's parallel loops
    to torch's threads, is an OpenMP pragma compiled into csrc/torch/module.cpp (without the
    flag it runs serially).  Compile flag only: the GOMP entry points resolve at load time to the
    OpenMP runtime torch already loaded, so there is one thread pool, not two."""
    if not (sys.platform.startswith("linux") and torch.backends.openmp.is_available()):
        return []
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["-fopenmp"] if "clang" not in out.lower() else []


def _cpu_ext():
    return CppExtension(
        name="fp8mix._C",
        sources=_torch_sources(cuda=False),
        include_dirs=[os.path.join(ROOT, "csrc", "include")],
        extra_objects=[CORE_LIB],
        extra_compile_args=["-O2", "-fno-fast-math"] + _openmp_flags(),
        extra_link_args=["-lpthread"],
    )


def _choose():
    force_cpu, force_cuda = _flag("FP8MIX_FORCE_CPU"), _flag("FP8MIX_FORCE_CUDA")
    if force_cpu and force_cuda:
        sys.exit("fp8mix: FP8MIX_FORCE_CPU and FP8MIX_FORCE_CUDA are both set; pick one")
    if force_cpu:
        return _cpu_ext()
    nvcc = _nvcc()
    if torch.version.cuda and nvcc:
        print(f"fp8mix: CUDA build (torch CUDA {torch.version.cuda}, nvcc {nvcc})")
        return _cuda_ext()
    if force_cuda:
        sys.exit("fp8mix: FP8MIX_FORCE_CUDA=1 but a CUDA build is not possible: "
                 f"torch.version.cuda={torch.version.cuda!r} (a CUDA build of torch is needed), "
                 f"nvcc={'found at ' + nvcc if nvcc else 'not found (set CUDA_HOME or PATH)'}")
    return _cpu_ext()


setup(
    ext_modules=[_choose()],
    cmdclass={"build_ext": BuildWithCore},
)
