"""GEMM inputs that their producer writes in FP8: the ``input_cast`` extension point of
fp8mix.nn._forward.fp8_forward for a norm (LayerNormLinear, LayerNormMLP's fc1) and an
activation (LayerNormMLP's fc2), on the C kernels of csrc/core/norm.c and act.c.

A *source* (NormSource, ActSource) makes the values and casts them in the same pass at
whatever the recipe asks: :func:`fused_input_cast` follows fp8mix.nn._casts.cast_input
branch for branch (block tiles and the 128x128 copy for wgrad; delayed scaling through
the module's state, composed when amaxes are all-reduced or the recipe's
amax_compute_algo is Python; current scaling; a checkpoint replay's scales; stochastic
rounding from the plan's offsets; infinities to NaN), so a fused module's FP8 numerics
are a Linear's on the produced values. No high-precision copy of the values is made
unless one is asked for (return_layernorm_output, or a Monitor sampling the step).

The autograd functions return, as the tensor whose gradient receives the GEMM's dx,
either that copy or a zero-storage stand-in (``x.new_zeros(()).expand``); their
backward is the norm's (from x and the kept mean / rstd) or the activation's (from h).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .. import ops
from ..formats import Granularity, fp8_dtype
from ._casts import _sr, all_reduce_max, input_layout, python_algo_scale
from ._plan import StepPlan, delayed_spec
from .activations import act_backward
from .norms import NormSpec, norm_backward

__all__ = ["NormSource", "ActSource", "fused_input_cast", "norm_input_cast", "act_input_cast", "has_fused_kernels"]

_IN = 0


def has_fused_kernels(device: torch.device) -> bool:
    """Whether this build has the fused producer casts for tensors on `device`."""
    return ops.has_kernels("norm_cast", device) and ops.has_kernels("act_cast", device)


class NormSource:
    """The normalized rows of x2 as a fused cast's source. The first call computes the
    row statistics (mean, rstd: kept for backward and reused by later calls)."""

    def __init__(self, x2: torch.Tensor, gamma, beta, spec: NormSpec):
        self.x2, self.gamma, self.beta, self.spec = x2, gamma, beta, spec
        self.dtype = x2.dtype
        self.mean: Optional[torch.Tensor] = None
        self.rstd: Optional[torch.Tensor] = None

    def _args(self) -> dict:
        s = self.spec
        kw: dict = dict(kind=s.kind, eps=s.eps, zero_centered_gamma=s.zero_centered_gamma)
        if self.rstd is not None:
            kw.update(mean=self.mean, rstd=self.rstd)
        return kw

    def _keep(self, mean: torch.Tensor, rstd: torch.Tensor) -> None:
        if self.rstd is None:
            self.mean = mean if mean.numel() else None
            self.rstd = rstd

    def cast(self, fp8: torch.dtype, **kw):
        q, qt, sinv, am, mean, rstd, hp = ops.norm_cast(self.x2, self.gamma, self.beta, fp8_dtype=fp8, **self._args(),
                                                        **kw)
        self._keep(mean, rstd)
        return q, qt, sinv, am, hp

    def delayed(self, *state, **kw):
        q, qt, scales, am, mean, rstd, hp = ops.norm_delayed_cast(self.x2, self.gamma, self.beta, *state,
                                                                  **self._args(), **kw)
        self._keep(mean, rstd)
        return q, qt, scales, am, hp


class ActSource:
    """The activation of h2 (2-D; gated: of its two halves) as a fused cast's source."""

    def __init__(self, h2: torch.Tensor, act: ops.Act):
        self.h2, self.act, self.dtype = h2, act, h2.dtype

    def cast(self, fp8: torch.dtype, **kw):
        return ops.act_cast(self.h2, act=self.act, fp8_dtype=fp8, **kw)

    def delayed(self, *state, **kw):
        return ops.act_delayed_cast(self.h2, *state, act=self.act, **kw)


