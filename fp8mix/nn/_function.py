"""The autograd function of an FP8 linear layer: the three scaled GEMMs.

Forward casts happen before apply() (fp8mix.nn._casts); the function runs the forward
GEMM, keeps the FP8 operands backward needs (1 byte per element of x), and in backward
casts dy once (with its transpose and the bias gradient's column sums in the same
op) and runs dgrad and wgrad. A non-finite value in x, W or dy casts to NaN
(``inf_to_nan``), so the outputs and gradients become NaN as a high-precision layer's
would, and any gradient scaler skips the step, with no host check.

Backward writes only the grad_output amax it leaves for the next forward
(``fp8_grad_pending[slot]``, max over backward passes). Under ``create_graph=True``
(double backward, e.g. gradient penalties) it computes dx with differentiable float32
matmuls of the dequantised FP8 operands, straight through the casts, so second-order
gradients through dx (w.r.t. dy and W) are exact for those values. A weight gradient
with a graph would need x in high precision for its second-order terms, which the FP8
layer does not keep: when the backward pass asks for it, an error names fp8mix.
"""
from __future__ import annotations

import torch

from .. import ops
from ..formats import Granularity
from . import _direct
from ._casts import block_wgrad_cast, grad_casts, recast_weight
from ._plan import Operands, Path, StepPlan
from .observe import observe_grad

__all__ = ["FP8LinearFunction", "FusedLinearFunction", "apply_fused"]

def _block_t(s: torch.Tensor, plan: StepPlan) -> torch.Tensor:
    """A 128x128-block weight scale as the other GEMM operand layout needs it."""
    return s.t().contiguous() if plan.consts.w_block2d else s


def _weight_operand(wq, wqt, w_sinv, plan: StepPlan, *, dgrad: bool):
    """The weight as B of the forward GEMM (W^T for a Linear, W for in_out) or of dgrad (W
    for a Linear, W^T for in_out), with its scale in B's [k-block][n-block] layout. The C
    GEMM reads a row-major B; with plan.tn every B is a K-contiguous view (of W or of
    its transpose wqt), as tensor cores need."""
    transposed = dgrad == (plan.layout == "in_out")  # B is W^T (K-contiguous view of W itself)
    if transposed:
        b = wq.t()
    else:
        b = wqt.t() if plan.tn else wq
    return b, (_block_t(w_sinv, plan) if transposed else w_sinv)


class FP8LinearFunction(torch.autograd.Function):
    """y = x W^T + b (W as (N, K)) or x W + b (W as (K, N), layout "in_out"), from operands
    cast before apply() (Path.COMPOSED and ONE_OP)."""

    @staticmethod
    def forward(ctx, x2, weight, bias, fp8: Operands, plan: StepPlan):
        # (the operands as one argument: autograd.Function.apply's cost grows with its count)
        b, sb = _weight_operand(fp8.wq, fp8.wqt, fp8.w_sinv, plan, dgrad=False)
        if plan.path is Path.ONE_OP:
            y = _direct.scaled_mm(fp8.xq, b, fp8.x_sinv, sb, bias=bias, out_dtype=plan.out_dtype)
        else:
            y = ops.scaled_mm(fp8.xq, b, fp8.x_sinv, sb, bias=bias, out_dtype=plan.out_dtype,
                              scale_granularity=plan.consts.gemm_grans)
        _save(ctx, x2, weight, bias, plan, fp8.xq, fp8.x_sinv, fp8.x_save, fp8.x_save_sinv, fp8.wq, fp8.wqt,
              fp8.w_sinv, fp8.pending)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_save, x_sinv, wq, wqt, w_sinv, g_plan, g_slot, rng = ctx.saved_tensors
        plan = ctx.plan
        eager = plan.eager and not torch.compiler.is_compiling()  # (a plan made in eager mode may be
        if eager:                                                 # replayed by a compiled backward)
            plan.backward_done = True  # (checkpoint replay bookkeeping, eager only)
        dy2 = dy if dy.dtype in (torch.float32, torch.bfloat16, torch.float16) else dy.float()
        want_db = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
        if plan.direct_backward and not torch.is_grad_enabled():
            return _direct.backward(ctx, plan, dy2, x_save, x_sinv, wq, w_sinv, g_plan, g_slot, want_db, eager)
        if plan.w_recast is not None:
            with torch.no_grad():
                wq, wqt = recast_weight(wq.detach(), plan)
        gq, g_sinv, gw, gw_sinv, db, gran = grad_casts(plan.module, dy2, plan, g_plan, g_slot, rng, want_db,
                                                       ctx.pending, wgrad_later=True)
        if eager and plan.record:
            observe_grad(plan, dy2, gq, g_sinv, gran)
        if torch.is_grad_enabled():  # create_graph=True
            return _double_backward(ctx, dy2, gq, g_sinv, x_save, x_sinv, wq, w_sinv, gran)
        grans = plan.consts.gemm_grans
        dx = dw = None
        if ctx.needs_input_grad[0]:  # dx = dy W (Linear) or dy W^T (in_out)
            b, sb = _weight_operand(wq, wqt, w_sinv, plan, dgrad=True)
            dx = ops.scaled_mm(gq, b, g_sinv, sb, out_dtype=ctx.x_dtype, scale_granularity=grans)
            b = sb = None
        if plan.w_recast is not None:  # the re-cast weight: freed once dgrad is done
            wq = wqt = None
        if gw is None and ctx.needs_input_grad[1]:  # block scaling: dy's second cast, once dgrad's is freed
            gq = None
            gw, gw_sinv = block_wgrad_cast(dy2, plan, rng)
        if ctx.needs_input_grad[1]:  # dW = dy^T x (Linear) or x^T dy (in_out)
            if plan.layout == "in_out":  # A = x^T (K, M): a cast's transpose or a view of x
                dw = ops.scaled_mm(x_save, gw, x_sinv, gw_sinv, out_dtype=ctx.w_dtype, scale_granularity=grans)
            else:  # B = x (M, K): for tn the M-contiguous view of the saved x^T
                bx = x_save.t() if plan.tn else x_save
                dw = ops.scaled_mm(gw, bx, gw_sinv, x_sinv, out_dtype=ctx.w_dtype, scale_granularity=grans)
        if db is not None and ctx.bias_dtype != torch.float32:
            db = db.to(ctx.bias_dtype)
        return dx, dw, db, None, None


