"""Hostile-input cases: fp8mix.nn (Linear, fp8_autocast, convert_model, load_state_dict)."""
from __future__ import annotations

import math  # noqa: F401

from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

# ---- Linear / fp8_autocast ---------------------------------------------------------------------------


def _lin(**kw):
    torch = _t()
    torch.manual_seed(0)
    return _f().Linear(32, 16, **kw)


def _fwd(x, recipe=None, lin=None):
    fp8mix = _f()
    lin = lin if lin is not None else _lin()
    with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe):
        return lin(x)


for dt in ("int64", "float64", "bool", "complex64"):
    add(f"linear_input_dtype_{dt}", lambda dt=dt: _fwd(_t().ones(4, 32).to(getattr(_t(), dt))),
        Raises(TypeError, HP))
add("linear_input_0d", lambda: _fwd(_t().tensor(1.0)), Raises(ValueError, r"shape"))
add("linear_input_wrong_features", lambda: _fwd(x_(4, 31)), Raises(ValueError, r"shape.*32"))
add("linear_input_list", lambda: _fwd([[1.0] * 32]), Raises((TypeError, AttributeError), r"tensor|list|dim"))
add("linear_input_meta_weight_cpu", lambda: _fwd(_t().ones(4, 32, device="meta")), Raises(ValueError, DEVICE))
add("linear_meta_module_meta_input",
    lambda: _fwd(_t().ones(4, 32, device="meta"), None, _lin(device="meta")),
    MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))
add("linear_float64_module", lambda: _fwd(x_(4, 32), None, _lin(dtype=_t().float64)),
    Raises(TypeError, r"float64|Double"))


@case(Valid())
def linear_empty_input():
    torch = _t()
    for recipe_name in ("DelayedScaling", "CurrentScaling", "BlockScaling"):
        recipe = getattr(_f().recipe, recipe_name)()
        y = _fwd(torch.empty(0, 32), recipe)
        assert y.shape == (0, 16)
        y = _fwd(torch.empty(2, 0, 32), recipe)
        assert y.shape == (2, 0, 16)


@case(Valid())
def linear_noncontig_input():
    """A non-contiguous input gives the same output and gradients as its contiguous copy."""
    torch = _t()
    fp8mix = _f()
    views = {"transposed": x_(32, 12).t(), "step": x_(24, 64)[::2, ::2], "stride0": x_(1, 32).expand(12, 32),
             "permute3d": x_(4, 3, 32).permute(1, 0, 2)}
    for rname in ("DelayedScaling", "CurrentScaling", "BlockScaling"):
        for vn, v in views.items():
            outs = []
            for inp in (v, v.contiguous()):
                lin = _lin()
                xi = inp.detach().requires_grad_()
                with fp8mix.fp8_autocast(fp8_recipe=getattr(fp8mix.recipe, rname)()):
                    y = lin(xi)
                y.square().sum().backward()
                outs.append((y.detach(), xi.grad, lin.weight.grad))
            for (a, b, what) in zip(outs[0], outs[1], ("y", "dx", "dw")):
                assert torch.equal(a, b), f"{rname} {vn}: {what} differs"


@case(Valid())
def linear_nonfinite_input():
    torch = _t()
    for val in (float("nan"), float("inf")):
        y = _fwd(torch.full((4, 32), val), _f().recipe.CurrentScaling())
        assert y.shape == (4, 16)


def _fwd_mb(flag):
    fp8mix = _f()
    lin = _lin()
    with fp8mix.fp8_autocast():
        return lin(x_(4, 32), is_first_microbatch=flag)


add("linear_is_first_microbatch_str", lambda: _fwd_mb("yes"), Raises(TypeError, r"is_first_microbatch"))
add("linear_is_first_microbatch_tensor", lambda: _fwd_mb(_t().tensor([1, 0])),
    Raises((TypeError, ValueError, RuntimeError), r"is_first_microbatch|ambiguous"))
add("linear_is_first_microbatch_false_uncached", lambda: _fwd_mb(False),
    Raises((RuntimeError, ValueError), r"is_first_microbatch"))


add("fp8_autocast_enabled_int", lambda: _f().fp8_autocast(enabled=1), Raises(TypeError, r"enabled"))
add("fp8_autocast_enabled_none", lambda: _f().fp8_autocast(enabled=None), Raises(TypeError, r"enabled"))
add("fp8_autocast_recipe_str", lambda: _f().fp8_autocast(True, "delayed"), Raises(TypeError, r"fp8_recipe"))
add("fp8_autocast_recipe_object", lambda: _f().fp8_autocast(True, object()), Raises(TypeError, r"fp8_recipe"))
add("fp8_autocast_recipe_class", lambda: _f().fp8_autocast(True, _f().recipe.DelayedScaling),
    Raises(TypeError, r"fp8_recipe"))
add("autocast_te_recipe_str", lambda: _f().autocast(True, "x"), Raises(TypeError, r"recipe"))


# ---- convert_model ---------------------------------------------------------------------------------


def _seq():
    import torch.nn as nn
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))


add("convert_model_none", lambda: _f().convert_model(None), Raises(TypeError, r"nn\.Module"))
add("convert_model_tensor", lambda: _f().convert_model(x_(3, 3)), Raises(TypeError, r"nn\.Module"))


@case(Valid())
def convert_model_bare_linear():
    """A bare nn.Linear converts in place (conversion changes the module's class)."""
    lin = __import__("torch.nn").nn.Linear(32, 32)
    out = _f().convert_model(lin)
    assert out is lin and isinstance(lin, _f().Linear) and lin.fp8_scale.dtype == _t().float32
