"""RowwiseScaling (torchao's "rowwise" and "rowwise_with_gw_hp" recipes) in fp8mix.Linear
and fp8mix.nn.Conv1D.

References nobody here wrote: float64 nn.Linear (SQNR bounds as tests/nn/test_linear.py),
torchao's own Float8Linear on the CPU (its from_recipe_name configs), and a float64
emulation written from torchao's description of the recipe (per-row amax along each
GEMM's reduction dimension, scale 2^floor(log2(448 / amax)), torch's own float8 cast,
float64 products). Also: checkpointing and torch.compile (aot_eager) bit-identical to
eager, state_dict, is_first_microbatch, convert_model(config=...), bad input.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from helpers import sqnr_db
from recipe_checks import check_checkpointing_bit_identical, check_compile_bit_identical, float64_pair, sqnr_vs_float64

import fp8mix
from fp8mix import Format, fp8_autocast
from fp8mix.recipe import CurrentScaling, RowwiseScaling, from_recipe_name

E4 = torch.float8_e4m3fn


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


RECIPES = {
    "default": lambda: RowwiseScaling(),
    "rowwise": lambda: from_recipe_name("rowwise"),
    "gw_hp": lambda: from_recipe_name("rowwise_with_gw_hp"),
}


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("conv", [False, True], ids=["linear", "conv1d"])
def test_matches_float64_within_linear_bounds(name, conv):
    lin, ref = float64_pair(conv=conv)
    x = torch.randn(24, 96) * torch.logspace(-2, 2, 24).unsqueeze(1)  # rows of very unlike scale
    fwd, dgrad, wgrad = sqnr_vs_float64(lin, ref, x, RECIPES[name](), conv=conv)
    assert fwd >= 25, f"forward SQNR {fwd:.1f} dB"
    assert dgrad >= 18, f"dgrad SQNR {dgrad:.1f} dB"
    assert wgrad >= (60 if name == "gw_hp" else 18), f"wgrad SQNR {wgrad:.1f} dB"
    assert torch.allclose(lin.bias.grad.double(), ref.bias.grad, rtol=1e-5, atol=1e-5)


def test_rows_of_unlike_scale_keep_their_precision():
    """The point of row scales: rows 1e6 times smaller than the first are not flushed
    toward zero, as they are by one scale for the whole tensor."""
    lin, ref = float64_pair()
    with torch.no_grad():
        lin.bias.zero_()
        ref.bias.zero_()
    x = torch.randn(16, 96)
    x[1:] *= 1e-6
    yr = ref(x.double())
    with torch.no_grad():
        with fp8_autocast(fp8_recipe=from_recipe_name("rowwise")):
            y_row = lin(x)
        with fp8_autocast(fp8_recipe=CurrentScaling(fp8_format=Format.E4M3)):
            y_tensor = lin(x)
    small_row, small_tensor = sqnr_db(yr[1:], y_row[1:]), sqnr_db(yr[1:], y_tensor[1:])
    assert small_row >= 25, f"rowwise SQNR of the small rows {small_row:.1f} dB"
    assert small_tensor < small_row - 10, (small_tensor, small_row)


# ---- a float64 emulation from torchao's description --------------------------------------

def _q_rows(t: torch.Tensor) -> torch.Tensor:
    """t (float32, 2-D) cast per row with scale 2^floor(log2(448/amax)), back in float64."""
    amax = t.abs().amax(dim=1, keepdim=True).double()
    scale = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(448.0 / amax))), torch.ones_like(amax))
    q = (t.double() * scale).float().to(E4)
    return q.double() / scale


def _q_tensor(t: torch.Tensor) -> torch.Tensor:
    amax = t.abs().max().double()
    scale = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    return (t.double() * scale).float().to(E4).double() / scale


def test_equals_float64_emulation_of_the_recipe():
    lin, _ = float64_pair(k=160, n=48, seed=3)
    x = (torch.randn(40, 160) * 3).requires_grad_()
    dy = torch.randn(40, 48)
    for gw_hp in (False, True):
        x.grad = lin.weight.grad = lin.bias.grad = None
        with fp8_autocast(fp8_recipe=from_recipe_name("rowwise_with_gw_hp" if gw_hp else "rowwise")):
            y = lin(x)
        y.backward(dy)
        w, xd = lin.weight.detach(), x.detach()
        y_ref = _q_rows(xd) @ _q_rows(w).t() + lin.bias.double()
        w_dgrad = _q_tensor(w) if gw_hp else _q_rows(w.t()).t()
        dx_ref = _q_rows(dy) @ w_dgrad
        dw_ref = dy.double().t() @ xd.double() if gw_hp else _q_rows(dy.t()) @ _q_rows(xd.t()).t()
        for got, want, what in ((y, y_ref, "y"), (x.grad, dx_ref, "dx"), (lin.weight.grad, dw_ref, "dW")):
            err = (got.double() - want).abs().max().item()
            assert err <= 2e-6 * want.abs().max().item(), f"gw_hp={gw_hp} {what}: max error {err}"


# ---- torchao's own Float8Linear on the CPU -------------------------------------------------

def _torchao():
    return pytest.importorskip("torchao.float8")


@pytest.mark.parametrize("name", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_matches_torchao_float8linear(name):
    tao = _torchao()
    torch.manual_seed(5)
    base = nn.Sequential(nn.Linear(128, 64))
    theirs = copy.deepcopy(base)
    tao.convert_to_float8_training(theirs, config=tao.Float8LinearConfig.from_recipe_name(name))
    ours = fp8mix.convert_model(copy.deepcopy(base), config=name)
    x = torch.randn(32, 128) * 2
    dy = torch.randn(32, 64)
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yt = theirs(xt)
    yt.backward(dy)
    with fp8_autocast():
        yo = ours(xo)
    yo.backward(dy)
    # The FP8 bytes and scales agree (test_equals_float64_emulation_of_the_recipe checks ours
    # exactly). torchao's rowwise GEMMs round their product to bfloat16 (its
    # addmm_float8_unwrapped works around torch._scaled_mm's float32 output) and add the
    # bias after: so theirs is ours rounded so, up to float32 summation order.
    bias = ours[0].bias.detach()
    rowwise = name != "tensorwise"

    def as_theirs(t, b=None, fp8_gemm=True):
        if not (rowwise and fp8_gemm):
            return t
        return (t - b).bfloat16().float() + b if b is not None else t.bfloat16().float()

    for a, b, what in ((yt, as_theirs(yo, bias), "y"), (xt.grad, as_theirs(xo.grad), "dx"),
                       (theirs[0].weight.grad, as_theirs(ours[0].weight.grad, fp8_gemm=name == "rowwise"), "dW"),
                       (theirs[0].bias.grad, ours[0].bias.grad, "db")):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * a.abs().max().item()), \
            f"{name} {what}: max difference {(a - b).abs().max().item()}"


def test_convert_model_accepts_a_torchao_config_object():
    tao = _torchao()
    for name, want in (("tensorwise", CurrentScaling(fp8_format=Format.HYBRID)),
                       ("rowwise", from_recipe_name("rowwise")),
                       ("rowwise_with_gw_hp", from_recipe_name("rowwise_with_gw_hp"))):
        m = fp8mix.convert_model(nn.Sequential(nn.Linear(32, 32)), config=tao.Float8LinearConfig.from_recipe_name(name))
        assert m[0].fp8_recipe == want, name
    odd = copy.copy(tao.Float8LinearConfig.from_recipe_name("rowwise"))  # torchao validates its own; mutate a copy
    object.__setattr__(odd, "cast_config_input", tao.CastConfig(scaling_type=tao.ScalingType.DISABLED))
    with pytest.raises(NotImplementedError, match="cast_config_input"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(32, 32)), config=odd)


# ---- recipe objects and convert_model(config=) ---------------------------------------------

def test_from_recipe_name():
    assert from_recipe_name("tensorwise") == CurrentScaling(fp8_format=Format.HYBRID)
    r = from_recipe_name("rowwise")
    assert (r.fp8_format, r.power_2_scale, r.gw_hp) == (Format.E4M3, True, False)
    assert from_recipe_name("rowwise_with_gw_hp").gw_hp is True
    for role in ("input", "weight", "grad_output"):
        assert r.granularity(role) == fp8mix.formats.Granularity.ROW
        assert r.format(role) == Format.E4M3
    with pytest.raises(ValueError, match="tensorwise"):
        from_recipe_name("colwise")
    with pytest.raises(TypeError, match="str"):
        from_recipe_name(3)


def test_bad_fields_raise():
    with pytest.raises(TypeError, match="gw_hp"):
        RowwiseScaling(gw_hp=1)
    with pytest.raises(TypeError, match="the fields are"):
        RowwiseScaling(block=1)
    with pytest.raises(TypeError, match="config"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(32, 32)), config=3.5)
    with pytest.raises(ValueError, match="unknown recipe name"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(32, 32)), config="colwise")
    with pytest.raises(TypeError, match="both"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(32, 32)), config="rowwise", recipe=CurrentScaling())


def test_convert_model_config_sets_the_layers_recipe():
    """The config's recipe replaces the autocast's inside fp8_autocast; outside, high precision."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(64, 32))
    m = fp8mix.convert_model(copy.deepcopy(base), config="rowwise")
    twin = fp8mix.convert_model(copy.deepcopy(base))
    x = torch.randn(8, 64)
    with torch.no_grad():
        assert torch.equal(m(x), base(x))
        with fp8_autocast(fp8_recipe=CurrentScaling()):
            got = m(x)
        with fp8_autocast(fp8_recipe=from_recipe_name("rowwise")):
            want = twin(x)
    assert torch.equal(got, want)