def _current(src, fmt, recipe, gran, group, *, transpose=False, sr=None, hp=None):
    """Current scaling of the source's values: (q, qt, scale_inv, hp); with a process group
    the amaxes are all-reduced before the cast (every rank the same scales)."""
    sr = sr or {}
    kw = dict(granularity=gran, margin=recipe.margin, power_2_scale=recipe.power_2_scale,
              amax_epsilon=float(getattr(recipe, "amax_epsilon", 0.0)), inf_to_nan=True, **sr)
    if group is None:
        q, qt, sinv, _, out = src.cast(fp8_dtype(fmt), transpose=transpose, hp_dtype=hp, **kw)
        return q, qt, sinv, out
    _, _, _, am, _ = src.cast(fp8_dtype(fmt), want_q=False, **kw)
    all_reduce_max(am, group)
    scale, sinv = ops.compute_scale(am, fp8_dtype(fmt), margin=recipe.margin, power_2_scale=recipe.power_2_scale,
                                    amax_epsilon=kw["amax_epsilon"])
    q, qt, _, _, out = src.cast(fp8_dtype(fmt), scale=scale, transpose=transpose, hp_dtype=hp, **kw)
    return q, qt, sinv, out


def _delayed(m, src, plan: StepPlan, replay, *, transpose: bool, hp):
    """Delayed-scaling cast of the values (the GEMM's input role): (q, qt, scales, hp)."""
    fmt, sr = plan.fmts[_IN], _sr(plan, _IN)
    if replay is not None:  # a checkpoint recompute: the original forward's scale, no record
        scales = replay.x_scales
        q, qt, _, _, out = src.cast(fp8_dtype(fmt), scale=scales[0:1], transpose=transpose, inf_to_nan=True,
                                    hp_dtype=hp, **sr)
        return q, qt, scales, out
    recipe, role = plan.recipe, plan.role(_IN)
    spec = delayed_spec(recipe)
    state = (m.fp8_amax_history, m.fp8_scale, m.fp8_steps)
    kw = dict(role=role, fp8_dtype=fp8_dtype(fmt), spec=spec, transpose=transpose, inf_to_nan=True, hp_dtype=hp, **sr)
    if not (callable(recipe.amax_compute_algo) or plan.group is not None):
        q, qt, scales, _, out = src.delayed(*state, record=plan.record, **kw)
        return q, qt, scales, out
    # composed, as _casts._delayed_composed: all-reduce between the passes, or a Python algo
    fresh = None
    if m._maybe_fresh[role] and plan.group is not None:  # a first use scales from the all-reduced amax
        _, _, _, fresh, _ = src.cast(fp8_dtype(fmt), want_q=False)
        all_reduce_max(fresh, plan.group)
    q, qt, scales, am, out = src.delayed(*state, record=False, fresh_amax=fresh, **kw)
    if plan.record:
        all_reduce_max(am, plan.group)
        before = m.fp8_scale[role:role + 1].clone() if callable(recipe.amax_compute_algo) else None
        ops.delayed_record(*state, am, role=role, fp8_dtype=fp8_dtype(fmt), spec=spec)
        if before is not None:
            python_algo_scale(m, role, recipe, fmt, before)
        m._maybe_fresh[role] = False
    return q, qt, scales, out


def fused_input_cast(m, src, plan: StepPlan, replay, *, want_hp: bool):
    """(xq, x_sinv, x_save, x_save_sinv, hp): cast_input's results for the source's values
    (the module's layout is "out_in"), and their high-precision copy (None unless want_hp)."""
    recipe = plan.recipe
    gran, want_xt, save_gran = input_layout(plan)
    hp = src.dtype if want_hp else None
    if gran == Granularity.BLOCK:
        xq, _, x_sinv, out = _current(src, plan.fmts[_IN], recipe, gran, plan.group, sr=_sr(plan, _IN), hp=hp)
        q2, q2t, x_save_sinv, _ = _current(src, plan.fmts[_IN], recipe, save_gran, plan.group, sr=_sr(plan, 3),
                                           transpose=plan.tn)
        return xq, x_sinv, (q2t if plan.tn else q2), x_save_sinv, (out if want_hp else None)
    if recipe.delayed():
        xq, xqt, scales, out = _delayed(m, src, plan, replay, transpose=want_xt, hp=hp)
        plan.x_scales = scales
        x_sinv = scales[1]
    else:
        xq, xqt, x_sinv, out = _current(src, plan.fmts[_IN], recipe, gran, plan.group, transpose=want_xt,
                                        sr=_sr(plan, _IN), hp=hp)
    return xq, x_sinv, (xqt if want_xt else None), (x_sinv if want_xt else None), (out if want_hp else None)


def _outputs(x2, casts, hp, shape):
    """The values (or a zero-storage stand-in of `shape`), then the FP8 casts (None as an
    empty tensor: autograd functions return tensors)."""
    xq, x_sinv, x_save, x_save_sinv = casts
    x_save = x2.new_empty((0,)) if x_save is None else x_save
    x_save_sinv = x2.new_empty((0,)) if x_save_sinv is None else x_save_sinv
    out = hp if hp is not None else x2.new_zeros(()).expand(shape)
    return out, xq, x_sinv, x_save, x_save_sinv


