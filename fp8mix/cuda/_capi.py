"""ctypes bindings to the few C entry points of fp8mix._C that the torch ops do not
expose: fp8mix_mm_layout_plan (cuBLASLt's layout rules, testable on any CPU) and the
casts with every fp8mix_cast_opts field (inf_to_nan has no op argument yet), on the
CPU (fp8mix_cast) and on CUDA (fp8mix_cuda_cast, CUDA builds only).

The structures mirror csrc/include/fp8mix.h field for field (ctypes applies the C
alignment rules); the C core is linked into fp8mix._C with default visibility.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
from dataclasses import dataclass

import torch

__all__ = ["MmProblem", "MmPlan", "mm_layout_plan", "cast_raw", "RULE_NAMES", "COPY_NAMES", "STATUS_NAMES"]

_i64, _u64, _int, _sz = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t

STATUS_NAMES = {0: "OK", 1: "NULL_POINTER", 2: "BAD_SHAPE", 3: "BAD_ENUM", 4: "BAD_SCALE", 5: "UNSUPPORTED",
                6: "NO_MEMORY", 7: "BAD_ARG"}
RULE_NAMES = {0: "ok", 1: "arch", 2: "formats", 3: "scale_arch", 4: "scale_version", 5: "scale_mix", 6: "shape"}
COPY_NAMES = {0: "in_place", 1: "pad", 2: "transpose"}
KIND_CODES = {"tensor": 0, "outer": 1, "block": 2}
_FMT = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}
_DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class MmProblem(ctypes.Structure):
    """fp8mix_mm_problem."""

    _fields_ = [("m", _i64), ("n", _i64), ("k", _i64), ("fmt_a", _int), ("fmt_b", _int),
                ("a_stride0", _i64), ("a_stride1", _i64), ("b_stride0", _i64), ("b_stride1", _i64),
                ("a_addr", _u64), ("b_addr", _u64), ("scale_a_kind", _int), ("scale_b_kind", _int),
                ("sa_addr", _u64), ("sb_addr", _u64), ("has_bias", _int), ("bias_t", _int), ("bias_addr", _u64),
                ("out_t", _int), ("out_addr", _u64), ("fast_accum", _int), ("sm", _int), ("blas_version", _i64)]


class MmScaleMap(ctypes.Structure):
    """fp8mix_mm_scale_map."""

    _fields_ = [("repack", _int), ("rows", _i64), ("cols", _i64), ("valid_rows", _i64), ("valid_cols", _i64),
                ("src_stride_r", _i64), ("src_stride_c", _i64)]


class MmPlan(ctypes.Structure):
    """fp8mix_mm_plan."""

    _fields_ = [("rule", _int), ("mp", _i64), ("np", _i64), ("kp", _i64), ("copy_a", _int), ("copy_b", _int),
                ("lda", _i64), ("ldb", _i64), ("kind", _int), ("sa", MmScaleMap), ("sb", MmScaleMap),
                ("bias_epilogue", _int), ("copy_bias", _int), ("bias_add", _int), ("d_t", _int),
                ("d_in_scratch", _int), ("fast_accum", _int), ("off_a", _sz), ("off_b", _sz), ("off_sa", _sz),
                ("off_sb", _sz), ("off_bias", _sz), ("off_d", _sz), ("off_ws", _sz), ("workspace_bytes", _sz),
                ("scratch_bytes", _sz)]


class _CastOpts(ctypes.Structure):
    """fp8mix_cast_opts."""

    _fields_ = [("fmt", _int), ("saturate", _int), ("rounding", _int), ("seed", _u64), ("offset", _u64),
                ("inf_to_nan", _int)]


def _c_path() -> str:
    """The file of the fp8mix._C extension (loaded by fp8mix.ops already)."""
    return str(importlib.import_module("fp8mix._C").__file__)


@functools.lru_cache(maxsize=None)
def _plan_lib(path: str | None) -> ctypes.CDLL:
    lib = ctypes.CDLL(path or _c_path())
    try:
        lib.fp8mix_mm_layout_plan.argtypes = [ctypes.POINTER(MmProblem), ctypes.POINTER(MmPlan)]
    except AttributeError:
        raise RuntimeError("fp8mix_mm_layout_plan is not in this library: a CPU-only fp8mix._C does not link it "
                           "(only the CUDA op uses it); pass a library built from csrc/core/mm_layout.c") from None
    lib.fp8mix_mm_layout_plan.restype = _int
    lib.fp8mix_mm_rule_string.argtypes = [_int]
    lib.fp8mix_mm_rule_string.restype = ctypes.c_char_p
    return lib


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(_c_path())
    p = ctypes.c_void_p
    lib.fp8mix_cast.argtypes = [p, _int, _i64, _i64, _i64, _int, p, p, _i64, p, _i64, p, ctypes.POINTER(_CastOpts)]
    lib.fp8mix_cast.restype = _int
    if hasattr(lib, "fp8mix_cuda_cast"):
        lib.fp8mix_cuda_cast.argtypes = [p, _int, _i64, _i64, _i64, _int, p, p, _i64, p, _i64, p, p,
                                         ctypes.POINTER(_CastOpts), p, _u64, p]  # ..., rng, rng_skip, stream
        lib.fp8mix_cuda_cast.restype = _int
    return lib


@dataclass(frozen=True)
class PlanResult:
    """What fp8mix_mm_layout_plan answered: its status name, the rule sentence and the plan."""

    status: str
    rule: str
    rule_text: str
    plan: MmPlan


def mm_layout_plan(problem: MmProblem, library: str | None = None) -> PlanResult:
    """Run fp8mix_mm_layout_plan on a problem (no device needed), from fp8mix._C (CUDA
    builds link it) or from `library`, a shared library built from mm_layout.c."""
    lib = _plan_lib(library)
    plan = MmPlan()
    st = lib.fp8mix_mm_layout_plan(ctypes.byref(problem), ctypes.byref(plan))
    text = lib.fp8mix_mm_rule_string(plan.rule).decode()
    return PlanResult(STATUS_NAMES.get(st, str(st)), RULE_NAMES.get(plan.rule, str(plan.rule)), text, plan)


def problem_of(a: torch.Tensor, b: torch.Tensor, kind_a: str, kind_b: str, *, out_dtype: torch.dtype,
               bias_dtype: torch.dtype | None = None, sm: int = 90, blas_version: int = 131000,
               fast_accum: bool = False) -> MmProblem:
    """The planning problem torch's CUDA op would build for a @ b (sizes, strides and
    alignment from the tensors, which may be fake or meta tensors of any device)."""
    p = MmProblem()
    p.m, p.k, p.n = a.shape[0], a.shape[1], b.shape[1]
    p.fmt_a, p.fmt_b = _FMT[a.dtype], _FMT[b.dtype]
    p.a_stride0, p.a_stride1 = a.stride()
    p.b_stride0, p.b_stride1 = b.stride()
    p.a_addr, p.b_addr = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    p.scale_a_kind, p.scale_b_kind = KIND_CODES[kind_a], KIND_CODES[kind_b]
    p.has_bias = bias_dtype is not None
    p.bias_t = _DT[bias_dtype] if bias_dtype is not None else 0
    p.out_t = _DT[out_dtype]
    p.fast_accum = int(fast_accum)
    p.sm, p.blas_version = sm, blas_version
    return p


def cast_raw(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype, *, saturate: bool = True,
             stochastic: bool = False, seed: int = 0, offset: int = 0, inf_to_nan: bool = False) -> torch.Tensor:
    """Per-tensor cast of a contiguous 2-D x with every fp8mix_cast_opts field: the C
    core on CPU tensors, fp8mix_cuda_cast (current stream) on CUDA tensors.  Returns q."""
    if x.dim() != 2 or not x.is_contiguous() or x.dtype not in _DT or scale.numel() != 1:
        raise ValueError("cast_raw: x must be a contiguous 2-D float32/bfloat16/float16 tensor, scale one float")
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=fp8_dtype, device=x.device)
    amax = torch.empty((), dtype=torch.float32, device=x.device)
    s = scale.to(device=x.device, dtype=torch.float32).reshape(()).contiguous()
    o = _CastOpts(_FMT[fp8_dtype], int(saturate), int(stochastic), seed % 2**64, offset % 2**64, int(inf_to_nan))
    args = [x.data_ptr(), _DT[x.dtype], rows, cols, max(cols, 1), 0, s.data_ptr(), q.data_ptr(), max(cols, 1), None,
            1, amax.data_ptr()]
    lib = _lib()
    if x.device.type == "cuda":
        if not hasattr(lib, "fp8mix_cuda_cast"):
            raise RuntimeError("cast_raw: this fp8mix build has no CUDA kernels")
        st = lib.fp8mix_cuda_cast(*args, None, ctypes.byref(o), None, 0,
                                  torch.cuda.current_stream(x.device).cuda_stream)
    else:
        st = lib.fp8mix_cast(*args, ctypes.byref(o))
    if st != 0:
        raise RuntimeError(f"cast_raw: status {STATUS_NAMES.get(st, st)}")
    return q
