"""fp8mix.search_plan: the planted sensitive layer is kept, the rest converted; the measured
numbers against references computed here from float64 and ml_dtypes (not fp8mix); the
model is left as it was; bad input is refused with a clear error."""
from __future__ import annotations

import copy
import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn as nn
from plan_models import MLP, batches, loss_fn

import fp8mix
from fp8mix.plan import search_plan
from fp8mix.recipe import CurrentScaling, DelayedScaling


@pytest.fixture(scope="module")
def planted():
    torch.manual_seed(0)
    model = MLP(planted=True)
    before = copy.deepcopy(model.state_dict())
    plan = search_plan(model, batches(6), loss_fn)
    return model, before, plan


def test_plan_keeps_the_planted_layer_and_converts_the_rest(planted):
    _, _, plan = planted
    assert plan.keep == ["fc2.lin", "head"]  # head: 10 outputs, under fp8mix's 16-feature minimum
    assert plan.fp8 == ["fc1", "fc3"]
    assert "SQNR" in plan.layer("fc2.lin").reason
    assert plan.layer("fc2.lin").output_sqnr_db["plan"] < 10.0  # the inliers are (mostly) flushed
    for name in plan.fp8:
        assert plan.layer(name).output_sqnr_db["plan"] > 25.0
    assert plan.measured_increase is not None and plan.measured_increase <= plan.budget
    assert "fc2.lin" in plan.table() and "keep" in plan.table()


def test_flop_share_counts_the_three_gemms_per_layer(planted):
    _, _, plan = planted
    # every layer sees the 64 rows of a batch: share = in*out of the FP8 layers over all
    sizes = {"fc1": 64 * 128, "fc2.lin": 129 * 128, "fc3": 128 * 128, "head": 128 * 10}
    assert plan.fp8_flop_share == pytest.approx((sizes["fc1"] + sizes["fc3"]) / sum(sizes.values()), rel=1e-12)
    assert plan.layer("fc1").flops == 6 * 64 * 64 * 128


def test_high_precision_loss_is_the_plain_models(planted):
    _, before, plan = planted
    ref = MLP(planted=True)
    ref.load_state_dict(before)
    with torch.no_grad():  # the search batches are the first 4 of 6 (the last third is held out)
        want = sum(float(loss_fn(ref, b)) for b in batches(6)[:4]) / 4
    assert plan.loss_hp == pytest.approx(want, rel=1e-6)


def test_search_cost_is_reported_and_a_few_dozen_passes(planted):
    _, _, plan = planted
    B, H, C, N = 4, 2, 3, 3  # search / held-out batches, candidates, eligible layers
    assert plan.passes == {"forward": B * (3 + C + 2 * (N - 1)) + H * 2, "backward": B * (1 + C) + H * 2}


def test_the_model_is_left_as_it_was(planted):
    model, before, _ = planted
    assert type(model.fc1) is nn.Linear and type(model.fc2.lin) is nn.Linear  # unconverted again
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.training


def _e4m3_current(t: torch.Tensor) -> np.ndarray:
    """Current per-tensor E4M3 cast and back, with ml_dtypes (saturating: values fit by construction)."""
    a = t.double().numpy()
    scale = np.float32(448.0 / np.abs(a).max())
    q = (a.astype(np.float32) * scale).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float64) / np.float64(scale)


def test_output_sqnr_matches_an_ml_dtypes_reference():
    torch.manual_seed(1)
    lin = nn.Linear(128, 96)
    x = torch.randn(64, 128)
    model = nn.Sequential(lin)
    plan = search_plan(model, [(x, None)], lambda m, b: m(b[0]).pow(2).mean(), heldout=[(x, None)],
                       candidates={"current": CurrentScaling(fp8_format=fp8mix.Format.E4M3)})
    got = plan.layer("0").output_sqnr_db["current"]
    w = lin.weight.detach()
    y = x.double().numpy() @ w.double().numpy().T + lin.bias.detach().double().numpy()
    yq = _e4m3_current(x) @ _e4m3_current(w).T + lin.bias.detach().double().numpy()
    want = 10 * math.log10((y ** 2).sum() / ((y - yq) ** 2).sum())
    assert got == pytest.approx(want, abs=0.05)


