"""fp8mix.ProgressiveFP8: adopt a plan gradually -- the planned FP8 layers enter FP8 one
after another over the first ``warmup_steps`` steps, least sensitive first ("start small,
increase the FP8 share step by step, and watch the training closely").

Order: the plan's FP8 layers by predicted cost (LayerPlan.cost), then by their output SQNR
under the chosen recipe (higher first), then by name. Layer k of n enters at step
``floor(k * warmup_steps / n)``: the first at step 0, all of them by ``warmup_steps``. Until
it enters, a layer runs in high precision (``fp8_enabled = False``) and its FP8 state is
untouched, so it enters with the fresh state it was converted with (its first cast scales
by its own amax). Layers the plan keeps never
enter. A layer an :class:`fp8mix.FP8Guard` has moved stays where the guard put it.

Call :meth:`step` once per optimizer step; :meth:`state_dict` / :meth:`load_state_dict`
resume the schedule exactly (with the model's and the optimizer's own state_dicts).
"""
from __future__ import annotations

import math
from typing import Optional

import torch.nn as nn

from .plan import Plan, fp8_layers

__all__ = ["ProgressiveFP8"]

_STATE_VERSION = 1


class ProgressiveFP8:
    """Moves `plan`'s FP8 layers of `model` into FP8 over `warmup_steps` steps (see the
    module docstring). Applies the plan to `model` (converting it when needed).

    Args:
        model: the model the plan was made for.
        plan: an fp8mix.Plan.
        warmup_steps: steps over which the layers enter (0: all at once).
        guard: an fp8mix.FP8Guard whose moves the schedule leaves alone (optional).
    """

    def __init__(self, model: nn.Module, plan: Plan, warmup_steps: int = 100, *, guard=None):
        if not isinstance(plan, Plan):
            raise TypeError(f"fp8mix.ProgressiveFP8: plan must be an fp8mix.Plan, got {type(plan).__name__}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"fp8mix.ProgressiveFP8: warmup_steps must be an int >= 0, got {warmup_steps!r}")
        if guard is not None and not hasattr(guard, "moved"):
            raise TypeError(f"fp8mix.ProgressiveFP8: guard must be an fp8mix.FP8Guard, got {type(guard).__name__}")
        plan.apply(model)
        self.layers = fp8_layers(model)
        self.plan, self.warmup_steps, self.guard = plan, warmup_steps, guard
        fp8 = [plan.layer(n) for n in plan.fp8]
        self.order = [lp.name for lp in sorted(fp8, key=lambda lp: (lp.cost, -_sqnr(lp), lp.name))]
        n = len(self.order)
        self.enter_at = {name: (k * warmup_steps) // n for k, name in enumerate(self.order)}
        self._step = 0
        self.events: list = []  # {"step", "layer"} per layer that entered FP8
        self._in: set = set()
        for name in self.order:
            self.layers[name].fp8_enabled = False
        self._apply()

    @property
    def global_step(self) -> int:
        return self._step

    @property
    def in_fp8(self) -> list:
        """The layers the schedule has put in FP8 so far (in entering order)."""
        return [n for n in self.order if n in self._in]

    @property
    def fp8_flop_share(self) -> float:
        """FP8 share of GEMM FLOPs now (layers the guard moved to high precision do not count)."""
        moved = self.guard.moved if self.guard is not None else {}
        return self.plan.flop_share([n for n in self._in if moved.get(n) != "high"])

    def step(self) -> list:
        """Advance one step; returns the layers that entered FP8 now."""
        self._step += 1
        return self._apply()

    def _apply(self) -> list:
        moved = self.guard.moved if self.guard is not None else {}
        entered = []
        for name in self.order:
            if name in moved:
                continue
            due = self.enter_at[name] <= self._step
            m = self.layers[name]
            if due and name not in self._in:
                # no reset_fp8_state(): a layer that never cast has a fresh state already, and a
                # resumed run's loaded state (its random-stream key included) must stay as saved
                m.fp8_enabled = True
                self._in.add(name)
                entered.append(name)
                self.events.append({"step": self._step, "layer": name})
            elif not due:
                m.fp8_enabled = False
        return entered

    def state_dict(self) -> dict:
        return {"version": _STATE_VERSION, "step": self._step, "order": list(self.order),
                "enter_at": dict(self.enter_at), "in_fp8": sorted(self._in), "events": [dict(e) for e in self.events]}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` made for the same plan (another order is a ValueError)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("fp8mix.ProgressiveFP8.load_state_dict: not a ProgressiveFP8 state_dict")
        if list(state["order"]) != self.order or dict(state["enter_at"]) != self.enter_at:
            raise ValueError("fp8mix.ProgressiveFP8.load_state_dict: the state is for another plan or warmup_steps "
                             f"(order {state['order']} vs {self.order})")
        self._step = int(state["step"])
        self._in = set(state["in_fp8"])
        self.events = [dict(e) for e in state["events"]]
        moved = self.guard.moved if self.guard is not None else {}
        for name in self.order:
            if name not in moved:
                self.layers[name].fp8_enabled = name in self._in


def _sqnr(lp) -> float:
    v: Optional[float] = lp.output_sqnr_db.get("plan")
    return v if v is not None and math.isfinite(v) else -math.inf
