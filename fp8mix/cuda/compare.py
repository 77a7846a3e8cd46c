"""The comparisons of the CUDA self-check, separated from any device call so that CPU
tests can feed them deliberately wrong results.

A ``Case`` holds one kernel output from the device (``got``) and the C core's answer
(``want``), both on the CPU, and how to compare them:

  "bits"   bit-identical (FP8 bytes, float bits, NaN sign and payload included)
  "gemm"   to within summation order and Hopper's FP22 accumulation: every element
           within 2^-6 of the sum of |products| (plus one rounding of the output
           type), and the whole within a relative Frobenius error of 2e-3 (4e-3 for
           16-bit outputs); ``bound`` holds sum(|a_ik sa| |b_kj sb|) + |bias_j|
  "stats"  quant_stats: every one of the 84 entries bit-identical (counts are exact
           and the float64 sums follow fp8mix.h's fixed order on the device too); a
           mismatch names the entry (fp8mix.numerics.FIELDS, or the histogram bin)

``verify`` raises SelfCheckError for the first case that fails, naming the kernel
and the first differing element (index and both values).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Case", "SelfCheckError", "verify", "failures", "first_mismatch", "gemm_tolerance", "scaled_operands",
           "gemm_bound", "random_scales", "stats_entry_name"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class SelfCheckError(RuntimeError):
    """A CUDA kernel disagreed with the C core (the CPU oracle)."""


@dataclass
class Case:
    kernel: str
    got: torch.Tensor
    want: torch.Tensor
    kind: str = "bits"
    bound: torch.Tensor | None = field(default=None, repr=False)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(_BITS[t.element_size()])


def _show(t: torch.Tensor, flat: int) -> str:
    """One element as its value and its bits."""
    t = t.detach().cpu().contiguous().reshape(-1)
    bits = int(t.view(_BITS[t.element_size()])[flat]) & ((1 << (8 * t.element_size())) - 1)
    width = 2 * t.element_size()
    return f"{float(t[flat].double())!r} (0x{bits:0{width}x})"


def _index(shape: torch.Size, flat: int) -> tuple[int, ...]:
    idx = []
    for d in reversed(shape):
        idx.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return tuple(reversed(idx))


def first_mismatch(got: torch.Tensor, want: torch.Tensor) -> int | None:
    """Flat index of the first element whose bits differ (None when all agree)."""
    g, w = _bits(got), _bits(want)
    diff = (g != w).nonzero()
    return int(diff[0, 0]) if diff.numel() else None


def gemm_tolerance(want: torch.Tensor, bound: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Per-element allowance: FP22 accumulation (2^-6 of sum |products|, the worst case
    of 128 additions truncated to 13 mantissa bits) plus one rounding to out_dtype."""
    ulp = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[out_dtype]
    return bound.double() * 2.0 ** -6 + want.double().abs() * ulp + 1e-30


