"""fp8mix.LayerNormLinear: Transformer Engine's LayerNorm (or RMSNorm) -> Linear, with the
norm's output written directly in FP8 by one fused C kernel.

    forward   ln[M,K] = norm(x)                 one pass over x per cast (csrc/core/norm.c):
              y[M,N]  = FP8(ln) . FP8(W)^T + b  row statistics, normalized values cast
                                                while in cache; no high-precision ln kept
    backward  d ln    = dy . W  (FP8 dgrad)     then the norm's backward from x and the
              dW      = dy^T . FP8(ln)          kept mean / rstd (torch); dW from the FP8
                                                ln the forward cast (1 byte/element)

Outside fp8_autocast (and for layers below ``fp8_min_features``) it is exactly
``F.layer_norm`` (or ``F.rms_norm``) then ``F.linear``: torch's ops. The FP8 state,
recipes, autocast, checkpointing and ``is_first_microbatch`` are fp8mix.Linear's (one
GEMM: roles input, weight, grad_output; the input role is the normalized x).
Parameters (TE's names): ``layer_norm_weight``, ``layer_norm_bias`` (LayerNorm only),
``weight`` (out, in), ``bias``.

Where the fused kernel is not used: devices without it (CUDA builds run torch's norm,
then the Linear's cast), and ``fp8_autocast(enabled=False, calibrating=True)`` (high
precision anyway; the input role records the amax of the normalized x).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context import as_bool, current_frame
from ..ops import NormKind
from ._forward import fp8_forward, frame_for, needs_own_frame
from ._tp import is_dtensor, norm_linear_tp_forward, te_parallel_norm
from .fp8_state import FP8StateMixin
from .fused_casts import has_fused_kernels, norm_input_cast
from .norms import NormSpec, norm_hp, norm_spec
from .te_options import TECheckpointMixin, apply_init, params_dtype_of, te_default_init, te_options

__all__ = ["LayerNormLinear", "fused_path", "norm_parameters"]


def fused_path(m, x: torch.Tensor) -> bool:
    """Whether m's forward on x writes its GEMM inputs with the fused kernels: not on
    devices without them, and not for a calibration-only autocast (no FP8 cast at all;
    the calibration must see the values themselves)."""
    if not has_fused_kernels(x.device):
        return False
    frame = current_frame()
    if frame is not None and needs_own_frame(m, frame):
        frame = frame_for(m, frame)
    return not (frame is not None and not frame.enabled and frame.calibrating)


def norm_parameters(m: Any, hidden: int, spec: NormSpec, *, device, dtype) -> None:
    """TE's layer_norm_weight (and, for LayerNorm, layer_norm_bias) on m."""
    kw = dict(device=device, dtype=dtype)
    m.layer_norm_weight = nn.Parameter(torch.empty(hidden, **kw))
    if spec.kind == NormKind.LAYER:
        m.layer_norm_bias = nn.Parameter(torch.empty(hidden, **kw))
    else:
        m.register_parameter("layer_norm_bias", None)


def reset_norm(m: Any, spec: NormSpec) -> None:
    """The norm at identity: gamma 1 (0 when zero-centered), beta 0."""
    with torch.no_grad():
        m.layer_norm_weight.fill_(0.0 if spec.zero_centered_gamma else 1.0)
        if m.layer_norm_bias is not None:
            m.layer_norm_bias.zero_()


