"""fp8mix.Linear: a drop-in nn.Linear whose three GEMMs run in FP8 under fp8_autocast.

    forward  y[M,N]  = x[M,K]  . W[N,K]^T     E4M3 x E4M3 (HYBRID)
    dgrad    dx[M,K] = dy[M,N] . W[N,K]       E5M2 x E4M3
    wgrad    dW[N,K] = dy^T[N,M] . x[M,K]     E5M2 x E4M3

Outside fp8_autocast it is nn.Linear, bit for bit. Inside, x and W are cast to FP8
(one fused pass each, amax included), the FP8 x (1 byte/element) is what backward
keeps, and dy is cast once into both dy and dy^T (cast+transpose). Master weights,
bias, gradients and outputs stay in high precision.

FP8 state (delayed scaling) lives in buffers, so it is in state_dict():
    fp8_amax_history  (L, 3) float32   newest first; columns input, weight, grad_output
    fp8_scale         (3,)   float32   the scale the next cast of each role uses
    fp8_steps         (3,)   int64     casts recorded per role
When the history rolls: once per USE of a role — each forward call records the amax
of its input, each backward call that of its grad_output, and the weight's once per
new weight version (the FP8 weight is cached while the parameter is unchanged, so
gradient-accumulation micro-batches reuse it and do not re-record it). Why per use and
not per optimizer step: a use is the one event every layer sees without help from the
optimizer, it keeps the update a fixed sequence of tensor ops (no host sync), and a
layer used several times per step (weight sharing, micro-batches) still sees each
tensor it casts. A checkpoint of a plain nn.Linear loads with strict=True; the FP8
state then starts fresh.
"""
from __future__ import annotations

import logging
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops
from .autocast import current_frame
from .formats import GRANULARITIES, Format, fp8_dtype, fp8_max
from .recipe import BlockScaling, CurrentScaling, DelayedScaling, role_format

__all__ = ["Linear"]

log = logging.getLogger("fp8mix")

_INPUT, _WEIGHT, _GRAD = 0, 1, 2
_ROLE_NAMES = ("input", "weight", "grad_output")
_BLOCK = GRANULARITIES["block"]
_BLOCK2D = GRANULARITIES["block2d"]
_FP8_KEYS = ("fp8_amax_history", "fp8_scale", "fp8_steps")


def _hp_out_dtype(x: torch.Tensor, module_dtype: torch.dtype) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return module_dtype


def _world_group(group):
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    if group is None:
        group = torch.distributed.group.WORLD
    return group if torch.distributed.get_world_size(group) > 1 else None


class _Plan:
    """What one forward call decided, kept for its backward (the recipe the forward used)."""

    __slots__ = ("recipe", "group", "layer", "out_dtype", "fmts")

    def __init__(self, recipe, group, layer, out_dtype):
        self.recipe = recipe
        self.group = group
        self.layer = layer
        self.out_dtype = out_dtype
        self.fmts = [role_format(recipe.fp8_format, r) for r in _ROLE_NAMES]


def _current(x2, fmt, recipe, granularity, group, transpose=False, want_q=True):
    """Current scaling of a 2-D tensor: (q, qt, scale_inv, amax). With a process group,
    amaxes are all-reduced first so every rank uses the same scales."""
    margin, pow2, eps = recipe.margin, recipe.power_2_scale, float(recipe.amax_epsilon)
    if group is None:
        return ops.quantize_current(x2, fp8_dtype(fmt), granularity, margin, pow2, eps, True, False, 0, 0,
                                    want_q, transpose)
    am = ops.amax(x2, granularity)
    torch.distributed.all_reduce(am, op=torch.distributed.ReduceOp.MAX, group=group)
    scale, sinv = ops.compute_scale(am, fp8_dtype(fmt), margin, pow2, eps)
    q, qt, _ = ops.cast(x2, scale, fp8_dtype(fmt), granularity, True, False, 0, 0, want_q, transpose)
    return q, qt, sinv, am


