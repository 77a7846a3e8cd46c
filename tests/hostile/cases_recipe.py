"""Hostile-input cases: recipes."""
from __future__ import annotations

import math  # noqa: F401

from .cases_nn import _fwd  # noqa: F401
from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

# ---- recipes -------------------------------------------------------------------------------------



for rname in ("DelayedScaling", "CurrentScaling", "BlockScaling"):
    for label, kw, exc, pat in (
            ("margin_negative", {"margin": -1}, ValueError, r"margin"),
            ("margin_127", {"margin": 127}, ValueError, r"margin"),
            ("margin_float", {"margin": 1.5}, (ValueError, TypeError), r"margin"),
            ("margin_bool", {"margin": True}, (ValueError, TypeError), r"margin"),
            ("margin_str", {"margin": "1"}, (ValueError, TypeError), r"margin"),
            ("format_unknown", {"fp8_format": "E3M4"}, ValueError, r"fp8_format"),
            ("format_int", {"fp8_format": 3}, (ValueError, TypeError), r"fp8_format"),
            ("format_torch_dtype", {"fp8_format": "float8_e4m3fn"}, (ValueError, TypeError), r"fp8_format"),
            ("power_2_scale_int", {"power_2_scale": 1}, TypeError, r"power_2_scale"),
            ("power_2_scale_str", {"power_2_scale": "True"}, TypeError, r"power_2_scale"),
    ):
        add(f"recipe_{rname}_{label}", lambda rname=rname, kw=kw: _R(rname)(**kw), Raises(exc, pat))
for rname in ("CurrentScaling", "BlockScaling"):
    for label, val in (("nan", float("nan")), ("inf", float("inf")), ("negative", -1.0), ("str", "0.1"),
                       ("none", None)):
        add(f"recipe_{rname}_amax_epsilon_{label}", lambda rname=rname, val=val: _R(rname)(amax_epsilon=val),
            Raises((ValueError, TypeError), r"amax_epsilon"))
for label, kw, pat in (("interval_0", {"interval": 0}, r"interval"),
                       ("interval_float", {"interval": 2.0}, r"interval"),
                       ("history_0", {"amax_history_len": 0}, r"amax_history_len"),
                       ("history_negative", {"amax_history_len": -4}, r"amax_history_len"),
                       ("history_float", {"amax_history_len": 16.0}, r"amax_history_len"),
                       ("algo_unknown", {"amax_compute_algo": "min"}, r"amax_compute_algo"),
                       ("algo_none", {"amax_compute_algo": None}, r"amax_compute_algo")):
    add(f"recipe_DelayedScaling_{label}", lambda kw=kw: _R("DelayedScaling")(**kw),
        Raises((ValueError, TypeError), pat))


def _mutated(field, value, rname="DelayedScaling"):
    r = _R(rname)()
    setattr(r, field, value)
    return _fwd(x_(4, 32), r)


# nonsense written into a recipe after construction: recipes are frozen, refused when set
# (dataclasses.FrozenInstanceError, an AttributeError naming the field)
add("recipe_mutated_margin", lambda: _mutated("margin", -5), Raises(AttributeError, r"margin"))
add("recipe_mutated_history_0", lambda: _mutated("amax_history_len", 0), Raises(AttributeError, r"amax_history_len"))
add("recipe_mutated_format", lambda: _mutated("fp8_format", "E3M4"), Raises(AttributeError, r"fp8_format"))
add("recipe_mutated_current_margin", lambda: _mutated("margin", 500, "CurrentScaling"),
    Raises(AttributeError, r"margin"))
add("recipe_algo_returns_str",
    lambda: _fwd(x_(4, 32), _R("DelayedScaling")(amax_compute_algo=lambda h: "big")),
    Raises((TypeError, ValueError), r"amax_compute_algo"))
add("recipe_algo_returns_vector",
    lambda: _fwd(x_(4, 32), _R("DelayedScaling")(amax_compute_algo=lambda h: h, amax_history_len=8)),
    Raises((TypeError, ValueError), r"amax_compute_algo"))
add("recipe_algo_raises", lambda: _fwd(x_(4, 32), _R("DelayedScaling")(amax_compute_algo=lambda h: 1 / 0)),
    Raises(ZeroDivisionError, r"division"))
add("recipe_history_huge_at_use", lambda: _fwd(x_(4, 32), _R("DelayedScaling")(amax_history_len=2**40)),
    Raises((RuntimeError, MemoryError, ValueError), ALLOC + r"|amax_history_len"))
