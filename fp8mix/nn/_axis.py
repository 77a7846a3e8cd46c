"""FP8 linear layers under recipes that quantise along each GEMM's reduction dimension
(fp8mix.recipe.RowwiseScaling, MXFP8BlockScaling; ``recipe.along_reduction()``).

Every operand of every GEMM is cast with its scales running along that GEMM's reduction
dimension K: A as (M, K), B as its transpose (N, K), so the scales factor out of the sums
(per row: the C GEMM's OUTER scales; per 1x32 block: its MX scales). A tensor read by two
GEMMs along different dimensions is cast twice (for MX the second cast reads x itself and
writes the transposed quantisation, ops.quantize_mx(transpose=True)):

    forward  y[M,N]  = x[M,K] . W^T    x along K, W (N, K) along K
    dgrad    dx[M,K] = dy[M,N] . W     dy along N, W^T (K, N) along N
    wgrad    dW[N,K] = dy^T . x        dy^T (N, M) along M, x^T (K, M) along M

(a Conv1D's (K, N) weight is used as its (N, K) transpose view, and its wgrad is the
transposed product). The forward casts x, x^T, W and W^T (what backward needs, 1 byte
per element); backward casts dy and dy^T. With ``recipe.hp_wgrad()`` (torchao's
rowwise_with_gw_hp) the weight gradient is a high-precision matmul of the saved input
and dy, and dgrad reads a per-tensor FP8 copy of W.

Stochastic rounding keys (plan.skips): 0 x, 3 x^T, 1 W, 5 W^T, 2 dy, 4 dy^T.
"""
from __future__ import annotations

import torch

from .. import ops
from ..formats import Format, Granularity, fp8_dtype
from ._casts import _sr
from ._plan import StepPlan

__all__ = ["axis_forward"]

_IN, _W, _G = 0, 1, 2
_XT, _GT, _WT = 3, 4, 5  # skip keys of the second casts


_MX_RULE = {"rceil": 0, "floor": 1}


def _kcast(t2: torch.Tensor, fmt: Format, recipe, gran: Granularity, sr: dict, *, transposed: bool = False):
    """Current-scaling cast of t2 (rows, K), or of its transpose when `transposed`, with the
    scales along the last dimension of what is cast: (q, scale_inv)."""
    eps = float(recipe.amax_epsilon)
    if gran == Granularity.MX:
        rule = _MX_RULE[recipe.scale_rule]
        q, sinv, qt, st, _ = ops.quantize_mx(t2, fp8_dtype(fmt), rule=rule, margin=recipe.margin, amax_epsilon=eps,
                                             want_q=not transposed, transpose=transposed, inf_to_nan=True, **sr)
        return (qt, st) if transposed else (q, sinv)
    src = t2.t() if transposed else t2
    q, _, sinv, _ = ops.quantize_current(src, fp8_dtype(fmt), granularity=gran, margin=recipe.margin,
                                         power_2_scale=recipe.power_2_scale, amax_epsilon=eps, inf_to_nan=True, **sr)
    return q, sinv


def _mm(a, sa, b_rows, sb, gran: Granularity, out_dtype, bias=None, b_gran=None) -> torch.Tensor:
    """a (M, K) @ B with B given as b_rows (N, K), each scaled along K with `gran` (B: `b_gran`
    when given; TENSOR: one scale)."""
    def kind(s, g, is_a: bool):
        if g == Granularity.TENSOR:
            return Granularity.TENSOR, s.reshape(())
        if g == Granularity.MX:  # (rows, ceil(K/32)) on both sides
            return Granularity.MX, s.reshape(-1, s.shape[-1])
        return Granularity.ROW, (s.reshape(-1, 1) if is_a else s.reshape(1, -1))

    ka, sa = kind(sa, gran, True)
    kb, sb = kind(sb, gran if b_gran is None else b_gran, False)
    return ops.scaled_mm(a, b_rows.t(), sa, sb, bias=bias, out_dtype=out_dtype, scale_granularity=(ka, kb))


def _weight_casts(m, w_oi: torch.Tensor, plan: StepPlan, is_first_microbatch, want_dgrad: bool):
    """(wq, w_sinv) for the forward and (wtq, wt_sinv) for dgrad (None when not wanted):
    W (N, K) along K and W^T (K, N) along N (per tensor under hp_wgrad, as torchao)."""
    recipe, fmt = plan.recipe, plan.fmts[_W]
    key = ("axis", type(recipe), fmt, recipe.margin, recipe.power_2_scale, recipe.hp_wgrad(),
           getattr(recipe, "scale_rule", None), tuple(w_oi.shape),
           w_oi.dtype, recipe.rounding_of("weight"))
    if is_first_microbatch is False:
        cached = m._wcache[plan.gemm]
        if cached is None or cached[0] != key:
            raise RuntimeError(f"fp8mix.{type(m).__name__}: is_first_microbatch=False but no FP8 weight was cached "
                               "by an is_first_microbatch=True call under this recipe (cast format, margin, "
                               "rounding and weight shape must match)")
        return cached[1:]
    gran = recipe.granularity("weight")
    wq, w_sinv = _kcast(w_oi, fmt, recipe, gran, _sr(plan, _W))
    wt = None
    if want_dgrad or is_first_microbatch:
        dgran = Granularity.TENSOR if recipe.hp_wgrad() else gran
        wt = _kcast(w_oi, fmt, recipe, dgran, _sr(plan, _WT), transposed=True)
    if is_first_microbatch:
        m._wcache[plan.gemm] = (key, (wq, w_sinv), wt)
    return (wq, w_sinv), wt


