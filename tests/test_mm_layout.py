"""fp8mix_mm_layout_plan (cuBLASLt's FP8 GEMM layout rules, csrc/core/mm_layout.c) on
the CPU, through ctypes.

1. The GEMMs fp8mix.Linear really issues (forward, dgrad, wgrad; every recipe; M in
   {1, 77, 128, 4096}, N and K in {16, 48, 144, 4096, 11008}), captured from its
   scaled_mm calls under FakeTensorMode (sizes, strides and scale shapes as on a GPU,
   no arithmetic), must all be plannable on sm_90, with the copies the operand
   layouts imply, and refused only by the rules that apply on sm_89 / sm_100.
2. Executing a plan the way cuBLASLt is documented to read its operands (TN layout,
   leading dimensions, zero padding, OUTER_VEC / VEC128 / BLK128x128 scale indexing,
   bias epilogue or bias add) must give the float64 product of the original problem:
   this is what catches a padded M or a scale array read with the wrong stride (the
   M % 4 block-scale bug) before any GPU run.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from helpers import RECIPES
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import fp8mix
from fp8mix.cuda import _capi
from fp8mix.cuda.compare import random_scales, scaled_operands
from fp8mix.cuda.fallback import scale_kind

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENSOR, OUTER, BLOCK = 0, 1, 2


@pytest.fixture(scope="module")
def planlib(tmp_path_factory):
    """fp8mix._C when it links the planner (CUDA builds), else mm_layout.c built here."""
    try:
        _capi._plan_lib(None)
        return None
    except RuntimeError:
        pass
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build csrc/core/mm_layout.c for the CPU-only build")
    so = str(tmp_path_factory.mktemp("mm") / "libmm_layout.so")
    subprocess.run([cc, "-std=c11", "-O1", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc", "include"),
                    os.path.join(ROOT, "csrc", "core", "mm_layout.c"), "-o", so], check=True)
    return so


# ---- 1. the GEMMs fp8mix.Linear issues -------------------------------------------------

class _GemmRecorder(TorchDispatchMode):
    """Records every fp8mix::scaled_mm call (its tensors are fake: shapes and strides only)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.fp8mix.scaled_mm.default:
            a, b, sa, sb = args[:4]
            bias = args[4] if len(args) > 4 else None
            self.calls.append((a, b, sa, sb, None if bias is None else bias.dtype, args[5]))
        return func(*args, **(kwargs or {}))


_CAPTURED: dict = {}


def _linear_gemms(recipe: str, m: int, n: int, k: int):
    """The scaled_mm calls of two fwd+bwd steps of fp8mix.Linear(k, n) on m tokens."""
    key = (recipe, m, n, k)
    if key not in _CAPTURED:
        rec = _GemmRecorder()
        with FakeTensorMode():
            lin = fp8mix.Linear(k, n)
            x = torch.randn(m, k, requires_grad=True)
            with rec:
                for _ in range(2):
                    with fp8mix.fp8_autocast(enabled=True, fp8_recipe=RECIPES[recipe]()):
                        y = lin(x)
                    y.backward(torch.randn_like(y))
        _CAPTURED[key] = rec.calls
    return _CAPTURED[key]


def _kinds(a, b, sa, sb):
    k = scale_kind(a, b, sa, sb)
    if k == "block":
        return "block", "block"
    if k == "tensor":
        return "tensor", "tensor"
    return ("tensor" if sa.numel() == 1 else "outer"), ("tensor" if sb.numel() == 1 else "outer")


def _k_contiguous(t, rows_dim):
    """Is the operand contiguous along K (a: dim 1; b: dim 0) with non-overlapping rows?"""
    kdim = 1 - rows_dim
    return t.shape[kdim] == 1 or t.stride(kdim) == 1


