"""Recipes as JSON objects, and the planner's default candidates.

A recipe is written as ``{"type": "DelayedScaling", <field>: <value>, ...}`` with every
dataclass field of the recipe: formats by name (``"HYBRID"``), ``rounding`` as a dict
role -> mode, ``auto`` as a dict of fp8mix.auto_format.AutoFormat's fields. Fields that
only exist for Transformer Engine's spelling and are normalised away (``use_power_2_scales``,
``scaling_factor_compute_algo``) are left out. A callable ``amax_compute_algo`` has no JSON
form: such a recipe cannot be saved (ValueError naming the field).

Not here: the plan itself (plan.py) and how candidates are measured (measure.py).
"""
from __future__ import annotations

import dataclasses
import types

from ..auto_format import AutoFormat
from ..formats import Format
from ..recipe import RECIPES, BlockScaling, CurrentScaling, DelayedScaling

__all__ = ["recipe_to_json", "recipe_from_json", "default_candidates", "recipe_label"]

_SKIP = ("use_power_2_scales", "scaling_factor_compute_algo")
_BY_NAME = {cls.__name__: cls for cls in RECIPES}


def default_candidates() -> dict:
    """label -> recipe: HYBRID delayed scaling (Transformer Engine's default, history 16 as
    the stability suite uses), HYBRID current per-tensor scaling, and 1x128 block scaling."""
    return {"delayed": DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16),
            "current": CurrentScaling(fp8_format=Format.HYBRID),
            "block": BlockScaling()}


def recipe_label(recipe) -> str:
    """A short human name: 'delayed HYBRID', 'block E4M3', ..."""
    kind = {"DelayedScaling": "delayed", "CurrentScaling": "current", "BlockScaling": "block",
            "RowwiseScaling": "rowwise", "MXFP8BlockScaling": "mx"}[type(recipe).__name__]
    return f"{kind} {recipe.fp8_format.name}"


def recipe_to_json(recipe) -> dict:
    """The JSON object of an fp8mix recipe (see the module docstring)."""
    if not isinstance(recipe, RECIPES):
        raise TypeError(f"fp8mix.plan: expected an fp8mix.recipe object, got {type(recipe).__name__}")
    out: dict = {"type": type(recipe).__name__}
    for f in dataclasses.fields(recipe):
        if f.name in _SKIP:
            continue
        v = getattr(recipe, f.name)
        if isinstance(v, Format):
            v = v.name
        elif isinstance(v, types.MappingProxyType):
            v = dict(v)
        elif isinstance(v, AutoFormat):
            v = dataclasses.asdict(v)
        elif callable(v):
            raise ValueError(f"fp8mix.plan: {type(recipe).__name__}.{f.name} is a callable, which has no JSON "
                             "form; use 'max' or 'most_recent' in a plan that is saved")
        out[f.name] = v
    return out


def recipe_from_json(obj: dict):
    """The recipe written by :func:`recipe_to_json` (ValueError naming what is wrong)."""
    if not isinstance(obj, dict) or obj.get("type") not in _BY_NAME:
        got = obj.get("type") if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"fp8mix.plan: a recipe must be an object with 'type' one of {sorted(_BY_NAME)}, got {got!r}")
    cls = _BY_NAME[obj["type"]]
    fields = {k: v for k, v in obj.items() if k != "type"}
    if isinstance(fields.get("fp8_format"), str):
        try:
            fields["fp8_format"] = Format[fields["fp8_format"]]
        except KeyError:
            raise ValueError(f"fp8mix.plan: unknown fp8_format {fields['fp8_format']!r} in a recipe") from None
    if isinstance(fields.get("auto"), dict):
        fields["auto"] = AutoFormat(**fields["auto"])
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"fp8mix.plan: bad recipe {obj!r}: {exc}") from None
