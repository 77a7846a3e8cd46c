"""What the integrations share (fp8mix.integrations, no third-party library): the forward
wrapped in fp8_autocast keeps the signature that inspect.signature reports (the HF Trainer
chooses dataset columns by it), computes what an explicit fp8_autocast computes, wraps
once, unwraps to the class forward, and follows copy.deepcopy; converting a converted
model is a no-op; the FP8 entries split out of a state dict are exactly fp8mix's."""
from __future__ import annotations

import copy
import inspect
import warnings

import torch
import torch.nn as nn

import fp8mix
from fp8mix.integrations import (
    convert,
    fp8_module_prefixes,
    split_fp8_state,
    unwrap_forward,
    wrap_forward,
)
from fp8mix.recipe import CurrentScaling, DelayedScaling


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 16)
        self.register_buffer("fp8_scale", torch.ones(2))  # a user buffer that happens to share the name

    def forward(self, x, *, scale: float = 1.0):
        return self.b(torch.relu(self.a(x))) * scale


def _net(seed=0):
    torch.manual_seed(seed)
    return Net()


def test_wrapped_forward_keeps_the_signature_and_computes_as_fp8_autocast():
    ref, model = _net(), _net()
    fp8mix.convert_model(ref)
    convert("test", model, None)
    before = inspect.signature(model.forward)
    wrap_forward(model, recipe=CurrentScaling())
    assert inspect.signature(model.forward) == before  # (x, *, scale=1.0)
    x = torch.randn(8, 32)
    with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
        want = ref(x, scale=2.0)
    got = model(x, scale=2.0)
    assert torch.equal(got, want)
    assert not torch.equal(got, fp8mix.unconvert_model(copy.deepcopy(ref))(x, scale=2.0))  # FP8 really ran


def test_a_forward_set_on_the_instance_keeps_its_signature_too():
    model = _net()
    convert("test", model, None)
    inner = model.forward  # bound to the model ...
    model.forward = lambda x, *, scale=1.0: inner(x, scale=scale)  # ... or any callable on the instance
    before = inspect.signature(model.forward)
    wrap_forward(model, recipe=DelayedScaling())
    assert inspect.signature(model.forward) == before
    x = torch.randn(4, 32)
    model(x, scale=3.0).sum().backward()
    assert int(model.a.fp8_steps[0]) == 1
    unwrap_forward(model)
    assert model.forward.__name__ == "<lambda>"


def test_wrap_twice_updates_settings_and_unwrap_restores_the_class_forward():
    model = _net()
    convert("test", model, None)
    wrap_forward(model, recipe=DelayedScaling())
    wrap_forward(model, recipe=CurrentScaling())
    assert model.__dict__["_fp8mix_autocast"].recipe == CurrentScaling()
    assert model.__dict__["_fp8mix_autocast"].inner is Net.forward  # one layer of wrapping
    unwrap_forward(model)
    assert "forward" not in model.__dict__ and "_fp8mix_autocast" not in model.__dict__
    x = torch.randn(4, 32)
    model(x)  # outside fp8_autocast: high precision, records nothing
    assert int(model.a.fp8_steps[0]) == 0


def test_a_deepcopy_runs_the_copys_layers():
    model = _net()
    convert("test", model, None)
    wrap_forward(model, recipe=DelayedScaling())
    twin = copy.deepcopy(model)
    twin(torch.randn(4, 32)).sum().backward()
    assert int(twin.a.fp8_steps[0]) == 1 and int(model.a.fp8_steps[0]) == 0


def test_convert_leaves_a_converted_model_alone():
    model = _net()
    convert("test", model, lambda m, fqn: fqn != "b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert("test", model, None)  # convert_model would warn "no layer converted" and could convert b
    assert type(model.a) is fp8mix.Linear and type(model.b) is nn.Linear


def test_split_fp8_state_takes_fp8mix_entries_only():
    model = _net()
    convert("test", model, None)
    sd = model.state_dict()
    prefixes = fp8_module_prefixes(model)
    assert prefixes == {"a.", "b."}
    taken = split_fp8_state(sd, prefixes)
    assert "fp8_scale" in sd  # the user's buffer of the root module stays
    assert set(taken) | set(sd) == set(model.state_dict()) and not set(taken) & set(sd)
    assert set(sd) == set(fp8mix.strip_fp8_state(model.state_dict()))  # which also keeps the user's buffer
