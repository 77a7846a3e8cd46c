"""What the demo counts while a run trains: bytes saved for backward, and FP8 casts that
overflowed or underflowed.

The FP8 counts come from fp8mix.numerics.quant_stats (the C kernel fp8mix_quant_stats),
the one place that decides what a cast lost: ``overflow`` = finite values beyond the
format's range after scaling (what a saturating cast clips), ``underflow`` = finite
non-zero values that became 0.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

import fp8mix
from fp8mix.numerics import QuantStats, quant_stats
from fp8mix.recipe import BlockScaling, role_format

from .variants import fp8_recipe

__all__ = ["SavedBytes", "CastCounter", "ROLES"]

ROLES = ("input", "weight", "grad_output")


class SavedBytes:
    """saved_tensors_hooks that add up the bytes autograd keeps for backward (unique
    storages; parameters themselves excluded, since they exist anyway)."""

    def __init__(self, model: nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in self.params:
                self.seen[ptr] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. wrappers)
            pass
        return t

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @property
    def mib(self) -> float:
        return sum(self.seen.values()) / 2 ** 20


def _cast_stats(x: torch.Tensor, fmt, scale, granularity: str) -> QuantStats:
    """quant_stats of `x`'s saturating cast to `fmt` (scale None: current scaling)."""
    x = x.detach()
    x = x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)
    return quant_stats(x, fp8mix.quantize(x, fmt, scale, granularity=granularity))


class CastCounter:
    """FP8 overflow/underflow bookkeeping of one run.

    - ``saturated_casts`` (delayed scaling, every step): casts whose recorded amax, cast
      with the scale the layer used, is out of the format's range (some element
      saturated). Counted per layer and role from the layers' fp8_amax_history and
      fp8_scale, after each step.
    - ``sampled`` (every sample step): each layer's input, weight and grad_output is cast
      again with fp8mix.quantize using the scale the layer used (current/block recipes: its
      own amax) and its elements are counted (overflow, underflow as in the module docstring).
    """

    def __init__(self, model: nn.Module, name: str):
        self.recipe = fp8_recipe(name)
        self.delayed = name == "fp8-delayed"
        self.block = isinstance(self.recipe, BlockScaling)
        self.layers: list = [m for m in model.modules() if isinstance(m, fp8mix.Linear)
                       and min(m.in_features, m.out_features) >= fp8mix.Linear.fp8_min_features]
        self.saturated_casts = 0
        self.casts = 0
        self.sampled = {r: {"numel": 0, "overflow": 0, "underflow": 0} for r in ROLES}
        self._before: list = []
        self._handles: list = []

    def before_step(self, sample: bool) -> None:
        """Snapshot scales/step counts; with `sample`, hook this step's casts."""
        if self.delayed:
            self._before = [(m.fp8_scale.clone(), m.fp8_steps.clone()) for m in self.layers]
        if sample:
            for m in self.layers:
                self._handles.append(m.register_forward_pre_hook(self._pre_hook))
                self._handles.append(m.register_forward_hook(self._post_hook))

    def after_step(self) -> None:
        """Count saturated casts of the step just run and remove the sampling hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if not self.delayed:
            return
        for m, (scale, steps) in zip(self.layers, self._before):
            for r, role in enumerate(ROLES):
                if int(m.fp8_steps[r]) == int(steps[r]) or int(steps[r]) == 0:
                    continue  # not cast this step, or first cast (scaled from its own amax)
                self.casts += 1
                fmt = role_format(self.recipe.fp8_format, role)
                st = _cast_stats(m.fp8_amax_history[0, r].reshape(1), fmt, scale[r].reshape(()), "tensor")
                if st.overflow + st.nonfinite > 0:
                    self.saturated_casts += 1  # the largest element was out of range: saturated

    @contextlib.contextmanager
    def saving(self):
        """Around model.state_dict(): fp8mix.Linear records the pending grad_output amaxes
        there (otherwise the next forward would), so count those casts as after_step does."""
        if not self.delayed:
            yield
            return
        self.before_step(False)
        try:
            yield
        finally:
            self.after_step()

    def _count(self, m, role: str, r: int, x: torch.Tensor) -> None:
        fmt = role_format(self.recipe.fp8_format, role)
        gran = ("block2d" if role == "weight" else "block") if self.block else "tensor"
        scale = m.fp8_scale[r].reshape(()) if self.delayed and int(m.fp8_steps[r]) > 0 else None
        st = _cast_stats(x, fmt, scale, gran)
        c = self.sampled[role]
        c["numel"] += int(st.numel)
        c["overflow"] += int(st.overflow)
        c["underflow"] += int(st.underflow)

    def _pre_hook(self, m, args):
        self._count(m, "input", 0, args[0])
        self._count(m, "weight", 1, m.weight)

    def _post_hook(self, m, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: self._count(m, "grad_output", 2, g))

    def state(self) -> dict:
        """The counts, for a checkpoint."""
        return {"saturated_casts": self.saturated_casts, "casts": self.casts, "sampled": self.sampled}

    def load_state(self, s: dict) -> None:
        self.saturated_casts, self.casts, self.sampled = s["saturated_casts"], s["casts"], s["sampled"]

    def summary(self) -> dict:
        """The counts, plus percentages of sampled elements."""
        s: dict = {"saturated_casts": self.saturated_casts if self.delayed else None,
                   "casts_checked": self.casts if self.delayed else None, "sampled": {}}
        for role, c in self.sampled.items():
            n = max(c["numel"], 1)
            s["sampled"][role] = dict(c, overflow_pct=100.0 * c["overflow"] / n,
                                      underflow_pct=100.0 * c["underflow"] / n)
        tot = {k: sum(c[k] for c in self.sampled.values()) for k in ("numel", "overflow", "underflow")}
        s["sampled_overflow_pct"] = 100.0 * tot["overflow"] / max(tot["numel"], 1)
        s["sampled_underflow_pct"] = 100.0 * tot["underflow"] / max(tot["numel"], 1)
        return s
