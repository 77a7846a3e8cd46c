"""Hostile-input cases: the stability toolkit (quant_stats, rounding and AUTO fields, FP8GradScaler, Monitor)."""
from __future__ import annotations

import math  # noqa: F401

from .cases_nn import _load, _sd  # noqa: F401
from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

# ---- stability toolkit: quant_stats, rounding / AUTO fields, FP8GradScaler, Monitor ---------------


def _qs(x, q, sinv, g=0):
    return _t().ops.fp8mix.quant_stats(x, q, sinv, g)


def _qs_pair(shape=(4, 16)):
    t = _f().quantize(x_(*shape))
    return x_(*shape), t.data, t.scale_inv


add("quant_stats_x_int", lambda: _qs(_t().ones(4, 16, dtype=_t().int32), *_qs_pair()[1:]), Raises(TypeError, HP))
add("quant_stats_x_float64", lambda: _qs(x_(4, 16).double(), *_qs_pair()[1:]), Raises(TypeError, HP))
add("quant_stats_q_not_fp8", lambda: _qs(x_(4, 16), x_(4, 16), _t().ones(())), Raises(TypeError, r"float8|FP8"))
add("quant_stats_shape_mismatch", lambda: _qs(x_(4, 8), *_qs_pair()[1:]), Raises(ValueError, r"shape"))
for label, val in (("nan", float("nan")), ("inf", float("inf")), ("zero", 0.0), ("neg", -2.0)):
    add(f"quant_stats_scale_inv_{label}", lambda val=val: _qs(x_(4, 16), _qs_pair()[1], _t().tensor(val)),
        Raises(ValueError, SCALE))
add("quant_stats_scale_inv_count", lambda: _qs(x_(4, 16), _qs_pair()[1], _t().ones(3), 1),
    Raises(ValueError, r"scale_inv.*elements"))
add("quant_stats_granularity_7", lambda: _qs(*_qs_pair(), 7), Raises(ValueError, r"granularit"))
add("quant_stats_meta", lambda: _qs(_t().ones(4, 16, device="meta"), _t().ones(4, 16, device="meta").to(
    _t().float8_e4m3fn), _t().ones((), device="meta")), MetaOrRaises((NotImplementedError, ValueError, TypeError,
                                                                      RuntimeError), DEVICE))


@case(Valid())
def quant_stats_views_match_contiguous():
    torch = _t()
    from fp8mix.numerics import quant_stats
    base = x_(64, 48)
    for v in (base.t(), base[::2, 1::3], base.expand(2, 64, 48)[1], torch.empty(0, 5), base[0, 0]):
        t = _f().quantize(v.contiguous())
        a = quant_stats(v, t)
        b = quant_stats(v.contiguous(), t)
        assert a == b or (a.numel == 0 and b.numel == 0), (a, b)


add("recipe_rounding_bad_mode", lambda: _f().recipe.DelayedScaling(rounding="down"), Raises(ValueError, r"rounding"))
add("recipe_rounding_bad_role", lambda: _f().recipe.CurrentScaling(rounding={"bias": "stochastic"}),
    Raises(ValueError, r"role"))
add("recipe_rounding_not_str", lambda: _f().recipe.BlockScaling(rounding=3), Raises(TypeError, r"rounding"))
add("recipe_auto_not_policy", lambda: _f().recipe.DelayedScaling(auto=5), Raises(TypeError, r"AutoFormat"))
add("recipe_auto_bad_warmup", lambda: _f().auto_format.AutoFormat(warmup=-1), Raises(ValueError, r"warmup"))
add("quantize_format_auto", lambda: _f().quantize(x_(4, 16), _f().Format.AUTO), Raises(ValueError, r"policy"))


@case(Raises(AttributeError, r"rounding"))
def recipe_rounding_changed_after_construction():
    r = _f().recipe.DelayedScaling()
    r.rounding = {"grad": "sometimes"}
    with _f().fp8_autocast(fp8_recipe=r):
        pass


