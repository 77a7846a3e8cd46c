"""The direct path of an FP8 GEMM step (StepPlan.path FUSED / ONE_OP): the only caller of
fp8mix._C's direct entry points, the same C++ functions as torch.ops.fp8mix's linear ops
bound without torch.ops' argument conversion, boxing and autograd fallback (about 10 us
less per call: most of a small layer's step, which makes three).

    FUSED   a Linear: delayed flush + x's and W's casts + the forward GEMM, one call
    ONE_OP  x's and W's casts (and the flush) in one call; the forward GEMM a second one
    backward  grad_cast + dgrad + wgrad in one call (StepPlan.direct_backward), through
              torch.ops when something watches the dispatcher by then

The same kernels in the same order as the separate ops (fp8mix.nn._casts), so the bytes are
theirs (tests/nn/test_one_op_casts.py). Only where nothing needs to see the op:
:func:`direct_ok`. The calls take plain CPU tensors (a subclass raises TypeError).
"""
from __future__ import annotations

import torch

from .. import _C, grad_stats, ops  # type: ignore[attr-defined]
from ..formats import Granularity
from ._casts import _recasts, _weight_key, grad_operands
from ._plan import IN, G, Operands, StepPlan, W, fmt_dtype, grad_state
from .observe import observe_grad

__all__ = ["direct_ok", "forward", "casts", "scaled_mm", "backward"]

_TENSOR = ops.mm_scale_code(Granularity.TENSOR)


def direct_ok() -> bool:
    """Whether the direct calls may run: in eager mode, outside any TorchDispatchMode and
    functorch transform — where nothing needs to see the op. The profiler still records
    them under the op's name."""
    return (not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack()
            and torch._C._functorch.peek_interpreter_stack() is None)


def forward(m, x2: torch.Tensor, w: torch.Tensor, bias, plan: StepPlan, wants_grad: bool, is_first_microbatch):
    """Path.FUSED: the casts and the forward GEMM (y = x W^T + bias) in one call: (y, xq,
    x_sinv, wq, w_sinv), with the plan and the weight cache left as :func:`casts` leaves them."""
    c, g = plan.consts, plan.gemm
    if c.delayed:
        b = m._buffers
        pending, slot = grad_state(m, g, eager=True)
        spec = c.spec
        (y, xq, plan.x_scales, x_sinv, wq, plan.w_scales, w_sinv, plan.g_plan, plan.g_slot,
         w_scale) = _C.linear_delayed_forward(
            x2, w, bias, plan.out_dtype, b["fp8_amax_history"], b["fp8_scale"], b["fp8_steps"], pending, slot, g,
            spec.history_len, fmt_dtype(plan, IN), fmt_dtype(plan, W), fmt_dtype(plan, G), spec.margin,
            spec.power_2_scale, spec.algo, spec.interval, plan.record, plan.record and wants_grad)
        plan.grad_fresh = m._maybe_fresh[3 * g + 2]
        recast = ("scale", w_scale)
    else:
        r = plan.recipe
        y, xq, x_sinv, wq, w_sinv, w_amax = _C.linear_current_forward(
            x2, w, bias, plan.out_dtype, fmt_dtype(plan, IN), fmt_dtype(plan, W), r.margin, r.power_2_scale, c.eps)
        recast = ("amax", w_amax)
    if is_first_microbatch:
        m._wcache[g] = (_weight_key(m, w, plan), wq, None, w_sinv)
    elif _recasts(m, w, plan):
        plan.w_recast = recast
    return y, xq, x_sinv, wq, w_sinv


