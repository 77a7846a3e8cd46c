"""Stability options of fp8mix.Linear: stochastic rounding per role, Format.AUTO,
gradient accumulation and the optional FP8 state's checkpoint behaviour."""
import copy

import pytest
import torch

import fp8mix
from fp8mix import Format
from fp8mix.auto_format import AutoFormat
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = [DelayedScaling, CurrentScaling, BlockScaling]


def _step(lin, x, recipe, dy=None):
    x = x.detach().requires_grad_(True)
    with fp8mix.fp8_autocast(fp8_recipe=recipe):
        y = lin(x)
    y.backward(torch.ones_like(y) if dy is None else dy)
    return y.detach(), x.grad, lin.weight.grad


# ---- stochastic rounding -------------------------------------------------------------
def test_rounding_field_is_validated_and_normalised():
    assert DelayedScaling().rounding == {"input": "nearest", "weight": "nearest", "grad_output": "nearest"}
    assert CurrentScaling(rounding={"grad": "stochastic"}).rounding["grad_output"] == "stochastic"
    assert BlockScaling(rounding="stochastic").rounding["weight"] == "stochastic"
    with pytest.raises(ValueError, match="unknown tensor role"):
        DelayedScaling(rounding={"bias": "stochastic"})
    with pytest.raises(ValueError, match="nearest"):
        DelayedScaling(rounding={"grad": "up"})
    with pytest.raises(TypeError, match="rounding must be a str or a dict"):
        DelayedScaling(rounding=1)


@pytest.mark.parametrize("cls", RECIPES)
def test_grad_sr_changes_only_the_gradients_and_is_seeded(cls):
    torch.manual_seed(0)
    base = fp8mix.Linear(256, 128)
    x = torch.randn(64, 256)
    dy = torch.randn(64, 128)
    near, sr_a, sr_b = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    y0, dx0, dw0 = _step(near, x, cls(), dy)
    torch.manual_seed(5)
    ya, dxa, dwa = _step(sr_a, x, cls(rounding={"grad": "stochastic"}), dy)
    torch.manual_seed(5)
    yb, dxb, dwb = _step(sr_b, x, cls(rounding={"grad": "stochastic"}), dy)
    assert torch.equal(y0, ya)  # forward untouched
    assert not torch.equal(dx0, dxa) and not torch.equal(dw0, dwa)
    assert torch.equal(dxa, dxb) and torch.equal(dwa, dwb)  # same torch seed, same bits


def test_sr_offset_advances_so_steps_do_not_repeat_bits():
    torch.manual_seed(0)
    lin = fp8mix.Linear(128, 128)
    x = torch.randn(32, 128)
    dy = torch.randn(32, 128)
    r = DelayedScaling(rounding={"grad": "stochastic"})
    lin.weight.requires_grad_(False)
    _, dx1, _ = _step(lin, x, r, dy)
    off1 = int(lin.fp8_rng[1])
    _, dx2, _ = _step(lin, x, r, dy)
    assert int(lin.fp8_rng[1]) == 2 * off1 == 2 * 32 * 128
    # same scale (history of the same data) but different random words
    assert not torch.equal(dx1, dx2)


def test_grad_sr_is_unbiased_in_training_shapes():
    """Averaged over many random streams, SR's dgrad converges to the exact product of
    the unquantised dy with the FP8 weight; round-to-nearest keeps a fixed bias."""
    torch.manual_seed(1)
    lin = fp8mix.Linear(128, 128, bias=False)
    x = torch.randn(16, 128)
    # dy values between E5M2 grid points after scaling: nearest rounds them all one way
    g = torch.Generator().manual_seed(2)
    dy = (1.0 + 0.09 * torch.rand(16, 128, generator=g)) * torch.sign(torch.randn(16, 128, generator=g))
    dy[0, 0] = 1.6  # the amax
    rec = CurrentScaling(rounding={"grad": "stochastic"})
    wq = fp8mix.quantize(lin.weight.detach(), "E4M3")
    exact = dy.double() @ wq.dequantize(torch.float32).double()
    _, dx_rne, _ = _step(copy.deepcopy(lin), x, CurrentScaling(), dy)
    acc = torch.zeros_like(exact)
    n = 64
    for i in range(n):
        l2 = copy.deepcopy(lin)
        l2.fp8_rng[0] = 1000 + i  # another stream
        _, dx, _ = _step(l2, x, rec, dy)
        acc += dx.double()
    err_sr = (acc / n - exact).abs().mean()
    err_rne = (dx_rne.double() - exact).abs().mean()
    assert err_sr < 0.3 * err_rne, (float(err_sr), float(err_rne))


def test_sr_stream_survives_state_dict_exactly():
    torch.manual_seed(3)
    a = fp8mix.Linear(64, 64)
    r = DelayedScaling(rounding="stochastic", amax_history_len=4)
    x, dy = torch.randn(8, 64), torch.randn(8, 64)
    _step(a, x, r, dy)
    b = fp8mix.Linear(64, 64)
    b.load_state_dict(a.state_dict())
    assert b.fp8_rng.tolist() == a.fp8_rng.tolist() and a.fp8_rng[1] > 0
    for _ in range(2):
        ya, dxa, _ = _step(a, x, r, dy)
        yb, dxb, _ = _step(b, x, r, dy)
        assert torch.equal(ya, yb) and torch.equal(dxa, dxb)


# ---- Format.AUTO -----------------------------------------------------------------------
def _wide(shape, binades, gen):
    mag = torch.exp2(-binades * torch.rand(shape, generator=gen))
    return mag * torch.sign(torch.randn(shape, generator=gen))


