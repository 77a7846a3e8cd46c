"""The per-module FP8 state where training scripts touch it (issue #12): evaluation and
calibration, dtype moves, deferred (meta-device) initialisation, checkpoints through
torch.distributed.checkpoint, flags. References: the same model without the feature
(no evaluation pass, built normally, float32 module), torch's nn.Linear, float64."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import fp8mix
from fp8mix.nn.fp8_state import FP8_STATE_KEYS
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=16), "current": CurrentScaling,
           "block": BlockScaling}


def _mlp(seed=0, d=64):
    torch.manual_seed(seed)
    return nn.Sequential(fp8mix.Linear(d, 2 * d), nn.GELU(), fp8mix.Linear(2 * d, d))


def _fp8_state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] in FP8_STATE_KEYS}


def _train(model, rec, steps, seed=1, lr=0.05, d=64):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, d, generator=g)
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# ---- 2. evaluation never changes training state -----------------------------------------------
@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "eval", "eval_with_grad"])
def test_evaluation_forwards_leave_the_fp8_state_untouched(how):
    rec = DelayedScaling(amax_history_len=1024)
    model = _mlp()
    _train(model, rec, 3)
    before = _fp8_state(model)
    outlier = torch.randn(32, 64) * 1e4  # the validation batch that once cut an input scale 460x
    if how == "no_grad":
        with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=rec):
            y = model(outlier)
    elif how == "inference_mode":
        with torch.inference_mode(), fp8mix.fp8_autocast(fp8_recipe=rec):
            y = model(outlier)
    else:
        model.eval()
        with torch.set_grad_enabled(how == "eval_with_grad"), fp8mix.fp8_autocast(fp8_recipe=rec):
            y = model(outlier)
            if how == "eval_with_grad":
                y.sum().backward()  # its backward records nothing either
        model.train()
    assert torch.isfinite(y).all()
    after = _fp8_state(model)
    for k in before:
        assert torch.equal(before[k], after[k]), f"{how} changed {k}"


def test_evaluation_between_steps_does_not_change_training():
    """Training with an outlier validation pass after every step equals training without it."""
    rec = DelayedScaling(amax_history_len=1024)
    a = _mlp(3)
    b = copy.deepcopy(a)
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (a, b))
    g = torch.Generator().manual_seed(4)
    for _ in range(4):
        x = torch.randn(32, 64, generator=g)
        for m, opt, val in ((a, opt_a, False), (b, opt_b, True)):
            with fp8mix.fp8_autocast(fp8_recipe=rec):
                m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if val:
                m.eval()
                with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=rec):
                    m(torch.randn(64, 64, generator=g) * 1e3)
                m.train()
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k


def test_evaluation_uses_the_trained_scales():
    """An evaluation forward computes with the scales training left (it reads the state):
    equal to the same forward cast with those scales by hand."""
    rec = DelayedScaling(amax_history_len=16)
    lin = fp8mix.Linear(64, 32)
    for _ in range(3):
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            lin(torch.randn(16, 64) * 3).sum().backward()
    x = torch.randn(8, 64)
    with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=rec):
        y = lin(x)
    sx, sw = lin.fp8_scale[0], lin.fp8_scale[1]
    xq = fp8mix.quantize(x, scale=sx)
    wq = fp8mix.quantize(lin.weight.detach(), scale=sw)
    ref = fp8mix.scaled_mm(xq, wq.t(), bias=lin.bias.detach())
    assert torch.equal(y, ref)


def test_calibrating_records_amaxes_in_high_precision():
    """fp8_autocast(enabled=False, calibrating=True): outputs are nn.Linear's exactly, and
    the delayed state learns the ranges (a later FP8 forward uses scales from them)."""
    lin = fp8mix.Linear(64, 32)
    ref = nn.Linear(64, 32)
    ref.load_state_dict({k: v for k, v in lin.state_dict().items() if not k.startswith("fp8_")})
    rec = DelayedScaling(amax_history_len=8)
    xs = [torch.randn(16, 64) * s for s in (1.0, 4.0, 2.0)]
    lin.eval()
    with torch.no_grad(), fp8mix.fp8_autocast(enabled=False, fp8_recipe=rec, calibrating=True):
        for x in xs:
            assert torch.equal(lin(x), ref(x))
    assert lin.fp8_steps.tolist() == [3, 3, 0]
    assert lin.fp8_amax_history[:3, 0].tolist() == [float(x.abs().max()) for x in reversed(xs)]
    amax = torch.stack([x.abs().max() for x in xs]).max()
    assert lin.fp8_scale[0].item() == (torch.tensor(448.0) / amax).item()  # one float32 division


# ---- 3. dtype moves ---------------------------------------------------------------------------
@pytest.mark.parametrize("move", ["to_bf16", "half", "double", "to_device_dtype"])
def test_dtype_moves_keep_the_fp8_state_exact(move):
    model = _mlp(5)
    _train(model, DelayedScaling(amax_history_len=16), 2)
    before = _fp8_state(model)
    moved = {"to_bf16": lambda m: m.to(torch.bfloat16), "half": lambda m: m.half(), "double": lambda m: m.double(),
             "to_device_dtype": lambda m: m.to("cpu", torch.float16)}[move](model)
    assert moved is model
    after = _fp8_state(model)
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k
    assert model[0].weight.dtype != torch.float32


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_training_a_low_precision_module(recipe, dtype):
    """A bf16 / fp16 module trains under every recipe: the loss falls as the float32
    module's does (same init and data) and outputs are in the module's dtype."""
    model32 = _mlp(6)
    model = copy.deepcopy(model32).to(dtype)
    rec = RECIPES[recipe]()
    with fp8mix.fp8_autocast(fp8_recipe=rec):
        y = model(torch.randn(4, 64, dtype=dtype))
    assert y.dtype == dtype
    l32 = _train_typed(model32, rec, torch.float32)
    llo = _train_typed(model, rec, dtype)
    assert llo[-1] < 0.8 * llo[0] and l32[-1] < 0.8 * l32[0], (llo, l32)
    assert abs(llo[-1] - l32[-1]) <= 0.05 * l32[-1], (llo, l32)


def _train_typed(model, rec, dtype, steps=30):
    torch.manual_seed(7)
    target = nn.Linear(64, 64).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(8)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 64, generator=g)
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            out = model(x.to(dtype)).float()
        loss = (out - target(x)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# ---- 4. deferred initialisation -------------------------------------------------------------------
def test_meta_device_init_then_to_empty_gives_a_fresh_fp8_state():
    torch.manual_seed(9)
    normal = _mlp(9)
    with torch.device("meta"):
        deferred = nn.Sequential(fp8mix.Linear(64, 128), nn.GELU(), fp8mix.Linear(128, 64))
    assert deferred[0].fp8_scale.is_meta
    deferred.to_empty(device="cpu")
    for m in deferred.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    for (k, a), b in zip(normal.state_dict().items(), deferred.state_dict().values()):
        if k.endswith("fp8_rng"):  # a stream key of its own, a fresh offset
            assert b[0] != 0 and b[1] == 0, k
        elif "fp8_" in k:
            assert torch.equal(a, b), f"{k} is not a freshly initialised FP8 state: {b}"
    losses = _train(deferred, DelayedScaling(), 3)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_to_empty_alone_resets_the_fp8_state():
    with torch.device("meta"):
        lin = fp8mix.Linear(32, 32)
    lin.to_empty(device="cpu")
    assert torch.equal(lin.fp8_scale, torch.ones(3)) and not lin.fp8_amax_history.any()
    assert lin.fp8_steps.tolist() == [0, 0, 0] and (lin.fp8_grad_pending == -1).all()


# ---- 9. torch.distributed.checkpoint with any recipe into a fresh model --------------------------------
@pytest.mark.parametrize("fresh", ["built", "converted"])
def test_dcp_round_trip_with_a_short_history_into_a_fresh_model(tmp_path, fresh):
    import torch.distributed.checkpoint as dcp
    rec = DelayedScaling(amax_history_len=16)
    model = _mlp(10)
    _train(model, rec, 3)
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "ck"))
    if fresh == "built":
        other = _mlp(11)
    else:
        torch.manual_seed(11)
        other = fp8mix.convert_model(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)))
    sd = other.state_dict()
    dcp.load(sd, checkpoint_id=str(tmp_path / "ck"))
    other.load_state_dict(sd)
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k
    assert _train(model, rec, 2, seed=3) == _train(other, rec, 2, seed=3)


# ---- 13. one rule for flags -----------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1, 0, torch.tensor(True), "yes", 1.0])
def test_flags_take_bools_only(bad):
    lin = fp8mix.Linear(32, 32)
    with fp8mix.fp8_autocast(), pytest.raises(TypeError, match="is_first_microbatch"):
        lin(torch.randn(4, 32), is_first_microbatch=bad)
    with pytest.raises(TypeError, match="enabled"):
        fp8mix.fp8_autocast(enabled=bad)
    with pytest.raises(TypeError, match="calibrating"):
        fp8mix.fp8_autocast(calibrating=bad)


def test_autocast_without_fp8_modules_warns_once(monkeypatch):
    import importlib
    ac = importlib.import_module("fp8mix.context")
    monkeypatch.setattr(ac, "_ran", [False])
    monkeypatch.setattr(ac, "_warned", [False])
    model = nn.Sequential(nn.Linear(8, 8))
    with pytest.warns(UserWarning, match="no fp8mix module ran"):
        with fp8mix.fp8_autocast():
            model(torch.randn(2, 8))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fp8mix.fp8_autocast():
            model(torch.randn(2, 8))
        monkeypatch.setattr(ac, "_warned", [False])
        with fp8mix.fp8_autocast():  # a context in which an fp8mix layer ran: no warning
            fp8mix.Linear(32, 32)(torch.randn(2, 32))
        with fp8mix.fp8_autocast(enabled=False):
            model(torch.randn(2, 8))


def test_distributed_checkpoint_round_trip(tmp_path):
    """torch.distributed.checkpoint (single process) saves and loads the FP8 state in place:
    a fresh model has the state shapes of a trained one (default history length)."""
    import torch.distributed.checkpoint as dcp
    torch.manual_seed(0)
    m = nn.Sequential(fp8mix.Linear(32, 32), nn.ReLU(), fp8mix.Linear(32, 32))
    for _ in range(3):
        with fp8mix.fp8_autocast():
            m(torch.randn(4, 32)).sum().backward()
        m(torch.randn(4, 32))  # outside: nothing recorded
    with fp8mix.fp8_autocast():
        m(torch.randn(4, 32))  # records the pending grad amax
    dcp.save(m.state_dict(), checkpoint_id=str(tmp_path / "ckpt"))
    m2 = nn.Sequential(fp8mix.Linear(32, 32), nn.ReLU(), fp8mix.Linear(32, 32))
    sd = m2.state_dict()
    dcp.load(sd, checkpoint_id=str(tmp_path / "ckpt"))
    m2.load_state_dict(sd)
    for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k
    assert int(m2[0].fp8_steps[0]) == 4


# ---- per-module policy: what a precision plan sets ------------------------------------------------
def test_per_module_recipe_and_switch_override_the_autocast():
    torch.manual_seed(12)
    model = _mlp(12)
    ref = copy.deepcopy(model)
    model[0].fp8_enabled = False  # this layer stays in high precision
    model[2].fp8_recipe = CurrentScaling()  # this one uses its own recipe
    ref0 = nn.Linear(64, 128)
    ref0.load_state_dict({k: v for k, v in ref[0].state_dict().items() if "fp8_" not in k})
    x = torch.randn(16, 64)
    with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
        y = model(x)
    h = ref0(x)
    assert torch.equal(model[0](x), h)  # (outside autocast too, trivially)
    with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
        yr = ref[2](ref[1](h))
    assert torch.equal(y, yr)
    assert model[0].fp8_steps.tolist() == [0, 0, 0] and model[2].fp8_steps.tolist() == [0, 0, 0]
