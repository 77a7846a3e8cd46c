"""fp8mix.Linear: a drop-in nn.Linear whose three GEMMs run in FP8 under fp8_autocast.

    forward  y[M,N]  = x[M,K]  . W[N,K]^T     E4M3 x E4M3 (HYBRID)
    dgrad    dx[M,K] = dy[M,N] . W[N,K]       E5M2 x E4M3
    wgrad    dW[N,K] = dy^T[N,M] . x[M,K]     E5M2 x E4M3

Outside fp8_autocast it is nn.Linear, bit for bit. Inside, x and W are cast to FP8
(one fused pass each, amax included), the FP8 x (1 byte/element) is what backward
keeps, and dy is cast once into both dy and dy^T (cast+transpose). Master weights,
bias, gradients and outputs stay in high precision.

Delayed-scaling state lives in buffers, so it is in state_dict():
    fp8_amax_history  (L, 3) float32   newest first; columns input, weight, grad_output
    fp8_scale         (3,)   float32   the scale the next cast of each role uses
    fp8_steps         (3,)   int64     amaxes recorded per role
    fp8_rng           (2,)   int64     stochastic rounding: Philox key, next offset
    fp8_auto          (3, 5) int64     Format.AUTO's state per role (fp8mix.auto_format)
(The last two are optional when loading: a checkpoint without them starts them fresh.)
When the history rolls — once per use of a role:
  * input: every forward call records its input's amax;
  * weight: every forward that casts it; with ``is_first_microbatch=False`` the FP8
    weight cast by the last ``is_first_microbatch=True`` call is reused and nothing is
    recorded (Transformer Engine's convention for gradient accumulation);
  * grad_output: each backward leaves its amax in the pending slot of its forward call
    and the next forward (or state_dict()) records the pending slots in call order.
Why per use and not per optimizer step: a use is the one event every layer sees without
help from the optimizer, the update is a fixed sequence of tensor ops (no host sync),
and keeping backward free of state changes is what lets torch.compile trace it.
Why the weight cache is explicit: a parameter's version counter misses writes through
``.data`` and FSDP2's all-gather copies, so automatic detection could serve a stale FP8
weight (and, under FSDP2, make ranks disagree on collectives).
A checkpoint of a plain nn.Linear loads with strict=True; the FP8 state starts fresh.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import auto_format, grad_stats, ops
from .autocast import current_frame
from .formats import GRANULARITIES, Format, fp8_dtype
from .recipe import BlockScaling, CurrentScaling, DelayedScaling, role_format

__all__ = ["Linear"]

log = logging.getLogger("fp8mix")

_INPUT, _WEIGHT, _GRAD = 0, 1, 2
_ROLE_NAMES = ("input", "weight", "grad_output")
_TENSOR = GRANULARITIES["tensor"]
_BLOCK = GRANULARITIES["block"]
_BLOCK2D = GRANULARITIES["block2d"]
_FP8_KEYS = ("fp8_amax_history", "fp8_scale", "fp8_steps")
_OPT_KEYS = ("fp8_rng", "fp8_auto")  # newer state: a checkpoint may lack them
_GRAN_NAMES = {v: k for k, v in GRANULARITIES.items()}
_NO_SR = (False, 0, 0)
# The history is allocated at DelayedScaling's default length up front, so that a fresh
# model's state_dict has the shapes of a trained one (torch.distributed.checkpoint loads
# in place and needs them); another recipe length is adopted at the first forward.
_DEFAULT_HISTORY = DelayedScaling().amax_history_len


def _auto_initial() -> list:
    """Format.AUTO's starting state per role: HYBRID's assignment, nothing counted."""
    return [auto_format.initial_state(role_format(Format.HYBRID, r)) for r in _ROLE_NAMES]


def _hp_out_dtype(x: torch.Tensor, module_dtype: torch.dtype) -> torch.dtype:
    dev = x.device.type
    if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return module_dtype


def _reduce_group(group):
    """The process group amaxes are all-reduced over, or None when there is nothing to reduce."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    if group is None:
        group = torch.distributed.group.WORLD
    return group if torch.distributed.get_world_size(group) > 1 else None


def _all_reduce_max(t: torch.Tensor, group) -> None:
    if group is not None:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)