def scaled_operands(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, kind: str,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """a * scale_a and b * scale_b elementwise in `dtype`, for fp8mix.scaled_mm's scale
    layouts: kind "tensor" / "row" (one value, (M, 1), (1, N)) or "block" ((M, ceil(K/128))
    1x128 tiles of a, (ceil(K/128), ceil(N/128)) 128x128 blocks of b).  Their product is
    the GEMM's exact value (in float64)."""
    m, k = a.shape
    n = b.shape[1]
    ad, bd = a.to(dtype), b.to(dtype)
    if kind == "block":
        ad = ad * sa.to(dtype).repeat_interleave(128, dim=1)[:, :k]
        bd = bd * sb.to(dtype).repeat_interleave(128, dim=0)[:k].repeat_interleave(128, dim=1)[:, :n]
    else:
        ad = ad * sa.to(dtype).reshape(-1, 1).expand(m, 1)
        bd = bd * sb.to(dtype).reshape(1, -1).expand(1, n)
    return ad, bd


def random_scales(kind: str, m: int, n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantisation factors of one scale kind for an (m, k) @ (k, n) product, in
    [0.5, 1.5) (per tensor: 0.37 and 1.9)."""
    if kind == "tensor":
        return torch.tensor(0.37), torch.tensor(1.9)
    if kind == "row":
        return torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    kb = -(-k // 128)
    return torch.rand(m, kb, generator=g) + 0.5, torch.rand(kb, -(-n // 128), generator=g) + 0.5


def gemm_bound(a, b, sa, sb, kind: str, bias=None) -> torch.Tensor:
    """sum_k |a_ik sa| |b_kj sb| + |bias_j| in float64 (computed in float32, ample for a
    tolerance): the size of what each output's summation rounds."""
    ad, bd = scaled_operands(a, b, sa, sb, kind, torch.float32)
    bound = (ad.abs() @ bd.abs()).double()
    return bound + bias.double().abs() if bias is not None else bound


def _fail(case: Case, what: str) -> SelfCheckError:
    return SelfCheckError(f"fp8mix CUDA self-check: kernel {case.kernel} disagrees with the CPU oracle: {what}. "
                          "The CUDA results of this build cannot be trusted; please report it (set "
                          "FP8MIX_CUDA_SELFCHECK=0 to skip the check).")


def _check_shape(case: Case) -> None:
    if tuple(case.got.shape) != tuple(case.want.shape) or case.got.dtype != case.want.dtype:
        raise _fail(case, f"shape/dtype {tuple(case.got.shape)} {case.got.dtype} vs {tuple(case.want.shape)} "
                          f"{case.want.dtype}")


def _verify_bits(case: Case) -> None:
    flat = first_mismatch(case.got, case.want)
    if flat is not None:
        raise _fail(case, f"first difference at index {_index(case.want.shape, flat)}: CUDA "
                          f"{_show(case.got, flat)}, CPU {_show(case.want, flat)}")


def _verify_gemm(case: Case) -> None:
    if case.bound is None:
        raise ValueError(f"self-check case {case.kernel}: a gemm case needs its bound")
    g, w = case.got.double().cpu(), case.want.double().cpu()
    tol = gemm_tolerance(case.want, case.bound.cpu(), case.want.dtype)
    bad = ~((g - w).abs() <= tol)  # NaN counts as bad
    if bool(bad.any()):
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        raise _fail(case, f"first element out of tolerance at index {_index(w.shape, flat)}: CUDA "
                          f"{_show(case.got, flat)}, CPU {_show(case.want, flat)}, allowed difference "
                          f"{float(tol.reshape(-1)[flat]):.3g}")
    rel = float((g - w).norm() / w.norm().clamp_min(1e-30))
    lim = 2e-3 if case.want.dtype == torch.float32 else 4e-3
    if not rel <= lim:
        raise _fail(case, f"relative Frobenius error {rel:.3g} above {lim:g}")


def stats_entry_name(i: int) -> str:
    """The name of quant_stats' entry i (a field of fp8mix.numerics, or a histogram bin)."""
    from ..numerics import FIELDS, HIST_MIN_LOG2
    return FIELDS[i] if i < len(FIELDS) else f"hist[{i - len(FIELDS)}] (log2 {HIST_MIN_LOG2 + i - len(FIELDS)})"


def _verify_stats(case: Case) -> None:
    flat = first_mismatch(case.got.double(), case.want.double())
    if flat is not None:
        g, w = case.got.double().cpu().reshape(-1), case.want.double().cpu().reshape(-1)
        raise _fail(case, f"entry {flat} ({stats_entry_name(flat)}) differs: CUDA {float(g[flat])!r}, "
                          f"CPU {float(w[flat])!r}")


_CHECKS = {"bits": _verify_bits, "gemm": _verify_gemm, "stats": _verify_stats}


def verify(cases: list[Case]) -> int:
    """Compare every case; raise SelfCheckError on the first failure.  Returns the
    number of elements compared."""
    n = 0
    for case in cases:
        check = _CHECKS.get(case.kind)
        if check is None:
            raise ValueError(f"self-check case {case.kernel}: unknown comparison {case.kind!r}")
        _check_shape(case)
        check(case)
        n += case.want.numel()
    return n


def failures(cases: list[Case]) -> list[str]:
    """Every failing case's message (verify stops at the first): for a report that shows
    all broken kernels of a device in one run."""
    out = []
    for case in cases:
        try:
            verify([case])
        except SelfCheckError as e:
            out.append(str(e))
    return out
