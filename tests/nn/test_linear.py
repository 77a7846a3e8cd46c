"""Tests of fp8mix.Linear (the module; fp8_autocast is test_autocast.py's, convert_model
tests/nn/test_convert.py's, torch.compile test_compile.py's, the recipes' arithmetic
test_recipe.py's, the FP8 state where scripts touch it tests/nn/test_fp8_state.py's).

What is checked:
  * drop-in: nn.Linear's signature, parameters, init (same RNG draws), state_dict
    (an nn.Linear checkpoint loads with strict=True); outside fp8_autocast, or with
    enabled=False, output and gradients equal nn.Linear's bit for bit;
  * accuracy inside fp8_autocast for every recipe: forward SQNR >= 25 dB, dgrad and
    wgrad >= 18 dB against a float32 layer, on odd and 3-D shapes;
  * dtypes: float32/bfloat16/float16 inputs, float32/bfloat16 modules, torch.autocast
    (cpu, bf16): master weights, optimizer grads and outputs in the right dtype;
  * tiny layers fall back to F.linear with a debug log line;
  * the FP8 weight cache: gradient accumulation casts once per weight version, the
    cached result equals recomputing, and any change of the weight is seen; it keeps
    working across Format.AUTO's switches;
  * FP8 state in state_dict, exact round trip, bit-identical resume of a training run;
  * a short real training run lands within 5% of float32's loss;
  * double backward (gradient penalties) against nn.Linear; bad input.
"""
from __future__ import annotations

import copy
import inspect
import io
import logging
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import RECIPE_IDS, RECIPES, make_pair, sqnr_db

import fp8mix
from fp8mix import fp8_autocast
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


def grads_of(*modules_or_tensors):
    out = []
    for m in modules_or_tensors:
        if isinstance(m, torch.Tensor):
            out.append(m.grad)
        else:
            out.extend(p.grad for p in m.parameters())
    return out


# --------------------------------------------------------------------------------------
# drop-in replacement
# --------------------------------------------------------------------------------------
def test_signature_matches_nn_linear():
    ours = inspect.signature(fp8mix.Linear.__init__).parameters
    theirs = inspect.signature(nn.Linear.__init__).parameters
    n = len(theirs)  # nn.Linear's parameters first, unchanged; TE's keywords after them, keyword-only
    assert [(p.name, p.default, p.kind) for p in list(ours.values())[:n]] == \
        [(p.name, p.default, p.kind) for p in theirs.values()]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in list(ours.values())[n:])
    assert issubclass(fp8mix.Linear, nn.Linear)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_same_parameters_and_init_as_nn_linear(bias, dtype):
    torch.manual_seed(123)
    ref = nn.Linear(37, 19, bias=bias, dtype=dtype)
    after_ref = torch.rand(4)
    torch.manual_seed(123)
    lin = fp8mix.Linear(37, 19, bias=bias, dtype=dtype)
    after_lin = torch.rand(4)
    assert torch.equal(after_ref, after_lin), "fp8mix.Linear must draw from the RNG exactly like nn.Linear"
    assert [n for n, _ in lin.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, p), (_, q) in zip(lin.named_parameters(), ref.named_parameters()):
        assert isinstance(p, nn.Parameter) and p.requires_grad
        assert p.dtype == q.dtype and p.shape == q.shape
        assert torch.equal(p, q), n
    assert (lin.bias is None) == (not bias)
    assert lin.in_features == 37 and lin.out_features == 19
    # meta-device construction works like nn.Linear's
    m = fp8mix.Linear(8, 4, device="meta")
    assert m.weight.device.type == "meta"


def test_loads_nn_linear_state_dict_strict():
    ref, _ = make_pair(48, 32, seed=1)
    lin = fp8mix.Linear(48, 32)
    res = lin.load_state_dict(ref.state_dict(), strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    assert int(lin.fp8_steps.sum()) == 0
    # and it then runs in FP8
    x = torch.randn(8, 48)
    with fp8_autocast():
        y = lin(x)
    assert sqnr_db(ref(x), y) >= 25
    # a partial FP8 state is still an error under strict=True
    sd = lin.state_dict()
    del sd["fp8_scale"]
    with pytest.raises(RuntimeError, match="fp8_scale"):
        fp8mix.Linear(48, 32).load_state_dict(sd, strict=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 40), (3, 5, 40)])
