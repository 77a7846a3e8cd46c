"""The planner's outlier rule (fp8mix.plan.outliers): planted outlier channels are measured
(spread, channel-group SQNR against an ml_dtypes reference), a layer whose casts they spoil
is smoothed, moved to MX or kept in high precision with the reason in plan.table(), 1000x
outliers that E4M3 holds are reported and left in FP8, clean models are untouched."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from outlier_models import OutlierMLP, SensitiveWeightMLP, WideOutlierMLP
from plan_models import MLP, batches, loss_fn

import fp8mix
from fp8mix.plan import Plan, search_plan
from fp8mix.plan.outliers import OUTLIER_SPREAD, assess
from fp8mix.recipe import MXFP8BlockScaling


def _plan(model):
    torch.manual_seed(0)
    return search_plan(model, batches(6), loss_fn)


@pytest.fixture(scope="module")
def plans():
    out = {}
    for key, make in (("1000x", lambda: OutlierMLP(2.0 ** 10)), ("2^17", lambda: OutlierMLP(2.0 ** 17)),
                      ("mx", lambda: WideOutlierMLP(1e10)), ("clean", lambda: MLP(planted=False)),
                      ("weight", SensitiveWeightMLP)):
        torch.manual_seed(0)
        out[key] = _plan(make())
    return out


def _e4m3(a: np.ndarray) -> np.ndarray:
    """Current per-tensor E4M3 cast and back with ml_dtypes (values fit by construction)."""
    scale = np.float32(448.0) / np.float32(np.abs(a).max())
    q = (a.astype(np.float32) * scale).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float64) / np.float64(scale)


def test_channel_group_sqnr_matches_an_ml_dtypes_reference():
    torch.manual_seed(3)
    x = torch.randn(64, 96)
    x[:, :2] *= 2.0 ** 16  # 2 outlier channels: the others fall below E4M3's normal range
    w = torch.randn(32, 96)
    w[:, :2] /= 2.0 ** 16
    rep = assess(x, w)
    assert rep.outliers == 2 and rep.spread > OUTLIER_SPREAD
    xq, wq = _e4m3(x.numpy()), _e4m3(w.numpy())
    amax = np.abs(x.numpy()).max(0).astype(np.float64)
    dec = np.floor(np.log10(amax.max() / amax))
    worst = math.inf
    for d in np.unique(dec):
        g = dec == d
        y = x.double().numpy()[:, g] @ w.double().numpy()[:, g].T
        e = y - xq[:, g] @ wq[:, g].T
        worst = min(worst, 10 * math.log10((y ** 2).sum() / (e ** 2).sum()))
    assert rep.loss["tensor"].worst_group_db == pytest.approx(worst, abs=1e-6)
    assert rep.loss["tensor"].worst_group_db < 20.0 < rep.loss["smooth"].worst_group_db
    assert rep.loss["tensor"].below_normal > 0.5


def test_1000x_outliers_are_reported_and_left_in_fp8(plans):
    lp = plans["1000x"].layer("fc2.lin")
    assert lp.outlier_channels == 4 and lp.channel_spread > 1000
    assert lp.decision == "fp8" and not lp.smooth
    assert "harmless" in lp.reason and "outlier" in lp.reason  # says why it acts not
    assert lp.output_sqnr_db["plan"] > 25.0


def test_spoiling_outliers_are_smoothed_and_the_table_says_why(plans):
    plan = plans["2^17"]
    lp = plan.layer("fc2.lin")
    assert lp.decision == "fp8" and lp.smooth
    assert "smooth fixes it" in lp.reason and "4 outlier channel(s) of 128" in lp.reason
    best_unfixed = max(v for k, v in lp.output_sqnr_db.items() if k != "plan")
    assert best_unfixed < 20.0 < 25.0 < lp.output_sqnr_db["plan"]
    assert "smooth" in plan.table() and "spread" in plan.table()


def test_outlier_alone_in_its_mx_block_moves_the_layer_to_mx(plans):
    lp = plans["mx"].layer("fc2.lin")  # zero weight column: smoothing cannot move it; 1x128 tiles share it
    assert lp.decision == "fp8" and isinstance(lp.recipe, MXFP8BlockScaling) and lp.candidate == "mx"
    assert "mx fixes it" in lp.reason
    assert lp.output_sqnr_db["plan"] > 25.0


def test_no_fix_keeps_high_precision_with_the_numbers():
    plan = _plan(MLP(planted=True))  # 1e10 outlier at channel 0: every cast's block holds real channels
    lp = plan.layer("fc2.lin")
    assert lp.decision == "keep" and "kept in high precision" in lp.reason
    for fix in ("smooth", "row", "block", "mx"):
        assert f"{fix} " in lp.reason


def test_clean_models_are_untouched(plans):
    for key in ("clean",):
        for lp in plans[key].layers:
            assert lp.outlier_channels == 0 and not lp.smooth and "outlier" not in lp.reason
            assert math.isnan(lp.channel_spread) or lp.channel_spread < OUTLIER_SPREAD
    assert plans["clean"].fp8 == ["fc1", "fc2", "fc3"]


def test_planted_sensitive_weight_columns_are_not_input_outliers_and_get_e5m2(plans):
    lp = plans["weight"].layer("fc2.lin")
    assert lp.outlier_channels == 0  # tiny input channels are not outliers
    best = max(v for k, v in lp.output_sqnr_db.items() if k != "plan")
    assert best < 20.0 and lp.output_sqnr_db["plan"] >= 20.0  # AUTO's range rule: E5M2 forward
    assert lp.formats["weight"] == "E5M2"


def test_smooth_decision_survives_json_and_apply(plans, tmp_path):
    plan = plans["2^17"]
    back = Plan.load(plan.save(tmp_path / "p.json"))
    lp = back.layer("fc2.lin")
    assert lp.smooth and lp.channel_spread == pytest.approx(plan.layer("fc2.lin").channel_spread)
    model = OutlierMLP(2.0 ** 17)
    back.apply(model)
    assert model.fc2.lin.fp8_smooth is True and getattr(model.fc1, "fp8_smooth", False) is False
    with pytest.raises(ValueError, match="smooth must be a bool"):
        fp8mix.plan.LayerPlan(name="a", decision="keep", reason="", smooth="yes")


def test_a_conv1d_layer_is_measured_with_its_in_out_weight():
    pytest.importorskip("transformers")
    from outlier_models import Conv1DOutlierMLP

    plan = _plan(Conv1DOutlierMLP(2.0 ** 17))
    lp = plan.layer("conv")
    assert lp.outlier_channels == 4 and lp.channel_spread > 1e4
    # Conv1D has no fp8_smooth, and its outliers share every finer block with real channels
    assert lp.decision == "keep" and not lp.smooth and "no finer cast passes" in lp.reason
    assert "Conv1D has no fp8_smooth" in lp.reason  # says why smoothing, which would pass, is not used
