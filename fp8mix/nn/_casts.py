"""The FP8 casts of a linear layer's three GEMMs, per recipe, and the per-call plan.

    forward  y[M,N]  = x[M,K]  . W^T       x and W cast (input, weight roles)
    dgrad    dx[M,K] = dy[M,N] . W         dy cast (grad_output role)
    wgrad    dW      = dy^T . x  (or x^T . dy for a (K, N) weight)

A Linear keeps W as (N, K) ("out_in"); Hugging Face's Conv1D as (K, N) ("in_out"). The C
GEMM reads A and B row- or column-major, so on the CPU no cast writes a transpose: wgrad
reads dy^T (out_in) or x^T (in_out) as a transposed view of the one FP8 copy.
FP8 tensor cores (cuBLASLt) read only "TN": both operands contiguous along the reduction
dimension. With ``plan.tn`` (CUDA tensors; TN_ON_CPU makes the CPU take the same path, for
tests) every cast that feeds a B operand also writes its transpose (one pass, the fused
cast+transpose), so that every B is a K-contiguous view and cuBLASLt gets no copy.

What a call asks of the casts is in its plan (fp8mix.nn._plan.StepPlan); these are the
separate ops of Path.COMPOSED (any device, recipe, process group, replay), which also serve
the direct path's backward where it cannot be one op. fp8mix.nn._direct runs the same
kernels in one call.
"""
from __future__ import annotations

import torch

from .. import ops
from .._op_types import DelayedSpec
from ..formats import Format, Granularity, fp8_dtype
from ._plan import IN as _IN
from ._plan import G as _G
from ._plan import StepPlan, fmt_dtype, grad_state, recipe_consts
from ._plan import W as _W
from .fp8_weight import FP8WeightBase

__all__ = ["cast_input", "cast_weight", "recast_weight", "input_layout", "grad_casts",
           "block_wgrad_cast", "grad_operands", "all_reduce_max", "python_algo_scale"]

_TENSOR, _BLOCK, _BLOCK2D = Granularity.TENSOR, Granularity.BLOCK, Granularity.BLOCK2D
_NO_SR: dict = {}


def all_reduce_max(t: torch.Tensor, group) -> None:
    """t = max of t over `group`: a process group, a tuple of groups (a data-parallel group
    and a tensor-parallel group: the max over each in turn is the max over both), or None."""
    if group is None:
        return
    for g in (group if isinstance(group, tuple) else (group,)):
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=g)


def _sr(plan: StepPlan, role: int) -> dict:
    """rng / rng_skip keywords of a cast of `role` (empty: round to nearest)."""
    if not plan.skips:
        return _NO_SR
    skip = plan.skips.get(role)
    return _NO_SR if skip is None else {"rng": plan.rng, "rng_skip": skip}


def _current(x2, fmt: Format, recipe, gran, group, *, transpose=False, sr=None):
    """Current scaling of a 2-D tensor: (q, qt, scale_inv, amax); with a process group the
    amaxes are all-reduced first so that every rank uses the same scales."""
    sr = sr or _NO_SR
    eps = recipe_consts(recipe).eps
    if group is None:
        return ops.quantize_current(x2, fp8_dtype(fmt), granularity=gran, margin=recipe.margin,
                                    power_2_scale=recipe.power_2_scale, amax_epsilon=eps, transpose=transpose,
                                    inf_to_nan=True, **sr)
    am = ops.amax(x2, granularity=gran)
    all_reduce_max(am, group)
    scale, sinv = ops.compute_scale(am, fp8_dtype(fmt), margin=recipe.margin, power_2_scale=recipe.power_2_scale,
                                    amax_epsilon=eps)
    q, qt, _ = ops.cast(x2, scale, fp8_dtype(fmt), granularity=gran, transpose=transpose, inf_to_nan=True, **sr)
    return q, qt, sinv, am


def _delayed(m, t2, role: int, plan: StepPlan, replay, *, transpose=False):
    """Delayed-scaling cast of a forward tensor: (q, qt, scales [scale, scale_inv])."""
    fmt, sr = plan.fmts[role], _sr(plan, role)
    if replay is not None:  # a checkpoint recompute: the original forward's scale, no record
        scales = replay.x_scales if role == _IN else replay.w_scales
        q, qt, _ = ops.cast(t2, scales[0:1], fp8_dtype(fmt), transpose=transpose, inf_to_nan=True, **sr)
        return q, qt, scales
    spec = plan.consts.spec
    if plan.consts.python_algo or plan.group is not None:
        return _delayed_composed(m, t2, role, plan, spec, transpose)
    b = m._buffers
    q, qt, scales, _ = ops.delayed_cast(t2, b["fp8_amax_history"], b["fp8_scale"], b["fp8_steps"],
                                        role=3 * plan.gemm + role, fp8_dtype=fmt_dtype(plan, role), spec=spec,
                                        record=plan.record, transpose=transpose, inf_to_nan=True, **sr)
    return q, qt, scales


