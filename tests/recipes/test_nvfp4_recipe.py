"""NVFP4BlockScaling in fp8mix.Linear: the three GEMMs against their definition composed
from fp8mix.nvfp4's pieces (themselves tested against ml_dtypes in tests/test_nvfp4.py),
against nn.Linear / float64 within FP4's error, the stochastic stream (drawn in backward,
kept by state_dict, untouched by activation checkpointing) and bad input."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fp8mix
from fp8mix import nvfp4
from fp8mix.recipe import NVFP4BlockScaling


def _layer(i=32, o=48, bias=True, seed=0):
    torch.manual_seed(seed)
    return fp8mix.Linear(i, o, bias=bias)


def _sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref, got = ref.double(), got.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum()))


def test_forward_is_the_defined_product():
    m = _layer()
    x = torch.randn(5, 7, 32)
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling()):
        y = m(x)
    want = nvfp4.mm(nvfp4.quantize(x), nvfp4.quantize(m.weight.detach(), tile_2d=True)) + m.bias.detach()
    assert torch.equal(y, want)
    assert _sqnr_db(F.linear(x, m.weight, m.bias), y) > 12  # FP4 on both operands: about 2 bits
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(disable_2d_quantization=True)):
        y1 = m(x)
    assert torch.equal(y1, nvfp4.mm(nvfp4.quantize(x), nvfp4.quantize(m.weight.detach())) + m.bias.detach())


def _hadamard16() -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(4):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("rows", [16, 21])
def test_backward_is_the_defined_products(rows):
    recipe = NVFP4BlockScaling()
    m = _layer()
    x = torch.randn(rows, 32, requires_grad=True)
    dy = torch.randn(rows, 48)
    words = m.fp8_rng.clone()
    with fp8mix.fp8_autocast(fp8_recipe=recipe):
        y = m(x)
    assert torch.equal(m.fp8_rng, words)  # the forward draws nothing
    y.backward(dy)
    assert not torch.equal(m.fp8_rng, words)  # the backward moved the stream past its words
    w = m.weight.detach()
    # dgrad: dy 1x16 stochastic with the words from the stream's offset on; W^T in 16x16 tiles
    dyq = nvfp4.quantize(dy, rng=words)
    assert torch.equal(x.grad, nvfp4.mm(dyq, nvfp4.quantize(w.t().contiguous(), tile_2d=True)))
    # wgrad: both operands along tokens (padded to 16), after H D / 4 — checked in float64 against
    # the transform written here as a matrix
    pad = -rows % 16
    dyt = F.pad(dy.t(), (0, pad)).contiguous()
    xt = F.pad(x.detach().t(), (0, pad)).contiguous()
    gq = nvfp4.quantize(nvfp4.random_hadamard(dyt, signs=recipe.rht_signs), rng=words,
                        rng_skip=-(-rows * 48 // 4) * 4)
    xq = nvfp4.quantize(nvfp4.random_hadamard(xt, signs=recipe.rht_signs))
    assert torch.equal(m.weight.grad, nvfp4.mm(gq, xq))
    d = torch.tensor([-1.0 if (recipe.rht_signs >> c) & 1 else 1.0 for c in range(16)], dtype=torch.float64)
    hd = _hadamard16() * d / 4
    rht = torch.block_diag(*[hd] * ((rows + pad) // 16))
    torch.testing.assert_close(nvfp4.random_hadamard(xt, signs=recipe.rht_signs).double(), xt.double() @ rht.T,
                               rtol=0, atol=1e-5)
    assert torch.equal(m.bias.grad, dy.sum(0))
    # and every gradient is the float32 one within FP4's error
    ref = torch.nn.Linear(32, 48)
    ref.load_state_dict({"weight": w, "bias": m.bias.detach()})
    xr = x.detach().clone().requires_grad_(True)
    ref(xr).backward(dy)
    assert _sqnr_db(xr.grad, x.grad) > 8 and _sqnr_db(ref.weight.grad, m.weight.grad) > 8


def test_stochastic_gradients_are_unbiased():
    torch.manual_seed(1)
    m = fp8mix.Linear(16, 16, bias=False)
    x = torch.randn(16, 16, requires_grad=True)
    dy = torch.randn(16, 16)
    grads = []
    for _ in range(200):
        x.grad = None
        with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(disable_2d_quantization=True)):
            m(x).backward(dy)
        grads.append(x.grad.clone())
    mean = torch.stack(grads).double().mean(0)
    # E[Q_sr(dy)] = dy (the block scales do not depend on the words), so the mean tends to
    # dy @ Q(W^T)^T, float64 here; its error shrinks like 1/sqrt(n)
    wt = nvfp4.quantize(m.weight.detach().t().contiguous()).dequantize(torch.float64)
    target = dy.double() @ wt.T
    single = (grads[0].double() - target).norm() / target.norm()
    assert (mean - target).norm() / target.norm() < 0.25 * single
    # nearest rounding instead: the same error every step (biased)
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(disable_2d_quantization=True,
                                                          disable_stochastic_rounding=True)):
        x.grad = None
        m(x).backward(dy)
    assert (x.grad.double() - target).norm() / target.norm() > 0.5 * single


def test_checkpointing_and_resume_are_exact():
    recipe = NVFP4BlockScaling()
    base = torch.nn.Sequential(fp8mix.Linear(32, 32), torch.nn.GELU(), fp8mix.Linear(32, 16))
    torch.manual_seed(3)
    data = [(torch.randn(12, 32), torch.randn(12, 16)) for _ in range(5)]

    def run(model, steps, ckpt=False):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for x, t in steps:
            with fp8mix.fp8_autocast(fp8_recipe=recipe):
                y = checkpoint(model, x, use_reentrant=False) if ckpt else model(x)
            loss = F.mse_loss(y, t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, opt

    a = copy.deepcopy(base)
    la, _ = run(a, data)
    b = copy.deepcopy(base)
    lb, _ = run(b, data, ckpt=True)
    assert la == lb and all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = copy.deepcopy(base)
    run(c, data[:3])
    d = copy.deepcopy(base)
    d.load_state_dict(c.state_dict())  # fp8_rng travels with the state
    ld, _ = run(d, data[3:])
    assert ld == la[3:]


def test_trains_close_to_float32():
    torch.manual_seed(0)
    w_true = torch.randn(16, 64)
    xs = torch.randn(40, 32, 64)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))
    fp4 = fp8mix.convert_model(copy.deepcopy(ref))
    losses = {}
    for name, model in (("fp32", ref), ("nvfp4", fp4)):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for x in xs:
            with fp8mix.fp8_autocast(enabled=name == "nvfp4", fp8_recipe=NVFP4BlockScaling()):
                loss = F.mse_loss(model(x), x @ w_true.T / 8)
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses[name] = loss.item()
    first = F.mse_loss(torch.zeros(32, 16), xs[0] @ w_true.T / 8).item()
    assert losses["nvfp4"] < 0.5 * first  # it learns
    assert losses["nvfp4"] < 3 * losses["fp32"] + 0.05, losses  # within FP4's cost of float32


def test_non_finite_input_propagates():
    m = _layer()
    x = torch.randn(3, 32)
    x[1, 5] = float("nan")
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling()):
        y = m(x)
    assert y[1].isnan().all() and not y[0].isnan().any() and not y[2].isnan().any()


def test_bad_input():
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling()):
        with pytest.raises(ValueError, match="in_features to be a multiple of 16.*in_features=40"):
            fp8mix.Linear(40, 32)(torch.randn(2, 40))
        with pytest.raises(ValueError, match="out_features to be a multiple of 16.*out_features=20"):
            fp8mix.Linear(32, 20)(torch.randn(2, 32))
        with pytest.raises(NotImplementedError, match="LayerNormLinear: NVFP4BlockScaling"):
            fp8mix.LayerNormLinear(32, 32)(torch.randn(2, 32))
    with pytest.raises(ValueError, match="rht_signs"):
        NVFP4BlockScaling(rht_signs=1 << 16)
    with pytest.raises(ValueError, match="E4M3"):
        NVFP4BlockScaling(fp8_format="E5M2")
    with pytest.raises(TypeError, match="disable_rht"):
        NVFP4BlockScaling(disable_rht=1)


def test_te_environment_defaults(monkeypatch):
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "1")
    r = NVFP4BlockScaling()
    assert r.disable_rht and r.disable_2d_quantization and not r.disable_stochastic_rounding
