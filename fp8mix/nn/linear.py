"""fp8mix.Linear: a drop-in nn.Linear whose three GEMMs run in FP8 under fp8_autocast.

    forward  y[M,N]  = x[M,K]  . W[N,K]^T     E4M3 x E4M3 (HYBRID)
    dgrad    dx[M,K] = dy[M,N] . W[N,K]       E5M2 x E4M3
    wgrad    dW[N,K] = dy^T[N,M] . x[M,K]     E5M2 x E4M3

Outside fp8_autocast it is nn.Linear, bit for bit. Inside, x and W are cast to FP8
(one fused pass each, amax included), the FP8 x (1 byte/element) is what backward
keeps, and dy is cast once into dy and dy^T (with the bias gradient's column sums).
Master weights, bias, gradients and outputs stay in high precision. The FP8 state (amax
histories, scales, ...) is fp8mix.nn.fp8_state's; the casts per recipe are
fp8mix.nn._casts'; checkpointing is fp8mix.nn.recompute's.

Gradient accumulation: ``layer(x, is_first_microbatch=True)`` casts and keeps the FP8
weight, ``False`` reuses it (no re-cast, no amax record) — Transformer Engine's
convention. It is explicit because a parameter's version counter misses writes through
``.data`` and FSDP2's all-gather copies, so automatic detection could serve a stale FP8
weight (and, under FSDP2, make ranks disagree on collectives).

Smoothing (``layer.fp8_smooth = True``, a policy attribute the planner sets for a layer
whose input has outlier channels): inside fp8_autocast the GEMMs take x * s and W / s
with per-channel power-of-two s (fp8mix.nn.smooth; ``fp8_smooth_alpha``, default 0.5):
the same product, casts that see a narrower channel spread. It re-casts the weight every
call (s follows the batch), so ``is_first_microbatch`` does not cache then; a layer with
an FP8 primary weight cannot be smoothed (its bytes are fixed: ValueError).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context import as_bool, current_frame
from ._forward import fp8_forward
from ._tp import is_dtensor, te_parallel, tp_linear_forward
from .fp8_state import FP8StateMixin
from .fp8_weight import FP8WeightBase
from .smooth import DEFAULT_ALPHA, smooth_operands
from .te_options import params_dtype_of, te_options

__all__ = ["Linear", "LinearForward"]


class LinearForward:
    """The forward of an nn.Linear-shaped FP8 module (weight (out, in), bias (out))."""

    fp8_min_features = 16
    weight: torch.Tensor
    bias: Any  # a Tensor or None, as nn.Linear declares it
    in_features: int
    out_features: int
    fp8_smooth = False  # policy attribute: per-channel smoothing of x before the FP8 casts
    fp8_smooth_alpha = DEFAULT_ALPHA

    def forward(self, x: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        """y = x W^T + b; in FP8 inside fp8_autocast.

        is_first_microbatch (as Transformer Engine): None (default) casts the weight every
        call; with gradient accumulation pass True on the first micro-batch of a step (cast
        and keep the FP8 weight) and False on the others (reuse it: no re-cast, no amax
        record). Ignored outside fp8_autocast."""
        if is_first_microbatch is not None:
            as_bool(f"fp8mix.{type(self).__name__}", "is_first_microbatch", is_first_microbatch)
        if is_dtensor(self.weight):  # tensor parallel: the FP8 GEMMs on the local shards
            if self.fp8_smooth:
                raise NotImplementedError(f"fp8mix.{type(self).__name__}: fp8_smooth (per-channel smoothing) is not "
                                          "supported under tensor parallel")
            return self._tp_forward(x, is_first_microbatch)
        if self.fp8_smooth and current_frame() is not None:
            return self._smoothed_forward(x)
        if getattr(self, "return_bias", False):  # TE's return_bias: the bias is returned, not added
            y = fp8_forward(self, x, self.weight, None, layout="out_in", in_features=self.in_features,
                            out_features=self.out_features, is_first_microbatch=is_first_microbatch,
                            hp_forward=lambda t: F.linear(t, self.weight))
            return y, self.bias  # type: ignore[return-value]
        return fp8_forward(self, x, self.weight, self.bias, layout="out_in", in_features=self.in_features,
                           out_features=self.out_features, is_first_microbatch=is_first_microbatch,
                           hp_forward=self._hp_forward)

    def _tp_forward(self, x, is_first_microbatch):
        return_bias = getattr(self, "return_bias", False)
        bias = None if return_bias else self.bias

        def local(xl, wl, bl, in_f: int, out_f: int, group):
            return fp8_forward(self, xl, wl, bl, layout="out_in", in_features=in_f, out_features=out_f,
                               is_first_microbatch=is_first_microbatch, hp_forward=lambda t: F.linear(t, wl, bl),
                               tp_group=group)

        y = tp_linear_forward(self, x, self.weight, bias, in_features=self.in_features,
                              out_features=self.out_features, is_first_microbatch=is_first_microbatch,
                              local_forward=local)
        return (y, self.bias) if return_bias else y

    def _hp_forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def _smoothed_forward(self, x: torch.Tensor):
        """The GEMM on (x * s, W / s) (fp8mix.nn.smooth); high precision: the plain product."""
        if isinstance(self.weight, FP8WeightBase):
            raise ValueError(f"fp8mix.{type(self).__name__}: fp8_smooth needs a high-precision weight (W / s is "
                             "re-cast each call); this layer holds an FP8 primary weight")
        xs, ws, _ = smooth_operands(x, self.weight, self.fp8_smooth_alpha)
        rb = getattr(self, "return_bias", False)
        bias = None if rb else self.bias
        y = fp8_forward(self, xs, ws, bias, layout="out_in", in_features=self.in_features,
                        out_features=self.out_features, is_first_microbatch=None,
                        hp_forward=lambda _: F.linear(x, self.weight, bias))
        return (y, self.bias) if rb else y

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fp8=True"  # type: ignore[misc]


class Linear(FP8StateMixin, LinearForward, nn.Linear):
    """Drop-in replacement for :class:`torch.nn.Linear` with FP8 GEMMs under
    :func:`fp8mix.fp8_autocast`.

    Same signature, parameters, initialisation and state_dict keys as nn.Linear (plus
    the FP8 state buffers, optional when loading). Layers with fewer than
    ``fp8_min_features`` input or output features run in high precision even inside
    fp8_autocast (FP8 costs more than it saves there); a debug log line says so.

    Transformer Engine's keywords are accepted too: ``params_dtype`` (torch's ``dtype``),
    ``init_method`` (a callable run on the weight, also by ``reset_parameters``; None keeps
    nn.Linear's initialisation, where TE's default is normal(0, 0.023)), ``return_bias``
    (forward returns ``(y, bias)`` without adding the bias) and ``get_rng_state_tracker`` /
    ``name`` (ignored); ``tp_group``, ``tp_size``, ``sequence_parallel`` and
    ``parallel_mode`` ("column" / "row" / None) shard it over the tensor-parallel group as
    TE does (fp8mix.nn._tp.te_parallel: built whole from the seed on every rank, then its
    weight becomes a DTensor holding the rank's shard); ``ub_*`` overlap and
    ``fuse_wgrad_accumulation`` raise NotImplementedError. Under torch's ColwiseParallel /
    RowwiseParallel (a DTensor weight) the FP8 GEMMs run on the local shards with every
    amax all-reduced over the TP group (fp8mix.nn._tp).
    """

    return_bias = False
    init_method = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 params_dtype: Optional[torch.dtype] = None, init_method: Optional[Callable] = None,
                 return_bias: bool = False, tp_group=None, tp_size: int = 1, sequence_parallel: bool = False,
                 parallel_mode: Optional[str] = None, **te_kwargs):
        te_options("Linear", te_kwargs)
        as_bool("fp8mix.Linear", "return_bias", return_bias)
        if init_method is not None and not callable(init_method):
            raise TypeError(f"fp8mix.Linear: init_method must be a callable taking the weight, got "
                            f"{type(init_method).__name__}")
        object.__setattr__(self, "init_method", init_method)  # nn.Linear.__init__ calls reset_parameters
        super().__init__(in_features, out_features, bias=bias, device=device,
                         dtype=params_dtype_of("Linear", params_dtype, dtype))
        self.return_bias = return_bias
        self._init_fp8_state(self.weight.device)
        te_parallel(self, tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                    parallel_mode=parallel_mode)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.init_method is not None:
            with torch.no_grad():
                self.init_method(self.weight)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Linear":
        """An fp8mix.Linear sharing `lin`'s weight and bias Parameters (no copy) and hooks."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        if lin.bias is None:
            new.register_parameter("bias", None)
        else:
            new.bias = lin.bias
        new._init_fp8_state(lin.weight.device)
        new.train(lin.training)
        new._forward_hooks.update(lin._forward_hooks)
        new._forward_pre_hooks.update(lin._forward_pre_hooks)
        return new
