"""torch._scaled_mm in place of fp8mix's own cuBLASLt GEMM, for problems cuBLASLt
refuses at run time (a device without row-wise / block scale modes, an older
cuBLASLt, no algorithm for a shape).

The CUDA op signals a refusal with a NotImplementedError whose message starts with
REFUSED_PREFIX (csrc/torch/ops_cuda.cpp); ``is_refusal`` recognises it and
``scaled_mm_fallback`` computes the same product from torch._scaled_mm's
per-tensor kernel, which every FP8 device and every torch version with FP8 has:

  tensor scales   one _scaled_mm call with the scales (bias in its epilogue when
                  torch allows it: out bf16/f16 and a bias of out's type)
  row-wise        torch's row-wise kernel for bf16 outputs when it accepts the call,
                  else a float32 product with unit scales, times scale_a x scale_b
  128-block       one unit-scale float32 product per 128-deep K block, each times
                  its block scales, summed in float32 (slow: a last resort)

K and N are zero padded to multiples of 16 as torch requires (zeros add nothing).
The result agrees with fp8mix's CPU GEMM to summation order.  E5M2 x E5M2 and
devices without FP8 GEMMs raise FallbackUnavailable, naming why.
"""
from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["REFUSED_PREFIX", "FallbackUnavailable", "is_refusal", "scale_kind", "scaled_mm_fallback", "refusals"]

REFUSED_PREFIX = "fp8mix.scaled_mm: refused by cuBLASLt"

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.float32, torch.bfloat16, torch.float16)
_warned: set[str] = set()
_warn_lock = threading.Lock()


class _Refusals(threading.local):
    """This thread's last cuBLASLt refusal that the fallback served (its message), or None:
    set by the op layer's CUDA hook (fp8mix.cuda), cleared by whoever wants to know."""

    last: "str | None" = None


refusals = _Refusals()


class FallbackUnavailable(RuntimeError):
    """torch._scaled_mm cannot compute this product either."""


def is_refusal(exc: BaseException) -> bool:
    """True for the CUDA op's 'cuBLASLt refused this problem' error (and nothing else)."""
    return isinstance(exc, NotImplementedError) and str(exc).lstrip().startswith(REFUSED_PREFIX)


