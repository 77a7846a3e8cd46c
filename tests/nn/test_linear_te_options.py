"""fp8mix.Linear with Transformer Engine's constructor keywords (params_dtype, init_method,
return_bias, the ignored and the refused ones), against nn.Linear."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix


def _const_half(w):
    nn.init.constant_(w, 0.5)


def test_params_dtype_is_torchs_dtype():
    layer = fp8mix.Linear(32, 48, params_dtype=torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.bias.dtype == torch.bfloat16
    assert layer.fp8_scale.dtype == torch.float32  # the FP8 state keeps its own dtype
    with pytest.raises(ValueError, match="disagree"):
        fp8mix.Linear(32, 48, params_dtype=torch.bfloat16, dtype=torch.float16)
    with pytest.raises(TypeError, match="floating-point"):
        fp8mix.Linear(32, 48, params_dtype=torch.int32)


def test_init_method_runs_at_construction_and_on_reset_parameters():
    layer = fp8mix.Linear(32, 48, init_method=_const_half)
    assert torch.equal(layer.weight, torch.full((48, 32), 0.5))
    with torch.device("meta"):
        deferred = fp8mix.Linear(32, 48, init_method=_const_half)
    deferred.to_empty(device="cpu")
    deferred.reset_parameters()
    assert torch.equal(deferred.weight, torch.full((48, 32), 0.5))
    with pytest.raises(TypeError, match="callable"):
        fp8mix.Linear(32, 48, init_method=0.02)


def test_without_init_method_the_initialisation_is_nn_linears():
    torch.manual_seed(3)
    ref = nn.Linear(32, 48)
    torch.manual_seed(3)
    layer = fp8mix.Linear(32, 48)
    assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)


@pytest.mark.parametrize("recipe", [None, fp8mix.recipe.DelayedScaling(), fp8mix.recipe.CurrentScaling()],
                         ids=["outside", "delayed", "current"])
def test_return_bias_returns_the_bias_instead_of_adding_it(recipe):
    torch.manual_seed(0)
    plain = fp8mix.Linear(64, 32)
    split = fp8mix.Linear(64, 32, return_bias=True)
    split.load_state_dict(plain.state_dict())
    x = torch.randn(8, 64)
    with fp8mix.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y_plain = plain(x)
        y, b = split(x)
    assert b is split.bias
    if recipe is None:  # nn.Linear's math, bit for bit
        assert torch.equal(y, F.linear(x, split.weight)) and torch.equal(y + b, y_plain)
    else:  # the same FP8 product; the bias added by torch instead of the GEMM's epilogue
        torch.testing.assert_close(y + b, y_plain, rtol=1e-6, atol=1e-6)
        ref = x.double() @ split.weight.double().t()
        assert (y.double() - ref).norm() / ref.norm() < 0.1


def test_te_options_ignored_and_refused():
    fp8mix.Linear(32, 48, get_rng_state_tracker=None, name="proj")  # accepted, no meaning here
    with pytest.raises(NotImplementedError, match="userbuffer"):
        fp8mix.Linear(32, 48, ub_overlap_ag=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        fp8mix.Linear(32, 48, bogus=1)
    with pytest.raises(TypeError, match="return_bias"):
        fp8mix.Linear(32, 48, return_bias=1)


@pytest.mark.parametrize("cls", [fp8mix.Linear, fp8mix.LayerNormLinear])
def test_te_tensor_parallel_options_on_one_process(cls):
    """TE's tensor-parallel options with one rank (tp_size 1): the layer is whole, as in TE;
    more ranks need torch.distributed (tests/distributed/test_tensor_parallel.py runs them
    on 2 processes)."""
    lone = cls(32, 48, parallel_mode="column", sequence_parallel=True)
    assert type(lone.weight) is torch.nn.Parameter and lone.weight.shape == (48, 32)
    with pytest.raises(RuntimeError, match="init_process_group"):
        cls(32, 48, tp_size=2, parallel_mode="column")
    with pytest.raises(ValueError, match="parallel_mode must be 'column', 'row' or None"):
        cls(32, 48, parallel_mode="colwise")


def test_converted_layers_keep_nn_linears_behaviour():
    model = nn.Sequential(nn.Linear(32, 48))
    fp8mix.convert_model(model)
    assert not model[0].return_bias and model[0].init_method is None
    x = torch.randn(2, 32)
    assert torch.equal(model(x), F.linear(x, model[0].weight, model[0].bias))  # a tensor (no bias tuple), nn.Linear's
