"""The FP8 forward of grouped linear layers (fp8mix.GroupedLinear, mixture-of-experts
expert layers): one function for every module that holds G experts' weights as one
(G, out, in) tensor and their FP8 state as G GEMMs of fp8mix.nn.fp8_state (``gemm0 + g``
for expert g: roles 3(gemm0+g) + input / weight / grad_output).

Per-tensor recipes (DelayedScaling, Float8CurrentScaling): every expert's input rows,
weight and gradient rows get their own scale, and each of the six steps is one C call
over all experts (fp8mix.ops.grouped_*: casts; scaled_grouped_mm: forward and dgrad;
scaled_grouped_mm_k: wgrad, the groups along K). Each expert's bytes, scales, state
updates and GEMM outputs are bit for bit what a single fp8mix GEMM of that expert's rows
gives (tests/nn/test_grouped_linear.py holds them against fp8mix.Linear per expert).

Conventions that differ from fp8mix.Linear, because a group can be empty: an expert that
receives no rows records nothing for its input and gradient roles (its weight is cast and
recorded every training forward, as TE does).

The other recipes (block, MX, rowwise, NVFP4) run each expert as its own fp8mix GEMM step
(fp8mix.nn._forward.fp8_forward with GEMM gemm0 + g: a Python loop over the experts, bit
for bit one fp8mix.Linear per expert). Format.AUTO, stochastic rounding of FP8 recipes, a
Monitor with the looped recipes, amax reduction over ranks and double backward raise
NotImplementedError naming what is missing.
"""
from __future__ import annotations

import itertools
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .. import ops
from ..context import current_frame, note_module_ran
from ..formats import Format, Granularity, fp8_dtype
from ..recipe import NVFP4BlockScaling
from ._forward import fp8_forward, frame_for, hp_out_dtype, reduce_group
from ._plan import delayed_spec
from .recompute import ReplayQueue, in_recompute, under_saved_tensor_hooks

__all__ = ["grouped_linear_forward", "check_splits"]

_HP = (torch.float32, torch.bfloat16, torch.float16)


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