def test_clean_model_goes_all_fp8_and_the_budget_is_respected():
    torch.manual_seed(2)
    model = MLP(planted=False)
    plan = search_plan(model, batches(3), loss_fn, budget=0.01)
    assert plan.fp8 == ["fc1", "fc2", "fc3"]
    assert plan.predicted_increase <= 0.01


def test_zero_budget_keeps_every_costly_layer():
    torch.manual_seed(3)
    model = MLP(planted=False)
    plan = search_plan(model, batches(3), loss_fn, budget=0.0, max_repairs=0)
    for lp in plan.layers:
        if lp.decision == "fp8":
            assert lp.cost == 0.0
        elif lp.name != "head":
            assert lp.cost > 0.0 and "exceeds the budget" in lp.reason


def test_sqnr_metric_skips_the_loss_passes():
    torch.manual_seed(0)
    plan = search_plan(MLP(planted=True), batches(3), loss_fn, metric="sqnr")
    assert plan.keep == ["fc2.lin", "head"]
    assert all(math.isnan(lp.solo_increase) for lp in plan.layers)
    B, H, C = 2, 1, 3
    assert plan.passes["forward"] == B * (2 + C) + 2 * H


def test_works_on_an_already_converted_model_and_restores_its_policy():
    torch.manual_seed(4)
    model = fp8mix.convert_model(MLP(planted=False))
    model.fc3.fp8_enabled = False
    model.fc1.fp8_recipe = DelayedScaling()
    with fp8mix.fp8_autocast():
        loss_fn(model, batches(1)[0]).backward()
    state = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    search_plan(model, batches(3), loss_fn)
    assert model.fc3.fp8_enabled is False and model.fc1.fp8_recipe == DelayedScaling()
    assert "fp8_enabled" not in model.fc2.__dict__
    assert all(torch.equal(a, b) for a, b in zip(grads, [p.grad for p in model.parameters()]))
    now = model.state_dict()
    assert all(torch.equal(now[k], state[k]) for k in state)


@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(budget=-0.1), ValueError, "budget"),
    (dict(budget=True), ValueError, "budget"),
    (dict(metric="speed"), ValueError, "metric"),
    (dict(candidates={"x": "delayed"}), TypeError, "candidates"),
    (dict(max_repairs=-1), ValueError, "max_repairs"),
    (dict(heldout=[]), ValueError, "heldout"),
])
def test_bad_arguments_are_refused(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        search_plan(MLP(planted=False), batches(2), loss_fn, **kwargs)


def test_bad_model_batches_and_loss():
    with pytest.raises(TypeError, match="nn.Module"):
        search_plan("model", batches(2), loss_fn)
    with pytest.raises(ValueError, match="batches"):
        search_plan(MLP(planted=False), [], loss_fn)
    with pytest.raises(ValueError, match="no linear layer"):
        search_plan(nn.Sequential(nn.ReLU()), batches(2), loss_fn)
    model = MLP(planted=False)
    with pytest.raises(TypeError, match="scalar"):
        search_plan(model, batches(2), lambda m, b: m(b[0]))
    assert type(model.fc1) is nn.Linear  # unconverted again after the failure


class _Unused(nn.Module):
    """fc1 and fc3 run; `spare` is never called."""

    def __init__(self):
        super().__init__()
        self.fc1, self.spare, self.fc3 = nn.Linear(64, 128), nn.Linear(64, 64), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc1(x)))


def test_a_layer_never_called_is_kept_with_its_reason_and_one_batch_warns():
    torch.manual_seed(6)
    with pytest.warns(UserWarning, match="one batch only"):
        plan = search_plan(_Unused(), batches(1), loss_fn)
    assert plan.keep == ["spare", "fc3"] and plan.fp8 == ["fc1"]
    assert "not called" in plan.layer("spare").reason and plan.layer("spare").flops == 0
