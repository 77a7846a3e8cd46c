"""fp8mix.FP8Guard: move a layer whose FP8 casts go bad back to high precision (or first
to a safer recipe), with a warning naming the layer and the signal.

It reads the rows an :class:`fp8mix.Monitor` records on its sampled steps (so it reacts
within ``patience`` samples, i.e. ``patience * monitor.every`` steps) and, once per
optimizer step, decides. Signals, per layer and sampled step, over its casts (input,
weight, grad_output):

    overflow    overflow_frac > overflow_frac (values clipped at the format's max: the
                scale lags a spike, delayed scaling's failure)
    underflow   underflow_frac > underflow_frac (values flushed to 0: an outlier or a
                stale spike in the amax history pushes the rest below the range)
    sqnr        sqnr_db < sqnr_db (the cast lost the tensor, whatever the cause)

A layer with a signal on ``patience`` consecutive samples is moved; a loss spike (the
step's loss above ``loss_spike`` times the median of the last ``loss_window`` losses)
moves at once the layer whose latest sample is worst relative to the thresholds, if any
is at least half-way there (no such layer: the spike is noted, nothing moves: it was not
FP8's doing). Moving means: to ``fallback`` (a recipe) if one is given and the layer is
not on it yet -- its FP8 state starts fresh -- else to high precision (``fp8_enabled =
False``; its forward is then nn.Linear's). Every decision is kept (:attr:`decisions`,
:meth:`report`) and in :meth:`state_dict`.

Default thresholds, from the stability suite (benchmarks/stability/exp11_guard.py and
docs/stability.md section 11): on clean GPT runs under HYBRID delayed scaling (200 steps,
every 2nd step sampled) the typical casts lose almost nothing (overflow under 0.3%,
underflow under 0.4%, SQNR above 25 dB forward, above 12 dB for gradients), but single
samples dip: a gradient spike clipped by the lagging scale drops that cast's SQNR to 3.6 dB,
an early activation overflows 1.6%. Such dips never lasted two samples, hence ``patience=2``
with thresholds outside the typical range (overflow 1%, underflow 10%, SQNR 8 dB). The
injected spiking layer crosses them on every sample (underflow 100% between spikes).

Not here: the monitor's own warnings (fp8mix.monitor.alerts: one sample, no action).
"""
from __future__ import annotations

import math
import statistics
import warnings
from typing import Any, Optional

import torch.nn as nn

from ..recipe import RECIPES
from .plan import fp8_layers
from .recipes import recipe_from_json, recipe_label, recipe_to_json

__all__ = ["FP8Guard", "FP8GuardWarning", "GUARD_DEFAULTS"]

GUARD_DEFAULTS: dict = {"overflow_frac": 0.01, "underflow_frac": 0.10, "sqnr_db": 8.0, "patience": 2, "loss_spike": 2.0,
                  "loss_window": 20}
_STATE_VERSION = 1


class FP8GuardWarning(UserWarning):
    """fp8mix.FP8Guard moved a layer out of its FP8 recipe."""


def _fraction(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"fp8mix.FP8Guard: {name} must be a fraction in [0, 1], got {v!r}")
    return float(v)


def _count(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"fp8mix.FP8Guard: {name} must be an int >= {lo}, got {v!r}")
    return v