@pytest.mark.parametrize("mode", ["outside", "disabled", "torch_autocast"])
def test_high_precision_path_is_nn_linear_bit_for_bit(dtype, shape, mode):
    ref, lin = make_pair(40, 24, dtype=dtype, seed=2)
    torch.manual_seed(3)
    x0 = torch.randn(shape, dtype=dtype)
    g = torch.randn(*shape[:-1], 24)
    outs = []
    for m in (ref, lin):
        x = x0.clone().requires_grad_()
        if mode == "outside":
            y = m(x)
        elif mode == "disabled":
            with fp8_autocast(enabled=False):
                y = m(x)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = m(x)
        (y * g.to(y.dtype)).sum().backward()
        outs.append((y, x.grad, *grads_of(m)))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------
SHAPES = [
    ((17,), 33, 65),
    ((3, 11), 48, 80),     # 3-D input (batch, seq, features)
    ((64,), 129, 130),     # crosses a 128 block edge in K and N
    ((2, 70), 256, 96),    # 3-D, M = 140
]


@pytest.mark.parametrize("recipe", RECIPE_IDS)
@pytest.mark.parametrize("lead,K,N", SHAPES, ids=[f"{'x'.join(map(str, ld))}x{k}->{n}" for ld, k, n in SHAPES])
def test_accuracy_vs_float32(recipe, lead, K, N):
    ref, lin = make_pair(K, N, seed=K * N)
    torch.manual_seed(7)
    x0 = torch.randn(*lead, K)
    g = torch.randn(*lead, N)

    xr = x0.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(g)

    x = x0.clone().requires_grad_()
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = lin(x)
    y.backward(g)

    assert y.shape == yr.shape and y.dtype == torch.float32
    fwd, dgrad, wgrad = sqnr_db(yr, y), sqnr_db(xr.grad, x.grad), sqnr_db(ref.weight.grad, lin.weight.grad)
    assert fwd >= 25, f"forward SQNR {fwd:.1f} dB"
    assert dgrad >= 18, f"dgrad SQNR {dgrad:.1f} dB"
    assert wgrad >= 18, f"wgrad SQNR {wgrad:.1f} dB"
    # really FP8 (not a silent high-precision fallback)
    assert fwd < 60 and dgrad < 60 and wgrad < 60
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", RECIPE_IDS)
@pytest.mark.parametrize("module_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes(recipe, module_dtype, in_dtype):
    ref, lin = make_pair(64, 48, dtype=module_dtype, seed=5)
    ref = ref.float()
    torch.manual_seed(6)
    x0 = torch.randn(4, 9, 64).to(in_dtype)
    g = torch.randn(4, 9, 48)
    x = x0.clone().requires_grad_()
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = lin(x)
    assert y.dtype == module_dtype
    y.backward(g.to(y.dtype))
    assert lin.weight.dtype == module_dtype and lin.weight.grad.dtype == module_dtype
    assert lin.bias.grad.dtype == module_dtype
    assert x.grad.dtype == in_dtype
    xr = x0.float().requires_grad_()
    yr = ref(xr)
    yr.backward(g)
    assert sqnr_db(yr, y) >= 25
    assert sqnr_db(xr.grad, x.grad) >= 18
    assert sqnr_db(ref.weight.grad, lin.weight.grad) >= 18


@pytest.mark.parametrize("recipe", RECIPE_IDS)
@pytest.mark.parametrize("order", ["torch_outside", "torch_inside"])
def test_under_torch_autocast_bf16(recipe, order):
    ref, lin = make_pair(64, 32, seed=8)
    torch.manual_seed(9)
    x0 = torch.randn(2, 10, 64)
    x = x0.clone().requires_grad_()
    if order == "torch_outside":
        with torch.autocast("cpu", dtype=torch.bfloat16), fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = lin(x)
    else:
        with fp8_autocast(fp8_recipe=RECIPES[recipe]()), torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
    assert y.dtype == torch.bfloat16
    g = torch.randn(2, 10, 32)
    y.backward(g.bfloat16())
    assert lin.weight.grad.dtype == torch.float32 and lin.bias.grad.dtype == torch.float32
    assert x.grad.dtype == torch.float32
    xr = x0.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(g.bfloat16().float())
    assert sqnr_db(yr, y) >= 25
    assert sqnr_db(xr.grad, x.grad) >= 18
    assert sqnr_db(ref.weight.grad, lin.weight.grad) >= 18


def test_empty_batch():
    lin = fp8mix.Linear(32, 24)
    x = torch.randn(0, 32, requires_grad=True)
    with fp8_autocast():
        y = lin(x)
    assert y.shape == (0, 24)
    y.sum().backward()
    assert x.grad.shape == (0, 32)


@pytest.mark.parametrize("shape", [(6, 32), (2, 3, 32)])
def test_output_allows_in_place_ops_like_nn_linear(shape):
    """nn.Linear's output may be modified in place (nn.ReLU(inplace=True), `y += b`)."""
    torch.manual_seed(29)
    model = nn.Sequential(fp8mix.Linear(32, 48), nn.ReLU(inplace=True), fp8mix.Linear(48, 16))
    ref = copy.deepcopy(model)
    ref[1] = nn.ReLU()
    x = torch.randn(shape)
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        y = model(x)
        yr = ref(x)
        z = model[0](x)
        z += 1.0
    assert torch.equal(y, yr)
    y.sum().backward()
    yr.sum().backward()
    z.sum().backward()
    assert torch.equal(model[2].weight.grad, ref[2].weight.grad)


@pytest.mark.parametrize("scenario", ["shared_weight_first_step", "eval_forward_first"])
def test_first_grad_cast_scales_from_the_gradient(scenario):
    """Delayed scaling: the first cast of grad_output (empty history) must scale from the
    gradient itself, also when the layer's first backward is not its first forward's
    (a layer used twice, or a no-grad evaluation forward before training). Small
    gradients (mean losses over big batches) underflow E5M2 with an arbitrary scale 1."""
    ref, lin = make_pair(64, 64, seed=17)
    torch.manual_seed(18)
    x1, x2 = torch.randn(16, 64), torch.randn(16, 64)
    g = torch.randn(16, 64) * 1e-7
    with fp8_autocast():
        if scenario == "shared_weight_first_step":
            y = lin(x1) + lin(x2)
            yr = ref(x1) + ref(x2)
        else:
            with torch.no_grad():
                lin(x2)
            y = lin(x1)
            yr = ref(x1)
    y.backward(g)
    yr.backward(g)
    wg = sqnr_db(ref.weight.grad, lin.weight.grad)
    assert wg >= 18, f"wgrad SQNR {wg:.1f} dB: grad_output's first cast did not scale from the gradient " \
                     f"(fp8_scale={lin.fp8_scale.tolist()})"


# --------------------------------------------------------------------------------------
# tiny layers
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_f,out_f", [(8, 32), (32, 8), (15, 15), (1, 1)])
@pytest.mark.parametrize("recipe", RECIPE_IDS)
def test_tiny_layers_fall_back_with_log(in_f, out_f, recipe, caplog):
    ref, lin = make_pair(in_f, out_f, seed=19)
    x0 = torch.randn(4, 3, in_f)
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    with caplog.at_level(logging.DEBUG, logger="fp8mix"):
        with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = lin(xa)
            y2 = lin(xa)
    assert torch.equal(y, F.linear(x0, lin.weight, lin.bias)) and torch.equal(y, y2)
    y.sum().backward()
    ref(xb).sum().backward()
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(lin.weight.grad, ref.weight.grad)
    assert lin.fp8_steps.tolist() == [0, 0, 0]
    recs = [r for r in caplog.records if r.name == "fp8mix" and r.levelno == logging.DEBUG]
    assert recs, "no debug log line from logger 'fp8mix' for a tiny layer"
    msg = recs[0].getMessage()
    assert f"{in_f}" in msg and f"{out_f}" in msg and "Linear" in msg, msg


def test_sixteen_features_is_fp8():
    _, lin = make_pair(16, 16, seed=20)
    x = torch.randn(8, 16)
    with fp8_autocast():
        y = lin(x)
    assert not torch.equal(y, F.linear(x, lin.weight, lin.bias))
    assert lin.fp8_steps.tolist()[:2] == [1, 1]


# --------------------------------------------------------------------------------------
# FP8 weight cache
# --------------------------------------------------------------------------------------
def test_grad_accumulation_casts_weight_once_per_step():
    """is_first_microbatch=True casts and keeps the FP8 weight, False reuses it: one
    weight cast (and one weight amax record) per optimizer step."""
    torch.manual_seed(24)
    lin = fp8mix.Linear(64, 48)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    micro = 4
    for step in range(3):
        for i in range(micro):
            with fp8_autocast():
                lin(torch.randn(8, 64), is_first_microbatch=(i == 0)).square().mean().backward()
        # the last micro-batch's grad_output amax waits in fp8_grad_pending for the next forward
        assert lin.state_dict()["fp8_steps"].tolist() == [micro * (step + 1), step + 1, micro * (step + 1) - 1]
        assert (lin.fp8_grad_pending >= 0).sum().item() == 1
        opt.step()
        opt.zero_grad()
    # without the argument, every forward casts the weight
    with fp8_autocast():
        for _ in range(3):
            lin(torch.randn(8, 64))
    assert lin.fp8_steps.tolist()[:2] == [micro * 3 + 3, 6]


def test_reuse_without_cached_weight_raises():
    lin = fp8mix.Linear(64, 48)
    with fp8_autocast(), pytest.raises(RuntimeError, match="is_first_microbatch"):
        lin(torch.randn(8, 64), is_first_microbatch=False)


@pytest.mark.parametrize("recipe", ["current", "block"])
def test_cached_weight_equals_recomputing(recipe):
    """Micro-batches reuse the cached FP8 weight (is_first_microbatch); re-casting it
    every call gives the same outputs and gradients."""
    torch.manual_seed(25)
    a = fp8mix.Linear(64, 48)
    b = copy.deepcopy(a)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.05)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05)
    for step in range(2):
        for i in range(3):
            x = torch.randn(8, 64)
            with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
                ya, yb = a(x, is_first_microbatch=(i == 0)), b(x)
            assert torch.equal(ya, yb)
            ya.square().mean().backward()
            yb.square().mean().backward()
        assert torch.equal(a.weight.grad, b.weight.grad)
        opt_a.step(), opt_b.step(), opt_a.zero_grad(), opt_b.zero_grad()
    assert torch.equal(a.weight, b.weight)


