"""One FP8 linear forward, shared by fp8mix.Linear and fp8mix.nn.Conv1D: decide what kind
of forward this is (training, read-only, a checkpoint's recompute), make the plan,
cast, and call the autograd function.

    training   grad enabled and module.training (or fp8_autocast(calibrating=True)):
               records amaxes, reserves its backward's slot, advances the random stream
    read-only  no_grad / inference_mode / eval(): reads the FP8 state, writes nothing
    replay     a non-reentrant checkpoint's recompute: repeats the original forward's
               plan (fp8mix.nn.recompute), writes nothing
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from .. import ops
from ..context import current_frame, note_module_ran
from ..formats import Granularity, fp8_dtype
from ..recipe import NVFP4BlockScaling
from . import _direct, _plan
from ._axis import axis_forward
from ._casts import all_reduce_max, cast_input, cast_weight, input_layout, python_algo_scale
from ._function import FP8LinearFunction, apply_fused
from ._nvfp4 import nvfp4_forward
from ._plan import Operands, Path, StepPlan, delayed_spec, fmt_dtype, grad_state, recipe_consts
from ._tp import check_group_recipe, is_dtensor
from .fp8_weight import FP8WeightBase, check_recipe
from .layer_order import keeps_high_precision
from .observe import auto_forward, monitor_forward
from .recompute import in_recompute, under_saved_tensor_hooks

__all__ = ["fp8_forward", "frame_for", "needs_own_frame", "make_plan", "reduce_group", "amax_groups", "hp_out_dtype"]

log = logging.getLogger("fp8mix")
_HP = (torch.float32, torch.bfloat16, torch.float16)
_DIST = torch.distributed.is_available()  # (a build property: asked once)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def hp_out_dtype(x: torch.Tensor, module_dtype: torch.dtype) -> torch.dtype:
    dev = "cpu" if x.is_cpu else "cuda" if x.is_cuda else None  # (x.device builds an object per call)
    if dev is not None and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return module_dtype


def reduce_group(group):
    """The process group amaxes are all-reduced over, or None when there is nothing to reduce."""
    if not (_DIST and torch.distributed.is_initialized()):
        return None
    if group is None:
        group = torch.distributed.group.WORLD
    return group if torch.distributed.get_world_size(group) > 1 else None


def amax_groups(group, tp_group):
    """What amaxes are all-reduced over: fp8_autocast's group (data parallel, when the recipe
    reduces) and the module's tensor-parallel group (always: its shards make one tensor).
    One group when the other adds nothing (None, or a group already holding every rank)."""
    tp = reduce_group(tp_group) if tp_group is not None else None
    if tp is None or tp is group:
        return group
    if group is None or torch.distributed.get_world_size(group) == torch.distributed.get_world_size():
        return tp if group is None else group
    return (group, tp)


def needs_own_frame(m, frame) -> bool:
    """Whether module m sees another frame than the autocast's (cheap: asked every forward)."""
    return not m.fp8_enabled or m.fp8_recipe is not None or type(frame.recipe) is NVFP4BlockScaling


def frame_for(m, frame):
    """The autocast frame as this module sees it: its own recipe (m.fp8_recipe), or FP8 off
    (m.fp8_enabled False), as a precision plan decided; else, under NVFP4BlockScaling,
    high precision when the recipe's default rule keeps the model's last layers there
    (keep_last_layers_hp: fp8mix.nn.layer_order)."""
    if not m.fp8_enabled:
        return dataclasses.replace(frame, enabled=False, calibrating=False)
    if m.fp8_recipe is not None:
        return dataclasses.replace(frame, recipe=m.fp8_recipe)
    if type(frame.recipe) is NVFP4BlockScaling and keeps_high_precision(m, frame.recipe):
        note_module_ran()  # (it ran inside the autocast, in high precision by the recipe's rule)
        return dataclasses.replace(frame, enabled=False, calibrating=False)
    return frame


