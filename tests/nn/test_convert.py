"""convert_model's coverage and checkpoints between plain and converted models (issue #12,
items 10 and 11). References: the unconverted model (outputs, parameters, state_dict keys),
torch's own weight_norm / parametrize modules."""
from __future__ import annotations

import copy
import inspect
import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import sqnr_db

import fp8mix
from fp8mix import fp8_autocast
from fp8mix.recipe import DelayedScaling


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Sequential(nn.ReLU(), nn.Linear(64, 64))
        self.c = nn.Linear(64, 16)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_converts_in_place_keeping_parameters_hooks_and_keys():
    torch.manual_seed(0)
    net = Small()
    params = list(net.parameters())
    keys = set(net.state_dict())
    calls = []
    net.c.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    x = torch.randn(4, 32)
    ref = net(x)
    out = fp8mix.convert_model(net)
    assert out is net and all(isinstance(m, fp8mix.Linear) for m in (net.a, net.b[1], net.c))
    assert list(net.parameters()) == params  # the same Parameter objects
    assert set(net.state_dict()) - keys == {f"{p}.{k}" for p in ("a", "b.1", "c")
                                            for k in fp8mix.nn.fp8_state.FP8_STATE_KEYS}
    assert torch.equal(net(x), ref)  # outside fp8_autocast: the high-precision layer, bit for bit
    assert len(calls) == 2
    assert net.fp8_conversion == ["a", "b.1", "c"] and net.fp8_conversion.skipped == {}


def test_shared_module_is_converted_once_and_stays_shared():
    torch.manual_seed(1)
    shared = nn.Linear(32, 32)
    model = nn.ModuleDict({"enc": nn.Sequential(shared, nn.ReLU()), "dec": nn.Sequential(shared)})
    model.alias = shared  # a second name on the same parent too
    fp8mix.convert_model(model)
    assert model["enc"][0] is model["dec"][0] is model.alias
    assert isinstance(model.alias, fp8mix.Linear)
    assert len(model.fp8_conversion) == 1
    assert sum(isinstance(m, fp8mix.Linear) for m in model.modules()) == 1


def test_subclasses_and_parametrized_linears_are_skipped_with_a_warning_naming_them():
    class LoRALinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2.0

    model = nn.Sequential(nn.Linear(32, 32), LoRALinear(32, 32), nn.Linear(32, 32))
    torch.nn.utils.parametrize.register_parametrization(model[2], "weight", nn.Identity())
    mha = nn.MultiheadAttention(32, 4)
    model.add_module("attn", mha)
    with pytest.warns(UserWarning, match=r"1: a subclass of nn\.Linear.*LoRALinear") as rec:
        fp8mix.convert_model(model)
    msg = str(rec[0].message)
    assert "2: a parametrized Linear" in msg and "attn.out_proj: the output projection" in msg
    assert isinstance(model[0], fp8mix.Linear)
    assert type(model[1]) is LoRALinear and not isinstance(model[2], fp8mix.Linear)
    assert set(model.fp8_conversion.skipped) == {"1", "2", "attn.out_proj"}


def test_filtered_modules_are_reported_without_warning(caplog):
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.INFO, logger="fp8mix"):
            fp8mix.convert_model(model, module_filter_fn=lambda m, fqn: fqn != "2")
    assert "converted 1 layer(s)" in caplog.text and "2 (module_filter_fn returned False)" in caplog.text
    assert type(model[2]) is nn.Linear


def test_converting_nothing_warns():
    with pytest.warns(UserWarning, match="no layer of Sequential was converted"):
        fp8mix.convert_model(nn.Sequential(nn.ReLU(), nn.Conv2d(3, 3, 1)))


