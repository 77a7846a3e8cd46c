"""fp8mix.LayerNormLinear: Transformer Engine's LayerNorm/RMSNorm -> Linear with the norm's
output cast to FP8 by the fused kernel.

What is checked:
  * TE's constructor names, parameters and state_dict keys (layer_norm_weight,
    layer_norm_bias, weight, bias), init_method, return_bias, return_layernorm_output,
    the unimplemented TE options raising, bad input;
  * outside fp8_autocast (and with enabled=False): exactly F.layer_norm / F.rms_norm then
    F.linear, outputs and every gradient bit for bit;
  * inside, every recipe: forward >= 25 dB and gradients (x, W, b, gamma, beta) >= 18 dB
    SQNR against a float64 reference, as fp8mix.Linear's bounds, really FP8 (< 60 dB);
  * the fused path saves no high-precision normalized tensor (saved-tensor hooks);
  * state_dict round trip (a copy continues bit for bit), a TE checkpoint with
    ``_extra_state`` loads, activation checkpointing (both torch modes and
    fp8mix.checkpoint, every recipe, stochastic rounding) bit-identical to none with the
    same FP8 state, evaluation / no_grad forwards leave the state, the tensor-core
    operand layouts and every ISA give the same bits, a sampling monitor changes nothing,
    calibration records the normalized x's amax, gradient accumulation's weight cache.
"""
from __future__ import annotations

import copy
import inspect
import io

import pytest
import torch
import torch.nn.functional as F
from helpers import sqnr_db
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import fp8mix
from fp8mix import ops
from fp8mix.nn import _plan
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": lambda: CurrentScaling(),
    "block": lambda: BlockScaling(),
}
SR_RECIPES = {**RECIPES, "delayed_sr": lambda: DelayedScaling(amax_history_len=4, rounding="stochastic"),
              "block_sr": lambda: BlockScaling(rounding="stochastic")}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


def make(in_f=96, out_f=80, normalization="LayerNorm", seed=0, **kw):
    torch.manual_seed(seed)
    m = fp8mix.LayerNormLinear(in_f, out_f, normalization=normalization, **kw)
    with torch.no_grad():  # a norm that is not the identity, so its gradients matter
        m.layer_norm_weight.add_(torch.randn(in_f) * 0.3)
        if m.layer_norm_bias is not None:
            m.layer_norm_bias.normal_(0, 0.2)
        if m.bias is not None:
            m.bias.normal_(0, 0.1)
    return m


def reference(m, x, *, dtype=torch.float64):
    """norm -> linear in torch's ops on copies of m's parameters in `dtype`."""
    p = {n: t.detach().to(dtype).requires_grad_() for n, t in m.named_parameters()}
    gamma = (1 + p["layer_norm_weight"]) if m.zero_centered_gamma else p["layer_norm_weight"]
    xr = x.detach().to(dtype).requires_grad_()
    if m.normalization == "LayerNorm":
        ln = F.layer_norm(xr, (m.in_features,), gamma, p["layer_norm_bias"], m.eps)
    else:
        ln = F.rms_norm(xr, (m.in_features,), gamma, m.eps)
    return F.linear(ln, p["weight"], p.get("bias")), xr, p


# --------------------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------------------
def test_te_signature_parameters_and_keys():
    names = list(inspect.signature(fp8mix.LayerNormLinear.__init__).parameters)[1:12]
    assert names == ["in_features", "out_features", "eps", "bias", "normalization", "zero_centered_gamma",
                     "return_layernorm_output", "return_bias", "params_dtype", "device", "init_method"]
    m = fp8mix.LayerNormLinear(64, 32, params_dtype=torch.bfloat16)
    assert [n for n, _ in m.named_parameters()] == ["layer_norm_weight", "layer_norm_bias", "weight", "bias"]
    assert all(p.dtype == torch.bfloat16 for p in m.parameters()) and m.fp8_scale.dtype == torch.float32
    assert [k for k in m.state_dict() if not k.startswith("fp8_")] == ["layer_norm_weight", "layer_norm_bias",
                                                                       "weight", "bias"]
    r = fp8mix.LayerNormLinear(64, 32, normalization="RMSNorm", bias=False)
    assert [n for n, _ in r.named_parameters()] == ["layer_norm_weight", "weight"] and r.layer_norm_bias is None
    # TE's initialisation: norm at identity, weight normal(0, 0.023), bias 0; init_method on the weight
    assert torch.equal(m.layer_norm_weight, torch.ones(64)) and torch.equal(m.bias, torch.zeros(32))
    big = fp8mix.LayerNormLinear(512, 512)
    assert abs(float(big.weight.detach().std()) - 0.023) < 0.001
    c = fp8mix.LayerNormLinear(64, 32, init_method=lambda w: torch.nn.init.constant_(w, 0.5))
    assert torch.equal(c.weight, torch.full((32, 64), 0.5))
    z = fp8mix.LayerNormLinear(64, 32, zero_centered_gamma=True)
    assert torch.equal(z.layer_norm_weight, torch.zeros(64))
    m2 = fp8mix.LayerNormLinear(8, 4, device="meta")
    assert m2.weight.is_meta