MS, NK = (1, 77, 128, 4096), (16, 48, 144, 4096, 11008)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("m", MS)
def test_linear_gemms_plan_on_sm90(planlib, recipe, m):
    for n in NK:
        for k in NK:
            calls = _linear_gemms(recipe, m, n, k)
            assert len(calls) == 6, (recipe, m, n, k)  # 2 steps x (forward, dgrad, wgrad)
            for idx, (a, b, sa, sb, bias_t, out_t) in enumerate(calls):
                what = f"{recipe} M={m} N={n} K={k} gemm {idx % 3} ({('forward', 'dgrad', 'wgrad')[idx % 3]})"
                ka, kb = _kinds(a, b, sa, sb)
                res = _capi.mm_layout_plan(_capi.problem_of(a, b, ka, kb, out_dtype=out_t, bias_dtype=bias_t), planlib)
                assert res.status == "OK", (what, res.rule_text)
                pl = res.plan
                gm, gk, gn = a.shape[0], a.shape[1], b.shape[1]
                block = ka == "block"
                kq = 128 if block else 16  # block scales: whole 128-deep K blocks
                assert (pl.mp, pl.np, pl.kp) == ((gm + 3) // 4 * 4 if block else gm, (gn + 15) // 16 * 16,
                                                 (gk + kq - 1) // kq * kq), what
                a_fits = _k_contiguous(a, 0) and gk % kq == 0 and (not block or gm % 4 == 0)
                assert (_capi.COPY_NAMES[pl.copy_a] == "in_place") == a_fits, what
                b_name = _capi.COPY_NAMES[pl.copy_b]
                if not _k_contiguous(b, 1):
                    assert b_name == "transpose", what  # a row-major b crosses layouts
                else:
                    assert b_name == ("in_place" if gk % kq == 0 and gn % 16 == 0 else "pad"), what
                if idx % 3 == 0 and k % kq == 0 and n % 16 == 0:  # forward: no copy of x or W
                    assert b_name == "in_place" and (m % 4 == 0 or not block) == (pl.copy_a == 0), what


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linear_tensor_core_layouts_need_no_transposing_copy(planlib, recipe, monkeypatch):
    """With the operand layouts fp8mix.Linear uses on CUDA (x, W and dy cast with their
    transposes where a GEMM's B needs them; fp8mix.nn._plan.TN_ON_CPU takes that path on
    the CPU), no operand of any GEMM crosses layouts: copies are only zero padding."""
    from fp8mix.nn import _plan
    monkeypatch.setattr(_plan, "TN_ON_CPU", True)
    for m, n, k in ((4096, 4096, 4096), (77, 11008, 4096), (128, 48, 144)):
        _CAPTURED.pop((recipe, m, n, k), None)
        for idx, (a, b, sa, sb, bias_t, out_t) in enumerate(_linear_gemms(recipe, m, n, k)):
            ka, kb = _kinds(a, b, sa, sb)
            pl = _capi.mm_layout_plan(_capi.problem_of(a, b, ka, kb, out_dtype=out_t, bias_dtype=bias_t), planlib).plan
            assert pl.copy_a != 2 and pl.copy_b != 2, (recipe, m, n, k, idx % 3)
        _CAPTURED.pop((recipe, m, n, k), None)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_linear_gemms_refused_only_where_the_rules_say(planlib, recipe):
    for a, b, sa, sb, bias_t, out_t in _linear_gemms(recipe, 77, 144, 48):
        ka, kb = _kinds(a, b, sa, sb)
        for sm, blas, want in ((89, 131000, "scale_arch"), (100, 131000, "scale_arch"), (90, 120800, "scale_version"),
                               (86, 131000, "arch")):
            res = _capi.mm_layout_plan(_capi.problem_of(a, b, ka, kb, out_dtype=out_t, bias_dtype=bias_t, sm=sm,
                                                        blas_version=blas), planlib)
            if recipe == "block" or want == "arch":
                assert (res.status, res.rule) == ("UNSUPPORTED", want), (recipe, sm, blas)
                assert res.rule_text and "rule" not in res.rule_text
            else:  # per-tensor scales run on every FP8 device and cuBLASLt
                assert res.status == "OK", (recipe, sm, blas, res.rule_text)


# ---- 2. executing a plan as cuBLASLt reads it ---------------------------------------------

def _scale_array(m: _capi.MmScaleMap, given: torch.Tensor) -> torch.Tensor:
    """The flat scale array cuBLASLt receives: the given one, or the map's repacked copy."""
    src = given.double().reshape(-1)
    if not m.repack:
        return src
    out = torch.ones(m.rows * m.cols, dtype=torch.float64)
    for r in range(m.valid_rows):
        for c in range(m.valid_cols):
            out[r * m.cols + c] = src[r * m.src_stride_r + c * m.src_stride_c]
    return out


def _operand(t: torch.Tensor, copy: int, rows_p: int, kp: int, ld: int, b_operand: bool) -> torch.Tensor:
    """(rows_p, kp) float64: what cuBLASLt reads, K-contiguous rows with leading dimension
    ld, from the caller's memory (in place) or from the zero-padded copy."""
    if copy == 0:
        base = t if not b_operand else t.t()  # rows of K values
        view = torch.as_strided(base, (rows_p, kp), (ld, 1), base.storage_offset())
        return view.double()
    rows = t.t() if b_operand else t
    out = torch.zeros(rows_p, kp, dtype=torch.float64)
    out[:rows.shape[0], :rows.shape[1]] = rows.double()
    return out


def _emulate(pl: _capi.MmPlan, a, b, sa, sb, bias) -> torch.Tensor:
    """The product cuBLASLt computes for this plan, in float64, using the documented scale
    layouts: OUTER_VEC (one per row of cuBLAS's M = our N, one per column of its N = our
    M), VEC128 (N-major, offset kb * N_cublas + i), BLK128x128 (offset mb * L4 + kb)."""
    m, n = a.shape[0], b.shape[1]
    A = _operand(a, pl.copy_a, pl.mp, pl.kp, pl.lda, False)   # cuBLAS B^T: mp x kp
    B = _operand(b, pl.copy_b, pl.np, pl.kp, pl.ldb, True)    # cuBLAS A^T: np x kp
    SA, SB = _scale_array(pl.sa, sa), _scale_array(pl.sb, sb)
    if pl.kind == TENSOR:
        D = SA[0] * SB[0] * (A @ B.T)
    elif pl.kind == OUTER:
        D = SA[:pl.mp].reshape(-1, 1) * SB[:pl.np].reshape(1, -1) * (A @ B.T)
    else:
        nkb, l4 = -(-pl.kp // 128), -(-(-(-pl.kp // 128)) // 4) * 4
        D = torch.zeros(pl.mp, pl.np, dtype=torch.float64)
        i, j = torch.arange(pl.mp), torch.arange(pl.np)
        for kb in range(nkb):
            part = A[:, kb * 128:(kb + 1) * 128] @ B[:, kb * 128:(kb + 1) * 128].T
            D += part * SA[kb * pl.mp + i].reshape(-1, 1) * SB[(j // 128) * l4 + kb].reshape(1, -1)
    if pl.bias_epilogue:
        bp = torch.zeros(pl.np, dtype=torch.float64)
        bp[:n] = bias.double()
        D = D + bp
    out = D[:m, :n]
    return out + bias.double() if pl.bias_add else out


def _reference(a, b, sa, sb, kind, bias) -> torch.Tensor:
    ad, bd = scaled_operands(a, b, sa, sb, kind)
    out = ad @ bd
    return out + bias.double() if bias is not None else out


def _problem(m, n, k, kind, b_layout, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 8).to(E4)
    w = (torch.randn(n, k, generator=g) * 8).to(E4)
    b = w.t() if b_layout == "col" else w.t().contiguous()
    return (a, b) + random_scales(kind, m, n, k, g)


@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
@pytest.mark.parametrize("b_layout", ["col", "row"])
@pytest.mark.parametrize("bias", [None, torch.bfloat16, torch.float32])
def test_executed_plan_gives_the_product(planlib, kind, b_layout, bias):
    for i, (m, n, k) in enumerate([(1, 16, 16), (5, 40, 48), (77, 48, 144), (6, 144, 272), (64, 130, 256)]):
        a, b, sa, sb = _problem(m, n, k, kind, b_layout, i)
        bv = None if bias is None else (torch.randn(n) * 10).to(bias)
        ka, kb = _kinds(a, b, sa, sb)
        p = _capi.problem_of(a, b, ka, kb, out_dtype=torch.bfloat16, bias_dtype=bias)
        res = _capi.mm_layout_plan(p, planlib)
        assert res.status == "OK", res.rule_text
        got, want = _emulate(res.plan, a, b, sa, sb, bv), _reference(a, b, sa, sb, kind, bv)
        assert got.shape == want.shape
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-12, (kind, b_layout, m, n, k, err)


def test_emulation_catches_a_wrong_block_layout(planlib):
    """The emulator is strict enough to see the bug the plan fixes: block scales with
    M % 4 != 0 but no M padding (the scale array's row pitch shifts every K block)."""
    a, b, sa, sb = _problem(77, 48, 272, "block", "col", 3)
    res = _capi.mm_layout_plan(_capi.problem_of(a, b, "block", "block", out_dtype=torch.float32), planlib)
    pl = res.plan
    assert pl.mp == 80 and pl.sa.cols == 80
    want = _reference(a, b, sa, sb, "block", None)
    assert ((_emulate(pl, a, b, sa, sb, None) - want).norm() / want.norm()).item() < 1e-12
    pl.mp = 77  # cuBLAS told M = 77 while the scale array keeps its pitch of 80
    got = _emulate(pl, a, b, sa, sb, None)
    assert ((got - want).norm() / want.norm()).item() > 1e-3


def test_plan_rejects_bad_input(planlib):
    a, b, sa, sb = _problem(8, 16, 16, "block", "col", 0)
    p = _capi.problem_of(a, b, "block", "tensor", out_dtype=torch.float32)
    res = _capi.mm_layout_plan(p, planlib)
    assert (res.status, res.rule) == ("BAD_ARG", "scale_mix") and "128-block" in res.rule_text
    p = _capi.problem_of(_problem(8, 16, 16, "tensor", "col", 0)[0][:0], b, "tensor", "tensor", out_dtype=torch.float32)
    assert _capi.mm_layout_plan(p, planlib).status == "BAD_SHAPE"
    p = _capi.problem_of(a.to(E5), b.to(E5), "tensor", "tensor", out_dtype=torch.float32)
    res = _capi.mm_layout_plan(p, planlib)
    assert (res.status, res.rule) == ("UNSUPPORTED", "formats") and "E5M2" in res.rule_text