def _check_input(m, x: torch.Tensor, weight: torch.Tensor, in_features: int) -> None:
    name = type(m).__name__
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8mix.{name}: input must be a tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"fp8mix.{name}: input has shape {tuple(x.shape)}, expected (..., {in_features})")
    if x.dtype not in _HP:
        raise TypeError(f"fp8mix.{name}: input must be float32, bfloat16 or float16, got {x.dtype}")
    if is_dtensor(weight) or is_dtensor(x):  # fp8mix.Linear hands its local shards in (fp8mix.nn._tp)
        raise NotImplementedError(f"fp8mix.{name}: a DTensor {'weight' if is_dtensor(weight) else 'input'}; "
                                  "tensor parallelism runs fp8mix.Linear layers only (torch's ColwiseParallel / "
                                  f"RowwiseParallel, or TE's parallel_mode); {name} runs on whole tensors")
    if x.device != weight.device:
        raise ValueError(f"fp8mix.{name}: input is on {x.device}, weight on {weight.device}")
    if not x.is_cpu and not ops.has_kernels("scaled_mm", x.device):
        raise NotImplementedError(f"fp8mix.{name}: this build has no FP8 kernels for {x.device}; "
                                  "run outside fp8_autocast or build fp8mix with CUDA")


def _small_or_empty(m, x: torch.Tensor, in_f: int, out_f: int) -> bool:
    if min(in_f, out_f) < m.fp8_min_features or x.numel() == 0:
        if not getattr(m, "_fallback_logged", False):
            log.debug("fp8mix.%s(%d, %d): running in high precision (%s)", type(m).__name__, in_f, out_f,
                      "empty input" if x.numel() == 0 else f"fewer than {m.fp8_min_features} features")
            m._fallback_logged = True
        return True
    return False


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def _plan_rounding(m, plan: StepPlan, rows: int, in_f: int, out_f: int, weight_cast: bool, wants_grad: bool,
                   grad_if_training: bool) -> None:
    """Stochastic rounding: the random words of this call's casts, from the layer's stream
    (fp8_rng [key, offset]), reserved by the forward for its backward too. A training
    forward advances the stream past them; a read-only one leaves it, but its GEMMs after
    the first start where a training forward's would (after the earlier GEMMs' words), so
    a read-only forward of a multi-GEMM module computes what a training forward does."""
    if not plan.consts.stochastic:
        return
    r = plan.recipe
    # BlockScaling casts x and dy twice; the along-reduction recipes x, W and dy (fp8mix.nn._axis)
    block = r.granularity("input") == Granularity.BLOCK or r.along_reduction()
    sizes = [(0, "input", rows * in_f, True), (3, "input", rows * in_f, block),
             (1, "weight", m.weight.numel(), weight_cast), (2, "grad_output", rows * out_f, wants_grad),
             (4, "grad_output", rows * out_f, wants_grad and block),
             (5, "weight", m.weight.numel(), weight_cast and r.along_reduction())]
    off = 0
    for key, role, n, used in sizes:
        if used and r.rounding_of(role) == "stochastic":
            plan.skips[key] = off
            off += _round4(n)
    if not plan.skips:
        return
    if not plan.record:  # what a training forward of this GEMM would take (its backward's words too)
        if grad_if_training and not wants_grad and r.rounding_of("grad_output") == "stochastic":
            off += _round4(rows * out_f) * (2 if block else 1)
    rng = plan.rng = m.fp8_rng.clone()
    if plan.record:
        with torch.no_grad():
            m.fp8_rng[1:].add_(off)
        return
    # read-only: the words this forward's earlier GEMMs took (Python ints, no host sync)
    before = m.__dict__.get("_fp8_ro_words", 0) if plan.gemm > 0 else 0
    if before:
        rng[1:].add_(before)
    m.__dict__["_fp8_ro_words"] = before + off