def test_weight_change_through_optimizer_and_load_is_seen():
    torch.manual_seed(26)
    lin = fp8mix.Linear(64, 64)
    x = torch.randn(8, 64)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        lin(x).sum().backward()
        opt.step()
        y = lin(x)
    assert sqnr_db(F.linear(x, lin.weight, lin.bias), y) >= 25
    new = nn.Linear(64, 64)
    lin.load_state_dict(new.state_dict())
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        y = lin(x)
    assert sqnr_db(new(x), y) >= 25


@pytest.mark.parametrize("how", ["data_inplace", "data_copy", "no_grad_copy"])
def test_weight_cache_sees_in_place_updates(how):
    """Manual SGD (`p.data.add_(...)`), EMA or weight loading through `.data` are common;
    `.data` has its own version counter, so a (version, data_ptr) key cannot see them."""
    torch.manual_seed(27)
    lin = fp8mix.Linear(64, 64, bias=False)
    x = torch.randn(8, 64)
    rec = CurrentScaling()
    with fp8_autocast(fp8_recipe=rec):
        lin(x)
    new = torch.randn(64, 64)
    if how == "data_inplace":
        lin.weight.data.mul_(-3.0)
    elif how == "data_copy":
        lin.weight.data.copy_(new)
    else:
        with torch.no_grad():
            lin.weight.copy_(new)
    with fp8_autocast(fp8_recipe=rec):
        y = lin(x)
    s = sqnr_db(x @ lin.weight.t(), y)
    assert s >= 25, f"stale FP8 weight after a {how} update of the parameter (SQNR {s:.1f} dB)"