def _delayed_composed(m, t2, role: int, plan: StepPlan, spec: DelayedSpec, transpose: bool):
    """The delayed cast from its parts, for what one C op cannot do: all-reducing amaxes
    over ranks between the passes, or a Python amax_compute_algo."""
    fmt, sr, group, recipe = plan.fmts[role], _sr(plan, role), plan.group, plan.recipe
    state = (m.fp8_amax_history, m.fp8_scale, m.fp8_steps)
    fresh = None
    role = plan.role(role)  # from here on: the module-state index
    if m._maybe_fresh[role] and group is not None:  # a first use scales from the all-reduced amax
        fresh = ops.amax(t2)
        all_reduce_max(fresh, group)
    q, qt, scales, am = ops.delayed_cast(t2, *state, role=role, fp8_dtype=fp8_dtype(fmt), spec=spec, record=False,
                                         transpose=transpose, inf_to_nan=True, fresh_amax=fresh, **sr)
    if plan.record:
        all_reduce_max(am, group)
        before = m.fp8_scale[role:role + 1].clone() if callable(recipe.amax_compute_algo) else None
        ops.delayed_record(*state, am, role=role, fp8_dtype=fp8_dtype(fmt), spec=spec)
        if before is not None:
            python_algo_scale(m, role, recipe, fmt, before)
        m._maybe_fresh[role] = False
    return q, qt, scales


def python_algo_scale(m, role: int, recipe, fmt: Format, before: torch.Tensor) -> None:
    """A callable amax_compute_algo: redo the record's scale rule (fp8mix_delayed_record)
    with the callable's value on the (L,) history in place of the max."""
    h = m.fp8_amax_history[: recipe.amax_history_len, role]
    v = recipe.amax_compute_algo(h.clone())
    try:
        a = torch.as_tensor(v, dtype=torch.float32, device=h.device)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError("DelayedScaling.amax_compute_algo must return one number (a float or a 1-element "
                        f"tensor), got {type(v).__name__}") from None
    if a.numel() != 1:
        raise ValueError(f"DelayedScaling.amax_compute_algo must return one number, got a tensor of shape "
                         f"{tuple(a.shape)}")
    a = a.reshape(1)
    kw = dict(margin=recipe.margin, power_2_scale=recipe.power_2_scale)
    s_algo, _ = ops.compute_scale(a, fp8_dtype(fmt), **kw)
    s_first, _ = ops.compute_scale(h[0:1].contiguous(), fp8_dtype(fmt), **kw)
    steps = m.fp8_steps[role]
    base = torch.where((steps == 1) & (h[0:1] > 0), s_first, before)   # the first record scales from itself
    due = torch.isfinite(a) & (a > 0) & (steps % recipe.interval == 0)
    m.fp8_scale[role:role + 1] = torch.where(due, s_algo, base)


def input_layout(plan: StepPlan) -> tuple:
    """What a GEMM input cast must produce for this plan: (granularity of xq, whether x's
    transpose is also needed, granularity of the wgrad copy or None when xq (or its
    transpose) serves). Module-specific input casts (a fused norm or activation) follow it."""
    recipe, in_out = plan.recipe, plan.layout == "in_out"
    if recipe.along_reduction():
        raise NotImplementedError(f"fp8mix: {type(recipe).__name__} is not supported by the fused norm/activation "
                                  "FP8 casts (LayerNormLinear, LayerNormMLP): they have no cast of the transpose "
                                  "along the tokens; use fp8mix.Linear layers or another recipe")
    if recipe.granularity("input") == _BLOCK:
        return _BLOCK, False, (_BLOCK if in_out else _BLOCK2D)
    return _TENSOR, plan.tn, None