def _grad_plan(m, plan: StepPlan, wants_grad: bool) -> None:
    """Delayed scaling: record the grad_output amaxes earlier backwards left (training
    forwards only), and take the scale and slot this call's backward uses."""
    recipe, g = plan.recipe, plan.gemm
    if plan.consts.python_algo and plan.record:
        _flush_python_algo(m, recipe, plan.fmts[2], g)
    b = m._buffers
    pending, slot = grad_state(m, g, eager=plan.eager)
    plan.g_plan, plan.g_slot = ops.delayed_flush(
        b["fp8_amax_history"], b["fp8_scale"], b["fp8_steps"], pending, slot, role=3 * g + 2,
        fp8_dtype=fmt_dtype(plan, 2), spec=plan.consts.spec, record=plan.record,
        reserve=plan.record and wants_grad)
    plan.grad_fresh = m._maybe_fresh[3 * g + 2]


def _flush_python_algo(m, recipe, fmt, g: int) -> None:
    """The flush of a callable amax_compute_algo: each pending amax recorded in ring order
    with the callable's scale rule (eager; host reads of the ring)."""
    spec = delayed_spec(recipe)
    pending, role = m.fp8_grad_pending[g], 3 * g + 2
    slots = pending.numel()
    head = int(m.fp8_grad_slot[g])
    for t in range(slots):
        k = (head + t) % slots
        if float(pending[k]) >= 0:
            before = m.fp8_scale[role:role + 1].clone()
            ops.delayed_record(m.fp8_amax_history, m.fp8_scale, m.fp8_steps, pending[k:k + 1].clone(),
                               role=role, fp8_dtype=fp8_dtype(fmt), spec=spec)
            python_algo_scale(m, role, recipe, fmt, before)
            pending[k] = -1.0


