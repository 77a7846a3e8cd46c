"""FP8GradScaler: dynamic loss scaling with feedback from the FP8 gradient casts.

What it covers: the interface and the scale trajectory of torch.amp.GradScaler
(scale, unscale_, step, update, state_dict, ...) on any device, plus a second
signal, the counts fp8mix.Linear's grad_output casts leave in fp8mix.grad_stats,
that moves the scale before inf/NaN ever appears. What it does not: it casts
nothing and keeps no per-layer state; the FP8 scales of the layers are theirs.
"""
from __future__ import annotations

import math
from collections import defaultdict
from enum import Enum
from typing import Optional

import torch

from . import grad_stats

__all__ = ["FP8GradScaler"]


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_opt_state() -> dict:
    return {"stage": _Stage.READY, "found_inf_per_device": {}}


def _number(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"FP8GradScaler: {name} must be a number, got {type(v).__name__}")
    return float(v)


def _check_init_scale(v) -> float:
    v = _number("init_scale", v)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"FP8GradScaler: init_scale must be finite and > 0, got {v}")
    return v


def _check_growth_factor(v) -> float:
    v = _number("growth_factor", v)
    if not (math.isfinite(v) and v > 1.0):
        raise ValueError(f"FP8GradScaler: growth_factor must be finite and > 1, got {v}")
    return v


def _check_backoff_factor(v) -> float:
    v = _number("backoff_factor", v)
    if not 0.0 < v < 1.0:
        raise ValueError(f"FP8GradScaler: backoff_factor must be in (0, 1), got {v}")
    return v


def _check_growth_interval(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"FP8GradScaler: growth_interval must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"FP8GradScaler: growth_interval must be >= 1, got {v}")
    return v


def _check_feedback_interval(v) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"FP8GradScaler: fp8_feedback_interval must be an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"FP8GradScaler: fp8_feedback_interval must be >= 1, got {v}")
    return v


def _check_fraction(name: str, v, hi_open: bool) -> float:
    v = _number(name, v)
    if not (0.0 <= v < 1.0 if hi_open else 0.0 <= v <= 1.0):
        raise ValueError(f"FP8GradScaler: {name} must be in [0, 1{')' if hi_open else ']'}, got {v}")
    return v


def _merge_stats(acc: Optional[dict], new: Optional[dict]) -> Optional[dict]:
    """Two grad_stats.pop() results as one: counts summed, each fraction re-weighted by
    the non-zero counts it was taken over (pop() divides by max(nonzero, 1))."""
    if new is None:
        return acc
    if acc is None:
        return dict(new)
    out = {k: acc[k] + new[k] for k in grad_stats.FIELDS}
    na, nn_, nz = max(acc["nonzero"], 1.0), max(new["nonzero"], 1.0), max(out["nonzero"], 1.0)
    for k in ("underflow_frac", "overflow_frac"):
        out[k] = (acc[k] * na + new[k] * nn_) / nz
    out["max_overflow_frac"] = max(acc.get("max_overflow_frac", 0.0), new.get("max_overflow_frac", 0.0))
    return out


def _inf_check_has_kernel(device: torch.device) -> bool:
    try:
        key = torch._C._dispatch_key_for_device(device.type)
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_amp_foreach_non_finite_check_and_unscale_",
                                                              key)
    except (AttributeError, RuntimeError):
        return False


def _non_finite_check_and_unscale_(grads: list, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """grads *= inv_scale in place; found_inf := 1.0 if any element of any grad is inf/NaN.
    torch's fused op where the device has it, else the same thing in plain tensor ops."""
    if _inf_check_has_kernel(found_inf.device):
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return
    bad = torch.zeros((), dtype=torch.bool, device=found_inf.device)
    for g in grads:
        bad |= ~torch.isfinite(g).all()
        g.mul_(inv_scale)
    found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))