def cast_input(m, x2: torch.Tensor, plan: StepPlan, replay):
    """(xq, x_sinv, x_save, x_save_sinv): the forward GEMM's A and what backward keeps of x
    for wgrad (None: xq itself). The contract every input cast keeps (see input_layout):
    read-only unless plan.record; a replay's scales when replay is given; infinities to NaN;
    stochastic rounding from plan.skips[0] (and [3] for a second cast of x)."""
    recipe = plan.recipe
    in_out = plan.layout == "in_out"
    want_xt = plan.tn  # tn: wgrad's operand from x must be M-contiguous (the C GEMM reads x^T as a view)
    if plan.consts.block:
        xq, _, x_sinv, _ = _current(x2, plan.fmts[_IN], recipe, _BLOCK, plan.group, sr=_sr(plan, _IN))
        sr2 = _sr(plan, 3)  # the second cast of x has its own random words
        if in_out:  # wgrad's A = x^T in 1x128 tiles along M
            x_save, _, x_save_sinv, _ = _current(x2.t(), plan.fmts[_IN], recipe, _BLOCK, plan.group, sr=sr2)
        else:  # wgrad's B = x in 128x128 blocks (its transpose, which holds the same blocks, for tn)
            q2, q2t, x_save_sinv, _ = _current(x2, plan.fmts[_IN], recipe, _BLOCK2D, plan.group, sr=sr2,
                                               transpose=plan.tn)
            x_save = q2t if plan.tn else q2
    elif plan.consts.delayed:
        xq, xqt, x_scales = _delayed(m, x2, _IN, plan, replay, transpose=want_xt)
        plan.x_scales = x_scales
        x_sinv = x_scales[1]
        x_save, x_save_sinv = (xqt, x_sinv) if want_xt else (None, None)
    else:
        xq, xqt, x_sinv, _ = _current(x2, plan.fmts[_IN], recipe, _TENSOR, plan.group, transpose=want_xt,
                                      sr=_sr(plan, _IN))
        x_save, x_save_sinv = (xqt, x_sinv) if want_xt else (None, None)
    return xq, x_sinv, x_save, x_save_sinv


def _weight_key(m, w: torch.Tensor, plan: StepPlan):
    r = plan.recipe
    return (type(r), plan.fmts[_W], r.margin, r.power_2_scale, tuple(w.shape), w.dtype, r.rounding_of("weight"),
            plan.tn)


def cast_weight(m, w: torch.Tensor, plan: StepPlan, replay, is_first_microbatch):
    """FP8 weight, its transpose (tn only, else None) and scale_inv. is_first_microbatch:
    None casts every call; True casts and keeps the result; False reuses what the last True
    call kept (Transformer Engine's gradient-accumulation convention). An FP8 weight
    (fp8mix.nn.fp8_weight: fp8_model_init's, or what FSDP2 all-gathered in FP8) is not
    cast again: its bytes and scale are the operands, whatever is_first_microbatch says."""
    if isinstance(w, FP8WeightBase):
        return w.gemm_operands(plan)
    if replay is not None and replay.w_cached is not None:
        plan.w_cached = replay.w_cached
        return replay.w_cached
    if is_first_microbatch is False:
        key = _weight_key(m, w, plan)
        cached = m._wcache[plan.gemm]
        if cached is None or cached[0] != key:
            raise RuntimeError(f"fp8mix.{type(m).__name__}: is_first_microbatch=False but no FP8 weight was cached "
                               "by an is_first_microbatch=True call under this recipe (cast format, margin, "
                               "rounding and weight shape must match)")
        plan.w_cached = cached[1:]
        plan.fmts[_W] = cached[0][1]
        return plan.w_cached
    recipe = plan.recipe
    w_amax = None
    if plan.consts.delayed:
        wq, wqt, w_scales = _delayed(m, w, _W, plan, replay, transpose=plan.tn)
        plan.w_scales = w_scales
        w_sinv = w_scales[1]
    else:
        wq, wqt, w_sinv, w_amax = _current(w, plan.fmts[_W], recipe, recipe.granularity("weight"), plan.group,
                                           sr=_sr(plan, _W), transpose=plan.tn)
    wqt = wqt if plan.tn else None
    if is_first_microbatch:
        m._wcache[plan.gemm] = (_weight_key(m, w, plan), wq, wqt, w_sinv)
    elif _recasts(m, w, plan):
        plan.w_recast = ("scale", plan.w_scales[0:1]) if plan.consts.delayed else ("amax", w_amax)
    return wq, wqt, w_sinv


