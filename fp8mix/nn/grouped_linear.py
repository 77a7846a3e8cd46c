"""fp8mix.GroupedLinear: Transformer Engine's GroupedLinear, the expert layers of a
mixture-of-experts block as one module: ``num_gemms`` linear maps (out_features x
in_features each), the rows of one input cut into consecutive groups by ``m_splits``,
group g through expert g.

    y[rows of g] = x[rows of g] . W_g^T + b_g          (forward: one grouped GEMM)
    dx[rows of g] = dy[rows of g] . W_g                (dgrad: one grouped GEMM)
    dW_g = dy[rows of g]^T . x[rows of g]              (wgrad: one grouped GEMM, groups along K)

Parameters ``weight0 .. weight{G-1}`` and ``bias0 ..`` (TE's names and shapes). Outside
fp8_autocast every group is nn.functional.linear of its rows, bit for bit. Inside, each
expert is its own GEMM of the FP8 state (fp8_gemms = num_gemms: roles 3g, 3g+1, 3g+2 for
expert g's input, weight and grad_output, as TE keeps num_gemms x 3 scaling factors):
per-expert scales. For the per-tensor recipes (delayed and current scaling) the casts and
GEMMs of all experts run as one C call each; block, MX, rowwise and NVFP4 run each expert
as its own fp8mix GEMM step (fp8mix.nn._grouped).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..context import as_bool
from ._grouped import grouped_linear_forward
from .fp8_state import FP8StateMixin
from .te_options import params_dtype_of, te_options

__all__ = ["GroupedLinear"]


class GroupedLinear(FP8StateMixin, nn.Module):
    """``num_gemms`` linear layers applied to consecutive row groups of one input
    (Transformer Engine's ``GroupedLinear(num_gemms, in_features, out_features, ...)``).

    ``forward(inp, m_splits, is_first_microbatch=None)``: ``inp`` is (T, in_features) (or
    (..., in_features), flattened to rows), ``m_splits`` a sequence (or 1-D integer tensor)
    of ``num_gemms`` non-negative group sizes summing to T; rows [sum(m_splits[:g]),
    sum(m_splits[:g+1])) go through expert g. Groups may be empty and of any size.

    Each expert is initialised as ``nn.Linear(in_features, out_features)`` would be (or by
    TE's ``init_method(weight)``); ``params_dtype`` / ``dtype`` / ``device`` as torch's.
    ``return_bias=True`` returns ``(y, [bias0, ...])`` without adding the biases.
    """

    fp8_min_features = 16  # (as fp8mix.Linear's: experts narrower than this run in high precision)

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, params_dtype: Optional[torch.dtype] = None, init_method: Optional[Callable] = None,
                 return_bias: bool = False, **te_kwargs):
        te_options("GroupedLinear", te_kwargs)
        for name, v in (("num_gemms", num_gemms), ("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"fp8mix.GroupedLinear: {name} must be a positive integer, got {v!r}")
        as_bool("fp8mix.GroupedLinear", "bias", bias)
        as_bool("fp8mix.GroupedLinear", "return_bias", return_bias)
        if init_method is not None and not callable(init_method):
            raise TypeError(f"fp8mix.GroupedLinear: init_method must be a callable taking a weight, got "
                            f"{type(init_method).__name__}")
        super().__init__()
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.fp8_gemms = num_gemms
        self.use_bias, self.return_bias, self.init_method = bias, return_bias, init_method
        kw = {"device": device, "dtype": params_dtype_of("GroupedLinear", params_dtype, dtype)}
        # The experts' weights side by side in one buffer (each Parameter a view of its slice),
        # so the grouped casts read them as one (G, out, in) tensor without a copy; after a
        # move that separates them (.to(), FSDP), fp8mix.nn._grouped stacks them instead.
        flat = torch.empty(num_gemms, out_features, in_features, **kw)
        for g in range(num_gemms):
            self.register_parameter(f"weight{g}", nn.Parameter(flat[g]))
            self.register_parameter(f"bias{g}", nn.Parameter(torch.empty(out_features, **kw)) if bias else None)
        self._init_weights()
        self._init_fp8_state(self.weight0.device)

    def _init_weights(self) -> None:
        if self.weight0.is_meta:
            return
        with torch.no_grad():
            for w, b in zip(self.weights(), self.biases()):
                if self.init_method is not None:
                    self.init_method(w)
                else:  # nn.Linear's initialisation, expert by expert
                    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
                if b is not None:
                    bound = 1 / math.sqrt(self.in_features)
                    nn.init.uniform_(b, -bound, bound)

    def reset_parameters(self) -> None:
        self._init_weights()
        self.reset_fp8_state()

    def weights(self) -> list:
        """[weight0, ..., weight{G-1}]."""
        return [getattr(self, f"weight{g}") for g in range(self.num_gemms)]

    def biases(self) -> list:
        """[bias0, ...] (Nones without bias)."""
        return [getattr(self, f"bias{g}") for g in range(self.num_gemms)]

    def forward(self, inp: torch.Tensor, m_splits: Union[Sequence[int], torch.Tensor],
                is_first_microbatch=None):
        """y with y[rows of group g] = x[rows of g] W_g^T + b_g (see the class docstring)."""
        if is_first_microbatch is not None:
            as_bool("fp8mix.GroupedLinear", "is_first_microbatch", is_first_microbatch)
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"fp8mix.GroupedLinear: inp must be a tensor, got {type(inp).__name__}")
        if inp.dim() == 0 or inp.shape[-1] != self.in_features:
            raise ValueError(f"fp8mix.GroupedLinear: inp has shape {tuple(inp.shape)}, expected "
                             f"(..., {self.in_features})")
        x2 = inp.reshape(-1, self.in_features)
        weight = self.weights()
        bias = None if (not self.use_bias or self.return_bias) else torch.stack(self.biases())
        y = grouped_linear_forward(self, x2, weight, bias, m_splits, is_first_microbatch=is_first_microbatch)
        y = y.reshape(*inp.shape[:-1], self.out_features)
        return (y, self.biases()) if self.return_bias else y

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, fp8=True")