class _LayerNormLinearBase(nn.Module):
    """The parameters and their initialisation (what FP8StateMixin.reset_parameters extends)."""

    weight: nn.Parameter
    bias: Optional[nn.Parameter]
    layer_norm_weight: nn.Parameter
    layer_norm_bias: Optional[nn.Parameter]

    def __init__(self, in_features: int, out_features: int, spec: NormSpec, bias: bool, init_method, device,
                 dtype):
        super().__init__()
        self.in_features, self.out_features, self._spec = in_features, out_features, spec
        self.init_method = init_method
        norm_parameters(self, in_features, spec, device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """TE's initialisation: the norm at identity, init_method(weight), zero bias."""
        reset_norm(self, self._spec)
        apply_init("LayerNormLinear", self.weight, self.init_method or te_default_init)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()


class LayerNormLinear(TECheckpointMixin, FP8StateMixin, _LayerNormLinearBase):
    """Transformer Engine's LayerNormLinear: ``y = Linear(norm(x))``, the norm's output cast
    to FP8 by one fused kernel under fp8_autocast.

    Args (TE's): in_features, out_features, eps=1e-5, bias=True,
    normalization="LayerNorm" | "RMSNorm", zero_centered_gamma=False,
    return_layernorm_output=False (forward returns ``(out, ln_out)``; ln_out is then made
    in high precision too), return_bias=False (the bias is not added but returned:
    ``(out, bias)``), params_dtype / dtype, device, init_method (a callable on the weight;
    default normal(0, 0.023) as TE). get_rng_state_tracker, name, ... are accepted and
    ignored. tp_group, tp_size, sequence_parallel and parallel_mode="column" shard it as
    TE's column-parallel LayerNormLinear (fp8mix.nn._tp.te_parallel_norm: built whole from
    the seed, then the GEMM's weight and bias hold the rank's rows, the norm's parameters
    are replicated; sequence_parallel: the input is the rank's rows of dim 0, normalised
    there and all-gathered before the GEMM). Under TP the norm runs in torch, then the
    Linear's FP8 cast (no fused norm kernel). parallel_mode="row", ub_* overlap and
    fuse_wgrad_accumulation raise NotImplementedError."""

    fp8_min_features = 16

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, bias: bool = True,
                 normalization: str = "LayerNorm", zero_centered_gamma: bool = False,
                 return_layernorm_output: bool = False, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, device=None, init_method: Optional[Callable] = None,
                 *, dtype: Optional[torch.dtype] = None, tp_group=None, tp_size: int = 1,
                 sequence_parallel: bool = False, parallel_mode: Optional[str] = None, **te_kwargs):
        owner = "LayerNormLinear"
        te_options(owner, te_kwargs)
        for name, v in (("bias", bias), ("return_layernorm_output", return_layernorm_output),
                        ("return_bias", return_bias)):
            as_bool(f"fp8mix.{owner}", name, v)
        spec = norm_spec(owner, normalization, eps, zero_centered_gamma)
        super().__init__(in_features, out_features, spec, bias, init_method, device,
                         params_dtype_of(owner, params_dtype, dtype))
        self.return_layernorm_output, self.return_bias = return_layernorm_output, return_bias
        self.eps, self.normalization, self.zero_centered_gamma = float(eps), normalization, zero_centered_gamma
        self.reset_parameters()
        self._init_fp8_state(self.weight.device)
        te_parallel_norm(self, tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                         parallel_mode=parallel_mode)

    def forward(self, inp: torch.Tensor, is_first_microbatch=None):
        """norm(inp) W^T + b; in FP8 inside fp8_autocast (is_first_microbatch: as
        fp8mix.Linear). Returns out, or (out, bias) / (out, ln_out) / (out, bias, ln_out)."""
        if is_first_microbatch is not None:
            as_bool("fp8mix.LayerNormLinear", "is_first_microbatch", is_first_microbatch)
        if is_dtensor(self.weight):  # column parallel (TE's arguments)
            return self._tp_forward(inp, is_first_microbatch)
        bias = None if self.return_bias else self.bias
        gamma, beta, spec = self.layer_norm_weight, self.layer_norm_bias, self._spec
        keep: list = []

        def hp_forward(x):
            ln = norm_hp(spec, x, gamma, beta)
            keep.append(ln)
            return F.linear(ln, self.weight, bias)

        kw = dict(layout="out_in", in_features=self.in_features, out_features=self.out_features,
                  is_first_microbatch=is_first_microbatch)
        if fused_path(self, inp):
            cast = norm_input_cast(gamma, beta, spec, want_hp=self.return_layernorm_output, keep=keep)
            out = fp8_forward(self, inp, self.weight, bias, hp_forward=hp_forward, input_cast=cast, **kw)
        else:  # torch's norm, then the Linear's own casts
            ln = norm_hp(spec, inp, gamma, beta)
            keep.append(ln)
            out = fp8_forward(self, ln, self.weight, bias, hp_forward=lambda t: F.linear(t, self.weight, bias), **kw)
        return self._outputs(out, keep)

    def _tp_forward(self, inp, is_first_microbatch):
        spec = self._spec

        def local(xl, wl, bl, in_f: int, out_f: int, group):
            return fp8_forward(self, xl, wl, bl, layout="out_in", in_features=in_f, out_features=out_f,
                               is_first_microbatch=is_first_microbatch, hp_forward=lambda t: F.linear(t, wl, bl),
                               tp_group=group)

        out, bias, ln = norm_linear_tp_forward(
            self, inp, lambda t: norm_hp(spec, t, self.layer_norm_weight, self.layer_norm_bias),
            is_first_microbatch=is_first_microbatch, return_bias=self.return_bias, local_forward=local)
        extra = ([bias] if self.return_bias else []) + ([ln] if self.return_layernorm_output else [])
        return (out, *extra) if extra else out

    def _outputs(self, out, keep):
        extra = []
        if self.return_bias:
            extra.append(self.bias)
        if self.return_layernorm_output:
            extra.append(keep[-1].reshape(*out.shape[:-1], self.in_features))
        return (out, *extra) if extra else out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"normalization={self.normalization}, eps={self.eps}, fp8=True")