def _save(ctx, x2, weight, bias, plan: StepPlan, xq, x_sinv, x_save, x_save_sinv, wq, wqt, w_sinv, pending):
    """What backward needs: the FP8 x (per-tensor recipes: the forward's xq; in_out: as x^T,
    a view), the weight (its FP8 copy, or the weight itself when backward casts it again),
    the grad_output plan and slot, the stochastic-rounding stream."""
    if x_save is None:
        x_save, x_save_sinv = (xq.t() if plan.layout == "in_out" else xq), x_sinv
    if plan.w_recast is not None:  # backward casts W again: keep the weight, not its FP8 copy
        wq, wqt = weight, None
    ctx.save_for_backward(x_save, x_save_sinv, wq, wqt, w_sinv, plan.g_plan, plan.g_slot, plan.rng)
    ctx.plan = plan
    ctx.pending = pending  # a buffer: backward leaves its amax there (mutated in place)
    ctx.x_dtype = x2.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.w_dtype = weight.dtype
    if plan.eager:
        ctx.weight = weight  # the Parameter itself, for a double backward's graph


class FusedLinearFunction(FP8LinearFunction):
    """Path.FUSED: a Linear whose casts run here, with the forward GEMM, in one direct call
    (fp8mix.nn._direct.forward); the same backward."""

    @staticmethod
    def forward(ctx, x2, weight, bias, plan: StepPlan, pending):  # type: ignore[override]
        y, xq, x_sinv, wq, w_sinv = _direct.forward(plan.module, x2, weight, bias, plan, plan.wants_grad,
                                                    plan.first_microbatch)
        _save(ctx, x2, weight, bias, plan, xq, x_sinv, None, None, wq, None, w_sinv, pending)
        return y


def _c_apply():
    """FusedLinearFunction.apply without torch's Python prologue (functorch's dead-wrapper
    unwrapping, setup_context's argument binding: neither applies to this function outside
    functorch transforms), ~3 us less per call; Path.FUSED holds only where
    _direct.direct_ok(). torch.autograd.Function.apply calls the same C method after that
    prologue."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, FusedLinearFunction)
    except (AttributeError, KeyError, TypeError):  # a torch without it: the public path
        return FusedLinearFunction.apply


apply_fused = _c_apply()


def _engine_wants(t) -> bool:
    """Whether the running backward pass computes a gradient for t (unknown: True)."""
    if t is None:
        return True
    try:
        return bool(torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(t).node))
    except (RuntimeError, AttributeError):
        return True


def _deq(q: torch.Tensor, sinv: torch.Tensor, gran) -> torch.Tensor:
    return ops.dequantize(q, sinv.reshape(ops.scale_shape(q, gran)) if gran == Granularity.TENSOR else sinv,
                          granularity=gran, out_dtype=torch.float32)


def _double_backward(ctx, dy2, gq, g_sinv, x_save, x_sinv, wq, w_sinv, gran):
    """Differentiable backward (create_graph=True) on the dequantised FP8 operands."""
    plan = ctx.plan
    if gran == Granularity.BLOCK:
        raise NotImplementedError("fp8mix: double backward (create_graph=True) through a BlockScaling layer is not "
                                  "supported; use a per-tensor recipe or run that layer outside fp8_autocast")
    dy_live = dy2.float()
    dyd = _deq(gq, g_sinv, gran) + (dy_live - dy_live.detach())  # value: the FP8 dy; d/d(dy) = identity
    wd = _deq(wq, w_sinv, Granularity.TENSOR)
    weight = getattr(ctx, "weight", None)
    if weight is not None:
        w_live = weight.float()
        wd = wd + (w_live - w_live.detach())  # value: the FP8 W; d/dW = identity
    in_out = plan.layout == "in_out"
    dx = dw = db = None
    if ctx.needs_input_grad[0]:  # Linear: dy W; in_out: dy W^T
        dx = (dyd @ (wd.t() if in_out else wd)).to(ctx.x_dtype)
    if ctx.needs_input_grad[1] and _engine_wants(weight):
        raise RuntimeError("fp8mix: create_graph=True with the weight's gradient requested is not supported by an "
                           "FP8 layer: its second-order terms through the input need x in high precision, which the "
                           "layer does not keep. Ask for input gradients only (e.g. torch.autograd.grad(out, x, "
                           "create_graph=True) for gradient penalties), or run this layer outside fp8_autocast")
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        db = dyd.sum(0).to(ctx.bias_dtype)
    return dx, dw, db, None, None