def _norm_forward(x2, gamma, beta, spec: NormSpec, m, plan, replay, want_hp: bool):
    src = NormSource(x2.detach(), gamma, beta, spec)
    *casts, hp = fused_input_cast(m, src, plan, replay, want_hp=want_hp)
    return _outputs(x2, casts, hp, x2.shape), src


def _act_forward(h2, act: ops.Act, m, plan, replay, want_hp: bool):
    *casts, hp = fused_input_cast(m, ActSource(h2.detach(), act), plan, replay, want_hp=want_hp)
    return _outputs(h2, casts, hp, (h2.shape[0], h2.shape[1] // 2 if act.gated else h2.shape[1]))


class _NormCast(torch.autograd.Function):
    """out = norm(x2) (or a stand-in) and its FP8 casts; backward: the norm's."""

    @staticmethod
    def forward(ctx, x2, gamma, beta, spec: NormSpec, m, plan, replay, want_hp: bool):
        out, src = _norm_forward(x2, gamma, beta, spec, m, plan, replay, want_hp)
        ctx.save_for_backward(x2, gamma, beta, src.mean, src.rstd)
        ctx.spec = spec
        ctx.mark_non_differentiable(*out[1:])
        return out

    @staticmethod
    def backward(ctx, dy, *_):
        x2, gamma, beta, mean, rstd = ctx.saved_tensors
        dx, dg, db = norm_backward(ctx.spec, dy, x2, gamma, beta, mean, rstd, ctx.needs_input_grad[:3])
        return dx, dg, db, None, None, None, None, None


class _ActCast(torch.autograd.Function):
    """out = act(h2) (or a stand-in) and its FP8 casts; backward: the activation's."""

    @staticmethod
    def forward(ctx, h2, act: ops.Act, m, plan, replay, want_hp: bool):
        out = _act_forward(h2, act, m, plan, replay, want_hp)
        ctx.save_for_backward(h2)
        ctx.act = act
        ctx.mark_non_differentiable(*out[1:])
        return out

    @staticmethod
    def backward(ctx, dy, *_):
        (h2,) = ctx.saved_tensors
        return act_backward(ctx.act, dy, h2), None, None, None, None, None


def _tracked(*tensors) -> bool:
    """Whether autograd records an op on these (fp8_forward runs input casts under
    enable_grad; inference mode and inputs without grad build no graph)."""
    return not torch.is_inference_mode_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _finish(out, xq, x_sinv, x_save, x_save_sinv, plan: StepPlan):
    has_save = input_layout(plan)[0] == Granularity.BLOCK or input_layout(plan)[1]
    return out, xq, x_sinv, (x_save if has_save else None), (x_save_sinv if has_save else None)


def _norm_cast(m, x2, plan, replay, *, gamma, beta, spec, want_hp, keep):
    want = want_hp or plan.monitor is not None  # a sampling monitor reads the values
    if _tracked(x2, gamma, beta):
        out = _NormCast.apply(x2, gamma, beta, spec, m, plan, replay, want)
    else:
        out = _norm_forward(x2, gamma, beta, spec, m, plan, replay, want)[0]
    if want_hp:
        keep.append(out[0])
    return _finish(*out, plan)


def _act_cast(m, x2, plan, replay, *, h2, act):
    want = plan.monitor is not None
    if _tracked(h2):
        out = _ActCast.apply(h2, act, m, plan, replay, want)
    else:
        out = _act_forward(h2, act, m, plan, replay, want)
    return _finish(*out, plan)


def norm_input_cast(gamma, beta, spec: NormSpec, *, want_hp: bool, keep: list):
    """fp8_forward's input_cast for a norm of the module's input (x2 is that input, 2-D);
    with want_hp the normalized values (differentiable) are appended to `keep`."""
    return functools.partial(_norm_cast, gamma=gamma, beta=beta, spec=spec, want_hp=want_hp, keep=keep)


def act_input_cast(h2: torch.Tensor, act: ops.Act):
    """fp8_forward's input_cast for the activation of h2 (the previous GEMM's 2-D output;
    fp8_forward's own x2 is only its first half's view and is not read)."""
    return functools.partial(_act_cast, h2=h2, act=act)