class _FP8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, plan: _Plan):
        layer = plan.layer
        K = x.shape[-1]
        x2 = x.reshape(-1, K)
        if isinstance(plan.recipe, BlockScaling):
            xq, _, x_sinv, _ = _current(x2, plan.fmts[_INPUT], plan.recipe, _BLOCK, plan.group)
            # wgrad needs x blocked along M as well: keep a 128x128-block copy instead of xq
            x_save, _, x_save_sinv, _ = _current(x2, plan.fmts[_INPUT], plan.recipe, _BLOCK2D, plan.group)
        else:
            xq, x_sinv = layer._cast_role(x2, _INPUT, plan)
            x_save, x_save_sinv = xq, x_sinv
        wq, w_sinv = layer._weight_fp8(weight, plan)
        w_sinv_fwd = w_sinv.t().contiguous() if isinstance(plan.recipe, BlockScaling) else w_sinv
        b = None
        if bias is not None:
            b = bias if bias.dtype in (torch.float32, plan.out_dtype) else bias.float()
        y = ops.scaled_mm(xq, wq.t(), x_sinv, w_sinv_fwd, b, plan.out_dtype, "fp32", 128)
        ctx.save_for_backward(x_save, x_save_sinv, wq, w_sinv)
        ctx.plan = plan
        ctx.x_dtype = x.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.w_dtype = weight.dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x_save, x_sinv, wq, w_sinv = ctx.saved_tensors
        plan = ctx.plan
        N = dy.shape[-1]
        dy2 = dy.reshape(-1, N)
        if dy2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            dy2 = dy2.float()
        recipe = plan.recipe
        dx = dw = db = None
        if isinstance(recipe, BlockScaling):
            gq, _, g_sinv, _ = _current(dy2, plan.fmts[_GRAD], recipe, _BLOCK, plan.group)
            gtq, _, gt_sinv, _ = _current(dy2.t(), plan.fmts[_GRAD], recipe, _BLOCK, plan.group)
        else:
            gq, gtq, g_sinv = plan.layer._cast_role(dy2, _GRAD, plan, transpose=True)
            gt_sinv = g_sinv
        if ctx.needs_input_grad[0]:
            dx = ops.scaled_mm(gq, wq, g_sinv, w_sinv, None, ctx.x_dtype, "fp32", 128)
            dx = dx.reshape(*dy.shape[:-1], dx.shape[-1])
        if ctx.needs_input_grad[1]:
            dw = ops.scaled_mm(gtq, x_save, gt_sinv, x_sinv, None, ctx.w_dtype, "fp32", 128)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, db, None


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
        self._setup_fp8(device)

    @classmethod
    def from_linear(cls, lin: nn.Linear, history_len: int = 0) -> "Linear":
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

    def _setup_fp8(self, device, history_len: int = 0):
        self._init_fp8_state(device, history_len)
        self._wcache = None
        self._fallback_logged = False
        self._fp8_absent = []
        self.register_load_state_dict_post_hook(_forgive_missing_fp8_state)

    # ---- state -------------------------------------------------------------------
    def _init_fp8_state(self, device=None, history_len: int = 0):
        self.register_buffer("fp8_amax_history", torch.zeros(history_len, 3, dtype=torch.float32, device=device))
        self.register_buffer("fp8_scale", torch.ones(3, dtype=torch.float32, device=device))
        self.register_buffer("fp8_steps", torch.zeros(3, dtype=torch.int64, device=device))

    def reset_fp8_state(self) -> None:
        """Forget amax histories, scales and cached FP8 weights."""
        with torch.no_grad():
            self.fp8_amax_history.zero_()
            self.fp8_scale.fill_(1.0)
            self.fp8_steps.zero_()
        self._wcache = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The history length is the saved run's: adopt the incoming shape before copying.
        key = prefix + "fp8_amax_history"
        if key in state_dict and isinstance(state_dict[key], torch.Tensor):
            src = state_dict[key]
            if src.dim() == 2 and src.shape[1] == 3 and src.shape != self.fp8_amax_history.shape:
                self.fp8_amax_history = torch.zeros(src.shape, dtype=torch.float32, device=self.fp8_scale.device)
        self._wcache = None
        # Remember which FP8 buffers this checkpoint lacks (an nn.Linear checkpoint):
        # the post-hook forgives exactly those and starts the FP8 state fresh.
        self._fp8_absent = [prefix + k for k in _FP8_KEYS if prefix + k not in state_dict]
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

    # ---- casts ---------------------------------------------------------------------
    def _cast_role(self, x2: torch.Tensor, role: int, plan: _Plan, transpose: bool = False):
        """Per-tensor cast of a 2-D tensor for `role` under a delayed or current recipe.
        Returns (q, scale_inv) or, with transpose, (q, qt, scale_inv)."""
        recipe, fmt = plan.recipe, plan.fmts[role]
        if isinstance(recipe, CurrentScaling):
            q, qt, sinv, _ = _current(x2, fmt, recipe, 0, plan.group, transpose)
            return (q, qt, sinv) if transpose else (q, sinv)
        # delayed scaling
        with torch.no_grad():
            steps = self.fp8_steps
            if int(steps[role]) == 0:
                # First use: no history yet, so scale from this tensor (not an arbitrary 1).
                am = ops.amax(x2, 0)
                self._reduce_amax(am, plan.group)
                s, _ = ops.compute_scale(am, fp8_dtype(fmt), recipe.margin, recipe.power_2_scale, 0.0)
                self.fp8_scale[role] = s
            scale = self.fp8_scale[role].clone()
            q, qt, am = ops.cast(x2, scale, fp8_dtype(fmt), 0, True, False, 0, 0, True, transpose)
            self._record_amax(role, am, recipe, plan.group)
            sinv = torch.reciprocal(scale)
        return (q, qt, sinv) if transpose else (q, sinv)

    def _reduce_amax(self, am: torch.Tensor, group) -> None:
        if group is not None:
            torch.distributed.all_reduce(am, op=torch.distributed.ReduceOp.MAX, group=group)

    def _record_amax(self, role: int, am: torch.Tensor, recipe: DelayedScaling, group) -> None:
        """Roll role's history, put `am` first, and every `interval` uses recompute its scale
        from the history (an amax of 0 or not finite keeps the previous scale)."""
        self._reduce_amax(am, group)
        self._ensure_history(recipe.amax_history_len)
        h = self.fp8_amax_history[:, role]
        h.copy_(torch.roll(h, 1, 0))
        h[0] = am
        self.fp8_steps[role] += 1
        if int(self.fp8_steps[role]) % recipe.interval != 0:
            return
        algo = recipe.amax_compute_algo
        if algo == "max":
            a = h.amax()
        elif algo == "most_recent":
            a = h[0]
        else:
            a = torch.as_tensor(algo(h.clone()), dtype=torch.float32, device=h.device).reshape(())
        fmt = role_format(recipe.fp8_format, _ROLE_NAMES[role])
        s, _ = ops.compute_scale(a.reshape(1), fp8_dtype(fmt), recipe.margin, recipe.power_2_scale, 0.0)
        ok = torch.isfinite(a) & (a > 0)
        self.fp8_scale[role] = torch.where(ok, s[0], self.fp8_scale[role])

    def _weight_fp8(self, weight: torch.Tensor, plan: _Plan):
        """FP8 weight and its scale_inv, cast once and reused while the weight is unchanged
        (detected by the parameter's version counter, data pointer and the recipe)."""
        recipe, fmt = plan.recipe, plan.fmts[_WEIGHT]
        key = (weight._version, weight.data_ptr(), weight.dtype, type(recipe), fmt,
               getattr(recipe, "margin", 0), getattr(recipe, "power_2_scale", False))
        compiling = torch.compiler.is_compiling()
        if not compiling and self._wcache is not None and self._wcache[0] == key:
            return self._wcache[1], self._wcache[2]
        w = weight.detach()
        if isinstance(recipe, BlockScaling):
            wq, _, sinv, _ = _current(w, fmt, recipe, _BLOCK2D, plan.group)
        else:
            wq, sinv = self._cast_role(w, _WEIGHT, plan)
        if not compiling:
            self._wcache = (key, wq, sinv)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frame = current_frame()
        if frame is None or not frame.enabled or not self._fp8_ok(x):
            return F.linear(x, self.weight, self.bias)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"fp8mix.Linear: input has {x.shape[-1]} features in its last dimension, "
                             f"expected {self.in_features} (input shape {tuple(x.shape)})")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"fp8mix.Linear: input must be float32, bfloat16 or float16, got {x.dtype}")
        if x.device != self.weight.device:
            raise ValueError(f"fp8mix.Linear: input is on {x.device}, weight on {self.weight.device}")
        if x.device.type != "cpu" and not torch._C._dispatch_has_kernel_for_dispatch_key(
                "fp8mix::scaled_mm", x.device.type.upper()):
            raise NotImplementedError(f"fp8mix.Linear: this build has no FP8 kernels for {x.device}; "
                                      "run outside fp8_autocast or build fp8mix with CUDA")
        plan = _Plan(frame.recipe, _world_group(frame.group), self, _hp_out_dtype(x, self.weight.dtype))
        return _FP8LinearFn.apply(x, self.weight, self.bias, plan)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fp8=True"


def _forgive_missing_fp8_state(module, incompatible_keys):
    """Let an nn.Linear checkpoint load with strict=True: when all of this layer's FP8
    buffers are missing, start its FP8 state fresh instead of failing."""
    absent = getattr(module, "_fp8_absent", [])
    module._fp8_absent = []
    missing = incompatible_keys.missing_keys
    if absent and len(absent) == len(_FP8_KEYS) and all(k in missing for k in absent):
        for k in absent:
            missing.remove(k)
        module.reset_fp8_state()
