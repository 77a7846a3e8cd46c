"""fp8mix.ProgressiveFP8: the planned layers enter FP8 least sensitive first over the warm-up,
kept layers never; a resumed run (model, optimizer and schedule state_dicts) continues bit for
bit as the uninterrupted one; a guard's move is left alone; refused input."""
from __future__ import annotations

import copy

import pytest
import torch
from plan_models import MLP, batches, loss_fn

import fp8mix
from fp8mix.plan import LayerPlan, Plan, ProgressiveFP8
from fp8mix.recipe import CurrentScaling, DelayedScaling

RECIPE = DelayedScaling(amax_history_len=16)


def _plan() -> Plan:
    """A hand-made plan for MLP(planted=True): fc3 cheapest, then fc1; fc2.lin and head kept."""
    def fp8(name, cost):
        return LayerPlan(name=name, decision="fp8", reason="", candidate="delayed", recipe=RECIPE, cost=cost,
                         flops=1.0)
    return Plan(layers=[fp8("fc1", 2e-4), LayerPlan(name="fc2.lin", decision="keep", reason="planted", flops=1.0),
                        fp8("fc3", 1e-5), LayerPlan(name="head", decision="keep", reason="tiny", flops=1.0)])


def test_layers_enter_least_sensitive_first_and_kept_layers_never():
    torch.manual_seed(0)
    model = MLP(planted=True)
    prog = ProgressiveFP8(model, _plan(), warmup_steps=4)
    assert prog.order == ["fc3", "fc1"] and prog.enter_at == {"fc3": 0, "fc1": 2}
    seen = []
    for _ in range(5):
        seen.append((model.fc3.fp8_enabled, model.fc1.fp8_enabled, model.fc2.lin.fp8_enabled))
        prog.step()
    assert seen == [(True, False, False), (True, False, False), (True, True, False), (True, True, False),
                    (True, True, False)]
    assert prog.in_fp8 == ["fc3", "fc1"] and prog.fp8_flop_share == pytest.approx(0.5)
    assert prog.events == [{"step": 0, "layer": "fc3"}, {"step": 2, "layer": "fc1"}]


def _run(model, opt, prog, data, start: int, stop: int) -> list:
    losses = []
    for b in data[start:stop]:
        with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
            loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        prog.step()
        losses.append(float(loss.detach()))
    return losses


def test_resume_is_exact():
    data = batches(10, seed=3)
    torch.manual_seed(1)
    base = MLP(planted=True)
    model = copy.deepcopy(base)
    prog = ProgressiveFP8(model, _plan(), warmup_steps=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = _run(model, opt, prog, data, 0, 3)
    ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "prog": prog.state_dict()})
    straight = _run(model, opt, prog, data, 3, 10)

    model2 = copy.deepcopy(base)
    prog2 = ProgressiveFP8(model2, _plan(), warmup_steps=8)
    model2.load_state_dict(ckpt["model"])
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    opt2.load_state_dict(ckpt["opt"])
    prog2.load_state_dict(ckpt["prog"])
    assert prog2.global_step == 3 and prog2.in_fp8 == ["fc3"]
    resumed = _run(model2, opt2, prog2, data, 3, 10)
    assert len(first) == 3 and resumed == straight and prog2.in_fp8 == ["fc3", "fc1"]
    assert prog2.state_dict() == prog.state_dict()
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


class _Guard:
    moved = {"fc1": "high"}


def test_a_guarded_layer_stays_where_the_guard_put_it():
    model = MLP(planted=True)
    model = fp8mix.convert_model(model)
    model.fc1.fp8_enabled = False
    prog = ProgressiveFP8(model, _plan(), warmup_steps=2, guard=_Guard())
    for _ in range(3):
        prog.step()
    assert model.fc1.fp8_enabled is False and model.fc3.fp8_enabled
    assert prog.fp8_flop_share == pytest.approx(0.25)  # fc3 only: 1 of the 4 layers' FLOPs


def test_refused_input():
    with pytest.raises(TypeError, match="Plan"):
        ProgressiveFP8(MLP(), {"layers": []})
    with pytest.raises(ValueError, match="warmup_steps"):
        ProgressiveFP8(MLP(), _plan(), warmup_steps=-1)
    with pytest.raises(TypeError, match="guard"):
        ProgressiveFP8(MLP(), _plan(), guard=object())
    prog = ProgressiveFP8(MLP(), _plan(), warmup_steps=4)
    with pytest.raises(ValueError, match="another plan"):
        prog.load_state_dict(dict(prog.state_dict(), enter_at={"fc3": 0, "fc1": 3}))
