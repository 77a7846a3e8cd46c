"""The per-call plan of an FP8 GEMM step: what one forward call decided (recipe, formats,
scales, stochastic-rounding offsets, whether it records, which :class:`Path` runs it), kept
for its backward and, under activation checkpointing, for the recompute, which repeats it.

Per-layer overhead (a small layer's step is mostly Python and op dispatch): what a call
asks of its recipe is derived once per recipe object (:class:`RecipeConsts`). The plan is
made by fp8mix.nn._forward.make_plan; the casts it asks for are fp8mix.nn._casts' (the
separate ops) or fp8mix.nn._direct's (one call); fp8mix.nn._function runs the GEMMs.
"""
from __future__ import annotations

import enum
from typing import Any, NamedTuple, Optional

import torch

from .._op_types import DelayedSpec
from ..formats import Format, Granularity, fp8_dtype
from ..recipe import ROLES

__all__ = ["Path", "Operands", "StepPlan", "RecipeConsts", "recipe_consts", "delayed_spec", "grad_state",
           "fmt_dtype", "TN_ON_CPU", "IN", "W", "G"]

IN, W, G = 0, 1, 2  # a GEMM's local roles: input, weight, grad_output
TN_ON_CPU = False  # tests: run the CPU through the tensor-core operand layouts
_TENSOR, _BLOCK, _BLOCK2D = Granularity.TENSOR, Granularity.BLOCK, Granularity.BLOCK2D


class Path(enum.Enum):
    """How one FP8 GEMM call runs: chosen once, by the plan (fp8mix.nn._forward.make_plan).

    FUSED and ONE_OP are eager CPU per-tensor steps (round to nearest, no process group, no
    replay, nothing watching the dispatcher: ``_direct.direct_ok``) run by fp8mix.nn._direct,
    the only caller of the direct entry points; their backward is one direct call too where
    the layout allows (``StepPlan.direct_backward``)."""

    FUSED = "fused"        # a Linear: x's and W's casts and the forward GEMM in one call
    ONE_OP = "one_op"      # x's and W's casts in one call, the GEMM separate (Conv1D, tn, a monitor)
    COMPOSED = "composed"  # the separate ops: any device, recipe, process group, replay, producer casts
    AXIS = "axis"          # along-reduction recipes (rowwise, MX): fp8mix.nn._axis


class Operands(NamedTuple):
    """The FP8 operands a composed or one-op forward hands to FP8LinearFunction (none requires
    grad): the forward GEMM's A and B, what wgrad keeps of x (x_save None: xq itself), the
    weight's transpose for a tensor-core layout (else None), and the buffer backward leaves
    its grad_output amax in (delayed scaling, recording: else None)."""

    xq: torch.Tensor
    x_sinv: torch.Tensor
    x_save: Optional[torch.Tensor]
    x_save_sinv: Optional[torch.Tensor]
    wq: torch.Tensor
    wqt: Optional[torch.Tensor]
    w_sinv: torch.Tensor
    pending: Optional[torch.Tensor]


class StepPlan:
    """What one forward call decided, for its backward (and its checkpoint recompute)."""

    __slots__ = ("recipe", "group", "out_dtype", "fmts", "record", "layout", "tn", "gemm", "x_scales", "w_scales",
                 "w_cached", "w_recast", "g_plan", "g_slot", "grad_fresh", "rng", "skips", "monitor", "name",
                 "auto_use", "module", "region", "replayed_by", "backward_done", "consts", "path", "dtypes", "eager",
                 "wants_grad", "first_microbatch", "__weakref__")

    def __init__(self, recipe, group, out_dtype, fmts, record: bool, layout: str, gemm: int = 0, *,
                 consts: "RecipeConsts | None" = None, dtypes: "tuple | None" = None, eager: bool = True):
        self.recipe = recipe
        self.consts = consts if consts is not None else recipe_consts(recipe)  # derived once per recipe
        self.group = group              # process group amaxes are all-reduced over, or None
        self.out_dtype = out_dtype
        self.fmts = fmts                # Format per role
        if dtypes is None:  # torch dtype per role (None for a role this plan has no format for)
            dtypes = tuple(None if f is None else fp8_dtype(f) for f in fmts)
        self.dtypes = dtypes
        self.eager = eager              # not traced by torch.compile (decided once per forward)
        self.record = record            # a training forward: records amaxes, its backward too
        self.layout = layout            # "out_in" (Linear) or "in_out" (Conv1D)
        self.tn = False                 # operands as FP8 tensor cores read them: every B K-contiguous
        self.gemm = gemm                # which of the module's GEMMs: its state roles are 3*gemm + 0, 1, 2
        self.x_scales = None            # delayed: [scale, scale_inv] the input cast used
        self.w_scales: Any = None       # delayed: ... the weight cast used
        self.w_cached = None            # (wq, w_sinv) reused from is_first_microbatch=True
        self.w_recast: Any = None       # backward re-casts W instead of keeping it: ("scale", s) or ("amax", a)
        self.g_plan = None              # delayed: [grad scale, fresh] for backward
        self.g_slot = None              # delayed, recording: the pending slot backward fills
        self.grad_fresh = False         # Python mirror of g_plan[1] (distributed path only)
        self.rng = None                 # stochastic rounding: [key, offset] at the forward
        self.skips: dict = {}           # role -> offset of its words from rng's offset
        self.monitor = None             # a Monitor sampling this step (eager)
        self.name = ""
        self.auto_use = -1              # Format.AUTO: the grad_output use backward evaluates
        self.module = None              # the module (AUTO votes and observers in backward)
        self.backward_done = False
        self.path = Path.COMPOSED       # how this call runs (chosen once: _forward.make_plan)
        self.wants_grad = False         # a backward will run (grad enabled and x or W requires grad)
        self.first_microbatch = None    # the call's is_first_microbatch (None, True, False)

    @property
    def direct(self) -> bool:
        """Whether this call's forward ran through fp8mix.nn._direct (FUSED or ONE_OP)."""
        return self.path is Path.FUSED or self.path is Path.ONE_OP

    @property
    def direct_backward(self) -> bool:
        """Whether its backward may be one op (ops.linear_backward: a Linear's layout, no
        tensor-core layout); without a graph (create_graph=False), decided at backward."""
        return self.direct and self.layout == "out_in" and not self.tn

    def role(self, local: int) -> int:
        """The module-state index of this GEMM's role `local` (0 input, 1 weight, 2 grad_output)."""
        return 3 * self.gemm + local