@case(Valid())
def linear_auto_and_sr_with_nonfinite_input():
    torch = _t()
    lin = _f().Linear(32, 32)
    r = _f().recipe.CurrentScaling(fp8_format="AUTO", rounding="stochastic")
    for bad in (float("nan"), float("inf"), 0.0):
        x = torch.full((4, 32), bad, requires_grad=True)
        with _f().fp8_autocast(fp8_recipe=r):
            y = lin(x)
        y.sum().backward()
        ref = torch.nn.functional.linear(x.detach(), lin.weight.detach(), lin.bias.detach())
        # non-finite input: a non-finite output as nn.Linear's (not saturated); zeros: the bias exactly
        assert torch.isfinite(y).all() == torch.isfinite(ref).all(), (bad, y)
        if bad == 0.0:
            assert torch.equal(y, ref.expand_as(y)) and torch.isfinite(lin.weight.grad).all()
        else:
            assert not torch.isfinite(lin.weight.grad).all(), bad
        assert torch.isfinite(x.grad).all()  # dx = dy W does not involve x
        lin.weight.grad = lin.bias.grad = None
    report = lin.fp8_format_report()
    assert set(report) == {"input", "weight", "grad_output"}
    # non-finite amaxes decide nothing: AUTO keeps HYBRID's assignment
    formats = {role: fmt for role, (fmt, _) in report.items()}
    assert formats == {"input": "E4M3", "weight": "E4M3", "grad_output": "E5M2"}, formats
    assert torch.isfinite(lin.fp8_scale).all() and (lin.fp8_scale > 0).all()


add("autocast_monitor_not_monitor", lambda: _f().fp8_autocast(monitor=object()), Raises(TypeError, r"monitor"))
for kw, pat in ((dict(init_scale=float("nan")), "init_scale"), (dict(init_scale=0.0), "init_scale"),
                (dict(growth_factor=1.0), "growth_factor"), (dict(backoff_factor=1.5), "backoff_factor"),
                (dict(growth_interval=0), "growth_interval"), (dict(growth_interval=2.5), "growth_interval"),
                (dict(overflow_threshold=1.0), "overflow_threshold"), (dict(enabled="yes"), "enabled")):
    add(f"grad_scaler_{'_'.join(f'{k}' for k in kw)}_{list(kw.values())[0]}",
        lambda kw=kw: _f().FP8GradScaler(**kw), Raises((ValueError, TypeError), pat))
add("grad_scaler_update_before_scale", lambda: _f().FP8GradScaler().update(), Raises(RuntimeError, r"scale"))
add("grad_scaler_scale_string", lambda: _f().FP8GradScaler().scale("loss"), Raises(TypeError, r"tensor"))
add("grad_scaler_load_empty", lambda: _f().FP8GradScaler().load_state_dict({}), Raises((RuntimeError, KeyError),
                                                                                       r"empty|missing"))
add("monitor_every_0", lambda: _f().Monitor(every=0), Raises(ValueError, r"every"))
add("monitor_warn_negative", lambda: _f().Monitor(overflow_warn=-1.0), Raises(ValueError, r"overflow_warn"))
add("monitor_attach_not_module", lambda: _f().Monitor().attach(3), Raises(TypeError, r"nn.Module"))
add("monitor_record_shape_mismatch", lambda: _f().Monitor().record("l", "input", x_(4, 16), _qs_pair((4, 8))[1],
                                                                   _t().ones(())), Raises(ValueError, r"shape"))
add("monitor_record_bad_granularity", lambda: _f().Monitor().record("l", "input", *_qs_pair(), "tile"),
    Raises(ValueError, r"granularity"))
add("load_state_dict_fp8_rng_wrong_shape", lambda: _load(_sd(fp8_rng=_t().zeros(3, dtype=_t().int64))),
    Raises(RuntimeError, r"fp8_rng|size"))
add("load_state_dict_fp8_auto_wrong_shape", lambda: _load(_sd(fp8_auto=_t().zeros(3, 4, dtype=_t().int64))),
    Raises(RuntimeError, r"fp8_auto|size"))
