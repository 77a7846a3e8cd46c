"""The FP8 forward of grouped linear layers (fp8mix.GroupedLinear, mixture-of-experts
expert layers): one function for every module that holds G experts' weights as one
(G, out, in) tensor, and their FP8 state as G GEMMs of fp8mix.nn.fp8_state
(``gemm0 + g`` for expert g)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ..context import current_frame

__all__ = ["grouped_linear_forward", "check_splits"]


def check_splits(owner: str, m_splits, groups: int, rows: int) -> list:
    """m_splits as a list of ints, checked: `groups` non-negative sizes summing to `rows`."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dim() != 1 or m_splits.dtype.is_floating_point or m_splits.dtype == torch.bool:
            raise TypeError(f"fp8mix.{owner}: m_splits must be a 1-D integer tensor or a sequence of ints, got a "
                            f"{m_splits.dtype} tensor of shape {tuple(m_splits.shape)}")
        splits = [int(v) for v in m_splits.tolist()]
    else:
        try:
            splits = list(m_splits)
        except TypeError:
            raise TypeError(f"fp8mix.{owner}: m_splits must be a sequence of ints, got "
                            f"{type(m_splits).__name__}") from None
        for v in splits:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"fp8mix.{owner}: m_splits must hold ints, got {v!r}")
    if len(splits) != groups:
        raise ValueError(f"fp8mix.{owner}: m_splits has {len(splits)} entries, expected num_gemms={groups}")
    if any(v < 0 for v in splits):
        raise ValueError(f"fp8mix.{owner}: m_splits must be non-negative, got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"fp8mix.{owner}: m_splits sums to {sum(splits)}, but the input has {rows} rows")
    return splits


def _hp_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], splits: list) -> torch.Tensor:
    """Each group's rows through F.linear (bit for bit nn.Linear per expert)."""
    parts = torch.split(x, splits)
    ys = [F.linear(p, weight[g], None if bias is None else bias[g]) for g, p in enumerate(parts)]
    return torch.cat(ys) if ys else x.new_empty(0, weight.shape[1])


def grouped_linear_forward(m, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           m_splits: Union[Sequence[int], torch.Tensor], *, gemm0: int = 0,
                           is_first_microbatch=None) -> torch.Tensor:
    """y (T, N) for x (T, K), weight (G, N, K), bias (G, N) or None: rows of group g times
    weight[g]^T plus bias[g]; in FP8 under fp8_autocast with module m's FP8 state, GEMMs
    gemm0 .. gemm0 + G - 1."""
    owner = type(m).__name__
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[2]:
        raise ValueError(f"fp8mix.{owner}: input {tuple(x.shape)} and weight {tuple(weight.shape)} do not make "
                         "a grouped linear (x (T, K), weight (G, N, K))")
    splits = check_splits(owner, m_splits, weight.shape[0], x.shape[0])
    frame = current_frame()
    if frame is None or not frame.enabled:
        return _hp_forward(x, weight, bias, splits)
    raise NotImplementedError(f"fp8mix.{owner}: the FP8 grouped forward is not built yet")