def _as_block(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The experts' weights as one (G, N, K) tensor for the casts (no autograd): a view when
    they lie side by side in one buffer (fp8mix.GroupedLinear allocates them so), else a copy."""
    w0 = weights[0]
    n, k = w0.shape
    step = n * k * w0.element_size()
    if all(w.is_contiguous() and w.shape == w0.shape and w.dtype == w0.dtype and w.device == w0.device
           and w.untyped_storage().data_ptr() == w0.untyped_storage().data_ptr()
           and w.data_ptr() == w0.data_ptr() + g * step for g, w in enumerate(weights)):
        return w0.detach().as_strided((len(weights), n, k), (n * k, k, 1))
    return torch.stack([w.detach() for w in weights])


def _hp_forward(x: torch.Tensor, weight, bias: Optional[torch.Tensor], splits: list) -> torch.Tensor:
    """Each group's rows through F.linear (bit for bit nn.Linear per expert)."""
    parts = torch.split(x, splits)
    # (unbind, not weight[g]: each index's backward would fill a whole (G, N, K) gradient)
    ws = weight.unbind(0) if isinstance(weight, torch.Tensor) else weight
    bs = bias.unbind(0) if bias is not None else [None] * len(parts)
    ys = [F.linear(p, ws[g], bs[g]) for g, p in enumerate(parts)]
    return torch.cat(ys)  # (G >= 1: never empty)


class GroupedPlan:
    """What one grouped forward decided, for its backward and a checkpoint's recompute."""

    __slots__ = ("delayed", "dtypes", "spec", "margin", "pow2", "eps", "x_scale", "w_scale", "g_plans", "g_slots",
                 "record", "out_dtype", "gemm0", "region", "replayed_by", "backward_done", "__weakref__")

    def __init__(self, recipe, gemm0: int, record: bool):
        self.gemm0, self.record, self.delayed = gemm0, record, recipe.delayed()
        self.dtypes = tuple(fp8_dtype(recipe.format(r)) for r in ("input", "weight", "grad_output"))
        self.spec = delayed_spec(recipe) if self.delayed else None
        self.margin, self.pow2 = int(recipe.margin), bool(recipe.power_2_scale)
        self.eps = float(getattr(recipe, "amax_epsilon", 0.0))
        self.out_dtype = torch.float32
        self.x_scale: Optional[torch.Tensor] = None  # delayed: the scales the casts used (a recompute repeats them)
        self.w_scale: Optional[torch.Tensor] = None
        self.g_plans: Optional[torch.Tensor] = None  # delayed: the gradient casts' plans and reserved slots
        self.g_slots: Optional[torch.Tensor] = None
        self.backward_done = False


def _one_call(recipe) -> bool:
    """Whether the recipe runs through the grouped ops (one C call per step): per-tensor recipes."""
    return not isinstance(recipe, NVFP4BlockScaling) and not recipe.along_reduction() and all(
        recipe.granularity(r) == Granularity.TENSOR for r in ("input", "weight", "grad_output"))


def _unsupported(recipe, frame) -> Optional[str]:
    """Why this recipe cannot run on grouped layers at all (None: it can)."""
    if isinstance(recipe, NVFP4BlockScaling):  # (its own rules: stochastic gradients draw in backward)
        return "the Monitor with NVFP4BlockScaling" if frame.monitor is not None else None
    if recipe.fp8_format is Format.AUTO:
        return "Format.AUTO"
    if recipe.stochastic():
        return "stochastic rounding"
    if recipe.delayed() and callable(recipe.amax_compute_algo):
        return "a callable amax_compute_algo"
    if frame.monitor is not None and not _one_call(recipe):
        return f"the Monitor with {type(recipe).__name__}"
    return None


def _replays(m) -> dict:
    """The grouped path's own replay queues (per first GEMM), apart from fp8_forward's."""
    q = m.__dict__.get("_grouped_replay")
    if q is None or q[0] is not m._replay:  # (new, or the module's Python state was reset)
        q = m.__dict__["_grouped_replay"] = (m._replay, {})
    return q[1]


def _per_expert_forward(m, x, w_list: list, bias, splits: list, gemm0: int, is_first_microbatch):
    """The recipes the grouped ops do not cover (block, MX, rowwise, NVFP4): each expert as
    one fp8mix GEMM step (fp8mix.nn._forward.fp8_forward, GEMM gemm0 + g of m's state) — a
    Python loop over the experts, bit for bit one fp8mix.Linear per expert. A checkpoint's
    recompute repeats each expert's plan, as for a Linear."""
    N, K = w_list[0].shape
    bs = bias.unbind(0) if bias is not None else [None] * len(w_list)
    ys = []
    for g, part in enumerate(torch.split(x, splits)):
        w, b = w_list[g], bs[g]
        ys.append(fp8_forward(m, part, w, b, layout="out_in", in_features=K, out_features=N,
                              is_first_microbatch=is_first_microbatch,
                              hp_forward=lambda t, w=w, b=b: F.linear(t, w, b), gemm=gemm0 + g))
    return torch.cat(ys)


def grouped_linear_forward(m, x: torch.Tensor, weight: Union[torch.Tensor, Sequence[torch.Tensor]],
                           bias: Optional[torch.Tensor], m_splits: Union[Sequence[int], torch.Tensor], *,
                           gemm0: int = 0, is_first_microbatch=None) -> torch.Tensor:
    """y (T, N) for x (T, K), weight (G, N, K) (one tensor, e.g. a stacked 3-D parameter, or
    a sequence of G (N, K) tensors: each gets its own gradient), bias (G, N) or None: rows of
    group g times weight[g]^T plus bias[g]; in FP8 under fp8_autocast with module m's FP8
    state, GEMMs gemm0 .. gemm0 + G - 1. is_first_microbatch as fp8mix.Linear's (TE's): True
    casts and keeps the FP8 weights, False reuses them."""
    owner = type(m).__name__
    whole: Optional[torch.Tensor] = weight if isinstance(weight, torch.Tensor) else None
    weights: list = [] if whole is not None else list(weight)
    if whole is None and (not weights or any(not isinstance(w, torch.Tensor) or w.dim() != 2
                                             or w.shape != weights[0].shape for w in weights)):
        raise ValueError(f"fp8mix.{owner}: weight must be a (G, N, K) tensor or G tensors of one (N, K) shape")
    shape = tuple(whole.shape) if whole is not None else (len(weights), *weights[0].shape)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or len(shape) != 3 or x.shape[1] != shape[2]:
        raise ValueError(f"fp8mix.{owner}: input {tuple(getattr(x, 'shape', ()))} and weight {shape} "
                         "do not make a grouped linear (x (T, K), weight (G, N, K))")
    G, N, K = shape
    if bias is not None and tuple(bias.shape) != (G, N):
        raise ValueError(f"fp8mix.{owner}: bias has shape {tuple(bias.shape)}, expected ({G}, {N})")
    if not 0 <= gemm0 <= m.fp8_gemms - G:
        raise ValueError(f"fp8mix.{owner}: GEMMs {gemm0}..{gemm0 + G - 1} outside the module's {m.fp8_gemms}")
    splits = check_splits(owner, m_splits, G, x.shape[0])
    eager = not torch.compiler.is_compiling()
    recompute = eager and in_recompute(eager=True) and torch.is_grad_enabled()
    w_inputs: list = [whole] if whole is not None else weights
    w_list = list(whole.unbind(0)) if whole is not None else weights
    queue = _replays(m).setdefault(gemm0, ReplayQueue())
    replay = queue.take() if recompute else None
    if recompute and replay is None:  # a per-expert forward's recompute (or a high-precision one): fp8_forward
        return _per_expert_forward(m, x, w_list, bias, splits, gemm0, is_first_microbatch)  # replays each
    frame = current_frame()
    if replay is None:
        if frame is None or not frame.enabled:
            return _hp_forward(x, weight, bias, splits)
        if not m.fp8_enabled or m.fp8_recipe is not None:
            frame = frame_for(m, frame)
            if not frame.enabled:
                return _hp_forward(x, weight, bias, splits)
    w_dtype = w_inputs[0].dtype
    if x.dtype not in _HP:
        raise TypeError(f"fp8mix.{owner}: input must be float32, bfloat16 or float16, got {x.dtype}")
    if not x.is_cpu:
        raise NotImplementedError(f"fp8mix.{owner}: the FP8 grouped GEMMs run on the CPU only in this build "
                                  f"(input on {x.device})")
    note_module_ran()
    if x.numel() == 0 or min(N, K) < getattr(m, "fp8_min_features", 16):
        return _hp_forward(x, weight, bias, splits)
    if replay is not None:
        plan = replay
    else:
        assert frame is not None
        recipe = frame.recipe
        why = _unsupported(recipe, frame)
        if why is not None:
            raise NotImplementedError(f"fp8mix.{owner}: {why} is not implemented for grouped GEMMs; use "
                                      "another recipe or run the experts outside fp8_autocast")
        if recipe.reduce_amax and reduce_group(frame.group) is not None:
            raise NotImplementedError(f"fp8mix.{owner}: amaxes all-reduced over ranks (reduce_amax=True with a "
                                      "process group of more than one rank) are not implemented for grouped GEMMs; "
                                      "pass reduce_amax=False to the recipe (each rank scales from its own tokens)")
        if not _one_call(recipe):
            return _per_expert_forward(m, x, w_list, bias, splits, gemm0, is_first_microbatch)
        plan = GroupedPlan(recipe, gemm0, record=(torch.is_grad_enabled() and m.training) or frame.calibrating)
    plan.out_dtype = hp_out_dtype(x, w_dtype)
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in w_inputs))
    offs = torch.tensor(list(itertools.accumulate(splits)), dtype=torch.int64)
    with torch.no_grad():
        block = whole.detach() if whole is not None else _as_block(w_inputs)
        xq, x_sinv, wq, w_sinv = _casts(m, x.detach(), block, offs, plan, replay is not None, wants_grad,
                                        is_first_microbatch)
    if replay is None and plan.record and wants_grad and eager and under_saved_tensor_hooks(eager=True):
        queue.push(plan)  # a checkpoint may recompute this forward: it will repeat this plan
    pending = m._buffers["fp8_grad_pending"][gemm0:gemm0 + G] if (plan.delayed and plan.record) else None
    return GroupedFP8Function.apply(x, bias, (xq, x_sinv, wq, w_sinv, offs, pending), plan, whole is None,
                                    *w_inputs)