def test_weight_norm_linear_is_converted_and_trains_its_g_and_v():
    """The hook-based weight_norm recomputes `weight` before each forward: the converted
    layer computes with it in FP8 and its gradients reach weight_g and weight_v."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the hook-based API
        torch.manual_seed(2)
        lin = torch.nn.utils.weight_norm(nn.Linear(64, 32))
        torch.manual_seed(2)
        ref = torch.nn.utils.weight_norm(nn.Linear(64, 32))
    model = nn.Sequential(lin)
    fp8mix.convert_model(model)
    assert isinstance(model[0], fp8mix.Linear)
    x = torch.randn(16, 64)
    with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
        y = model(x)
    yr = ref(x)
    err = float((y - yr).norm() / yr.norm())
    assert err < 0.06, err
    y.square().sum().backward()
    yr.square().sum().backward()
    for name in ("weight_g", "weight_v", "bias"):
        g, gr = getattr(model[0], name).grad, getattr(ref, name).grad
        assert g is not None and float((g - gr).norm() / gr.norm()) < 0.1, name


def test_unconvert_model_restores_plain_modules():
    torch.manual_seed(3)
    net = Small()
    params = list(net.parameters())
    plain_keys = set(net.state_dict())
    x = torch.randn(4, 32)
    ref = net(x)
    fp8mix.convert_model(net)
    with fp8mix.fp8_autocast():
        net(x).sum().backward()
    fp8mix.unconvert_model(net)
    assert all(type(m) is nn.Linear for m in (net.a, net.b[1], net.c))
    assert list(net.parameters()) == params and set(net.state_dict()) == plain_keys
    assert torch.equal(net(x), ref)
    fp8mix.convert_model(net)  # and back again
    assert isinstance(net.a, fp8mix.Linear)


def test_strip_fp8_state_loads_into_the_plain_model_strict():
    torch.manual_seed(4)
    net = fp8mix.convert_model(Small())
    with fp8mix.fp8_autocast():
        net(torch.randn(4, 32)).sum().backward()
    plain = Small()
    with pytest.raises(RuntimeError, match="fp8_"):
        plain.load_state_dict(net.state_dict(), strict=True)
    plain.load_state_dict(fp8mix.strip_fp8_state(net.state_dict()), strict=True)
    x = torch.randn(4, 32)
    assert torch.equal(plain(x), net(x))


def test_load_fp8_state_restores_a_converted_model(tmp_path):
    torch.manual_seed(5)
    net = fp8mix.convert_model(Small())
    rec = DelayedScaling(amax_history_len=8)
    for _ in range(3):
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            net(torch.randn(8, 32)).sum().backward()
    torch.save(net.state_dict(), tmp_path / "ck.pt")
    fresh = fp8mix.convert_model(Small())
    fresh.load_state_dict(fp8mix.strip_fp8_state(net.state_dict()))  # the weights, as from_pretrained would
    restored = fp8mix.load_fp8_state(fresh, tmp_path / "ck.pt")
    assert restored == ["a", "b.1", "c"]
    for (k, a), b in zip(net.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    with pytest.warns(UserWarning, match="no FP8 state"):
        fp8mix.load_fp8_state(fresh, fp8mix.strip_fp8_state(net.state_dict()))


# --------------------------------------------------------------------------------------
# convert_model
# --------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 64)
        self.layers = nn.ModuleList([nn.Linear(64, 64), nn.Sequential(nn.ReLU(), nn.Linear(64, 64))])
        self.gate = nn.Linear(64, 4)   # tiny

    def forward(self, x):
        x = self.proj(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x, self.gate(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), nn.Identity())
        self.head = nn.Linear(64, 16)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h, gate = self.blocks[0](x)
        return self.head(self.norm(h)) + gate.sum(-1, keepdim=True)


LINEAR_FQNS = ["blocks.0.proj", "blocks.0.layers.0", "blocks.0.layers.1.1", "blocks.0.gate", "head"]


def test_convert_model_signature():
    sig = inspect.signature(fp8mix.convert_model)
    assert [(p.name, p.default) for p in sig.parameters.values()] == \
        [("model", inspect.Parameter.empty), ("module_filter_fn", None), ("recipe", None), ("config", None),
         ("plan", None), ("fsdp_fp8_all_gather", None)]


def test_convert_model_swaps_nested_linears_sharing_parameters():
    torch.manual_seed(21)
    model = Net()
    params_before = dict(model.named_parameters())
    x = torch.randn(5, 32)
    y_before = model(x)
    out = convert_ret = fp8mix.convert_model(model)
    assert convert_ret is model
    mods = dict(out.named_modules())
    for fqn in LINEAR_FQNS:
        assert type(mods[fqn]) is fp8mix.Linear, fqn
    assert type(mods["norm"]) is nn.LayerNorm
    params_after = dict(model.named_parameters())
    assert params_after.keys() == params_before.keys()
    for k in params_before:
        assert params_after[k] is params_before[k], f"{k} is not the same Parameter object"
    assert torch.equal(model(x), y_before)
    with fp8_autocast():
        y8 = model(x)
    assert sqnr_db(y_before, y8) >= 20
    # idempotent: converting again changes nothing
    fp8mix.convert_model(model)
    assert all(dict(model.named_parameters())[k] is params_before[k] for k in params_before)


def test_convert_model_filter():
    torch.manual_seed(22)
    model = Net()
    seen = []

    def keep(module, fqn):
        seen.append((type(module), fqn))
        return fqn != "head" and module.out_features >= 16

    fp8mix.convert_model(model, module_filter_fn=keep)
    assert sorted(f for _, f in seen) == sorted(LINEAR_FQNS)
    assert all(t is nn.Linear for t, _ in seen)
    mods = dict(model.named_modules())
    assert type(mods["head"]) is nn.Linear
    assert type(mods["blocks.0.gate"]) is nn.Linear
    for fqn in ("blocks.0.proj", "blocks.0.layers.0", "blocks.0.layers.1.1"):
        assert type(mods[fqn]) is fp8mix.Linear


def test_convert_model_optimizer_made_before_still_trains():
    torch.manual_seed(23)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Sequential(nn.Linear(64, 64), nn.ReLU()), nn.Linear(64, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    fp8mix.convert_model(model, recipe=DelayedScaling(amax_history_len=4))
    assert all(type(m) is fp8mix.Linear for m in model.modules() if isinstance(m, nn.Linear))
    assert [p for p in model.parameters()] == [p for g in opt.param_groups for p in g["params"]]
    x, t = torch.randn(64, 32), torch.randn(64, 16)
    losses = []
    for _ in range(10):
        with fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=4)):
            loss = F.mse_loss(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert losses[-1] < 0.9 * losses[0]
    assert all(int(m.fp8_steps[1]) == 10 for m in model.modules() if isinstance(m, fp8mix.Linear))


def test_convert_model_keeps_forward_hooks():
    model = nn.Sequential(nn.Linear(32, 32))
    calls = []
    model[0].register_forward_hook(lambda m, i, o: calls.append(type(m)))
    fp8mix.convert_model(model)
    model(torch.randn(2, 32))
    assert calls == [fp8mix.Linear]


def test_strip_fp8_state_keeps_other_modules_buffers_of_the_same_name():
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("fp8_scale", torch.tensor(3.0))  # someone else's buffer, same name

    model = nn.Sequential(fp8mix.Linear(32, 32), Other())
    sd = fp8mix.strip_fp8_state(model.state_dict())
    assert set(sd) == {"0.weight", "0.bias", "1.fp8_scale"}


def test_recipes_pickle_and_deepcopy():
    import pickle
    r = DelayedScaling(amax_history_len=8, rounding={"grad": "stochastic"})
    assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) is r
    model = nn.Sequential(fp8mix.Linear(32, 32))
    with torch.no_grad(), fp8_autocast(fp8_recipe=r):  # a read-only forward keeps its frame (and recipe)
        model(torch.randn(2, 32))
    clone = copy.deepcopy(model)
    assert torch.equal(clone[0].weight, model[0].weight)
