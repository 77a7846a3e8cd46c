"""Per-channel smoothing (Smooth-SwiGLU, fp8mix.nn.smooth): LayerNormMLP(smooth_swiglu=True)
and fp8mix.Linear.fp8_smooth compute the unsmoothed function (bit for bit outside
fp8_autocast, within FP8 tolerance of the float64 reference inside), and on an input with
outlier channels their FP8 error is lower than without smoothing. References: the same
module in float64 outside any autocast (torch's ops), not fp8mix's casts."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import fp8mix
from fp8mix.nn.layernorm_mlp import LayerNormMLP
from fp8mix.nn.smooth import smooth_operands, smoothing_scales
from fp8mix.recipe import CurrentScaling

# channels of the SwiGLU output made ~65000x larger (gate and up rows x256 each: beyond
# what one E4M3 scale holds for the other channels, whose values then fall below 2^-6;
# 1000x alone E4M3 holds) and fc2's columns for them 65536x smaller: the function's output
# keeps every channel's share (as in trained LLMs, whose outlier channels meet small
# weights), so what a cast loses on the other channels shows in the output
OUT = [3, 70]


def _sqnr(ref: torch.Tensor, y: torch.Tensor) -> float:
    ref, y = ref.detach(), y.detach()
    return 10 * math.log10(float(ref.pow(2).sum()) / float((y.double() - ref).pow(2).sum()))


def _mlp(smooth: bool, outliers: bool = True) -> LayerNormMLP:
    torch.manual_seed(0)
    m = LayerNormMLP(64, 128, activation="swiglu", normalization="RMSNorm", smooth_swiglu=smooth)
    if outliers:
        with torch.no_grad():
            for c in OUT:
                m.fc1_weight[c] *= 256.0
                m.fc1_weight[128 + c] *= 256.0
                m.fc2_weight[:, c] /= 65536.0
    return m


def _run(m, x, grad=False):
    x = x.clone().requires_grad_(grad)
    with fp8mix.fp8_autocast(enabled=True, fp8_recipe=CurrentScaling()):
        y = m(x)
    if grad:
        y.pow(2).sum().backward()
    return y


def test_outside_autocast_smoothing_changes_nothing_bit_for_bit():
    x = torch.randn(32, 64)
    assert torch.equal(_mlp(True)(x), _mlp(False)(x))


def test_scales_are_powers_of_two_and_the_products_exact():
    torch.manual_seed(1)
    x, w = torch.randn(64, 48) * torch.logspace(-3, 3, 48), torch.randn(16, 48)
    xs, ws, s = smooth_operands(x, w)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)
    assert torch.equal(xs / s, x) and torch.equal(ws * s, w)  # power-of-two products: exact in float32
    # alpha=0.5 balances the channel ranges: x*s and w/s have the same per-channel amax within 2x each way
    r = (xs.abs().amax(0) / (ws.abs().amax(0))).log2().abs()
    assert float(r.max()) <= 1.0 + 1e-6
    assert torch.equal(smoothing_scales(torch.zeros(4, 3), torch.ones(2, 3)), torch.ones(3))  # dead channels: 1


def test_smooth_swiglu_equals_the_float64_math_within_fp8_tolerance_and_beats_plain_on_outliers():
    x = torch.randn(256, 64)
    ref = copy.deepcopy(_mlp(False)).double()(x.double())
    y_plain, y_smooth = _run(_mlp(False), x), _run(_mlp(True), x)
    s_plain, s_smooth = _sqnr(ref, y_plain), _sqnr(ref, y_smooth)
    # two E4M3 casts (3 mantissa bits: ~31 dB each on well-scaled data) per GEMM, two GEMMs:
    # about 25 dB end to end when nothing is lost to range; 20 dB is the planner's own limit
    assert s_smooth > 20.0
    assert s_smooth > s_plain + 3.0, (s_plain, s_smooth)


def test_smooth_swiglu_gradients_match_float64_within_fp8_tolerance():
    x = torch.randn(128, 64)
    ref_m = copy.deepcopy(_mlp(True)).double()
    xr = x.double().requires_grad_(True)
    ref_m(xr).pow(2).sum().backward()
    m = _mlp(True)
    xg = x.clone().requires_grad_(True)
    with fp8mix.fp8_autocast(enabled=True, fp8_recipe=CurrentScaling()):
        m(xg).pow(2).sum().backward()
    # gradients go through E5M2 (2 mantissa bits, ~25 dB per cast) and two E4M3 operands
    for got, want in ((xg.grad, xr.grad), (m.fc2_weight.grad, ref_m.fc2_weight.grad),
                      (m.fc1_weight.grad, ref_m.fc1_weight.grad)):
        assert _sqnr(want, got) > 15.0


def test_linear_fp8_smooth_beats_plain_on_outlier_channels():
    torch.manual_seed(2)
    lin = fp8mix.Linear(128, 64)
    x = torch.randn(256, 128)
    x[:, [5, 77]] *= 2.0 ** 17  # beyond E4M3's range for the other channels under one scale
    with torch.no_grad():
        lin.weight[:, [5, 77]] /= 2.0 ** 17  # (as OUT above: the output keeps every channel's share)
    ref = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    plain = _run(lin, x)
    lin.fp8_smooth = True
    smooth = _run(lin, x)
    assert _sqnr(ref, smooth) > _sqnr(ref, plain) + 3.0
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))  # outside: nn.Linear's


def test_bad_smoothing_arguments_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        LayerNormMLP(32, 64, activation="swiglu", smooth_swiglu=True, smooth_alpha=0.0)
    with pytest.raises(TypeError, match="smooth_swiglu"):
        LayerNormMLP(32, 64, activation="swiglu", smooth_swiglu="yes")
    with fp8mix.fp8_model_init():
        lin = fp8mix.Linear(32, 32)
    lin.fp8_smooth = True
    with pytest.raises(ValueError, match="FP8 primary weight"):
        _run(lin, torch.randn(4, 32))