def axis_forward(m, x2: torch.Tensor, weight: torch.Tensor, bias, plan: StepPlan, is_first_microbatch,
                 wants_grad: bool):
    """The layer's output y2 (M, N) under an along-reduction recipe (x2 (M, K) as given)."""
    recipe = plan.recipe
    in_out = plan.layout == "in_out"
    w_oi = weight.detach().t() if in_out else weight.detach()
    gran = recipe.granularity("input")
    want_dx = wants_grad and x2.requires_grad
    want_dw = wants_grad and weight.requires_grad
    with torch.no_grad():
        xd = x2.detach()
        xq, x_sinv = _kcast(xd, plan.fmts[_IN], recipe, gran, _sr(plan, _IN))
        (wq, w_sinv), wt = _weight_casts(m, w_oi, plan, is_first_microbatch, want_dx)
        if plan.monitor is not None and not in_out:  # (a Conv1D's W is cast as its transpose)
            from .observe import monitor_forward
            monitor_forward(m, plan, xd, xq, x_sinv, wq, w_sinv,
                            is_first_microbatch is not False)
        x_save = None
        if want_dw:
            x_save = xd if recipe.hp_wgrad() else _kcast(xd, plan.fmts[_IN], recipe, gran, _sr(plan, _XT),
                                                         transposed=True)
    wtq, wt_sinv = wt if (want_dx and wt is not None) else (None, None)
    xs_q, xs_sinv = (x_save, None) if (x_save is None or recipe.hp_wgrad()) else x_save
    return AxisLinearFunction.apply(x2, weight, bias, xq, x_sinv, wq, w_sinv, wtq, wt_sinv, xs_q, xs_sinv, plan.rng,
                                    plan)


class AxisLinearFunction(torch.autograd.Function):
    """y = x W^T + b (or x W + b for a Conv1D) from operands cast along each GEMM's K."""

    @staticmethod
    def forward(ctx, x2, weight, bias, xq, x_sinv, wq, w_sinv, wtq, wt_sinv, xs_q, xs_sinv, rng, plan: StepPlan):
        gran = plan.recipe.granularity("input")
        y = _mm(xq, x_sinv, wq, w_sinv, gran, plan.out_dtype, bias=bias)
        ctx.save_for_backward(wtq, wt_sinv, xs_q, xs_sinv, rng)
        ctx.plan = plan
        ctx.x_dtype, ctx.w_dtype = x2.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        wtq, wt_sinv, xs_q, xs_sinv, rng = ctx.saved_tensors
        plan = ctx.plan
        if torch.is_grad_enabled():
            raise NotImplementedError(f"fp8mix: double backward (create_graph=True) through a "
                                      f"{type(plan.recipe).__name__} layer is not supported; use a per-tensor "
                                      "recipe or run that layer outside fp8_autocast")
        if not torch.compiler.is_compiling():
            plan.backward_done = True
        recipe, fmt = plan.recipe, plan.fmts[_G]
        gran = recipe.granularity("grad_output")
        dy2 = dy if dy.dtype in (torch.float32, torch.bfloat16, torch.float16) else dy.float()
        sr = {} if plan.skips.get(_G) is None else {"rng": rng, "rng_skip": plan.skips[_G]}
        sr_t = {} if plan.skips.get(_GT) is None else {"rng": rng, "rng_skip": plan.skips[_GT]}
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            gq, g_sinv = _kcast(dy2, fmt, recipe, gran, sr)
            dgran = Granularity.TENSOR if recipe.hp_wgrad() else gran
            dx = _mm(gq, g_sinv, wtq, wt_sinv, gran, ctx.x_dtype, b_gran=dgran)
        if ctx.needs_input_grad[1]:
            dw = _wgrad(dy2, xs_q, xs_sinv, plan, fmt, gran, ctx.w_dtype, sr_t)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None, None, None, None, None, None


def _wgrad(dy2, xs_q, xs_sinv, plan: StepPlan, fmt: Format, gran: Granularity, w_dtype, sr: dict) -> torch.Tensor:
    """dW as the weight's layout wants it: dy^T x (N, K), or x^T dy (K, N) for a Conv1D."""
    in_out = plan.layout == "in_out"
    if plan.recipe.hp_wgrad():  # xs_q is the saved high-precision input
        dyf, xf = dy2.float(), xs_q.float()
        dw = xf.t() @ dyf if in_out else dyf.t() @ xf
        return dw.to(w_dtype)
    gtq, gt_sinv = _kcast(dy2, fmt, plan.recipe, gran, sr, transposed=True)  # dy^T (N, M) along M
    if in_out:
        return _mm(xs_q, xs_sinv, gtq, gt_sinv, gran, w_dtype)
    return _mm(gtq, gt_sinv, xs_q, xs_sinv, gran, w_dtype)