def test_weight_cache_sees_copy_with_preserved_version_counter():
    """FSDP2 all-gathers each step's weights into the same unsharded Parameter under
    torch.autograd._unsafe_preserve_version_counter (its version stays 0) and often at the
    same address; torch.func.functional_call with fresh weight tensors can land on a
    freed tensor's address with the same version 0. A (version, data_ptr) key then
    returns the previous weight's FP8 cast. (Under FSDP2 the hit/miss can also differ
    between ranks, and a miss all-reduces the weight amax while a hit does not: a hang.
    See test_distributed.py.)"""
    torch.manual_seed(28)
    lin = fp8mix.Linear(64, 64, bias=False)
    x = torch.randn(8, 64)
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        lin(x)
    new = torch.randn(64, 64) * 3.0
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(lin.weight):
        lin.weight.copy_(new)
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        y = lin(x)
    s = sqnr_db(x @ new.t(), y)
    assert s >= 25, f"stale FP8 weight after the weight's contents changed (SQNR {s:.1f} dB)"


# --------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------
FP8_KEYS = ("fp8_amax_history", "fp8_scale", "fp8_steps")


def _train_steps(model, opt, steps, recipe, start=0, batch=32, in_f=32):
    losses = []
    for i in range(start, start + steps):
        gen = torch.Generator().manual_seed(1000 + i)
        scale = 1.0 + 3.0 * (i % 3)  # varying magnitudes exercise the histories
        x = torch.randn(batch, in_f, generator=gen) * scale
        t = torch.randn(batch, 16, generator=gen)
        with fp8_autocast(fp8_recipe=recipe):
            loss = F.mse_loss(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(fp8mix.Linear(32, 64), nn.ReLU(), fp8mix.Linear(64, 64), nn.GELU(), fp8mix.Linear(64, 16))


def test_fp8_state_is_in_state_dict_and_round_trips():
    rec = DelayedScaling(amax_history_len=4)
    model = _mlp(30)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train_steps(model, opt, 6, rec)
    sd = model.state_dict()
    for i in (0, 2, 4):
        for k in FP8_KEYS:
            assert f"{i}.{k}" in sd
        assert dict(model[i].named_buffers()).keys() >= set(FP8_KEYS)
        assert sd[f"{i}.fp8_amax_history"].shape == (1024, 3)  # one shape for every recipe up to 1024
        assert not sd[f"{i}.fp8_amax_history"][4:].any()  # rows beyond the recipe's length unused
        assert sd[f"{i}.fp8_amax_history"].dtype == torch.float32
        assert sd[f"{i}.fp8_scale"].shape == (3,) and sd[f"{i}.fp8_steps"].dtype == torch.int64
        assert sd[f"{i}.fp8_steps"].tolist() == [6, 6, 5]  # the 6th grad_output amax is pending
        assert (sd[f"{i}.fp8_grad_pending"] >= 0).sum() == 1
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    sd2 = torch.load(buf)
    fresh = _mlp(31)
    with fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=9)):  # another recipe ran before: no matter
        fresh(torch.randn(2, 32))
    fresh.load_state_dict(sd2, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
        assert fresh.state_dict()[k].shape == v.shape, k


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_resume_from_checkpoint_is_bit_identical(opt_name):
    rec = DelayedScaling(amax_history_len=8)
    make_opt = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-3),
    }[opt_name]
    total, k = 8, 3
    model = _mlp(40)
    opt = make_opt(model.parameters())
    full = _train_steps(model, opt, total, rec)

    model = _mlp(40)
    opt = make_opt(model.parameters())
    first = _train_steps(model, opt, k, rec)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    model2 = _mlp(41)  # different init: everything must come from the checkpoint
    opt2 = make_opt(model2.parameters())
    model2.load_state_dict(ck["model"], strict=True)
    opt2.load_state_dict(ck["opt"])
    rest = _train_steps(model2, opt2, total - k, rec, start=k)
    resumed = first + rest
    assert [v.item() for v in resumed] == [v.item() for v in full]
    assert all(torch.equal(a, b) for a, b in zip(resumed, full))