add("convert_model_filter_not_callable", lambda: _f().convert_model(_seq(), module_filter_fn=3),
    Raises(TypeError, r"module_filter_fn"))
add("convert_model_filter_raises", lambda: _f().convert_model(_seq(), module_filter_fn=lambda m, n: 1 / 0),
    Raises(ZeroDivisionError, r"division"))
add("convert_model_recipe_str", lambda: _f().convert_model(_seq(), recipe="delayed"),
    Raises(TypeError, r"recipe"))


@case(Valid())
def convert_model_meta():
    torch = _t()
    m = _f().convert_model(torch.nn.Sequential(torch.nn.Linear(32, 16, device="meta")))
    assert isinstance(m[0], _f().Linear) and m[0].weight.device.type == "meta"


# ---- Linear.load_state_dict -------------------------------------------------------------------------


def _sd(**over):
    sd = dict(_lin().state_dict())
    for k, v in over.items():
        if v is None:
            sd.pop(k)
        else:
            sd[k] = v
    return sd


def _load(sd, strict=True):
    return _lin().load_state_dict(sd, strict=strict)


def _load_and_run(sd):
    lin = _lin()
    lin.load_state_dict(sd)
    return _fwd(x_(4, 32), None, lin)


add("state_dict_missing_fp8_scale", lambda: _load(_sd(fp8_scale=None)), Raises(RuntimeError, r"Missing.*fp8_scale"))
add("state_dict_missing_fp8_steps", lambda: _load(_sd(fp8_steps=None)), Raises(RuntimeError, r"Missing.*fp8_steps"))
add("state_dict_missing_history_and_scale",
    lambda: _load(_sd(fp8_scale=None, fp8_amax_history=None)), Raises(RuntimeError, r"Missing.*fp8_"))
add("state_dict_extra_fp8_key", lambda: _load(_sd(fp8_extra=_t().ones(3))),
    Raises(RuntimeError, r"Unexpected.*fp8_extra"))
add("state_dict_scale_shape", lambda: _load(_sd(fp8_scale=_t().ones(4))),
    Raises(RuntimeError, r"size mismatch.*fp8_scale"))
add("state_dict_scale_0d", lambda: _load(_sd(fp8_scale=_t().tensor(1.0))),
    Raises(RuntimeError, r"size mismatch.*fp8_scale|fp8_scale"))
add("state_dict_steps_shape", lambda: _load(_sd(fp8_steps=_t().zeros(2, dtype=_t().int64))),
    Raises(RuntimeError, r"size mismatch.*fp8_steps"))
add("state_dict_history_4_columns", lambda: _load(_sd(fp8_amax_history=_t().ones(5, 4))),
    Raises(RuntimeError, r"size mismatch.*fp8_amax_history"))
add("state_dict_history_1d", lambda: _load(_sd(fp8_amax_history=_t().ones(5))),
    Raises(RuntimeError, r"size mismatch.*fp8_amax_history"))
add("state_dict_history_3d", lambda: _load(_sd(fp8_amax_history=_t().ones(5, 3, 1))),
    Raises(RuntimeError, r"size mismatch.*fp8_amax_history"))
add("state_dict_scale_list", lambda: _load(_sd(fp8_scale=[1.0, 1.0, 1.0])), Raises(RuntimeError, r"fp8_scale"))
add("state_dict_scale_meta", lambda: _load(_sd(fp8_scale=_t().ones(3, device="meta"))),
    Raises((RuntimeError, NotImplementedError, ValueError), r"fp8_scale"))
add("state_dict_weight_shape", lambda: _load(_sd(weight=_t().ones(16, 31))),
    Raises(RuntimeError, r"size mismatch.*weight"))
for label, val in (("nan", float("nan")), ("zero", 0.0), ("negative", -1.0), ("inf", float("inf"))):
    add(f"state_dict_scale_{label}_then_forward",
        lambda val=val: _load_and_run(_sd(fp8_scale=_t().full((3,), val), fp8_steps=_t().ones(3, dtype=_t().int64),
                                          fp8_amax_history=_t().ones(4, 3))),
        Raises((ValueError, RuntimeError), r"scale"))


@case(Valid())
def state_dict_nn_linear_checkpoint():
    """A plain nn.Linear checkpoint (no FP8 state at all) loads strictly; FP8 state starts fresh."""
    torch = _t()
    ref = torch.nn.Linear(32, 16)
    lin = _lin()
    lin.load_state_dict(ref.state_dict())
    assert torch.equal(lin.weight, ref.weight)
    assert int(lin.fp8_steps.sum()) == 0 and torch.equal(lin.fp8_scale, torch.ones(3))


@case(Valid())
def state_dict_other_history_length():
    h = _t().rand(7, 3)
    lin = _lin()
    lin.load_state_dict(_sd(fp8_amax_history=h))  # a short (older) history: its rows first, the rest empty
    assert tuple(lin.fp8_amax_history.shape) == (1024, 3)
    assert _t().equal(lin.fp8_amax_history[:7], h) and not lin.fp8_amax_history[7:].any()
    _fwd(x_(4, 32), _R("DelayedScaling")(amax_history_len=7), lin)
    lin.load_state_dict(_sd(fp8_amax_history=_t().rand(2000, 3)))  # a longer one: the buffer grows
    assert tuple(lin.fp8_amax_history.shape) == (2000, 3)
    _fwd(x_(4, 32), _R("DelayedScaling")(amax_history_len=2000), lin)