def test_fused_modules_refuse_with_a_clear_error():
    ln = fp8mix.LayerNormLinear(64, 32)
    with fp8_autocast(fp8_recipe=RowwiseScaling()):
        with pytest.raises(NotImplementedError, match="fused"):
            ln(torch.randn(4, 64, requires_grad=True))


def test_double_backward_refused():
    lin, _ = float64_pair()
    x = torch.randn(8, 96, requires_grad=True)
    with fp8_autocast(fp8_recipe=RowwiseScaling()):
        y = lin(x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=False)
    assert g.shape == x.shape
    with fp8_autocast(fp8_recipe=RowwiseScaling()):
        y = lin(x)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


# ---- state: state_dict, is_first_microbatch, checkpointing, compile ------------------------

def test_state_dict_round_trip():
    lin, _ = float64_pair()
    x = torch.randn(8, 96)
    with fp8_autocast(fp8_recipe=RowwiseScaling(rounding="stochastic")):
        lin(x.requires_grad_()).sum().backward()
        sd = copy.deepcopy(lin.state_dict())
        twin = fp8mix.Linear(96, 40)
        twin.load_state_dict(sd)
        assert torch.equal(twin(x), lin(x))


def test_is_first_microbatch_reuses_the_weight_casts():
    lin, _ = float64_pair()
    x = torch.randn(8, 96, requires_grad=True)
    with fp8_autocast(fp8_recipe=RowwiseScaling()):
        y1 = lin(x, is_first_microbatch=True)
        y1.backward(torch.ones_like(y1))
        g1 = x.grad.clone()
        with torch.no_grad():
            lin.weight.add_(1.0)  # a stale cached weight is what is_first_microbatch=False asks for
        x.grad = None
        y2 = lin(x, is_first_microbatch=False)
        y2.backward(torch.ones_like(y2))
    assert torch.equal(y1, y2)
    assert torch.equal(g1, x.grad)
    fresh = fp8mix.Linear(96, 40)
    with fp8_autocast(fp8_recipe=RowwiseScaling()), pytest.raises(RuntimeError, match="is_first_microbatch"):
        fresh(x, is_first_microbatch=False)


@pytest.mark.parametrize("recipe", [RowwiseScaling(), from_recipe_name("rowwise_with_gw_hp"),
                                    RowwiseScaling(rounding="stochastic")], ids=["rowwise", "gw_hp", "sr"])
@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_checkpointed_steps_equal_plain_steps(recipe, mode):
    check_checkpointing_bit_identical(recipe, mode)


@pytest.mark.parametrize("recipe", [RowwiseScaling(), from_recipe_name("rowwise_with_gw_hp")], ids=["rowwise", "gw_hp"])
def test_compile_aot_eager_equals_eager(recipe):
    check_compile_bit_identical(recipe)