# --------------------------------------------------------------------------------------
# a real training loop
# --------------------------------------------------------------------------------------
def _regression_task():
    gen = torch.Generator().manual_seed(50)
    n, d_in, d_out = 1024, 32, 16
    x = torch.randn(n, d_in, generator=gen)
    w1 = torch.randn(d_in, 48, generator=gen) / math.sqrt(d_in)
    w2 = torch.randn(48, d_out, generator=gen) / math.sqrt(48)
    y = torch.tanh(x @ w1) @ w2
    y = y / y.std() + 0.3 * torch.randn(n, d_out, generator=gen)  # noise floor 0.09
    return x, y


def _train_mlp(recipe, steps=250, batch=64):
    x, y = _regression_task()
    torch.manual_seed(51)
    model = nn.Sequential(fp8mix.Linear(32, 128), nn.GELU(), fp8mix.Linear(128, 128), nn.GELU(),
                          fp8mix.Linear(128, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(52)
    ctx = (lambda: fp8_autocast(fp8_recipe=recipe)) if recipe is not None else (lambda: fp8_autocast(enabled=False))
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        with ctx():
            loss = F.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad(), ctx():
        final = F.mse_loss(model(x), y).item()
    return final, model


def test_training_loop_matches_float32():
    f32, _ = _train_mlp(None)
    assert f32 < 0.2, f"float32 baseline did not learn (loss {f32})"
    for name in ("delayed", "current"):
        loss, model = _train_mlp(RECIPES[name]())
        if name == "delayed":  # 250 steps recorded; the last grad_output amax pending; the no_grad loss none
            steps = [m.fp8_steps.tolist() for m in model if isinstance(m, fp8mix.Linear)]
            assert steps == [[250, 250, 249]] * 3, steps
        rel = abs(loss - f32) / f32
        assert math.isfinite(loss) and rel <= 0.05, f"{name}: FP8 loss {loss:.5f} vs float32 {f32:.5f} ({rel:.1%})"


# --------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", RECIPE_IDS)
def test_bad_input(recipe):
    lin = fp8mix.Linear(32, 24)
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        with pytest.raises(ValueError, match="32"):
            lin(torch.randn(4, 31))
        with pytest.raises(ValueError, match=r"shape \(33, 4\), expected \(\.\.\., 32\)"):
            lin(torch.randn(4, 33, 1).squeeze(-1).t().contiguous())  # (33, 4)
        with pytest.raises(TypeError, match="float64"):
            lin(torch.randn(4, 32, dtype=torch.float64))
        with pytest.raises(TypeError, match="float32, bfloat16 or float16, got torch.int64"):
            lin(torch.ones(4, 32, dtype=torch.int64))
        with pytest.raises(TypeError, match="float32, bfloat16 or float16, got torch.int8"):
            lin(torch.ones(4, 32, dtype=torch.int8))
        with pytest.raises(ValueError, match="input is on meta, weight on cpu"):
            lin(torch.randn(4, 32, device="meta"))
    assert int(lin.fp8_steps.sum()) == 0  # nothing recorded by rejected calls


@pytest.mark.parametrize("recipe", RECIPE_IDS)
def test_meta_module_and_input(recipe):
    """All on meta (shape inference, deferred init): either a meta output of the right
    shape or a clear error naming the device -- not an internal parse error."""
    lin = fp8mix.Linear(32, 24, device="meta")
    x = torch.randn(4, 32, device="meta")
    try:
        with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = lin(x)
    except Exception as e:  # noqa: BLE001
        assert isinstance(e, (NotImplementedError, ValueError, TypeError)) and "meta" in str(e).lower(), \
            f"unclear error for meta tensors: {type(e).__name__}: {e}"
    else:
        assert y.device.type == "meta" and y.shape == (4, 24)


# --------------------------------------------------------------------------------------
# double backward (issue #12, item 5)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_gradient_penalty_on_the_input_matches_nn_linear(recipe):
    """R1-style penalty ||d out / d x||^2: the second-order gradients (w.r.t. the weights,
    through dx) agree with a high-precision model's within FP8 tolerance, and are not zero."""
    torch.manual_seed(70)
    fp8 = nn.Sequential(fp8mix.Linear(64, 128), nn.Tanh(), fp8mix.Linear(128, 1))
    ref = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1))
    ref.load_state_dict({k: v for k, v in fp8.state_dict().items() if "fp8_" not in k})
    x = torch.randn(32, 64)
    grads = []
    for model, ctx in ((fp8, fp8_autocast(fp8_recipe=RECIPES[recipe]())), (ref, torch.enable_grad())):
        xi = x.clone().requires_grad_()
        with ctx:
            out = model(xi).sum()
        (gx,) = torch.autograd.grad(out, xi, create_graph=True)
        gx.square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    assert [g is None for g in grads[0]] == [g is None for g in grads[1]]
    for g8, gr in zip(*grads):
        if gr is not None:
            assert gr.abs().sum() > 0 and g8.abs().sum() > 0
            assert sqnr_db(gr, g8) >= 15, sqnr_db(gr, g8)