@pytest.mark.parametrize("option,value", [("fuse_wgrad_accumulation", True), ("ub_overlap_ag", True),
                                          ("ub_bulk_wgrad", True), ("parameters_split", ("query", "key"))])
def test_unimplemented_te_options_raise(option, value):
    with pytest.raises(NotImplementedError, match=f"{option}.*fp8mix does not implement"):
        fp8mix.LayerNormLinear(32, 32, **{option: value})


def test_te_row_parallel_is_refused():
    """Column mode is TE's (tests/nn/test_linear_te_options.py, tests/distributed/)."""
    with pytest.raises(NotImplementedError, match="parallel_mode='row'"):
        fp8mix.LayerNormLinear(32, 32, parallel_mode="row")


def test_accepted_and_unknown_options():
    fp8mix.LayerNormLinear(32, 32, get_rng_state_tracker=lambda: None, name="qkv", ub_name="qkv", tp_size=1,
                           sequence_parallel=False, parallel_mode=None, ub_overlap_ag=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalisation'"):
        fp8mix.LayerNormLinear(32, 32, normalisation="RMSNorm")
    with pytest.raises(ValueError, match="normalization must be"):
        fp8mix.LayerNormLinear(32, 32, normalization="BatchNorm")
    with pytest.raises(TypeError, match="return_bias must be True or False"):
        fp8mix.LayerNormLinear(32, 32, return_bias=1)
    with pytest.raises(TypeError, match="init_method must be a callable"):
        fp8mix.LayerNormLinear(32, 32, init_method=0.02)


@pytest.mark.filterwarnings("ignore:fp8mix.fp8_autocast. no fp8mix module ran")
def test_bad_input_raises():
    m = make(64, 32)
    with fp8mix.fp8_autocast():
        with pytest.raises(ValueError, match=r"expected \(\.\.\., 64\)"):
            m(torch.randn(4, 63))
        with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
            m(torch.randn(4, 64).double())


# --------------------------------------------------------------------------------------
# high precision: exactly torch's ops
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["outside", "disabled", "tiny"])
def test_high_precision_is_norm_then_linear_bit_for_bit(normalization, dtype, mode):
    in_f, out_f = (8, 32) if mode == "tiny" else (96, 80)
    m = make(in_f, out_f, normalization, zero_centered_gamma=normalization == "RMSNorm").to(dtype)
    x0 = torch.randn(3, 11, in_f, dtype=dtype)
    ref, xr, p = reference(m, x0, dtype=dtype)
    ref.backward(torch.ones_like(ref))
    x = x0.clone().requires_grad_()
    with fp8mix.fp8_autocast(enabled=mode != "disabled"):
        y = m(x) if mode != "outside" else None
    if mode == "outside":
        y = m(x)
    y.backward(torch.ones_like(y))
    assert y.dtype == dtype and torch.equal(y, ref) and torch.equal(x.grad, xr.grad)
    for n, t in m.named_parameters():
        assert torch.equal(t.grad, p[n].grad), n