def _algo_result(v, device) -> torch.Tensor:
    """A callable amax_compute_algo's result as a 0-d float32 tensor, or a clear error."""
    try:
        t = torch.as_tensor(v, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError("DelayedScaling.amax_compute_algo must return one number (a float or a 1-element "
                        f"tensor), got {type(v).__name__}") from None
    if t.numel() != 1:
        raise ValueError("DelayedScaling.amax_compute_algo must return one number, got a tensor of shape "
                         f"{tuple(t.shape)}")
    return t.reshape(())


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class _Plan:
    """What one forward call decided, kept for its backward (which uses the same recipe,
    formats, random stream and observers)."""

    __slots__ = ("recipe", "group", "out_dtype", "fmts", "grad_fresh", "sr", "monitor", "name", "auto_use",
                 "auto_choice")

    def __init__(self, recipe, group, out_dtype, fmts):
        self.recipe = recipe
        self.group = group
        self.out_dtype = out_dtype
        self.fmts = fmts
        self.grad_fresh = False  # delayed: no grad_output amax recorded yet
        self.sr = [_NO_SR, _NO_SR, _NO_SR, _NO_SR]  # per role; [3]: the second grad cast (BlockScaling)
        self.monitor = None  # a Monitor sampling this step
        self.name = ""
        self.auto_use = -1  # Format.AUTO: index of the grad_output use backward evaluates
        self.auto_choice = None  # ... and backward's (Format, reason)


def _current(x2, fmt, recipe, granularity, group, transpose=False, sr=_NO_SR):
    """Current scaling of a 2-D tensor: (q, qt, scale_inv, amax). With a process group
    the amaxes are all-reduced first so that every rank uses the same scales.
    sr: (stochastic, seed, offset) of the cast."""
    margin, pow2 = recipe.margin, recipe.power_2_scale
    eps = float(getattr(recipe, "amax_epsilon", 0.0))
    if group is None:
        return ops.quantize_current(x2, fp8_dtype(fmt), granularity, margin, pow2, eps, True, *sr, True, transpose)
    am = ops.amax(x2, granularity)
    _all_reduce_max(am, group)
    scale, sinv = ops.compute_scale(am, fp8_dtype(fmt), margin, pow2, eps)
    q, qt, _ = ops.cast(x2, scale, fp8_dtype(fmt), granularity, True, *sr, True, transpose)
    return q, qt, sinv, am


def _cast_grad(dy2: torch.Tensor, plan: _Plan, g_scale: torch.Tensor):
    """grad_output casts for dgrad (dy) and wgrad (dy^T): (gq, g_sinv, gtq, gt_sinv,
    amax to record (delayed scaling) or None, amax of dy (per tile for blocks), granularity of gq)."""
    recipe, fmt, sr = plan.recipe, plan.fmts[_GRAD], plan.sr[_GRAD]
    if isinstance(recipe, BlockScaling):  # 1x128 tiles along N for dgrad, along M for wgrad
        gq, _, g_sinv, am = _current(dy2, fmt, recipe, _BLOCK, plan.group, sr=sr)
        gtq, _, gt_sinv, _ = _current(dy2.t(), fmt, recipe, _BLOCK, plan.group, sr=plan.sr[3])
        return gq, g_sinv, gtq, gt_sinv, None, am, _BLOCK
    if isinstance(recipe, CurrentScaling) or plan.grad_fresh:
        gq, gtq, g_sinv, am = _current(dy2, fmt, recipe, _TENSOR, plan.group, transpose=True, sr=sr)
        return gq, g_sinv, gtq, g_sinv, am if plan.grad_fresh else None, am, _TENSOR
    gq, gtq, am = ops.cast(dy2, g_scale, fp8_dtype(fmt), _TENSOR, True, *sr, True, True)
    g_sinv = torch.reciprocal(g_scale)
    return gq, g_sinv, gtq, g_sinv, am, am, _TENSOR


def _observe_grad(dy2, gq, g_sinv, gran: int, plan: _Plan) -> None:
    """Eager-only observers of the grad_output cast: the gradient scaler's feedback
    counts, a sampling monitor, and Format.AUTO's evaluation of this use."""
    if grad_stats.enabled():
        grad_stats.add(ops.quant_stats(dy2, gq, g_sinv, gran))
    if plan.monitor is not None:
        plan.monitor.record(plan.name, "grad_output", dy2, gq, g_sinv, _GRAN_NAMES[gran], fmt=plan.fmts[_GRAD],
                            scale=None, amax=None)
    if plan.auto_use >= 0:
        r = plan.recipe
        plan.auto_choice = auto_format.evaluate(dy2, gran, r.margin, r.power_2_scale, r.auto.range_tolerance)


class _FP8LinearFn(torch.autograd.Function):
    """The three GEMMs. Forward casts happen before apply() (in Linear.forward), and
    backward changes no state: it hands the grad_output amax back as the "gradient" of
    `grad_amax_slot`, a leaf the layer reads at its next forward."""

    @staticmethod
    def forward(ctx, x, weight, bias, xq, x_sinv, x_save, x_save_sinv, wq, w_sinv, g_scale, grad_amax_slot,
                plan: _Plan):
        w_sinv_fwd = w_sinv.t().contiguous() if isinstance(plan.recipe, BlockScaling) else w_sinv
        b = None
        if bias is not None:
            b = bias if bias.dtype in (torch.float32, plan.out_dtype) else bias.float()
        y = ops.scaled_mm(xq, wq.t(), x_sinv, w_sinv_fwd, b, plan.out_dtype, "fp32", 128)
        if x_save is None:  # per-tensor recipes keep the forward's FP8 x itself
            x_save, x_save_sinv = xq, x_sinv
        ctx.save_for_backward(x_save, x_save_sinv, wq, w_sinv, g_scale)
        ctx.plan = plan
        ctx.x_dtype = x.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.w_dtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x_save, x_sinv, wq, w_sinv, g_scale = ctx.saved_tensors
        plan = ctx.plan
        dy2 = dy
        if dy2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            dy2 = dy2.float()
        gq, g_sinv, gtq, gt_sinv, am, am_dy, gran = _cast_grad(dy2, plan, g_scale)
        if not _compiling():
            _observe_grad(dy2, gq, g_sinv, gran, plan)
        # The saturating cast turns an inf in dy into the format's max, which would hand
        # the optimizer finite, wrong gradients that no inf check (GradScaler) can see:
        # make dx and dW NaN instead, as a high-precision layer's would be.
        dy_ok = torch.isfinite(am_dy).all()
        dx = dw = db = d_slot = None
        if ctx.needs_input_grad[0]:
            dx = ops.scaled_mm(gq, wq, g_sinv, w_sinv, None, ctx.x_dtype, "fp32", 128)
            dx = torch.where(dy_ok, dx, float("nan"))
        if ctx.needs_input_grad[1]:
            dw = ops.scaled_mm(gtq, x_save, gt_sinv, x_sinv, None, ctx.w_dtype, "fp32", 128)
            dw = torch.where(dy_ok, dw, float("nan"))
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        if am is not None and ctx.needs_input_grad[10]:
            d_slot = am.reshape(())
        return dx, dw, db, None, None, None, None, None, None, None, d_slot, None


class Linear(nn.Linear):
    """Drop-in replacement for :class:`torch.nn.Linear` with FP8 GEMMs under
    :func:`fp8mix.fp8_autocast`.

    Same signature, parameters, initialisation and state_dict keys as nn.Linear (plus
    the FP8 state buffers, optional when loading). Layers with fewer than
    ``fp8_min_features`` input or output features run in high precision even inside
    fp8_autocast (FP8 costs more than it saves there); a debug log line says so.
    """

    fp8_min_features = 16

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup_fp8(self.weight.device)

    @classmethod
    def from_linear(cls, lin: nn.Linear, history_len: int = _DEFAULT_HISTORY) -> "Linear":
        """An fp8mix.Linear sharing `lin`'s weight and bias Parameters (no copy) and hooks."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight = lin.weight
        if lin.bias is None:
            new.register_parameter("bias", None)
        else:
            new.bias = lin.bias
        new._setup_fp8(lin.weight.device, history_len)
        new.train(lin.training)
        new._forward_hooks.update(lin._forward_hooks)
        new._forward_pre_hooks.update(lin._forward_pre_hooks)
        return new

    # ---- state -------------------------------------------------------------------
    def _setup_fp8(self, device, history_len: int = _DEFAULT_HISTORY):
        self.register_buffer("fp8_amax_history", torch.zeros(history_len, 3, dtype=torch.float32, device=device))
        self.register_buffer("fp8_scale", torch.ones(3, dtype=torch.float32, device=device))
        self.register_buffer("fp8_steps", torch.zeros(3, dtype=torch.int64, device=device))
        self.register_buffer("fp8_rng", torch.zeros(2, dtype=torch.int64, device=device))
        self.register_buffer("fp8_auto", torch.tensor(_auto_initial(), dtype=torch.int64, device=device))
        # Python mirrors of fp8_rng and fp8_auto: read and changed every call without a
        # host sync; written into the buffers by state_dict(), read back by loading.
        self._sr_key, self._sr_offset = 0, 0
        self._auto_state = _auto_initial()
        self._auto_plans = []  # plans whose backward evaluates grad_output for Format.AUTO
        self._auto_reasons = {}
        self._wcache = None
        self._fallback_logged = False
        self._fp8_absent = []
        self._fp8_fresh = [True, True, True]  # mirrors fp8_steps == 0 without reading the tensor
        self._last_delayed = None  # (recipe, group) of the last delayed-scaling forward
        self._last_recipe = None  # the recipe of the last FP8 forward (Format.AUTO folds)
        self._new_grad_slots(device)
        self.register_load_state_dict_post_hook(_forgive_missing_fp8_state)
        self._register_state_dict_hook(_flush_before_save)

    _N_GRAD_SLOTS = 8

    def _new_grad_slots(self, device):
        # Not buffers: they must stay leaves so autograd fills their .grad. Each forward
        # that will see a backward takes a free slot, so every backward's amax is kept
        # apart until the next forward records them in call order.
        self._grad_slots = [torch.zeros((), dtype=torch.float32, device=device, requires_grad=True)
                            for _ in range(self._N_GRAD_SLOTS)]
        self._no_slot = torch.zeros((), dtype=torch.float32, device=device)
        self._slots_pending = []  # slot indices whose backward has not been recorded, in call order

    def _take_slot(self) -> torch.Tensor:
        free = [i for i in range(self._N_GRAD_SLOTS) if i not in self._slots_pending]
        if not free:  # every slot's backward is outstanding: assume they were abandoned
            for slot in self._grad_slots:
                slot.grad = None
            self._slots_pending = []
            free = [0]
        self._slots_pending.append(free[0])
        return self._grad_slots[free[0]]

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._new_grad_slots(self.fp8_scale.device)
        self._wcache = None
        return out

    def reset_fp8_state(self) -> None:
        """Forget amax histories, scales and the cached FP8 weight."""
        with torch.no_grad():
            self.fp8_amax_history.zero_()
            self.fp8_scale.fill_(1.0)
            self.fp8_steps.zero_()
        self._reset_optional_state()
        for slot in self._grad_slots:
            slot.grad = None
        self._slots_pending = []
        self._wcache = None
        self._fp8_fresh = [True, True, True]

    def _reset_optional_state(self) -> None:
        with torch.no_grad():
            self.fp8_rng.zero_()
            self.fp8_auto.copy_(torch.tensor(_auto_initial()))
        self._sr_key, self._sr_offset = 0, 0
        self._auto_state = _auto_initial()
        self._auto_plans = []
        self._auto_reasons = {}

    def _sync_mirrors_to_buffers(self) -> None:
        with torch.no_grad():
            self.fp8_rng.copy_(torch.tensor([self._sr_key, self._sr_offset], dtype=torch.int64))
            self.fp8_auto.copy_(torch.tensor(self._auto_state, dtype=torch.int64))

    def _sync_mirrors_from_buffers(self) -> None:
        self._sr_key, self._sr_offset = (int(v) for v in self.fp8_rng.tolist())
        self._auto_state = [list(map(int, r)) for r in self.fp8_auto.tolist()]
        self._auto_plans = []

    # ---- format per role (Format.AUTO) and stochastic rounding ----------------------
    def _fmt(self, recipe, role: int) -> Format:
        if recipe.fp8_format is Format.AUTO:
            return auto_format.current(self._auto_state[role])
        return role_format(recipe.fp8_format, _ROLE_NAMES[role])

    def fp8_format_report(self) -> dict:
        """Format.AUTO's current choice per tensor role, with the reason of the last
        evaluation that changed or confirmed it: {role: (Format name, reason)}."""
        if self._last_recipe is not None:
            self._fold_auto_grad(self._last_recipe)  # backwards that ran since the last forward
        return {r: (auto_format.current(self._auto_state[i]).name, self._auto_reasons.get(r, "not evaluated yet"))
                for i, r in enumerate(_ROLE_NAMES)}

    def _auto_vote(self, role: int, use: int, choice, recipe) -> None:
        fmt, reason = choice
        self._auto_reasons[_ROLE_NAMES[role]] = reason
        if auto_format.vote(self._auto_state[role], use, fmt, recipe.auto):
            name = getattr(self, "_fp8_name", None) or f"Linear@{id(self):x}"
            log.info("fp8mix.Linear %s: %s now %s (%s)", name, _ROLE_NAMES[role], fmt.name, reason)
            frame = current_frame()
            if frame is not None and frame.monitor is not None:
                frame.monitor.note(name, _ROLE_NAMES[role], "format", f"{fmt.name} ({reason})")
            if recipe.delayed() and not self._fp8_fresh[role]:
                with torch.no_grad():  # the history is in units of x: rescale it for the new format's max
                    self._rescale_from_history(role, recipe)
            self._wcache = None

    def _auto_forward(self, x2: torch.Tensor, w: torch.Tensor, recipe, wants_grad: bool, weight_cast: bool):
        """Format.AUTO bookkeeping of one forward: evaluate input/weight when due, and
        return the use index of grad_output that backward should evaluate (or -1)."""
        self._fold_auto_grad(recipe)
        for role, t, counted in ((_INPUT, x2, True), (_WEIGHT, w, weight_cast)):
            if not counted:
                continue
            st = self._auto_state[role]
            evaluate = auto_format.due(st, recipe.auto)
            use = auto_format.tick(st)
            if evaluate:
                gran = _BLOCK2D if (role == _WEIGHT and isinstance(recipe, BlockScaling)) else (
                    _BLOCK if isinstance(recipe, BlockScaling) else _TENSOR)
                self._auto_vote(role, use, auto_format.evaluate(t, gran, recipe.margin, recipe.power_2_scale,
                                                                recipe.auto.range_tolerance), recipe)
        if not wants_grad:
            return -1
        st = self._auto_state[_GRAD]
        evaluate = auto_format.due(st, recipe.auto)
        use = auto_format.tick(st)
        return use if evaluate else -1

    def _fold_auto_grad(self, recipe) -> None:
        """Fold the grad_output evaluations earlier backwards left in their plans."""
        keep = []
        for plan in self._auto_plans:
            if plan.auto_choice is not None:
                self._auto_vote(_GRAD, plan.auto_use, plan.auto_choice, recipe)
            elif len(self._auto_plans) - len(keep) <= self._N_GRAD_SLOTS:
                keep.append(plan)  # backward not run yet (older ones are taken as abandoned)
        self._auto_plans = keep

    def _sr_stream(self, numel: int):
        """(True, seed, offset) for one stochastic cast of numel elements, advancing this
        layer's Philox offset past it. The key is drawn at the first use."""
        if self._sr_key == 0:
            self._sr_key = int(torch.randint(1, 2 ** 62, (1,)).item())
        off = self._sr_offset
        self._sr_offset = (off + -(-numel // 4) * 4) % 2 ** 62
        return (True, self._sr_key, off)


    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The history length is the checkpoint's: adopt its shape before copying.
        src = state_dict.get(prefix + "fp8_amax_history")
        if isinstance(src, torch.Tensor) and src.dim() == 2 and src.shape[1] == 3 \
                and src.shape != self.fp8_amax_history.shape:
            self.fp8_amax_history = torch.zeros(src.shape, dtype=torch.float32, device=self.fp8_scale.device)
        self._wcache = None
        for slot in self._grad_slots:
            slot.grad = None
        self._slots_pending = []
        # Remember which FP8 buffers this checkpoint lacks (an nn.Linear checkpoint):
        # the post-hook forgives exactly those and starts the FP8 state fresh.
        self._fp8_absent = [prefix + k for k in _FP8_KEYS + _OPT_KEYS if prefix + k not in state_dict]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _ensure_history(self, length: int):
        h = self.fp8_amax_history
        if h.shape[0] == length:
            return
        new = torch.zeros(length, 3, dtype=torch.float32, device=h.device)
        n = min(length, h.shape[0])
        new[:n] = h[:n]
        self.fp8_amax_history = new

    # ---- delayed scaling -----------------------------------------------------------
    def _record_amax(self, role: int, am: torch.Tensor, recipe: DelayedScaling, group) -> None:
        """Roll role's history, put `am` first, and every `interval` records recompute its
        scale from the history (an amax of 0 or not finite keeps the previous scale).
        A non-finite amax (a step whose tensors overflowed, which a gradient scaler skips)
        goes into the history as 0, "no information", so that it cannot freeze the scale
        for the whole length of the history."""
        _all_reduce_max(am, group)
        am = am.reshape(())
        h = self.fp8_amax_history[:, role]
        h.copy_(torch.roll(h, 1, 0))
        h[0] = torch.where(torch.isfinite(am), am, torch.zeros_like(am))
        self.fp8_steps[role] += 1
        self._rescale_from_history(role, recipe, every_interval=True)

    def _rescale_from_history(self, role: int, recipe: DelayedScaling, every_interval: bool = False) -> None:
        """The role's scale from its amax history by the recipe's algorithm (kept when the
        amax is 0 or not finite; with every_interval, only every `interval` records)."""
        h = self.fp8_amax_history[:, role]
        algo = recipe.amax_compute_algo
        if algo == "max":
            a = h.amax()
        elif algo == "most_recent":
            a = h[0]
        else:
            a = _algo_result(algo(h.clone()), h.device)
        fmt = self._fmt(recipe, role)
        s, _ = ops.compute_scale(a.reshape(1), fp8_dtype(fmt), recipe.margin, recipe.power_2_scale, 0.0)
        ok = torch.isfinite(a) & (a > 0)
        if every_interval and recipe.interval > 1:  # a tensor test: no host sync, no graph break
            ok = ok & (self.fp8_steps[role] % recipe.interval == 0)
        self.fp8_scale[role] = torch.where(ok, s[0], self.fp8_scale[role])

    def _flush_grad_amax(self, recipe: DelayedScaling, group) -> None:
        """Record, in call order, the grad_output amaxes backward left in the slots."""
        for i in list(self._slots_pending):
            slot = self._grad_slots[i]
            g = slot.grad
            if g is None:  # that call's backward has not run yet
                continue
            slot.grad = None
            self._slots_pending.remove(i)
            with torch.no_grad():
                self._ensure_history(recipe.amax_history_len)
                am = g.detach().clone()
                if self._fp8_fresh[_GRAD]:  # first record: the scale comes from this amax
                    self._fp8_fresh[_GRAD] = False
                    _all_reduce_max(am, group)
                    fmt = self._fmt(recipe, _GRAD)
                    s, _ = ops.compute_scale(am.reshape(1), fp8_dtype(fmt), recipe.margin, recipe.power_2_scale, 0.0)
                    self.fp8_scale[_GRAD] = s[0]
                self._record_amax(_GRAD, am, recipe, group)

    def _cast_delayed(self, x2: torch.Tensor, role: int, plan: _Plan):
        """Delayed-scaling cast of a forward tensor: (q, scale_inv); records its amax."""
        recipe, fmt = plan.recipe, plan.fmts[role]
        with torch.no_grad():
            if self._fp8_fresh[role]:
                # First use: no history yet, so scale from this tensor (not an arbitrary 1).
                self._fp8_fresh[role] = False
                am = ops.amax(x2, _TENSOR)
                _all_reduce_max(am, plan.group)
                s, _ = ops.compute_scale(am, fp8_dtype(fmt), recipe.margin, recipe.power_2_scale, 0.0)
                self.fp8_scale[role] = s
            scale = self.fp8_scale[role].clone()
            q, _, am = ops.cast(x2, scale, fp8_dtype(fmt), _TENSOR, True, *plan.sr[role], True, False)
            self._record_amax(role, am, recipe, plan.group)
        return q, torch.reciprocal(scale)

    # ---- forward casts -------------------------------------------------------------
    def _cast_input(self, x2: torch.Tensor, plan: _Plan):
        """(xq, x_sinv, x_save, x_save_sinv); x_save None means 'backward keeps xq'."""
        recipe, fmt = plan.recipe, plan.fmts[_INPUT]
        sr = plan.sr[_INPUT]
        if isinstance(recipe, BlockScaling):
            xq, _, x_sinv, _ = _current(x2, fmt, recipe, _BLOCK, plan.group, sr=sr)
            # wgrad needs x blocked along M too: keep a 128x128-block copy rather than xq
            # (its own random words: shifting the offset by one cast's worth)
            sr2 = (sr[0], sr[1], sr[2] + -(-x2.numel() // 4) * 4) if sr[0] else sr
            x_save, _, x_save_sinv, _ = _current(x2, fmt, recipe, _BLOCK2D, plan.group, sr=sr2)
            return xq, x_sinv, x_save, x_save_sinv
        if isinstance(recipe, CurrentScaling):
            xq, _, x_sinv, _ = _current(x2, fmt, recipe, _TENSOR, plan.group, sr=sr)
        else:
            xq, x_sinv = self._cast_delayed(x2, _INPUT, plan)
        return xq, x_sinv, None, None

    def _weight_fp8(self, weight: torch.Tensor, plan: _Plan, is_first_microbatch):
        """FP8 weight and its scale_inv. is_first_microbatch: None casts every call; True
        casts and keeps the result; False reuses what the last True call kept (an error if
        there is none, or if it was cast under another recipe or format)."""
        recipe, fmt = plan.recipe, plan.fmts[_WEIGHT]
        key = (type(recipe), fmt, recipe.margin, recipe.power_2_scale, weight.shape, weight.dtype,
               recipe.rounding["weight"])
        if is_first_microbatch is False:
            if self._wcache is None or self._wcache[0] != key:
                raise RuntimeError("fp8mix.Linear: is_first_microbatch=False but no FP8 weight was cached by an "
                                   "is_first_microbatch=True call under this recipe")
            return self._wcache[1], self._wcache[2]
        w = weight.detach()
        if isinstance(recipe, BlockScaling):
            wq, _, sinv, _ = _current(w, fmt, recipe, _BLOCK2D, plan.group, sr=plan.sr[_WEIGHT])
        elif isinstance(recipe, CurrentScaling):
            wq, _, sinv, _ = _current(w, fmt, recipe, _TENSOR, plan.group, sr=plan.sr[_WEIGHT])
        else:
            wq, sinv = self._cast_delayed(w, _WEIGHT, plan)
        self._wcache = (key, wq, sinv) if is_first_microbatch else None
        return wq, sinv

    # ---- forward -------------------------------------------------------------------
    def _fp8_ok(self, x: torch.Tensor) -> bool:
        if min(self.in_features, self.out_features) < self.fp8_min_features or x.numel() == 0:
            if not self._fallback_logged:
                log.debug("fp8mix.Linear(%d, %d): running in high precision (%s)", self.in_features,
                          self.out_features, "empty input" if x.numel() == 0 else
                          f"fewer than {self.fp8_min_features} features")
                self._fallback_logged = True
            return False
        return True

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"fp8mix.Linear: input has shape {tuple(x.shape)}, expected (..., {self.in_features})")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"fp8mix.Linear: input must be float32, bfloat16 or float16, got {x.dtype}")
        if x.device != self.weight.device:
            raise ValueError(f"fp8mix.Linear: input is on {x.device}, weight on {self.weight.device}")
        if x.device.type != "cpu" and not torch._C._dispatch_has_kernel_for_dispatch_key(
                "fp8mix::scaled_mm", torch._C._dispatch_key_for_device(x.device.type)):
            raise NotImplementedError(f"fp8mix.Linear: this build has no FP8 kernels for {x.device}; "
                                      "run outside fp8_autocast or build fp8mix with CUDA")

    def forward(self, x: torch.Tensor, is_first_microbatch=None) -> torch.Tensor:
        """y = x W^T + b; in FP8 inside fp8_autocast.

        is_first_microbatch (as Transformer Engine): None (default) casts the weight every
        call; with gradient accumulation pass True on the first micro-batch of a step (cast
        and keep the FP8 weight) and False on the others (reuse it: no re-cast, no amax
        record). Ignored outside fp8_autocast."""
        if is_first_microbatch not in (None, True, False):
            raise TypeError("fp8mix.Linear: is_first_microbatch must be None, True or False")
        frame = current_frame()
        if frame is None or not frame.enabled:
            return F.linear(x, self.weight, self.bias)
        self._check_input(x)
        if not self._fp8_ok(x):
            return F.linear(x, self.weight, self.bias)
        recipe = frame.recipe
        self._last_recipe = recipe
        eager = not _compiling()
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        weight_cast = is_first_microbatch is not False
        x2 = x.reshape(-1, self.in_features)
        auto_use = -1
        if recipe.fp8_format is Format.AUTO and eager:  # decisions need host reads: eager only
            auto_use = self._auto_forward(x2.detach(), self.weight.detach(), recipe, wants_grad, weight_cast)
        plan = _Plan(recipe, _reduce_group(frame.group), _hp_out_dtype(x, self.weight.dtype),
                     [self._fmt(recipe, r) for r in range(3)])
        if auto_use >= 0:
            plan.auto_use = auto_use
            self._auto_plans.append(plan)
        self._plan_rounding(plan, x2.shape[0], weight_cast, wants_grad)
        monitor = frame.monitor
        if monitor is not None and eager and monitor.sampling:
            plan.monitor = monitor
            plan.name = getattr(self, "_fp8_name", None) or f"Linear@{id(self):x}"
        g_scale = self.fp8_scale[_GRAD]
        if recipe.delayed():
            with torch.no_grad():
                self._ensure_history(recipe.amax_history_len)
            self._flush_grad_amax(recipe, plan.group)
            self._last_delayed = (recipe, plan.group)
            plan.grad_fresh = self._fp8_fresh[_GRAD]  # until a grad amax is recorded
            g_scale = g_scale.clone()  # the scale this call's backward will use
        slot = self._take_slot() if recipe.delayed() and wants_grad else self._no_slot
        with torch.no_grad():
            xq, x_sinv, x_save, x_save_sinv = self._cast_input(x2.detach(), plan)
            wq, w_sinv = self._weight_fp8(self.weight, plan, is_first_microbatch)
            if plan.monitor is not None:
                self._monitor_forward(plan, x2.detach(), xq, x_sinv, wq, w_sinv, weight_cast)
        y2 = _FP8LinearFn.apply(x2, self.weight, self.bias, xq, x_sinv, x_save, x_save_sinv, wq, w_sinv, g_scale,
                                slot, plan)
        return y2.reshape(*x.shape[:-1], self.out_features)

    def _plan_rounding(self, plan: _Plan, rows: int, weight_cast: bool, wants_grad: bool) -> None:
        """Reserve this call's stochastic-rounding streams (forward decides them for its
        backward too, so backward changes no state)."""
        r = plan.recipe.rounding
        block = isinstance(plan.recipe, BlockScaling)
        if r["input"] == "stochastic":  # BlockScaling casts x twice: reserve both
            plan.sr[_INPUT] = self._sr_stream(rows * self.in_features * (2 if block else 1))
        if r["weight"] == "stochastic" and weight_cast:
            plan.sr[_WEIGHT] = self._sr_stream(self.weight.numel())
        if r["grad_output"] == "stochastic" and wants_grad:
            plan.sr[_GRAD] = self._sr_stream(rows * self.out_features)
            if block:
                plan.sr[3] = self._sr_stream(rows * self.out_features)

    def _monitor_forward(self, plan: _Plan, x2, xq, x_sinv, wq, w_sinv, weight_cast: bool) -> None:
        block = isinstance(plan.recipe, BlockScaling)
        plan.monitor.record(plan.name, "input", x2, xq, x_sinv, "block" if block else "tensor",
                            fmt=plan.fmts[_INPUT], scale=None, amax=None)
        if weight_cast:
            plan.monitor.record(plan.name, "weight", self.weight.detach(), wq, w_sinv,
                                "block2d" if block else "tensor", fmt=plan.fmts[_WEIGHT], scale=None, amax=None)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fp8=True"


def _forgive_missing_fp8_state(module, incompatible_keys):
    """Let an nn.Linear checkpoint load with strict=True: when all of this layer's FP8
    buffers are missing, start its FP8 state fresh instead of failing."""
    absent, module._fp8_absent = module._fp8_absent, []
    missing = incompatible_keys.missing_keys
    optional = [k for k in absent if k.endswith(_OPT_KEYS) and k in missing]
    core = [k for k in absent if k not in optional]
    if core and len(core) == len(_FP8_KEYS) and all(k in missing for k in core):
        for k in core:
            missing.remove(k)
        module.reset_fp8_state()
    if optional:  # a checkpoint from before stochastic rounding / Format.AUTO state
        for k in optional:
            missing.remove(k)
        module._reset_optional_state()
    module._fp8_fresh = [int(n) == 0 for n in module.fp8_steps.tolist()]
    module._sync_mirrors_from_buffers()


def _flush_before_save(module, state_dict, prefix, local_metadata):
    """state_dict() hook: a pending grad_output amax is recorded before saving, so a
    resumed run continues exactly as an uninterrupted one."""
    if module._last_delayed is not None and any(s.grad is not None for s in module._grad_slots):
        module._flush_grad_amax(*module._last_delayed)
    if module._last_recipe is not None and any(p.auto_choice is not None for p in module._auto_plans):
        module._fold_auto_grad(module._last_recipe)
    module._sync_mirrors_to_buffers()
    for k in _FP8_KEYS + _OPT_KEYS:
        if prefix + k in state_dict:
            state_dict[prefix + k] = getattr(module, k).detach()
    return state_dict
