"""NVFP4BlockScaling's default rule, keep_last_layers_hp (the NVFP4 pretraining paper's
last layers in high precision): exactly the layers it names run as nn.Linear, bit for bit,
the others in NVFP4; a plan's or the user's per-module policy wins both ways; the field is
validated; 0 turns it off; the decision is the same in eval, under checkpointing and after
a checkpoint is loaded into a freshly built model."""
import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fp8mix
from fp8mix.nn import layer_order
from fp8mix.plan import LayerPlan, Plan
from fp8mix.recipe import CurrentScaling, NVFP4BlockScaling


def _plain(n_layers: int, width: int = 32, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list = []
    for _ in range(n_layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods)


def _model(n_layers: int, seed: int = 0) -> nn.Sequential:
    return fp8mix.convert_model(_plain(n_layers, seed=seed))


def _linears(model: nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, fp8mix.Linear)]


def _run_and_record(model: nn.Module, x: torch.Tensor, recipe, grad: bool = True) -> list:
    """Each fp8mix layer's (input, output) of one forward under the recipe."""
    seen: list = []
    hooks = [m.register_forward_hook(lambda m, a, out: seen.append((m, a[0].detach(), out.detach())))
             for m in _linears(model)]
    try:
        with torch.set_grad_enabled(grad), fp8mix.fp8_autocast(fp8_recipe=recipe):
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _alone_nvfp4(m: fp8mix.Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's NVFP4 forward on its own (a copy, rule off)."""
    solo = copy.deepcopy(m)
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(keep_last_layers_hp=0)):
        return solo(x).detach()


def _precision_of(model: nn.Module, recipe, x=None, grad: bool = True) -> list:
    """Per fp8mix layer in module order: "hp" when its output is F.linear's bit for bit,
    "nvfp4" when it is the layer's own NVFP4 forward (and not F.linear's)."""
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1)) if x is None else x
    out = []
    for m, inp, y in _run_and_record(model, x, recipe, grad):
        hp = F.linear(inp, m.weight, m.bias)
        if torch.equal(y, hp):
            out.append("hp")
        else:
            assert torch.equal(y, _alone_nvfp4(m, inp)), "neither nn.Linear's nor NVFP4's output"
            out.append("nvfp4")
    return out


def test_default_is_the_papers_share_rounded_half_up():
    r = NVFP4BlockScaling()
    assert r.keep_last_layers_hp == 0.15
    # 15% of the layers, rounded to the nearest count (half up), computed here in float64
    for n in (1, 2, 3, 4, 7, 9, 10, 20, 62, 100):
        assert r.high_precision_tail(n) == math.floor(0.15 * n + 0.5), n
    assert NVFP4BlockScaling(keep_last_layers_hp=3).high_precision_tail(2) == 2  # a count beyond the model: all
    assert NVFP4BlockScaling(keep_last_layers_hp=0.5).high_precision_tail(5) == 3


@pytest.mark.parametrize("n_layers, keep", [(7, 0.15), (10, 0.15), (9, 4), (6, 0.34)])
def test_exactly_the_last_layers_run_as_nn_linear(n_layers, keep):
    model = _model(n_layers)
    recipe = NVFP4BlockScaling(keep_last_layers_hp=keep)
    tail = math.floor(keep * n_layers + 0.5) if isinstance(keep, float) else keep
    assert tail >= 1
    expected = ["nvfp4"] * (n_layers - tail) + ["hp"] * tail
    assert _precision_of(model, recipe) == expected
    assert _precision_of(model, recipe, grad=False) == expected  # no_grad: the same decision
    model.eval()
    assert _precision_of(model, recipe) == expected  # eval(): the same


def test_the_whole_model_matches_nn_linear_where_the_rule_keeps_layers():
    """One layer model, count 1: the model's output is the plain nn.Linear model's bit for bit."""
    plain = _plain(1)
    model = fp8mix.convert_model(copy.deepcopy(plain))
    x = torch.randn(4, 32)
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(keep_last_layers_hp=1)):
        y = model(x)
    assert torch.equal(y, plain(x))
    with fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling()):  # 15% of 1 layer rounds to 0: NVFP4
        assert not torch.equal(model(x), plain(x))


def test_zero_turns_the_rule_off():
    for off in (0, 0.0):
        assert _precision_of(_model(7), NVFP4BlockScaling(keep_last_layers_hp=off)) == ["nvfp4"] * 7


def test_user_policy_wins_both_ways():
    model = _model(7)
    layers = _linears(model)
    recipe = NVFP4BlockScaling()  # keeps the last one
    layers[2].fp8_enabled = False  # a middle layer to high precision
    layers[6].fp8_enabled = True   # the last layer, explicitly in low precision: NVFP4
    assert _precision_of(model, recipe) == ["nvfp4", "nvfp4", "hp", "nvfp4", "nvfp4", "nvfp4", "nvfp4"]
    del layers[6].fp8_enabled  # the default again
    assert _precision_of(model, recipe)[6] == "hp"