def fp8_forward(m, x: torch.Tensor, weight: torch.Tensor, bias, *, layout: str, in_features: int,
                out_features: int, is_first_microbatch, hp_forward, gemm: int = 0, input_cast=None,
                tp_group=None):
    """GEMM `gemm` of the module under fp8_autocast (hp_forward(x): its high-precision forward).

    input_cast(m, x2, plan, replay) -> (x_autograd, xq, x_sinv, x_save, x_save_sinv) replaces
    the cast of x for modules that produce the GEMM's FP8 input themselves (a norm or an
    activation fused with the cast): x_autograd is the tensor whose gradient receives dx
    (its grad_fn: the fused op's backward), the rest as _casts.cast_input returns, under the
    same contract. tp_group: the tensor-parallel group of a module computing on its shard
    (fp8mix.nn._tp): every amax is all-reduced over it too."""
    eager = not torch.compiler.is_compiling()  # asked once per forward (a Python call each time)
    recompute = eager and in_recompute(eager=True) and torch.is_grad_enabled()
    replay = m._replay[gemm].take() if recompute else None
    frame = current_frame()
    if replay is None and frame is not None and needs_own_frame(m, frame):
        frame = frame_for(m, frame)
    if replay is None:
        if frame is None and recompute and m._nograd_frame is not None:
            frame = m._nograd_frame  # a reentrant recompute outside fp8_autocast: its forward's context
        if frame is None or not (frame.enabled or frame.calibrating):
            return hp_forward(x)
        if not frame.enabled:  # calibrating=True, enabled=False
            return _calibrate(m, x, weight, frame, hp_forward, in_features, out_features, gemm, tp_group)
    _check_input(m, x, weight, in_features)
    note_module_ran()
    if _small_or_empty(m, x, in_features, out_features):
        return hp_forward(x)
    nv = replay.recipe if replay is not None else frame.recipe if frame is not None else None
    if isinstance(nv, NVFP4BlockScaling):
        if tp_group is not None:  # (its per-tensor scale would come from each rank's shard alone)
            raise NotImplementedError(f"fp8mix.{type(m).__name__}: NVFP4BlockScaling under tensor parallelism is "
                                      "not implemented (its tensor scales are not all-reduced over the TP group); "
                                      "use an FP8 recipe")
        keep = (not recompute and eager and torch.is_grad_enabled() and under_saved_tensor_hooks(eager=True))
        return nvfp4_forward(m, x, weight, bias, recipe=nv, layout=layout, in_features=in_features,
                             out_features=out_features, out_dtype=hp_out_dtype(x, weight.dtype),
                             fused_input=input_cast is not None, replays=m._replay[gemm] if keep else None)
    x2 = x if x.dim() == 2 else x.reshape(-1, in_features)
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    # (tensor subclasses — DTensor, wrapper subclasses — dispatch through torch.ops: the
    # direct path calls the ops without the dispatcher)
    direct_ok = (input_cast is None and is_first_microbatch is not False and x2.is_cpu and type(x2) is torch.Tensor
                 and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN))
    plan = make_plan(m, x2, weight, frame, replay, recompute, layout, is_first_microbatch, wants_grad,
                     hp_out_dtype(x, weight.dtype), gemm, direct_ok, eager=eager, tp_group=tp_group)
    path = plan.path
    if path is Path.AXIS:
        if input_cast is not None:
            input_layout(plan)  # raises: the fused producer casts have no along-reduction layout
        _keep_for_recompute(m, plan, gemm, wants_grad, recompute, eager)
        y2 = axis_forward(m, x2, weight, bias, plan, is_first_microbatch, wants_grad)
        return y2 if x2 is x else y2.reshape(*x.shape[:-1], out_features)
    pending = m._buffers["fp8_grad_pending"] if (plan.record and plan.consts.delayed) else None
    if path is Path.FUSED:  # the casts and the forward GEMM in one call, inside the autograd function
        _keep_for_recompute(m, plan, gemm, wants_grad, recompute, eager)
        y2 = apply_fused(x2, weight, bias, plan, pending)
        return y2 if x2 is x else y2.reshape(*x.shape[:-1], out_features)
    if path is Path.ONE_OP:  # one call on detached tensors: nothing to keep out of autograd, no no_grad() needed
        fp8 = _direct.casts(m, x2.detach(), weight.detach(), plan, wants_grad, is_first_microbatch, pending)
    else:
        with torch.no_grad():
            if input_cast is None:
                xq, x_sinv, x_save, x_save_sinv = cast_input(m, x2.detach(), plan, replay)
            else:
                with torch.enable_grad():
                    x2, xq, x_sinv, x_save, x_save_sinv = input_cast(m, x2, plan, replay)
            wq, wqt, w_sinv = cast_weight(m, weight.detach(), plan, replay, is_first_microbatch)
        fp8 = Operands(xq, x_sinv, x_save, x_save_sinv, wq, wqt, w_sinv, pending)
    if plan.monitor is not None:
        with torch.no_grad():
            monitor_forward(m, plan, x2.detach(), fp8.xq, fp8.x_sinv, fp8.wq, fp8.w_sinv,
                            is_first_microbatch is not False)
    _keep_for_recompute(m, plan, gemm, wants_grad, recompute, eager)
    y2 = FP8LinearFunction.apply(x2, weight, bias, fp8, plan)
    return y2 if x2 is x else y2.reshape(*x.shape[:-1], out_features)


def _keep_for_recompute(m, plan: StepPlan, gemm: int, wants_grad: bool, recompute: bool, eager: bool) -> None:
    """A training forward that a checkpoint may recompute: the recompute will repeat this plan."""
    if plan.record and wants_grad and not recompute and eager and under_saved_tensor_hooks(eager=True):
        m._replay[gemm].push(plan)