def _make_spec(recipe) -> DelayedSpec:
    algo = recipe.amax_compute_algo
    return DelayedSpec(history_len=recipe.amax_history_len, margin=recipe.margin, power_2_scale=recipe.power_2_scale,
                       algo=algo if isinstance(algo, str) else "max", interval=recipe.interval)


class RecipeConsts:
    """What every call asks of a recipe, answered once per recipe object (recipes are
    frozen): a layer's forward and backward read these instead of re-deriving them (a
    DelayedSpec, formats, granularities) on each call."""

    __slots__ = ("delayed", "fmts", "dtypes", "spec", "stochastic", "eps", "block", "g_block", "gemm_grans",
                 "w_block2d", "python_algo", "one_op", "w_recastable")

    def __init__(self, recipe):
        self.delayed = recipe.delayed()
        # Format.AUTO: each layer's own choice (fp8mix.nn.fp8_state._fmt), not the recipe's
        self.fmts = None if recipe.fp8_format is Format.AUTO else tuple(recipe.format(r) for r in ROLES)
        self.dtypes = None if self.fmts is None else tuple(fp8_dtype(f) for f in self.fmts)
        self.spec = _make_spec(recipe) if self.delayed else None
        self.python_algo = self.delayed and callable(recipe.amax_compute_algo)
        self.stochastic = recipe.stochastic()
        self.eps = float(getattr(recipe, "amax_epsilon", 0.0))
        self.block = recipe.granularity("input") == _BLOCK  # x in 1x128 tiles (and 128x128 for wgrad)
        self.g_block = recipe.granularity("grad_output") == _BLOCK
        # the GEMMs' scale granularities (A, B): 1x128 tiles times 128x128 blocks, or one value each
        self.gemm_grans = (_BLOCK, _BLOCK2D) if self.block else (_TENSOR, _TENSOR)
        self.w_block2d = recipe.granularity("weight") == _BLOCK2D
        self.w_recastable = recipe.granularity("weight") in (_TENSOR, _BLOCK2D)  # backward may cast W again
        # whether x's and W's casts can be one op (Path.FUSED / ONE_OP)
        per_tensor = all(recipe.granularity(r) == _TENSOR for r in ROLES) and not recipe.along_reduction()
        self.one_op = per_tensor and not self.python_algo


def recipe_consts(recipe, eager: "bool | None" = None) -> RecipeConsts:
    """The recipe's RecipeConsts, kept on the recipe object after the first eager call
    (under torch.compile, built afresh: the trace runs once). eager: the caller's
    torch.compiler.is_compiling() answer (negated), when it has one."""
    if eager is None:
        eager = not torch.compiler.is_compiling()
    if not eager:
        return RecipeConsts(recipe)
    c = recipe.__dict__.get("_fp8mix_consts")
    if c is None:
        c = RecipeConsts(recipe)
        object.__setattr__(recipe, "_fp8mix_consts", c)  # a cache, not a field: eq, hash, pickle ignore it
    return c


def delayed_spec(recipe) -> DelayedSpec:
    spec = recipe_consts(recipe).spec
    return spec if spec is not None else _make_spec(recipe)


def grad_state(m, gemm: int, eager: "bool | None" = None):
    """(fp8_grad_pending[gemm], fp8_grad_slot[gemm]): views of the module's buffers, made
    once per buffer object in eager mode (an index op less per forward and backward).
    Inference mode and torch.compile index afresh (a view made in inference mode could
    not be written outside it). eager: the caller's torch.compiler.is_compiling() answer
    (negated), when it has one."""
    b = m._buffers
    pend, slot = b["fp8_grad_pending"], b["fp8_grad_slot"]
    if eager is None:
        eager = not torch.compiler.is_compiling()
    if not eager or torch.is_inference_mode_enabled():
        return pend[gemm], slot[gemm]
    c = m.__dict__.get("_fp8_grad_views")
    if c is None or c[0] is not pend or c[1] is not slot:  # first call, or the buffers were replaced (.to())
        with torch.no_grad():
            c = (pend, slot, [(pend[g], slot[g]) for g in range(pend.shape[0])])
        m.__dict__["_fp8_grad_views"] = c
    return c[2][gemm]


def fmt_dtype(plan: StepPlan, role: int) -> torch.dtype:
    """The torch FP8 dtype of this plan's role `role` (0 input, 1 weight, 2 grad_output)."""
    return plan.dtypes[role]
