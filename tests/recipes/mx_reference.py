"""A reference for MX (OCP Microscaling Formats v1.0) quantisation, written from the
spec for the tests here: 32-element blocks along the last dimension, one power-of-two
scale 2^e per block (e in E8M0's [-127, 127]) by NVIDIA's "rceil" rule or the spec's
"floor(log2(amax)) - emax_elem", elements by torch's own float8 cast (nearest even),
saturating. Shares no code with fp8mix."""
from __future__ import annotations

import math

import torch

from fp8mix import Format

DT = {Format.E4M3: torch.float8_e4m3fn, Format.E5M2: torch.float8_e5m2}
FMAX = {Format.E4M3: 448.0, Format.E5M2: 57344.0}
EMAX = {Format.E4M3: 8, Format.E5M2: 15}


def ref_exponent(amax: float, fmt: Format, rule: str, margin: int = 0) -> int:
    if not math.isfinite(amax):
        return 0  # fp8mix's documented choice for a block with NaN / inf (OCP: the NaN scale)
    if amax == 0.0:
        return -127
    _, E = math.frexp(amax)  # amax = f 2^E, f in [0.5, 1)
    e = (E - 1) - EMAX[fmt]
    if rule == "rceil":
        while amax > FMAX[fmt] * 2.0 ** e:  # exact in float64
            e += 1
    return max(-127, min(127, e + margin))


def ref_mx(x: torch.Tensor, fmt: Format, rule: str, margin: int = 0):
    """(q bytes, scale_inv) of the 2-D float32 tensor x per the spec."""
    rows, cols = x.shape
    nb = -(-cols // 32)
    q = torch.empty(rows, cols, dtype=DT[fmt])
    s = torch.empty(rows, nb)
    for i in range(rows):
        for b in range(nb):
            blk = x[i, 32 * b: 32 * b + 32]
            amax = float("nan") if torch.isnan(blk).any() else float(blk.abs().max())
            e = ref_exponent(amax, fmt, rule, margin)
            s[i, b] = 2.0 ** e
            y = (blk.double() * 2.0 ** -e).float()  # x * 2^-e rounded to float32 first (fp8mix's cast rule)
            y = torch.where(torch.isinf(y), y.sign() * FMAX[fmt], y).clamp(-FMAX[fmt], FMAX[fmt])
            q[i, 32 * b: 32 * b + 32] = y.to(DT[fmt])
    return q, s




def ref_mx_deq(x: torch.Tensor, fmt: Format, rule: str = "rceil") -> torch.Tensor:
    """The values of ref_mx(x) in float64 (x 2-D)."""
    q, s = ref_mx(x.float(), fmt, rule)
    return q.double() * s.double().repeat_interleave(32, dim=1)[:, : x.shape[1]]