def _recasts(m, w: torch.Tensor, plan: StepPlan) -> bool:
    """Whether backward re-casts the weight rather than keeping its FP8 copy from the forward
    to the backward: on the CPU for per-tensor and 128x128-block weight scales (one more cast of W per step,
    a few percent of the step's GEMM time from a few hundred rows up, and no FP8 weight held
    across the step: in a model the weights' FP8 copies are a large part of the peak). A
    module's ``fp8_recast_weight`` (True / False) overrides this default; CUDA keeps the copy
    by default, as Transformer Engine does (a launch costs more than the bytes there)."""
    # (from the instance dict or the class: nn.Module.__getattr__'s miss path raises and
    # catches an AttributeError, a few microseconds per call)
    choice = m.__dict__.get("fp8_recast_weight", getattr(type(m), "fp8_recast_weight", None))
    if choice is None:
        choice = w.is_cpu
    return bool(choice) and plan.consts.w_recastable


def recast_weight(w: torch.Tensor, plan: StepPlan):
    """(wq, wqt): the forward's weight cast again, bit for bit (the same scale, format,
    rounding words and transpose), for a backward that did not keep it (plan.w_recast)."""
    kind, v = plan.w_recast
    recipe, fmt = plan.recipe, fp8_dtype(plan.fmts[_W])
    gran = recipe.granularity("weight")  # per tensor, or 128x128 blocks (one amax per block)
    if kind == "amax":  # current scaling: the scales the forward's cast derived from these amaxes
        v, _ = ops.compute_scale(v.reshape(-1), fmt, margin=recipe.margin, power_2_scale=recipe.power_2_scale,
                                 amax_epsilon=recipe_consts(recipe).eps)
    wq, wqt, _ = ops.cast(w, v, fmt, granularity=gran, transpose=plan.tn, inf_to_nan=True, **_sr(plan, _W))
    return wq, (wqt if plan.tn else None)


def grad_casts(m, dy2: torch.Tensor, plan: StepPlan, g_plan, g_slot, rng, want_db: bool, pending=None, *,
               wgrad_later: bool = False):
    """grad_output casts: (gq for dgrad, g_sinv, wgrad operand from dy, its scale_inv,
    bias gradient in float32 or None, granularity of gq). Block scaling casts dy twice (the
    two GEMMs want blocks along different axes); with ``wgrad_later`` the second cast is
    left to the caller (:func:`block_wgrad_cast`, after dgrad), and the wgrad operand and its
    scale are returned as None, so the two FP8 copies of dy never coexist."""
    recipe, fmt, c = plan.recipe, plan.fmts[_G], plan.consts
    sr = _NO_SR if plan.skips.get(_G) is None else {"rng": rng, "rng_skip": plan.skips[_G]}
    if c.g_block:  # 1x128 tiles along N for dgrad
        gq, _, g_sinv, _ = _current(dy2, fmt, recipe, _BLOCK, plan.group, sr=sr)
        gw, gw_sinv = (None, None) if wgrad_later else block_wgrad_cast(dy2, plan, rng)
        db = dy2.sum(0, dtype=torch.float32) if want_db else None
        return gq, g_sinv, gw, gw_sinv, db, _BLOCK
    if plan.group is not None:  # every rank the same scale, and the same amax left pending
        return _grad_casts_distributed(m, dy2, plan, g_plan, g_slot, sr, want_db, pending)
    fdt, g_plan, pending, g_slot = grad_operands(m, plan, g_plan, g_slot, pending)
    gq, gqt, g_sinv, _, db = ops.grad_cast(
        dy2, fdt, plan=g_plan, pending=pending, slot=g_slot, margin=recipe.margin,
        power_2_scale=recipe.power_2_scale, amax_epsilon=c.eps, transpose=plan.tn, colsum=want_db, **sr)
    return gq, g_sinv, _wgrad_dy(gq, gqt, plan), g_sinv, (db if want_db else None), _TENSOR


_WGRAD_CHUNK_BYTES = 2 << 20  # the high-precision slab block_wgrad_cast copies at a time


