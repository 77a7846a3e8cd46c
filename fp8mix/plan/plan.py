"""fp8mix.Plan: which layers run in FP8 and under which recipe, why, and what was measured.

A plan is data: one :class:`LayerPlan` per linear layer (by module path) and the numbers
of the search that made it. :meth:`Plan.apply` puts it on a model (converting it first
when needed) through the per-module policy attributes every fp8mix module has
(``fp8_enabled``, ``fp8_recipe``: fp8mix.nn.fp8_state), so a plan never changes how a
module computes, only which recipe the autocast gives it.

JSON (``plan.save(path)`` / ``Plan.load(path)``), stable keys of version 1::

    {"format": "fp8mix.plan", "version": 1,
     "metric": "loss" | "sqnr",           what decided (see fp8mix.plan.search)
     "budget": float,                     allowed loss increase, a fraction of loss_hp
     "loss_hp": float,                    mean loss of the search batches, high precision
     "loss_all_fp8": {label: float},      ... with every layer in FP8 under each candidate
     "predicted_increase": float,         sum of the chosen FP8 layers' costs / loss_hp
     "measured_increase": float | null,   (plan loss - high-precision loss) / hp loss on held-out batches
     "fp8_flop_share": float,             GEMM FLOPs (forward + both backward GEMMs) in FP8, of all
     "passes": {"forward": int, "backward": int},   what the search cost
     "candidates": {label: recipe},       fp8mix.plan.recipes' JSON form
     "notes": [str],                      what the search did besides choosing (repairs, ...)
     "layers": [{"name": str, "decision": "fp8" | "keep",
                 "candidate": label | null, "recipe": recipe | null, "formats": {role: "E4M3" | "E5M2"} | null,
                 "flops": float, "cost": float, "solo_increase": float, "keep_gain": float,
                 "output_sqnr_db": {label: float}, "grad_sqnr_db": {label: float}, "reason": str,
                 "smooth": bool,                  per-channel smoothing of the input (fp8_smooth;
                                                  LayerNormMLP: of fc2's, Smooth-SwiGLU)
                 "channel_spread": float,         input's max / median channel amax (first batch)
                 "outlier_channels": int}]}       input channels >= 100x the median (plan.outliers)

"smooth", "channel_spread" and "outlier_channels" are optional when read (False, nan, 0).

Non-finite numbers are written as the strings "inf", "-inf", "nan" (standard JSON) and read back.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

import torch.nn as nn

from ..monitor.export import _json_safe as _safe  # the monitor's strict-JSON rule: non-finite floats as strings
from ..nn.convert import convert_model
from ..nn.fp8_state import FP8StateMixin
from ..nn.layer_order import mark_layer_order
from .recipes import recipe_from_json, recipe_to_json

__all__ = ["Plan", "LayerPlan", "PLAN_FORMAT", "PLAN_VERSION", "fp8_layers"]

PLAN_FORMAT = "fp8mix.plan"
PLAN_VERSION = 1
DECISIONS = ("fp8", "keep")


def fp8_layers(model: nn.Module) -> dict:
    """{module path: module} of every fp8mix module of `model` (a shared module once, by its first name)."""
    out, seen = {}, set()
    for name, m in model.named_modules():
        if isinstance(m, FP8StateMixin) and id(m) not in seen:
            seen.add(id(m))
            out[name or type(model).__name__] = m
    return out


@dataclasses.dataclass
class LayerPlan:
    """The decision for one layer and the numbers behind it (see the module docstring's keys).

    cost: the predicted loss increase of this layer in FP8 (absolute, loss units): the larger
    of solo_increase (only this layer in FP8) and keep_gain (all in FP8 minus all but this
    one), at least 0."""

    name: str
    decision: str
    reason: str
    candidate: Optional[str] = None
    recipe: object = None
    formats: Optional[dict] = None
    flops: float = 0.0
    cost: float = 0.0
    solo_increase: float = math.nan
    keep_gain: float = math.nan
    output_sqnr_db: dict = dataclasses.field(default_factory=dict)
    grad_sqnr_db: dict = dataclasses.field(default_factory=dict)
    smooth: bool = False
    channel_spread: float = math.nan
    outlier_channels: int = 0

    def __post_init__(self):
        if self.decision not in DECISIONS:
            raise ValueError(f"fp8mix.Plan: layer {self.name!r} decision must be one of {DECISIONS}, "
                             f"got {self.decision!r}")
        if self.decision == "fp8" and self.recipe is None:
            raise ValueError(f"fp8mix.Plan: layer {self.name!r} is planned in FP8 but has no recipe")
        if not isinstance(self.smooth, bool):
            raise ValueError(f"fp8mix.Plan: layer {self.name!r} smooth must be a bool, got {self.smooth!r}")

    def to_json(self) -> dict:
        # not dataclasses.asdict: it would deep-copy the recipe's read-only mappings
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["recipe"] = None if self.recipe is None else recipe_to_json(self.recipe)
        for k in ("formats", "output_sqnr_db", "grad_sqnr_db"):
            d[k] = None if d[k] is None else dict(d[k])
        return d

    @classmethod
    def from_json(cls, d: dict) -> "LayerPlan":
        if not isinstance(d, dict) or not all(k in d for k in ("name", "decision", "reason")):
            raise ValueError(f"fp8mix.Plan.load: a layer entry needs 'name', 'decision' and 'reason', got {d!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in _unsafe(d).items() if k in known}
        if fields.get("recipe") is not None:
            fields["recipe"] = recipe_from_json(d["recipe"])
        return cls(**fields)


@dataclasses.dataclass
class Plan:
    """A per-layer precision plan (fp8mix.search_plan makes one; see the module docstring)."""

    layers: list
    metric: str = "loss"
    budget: float = 0.0
    loss_hp: float = math.nan
    loss_all_fp8: dict = dataclasses.field(default_factory=dict)
    predicted_increase: float = math.nan
    measured_increase: Optional[float] = None
    fp8_flop_share: float = math.nan
    passes: dict = dataclasses.field(default_factory=lambda: {"forward": 0, "backward": 0})
    candidates: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)

    # ---- reading ---------------------------------------------------------------------
    def layer(self, name: str) -> LayerPlan:
        for lp in self.layers:
            if lp.name == name:
                return lp
        raise KeyError(f"fp8mix.Plan: no layer {name!r}; the plan has {[lp.name for lp in self.layers]}")

    @property
    def fp8(self) -> list:
        """Names of the layers planned in FP8."""
        return [lp.name for lp in self.layers if lp.decision == "fp8"]

    @property
    def keep(self) -> list:
        """Names of the layers kept in high precision."""
        return [lp.name for lp in self.layers if lp.decision == "keep"]

    def flop_share(self, names) -> float:
        """FP8 share of GEMM FLOPs if exactly the layers `names` ran in FP8."""
        total = sum(lp.flops for lp in self.layers)
        names = set(names)
        return sum(lp.flops for lp in self.layers if lp.name in names) / total if total else 0.0

    # ---- applying --------------------------------------------------------------------
    def apply(self, model: nn.Module) -> nn.Module:
        """Put the plan on `model` in place and return it: convert it when it has no fp8mix
        module yet, then per planned layer set ``fp8_enabled`` and ``fp8_recipe``
        (kept layers: fp8_enabled=False, their forward is nn.Linear's bit for bit), and
        ``fp8_smooth`` where the plan smooths the layer's input.
        A planned layer missing from the model, or a smoothed one that cannot smooth, is a
        ValueError; model layers the plan does not name keep their policy (the autocast's recipe)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"fp8mix.Plan.apply expects an nn.Module, got {type(model).__name__}")
        layers = fp8_layers(model)
        if not layers:
            convert_model(model)
            layers = fp8_layers(model)
        mark_layer_order(model)  # (the whole model's order: NVFP4's default rule for layers the plan leaves)
        missing = [lp.name for lp in self.layers if lp.name not in layers]
        if missing:
            raise ValueError(f"fp8mix.Plan.apply: the model has no fp8mix layer named {missing}; it has "
                             f"{sorted(layers)} (was the plan made for another model?)")
        bad = [lp.name for lp in self.layers if lp.smooth and not hasattr(type(layers[lp.name]), "fp8_smooth")]
        if bad:
            raise ValueError(f"fp8mix.Plan.apply: the plan smooths {bad}, which have no fp8_smooth "
                             "(fp8mix.Linear and LayerNormMLP have it)")
        for lp in self.layers:
            m = layers[lp.name]
            m.fp8_enabled = lp.decision == "fp8"
            m.fp8_recipe = lp.recipe if lp.decision == "fp8" else None
            if lp.smooth or "fp8_smooth" in m.__dict__:
                m.fp8_smooth = lp.decision == "fp8" and lp.smooth
        return model

    # ---- printing --------------------------------------------------------------------
    def table(self) -> str:
        """The plan as a fixed-width text table, then its totals."""
        labels = list(self.candidates) or sorted({k for lp in self.layers for k in lp.output_sqnr_db} - {"plan"})
        labels += ["plan"] if any("plan" in lp.output_sqnr_db for lp in self.layers) else []
        hdr = (f"{'layer':<26} {'decision':<19} {'in/w/grad':<9} {'FLOP%':>6} {'spread':>7} {'cost':>9} {'solo':>9} "
               f"{'keep-gain':>9} "
               + " ".join(f"{'SQNR ' + c[:8]:>13}" for c in labels) + "  reason")
        total = sum(lp.flops for lp in self.layers) or 1.0
        lines = [hdr, "-" * len(hdr)]
        for lp in self.layers:
            dec = f"fp8 {lp.candidate}" if lp.decision == "fp8" else "keep"
            fmts = "-" if not lp.formats else "/".join(lp.formats[r][:2] for r in ("input", "weight", "grad_output"))
            sq = " ".join(f"{lp.output_sqnr_db.get(c, math.nan):>13.1f}" for c in labels)
            spread = "-" if math.isnan(lp.channel_spread) else f"{lp.channel_spread:.3g}"
            lines.append(f"{lp.name:<26.26} {dec:<19.19} {fmts:<9} {100 * lp.flops / total:>6.1f} {spread:>7} "
                         f"{lp.cost:>9.2e} {lp.solo_increase:>9.2e} {lp.keep_gain:>9.2e} {sq}  {lp.reason}")
        lines.append("")
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        meas = "not verified" if self.measured_increase is None else f"{100 * self.measured_increase:+.3f}%"
        all8 = ", ".join(f"{k} {v:.4f}" for k, v in self.loss_all_fp8.items())
        return (f"FP8 layers {len(self.fp8)}/{len(self.layers)}, FP8 share of GEMM FLOPs "
                f"{100 * self.fp8_flop_share:.1f}%; loss increase budget {100 * self.budget:.2f}% of the "
                f"high-precision loss {self.loss_hp:.4f}; predicted {100 * self.predicted_increase:+.3f}%, "
                f"measured on held-out batches {meas}; all-FP8 loss: {all8 or '-'}; search cost "
                f"{self.passes.get('forward', 0)} forward + {self.passes.get('backward', 0)} backward passes"
                + ("".join(f"\nnote: {n}" for n in self.notes)))

    def __str__(self) -> str:
        return self.table()

    # ---- JSON --------------------------------------------------------------------------
    def to_json(self) -> dict:
        return _safe({"format": PLAN_FORMAT, "version": PLAN_VERSION, "metric": self.metric, "budget": self.budget,
                      "loss_hp": self.loss_hp, "loss_all_fp8": dict(self.loss_all_fp8),
                      "predicted_increase": self.predicted_increase, "measured_increase": self.measured_increase,
                      "fp8_flop_share": self.fp8_flop_share, "passes": dict(self.passes),
                      "candidates": {k: recipe_to_json(r) for k, r in self.candidates.items()},
                      "notes": list(self.notes), "layers": [lp.to_json() for lp in self.layers]})

    @classmethod
    def from_json(cls, doc: dict) -> "Plan":
        if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
            raise ValueError(f"fp8mix.Plan.load: not an fp8mix plan (its 'format' must be {PLAN_FORMAT!r})")
        if doc.get("version") != PLAN_VERSION:
            raise ValueError(f"fp8mix.Plan.load: plan version {doc.get('version')!r}, this fp8mix reads "
                             f"{PLAN_VERSION}")
        if not isinstance(doc.get("layers"), list):
            raise ValueError("fp8mix.Plan.load: 'layers' must be a list")
        d = _unsafe(doc)
        return cls(layers=[LayerPlan.from_json(x) for x in doc["layers"]], metric=d.get("metric", "loss"),
                   budget=d.get("budget", 0.0), loss_hp=d.get("loss_hp", math.nan),
                   loss_all_fp8=d.get("loss_all_fp8", {}), predicted_increase=d.get("predicted_increase", math.nan),
                   measured_increase=d.get("measured_increase"), fp8_flop_share=d.get("fp8_flop_share", math.nan),
                   passes=d.get("passes", {"forward": 0, "backward": 0}),
                   candidates={k: recipe_from_json(v) for k, v in doc.get("candidates", {}).items()},
                   notes=list(d.get("notes", [])))

    def save(self, path) -> str:
        """Write the plan as JSON to `path` (str or PathLike) and return the path."""
        path = os.fspath(path)
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
        return path

    @classmethod
    def load(cls, path) -> "Plan":
        """Read a plan written by :meth:`save`."""
        with open(os.fspath(path)) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"fp8mix.Plan.load: {os.fspath(path)!r} is not JSON: {exc}") from None
        return cls.from_json(doc)


_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _unsafe(o):
    """The inverse of _safe for number fields (a name or reason that is literally 'nan' stays:
    only dict values under numeric keys are converted by their callers' types)."""
    if isinstance(o, str) and o in _NONFINITE:
        return _NONFINITE[o]
    if isinstance(o, dict):
        return {k: _unsafe(v) if k not in ("name", "reason", "decision", "candidate", "metric") else v
                for k, v in o.items()}
    if isinstance(o, list):
        return [_unsafe(v) for v in o]
    return o