def _warn_once(key: str, msg: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def scale_kind(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> str:
    """'tensor', 'row' or 'block': how fp8mix's scaled_mm reads these scale shapes
    (the same rules as the C++ op, block first); ValueError for any other shape."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    kb, nb = -(-k // 128), -(-n // 128)
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    if sa == (m, kb) and sb == (kb, nb) and not (scale_a.numel() == 1 and scale_b.numel() == 1):
        return "block"
    a_t, b_t = scale_a.numel() == 1 and scale_a.dim() <= 2, scale_b.numel() == 1 and scale_b.dim() <= 2
    a_r, b_r = sa == (m, 1), sb == (1, n)
    if a_t and b_t:
        return "tensor"
    if (a_t or a_r) and (b_t or b_r):
        return "row"
    raise ValueError(f"fp8mix.scaled_mm fallback: scale shapes {sa} and {sb} fit no scale layout for a {m}x{k} @ "
                     f"{k}x{n} product (one value, (M, 1) / (1, N) per row / column, or (M, ceil(K/128)) / "
                     "(ceil(K/128), ceil(N/128)) per block)")


def _check(a, b, scale_a, scale_b, bias, out_dtype) -> None:
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fp8mix.scaled_mm fallback: {name} must be a tensor, got {type(t).__name__}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"fp8mix.scaled_mm fallback: need a (M, K) and b (K, N), got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.dtype not in _FP8 or b.dtype not in _FP8:
        raise TypeError(f"fp8mix.scaled_mm fallback: a and b must be FP8, got {a.dtype} and {b.dtype}")
    if a.dtype == torch.float8_e5m2 and b.dtype == torch.float8_e5m2:
        raise FallbackUnavailable("fp8mix.scaled_mm fallback: torch._scaled_mm has no E5M2 x E5M2 kernel either; "
                                  "use E4M3 for one operand")
    if out_dtype not in _OUT:
        raise TypeError(f"fp8mix.scaled_mm fallback: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        raise TypeError("fp8mix.scaled_mm fallback: scales must be float32")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != b.shape[1] or bias.dtype not in _OUT):
        raise ValueError(f"fp8mix.scaled_mm fallback: bias must be a float ({b.shape[1]},) tensor")


def _pad_to16(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a row-major (M, Kp) and b column-major (Kp, Np), zero padded, as torch wants them."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    kp, np_ = -(-k // 16) * 16, -(-n // 16) * 16
    if kp == k and a.stride(1) == 1 and a.stride(0) % 16 == 0:
        a_p = a
    else:
        a_p = torch.zeros((m, kp), dtype=torch.uint8, device=a.device)
        a_p[:, :k] = a.view(torch.uint8) if a.stride(1) == 1 else a.contiguous().view(torch.uint8)
        a_p = a_p.view(a.dtype)
    bt = b.t()  # (N, K): row-major when b is column-major
    if kp == k and np_ == n and bt.stride(1) == 1 and bt.stride(0) % 16 == 0:
        return a_p, b
    bt_p = torch.zeros((np_, kp), dtype=torch.uint8, device=b.device)
    bt_p[:n, :k] = bt.contiguous().view(torch.uint8)
    return a_p, bt_p.view(b.dtype).t()


def _mm(a_p, b_p, sa, sb, out_dtype, bias=None) -> torch.Tensor:
    try:
        return torch._scaled_mm(a_p, b_p, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
    except RuntimeError as e:
        raise FallbackUnavailable(f"fp8mix.scaled_mm fallback: torch._scaled_mm failed too: {e}") from e


def _rowwise(a_p, b_p, scale_a, scale_b, m, n, out_dtype, bias) -> torch.Tensor:
    np_ = b_p.shape[1]
    sa = scale_a.reshape(-1, 1).expand(m, 1).contiguous()
    sb = torch.ones((1, np_), dtype=torch.float32, device=b_p.device)
    sb[:, :n] = scale_b.reshape(1, -1).expand(1, n)
    if out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
        try:  # torch's own row-wise kernel (bf16 output only)
            bias_p = None if bias is None else torch.nn.functional.pad(bias, (0, np_ - n))
            return torch._scaled_mm(a_p, b_p, scale_a=sa, scale_b=sb, bias=bias_p, out_dtype=out_dtype)[:, :n]
        except RuntimeError:
            pass  # not on this device / torch: the float32 route below
    one = torch.ones((), dtype=torch.float32, device=a_p.device)
    acc = _mm(a_p, b_p, one, one, torch.float32)[:, :n]
    return _epilogue(acc * sa * sb[:, :n], bias, out_dtype)


def _blockwise(a_p, b_p, scale_a, scale_b, m, n, out_dtype, bias) -> torch.Tensor:
    k = scale_a.shape[1] * 128
    one = torch.ones((), dtype=torch.float32, device=a_p.device)
    sb_cols = scale_b.repeat_interleave(128, dim=1)[:, :n]  # (kb, N)
    acc = torch.zeros((m, n), dtype=torch.float32, device=a_p.device)
    kp = a_p.shape[1]
    for kb in range(scale_a.shape[1]):
        k0, k1 = kb * 128, min((kb + 1) * 128, kp, k)
        if k0 >= kp:
            break
        part = _mm(a_p[:, k0:k1].contiguous(), b_p[k0:k1, :].t().contiguous().t(), one, one, torch.float32)
        acc += part[:, :n] * scale_a[:, kb:kb + 1] * sb_cols[kb:kb + 1, :]
    return _epilogue(acc, bias, out_dtype)


def _epilogue(acc: torch.Tensor, bias, out_dtype) -> torch.Tensor:
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)


def scaled_mm_fallback(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """out = (a * scale_a) @ (b * scale_b) + bias through torch._scaled_mm, with
    fp8mix.scaled_mm's scale layouts (see the module docstring); warns once per
    scale kind that the fallback is in use."""
    _check(a, b, scale_a, scale_b, bias, out_dtype)
    kind = scale_kind(a, b, scale_a, scale_b)
    _warn_once(kind, f"fp8mix.scaled_mm: fp8mix's cuBLASLt GEMM refused a {kind}-scaled product on this device; "
               "using torch._scaled_mm instead" + (" (one GEMM per 128-deep K block: slow)" if kind == "block" else ""))
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if m == 0 or n == 0 or k == 0:
        out = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        return _epilogue(out, bias, out_dtype)
    a_p, b_p = _pad_to16(a, b)
    if kind == "tensor":
        sa, sb = scale_a.reshape(()), scale_b.reshape(())
        np_ = b_p.shape[1]
        if bias is None or (out_dtype != torch.float32 and bias.dtype == out_dtype):
            bias_p = None if bias is None else torch.nn.functional.pad(bias, (0, np_ - n))
            return _mm(a_p, b_p, sa, sb, out_dtype, bias_p)[:, :n].contiguous()
        return _epilogue(_mm(a_p, b_p, sa, sb, torch.float32)[:, :n], bias, out_dtype)
    if kind == "row":
        return _rowwise(a_p, b_p, scale_a, scale_b, m, n, out_dtype, bias).contiguous()
    return _blockwise(a_p, b_p, scale_a, scale_b, m, n, out_dtype, bias).contiguous()