def test_a_plans_decisions_win_both_ways():
    model = _model(7)
    names = [n for n, m in model.named_modules() if isinstance(m, fp8mix.Linear)]
    plan = Plan(layers=[LayerPlan(name=names[1], decision="keep", reason="test"),
                        LayerPlan(name=names[6], decision="fp8", reason="test", recipe=CurrentScaling())])
    plan.apply(model)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1))
    seen = _run_and_record(model, x, NVFP4BlockScaling())
    kinds = []
    for m, inp, y in seen:
        if torch.equal(y, F.linear(inp, m.weight, m.bias)):
            kinds.append("hp")
            continue
        solo = copy.deepcopy(m)
        solo.reset_fp8_state()
        with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
            fp8 = solo(inp).detach()
        kinds.append("current" if torch.equal(y, fp8) else
                     "nvfp4" if torch.equal(y, _alone_nvfp4(m, inp)) else "?")
    # layer 1 kept by the plan, layer 6 (which the rule would keep) in FP8 under the plan's recipe
    assert kinds == ["nvfp4", "hp", "nvfp4", "nvfp4", "nvfp4", "nvfp4", "current"]


def test_checkpointing_and_a_reloaded_model_decide_the_same():
    recipe = NVFP4BlockScaling(keep_last_layers_hp=2)
    base = _model(5)
    x, t = torch.randn(8, 32), torch.randn(8, 32)

    def grads(model, ckpt):
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            y = checkpoint(model, x, use_reentrant=False) if ckpt else model(x)
        F.mse_loss(y, t).backward()
        return [p.grad.clone() for p in model.parameters()]

    a, b = copy.deepcopy(base), copy.deepcopy(base)
    ga, gb = grads(a, False), grads(b, True)
    assert all(torch.equal(p, q) for p, q in zip(ga, gb))
    # the last layer's gradients are nn.Linear's backward on what reached it
    last = _linears(a)[-1]
    seen = _run_and_record(copy.deepcopy(base), x, recipe)
    inp = seen[-1][1].clone().requires_grad_(True)
    ref = nn.Linear(32, 32)
    ref.load_state_dict({"weight": last.weight.detach(), "bias": last.bias.detach()})
    F.mse_loss(torch.tanh(ref(inp)), t).backward()
    assert torch.equal(ref.weight.grad, ga[-2]) and torch.equal(ref.bias.grad, ga[-1])
    # a fresh model built and converted the same way, the checkpoint loaded: the same decisions
    fresh = _model(5, seed=7)
    fresh.load_state_dict(base.state_dict())
    assert _precision_of(fresh, recipe) == _precision_of(base, recipe) == ["nvfp4"] * 3 + ["hp"] * 2


def test_module_order_counts_a_shared_layer_once_and_unmarked_models_warn():
    torch.manual_seed(0)
    shared = fp8mix.Linear(32, 32)
    model = nn.Sequential(fp8mix.Linear(32, 32), shared, nn.Tanh(), shared, fp8mix.Linear(32, 32))
    layer_order._warned[0] = False
    with pytest.warns(UserWarning, match="mark_layer_order"):
        kinds = _precision_of(model, NVFP4BlockScaling(keep_last_layers_hp=1))
    assert kinds == ["nvfp4"] * 4  # unmarked: the rule cannot tell which layer is last
    fp8mix.mark_layer_order(model)
    assert [layer_order.layer_position(m) for m in (model[0], shared, model[4])] == [(0, 3), (1, 3), (2, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _precision_of(model, NVFP4BlockScaling(keep_last_layers_hp=2)) == ["nvfp4", "hp", "hp", "hp"]


def test_the_field_is_validated():
    for bad in (1.0, 1.5, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="keep_last_layers_hp.*fraction.*\\[0, 1\\)"):
            NVFP4BlockScaling(keep_last_layers_hp=bad)
    with pytest.raises(ValueError, match="keep_last_layers_hp.*count of layers must be >= 0"):
        NVFP4BlockScaling(keep_last_layers_hp=-1)
    for bad in (True, "0.15", None, [1]):
        with pytest.raises(TypeError, match="keep_last_layers_hp must be a float fraction"):
            NVFP4BlockScaling(keep_last_layers_hp=bad)
    with pytest.raises(TypeError, match="mark_layer_order expects an nn.Module"):
        fp8mix.mark_layer_order("model")


def test_the_literal_default_on_a_ten_layer_model():
    assert _precision_of(_model(10), NVFP4BlockScaling()) == ["nvfp4"] * 8 + ["hp"] * 2


def test_a_transformers_gpt2_keeps_its_head_and_last_block():
    """A real Hugging Face GPT-2 (random init from a config): module order is c_attn, c_proj,
    c_fc, c_proj per block, then lm_head; keep 5 = the last block's four Conv1D and the head,
    whose outputs are transformers' own Conv1D / nn.Linear forward bit for bit."""
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D as HFConv1D
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = fp8mix.convert_model(transformers.GPT2LMHeadModel(cfg)).eval()
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (fp8mix.Linear, fp8mix.nn.Conv1D))]
    assert [n for n, _ in layers][-5:] == ["transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj",
                                           "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj", "lm_head"]
    seen: list = []
    hooks = [m.register_forward_hook(lambda m, a, out: seen.append((m, a[0].detach(), out.detach())))
             for _, m in layers]
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=NVFP4BlockScaling(keep_last_layers_hp=5)):
        model(ids)
    for h in hooks:
        h.remove()
    kinds = []
    for m, inp, y in seen:
        ref = HFConv1D.forward(m, inp) if isinstance(m, fp8mix.nn.Conv1D) else F.linear(inp, m.weight, m.bias)
        kinds.append("hp" if torch.equal(y, ref) else "nvfp4")
    assert kinds == ["nvfp4"] * 4 + ["hp"] * 5
