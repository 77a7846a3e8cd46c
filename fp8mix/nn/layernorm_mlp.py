"""fp8mix.LayerNormMLP: Transformer Engine's norm -> fc1 -> activation -> fc2, two FP8
GEMMs whose inputs their producers write in FP8 (fused C kernels).

    ln[M,H]  = norm(x)               fused norm + cast (csrc/core/norm.c): FP8 ln only
    h[M,F1]  = FP8(ln) . FP8(W1)^T + b1     F1 = F, or 2F for gated activations
    a[M,F]   = act(h)                fused activation + cast (csrc/core/act.c): FP8 a only;
                                     gated: act(h[:, :F]) * h[:, F:], halves read in place
    y[M,H]   = FP8(a) . FP8(W2)^T + b2

Backward keeps x, the norm's mean / rstd, h (the activation's input, as TE keeps it) and
the two FP8 GEMM inputs; the activation's and the norm's backward are torch's ops.
One FP8 state with G = 2 GEMMs (roles fc1.input, fc1.weight, fc1.grad_output, fc2.*),
the recipes, autocast, checkpointing and ``is_first_microbatch`` as fp8mix.Linear.
Outside fp8_autocast: F.layer_norm / F.rms_norm, F.linear, the activation in torch's
ops, F.linear, exactly. Parameters (TE's names): layer_norm_weight, layer_norm_bias,
fc1_weight, fc1_bias, fc2_weight, fc2_bias.

``smooth_swiglu=True`` (Smooth-SwiGLU, Fishman et al. 2024): fc2's FP8 GEMMs take
a * s and W2 / s, s per channel of the activation output a, powers of two (exact), from
the batch's channel amaxes (fp8mix.nn.smooth; ``smooth_alpha`` 1.0 is the paper's, the
default 0.5 splits the spread with W2). The activation is then computed by torch and cast
by the separate cast (not the fused activation + cast kernel), and fc2's weight is re-cast
every call. Outside fp8_autocast nothing changes. The flag is the module's ``fp8_smooth``
policy attribute (``smooth_swiglu`` reads and sets it), the one fp8mix.Linear has, so a
precision plan (fp8mix.plan's outlier rule) can turn it on or off.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context import as_bool, current_frame
from ._forward import fp8_forward
from .activations import act_hp, activation_of
from .fp8_state import FP8StateMixin
from .fused_casts import act_input_cast, norm_input_cast
from .layernorm_linear import fused_path, norm_parameters, reset_norm
from .norms import NormSpec, norm_hp, norm_spec
from .smooth import DEFAULT_ALPHA, check_alpha, smooth_operands
from .te_options import TECheckpointMixin, apply_init, params_dtype_of, te_default_init, te_options

__all__ = ["LayerNormMLP"]


class _LayerNormMLPBase(nn.Module):
    """The parameters and their initialisation (what FP8StateMixin.reset_parameters extends)."""

    layer_norm_weight: nn.Parameter
    layer_norm_bias: Optional[nn.Parameter]
    fc1_weight: nn.Parameter
    fc2_weight: nn.Parameter
    fc1_bias: Optional[nn.Parameter]
    fc2_bias: Optional[nn.Parameter]

    def __init__(self, hidden: int, ffn: int, fc1_out: int, spec: NormSpec, bias: bool, inits, device, dtype):
        super().__init__()
        self.hidden_size, self.ffn_hidden_size, self._spec = hidden, ffn, spec
        self.init_method, self.output_layer_init_method = inits
        kw = dict(device=device, dtype=dtype)
        norm_parameters(self, hidden, spec, **kw)
        for fc, shape in (("fc1", (fc1_out, hidden)), ("fc2", (hidden, ffn))):  # TE's order of keys
            setattr(self, f"{fc}_weight", nn.Parameter(torch.empty(*shape, **kw)))
            if bias:
                setattr(self, f"{fc}_bias", nn.Parameter(torch.empty(shape[0], **kw)))
            else:
                self.register_parameter(f"{fc}_bias", None)

    def reset_parameters(self) -> None:
        """TE's initialisation: the norm at identity, init_method(fc1_weight),
        output_layer_init_method(fc2_weight) (default normal(0, 0.023)), zero biases."""
        reset_norm(self, self._spec)
        apply_init("LayerNormMLP", self.fc1_weight, self.init_method or te_default_init)
        apply_init("LayerNormMLP", self.fc2_weight, self.output_layer_init_method or te_default_init)
        with torch.no_grad():
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None:
                    b.zero_()


class LayerNormMLP(TECheckpointMixin, FP8StateMixin, _LayerNormMLPBase):
    """Transformer Engine's LayerNormMLP under fp8_autocast, with fused norm and activation
    casts.

    Args (TE's): hidden_size, ffn_hidden_size, eps=1e-5, bias=True,
    normalization="LayerNorm" | "RMSNorm", activation="gelu" (tanh form) | "relu" |
    "silu" | "qgelu" | "srelu" | "geglu" | "swiglu" | "reglu" | "qgeglu" | "sreglu",
    zero_centered_gamma, return_layernorm_output (``(out, ln_out)``), return_bias (fc2's
    bias not added but returned), params_dtype / dtype, device, init_method (fc1) and
    output_layer_init_method (fc2): callables on the weight. TE's parallelism and overlap
    options raise NotImplementedError; get_rng_state_tracker, seq_length, ... are
    accepted and ignored. fp8mix's own (keyword only): smooth_swiglu (per-channel smoothing
    of fc2's input, see the module docstring) and smooth_alpha (in (0, 1])."""

    fp8_gemms = 2
    fp8_min_features = 16
    fp8_smooth = False  # policy attribute: Smooth-SwiGLU's smoothing of fc2's input (smooth_swiglu)

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu", zero_centered_gamma: bool = False,
                 return_layernorm_output: bool = False, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, device=None, init_method: Optional[Callable] = None,
                 output_layer_init_method: Optional[Callable] = None, *, dtype: Optional[torch.dtype] = None,
                 smooth_swiglu: bool = False, smooth_alpha: float = DEFAULT_ALPHA, **te_kwargs):
        owner = "LayerNormMLP"
        te_options(owner, te_kwargs)
        as_bool(f"fp8mix.{owner}", "smooth_swiglu", smooth_swiglu)
        alpha = check_alpha(f"fp8mix.{owner}", smooth_alpha)
        for name, v in (("bias", bias), ("return_layernorm_output", return_layernorm_output),
                        ("return_bias", return_bias)):
            as_bool(f"fp8mix.{owner}", name, v)
        spec = norm_spec(owner, normalization, eps, zero_centered_gamma)
        act = activation_of(owner, activation)
        fc1_out = 2 * ffn_hidden_size if act.gated else ffn_hidden_size
        super().__init__(hidden_size, ffn_hidden_size, fc1_out, spec, bias, (init_method, output_layer_init_method),
                         device, params_dtype_of(owner, params_dtype, dtype))
        self._act, self.activation = act, activation
        self.fp8_smooth, self.smooth_alpha = smooth_swiglu, alpha
        self.return_layernorm_output, self.return_bias = return_layernorm_output, return_bias
        self.eps, self.normalization, self.zero_centered_gamma = float(eps), normalization, zero_centered_gamma
        self._gemm = 0
        self.reset_parameters()
        self._init_fp8_state(self.fc1_weight.device)

    @property
    def smooth_swiglu(self) -> bool:
        """TE-style spelling of the ``fp8_smooth`` policy (per-channel smoothing of fc2's input)."""
        return self.fp8_smooth

    @smooth_swiglu.setter
    def smooth_swiglu(self, on: bool) -> None:
        self.fp8_smooth = as_bool("fp8mix.LayerNormMLP", "smooth_swiglu", on)

    @property
    def weight(self) -> torch.Tensor:
        """The weight of the GEMM running now (fc1_weight or fc2_weight): what fp8mix's
        shared GEMM machinery reads as ``module.weight`` (device check, the random words it
        reserves for the weight cast, the monitor's weight record)."""
        return self.fc2_weight if self._gemm == 1 else self.fc1_weight

    def forward(self, inp: torch.Tensor, is_first_microbatch=None):
        """fc2(act(fc1(norm(inp)))); in FP8 inside fp8_autocast. Returns out, or
        (out, fc2_bias) / (out, ln_out) / (out, fc2_bias, ln_out) as TE."""
        if is_first_microbatch is not None:
            as_bool("fp8mix.LayerNormMLP", "is_first_microbatch", is_first_microbatch)
        gamma, beta, spec = self.layer_norm_weight, self.layer_norm_bias, self._spec
        keep: list = []
        fused = fused_path(self, inp)
        kw = dict(layout="out_in", is_first_microbatch=is_first_microbatch)

        def fc1_hp(x):
            ln = norm_hp(spec, x, gamma, beta)
            keep.append(ln)
            return F.linear(ln, self.fc1_weight, self.fc1_bias)

        self._gemm = 0
        if fused:
            cast = norm_input_cast(gamma, beta, spec, want_hp=self.return_layernorm_output, keep=keep)
            h = fp8_forward(self, inp, self.fc1_weight, self.fc1_bias, in_features=self.hidden_size,
                            out_features=self.fc1_weight.shape[0], hp_forward=fc1_hp, gemm=0, input_cast=cast, **kw)
        else:
            ln = norm_hp(spec, inp, gamma, beta)
            keep.append(ln)
            h = fp8_forward(self, ln, self.fc1_weight, self.fc1_bias, in_features=self.hidden_size,
                            out_features=self.fc1_weight.shape[0],
                            hp_forward=lambda t: F.linear(t, self.fc1_weight, self.fc1_bias), gemm=0, **kw)
        out = self._fc2(h, fused, kw)
        self._gemm = 0
        extra = []
        if self.return_bias:
            extra.append(self.fc2_bias)
        if self.return_layernorm_output:
            extra.append(keep[-1].reshape(*out.shape[:-1], self.hidden_size))
        return (out, *extra) if extra else out

    def _fc2(self, h: torch.Tensor, fused: bool, kw: dict) -> torch.Tensor:
        """fc2 on act(h): the activation fused with fc2's input cast, or (no fused
        kernels, calibration) computed by torch first."""
        act, bias = self._act, (None if self.return_bias else self.fc2_bias)
        F_ = self.ffn_hidden_size
        self._gemm = 1
        if self.fp8_smooth and current_frame() is not None:
            a = act_hp(act, h)
            xs, ws, _ = smooth_operands(a, self.fc2_weight, self.smooth_alpha)
            return fp8_forward(self, xs, ws, bias, in_features=F_, out_features=self.hidden_size,
                               hp_forward=lambda _: F.linear(a, self.fc2_weight, bias), gemm=1,
                               **{**kw, "is_first_microbatch": None})
        if not fused:
            return fp8_forward(self, act_hp(act, h), self.fc2_weight, bias, in_features=F_,
                               out_features=self.hidden_size, hp_forward=lambda t: F.linear(t, self.fc2_weight, bias),
                               gemm=1, **kw)
        # fp8_forward's x is only h's first F columns (a view): the shapes it checks; the
        # fused cast reads all of h
        x = h[..., :F_] if act.gated else h
        return fp8_forward(self, x, self.fc2_weight, bias, in_features=F_, out_features=self.hidden_size,
                           hp_forward=lambda _: F.linear(act_hp(act, h), self.fc2_weight, bias), gemm=1,
                           input_cast=act_input_cast(h.reshape(-1, h.shape[-1]), act), **kw)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"activation={self.activation}, normalization={self.normalization}, "
                f"bias={self.fc1_bias is not None}, fp8=True" + (", smooth_swiglu=True" if self.smooth_swiglu else ""))
