"""fp8mix.Plan: JSON round trip with its documented keys, apply() against nn.Linear and
against the per-module policy done by hand, and refused input."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn as nn
from plan_models import MLP, batches, loss_fn

import fp8mix
from fp8mix.plan import LayerPlan, Plan, search_plan
from fp8mix.plan.recipes import recipe_from_json, recipe_to_json
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

TOP_KEYS = {"format", "version", "metric", "budget", "loss_hp", "loss_all_fp8", "predicted_increase",
            "measured_increase", "fp8_flop_share", "passes", "candidates", "notes", "layers"}
LAYER_KEYS = {"name", "decision", "candidate", "recipe", "formats", "flops", "cost", "solo_increase", "keep_gain",
              "output_sqnr_db", "grad_sqnr_db", "reason", "smooth", "channel_spread", "outlier_channels"}


@pytest.fixture(scope="module")
def plan():
    torch.manual_seed(0)
    return search_plan(MLP(planted=True), batches(3), loss_fn)


def test_json_round_trip_keeps_every_field(plan, tmp_path):
    path = plan.save(tmp_path / "plan.json")
    doc = json.load(open(path))  # standard JSON: no NaN literals
    assert set(doc) == TOP_KEYS and doc["format"] == "fp8mix.plan" and doc["version"] == 1
    assert all(set(layer) == LAYER_KEYS for layer in doc["layers"])
    back = Plan.load(path)
    assert back.to_json() == plan.to_json()
    assert [lp.recipe for lp in back.layers] == [lp.recipe for lp in plan.layers]
    assert math.isnan(back.layer("head").solo_increase)  # "nan" strings come back as floats
    assert back.table() == plan.table()


@pytest.mark.parametrize("recipe", [
    DelayedScaling(), DelayedScaling(fp8_format=fp8mix.Format.E4M3, amax_history_len=16, margin=1,
                                     amax_compute_algo="most_recent", rounding={"grad": "stochastic"}),
    CurrentScaling(fp8_format=fp8mix.Format.AUTO, power_2_scale=True), BlockScaling(amax_epsilon=1e-6),
])
def test_recipes_round_trip(recipe):
    obj = recipe_to_json(recipe)
    assert json.loads(json.dumps(obj)) == obj
    assert recipe_from_json(obj) == recipe


def test_a_callable_recipe_field_cannot_be_saved():
    with pytest.raises(ValueError, match="amax_compute_algo"):
        recipe_to_json(DelayedScaling(amax_compute_algo=lambda h: h.max()))


def test_apply_sets_the_policy_and_matches_hand_set_policy(plan):
    torch.manual_seed(5)
    base = MLP(planted=True)
    a, b = copy.deepcopy(base), fp8mix.convert_model(copy.deepcopy(base))
    plan.apply(a)  # converts a plain model first
    assert isinstance(a.fc1, fp8mix.Linear) and a.fc1.fp8_enabled and a.fc1.fp8_recipe == plan.layer("fc1").recipe
    assert a.fc2.lin.fp8_enabled is False and a.fc2.lin.fp8_recipe is None
    for lp in plan.layers:  # the same policy by hand
        m = b.get_submodule(lp.name)
        m.fp8_enabled, m.fp8_recipe = lp.decision == "fp8", lp.recipe
    x = batches(1, seed=9)[0][0]
    with fp8mix.fp8_autocast():
        ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    # the kept layer is nn.Linear bit for bit inside the autocast
    ref = nn.Linear(129, 128)
    ref.load_state_dict({k: v for k, v in base.fc2.lin.state_dict().items()})
    h = torch.randn(8, 129)
    with fp8mix.fp8_autocast():
        assert torch.equal(a.fc2.lin(h), ref(h))


def test_apply_refuses_another_model(plan):
    with pytest.raises(ValueError, match="no fp8mix layer named"):
        plan.apply(nn.Sequential(nn.Linear(32, 32)))
    with pytest.raises(TypeError, match="nn.Module"):
        plan.apply("model")


def test_load_refuses_what_is_not_a_plan(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"format": "something"}')
    with pytest.raises(ValueError, match="not an fp8mix plan"):
        Plan.load(p)
    p.write_text('{"format": "fp8mix.plan", "version": 99, "layers": []}')
    with pytest.raises(ValueError, match="version"):
        Plan.load(p)
    p.write_text("not json")
    with pytest.raises(ValueError, match="not JSON"):
        Plan.load(p)
    p.write_text(json.dumps({"format": "fp8mix.plan", "version": 1,
                             "layers": [{"name": "a", "decision": "maybe", "reason": ""}]}))
    with pytest.raises(ValueError, match="decision"):
        Plan.load(p)
    with pytest.raises(ValueError, match="recipe"):
        recipe_from_json({"type": "FastScaling"})


def test_a_layer_in_fp8_needs_a_recipe():
    with pytest.raises(ValueError, match="no recipe"):
        LayerPlan(name="a", decision="fp8", reason="")
