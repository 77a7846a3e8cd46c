"""Tensor and sequence parallelism in FP8 through DTensor (torch.distributed.tensor.parallel).

fp8mix.Linear runs under torch's own styles: ``parallelize_module(model, tp_mesh,
{"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})`` makes its weight a DTensor, and its
forward runs the FP8 GEMMs on the local shards with every amax all-reduced over the TP
group (fp8mix.nn._tp has the layouts and what equals the unsharded layer). Sequence
parallel is torch's too: SequenceParallel on the norms, ``ColwiseParallel(input_layouts=
Shard(1))`` (all-gather before) and ``RowwiseParallel(output_layouts=Shard(1))``
(reduce-scatter after).

The names torchao's float8 training gives its styles (torchao.float8.float8_tensor_parallel),
for scripts written against torchao:

    Float8ColwiseParallel     ColwiseParallel for fp8mix modules
    Float8RowwiseParallel     RowwiseParallel for fp8mix modules
    PrepareFloat8ModuleInput  PrepareModuleInput with torchao's signature

They differ from torchao's in where the FP8 cast happens: torchao casts a module's input to
FP8 before the all-gather (the activation moves in FP8); fp8mix casts inside the module,
after the redistribution, so the all-gathers of sequence parallel move high precision (the
FP8 bytes are the same: the scale comes from the all-reduced amax either way). They refuse
a module that is not an fp8mix nn.Linear-shaped module (as torchao's refuse a
non-Float8Linear), and a tensor-parallel size that does not divide the features it splits.

Not here: FP8 on the wire for TP activations; the fused norm modules (LayerNormLinear,
LayerNormMLP) under these styles (torch's styles take nn.Linear and nn.Embedding only).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from ..nn._tp import check_divides, local_fp8_state
from ..nn.fp8_state import FP8StateMixin

__all__ = ["Float8ColwiseParallel", "Float8RowwiseParallel", "PrepareFloat8ModuleInput"]


class _FP8Style:
    """What the FP8 names add to torch's style after them in the bases: the module check
    (an fp8mix nn.Linear-shaped module, the TP size dividing the features its mode splits)
    before the style applies, and the module's FP8 state kept plain tensors after."""

    _mode = "column"

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        style = type(self).__name__
        if not (isinstance(module, FP8StateMixin) and isinstance(module, nn.Linear)):
            raise ValueError(f"fp8mix.distributed.{style}: expects an fp8mix.Linear (fp8mix.convert_model before "
                             f"parallelize_module), got {type(module).__module__}.{type(module).__name__}; use "
                             f"torch's {style.replace('Float8', '')} for other modules")
        check_divides(module, mode=self._mode, tp=device_mesh.size(), in_features=module.in_features,
                      out_features=module.out_features)
        out = super()._apply(module, device_mesh)  # type: ignore[misc]
        local_fp8_state(module)
        return out


class Float8ColwiseParallel(_FP8Style, ColwiseParallel):
    """torch's ColwiseParallel, for an fp8mix.Linear (its FP8 GEMMs on the local shards)."""

    _mode = "column"


class Float8RowwiseParallel(_FP8Style, RowwiseParallel):
    """torch's RowwiseParallel, for an fp8mix.Linear (its FP8 GEMMs on the local shards)."""

    _mode = "row"


class PrepareFloat8ModuleInput(PrepareModuleInput):
    """torchao's PrepareFloat8ModuleInput signature over torch's PrepareModuleInput: the
    inputs are redistributed in high precision and the fp8mix modules inside cast them
    (the module docstring says why the bytes agree). ``float8_dtype`` must be
    torch.float8_e4m3fn (as torchao's); ``fwd_config_submodule_fqn``, when given, must name
    an fp8mix module inside (torchao reads its cast config there; fp8mix's modules take the
    recipe from fp8_autocast, so nothing more is read)."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False,
                 float8_dtype: torch.dtype = torch.float8_e4m3fn, fwd_config_submodule_fqn=None):
        super().__init__(input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
                         input_kwarg_layouts=input_kwarg_layouts,
                         desired_input_kwarg_layouts=desired_input_kwarg_layouts, use_local_output=use_local_output)
        if float8_dtype != torch.float8_e4m3fn:
            raise NotImplementedError(f"PrepareFloat8ModuleInput: float8_dtype={float8_dtype}; only "
                                      "torch.float8_e4m3fn is supported (as torchao)")
        self.float8_dtype = float8_dtype
        self.fwd_config_submodule_fqn = fwd_config_submodule_fqn

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        fqn = self.fwd_config_submodule_fqn
        if fqn is not None and not isinstance(module.get_submodule(fqn), FP8StateMixin):
            raise ValueError(f"PrepareFloat8ModuleInput: fwd_config_submodule_fqn={fqn!r} is a "
                             f"{type(module.get_submodule(fqn)).__name__}, not an fp8mix module")
        if fqn is None and not any(isinstance(m, FP8StateMixin) for m in module.modules()):
            raise ValueError(f"PrepareFloat8ModuleInput: {type(module).__name__} holds no fp8mix module "
                             "(fp8mix.convert_model before parallelize_module)")
        return super()._apply(module, device_mesh)