# --------------------------------------------------------------------------------------
# FP8: accuracy
# --------------------------------------------------------------------------------------
SHAPES = [((17,), 33, 65), ((3, 11), 48, 80), ((64,), 129, 130), ((2, 70), 256, 96)]


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("lead,K,N", SHAPES, ids=[f"{'x'.join(map(str, s))}x{k}->{n}" for s, k, n in SHAPES])
def test_accuracy_vs_float64(recipe, normalization, lead, K, N):
    m = make(K, N, normalization, seed=K + N)
    torch.manual_seed(7)
    x0 = torch.randn(*lead, K) * 2 + 0.5
    g = torch.randn(*lead, N)
    ref, xr, p = reference(m, x0)
    ref.backward(g.double())
    x = x0.clone().requires_grad_()
    with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = m(x)
    y.backward(g)
    assert y.shape == ref.shape and y.dtype == torch.float32
    got = {"forward": sqnr_db(ref, y), "dx": sqnr_db(xr.grad, x.grad)}
    got.update({n: sqnr_db(p[n].grad, t.grad) for n, t in m.named_parameters()})
    assert got["forward"] >= 25, got
    assert all(v >= 18 for v in got.values()), got
    assert got["forward"] < 60 and got["dx"] < 60 and got["weight"] < 60, f"not FP8: {got}"


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_return_layernorm_output_and_bias(recipe):
    m = make(96, 80, return_layernorm_output=True, return_bias=True)
    x0 = torch.randn(40, 96)
    ref, xr, p = reference(m, x0)
    ln_ref = F.layer_norm(xr, (96,), p["layer_norm_weight"], p["layer_norm_bias"], m.eps)
    ref = ref - p["bias"]
    (ref.square().sum() + ln_ref.pow(3).sum()).backward()
    x = x0.clone().requires_grad_()
    with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        out, bias, ln = m(x)
    assert bias is m.bias and ln.shape == x.shape
    torch.testing.assert_close(ln.double(), ln_ref, rtol=0, atol=1e-5)  # ln_out in high precision
    assert sqnr_db(ref, out) >= 25
    (out.square().sum() + ln.pow(3).sum()).backward()  # gradients through both outputs
    assert sqnr_db(xr.grad, x.grad) >= 18
    assert sqnr_db(p["layer_norm_weight"].grad, m.layer_norm_weight.grad) >= 18
    assert m.bias.grad is None  # not used by the module: the caller adds it


def test_torch_autocast_bf16():
    m = make(64, 48)
    x0 = torch.randn(2, 10, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16), fp8mix.fp8_autocast():
        y = m(x0)
    assert y.dtype == torch.bfloat16
    ref, _, _ = reference(m, x0)
    assert sqnr_db(ref, y) >= 25


