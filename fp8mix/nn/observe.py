"""Eager-only observers of an FP8 layer's casts: the gradient scalers' feedback counts
(fp8mix.grad_stats), a sampling fp8mix.Monitor, and Format.AUTO's evaluations and votes.

They run only for training forwards and their backward passes (never for evaluation or
a checkpoint's recompute), and never under torch.compile. Nothing here reads a tensor
on the host except Format.AUTO (eager by design) and the Monitor on its sampled steps.
"""
from __future__ import annotations

import logging

import torch

from .. import auto_format, grad_stats, ops
from ..formats import Granularity, fp8_dtype
from ..recipe import ROLES
from ._plan import delayed_spec

__all__ = ["observe_grad", "monitor_forward", "auto_forward"]

log = logging.getLogger("fp8mix")
_IN, _W, _G = 0, 1, 2


def observe_grad(plan, dy2: torch.Tensor, gq: torch.Tensor, g_sinv: torch.Tensor, gran) -> None:
    """Backward's grad_output cast, seen by the scalers, the monitor and Format.AUTO."""
    if grad_stats.enabled():
        grad_stats.add(ops.quant_stats(dy2, gq, g_sinv, gran))
    if plan.monitor is not None:
        plan.monitor.record(plan.name, "grad_output", dy2, gq, g_sinv, Granularity.of(gran).label, fmt=plan.fmts[_G],
                            scale=None, amax=None)
    if plan.auto_use >= 0:
        r = plan.recipe
        choice = auto_format.evaluate(dy2, gran, r.margin, r.power_2_scale, r.auto.range_tolerance)
        vote(plan.module, plan.role(_G), plan.auto_use, choice, r, plan.monitor)


def monitor_forward(m, plan, x2, xq, x_sinv, wq, w_sinv, weight_cast: bool) -> None:
    r = plan.recipe
    plan.monitor.record(plan.name, "input", x2, xq, x_sinv, r.granularity("input").label, fmt=plan.fmts[_IN],
                        scale=None, amax=None)
    if weight_cast:
        plan.monitor.record(plan.name, "weight", m.weight.detach(), wq, w_sinv, r.granularity("weight").label,
                            fmt=plan.fmts[_W], scale=None, amax=None)


def vote(m, role: int, use: int, choice, recipe, monitor) -> None:
    """Fold one evaluation into role's Format.AUTO state; on a switch, log, tell the
    monitor and rescale a delayed role's scale from its history for the new format."""
    fmt, reason = choice
    role_name = m.fp8_role_name(role)
    m._auto_reasons[role_name] = reason
    if not auto_format.vote(m._auto_state[role], use, fmt, recipe.auto):
        return
    name = m._fp8_label()
    log.info("fp8mix %s: %s now %s (%s)", name, role_name, fmt.name, reason)
    if monitor is not None:
        monitor.note(name, role_name, "format", f"{fmt.name} ({reason})")
    if recipe.delayed() and int(m.fp8_steps[role]) > 0:
        with torch.no_grad():  # the history is in units of x: the new format's max gives another scale
            ops.delayed_rescale(m.fp8_amax_history, m.fp8_scale, m.fp8_steps, role=role, fp8_dtype=fp8_dtype(fmt),
                                spec=delayed_spec(recipe))
    if role % 3 == _W:
        m._wcache[role // 3] = None


def auto_forward(m, x2: torch.Tensor, w: torch.Tensor, recipe, monitor, wants_grad: bool, weight_cast: bool,
                 gemm: int = 0) -> int:
    """Format.AUTO bookkeeping of one training forward: evaluate input/weight when due, and
    return the use index of grad_output its backward should evaluate (or -1)."""
    for local, t, counted in ((_IN, x2, True), (_W, w, weight_cast)):
        if not counted:
            continue
        st = m._auto_state[3 * gemm + local]
        evaluate = auto_format.due(st, recipe.auto)
        use = auto_format.tick(st)
        if evaluate:
            gran = recipe.granularity(ROLES[local])
            vote(m, 3 * gemm + local, use, auto_format.evaluate(t, gran, recipe.margin, recipe.power_2_scale,
                                                                recipe.auto.range_tolerance), recipe, monitor)
    if not wants_grad:
        return -1
    st = m._auto_state[3 * gemm + _G]
    evaluate = auto_format.due(st, recipe.auto)
    use = auto_format.tick(st)
    return use if evaluate else -1