@pytest.mark.parametrize("how", ["grad_of_weight", "backward"])
def test_create_graph_with_the_weight_gradient_raises_naming_fp8mix(how):
    lin = fp8mix.Linear(32, 32)
    x = torch.randn(8, 32, requires_grad=True)
    with fp8_autocast():
        out = lin(x).square().sum()
    with pytest.raises(RuntimeError, match="fp8mix: create_graph=True with the weight's gradient"):
        if how == "backward":
            out.backward(create_graph=True)
        else:
            torch.autograd.grad(out, lin.weight, create_graph=True)


def test_double_backward_through_block_scaling_is_refused():
    lin = fp8mix.Linear(32, 32)
    x = torch.randn(8, 32, requires_grad=True)
    with fp8_autocast(fp8_recipe=BlockScaling()):
        out = lin(x).sum()
    with pytest.raises(NotImplementedError, match="BlockScaling"):
        torch.autograd.grad(out, x, create_graph=True)


# --------------------------------------------------------------------------------------
# non-finite inputs and weights (issue #12, item 7)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", RECIPE_IDS)
@pytest.mark.parametrize("where", ["x_inf", "x_neg_inf", "x_nan", "w_inf", "w_nan"])
def test_non_finite_input_or_weight_gives_non_finite_output(recipe, where):
    """As nn.Linear: an inf/NaN in x or W reaches the output (a saturating cast would turn
    an inf into a finite 448 that no inf check sees)."""
    torch.manual_seed(71)
    lin = fp8mix.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    bad = {"x_inf": math.inf, "x_neg_inf": -math.inf, "x_nan": math.nan, "w_inf": math.inf, "w_nan": math.nan}[where]
    if where.startswith("x"):
        x[3, 5] = bad
    else:
        with torch.no_grad():
            lin.weight[7, 9] = bad
    ref = F.linear(x, lin.weight)
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = lin(x)
    assert not torch.isfinite(ref).all()
    assert not torch.isfinite(y).all(), "the non-finite value vanished in the FP8 cast"
    assert torch.equal(torch.isfinite(y), torch.isfinite(ref))  # non-finite exactly where nn.Linear's is


# --------------------------------------------------------------------------------------
# Format.AUTO with gradient accumulation (issue #12, item 8)
# --------------------------------------------------------------------------------------
def test_accumulation_keeps_working_across_format_switches():
    from fp8mix.auto_format import AutoFormat
    torch.manual_seed(72)
    lin = fp8mix.Linear(128, 128)
    rec = CurrentScaling(fp8_format="AUTO", auto=AutoFormat(warmup=1, interval=1, patience=1))
    g = torch.Generator().manual_seed(73)
    switches = 0
    prev = lin.fp8_format_report()["input"][0]
    for step in range(6):
        for micro in range(3):
            # inputs alternate between a narrow and a 2^30-wide range: AUTO switches the input format
            x = torch.randn(16, 128, generator=g)
            if step % 2:
                x = x * torch.pow(2.0, torch.randint(-15, 15, (16, 128), generator=g).float())
            with fp8_autocast(fp8_recipe=rec):
                lin(x, is_first_microbatch=micro == 0).sum().backward()
            now = lin.fp8_format_report()["input"][0]
            switches += now != prev
            prev = now
    assert switches >= 2, "the schedule should make AUTO switch formats mid-accumulation"