class FP8GradScaler:
    """Loss scaling for FP8 training: torch.amp.GradScaler plus FP8 cast feedback.

    Use it exactly as torch.amp.GradScaler::

        scaler = fp8mix.FP8GradScaler()
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                  # optional: clip or inspect true gradients
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)                      # skipped if any gradient is inf/NaN
        scaler.update()

    With ``fp8_feedback=False`` it is torch.amp.GradScaler, step for step: the scale
    starts at `init_scale`; a step whose gradients hold an inf/NaN is skipped and the
    scale is multiplied by `backoff_factor`; after `growth_interval` consecutive clean
    steps it is multiplied by `growth_factor` (not if that would be infinite). Inf checks
    are exact (every element of every gradient), with torch's fused
    ``_amp_foreach_non_finite_check_and_unscale_`` where the device has it and plain
    tensor ops elsewhere. The scale and the growth tracker live in tensors on the
    gradients' device; without feedback nothing reads them back to the host except
    step() (one ``found_inf`` read, as torch).

    **Why feedback.** A loss scale exists to put gradients where the number format can
    represent them. For FP32/BF16 master gradients that is only about inf/NaN. For the FP8
    casts of grad_output inside fp8mix.Linear it depends on the recipe:

    * per-tensor (or per-block) *current* scaling divides the loss scale back out: the
      cast's scale comes from the tensor's own amax, so the loss scale barely matters;
    * *delayed* scaling casts with a scale computed from past amaxes: when dy is larger
      than its history (the loss scale just grew, or the loss spiked) the top of it
      **saturates**, silently, to the format's max (saturating casts never make an inf,
      so the plain inf check cannot see it); when it is smaller (after a backoff) its
      bottom **underflows** to zero until the history rolls over;
    * an unscaled cast (scale 1) puts gradients exactly where the loss scale puts them.

    So with ``fp8_feedback=True`` (default) the scaler activates its own
    :class:`fp8mix.grad_stats.GradStats` collector
    (in :meth:`scale`) on every `fp8_feedback_interval`-th iteration (default 10: counting
    costs one more read of each dy, so it is sampled), and on every iteration after one
    whose counts made it act (so a scale in motion is followed step by step until it
    settles), and reads the counts of all
    grad_output casts of that iteration (at unscale_()/step() and again at update()):

    * ``nonfinite`` > 0 (a grad_output cast saw an inf/NaN): the step is **skipped**, as
      for an inf gradient, and the scale backs off. The casts saturate, so an inf in dy
      reaches the weights as the format's max: a layer without bias then produces finite,
      wrong gradients that no inf check on the parameters can see (a high-precision run
      would have skipped that step). This covers every optimizer of the iteration.
    * ``overflow_frac`` (values beyond the format's max after scaling, which the
      saturating cast clipped, plus inf/NaN, over the non-zero values), pooled over the
      casts or of any single cast (``max_overflow_frac``: one layer's clipped gradients
      matter even when the pooled fraction is small), above `overflow_threshold`
      (default 1e-3: a few clipped outliers are harmless, a clipped tail is not): the
      scale backs off by `backoff_factor` and the growth tracker resets,
      as for an inf, but a finite step is **not** skipped (its gradients were only
      clipped). At most one backoff per update, inf or not.
    * else ``underflow_frac`` (non-zero values flushed to zero, over the non-zero values)
      above `underflow_threshold` (default 0.05), on a step without inf/NaN and without the
      interval growth: the scale grows at once by `growth_factor`, at most once per update,
      only while the result stays <= `max_scale` (default 2**24: a loss of ~1 times 2**24
      still leaves FP32 gradients ~2**100 below overflow, and underflow that persists at
      such a scale comes from the gradients' own spread, which no scale fixes) and below
      the last scale that overflowed or met an inf (so the two rules cannot ping-pong
      between two scales; the next interval growth lifts that ceiling and probes upward
      as torch does). The growth tracker resets.

    The last counts (or None when no FP8 cast reported) are in ``last_fp8_stats`` and the
    decision in ``last_fp8_action`` (``"skip"``, ``"backoff"``, ``"grow"`` or None: what
    the FP8 counts did beyond torch's rule). The counters ``fp8_skips``, ``fp8_backoffs``
    and ``fp8_growths`` count those decisions; they, the ceiling and the
    thresholds are in state_dict(). Each scaler has its own collector: two scalers each
    see every gradient cast of the iterations they sample. Stop the collection with
    :meth:`close` (or ``with FP8GradScaler() as scaler:``); a scaler that is
    garbage-collected stops too.

    Args:
        device: where the scale lives when first created ("cpu", "cuda", ...); the scale
            is created lazily on the device of the first scaled output.
        init_scale, growth_factor, backoff_factor, growth_interval, enabled: as torch.
        fp8_feedback: act on the counts of fp8mix.grad_stats (see above).
        overflow_threshold: in [0, 1); ``overflow_frac`` above it backs off.
        underflow_threshold: in [0, 1]; ``underflow_frac`` above it grows the scale.
        max_scale: cap of the underflow-driven growth (finite, > 0).
        fp8_feedback_interval: count the gradient casts on iterations 0, n, 2n, ... (int >= 1).

    Raises:
        ValueError: non-finite or non-positive init_scale, growth_factor <= 1,
            backoff_factor outside (0, 1), growth_interval < 1, thresholds outside range.
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True, *,
                 fp8_feedback: bool = True, overflow_threshold: float = 1e-3, underflow_threshold: float = 0.05,
                 max_scale: float = 2.0 ** 24, fp8_feedback_interval: int = 10):
        if not isinstance(enabled, bool):
            raise TypeError(f"FP8GradScaler: enabled must be a bool, got {type(enabled).__name__}")
        if not isinstance(fp8_feedback, bool):
            raise TypeError(f"FP8GradScaler: fp8_feedback must be a bool, got {type(fp8_feedback).__name__}")
        self._device = torch.device(device).type
        self._init_scale = _check_init_scale(init_scale)
        self._growth_factor = _check_growth_factor(growth_factor)
        self._backoff_factor = _check_backoff_factor(backoff_factor)
        self._growth_interval = _check_growth_interval(growth_interval)
        self._overflow_threshold = _check_fraction("overflow_threshold", overflow_threshold, True)
        self._underflow_threshold = _check_fraction("underflow_threshold", underflow_threshold, False)
        ms = _number("max_scale", max_scale)
        if not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"FP8GradScaler: max_scale must be finite and > 0, got {ms}")
        self._max_scale = ms
        self._fp8_feedback = fp8_feedback
        self._fb_interval = _check_feedback_interval(fp8_feedback_interval)
        self._fb_iter = 0  # iterations updated so far: those with _fb_iter % interval == 0 are counted
        self._enabled = enabled
        if enabled and self._device == "cuda" and not torch.cuda.is_available():
            import warnings
            warnings.warn("FP8GradScaler is enabled for device 'cuda' but CUDA is not available; disabling.")
            self._enabled = False
        self._scale: Optional[torch.Tensor] = None  # float32, created at the first scale()
        self._growth_tracker: Optional[torch.Tensor] = None  # int32, consecutive clean steps
        self._init_growth_tracker = 0
        self._opt_states: dict = defaultdict(_fresh_opt_state)
        # FP8 feedback state
        self._ceiling = math.inf  # the last scale that overflowed or met an inf: underflow growth stays below
        self.fp8_backoffs = 0
        self.fp8_growths = 0
        self.fp8_skips = 0
        self._hidden_inf = False  # this iteration's FP8 casts saw an inf/NaN
        self.last_fp8_stats: Optional[dict] = None
        self.last_fp8_action: Optional[str] = None
        self._stats_acc: Optional[dict] = None  # counts popped since the last update()
        self._stats = grad_stats.GradStats()  # this scaler's counts (held weakly while active)

    # ---- grad_stats collection ------------------------------------------------------
    def _collect(self) -> None:
        self._stats.activate()  # the collector is held weakly: a collected scaler stops counting

    def close(self) -> None:
        """Stop collecting gradient-cast counts (a later scale() starts again)."""
        self._stats.deactivate()

    def __enter__(self) -> "FP8GradScaler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- scale ----------------------------------------------------------------------
    def _lazy_init(self, dev: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=dev)

    def _require_init(self, what: str):
        if self._scale is None:
            raise RuntimeError(f"FP8GradScaler.{what}() called before scale(): nothing was scaled yet this run")
        return self._scale, self._growth_tracker

    def scale(self, outputs):
        """outputs (a tensor, or nested lists/tuples of tensors) times the current scale."""
        if not self._enabled:
            return outputs
        if self._fp8_feedback and (self._fb_iter % self._fb_interval == 0 or self.last_fp8_action is not None):
            self._collect()  # this iteration's backward counts its gradient casts
        else:
            self.close()
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        per_device: dict = {}

        def apply(v):
            if isinstance(v, torch.Tensor):
                if self._scale is None:
                    self._lazy_init(v.device)
                if v.device not in per_device:
                    per_device[v.device] = self._scale.to(device=v.device, non_blocking=True)
                return v * per_device[v.device]
            if isinstance(v, list):
                return [apply(e) for e in v]
            if isinstance(v, tuple):
                out = [apply(e) for e in v]
                return type(v)(*out) if hasattr(v, "_fields") else type(v)(out)  # namedtuples too
            raise TypeError(f"FP8GradScaler.scale: outputs must be a tensor or nested lists/tuples of tensors, "
                            f"got {type(v).__name__}")

        return apply(outputs)

    # ---- unscale / step -------------------------------------------------------------
    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, allow_fp16: bool) -> dict:
        per_device: dict = defaultdict(lambda: defaultdict(list))
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not allow_fp16 and p.grad.dtype == torch.float16:
                        raise ValueError("FP8GradScaler: attempting to unscale FP16 gradients (keep master "
                                         "parameters and their gradients in FP32 or BF16)")
                    g = p.grad
                    if g.is_sparse:
                        if g.dtype is torch.float16:  # duplicates could overflow only once added up
                            p.grad = g = g.coalesce()
                        g = g._values()
                    per_device[g.device][g.dtype].append(g)
            found = {}
            for dev, by_dtype in per_device.items():
                found_inf = torch.zeros((), dtype=torch.float32, device=dev)
                inv = inv_scale.to(dev)
                for grads in by_dtype.values():
                    _non_finite_check_and_unscale_(grads, found_inf, inv)
                found[dev] = found_inf
        return found

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and record whether any is
        inf/NaN. Optional (step() does it); at most once per optimizer between updates."""
        if not self._enabled:
            return
        scale, _ = self._require_init("unscale_")
        state = self._opt_states[id(optimizer)]
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("FP8GradScaler.unscale_() has already been called on this optimizer since the "
                               "last update()")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("FP8GradScaler.unscale_() is being called after step()")
        inv_scale = scale.double().reciprocal().float()  # as torch: 1/scale rounded once, from fp64
        state["found_inf_per_device"] = self._check_hidden_infs(self._unscale_grads_(optimizer, inv_scale, False))
        state["stage"] = _Stage.UNSCALED

    def _pop_stats(self) -> Optional[dict]:
        if self._fp8_feedback:
            self._stats_acc = _merge_stats(self._stats_acc, self._stats.pop())
        return self._stats_acc

    def _check_hidden_infs(self, found: dict) -> dict:
        """An inf/NaN the FP8 grad_output casts saw counts as found, even when saturation
        turned it into finite (wrong) parameter gradients."""
        stats = self._pop_stats()
        if stats is not None and stats["nonfinite"] > 0:
            if not any(bool(v.item()) for v in found.values()):
                self._hidden_inf = True  # the skip is the FP8 counts' doing
            scale, _ = self._require_init("step")
            dev = scale.device
            found = dict(found)
            found[dev] = torch.ones((), dtype=torch.float32, device=dev)
        return found

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """unscale_(optimizer) if not done yet, then optimizer.step(*args, **kwargs) unless a
        gradient is inf/NaN. Returns what optimizer.step returned, or None when skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("FP8GradScaler.step: closures are not supported while the scaler is enabled")
        scale, _ = self._require_init("step")
        state = self._opt_states[id(optimizer)]
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("FP8GradScaler.step() has already been called since the last update()")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # Fused optimizers unscale and skip themselves: hand them grad_scale and found_inf.
            if state["stage"] is _Stage.READY:
                one = torch.ones((), dtype=torch.float32, device=scale.device)
                state["found_inf_per_device"] = self._check_hidden_infs(self._unscale_grads_(optimizer, one, True))
            found_inf = sum(t.to(scale.device) for t in state["found_inf_per_device"].values())
            if not torch.is_tensor(found_inf):
                found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
            grad_scale = (getattr(optimizer, "grad_scale", None) if state["stage"] is _Stage.UNSCALED
                          else scale * getattr(optimizer, "grad_scale", 1))
            optimizer.grad_scale = grad_scale  # type: ignore[attr-defined]
            optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            try:
                ret = optimizer.step(*args, **kwargs)
            finally:
                del optimizer.grad_scale  # type: ignore[attr-defined]
                del optimizer.found_inf  # type: ignore[attr-defined]
            state["stage"] = _Stage.STEPPED
            return ret
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        found = state["found_inf_per_device"]
        if not found:
            raise RuntimeError("FP8GradScaler.step: no inf checks were recorded for this optimizer (none of its "
                               "parameters has a gradient)")
        ret = None
        if not sum(float(v.item()) for v in found.values()):
            ret = optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return ret

    # ---- update ---------------------------------------------------------------------
    def update(self, new_scale=None) -> None:
        """End of iteration: back off after an inf/NaN (or FP8 overflow), grow after
        `growth_interval` clean steps (or FP8 underflow); or set `new_scale` as given."""
        if not self._enabled:
            return
        scale, tracker = self._require_init("update")
        stats = self._pop_stats()
        self._stats_acc = None
        self.last_fp8_stats = stats
        self.last_fp8_action = None
        if new_scale is not None:
            self._hidden_inf = False
            if isinstance(new_scale, torch.Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("FP8GradScaler.update: new_scale must be a float or a 1-element tensor "
                                     "that does not require grad")
                scale.copy_(new_scale.detach().reshape(()).to(device=scale.device, dtype=torch.float32))
            else:
                v = _number("new_scale", new_scale)
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"FP8GradScaler.update: new_scale must be finite and > 0, got {v}")
                scale.fill_(v)
            self._opt_states = defaultdict(_fresh_opt_state)
            return
        found_infs = [f.to(scale.device) for st in self._opt_states.values()
                      for f in st["found_inf_per_device"].values()]
        if not found_infs:
            raise RuntimeError("FP8GradScaler.update: no inf checks were recorded before update() "
                               "(call step() or unscale_() first)")
        found = torch.stack(found_infs).sum() > 0
        fb_over = fb_under = False
        if stats is not None:
            # the worst single cast: one layer's clipped gradients count even when the
            # pooled fraction over all layers stays small
            fb_over = max(stats["overflow_frac"], stats.get("max_overflow_frac", 0.0)) > self._overflow_threshold
            fb_under = stats["underflow_frac"] > self._underflow_threshold
        backoff = torch.ones_like(found) if fb_over else found
        old = float(scale.item()) if self._fp8_feedback else math.nan
        grew = self._update_scale(scale, tracker, backoff)
        if self._fp8_feedback:  # host-side decisions (pop() has synchronised already)
            had_inf = bool(found.item())
            if had_inf or fb_over:
                self._ceiling = old
            if self._hidden_inf:
                self.fp8_skips += 1
                self.last_fp8_action = "skip"
            elif had_inf:
                pass  # torch's rule did it all
            elif fb_over:
                self.fp8_backoffs += 1
                self.last_fp8_action = "backoff"
            elif bool(grew.item()):
                self._ceiling = math.inf  # the interval growth probes upward again
            elif fb_under:
                s = float(scale.item())
                g = float(torch.tensor(s * self._growth_factor, dtype=torch.float32))
                if math.isfinite(g) and g <= self._max_scale and g < self._ceiling:
                    scale.fill_(g)
                    tracker.zero_()
                    self.fp8_growths += 1
                    self.last_fp8_action = "grow"
        self._hidden_inf = False
        self._opt_states = defaultdict(_fresh_opt_state)
        self._fb_iter += 1

    def _update_scale(self, scale: torch.Tensor, tracker: torch.Tensor, backoff: torch.Tensor) -> torch.Tensor:
        """torch's rule, as tensor ops (no host sync), products in fp64 rounded once to fp32:
        backoff -> scale*backoff_factor, tracker 0; else tracker+1, and when it reaches
        growth_interval scale*growth_factor (if finite), tracker 0. Returns "grew"."""
        s64 = scale.double()
        succ = tracker + 1
        at_interval = (~backoff) & (succ >= self._growth_interval)
        grown = (s64 * self._growth_factor).float()
        grew = at_interval & torch.isfinite(grown)
        new = torch.where(backoff, (s64 * self._backoff_factor).float(), torch.where(grew, grown, scale))
        scale.copy_(new)
        tracker.copy_(torch.where(backoff | at_interval, torch.zeros_like(succ), succ))
        return grew

    # ---- accessors ------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = _check_growth_factor(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = _check_backoff_factor(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = _check_growth_interval(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def is_enabled(self) -> bool:
        return self._enabled

    # ---- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """torch's five entries (so torch.amp.GradScaler can load it) plus the FP8 feedback
        settings and counters; {} when disabled. Call it after update()."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "fp8_feedback": self._fp8_feedback,
            "overflow_threshold": self._overflow_threshold,
            "underflow_threshold": self._underflow_threshold,
            "max_scale": self._max_scale,
            "fp8_feedback_interval": self._fb_interval,
            "fp8_feedback_iter": self._fb_iter,
            "fp8_ceiling": self._ceiling,
            "fp8_backoffs": self.fp8_backoffs,
            "fp8_growths": self.fp8_growths,
            "fp8_skips": self.fp8_skips,
            "last_fp8_stats": None if self.last_fp8_stats is None else dict(self.last_fp8_stats),
            "last_fp8_action": self.last_fp8_action,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load state_dict() output, or a torch.amp.GradScaler state dict (the FP8 counters
        then start fresh and the feedback settings stay this scaler's). No-op when disabled."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("FP8GradScaler.load_state_dict: the state dict is empty (saved from a disabled "
                               "scaler?)")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
                   if k not in state_dict]
        if missing:
            raise KeyError(f"FP8GradScaler.load_state_dict: missing keys {missing}")
        sc = _check_init_scale(state_dict["scale"])
        gf = _check_growth_factor(state_dict["growth_factor"])
        bf = _check_backoff_factor(state_dict["backoff_factor"])
        gi = _check_growth_interval(int(state_dict["growth_interval"]))
        self._init_scale, self._growth_factor, self._backoff_factor, self._growth_interval = sc, gf, bf, gi
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None and self._growth_tracker is not None:
            self._scale.fill_(sc)
            self._growth_tracker.fill_(self._init_growth_tracker)
        if "fp8_feedback" in state_dict:
            self._fp8_feedback = bool(state_dict["fp8_feedback"])
            self._overflow_threshold = _check_fraction("overflow_threshold", state_dict["overflow_threshold"], True)
            self._underflow_threshold = _check_fraction("underflow_threshold", state_dict["underflow_threshold"],
                                                        False)
            self._max_scale = float(state_dict["max_scale"])
            self._fb_interval = _check_feedback_interval(state_dict.get("fp8_feedback_interval", 1))
            self._fb_iter = int(state_dict.get("fp8_feedback_iter", 0))
            self._ceiling = float(state_dict["fp8_ceiling"])
            self.fp8_backoffs = int(state_dict["fp8_backoffs"])
            self.fp8_growths = int(state_dict["fp8_growths"])
            self.fp8_skips = int(state_dict.get("fp8_skips", 0))
            st = state_dict.get("last_fp8_stats")
            self.last_fp8_stats = None if st is None else dict(st)
            self.last_fp8_action = state_dict.get("last_fp8_action")
        else:
            self._ceiling = math.inf
            self.fp8_backoffs = self.fp8_growths = self.fp8_skips = 0
            self.last_fp8_stats = self.last_fp8_action = None
        if not self._fp8_feedback:
            self.close()

    def __getstate__(self) -> dict:
        if self._enabled and any(st["stage"] is not _Stage.READY or st["found_inf_per_device"]
                                 for st in self._opt_states.values()):
            raise RuntimeError("FP8GradScaler can only be pickled between update() and the next scale()")
        state = self.__dict__.copy()
        state["_init_scale"] = self.get_scale() if self._enabled else self._init_scale
        state["_init_growth_tracker"] = self._get_growth_tracker()
        state["_scale"] = state["_growth_tracker"] = None
        state["_stats"] = grad_stats.GradStats()  # the copy collects on its own from its first scale()
        state["_opt_states"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._opt_states = defaultdict(_fresh_opt_state)

    def __repr__(self) -> str:
        return (f"FP8GradScaler(scale={self.get_scale()}, growth_factor={self._growth_factor}, "
                f"backoff_factor={self._backoff_factor}, growth_interval={self._growth_interval}, "
                f"enabled={self._enabled}, fp8_feedback={self._fp8_feedback})")