@pytest.mark.parametrize("cls", RECIPES)
def test_auto_picks_e5m2_for_wide_range_and_e4m3_for_narrow(cls):
    torch.manual_seed(0)
    lin = fp8mix.Linear(256, 256)
    rec = cls(fp8_format=Format.AUTO, auto=AutoFormat(warmup=4))
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = _wide((64, 256), 30.0, g)  # 2^30 dynamic range
        _step(lin, x, rec, torch.randn(64, 256, generator=g))
    rep = lin.fp8_format_report()
    assert rep["input"][0] == "E5M2" and "range" in rep["input"][1]
    assert rep["weight"][0] == "E4M3" and "precision" in rep["weight"][1]  # init weights: narrow
    assert rep["grad_output"][0] == "E4M3"  # Gaussian gradients fit E4M3 after scaling
    # the decision is in the state_dict: code 1 (E5M2) for input, 0 (E4M3) for weight and grad_output
    assert lin.state_dict()["fp8_auto"][:, 0].tolist() == [1, 0, 0]


def test_auto_hysteresis_does_not_flip_every_step():
    torch.manual_seed(0)
    lin = fp8mix.Linear(128, 128)
    lin.weight.requires_grad_(False)
    rec = CurrentScaling(fp8_format="AUTO", auto=AutoFormat(warmup=2, interval=1, patience=3))
    g = torch.Generator().manual_seed(1)
    wide = lambda: _wide((32, 128), 30.0, g)  # noqa: E731
    narrow = lambda: torch.randn(32, 128, generator=g)  # noqa: E731
    seen = []
    for make in [narrow, narrow, wide, narrow, wide, narrow, wide, wide, wide]:
        with fp8mix.fp8_autocast(fp8_recipe=rec):  # training forwards: evaluation never votes
            lin(make())
        seen.append(lin.fp8_format_report()["input"][0])
    # warm-up decides E4M3; alternating evidence never builds a streak of 3; three wide in a row switch
    assert seen[:8] == ["E4M3"] * 8 and seen[8] == "E5M2"


def test_auto_decisions_resume_exactly():
    torch.manual_seed(0)
    rec = DelayedScaling(fp8_format="AUTO", auto=AutoFormat(warmup=3, interval=2, patience=1), amax_history_len=4)
    a = fp8mix.Linear(128, 128)
    g = torch.Generator().manual_seed(2)
    xs = [_wide((16, 128), 30.0 if i % 3 else 4.0, g) for i in range(10)]
    for x in xs[:5]:
        _step(a, x, rec)
    b = fp8mix.Linear(128, 128)
    b.load_state_dict(a.state_dict())
    for x in xs[5:]:
        ya, dxa, _ = _step(a, x, rec)
        yb, dxb, _ = _step(b, x, rec)
        assert torch.equal(ya, yb) and torch.equal(dxa, dxb)
    assert a._auto_state == b._auto_state


def test_auto_policy_is_validated():
    with pytest.raises(ValueError, match="warmup"):
        AutoFormat(warmup=0)
    with pytest.raises(ValueError, match="range_tolerance"):
        AutoFormat(range_tolerance=1.5)
    with pytest.raises(TypeError, match="AutoFormat"):
        DelayedScaling(auto={"warmup": 3})
    with pytest.raises(ValueError, match="policy"):
        fp8mix.quantize(torch.ones(4), Format.AUTO)


# ---- gradient accumulation and old checkpoints ----------------------------------------
def test_accumulation_steps_do_not_pollute_the_weight_history():
    torch.manual_seed(0)
    lin = fp8mix.Linear(64, 64)
    rec = DelayedScaling(amax_history_len=8)
    for step in range(3):
        for micro in range(4):
            x = torch.randn(8, 64).requires_grad_(True)
            with fp8mix.fp8_autocast(fp8_recipe=rec):
                y = lin(x, is_first_microbatch=(micro == 0))
            y.sum().backward()
        with torch.no_grad():
            lin.weight.mul_(1.5)  # an optimizer step that changes the weight amax
    sd = lin.state_dict()
    steps = sd["fp8_steps"].tolist()
    assert steps == [12, 3, 11]  # one weight record per optimizer step; the 12th grad amax is pending
    assert (sd["fp8_grad_pending"] >= 0).sum() == 1
    w_hist = sd["fp8_amax_history"][:3, 1]
    assert torch.allclose(w_hist[0] / w_hist[1], torch.tensor(1.5)) and torch.allclose(w_hist[1] / w_hist[2],
                                                                                        torch.tensor(1.5))


def test_checkpoint_without_the_new_fp8_state_still_loads():
    a = fp8mix.Linear(32, 32)
    with fp8mix.fp8_autocast():
        a(torch.randn(4, 32)).sum().backward()
    sd = a.state_dict()
    del sd["fp8_rng"], sd["fp8_auto"], sd["fp8_grad_pending"], sd["fp8_grad_slot"]
    sd["fp8_amax_history"] = sd["fp8_amax_history"][:16].clone()  # earlier versions saved the recipe's length
    b = fp8mix.Linear(32, 32)
    res = b.load_state_dict(sd, strict=True)
    assert not res.missing_keys and torch.equal(b.fp8_scale, a.fp8_scale)
    assert torch.equal(b.fp8_amax_history, a.fp8_amax_history) and b.fp8_amax_history.shape == (1024, 3)
    assert b.fp8_rng.tolist() == [b._fp8_key, 0] and b.fp8_auto.tolist() == fp8mix.Linear(32, 32).fp8_auto.tolist()
    assert (b.fp8_grad_pending == -1).all() and b.fp8_grad_slot.tolist() == [0]