def _casts(m, x, weight, offs, plan: GroupedPlan, replaying: bool, wants_grad: bool, is_first_microbatch):
    """x's and the weights' per-expert casts (and, delayed, the gradient plans): (xq, x_sinv,
    wq (G, N, K), w_sinv), each scale per expert."""
    G, N, K = weight.shape
    xd, wd, gd = plan.dtypes
    w2 = weight.reshape(G * N, K)
    w_offs = torch.arange(1, G + 1, dtype=torch.int64) * N
    if replaying and plan.x_scale is not None and plan.w_scale is not None:
        # a delayed checkpoint's recompute: the original forward's scales, nothing recorded
        rows = torch.diff(offs, prepend=offs.new_zeros(1))
        xq = ops.cast(x, plan.x_scale.repeat_interleave(rows), xd, granularity=Granularity.ROW, inf_to_nan=True)[0]
        wq = ops.cast(w2, plan.w_scale.repeat_interleave(N), wd, granularity=Granularity.ROW, inf_to_nan=True)[0]
        return xq, plan.x_scale.reciprocal(), wq.view(G, N, K), plan.w_scale.reciprocal()
    cache = m.__dict__.setdefault("_grouped_wcache", {})
    cached = cache.get(plan.gemm0) if (is_first_microbatch is False and not replaying) else None
    spec = plan.spec
    if spec is None:  # current scaling: a pure function of the tensors (a recompute repeats it)
        xq, _, x_sinv, _ = ops.grouped_quantize(x, offs, xd, margin=plan.margin, power_2_scale=plan.pow2,
                                                amax_epsilon=plan.eps, inf_to_nan=True)
        if cached is not None:
            wq, w_sinv = cached
        else:
            wq, _, w_sinv, _ = ops.grouped_quantize(w2, w_offs, wd, margin=plan.margin, power_2_scale=plan.pow2,
                                                    amax_epsilon=plan.eps, inf_to_nan=True)
            if is_first_microbatch:
                cache[plan.gemm0] = (wq, w_sinv)
        return xq, x_sinv, wq.view(G, N, K), w_sinv
    b, g0 = m._buffers, plan.gemm0
    m._ensure_history(spec.history_len)
    hist, scale, steps = b["fp8_amax_history"], b["fp8_scale"], b["fp8_steps"]
    plan.g_plans, plan.g_slots = ops.grouped_delayed_flush(
        hist, scale, steps, b["fp8_grad_pending"][g0:g0 + G], b["fp8_grad_slot"][g0:g0 + G], role0=3 * g0 + 2,
        role_step=3, fp8_dtype=gd, spec=spec, record=plan.record, reserve=plan.record and wants_grad)
    xq, _, xs, _ = ops.grouped_delayed_cast(x, offs, hist, scale, steps, role0=3 * g0, role_step=3, fp8_dtype=xd,
                                            spec=spec, record=plan.record, inf_to_nan=True)
    if cached is not None:
        wq, ws = cached
    else:
        wq, _, ws, _ = ops.grouped_delayed_cast(w2, w_offs, hist, scale, steps, role0=3 * g0 + 1, role_step=3,
                                                fp8_dtype=wd, spec=spec, record=plan.record, inf_to_nan=True)
        if is_first_microbatch:
            cache[plan.gemm0] = (wq, ws)
    plan.x_scale, plan.w_scale = xs[:, 0], ws[:, 0]
    return xq, xs[:, 1], wq.view(G, N, K), ws[:, 1]