class FP8Guard:
    """Watches `monitor`'s records of `model`'s fp8mix layers; call :meth:`step` once per
    optimizer step, after ``monitor.step()`` (the module docstring lists the signals).

    Args:
        model: the converted model (its fp8mix layers are named by module path, as
            ``monitor.attach(model)`` names them; the guard attaches the monitor itself).
        monitor: the fp8mix.Monitor the training loop passes to fp8_autocast.
        overflow_frac, underflow_frac: fractions of a cast's non-zero values.
        sqnr_db: a cast below this many dB is a signal.
        patience: consecutive signalling samples before a layer is moved.
        loss_spike: a loss this many times the recent median is a spike (None: no loss rule).
        loss_window: losses the median is over (the rule waits until 5 are in).
        fallback: a recipe to try before high precision (None: straight to high precision).
        warn: emit FP8GuardWarning on every move (decisions are recorded either way).
    """

    def __init__(self, model: nn.Module, monitor, *, overflow_frac: float = GUARD_DEFAULTS["overflow_frac"],
                 underflow_frac: float = GUARD_DEFAULTS["underflow_frac"], sqnr_db: float = GUARD_DEFAULTS["sqnr_db"],
                 patience: int = GUARD_DEFAULTS["patience"], loss_spike: Optional[float] = GUARD_DEFAULTS["loss_spike"],
                 loss_window: int = GUARD_DEFAULTS["loss_window"], fallback=None, warn: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"fp8mix.FP8Guard expects an nn.Module, got {type(model).__name__}")
        if not (callable(getattr(monitor, "attach", None)) and hasattr(monitor, "records")):
            raise TypeError(f"fp8mix.FP8Guard: monitor must be an fp8mix.Monitor, got {type(monitor).__name__}")
        if fallback is not None and not isinstance(fallback, RECIPES):
            raise TypeError("fp8mix.FP8Guard: fallback must be an fp8mix recipe or None, got "
                            f"{type(fallback).__name__}")
        if isinstance(sqnr_db, bool) or not isinstance(sqnr_db, (int, float)) or math.isnan(sqnr_db):
            raise ValueError(f"fp8mix.FP8Guard: sqnr_db must be a number, got {sqnr_db!r}")
        if loss_spike is not None and (isinstance(loss_spike, bool) or not isinstance(loss_spike, (int, float))
                                       or not loss_spike > 1.0):
            raise ValueError(f"fp8mix.FP8Guard: loss_spike must be a number > 1 or None, got {loss_spike!r}")
        self.layers = fp8_layers(model)
        if not self.layers:
            raise ValueError("fp8mix.FP8Guard: the model has no fp8mix layer (convert it first)")
        monitor.attach(model)
        self.monitor = monitor
        self.overflow_frac = _fraction("overflow_frac", overflow_frac)
        self.underflow_frac = _fraction("underflow_frac", underflow_frac)
        self.sqnr_db = float(sqnr_db)
        self.patience = _count("patience", patience, 1)
        self.loss_spike = None if loss_spike is None else float(loss_spike)
        self.loss_window = _count("loss_window", loss_window, 5)
        self.fallback = fallback
        if not isinstance(warn, bool):
            raise TypeError("fp8mix.FP8Guard: warn must be a bool")
        self.warn = warn
        self._next = 0  # first monitor step not read yet
        self._bad: dict = {}  # layer -> consecutive signalling samples
        self._stage: dict = {}  # layer -> "fallback" | "high" (absent: as planned)
        self._losses: list = []
        self._latest: dict = {}  # layer -> (severity, signal dict) of its latest sample
        self.decisions: list = []

    # ---- reading the monitor -------------------------------------------------------
    def _signals(self, row: dict) -> list:
        """(signal, value, threshold, severity) of one record; severity = how far past (>1)."""
        out = []
        if row["overflow_frac"] > 0 and self.overflow_frac < 1:
            out.append(("overflow", row["overflow_frac"], self.overflow_frac,
                        row["overflow_frac"] / max(self.overflow_frac, 1e-12)))
        if row["underflow_frac"] > 0 and self.underflow_frac < 1:
            out.append(("underflow", row["underflow_frac"], self.underflow_frac,
                        row["underflow_frac"] / max(self.underflow_frac, 1e-12)))
        sq = row["sqnr_db"]
        if math.isfinite(sq) and self.sqnr_db > -math.inf:
            out.append(("sqnr", sq, self.sqnr_db, 2.0 ** ((self.sqnr_db - sq) / 3.0)))  # 3 dB under: twice as bad
        return out

    def _read(self) -> dict:
        """{layer: [(severity, signal dict)]} of the records since the last call, by sampled step."""
        by_layer: dict = {}
        last = self._next - 1
        for row in self.monitor.records:
            if row["step"] < self._next or row["layer"] not in self.layers:
                continue
            last = max(last, row["step"])
            for sig, value, thr, sev in self._signals(row):
                entry = (sev, {"signal": sig, "role": row["role"], "value": value, "threshold": thr,
                               "step": row["step"]})
                by_layer.setdefault(row["layer"], {}).setdefault(row["step"], []).append(entry)
        self._next = last + 1
        return by_layer

    # ---- deciding --------------------------------------------------------------------
    def step(self, loss=None) -> list:
        """Read the new samples (and `loss`, a float or scalar tensor, for the spike rule);
        move the layers that went bad. Returns this call's new decisions."""
        new = []
        for layer, steps in self._read().items():
            for step in sorted(steps):
                worst = max(steps[step], key=lambda e: e[0])
                self._latest[layer] = worst
                if worst[0] > 1.0:  # (a layer in high precision casts nothing: it has no records)
                    self._bad[layer] = self._bad.get(layer, 0) + 1
                else:
                    self._bad[layer] = 0
                if self._bad[layer] >= self.patience:
                    new.append(self._move(layer, worst[1], why=f"{self.patience} sample(s) in a row"))
        if loss is not None:
            new += self._loss_rule(float(loss))
        return new

    def _loss_rule(self, loss: float) -> list:
        hist = self._losses
        out = []
        if self.loss_spike is not None and len(hist) >= 5 and math.isfinite(loss):
            med = statistics.median(hist)
            if med > 0 and loss > self.loss_spike * med:
                live = {n: v for n, v in self._latest.items() if self._stage.get(n) != "high"}
                suspect = max(live.items(), key=lambda kv: kv[1][0], default=None)
                if suspect is not None and suspect[1][0] > 0.5:
                    sig = dict(suspect[1][1], loss=loss, loss_median=med)
                    out.append(self._move(suspect[0], sig, why=f"loss spike {loss:.4g} > {self.loss_spike:g} x "
                                                                f"median {med:.4g}"))
                else:
                    self.decisions.append({"step": self.monitor.global_step, "layer": None, "signal": "loss_spike",
                                           "value": loss, "threshold": self.loss_spike * med,
                                           "action": "none (no FP8 layer near a threshold)"})
        if math.isfinite(loss):
            hist.append(loss)
            del hist[: max(0, len(hist) - self.loss_window)]
        return out

    def _move(self, layer: str, sig: dict, why: str) -> dict:
        m = self.layers[layer]
        if self.fallback is not None and layer not in self._stage:
            m.fp8_recipe = self.fallback
            m.reset_fp8_state()
            self._stage[layer] = "fallback"
            action = f"recipe {recipe_label(self.fallback)}"
        else:
            m.fp8_enabled = False
            self._stage[layer] = "high"
            action = "high precision"
        self._bad[layer] = 0
        self._latest.pop(layer, None)
        d = {"step": self.monitor.global_step, "layer": layer, "action": action, "why": why, **sig}
        self.decisions.append(d)
        if self.warn:
            warnings.warn(f"fp8mix.FP8Guard: layer {layer!r} moved to {action} at step {d['step']}: "
                          f"{sig.get('role')} {sig['signal']} {sig['value']:.4g} (threshold {sig['threshold']:.4g}; "
                          f"{why})", FP8GuardWarning, stacklevel=3)
        return d

    # ---- reporting and state ---------------------------------------------------------------
    @property
    def moved(self) -> dict:
        """{layer: "fallback" | "high"} of the layers the guard has moved."""
        return dict(self._stage)

    def report(self) -> str:
        """One line per decision (or a line saying there was none)."""
        if not self.decisions:
            return "fp8mix.FP8Guard: no layer moved (no signal beyond the thresholds)"
        lines = [f"fp8mix.FP8Guard: {len(self._stage)} layer(s) moved"]
        for d in self.decisions:
            where = d["layer"] or "-"
            lines.append(f"  step {d['step']}: {where}: {d['action']} ({d.get('role', '')} {d['signal']} "
                         f"{d['value']:.4g}, threshold {d['threshold']:.4g}{'; ' + d['why'] if 'why' in d else ''})")
        return "\n".join(lines)

    def state_dict(self) -> dict:
        """Plain Python objects: what the guard read, counted and decided."""
        return {"version": _STATE_VERSION, "next_step": self._next, "bad": dict(self._bad),
                "stage": dict(self._stage), "losses": list(self._losses),
                "latest": {k: [v[0], dict(v[1])] for k, v in self._latest.items()},
                "decisions": [dict(d) for d in self.decisions],
                "fallback": None if self.fallback is None else recipe_to_json(self.fallback)}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` and put its moves back on the model."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("fp8mix.FP8Guard.load_state_dict: not an FP8Guard state_dict")
        unknown = [n for n in state["stage"] if n not in self.layers]
        if unknown:
            raise ValueError(f"fp8mix.FP8Guard.load_state_dict: the model has no fp8mix layer {unknown}")
        self._next = int(state["next_step"])
        self._bad = {k: int(v) for k, v in state["bad"].items()}
        self._stage = dict(state["stage"])
        self._losses = [float(v) for v in state["losses"]]
        self._latest = {k: (float(v[0]), dict(v[1])) for k, v in state["latest"].items()}
        self.decisions = [dict(d) for d in state["decisions"]]
        fallback: Any = None if state.get("fallback") is None else recipe_from_json(state["fallback"])
        for name, stage in self._stage.items():
            m = self.layers[name]
            if stage == "high":
                m.fp8_enabled = False
            else:
                m.fp8_recipe = fallback