def block_wgrad_cast(dy2: torch.Tensor, plan: StepPlan, rng):
    """Block scaling's wgrad operand from dy and its scale_inv: dy^T in 1x128 tiles along M
    (Linear's A), or dy in 128x128 blocks (Conv1D's B; M-contiguous for tn: its transpose's
    view). Its stochastic rounding words have their own offset (skips[4]): the same bits
    whether this cast runs before or after dgrad."""
    recipe, fmt = plan.recipe, plan.fmts[_G]
    skip = plan.skips.get(4)
    sr2 = {} if skip is None else {"rng": rng, "rng_skip": skip}
    if plan.layout == "in_out":
        g2, g2t, gw_sinv, _ = _current(dy2, fmt, recipe, _BLOCK2D, plan.group, sr=sr2, transpose=plan.tn)
        return (g2t.t() if plan.tn else g2), gw_sinv
    n, m = dy2.shape[1], dy2.shape[0]
    step = max(1, _WGRAD_CHUNK_BYTES // max(1, m * dy2.element_size()))
    if plan.group is not None or step >= n or dy2.is_cpu:  # (the CPU op reads the transposed view itself)
        gw, _, gw_sinv, _ = _current(dy2.t(), fmt, recipe, _BLOCK, plan.group, sr=sr2)
        return gw, gw_sinv
    # dy^T is a column-major view: the CUDA cast reads a row-major copy of it. Made whole,
    # that copy is as large as dy and would set the backward's peak; in slabs of rows of
    # dy^T (the tiles run along a row, so no tile is split) it stays small. Element n of the
    # whole gets random word n: a slab starting at row r skips r * m more words.
    gw = torch.empty(n, m, dtype=fp8_dtype(fmt), device=dy2.device)
    gw_sinv = torch.empty(n, (m + 127) // 128, dtype=torch.float32, device=dy2.device)
    for r in range(0, n, step):
        part = dy2[:, r:r + step].t()
        sr = {} if skip is None else {"rng": rng, "rng_skip": skip + r * m}
        q, _, si, _ = _current(part, fmt, recipe, _BLOCK, None, sr=sr)
        gw[r:r + step].copy_(q)
        gw_sinv[r:r + step].copy_(si)
    return gw, gw_sinv


def grad_operands(m, plan: StepPlan, g_plan, g_slot, pending, eager: "bool | None" = None):
    """grad_cast's fp8_dtype, plan, pending and slot arguments for this backward: delayed
    scaling's plan (else None: current scaling), and, for a recording forward's backward,
    this GEMM's pending amax slot (else None)."""
    c = plan.consts
    if pending is not None and plan.record and c.delayed:  # this GEMM's row of the pending amaxes
        own = pending is m._buffers["fp8_grad_pending"]
        pending = grad_state(m, plan.gemm, eager=eager)[0] if own else pending[plan.gemm]
    else:
        pending = None
    return fmt_dtype(plan, _G), (g_plan if c.delayed else None), pending, (g_slot if pending is not None else None)


def _wgrad_dy(gq, gqt, plan: StepPlan):
    """dy as wgrad's operand: A = dy^T (out_in: the C GEMM reads dy's transposed view in
    place; tn: the cast's transpose); B = dy, or for tn the M-contiguous view of dy^T (in_out)."""
    if plan.layout == "out_in":
        return gqt if plan.tn else gq.t()
    return gqt.t() if plan.tn else gq


def _grad_casts_distributed(m, dy2, plan: StepPlan, g_plan, g_slot, sr: dict, want_db: bool, pending):
    """grad_casts from parts, with the amax all-reduced over the ranks: for current
    scaling (and a role's first use) before the cast, for delayed scaling after it, so that
    the pending amax (what the next forward records) is the same on every rank."""
    recipe, fmt = plan.recipe, plan.fmts[_G]
    if not recipe.delayed() or plan.grad_fresh:
        gq, gqt, g_sinv, am = _current(dy2, fmt, recipe, _TENSOR, plan.group, transpose=plan.tn,
                                       sr=sr)
    else:
        gq, gqt, am = ops.cast(dy2, g_plan[0:1], fp8_dtype(fmt), transpose=plan.tn, inf_to_nan=True,
                               **sr)
        all_reduce_max(am, plan.group)
        g_sinv = torch.reciprocal(g_plan[0])
    if plan.record and recipe.delayed() and pending is not None:
        _keep_pending(pending[plan.gemm], am, g_slot)
        m._maybe_fresh[plan.role(_G)] = False
    db = dy2.sum(0, dtype=torch.float32) if want_db else None
    return gq, g_sinv, _wgrad_dy(gq, gqt, plan), g_sinv, db, _TENSOR


def _keep_pending(pending: torch.Tensor, am: torch.Tensor, slot: torch.Tensor) -> None:
    """pending[slot] = max(pending[slot], amax or 0 when not finite): the composed form of
    grad_cast's pending update (distributed path)."""
    v = torch.where(torch.isfinite(am), am, torch.zeros_like(am)).reshape(())
    pending[slot] = torch.maximum(pending[slot], v)