class GroupedFP8Function(torch.autograd.Function):
    """y[rows of g] = x[rows of g] W_g^T + b_g from operands cast before apply(); backward
    casts dy per expert once and runs dgrad (grouped GEMM) and wgrad (grouped-K GEMM)."""

    @staticmethod
    def forward(ctx, x, bias, fp8, plan: GroupedPlan, as_list: bool, *weights):
        xq, x_sinv, wq, w_sinv, offs, pending = fp8
        y = ops.scaled_grouped_mm(xq, wq.transpose(1, 2), x_sinv, w_sinv, offs=offs, bias=bias,
                                  out_dtype=plan.out_dtype, scale_kind=0)
        ctx.save_for_backward(xq, x_sinv, wq, w_sinv, offs)
        ctx.plan, ctx.pending = plan, pending
        ctx.x_dtype, ctx.w_dtype, ctx.as_list = x.dtype, weights[0].dtype, as_list
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        xq, x_sinv, wq, w_sinv, offs = ctx.saved_tensors
        plan = ctx.plan
        if torch.is_grad_enabled():
            raise NotImplementedError("fp8mix: double backward (create_graph=True) through a grouped FP8 layer is not "
                                      "implemented; run the experts outside fp8_autocast for it")
        plan.backward_done = True
        dy2 = dy if dy.dtype in _HP else dy.float()
        want_db = ctx.bias_dtype is not None and ctx.needs_input_grad[1]
        delayed = plan.delayed and plan.g_plans is not None
        gq, _, g_sinv, _, db = ops.grouped_grad_cast(
            dy2, offs, plan.dtypes[2], plans=plan.g_plans if delayed else None,
            pending=ctx.pending if (delayed and plan.g_slots is not None and ctx.pending is not None) else None,
            slots=plan.g_slots if (delayed and ctx.pending is not None) else None, margin=plan.margin,
            power_2_scale=plan.pow2, amax_epsilon=plan.eps, colsum=want_db)
        dx = dw = None
        if ctx.needs_input_grad[0]:  # dx[rows of g] = dy[rows of g] W_g
            dx = ops.scaled_grouped_mm(gq, wq, g_sinv, w_sinv, offs=offs, out_dtype=ctx.x_dtype, scale_kind=0)
        if any(ctx.needs_input_grad[5:]):  # dW_g = dy[rows of g]^T x[rows of g]: the groups along K
            dw = ops.scaled_grouped_mm_k(gq.t(), xq, g_sinv, x_sinv, offs=offs, out_dtype=ctx.w_dtype)
        if db is not None:
            db = db.to(ctx.bias_dtype)
        dws = (None,) * len(ctx.needs_input_grad[5:]) if dw is None else tuple(dw.unbind(0)) if ctx.as_list else (dw,)
        return (dx, db if want_db else None, None, None, None, *dws)
