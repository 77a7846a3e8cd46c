"""Build fp8mix: the C core (csrc/core, via `make core`) as a static library,
linked into one torch extension, fp8mix._C, made from csrc/torch_ops.cpp.

The C core is built by the Makefile because its SIMD variant files need their
own -m flags and it must also build alone (tests, sanitizers, fuzzers).
Environment: CC picks the C compiler; FP8MIX_MAKE the make program.
"""
import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_BUILD = os.path.join("build", "core-ext")
CORE_LIB = os.path.join(ROOT, CORE_BUILD, "libfp8mix_core.a")


class BuildWithCore(BuildExtension):
    def build_extensions(self):
        make = os.environ.get("FP8MIX_MAKE", "make")
        jobs = str(max(1, os.cpu_count() or 1))
        subprocess.check_call([make, "-C", ROOT, "-j", jobs, "core", f"BUILD={CORE_BUILD}"])
        super().build_extensions()


ext = CppExtension(
    name="fp8mix._C",
    sources=["csrc/torch_ops.cpp"],
    include_dirs=[os.path.join(ROOT, "csrc", "include")],
    extra_objects=[CORE_LIB],
    extra_compile_args=["-O2", "-fno-fast-math"],
    extra_link_args=["-lpthread"],
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithCore},
)
