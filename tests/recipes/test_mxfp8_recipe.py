"""fp8mix.recipe.MXFP8BlockScaling in fp8mix.Linear / fp8mix.nn.Conv1D: every GEMM with
OCP MX 1x32 blocks along its reduction dimension.

References: float64 nn.Linear (the SQNR bounds of tests/nn/test_linear.py), a float64
emulation of the three GEMMs built from tests/recipes/mx_reference.py (written from the
OCP MX v1.0 spec), and a tiny GPT-2 (Hugging Face) trained in high precision. Also:
checkpointing and torch.compile (aot_eager) bit-identical to eager, state_dict, stochastic
rounding, bad fields.
"""
from __future__ import annotations

import copy

import pytest
import torch
from mx_reference import ref_mx_deq
from recipe_checks import check_checkpointing_bit_identical, check_compile_bit_identical, float64_pair, sqnr_vs_float64

import fp8mix
from fp8mix import Format, fp8_autocast
from fp8mix.recipe import CurrentScaling, MXFP8BlockScaling, RowwiseScaling

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


RECIPES = {
    "e4m3": lambda: MXFP8BlockScaling(),
    "hybrid": lambda: MXFP8BlockScaling(fp8_format=Format.HYBRID),
    "floor": lambda: MXFP8BlockScaling(scale_rule="floor"),
    "margin": lambda: MXFP8BlockScaling(margin=1),
}


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("conv", [False, True], ids=["linear", "conv1d"])
def test_matches_float64_within_linear_bounds(name, conv):
    lin, ref = float64_pair(conv=conv)
    x = torch.randn(24, 96) * torch.logspace(-3, 3, 96)  # K blocks of very unlike scale
    fwd, dgrad, wgrad = sqnr_vs_float64(lin, ref, x, RECIPES[name](), conv=conv)
    assert fwd >= 25, f"forward SQNR {fwd:.1f} dB"
    assert dgrad >= 18, f"dgrad SQNR {dgrad:.1f} dB"
    assert wgrad >= 18, f"wgrad SQNR {wgrad:.1f} dB"


@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("conv", [False, True], ids=["linear", "conv1d"])
def test_equals_float64_emulation_of_the_spec(rule, conv):
    """Each GEMM equals the float64 product of the spec's MX quantisations of its operands
    along its reduction dimension, to float32 summation (K * 2^-24 of the |terms|)."""
    lin, _ = float64_pair(k=80, n=48, seed=3, conv=conv)
    x = (torch.randn(40, 80) * 3).requires_grad_()
    dy = torch.randn(40, 48)
    with fp8_autocast(fp8_recipe=MXFP8BlockScaling(scale_rule=rule)):
        y = lin(x)
    y.backward(dy)
    w = (lin.weight.t() if conv else lin.weight).detach()  # (N, K)
    xd = x.detach()
    e4 = Format.E4M3

    def check(got, a_rows, b_rows, bias, what):
        want = a_rows @ b_rows.t() + (0 if bias is None else bias.double())
        mag = a_rows.abs() @ b_rows.abs().t()
        k = a_rows.shape[1]
        bad = (got.double() - want).abs() > (k + 2) * 2.0 ** -24 * (mag + 1e-30) + 1e-6 * (bias is not None)
        assert not bad.any(), f"{what}: {int(bad.sum())} outputs off, max {(got.double() - want).abs().max()}"

    check(y, ref_mx_deq(xd, e4, rule), ref_mx_deq(w, e4, rule), lin.bias.detach(), "y")
    check(x.grad, ref_mx_deq(dy, e4, rule), ref_mx_deq(w.t().contiguous(), e4, rule), None, "dx")
    dw = lin.weight.grad.t() if conv else lin.weight.grad
    check(dw, ref_mx_deq(dy.t().contiguous(), e4, rule), ref_mx_deq(xd.t().contiguous(), e4, rule), None, "dW")


def test_bad_fields():
    with pytest.raises(ValueError, match="scale_rule"):
        MXFP8BlockScaling(scale_rule="nearest")
    with pytest.raises(ValueError, match="power_2_scale"):
        MXFP8BlockScaling(power_2_scale=False)
    with pytest.raises(ValueError, match="fp8_format"):
        MXFP8BlockScaling(fp8_format=Format.AUTO)
    with pytest.raises(TypeError, match="the fields are"):
        MXFP8BlockScaling(block_size=16)
    with pytest.raises(NotImplementedError, match="attention"):
        MXFP8BlockScaling(fp8_dpa=True)
    assert MXFP8BlockScaling().granularity("weight") == fp8mix.formats.Granularity.MX


def test_state_dict_and_stochastic_rounding():
    lin, _ = float64_pair()
    x = torch.randn(8, 96, requires_grad=True)
    dy = torch.randn(8, 40)
    rec = MXFP8BlockScaling(rounding={"grad": "stochastic"})
    with fp8_autocast(fp8_recipe=rec):
        lin(x).backward(dy)
        g1 = x.grad.clone()
        twin = fp8mix.Linear(96, 40)
        twin.load_state_dict(copy.deepcopy(lin.state_dict()))
        x.grad = None
        lin(x).backward(dy)
        assert not torch.equal(g1, x.grad)  # the stream advanced: other random words
        xt = x.detach().clone().requires_grad_()
        twin(xt).backward(dy)
        assert torch.equal(xt.grad, x.grad)  # the state dict carried the stream


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_checkpointed_steps_equal_plain_steps(mode, rounding):
    check_checkpointing_bit_identical(MXFP8BlockScaling(rounding=rounding), mode)


def test_compile_aot_eager_equals_eager():
    check_compile_bit_identical(MXFP8BlockScaling())


# ---- a tiny GPT trained with each recipe -----------------------------------------------

def test_tiny_gpt_trains_within_the_loss_tolerance_of_the_other_recipes():
    """Bound (stated): after 12 AdamW steps on a fixed batch, the MXFP8 and rowwise runs'
    final loss is within 5% of the high-precision run's (tests/test_transformers.py's bound
    for CurrentScaling), and every run has cut its loss by more than 10%."""
    transformers = pytest.importorskip("transformers")

    def gpt2():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                      attn_implementation="eager")
        return transformers.GPT2LMHeadModel(cfg)

    ids = torch.randint(0, 128, (4, 24), generator=torch.Generator().manual_seed(0))

    def losses(recipe):
        model = gpt2()
        if recipe is not None:
            fp8mix.convert_model(model)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        torch.manual_seed(1234)  # the same dropout masks for every run
        out = []
        for _ in range(12):
            with fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(float(loss))
        return out

    hp = losses(None)
    runs = {"mxfp8": losses(MXFP8BlockScaling()), "rowwise": losses(RowwiseScaling()),
            "current": losses(CurrentScaling())}
    for name, ls in {"hp": hp, **runs}.items():
        assert ls[-1] < 0.9 * ls[0], (name, ls)
    for name, ls in runs.items():
        assert abs(ls[-1] - hp[-1]) < 0.05 * hp[-1], (name, ls[-1], hp[-1])