def casts(m, x2: torch.Tensor, w: torch.Tensor, plan: StepPlan, wants_grad: bool, is_first_microbatch,
          pending) -> Operands:
    """Path.ONE_OP: what _casts.cast_input and cast_weight give (and leave in the plan and the
    weight cache), with delayed scaling's flush of the grad_output role before them, as one
    call. W is cast now (is_first_microbatch is not False)."""
    c, g = plan.consts, plan.gemm
    w_amax = None
    if c.delayed:
        b = m._buffers
        g_pending, slot = grad_state(m, g, eager=True)
        spec = c.spec
        (xq, xqt, plan.x_scales, x_sinv, wq, wqt, plan.w_scales, w_sinv, plan.g_plan,
         plan.g_slot) = _C.linear_delayed_casts(
            x2, w, b["fp8_amax_history"], b["fp8_scale"], b["fp8_steps"], g_pending, slot, g, spec.history_len,
            fmt_dtype(plan, IN), fmt_dtype(plan, W), fmt_dtype(plan, G), spec.margin, spec.power_2_scale,
            spec.algo, spec.interval, plan.record, plan.record and wants_grad, plan.tn, True)
        plan.grad_fresh = m._maybe_fresh[3 * g + 2]
    else:
        r = plan.recipe
        xq, xqt, x_sinv, _, wq, wqt, w_sinv, w_amax = _C.linear_current_casts(
            x2, w, fmt_dtype(plan, IN), fmt_dtype(plan, W), r.margin, r.power_2_scale, c.eps, plan.tn, True)
    x_save, x_save_sinv = (xqt, x_sinv) if plan.tn else (None, None)
    wqt = wqt if plan.tn else None
    if is_first_microbatch:
        m._wcache[g] = (_weight_key(m, w, plan), wq, wqt, w_sinv)
    elif _recasts(m, w, plan):
        plan.w_recast = ("scale", plan.w_scales[0:1]) if c.delayed else ("amax", w_amax)
    return Operands(xq, x_sinv, x_save, x_save_sinv, wq, wqt, w_sinv, pending)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *, bias,
              out_dtype: torch.dtype) -> torch.Tensor:
    """Path.ONE_OP's forward GEMM: ops.scaled_mm with per-tensor scales, called directly."""
    return _C.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, "fp32", 128, _TENSOR, _TENSOR)


def backward(ctx, plan: StepPlan, dy2, x_save, x_sinv, wq, w_sinv, g_plan, g_slot, want_db: bool, eager: bool):
    """A direct forward's backward as one op (grad_cast, dgrad, wgrad: the same calls in the
    same order as the composed backward), for a plan with ``direct_backward`` and no graph:
    the direct call when :func:`direct_ok` still holds, else the same op through torch.ops."""
    fdt, gp, pending, slot = grad_operands(plan.module, plan, g_plan, g_slot, ctx.pending, eager=eager)
    r, c = plan.recipe, plan.consts
    w_scale = w_amax = w_fp8 = None
    direct = direct_ok()
    if plan.w_recast is not None:  # wq is the weight: the op casts it again and frees it before dW
        kind, v = plan.w_recast
        w_scale, w_amax = (v, None) if kind == "scale" else (None, v)
        w_fp8 = fmt_dtype(plan, W)
        if not direct:  # (torch.ops' autograd fallback would see the Parameter; the direct call reads its data)
            wq = wq.detach()
    want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if direct:
        dx, dw, db, gq, g_sinv = _C.linear_backward(
            dy2, wq, w_sinv, x_save, x_sinv, fdt, gp, pending, slot, r.margin, r.power_2_scale, c.eps, want_db,
            want_dx, want_dw, ctx.x_dtype, ctx.w_dtype, w_scale, w_amax, w_fp8)
    else:
        dx, dw, db, gq, g_sinv = ops.linear_backward(
            dy2, wq, w_sinv, x_save, x_sinv, fp8_dtype=fdt, plan=gp, pending=pending, slot=slot, margin=r.margin,
            power_2_scale=r.power_2_scale, amax_epsilon=c.eps, colsum=want_db, want_dx=want_dx, want_dw=want_dw,
            dx_dtype=ctx.x_dtype, dw_dtype=ctx.w_dtype, w_scale=w_scale, w_amax=w_amax, w_fp8_dtype=w_fp8)
    if plan.record and (plan.monitor is not None or plan.auto_use >= 0 or grad_stats.enabled()):
        observe_grad(plan, dy2, gq, g_sinv, Granularity.TENSOR)  # (the checks observe_grad makes, inlined)
    db = db if want_db else None
    if db is not None and ctx.bias_dtype != torch.float32:
        db = db.to(ctx.bias_dtype)
    return (dx if want_dx else None), (dw if want_dw else None), db, None, None