def test_saves_no_high_precision_normalized_tensor():
    """What backward keeps: x itself, the per-row statistics, the FP8 ln (1 byte/elt) and
    the FP8 weight; never a float tensor of ln's size other than x's own storage."""
    m = make(256, 128)
    x = torch.randn(64, 256, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with fp8mix.fp8_autocast():
            m(x)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    big_hp = [t for t in saved if t.is_floating_point() and t.element_size() > 1 and t.numel() >= x.numel()
              and t.untyped_storage().data_ptr() not in params]
    assert all(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in big_hp), \
        [tuple(t.shape) for t in big_hp]
    assert any(t.dtype == torch.float8_e4m3fn and t.shape == (64, 256) for t in saved)


# --------------------------------------------------------------------------------------
# state: checkpoints, recompute, evaluation
# --------------------------------------------------------------------------------------
def _steps(m, recipe, n=3, mode=None, seed=0):
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = (torch.randn(48, m.in_features, generator=gen) * (1 + i)).requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            if mode is None:
                y = m(x)
            elif mode == "fp8mix":
                y = fp8mix.checkpoint(m, x)
            else:
                y = torch_checkpoint(m, x, use_reentrant=mode == "reentrant")
            y.square().mean().backward()
        out.append((y.detach(), x.grad.clone(), [p.grad.clone() for p in m.parameters()]))
        opt.step()
        opt.zero_grad()
    return out, {k: v.clone() for k, v in m.state_dict().items() if k.startswith("fp8_")}


@pytest.mark.parametrize("recipe", list(SR_RECIPES))
@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant", "fp8mix"])
def test_activation_checkpointing_is_bit_identical(recipe, mode):
    base = make(160, 144)
    ref, ref_state = _steps(copy.deepcopy(base), SR_RECIPES[recipe]())
    got, got_state = _steps(copy.deepcopy(base), SR_RECIPES[recipe](), mode=mode)
    for i, ((y0, x0, g0), (y1, x1, g1)) in enumerate(zip(ref, got)):
        assert torch.equal(y0, y1) and torch.equal(x0, x1), i
        assert all(torch.equal(a, b) for a, b in zip(g0, g1)), i
    for k in ref_state:
        assert torch.equal(ref_state[k], got_state[k]), k


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_state_dict_round_trip_continues_bit_for_bit(recipe):
    a = make(96, 80)
    _steps(a, RECIPES[recipe](), n=2)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = fp8mix.LayerNormLinear(96, 80)
    b.load_state_dict(torch.load(io.BytesIO(buf.getvalue())), strict=True)
    ra, sa = _steps(a, RECIPES[recipe](), n=2, seed=5)
    rb, sb = _steps(b, RECIPES[recipe](), n=2, seed=5)
    for (y0, x0, g0), (y1, x1, g1) in zip(ra, rb):
        assert torch.equal(y0, y1) and torch.equal(x0, x1) and all(torch.equal(p, q) for p, q in zip(g0, g1))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    if recipe == "delayed":
        assert sa["fp8_steps"].tolist() == [4, 4, 3]


def test_te_checkpoint_loads():
    """A checkpoint as TE saves it: TE's parameter names plus its FP8 metadata, which does
    not carry over (fresh FP8 state, a warning)."""
    m = make(64, 32)
    te_sd = {k: v.clone() for k, v in m.state_dict().items() if not k.startswith("fp8_")}
    te_sd["_extra_state"] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    fresh = fp8mix.LayerNormLinear(64, 32)
    with pytest.warns(UserWarning, match="not carried over"):
        res = fresh.load_state_dict(te_sd, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    assert torch.equal(fresh.weight, m.weight) and int(fresh.fp8_steps.sum()) == 0


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_evaluation_leaves_the_state(recipe):
    m = make(96, 80)
    _steps(m, RECIPES[recipe](), n=2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(16, 96)
    with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        with torch.no_grad():
            y1 = m(x)
        with torch.inference_mode():
            y2 = m(x)
        m.eval()
        y3 = m(x.requires_grad_())
        m.train()
    assert torch.equal(y1, y2) and torch.equal(y1, y3.detach())
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("recipe", list(SR_RECIPES))
def test_tensor_core_layouts_and_isas_give_the_same_bits(recipe, monkeypatch):
    base = make(160, 144)
    ref, ref_state = _steps(copy.deepcopy(base), SR_RECIPES[recipe]())
    monkeypatch.setattr(_plan, "TN_ON_CPU", True)
    ops.set_max_isa("scalar")
    got, got_state = _steps(copy.deepcopy(base), SR_RECIPES[recipe]())
    for (y0, x0, g0), (y1, x1, g1) in zip(ref, got):
        assert torch.equal(y0, y1) and torch.equal(x0, x1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert all(torch.equal(ref_state[k], got_state[k]) for k in ref_state)


def test_a_sampling_monitor_changes_nothing_and_sees_the_normalized_input():
    base = make(96, 80)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    mon = fp8mix.Monitor(every=1).attach(b)
    x = torch.randn(32, 96)
    with fp8mix.fp8_autocast():
        ya = a(x)
    with fp8mix.fp8_autocast(monitor=mon):
        yb = b(x)
    assert torch.equal(ya, yb)
    rows = [r for r in mon.records if r["role"] == "input"]
    ln = F.layer_norm(x, (96,), base.layer_norm_weight, base.layer_norm_bias, base.eps)
    assert rows and rows[-1]["amax"] == pytest.approx(float(ln.detach().abs().max()), rel=1e-5)
    assert 20 < rows[-1]["sqnr_db"] < 60  # the cast of the normalized values, not of a stand-in


def test_calibration_records_the_normalized_amax():
    m = make(96, 80)
    x = torch.randn(32, 96) * 5
    with fp8mix.fp8_autocast(enabled=False, calibrating=True):
        y = m(x)
    ln = F.layer_norm(x, (96,), m.layer_norm_weight, m.layer_norm_bias, m.eps)
    assert torch.equal(y, F.linear(ln, m.weight, m.bias))
    assert float(m.fp8_amax_history[0, 0]) == float(ln.detach().abs().max()) and int(m.fp8_steps[0]) == 1


def test_gradient_accumulation_casts_the_weight_once():
    m = make(64, 48)
    for i in range(3):
        with fp8mix.fp8_autocast():
            m(torch.randn(8, 64), is_first_microbatch=i == 0).sum().backward()
    assert m.fp8_steps.tolist() == [3, 1, 2]
    with pytest.raises(TypeError, match="is_first_microbatch must be True or False"):
        m(torch.randn(8, 64), is_first_microbatch=1)


def test_infinite_input_gives_nan_like_a_high_precision_layer():
    m = make(64, 48)
    x = torch.randn(4, 64)
    x[2, 7] = float("inf")
    with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
        y = m(x)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()
