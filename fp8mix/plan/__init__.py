"""fp8mix.plan: which layers FP8 hurts, a per-layer precision plan, gradual adoption, fallback.

    search_plan     measure each linear layer's FP8 sensitivity on a few batches and choose
                    per layer: a recipe and formats, or "keep" (high precision) (search.py)
    Plan            the decisions with their numbers and reasons; table, JSON, apply (plan.py)
    ProgressiveFP8  move planned layers into FP8 over the first steps, least sensitive first
                    (progressive.py)
    FP8Guard        watch the numerics monitor and move a layer that goes bad back to high
                    precision or a safer recipe (guard.py)

Recipes' JSON form is recipes.py; the measurement passes are measure.py. Nothing here
changes how a module computes: plans act through the per-module policy attributes
(``fp8_enabled``, ``fp8_recipe``) of fp8mix.nn.fp8_state.
"""
from .guard import GUARD_DEFAULTS, FP8Guard, FP8GuardWarning
from .plan import LayerPlan, Plan
from .progressive import ProgressiveFP8
from .recipes import default_candidates, recipe_from_json, recipe_to_json
from .search import DEFAULT_BUDGET, SQNR_LIMIT_DB, search_plan

__all__ = ["search_plan", "Plan", "LayerPlan", "ProgressiveFP8", "FP8Guard", "FP8GuardWarning", "GUARD_DEFAULTS",
           "DEFAULT_BUDGET", "SQNR_LIMIT_DB", "default_candidates", "recipe_to_json", "recipe_from_json"]
