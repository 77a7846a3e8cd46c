"""fp8mix.nn.Conv1D: Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2, GPT-J
style) with FP8 GEMMs under fp8_autocast.

HF's Conv1D is a linear layer with its weight stored transposed, (in_features,
out_features), and ``y = x @ W + b``. This module keeps exactly that weight and its
state_dict keys (``weight``, ``bias``), so a converted GPT-2 loads and saves the same
checkpoints; the C GEMM reads the (K, N) weight in place, so no transposed copy is made
per step. Outside fp8_autocast it computes ``torch.addmm(b, x, W)`` as HF does, bit for bit.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..context import as_bool
from ._forward import fp8_forward
from .fp8_state import FP8StateMixin

__all__ = ["Conv1D", "Conv1DForward"]


class Conv1DForward:
    """The forward of a Conv1D-shaped FP8 module (weight (in, out), bias (out), nf = out)."""

    fp8_min_features = 16
    weight: torch.Tensor
    bias: torch.Tensor
    nf: int

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.nf)

    def forward(self, x: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        if is_first_microbatch is not None:
            as_bool(f"fp8mix.{type(self).__name__}", "is_first_microbatch", is_first_microbatch)
        return fp8_forward(self, x, self.weight, self.bias, layout="in_out", in_features=self.in_features,
                           out_features=self.out_features, is_first_microbatch=is_first_microbatch,
                           hp_forward=self._hp_forward)

    def _hp_forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class Conv1D(FP8StateMixin, Conv1DForward, nn.Module):
    """``Conv1D(nf, nx)`` as Hugging Face's: nf output features, nx input features,
    weight (nx, nf), bias (nf)."""

    def __init__(self, nf: int, nx: int, device=None, dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)
        self._init_fp8_state(self.weight.device)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.weight, std=0.02)
            self.bias.zero_()
        self.reset_fp8_state()

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}, fp8=True"
