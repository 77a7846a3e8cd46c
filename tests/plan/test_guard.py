"""fp8mix.FP8Guard: an injected fault (a layer whose input starts spiking mid-run) is caught
and the layer moved back to high precision with a warning naming it; a clean run moves
nothing; the fallback recipe comes first when given; state round trip; refused input."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from plan_models import SpikyMLP, batches, loss_fn

import fp8mix
from fp8mix.plan import FP8Guard, FP8GuardWarning
from fp8mix.recipe import CurrentScaling, DelayedScaling

RECIPE = DelayedScaling(fp8_format=fp8mix.Format.HYBRID, amax_history_len=16)
FAULT_AT, SPIKE_EVERY, SPIKE = 12, 4, 2.0 ** 16


def _train(steps: int, fault: bool, guard_kwargs=None, seed: int = 0):
    """AdamW on the MLP under delayed scaling with a monitor sampling every step; with
    `fault`, fc2's input is multiplied by 2^16 on every 4th step from FAULT_AT on (the
    history then keeps a scale 2^16 too small for the steps between)."""
    torch.manual_seed(seed)
    model = fp8mix.convert_model(SpikyMLP())
    mon = fp8mix.Monitor(every=1, hist_bins=0, warn=False)
    guard = FP8Guard(model, mon, **{"warn": False, **(guard_kwargs or {})})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(steps, seed=seed + 100)
    moved_at = None
    for step, b in enumerate(data):
        model.fc2.factor = SPIKE if fault and step >= FAULT_AT and (step - FAULT_AT) % SPIKE_EVERY == 0 else 1.0
        with fp8mix.fp8_autocast(fp8_recipe=RECIPE, monitor=mon):
            loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step()
        if guard.step(loss=loss) and moved_at is None:
            moved_at = step
    return model, guard, moved_at


def test_the_guard_moves_the_spiking_layer_back_and_names_it():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        model, guard, moved_at = _train(30, fault=True, guard_kwargs={"warn": True})
    assert guard.moved == {"fc2.lin": "high"}
    assert moved_at is not None and FAULT_AT < moved_at <= FAULT_AT + 4
    d = guard.decisions[0]
    assert d["layer"] == "fc2.lin" and d["action"] == "high precision" and d["signal"] == "underflow"
    msgs = [str(x.message) for x in w if issubclass(x.category, FP8GuardWarning)]
    assert len(msgs) == 1 and "fc2.lin" in msgs[0] and d["signal"] in msgs[0]
    assert "fc2.lin" in guard.report()
    # moved back: inside the autocast its forward is nn.Linear's, bit for bit
    assert model.fc2.lin.fp8_enabled is False and model.fc1.fp8_enabled and model.fc3.fp8_enabled
    x = torch.randn(8, 128)
    with fp8mix.fp8_autocast(fp8_recipe=RECIPE):
        assert torch.equal(model.fc2.lin(x), F.linear(x, model.fc2.lin.weight, model.fc2.lin.bias))


def test_the_guard_does_not_trigger_on_a_clean_run():
    _, guard, moved_at = _train(30, fault=False)
    assert moved_at is None and guard.moved == {} and guard.decisions == []
    assert "no layer moved" in guard.report()


def test_the_fallback_recipe_comes_before_high_precision():
    model, guard, _ = _train(30, fault=True, guard_kwargs={"fallback": CurrentScaling()})
    # current scaling adapts to each spike at once: the layer is fine there and stays in FP8
    assert guard.decisions[0]["action"] == "recipe current HYBRID"
    assert guard.moved == {"fc2.lin": "fallback"}
    assert model.fc2.lin.fp8_enabled and model.fc2.lin.fp8_recipe == CurrentScaling()


def test_state_round_trip_restores_the_moves():
    model, guard, _ = _train(20, fault=True)
    state = guard.state_dict()
    torch.manual_seed(0)
    fresh = fp8mix.convert_model(SpikyMLP())
    g2 = FP8Guard(fresh, fp8mix.Monitor(every=1))
    g2.load_state_dict(state)
    assert g2.state_dict() == state
    assert fresh.fc2.lin.fp8_enabled is False and fresh.fc1.fp8_enabled


def test_a_loss_spike_moves_the_worst_layer_near_a_threshold():
    model, guard, _ = _train(6, fault=False, guard_kwargs={"loss_spike": 1.5})
    assert guard.decisions == []
    guard._latest["fc3"] = (0.8, {"signal": "underflow", "role": "input", "value": 0.08, "threshold": 0.1, "step": 5})
    assert guard.step(loss=1e3)[0]["layer"] == "fc3"
    assert guard.moved == {"fc3": "high"}
    guard._latest.clear()
    assert guard.step(loss=1e4) == [] and guard.decisions[-1]["action"].startswith("none")


@pytest.mark.parametrize("kwargs, err, msg", [
    (dict(underflow_frac=2.0), ValueError, "underflow_frac"),
    (dict(patience=0), ValueError, "patience"),
    (dict(loss_spike=0.5), ValueError, "loss_spike"),
    (dict(fallback="current"), TypeError, "fallback"),
    (dict(sqnr_db=float("nan")), ValueError, "sqnr_db"),
])
def test_bad_arguments_are_refused(kwargs, err, msg):
    model = fp8mix.convert_model(SpikyMLP())
    with pytest.raises(err, match=msg):
        FP8Guard(model, fp8mix.Monitor(), **kwargs)


def test_bad_model_and_monitor():
    with pytest.raises(TypeError, match="Monitor"):
        FP8Guard(fp8mix.convert_model(SpikyMLP()), object())
    with pytest.raises(ValueError, match="convert it first"):
        FP8Guard(SpikyMLP(), fp8mix.Monitor())
    g = FP8Guard(fp8mix.convert_model(SpikyMLP()), fp8mix.Monitor())
    with pytest.raises(ValueError, match="FP8Guard state_dict"):
        g.load_state_dict({"version": 7})