def make_plan(m, x2, weight, frame, replay, recompute: bool, layout: str, is_first_microbatch, wants_grad: bool,
              out_dtype, gemm: int, direct_ok: bool = False, *, eager: bool, tp_group=None) -> StepPlan:
    """This call's decisions, its Path among them: a replay's, or the recipe's with the
    module's FP8 state (a training forward records; anything else only reads). direct_ok:
    the caller's part of whether the direct path may run it (then the delayed flush runs
    inside the direct call, not here). eager: not traced by torch.compile."""
    weight_cast = is_first_microbatch is not False
    if replay is not None:
        recipe, group, monitor, record = replay.recipe, replay.group, None, False
    else:
        recipe, monitor = frame.recipe, frame.monitor
        group = reduce_group(frame.group) if recipe.reduce_amax else None
        if tp_group is not None:
            group = amax_groups(group, tp_group)
        record = (torch.is_grad_enabled() and m.training) or frame.calibrating
        if group is not None and tp_group is None and record and eager and not recompute:
            check_group_recipe(m, recipe, group, x2.device)  # once per module and recipe
        if not record:
            m._nograd_frame = frame  # for a reentrant checkpoint's recompute of this forward
        elif not recompute and m._nograd_frame is not None:  # (nn.Module.__setattr__ costs a microsecond)
            m._nograd_frame = None
    if isinstance(weight, FP8WeightBase):  # serves one weight rule: any other recipe raises before a cast
        check_recipe(m, weight, recipe)
    consts = recipe_consts(recipe, eager=eager)
    auto_use = -1
    if replay is None and consts.fmts is None and eager and record:  # Format.AUTO
        auto_use = auto_forward(m, x2.detach(), weight.detach(), recipe, monitor, wants_grad, weight_cast, gemm)
    dtypes = None  # (the recipe's, derived once, unless each layer chooses: Format.AUTO)
    if replay is not None:
        fmts = list(replay.fmts)
    elif consts.fmts is not None:
        fmts, dtypes = list(consts.fmts), consts.dtypes
    else:
        fmts = [m._fmt(recipe, 3 * gemm + r) for r in range(3)]
    plan = StepPlan(recipe, group, out_dtype, fmts, record, layout, gemm, consts=consts, dtypes=dtypes, eager=eager)
    plan.module, plan.auto_use = m, auto_use
    plan.wants_grad, plan.first_microbatch = wants_grad, is_first_microbatch
    plan.tn = x2.is_cuda or _plan.TN_ON_CPU
    if recipe.along_reduction():
        plan.path = Path.AXIS
    if replay is not None:
        plan.rng, plan.skips = replay.rng, replay.skips
        plan.g_plan, plan.g_slot, plan.grad_fresh = replay.g_plan, replay.g_slot, replay.grad_fresh
    else:
        _plan_rounding(m, plan, x2.shape[0], x2.shape[1], weight.numel() // x2.shape[1], weight_cast, wants_grad,
                       grad_if_training=x2.requires_grad or weight.requires_grad)
        # Under a TorchDispatchMode (an op counter, FakeTensorMode, a debugger) the separate ops
        # run, as on a GPU: what such a mode observes does not depend on the device. Otherwise
        # the direct path calls the ops without torch.ops' dispatch (_direct.direct_ok).
        if direct_ok and eager and consts.one_op and group is None and not plan.skips and _direct.direct_ok():
            plan.path = Path.ONE_OP
        if consts.delayed:
            m._ensure_history(consts.spec.history_len)
            if not plan.direct:
                _grad_plan(m, plan, wants_grad)
    if monitor is not None and eager and record and monitor.sampling:
        plan.monitor, plan.name = monitor, m._fp8_label()
    if plan.path is Path.ONE_OP and layout == "out_in" and not plan.tn and plan.monitor is None:
        plan.path = Path.FUSED
    return plan


def _calibrate(m, x, weight, frame, hp_forward, in_features: int, out_features: int, gemm: int, tp_group=None):
    """fp8_autocast(enabled=False, calibrating=True): high precision, and a delayed recipe's
    input and weight amaxes recorded (Transformer Engine's calibration)."""
    recipe = frame.recipe
    if recipe.delayed() and x.numel() and min(in_features, out_features) >= m.fp8_min_features:
        _check_input(m, x, weight, in_features)
        note_module_ran()
        spec = delayed_spec(recipe)
        group = amax_groups(reduce_group(frame.group), tp_group)
        with torch.no_grad():
            for role, t in ((3 * gemm, x.reshape(-1, in_features)), (3 * gemm + 1, weight)):
                am = ops.amax(t.detach())
                all_reduce_max(am, group)
                ops.delayed_record(m.fp8_amax_history, m.fp8_scale, m.fp8_steps, am, role=role,
                                   fp8_dtype=fp8_dtype(m._fmt(recipe, role)), spec=spec)
                m._maybe_fresh[role] = False
    return hp_forward(x)
