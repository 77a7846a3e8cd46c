"""Hostile-input cases for every public fp8mix op and module, and the worker that
runs them (used by tests/test_hostile.py, which runs this file in subprocesses).

Each case is a function that makes one call with a hostile argument, and an
expectation:

* ``Raises(types, pattern)``: a Python exception of one of `types` whose message
  matches `pattern` (a case-insensitive regex that names the problem: the
  argument, the dtype, the device...);
* ``Valid()``: the call returns; a valid but unusual input (a transposed,
  strided, stride-0 or overlapping view, an empty or 0-d tensor) must give what
  the plain contiguous input gives, which the case function asserts itself;
* ``MetaOrRaises(types, pattern)``: meta-device inputs: either a result on the
  meta device (shape inference through the fake kernels) or a clean exception.

Never acceptable: a signal (segfault, abort), a hang, or an exception of the
wrong type / with a message that does not say what is wrong.

Run as a script: ``python tests/hostile_worker.py NAME...`` runs the named cases
(all when none are named) and prints one JSON line per case:
``{"start": name}`` before it runs, then
``{"name": ..., "ok": bool, "detail": str}``. The address space is capped
(RLIMIT_AS: what torch maps after import + 3 GiB) so that huge allocations fail
fast and cleanly instead of swapping the machine.
"""
from __future__ import annotations

import json
import math
import re
import sys

# ---- expectations ------------------------------------------------------------------


class Raises:
    def __init__(self, types, pattern: str):
        self.types = types if isinstance(types, tuple) else (types,)
        self.pattern = pattern

    def judge(self, result, exc):
        want = "/".join(t.__name__ for t in self.types)
        if exc is None:
            return False, f"returned {_short(result)}; expected {want} matching /{self.pattern}/"
        msg = str(exc)
        if not isinstance(exc, self.types):
            return False, f"raised {type(exc).__name__}: {msg[:300]!r}; expected {want} matching /{self.pattern}/"
        if not re.search(self.pattern, msg, re.IGNORECASE | re.DOTALL):
            return False, f"{type(exc).__name__} message {msg[:300]!r} does not match /{self.pattern}/"
        return True, f"{type(exc).__name__}: {msg[:160]}"


class Valid:
    def judge(self, result, exc):
        if exc is not None:
            return False, f"valid input raised {type(exc).__name__}: {str(exc)[:300]!r}"
        return True, "ok"


class MetaOrRaises(Raises):
    def judge(self, result, exc):
        if exc is None:
            devs = _devices(result)
            if devs and all(d == "meta" for d in devs):
                return True, "meta result"
            return False, f"returned a result on {sorted(devs)} for meta input (uninitialised data?)"
        return super().judge(result, exc)


def _short(r):
    s = repr(r)
    return s if len(s) < 120 else s[:117] + "..."


def _devices(r):
    import torch

    from fp8mix import Float8Tensor
    if isinstance(r, torch.Tensor):
        return {r.device.type}
    if isinstance(r, Float8Tensor):
        return {r.data.device.type, r.scale_inv.device.type}
    if isinstance(r, (tuple, list)):
        out = set()
        for x in r:
            out |= _devices(x)
        return out
    return set()


# ---- helpers -------------------------------------------------------------------------

CASES: dict = {}


def case(expect, name=None):
    def deco(fn):
        CASES[name or fn.__name__] = (fn, expect)
        return fn
    return deco


def add(name, fn, expect):
    CASES[name] = (fn, expect)


def _t():
    import torch
    return torch


def _f():
    import fp8mix
    return fp8mix


def x_(*shape, dtype=None, seed=0):
    torch = _t()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    return x if dtype is None else x.to(dtype)


def f8_equal(a, b, what=""):
    """Two Float8Tensors hold the same bytes, scale_inv and amax (NaN-aware)."""
    torch = _t()
    assert a.data.dtype == b.data.dtype, f"{what}: dtype {a.data.dtype} vs {b.data.dtype}"
    assert a.data.shape == b.data.shape, f"{what}: shape {tuple(a.data.shape)} vs {tuple(b.data.shape)}"
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)), f"{what}: FP8 bytes differ"
    assert a.scale_inv.shape == b.scale_inv.shape, f"{what}: scale_inv shape"
    assert torch.equal(a.scale_inv, b.scale_inv), f"{what}: scale_inv differs"
    if a.amax is not None or b.amax is not None:
        assert torch.allclose(a.amax, b.amax, equal_nan=True, rtol=0, atol=0), f"{what}: amax differs"


# Message patterns
HP = r"float32, bfloat16 or float16"
SCALE = r"scale.*(finite|> ?0|positive)"
DEVICE = r"meta|device"
ALLOC = r"alloc|memory|overflow"


def _views(dtype=None):
    """Non-contiguous views (made in `dtype` itself: .to() would copy them into a
    contiguous tensor)."""
    torch = _t()
    dtype = dtype or torch.float32
    base = x_(40, 300, seed=3, dtype=dtype)
    return {
        "transposed": base[:, :24].t(),                                  # (24, 40), strides (1, 300)
        "step_slice": base[::3, ::2],                                    # (14, 150), inner stride 2
        "row_slice": base[5:25, 7:207],                                  # inner stride 1, ld 300
        "stride0_rows": base[3:4, :].expand(9, 300),                     # stride (0, 1)
        "stride0_all": torch.tensor(1.5, dtype=dtype).expand(5, 131),    # stride (0, 0)
        "overlap": torch.as_strided(base, (50, 130), (3, 1)),            # rows overlap
        "permute3d": x_(6, 5, 140, seed=4, dtype=dtype).permute(1, 0, 2),  # 3-D, inner stride 1
        "inner_stride3": torch.as_strided(base, (7, 90), (301, 3)),
    }


# ---- quantize ------------------------------------------------------------------------------

for dt in ("int32", "int64", "uint8", "bool", "float64", "complex64", "float8_e4m3fn"):
    def _q_dtype(dt=dt):
        torch = _t()
        x = torch.ones(3, 5).to(getattr(torch, dt))
        return _f().quantize(x)
    add(f"quantize_dtype_{dt}", _q_dtype, Raises(TypeError, HP))
    def _amax_dtype(dt=dt):
        torch = _t()
        return _f().amax(torch.ones(3, 5).to(getattr(torch, dt)))
    add(f"amax_dtype_{dt}", _amax_dtype, Raises(TypeError, HP))
    def _ct_dtype(dt=dt):
        torch = _t()
        return _f().cast_transpose(torch.ones(3, 5).to(getattr(torch, dt)))
    add(f"cast_transpose_dtype_{dt}", _ct_dtype, Raises(TypeError, HP))

add("quantize_list", lambda: _f().quantize([1.0, 2.0]), Raises(TypeError, r"torch\.Tensor"))
add("quantize_none", lambda: _f().quantize(None), Raises(TypeError, r"torch\.Tensor"))
add("quantize_numpy", lambda: _f().quantize(x_(3, 3).numpy()), Raises(TypeError, r"torch\.Tensor"))
add("amax_none", lambda: _f().amax(None), Raises(TypeError, r"torch\.Tensor"))


@case(Valid())
def quantize_0d():
    torch = _t()
    fp8mix = _f()
    for g in ("tensor", "row", "block", "block2d"):
        q = fp8mix.quantize(torch.tensor(-3.25), granularity=g)
        assert q.data.shape == (), f"{g}: shape {q.data.shape}"
        q1 = fp8mix.quantize(torch.tensor([-3.25]), granularity=g)
        assert torch.equal(q.data.view(torch.uint8).reshape(1), q1.data.view(torch.uint8)), g
        assert float(q.dequantize()) == -3.25, f"{g}: {float(q.dequantize())}"


@case(Valid())
def amax_0d():
    torch = _t()
    assert float(_f().amax(torch.tensor(-7.5))) == 7.5


for shape in ((0, 16), (3, 0), (0,), (2, 0, 5), (0, 0)):
    for g in ("tensor", "row", "block", "block2d"):
        def _q_empty(shape=shape, g=g):
            torch = _t()
            x = torch.empty(*shape)
            q = _f().quantize(x, granularity=g)
            assert q.data.shape == x.shape, f"shape {tuple(q.data.shape)}"
            assert q.dequantize().shape == x.shape
            return q
        add(f"quantize_empty_{'x'.join(map(str, shape))}_{g}", _q_empty, Valid())
    def _amax_empty(shape=shape):
        torch = _t()
        a = _f().amax(torch.empty(*shape))
        assert float(a) == 0.0, f"amax of empty = {float(a)}"
    add(f"amax_empty_{'x'.join(map(str, shape))}", _amax_empty, Valid())


@case(Valid())
def cast_transpose_empty_rows():
    torch = _t()
    q, qt = _f().cast_transpose(torch.empty(0, 16))
    assert q.data.shape == (0, 16) and qt.data.shape == (16, 0)


@case(Valid())
def cast_transpose_empty_cols():
    torch = _t()
    q, qt = _f().cast_transpose(torch.empty(5, 0))
    assert q.data.shape == (5, 0) and qt.data.shape[0] == 0


@case(Valid())
def quantize_empty_huge_view():
    torch = _t()
    x = torch.zeros(0, 1).expand(0, 2**40)
    q = _f().quantize(x)
    assert q.data.shape == (0, 2**40)


@case(Valid())
def amax_empty_huge_view():
    torch = _t()
    assert float(_f().amax(torch.zeros(0, 1).expand(0, 2**40))) == 0.0


add("quantize_huge_expand_alloc", lambda: _f().quantize(_t().zeros(1, 1).expand(2**20, 2**20)),
    Raises((RuntimeError, MemoryError), ALLOC))
add("quantize_huge_expand_overflow", lambda: _f().quantize(_t().zeros(1, 1).expand(2**31, 2**31)),
    Raises((RuntimeError, MemoryError, ValueError, OverflowError), ALLOC))
add("quantize_huge_1x2pow31_bf16", lambda: _f().quantize(_t().zeros(1, 1, dtype=_t().bfloat16).expand(1, 2**31)),
    Raises((RuntimeError, MemoryError), ALLOC))
add("amax_huge_expand", lambda: _f().amax(_t().zeros(1, 1).expand(1, 2**40)),
    Raises((RuntimeError, MemoryError), ALLOC))
add("cast_transpose_huge_expand", lambda: _f().cast_transpose(_t().zeros(1, 1).expand(2**21, 2**21)),
    Raises((RuntimeError, MemoryError), ALLOC))

# non-contiguous inputs: the same bytes as the contiguous copy
for vname in ("transposed", "step_slice", "row_slice", "stride0_rows", "stride0_all", "overlap", "permute3d",
              "inner_stride3"):
    for dt in ("float32", "bfloat16", "float16"):
        def _q_view(vname=vname, dt=dt):
            torch = _t()
            fp8mix = _f()
            v = _views(getattr(torch, dt))[vname]
            assert v.dtype == getattr(torch, dt) and not v.is_contiguous(), "harness: view is contiguous"
            for g in ("tensor", "row", "block", "block2d"):
                for kw in ({}, {"rounding": "stochastic", "seed": 7, "offset": 3}, {"scale": None, "margin": 2},
                           {"fmt": "E5M2", "saturate": False}):
                    a = fp8mix.quantize(v, granularity=g, **kw)
                    b = fp8mix.quantize(v.contiguous(), granularity=g, **kw)
                    f8_equal(a, b, f"{vname}/{dt}/{g}/{kw}")
                am = fp8mix.amax(v, g)
                assert torch.equal(am, fp8mix.amax(v.contiguous(), g)), f"amax {g}"
            for g in ("tensor", "block2d"):
                (a, at), (b, bt) = fp8mix.cast_transpose(v, granularity=g), fp8mix.cast_transpose(v.contiguous(),
                                                                                                   granularity=g)
                f8_equal(a, b, f"cast_transpose q {g}")
                f8_equal(at, bt, f"cast_transpose qt {g}")
                q2 = a.data.reshape(-1, a.data.shape[-1]) if a.data.dim() else a.data.reshape(1, 1)
                assert torch.equal(at.data.view(torch.uint8), q2.t().view(torch.uint8)), "qt is not q transposed"
        add(f"noncontig_{vname}_{dt}", _q_view, Valid())


def _unaligned(shape, dtype, seed=0):
    """A tensor whose data pointer is 1 byte off its dtype's alignment (torch.frombuffer allows it)."""
    import warnings
    torch = _t()
    n = 1
    for d in shape:
        n *= d
    es = torch.empty((), dtype=dtype).element_size()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer warns that a bytearray is writable
        t = torch.frombuffer(bytearray(es * n + 1), dtype=dtype, offset=1, count=n).reshape(shape)
    assert t.data_ptr() % es != 0 or es == 1
    if dtype.is_floating_point and dtype.itemsize > 1:
        t.copy_(x_(*shape, seed=seed))
    return t


@case(Valid())
def unaligned_inputs():
    """Inputs at an odd address (misaligned for their dtype) give the same bytes as aligned copies."""
    torch = _t()
    fp8mix = _f()
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x = _unaligned((5, 300), dt)
        for g in ("tensor", "row", "block", "block2d"):
            f8_equal(fp8mix.quantize(x, granularity=g), fp8mix.quantize(x.clone(), granularity=g), f"{dt} {g}")
            assert torch.equal(fp8mix.amax(x, g), fp8mix.amax(x.clone(), g))
        f8_equal(fp8mix.quantize(x, scale=_unaligned((5, 1), torch.float32, 1).abs() + 0.5, granularity="row"),
                 fp8mix.quantize(x.clone(), scale=_unaligned((5, 1), torch.float32, 1).abs() + 0.5,
                                 granularity="row"), "unaligned scale")
    a8 = fp8mix.quantize(x_(16, 64)).data
    ua = _unaligned((16, 64), torch.uint8)
    ua.copy_(a8.view(torch.uint8))
    ua = ua.view(torch.float8_e4m3fn)
    bias = _unaligned((16,), torch.float32, 2)
    one = torch.tensor(1.0)
    assert torch.equal(mm(ua, ua.t(), one, one, bias=bias), mm(a8, a8.t(), one, one, bias=bias.clone()))
    q = fp8mix.Float8Tensor(ua, one)
    assert torch.equal(q.dequantize(torch.bfloat16), fp8mix.Float8Tensor(a8, one).dequantize(torch.bfloat16))


@case(Valid())
def quantize_scale_noncontig():
    torch = _t()
    fp8mix = _f()
    x = x_(6, 300)
    s = (torch.rand(6, 2) + 0.5)[:, 1:]          # (6, 1) with stride (2, 1)
    a, b = fp8mix.quantize(x, scale=s, granularity="row"), fp8mix.quantize(x, scale=s.contiguous(),
                                                                           granularity="row")
    f8_equal(a, b, "row scales")
    s = (torch.rand(3, 6) + 0.5).t()             # (6, 3) transposed: block scales
    a, b = fp8mix.quantize(x, scale=s, granularity="block"), fp8mix.quantize(x, scale=s.contiguous(),
                                                                             granularity="block")
    f8_equal(a, b, "block scales")


@case(Valid())
def quantize_requires_grad():
    torch = _t()
    x = x_(4, 16).requires_grad_()
    a = _f().quantize(x)
    f8_equal(a, _f().quantize(x.detach()), "requires_grad")
    assert not a.data.requires_grad and not a.scale_inv.requires_grad, \
        "FP8 outputs of a requires_grad input require grad (a grad_fn without an autograd kernel)"


@case(Valid())
def quantize_nonfinite_values():
    torch = _t()
    x = torch.tensor([[1.0, float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, 3e38]])
    for g in ("tensor", "row", "block", "block2d"):
        q = _f().quantize(x, granularity=g)
        assert math.isnan(float(q.amax.reshape(-1)[0])), "amax with a NaN must be NaN"
        q = _f().quantize(x, scale=1.0, granularity=g)
        d = q.data.view(torch.uint8)
        assert int(d[0, 1]) == 0x7F and int(d[0, 2]) == 0x7E and int(d[0, 3]) == 0xFE, d.tolist()


for label, val in (("nan", float("nan")), ("inf", float("inf")), ("neginf", -float("inf")), ("zero", 0.0),
                   ("neg", -2.0), ("negzero", -0.0)):
    add(f"quantize_scale_{label}", lambda val=val: _f().quantize(x_(4, 16), scale=val),
        Raises(ValueError, SCALE))
    add(f"quantize_scale_tensor_{label}", lambda val=val: _f().quantize(x_(4, 16), scale=_t().tensor(val)),
        Raises(ValueError, SCALE))
    add(f"quantize_scale_row_one_{label}",
        lambda val=val: _f().quantize(x_(4, 16), scale=_t().tensor([[1.0], [2.0], [val], [4.0]]),
                                      granularity="row"), Raises(ValueError, SCALE))
    add(f"cast_transpose_scale_{label}", lambda val=val: _f().cast_transpose(x_(4, 16), scale=val),
        Raises(ValueError, SCALE))

add("quantize_scale_float64", lambda: _f().quantize(x_(4, 16), scale=_t().tensor(2.0, dtype=_t().float64)),
    Raises(TypeError, r"scale.*float32"))
add("quantize_scale_int_tensor", lambda: _f().quantize(x_(4, 16), scale=_t().tensor(2)),
    Raises(TypeError, r"scale.*float32"))
add("quantize_scale_str", lambda: _f().quantize(x_(4, 16), scale="2"), Raises(TypeError, r"scale"))
add("quantize_scale_row_wrong_count", lambda: _f().quantize(x_(4, 16), scale=_t().ones(3), granularity="row"),
    Raises(ValueError, r"scale.*3 elements.*4"))
add("quantize_scale_block_wrong_count",
    lambda: _f().quantize(x_(4, 300), scale=_t().ones(4, 2), granularity="block"),
    Raises(ValueError, r"scale.*8 elements.*12"))
add("quantize_scale_block2d_wrong_count",
    lambda: _f().quantize(x_(200, 300), scale=_t().ones(3), granularity="block2d"),
    Raises(ValueError, r"scale.*3 elements.*6"))
add("quantize_scale_tensor_wrong_count", lambda: _f().quantize(x_(4, 16), scale=_t().ones(2)),
    Raises(ValueError, r"scale.*2 elements.*1"))
add("quantize_scale_empty_tensor", lambda: _f().quantize(x_(4, 16), scale=_t().ones(0)),
    Raises(ValueError, r"scale.*0 elements"))
add("cast_transpose_scale_wrong_count",
    lambda: _f().cast_transpose(x_(4, 16), scale=_t().ones(2), granularity="block2d"),
    Raises(ValueError, r"scale.*2 elements"))

add("quantize_margin_negative", lambda: _f().quantize(x_(4, 16), margin=-1), Raises(ValueError, r"margin"))
add("quantize_margin_127", lambda: _f().quantize(x_(4, 16), margin=127), Raises(ValueError, r"margin"))
add("quantize_margin_huge", lambda: _f().quantize(x_(4, 16), margin=10**30),
    Raises((ValueError, OverflowError, RuntimeError, TypeError), r"margin"))
add("quantize_margin_float", lambda: _f().quantize(x_(4, 16), margin=1.5),
    Raises((ValueError, RuntimeError, TypeError), r"margin"))
for label, val in (("nan", float("nan")), ("inf", float("inf")), ("neg", -1.0)):
    add(f"quantize_amax_epsilon_{label}", lambda val=val: _f().quantize(x_(4, 16), amax_epsilon=val),
        Raises(ValueError, r"amax_epsilon"))
add("quantize_offset_negative", lambda: _f().quantize(x_(4, 16), offset=-1), Raises(ValueError, r"offset"))
add("quantize_offset_2pow70", lambda: _f().quantize(x_(4, 16), offset=2**70, rounding="stochastic", seed=1),
    Raises((ValueError, OverflowError, RuntimeError), r"offset"))
add("quantize_offset_float", lambda: _f().quantize(x_(4, 16), offset=1.5), Raises((ValueError, TypeError),
                                                                                   r"offset"))
for label, val in (("negative", -1), ("float", 1.5), ("2pow64", 2**64), ("str", "7")):
    add(f"quantize_seed_{label}", lambda val=val: _f().quantize(x_(4, 16), rounding="stochastic", seed=val),
        Raises(ValueError, r"seed"))
add("quantize_fmt_hybrid", lambda: _f().quantize(x_(4, 16), _f().Format.HYBRID),
    Raises(ValueError, r"HYBRID|per-role"))
add("quantize_fmt_unknown_str", lambda: _f().quantize(x_(4, 16), "E3M4"), Raises(ValueError, r"format"))
add("quantize_fmt_int", lambda: _f().quantize(x_(4, 16), 3), Raises(TypeError, r"fmt|format"))
add("quantize_fmt_torch_dtype", lambda: _f().quantize(x_(4, 16), _t().float8_e4m3fn), Raises(TypeError, r"fmt|format"))
add("quantize_granularity_unknown", lambda: _f().quantize(x_(4, 16), granularity="col"),
    Raises(ValueError, r"granularity"))
add("quantize_granularity_none", lambda: _f().quantize(x_(4, 16), granularity=None),
    Raises((ValueError, TypeError), r"granularity"))
add("quantize_granularity_int", lambda: _f().quantize(x_(4, 16), granularity=1),
    Raises((ValueError, TypeError), r"granularity"))
add("quantize_rounding_unknown", lambda: _f().quantize(x_(4, 16), rounding="up"), Raises(ValueError, r"rounding"))
add("quantize_saturate_str", lambda: _f().quantize(x_(4, 16), saturate="no"),
    Raises((TypeError, ValueError, RuntimeError), r"saturate"))
add("quantize_power_2_scale_str", lambda: _f().quantize(x_(4, 16), power_2_scale="yes"),
    Raises((TypeError, ValueError, RuntimeError), r"power_2_scale"))
add("amax_granularity_unknown", lambda: _f().amax(x_(4, 16), "rows"), Raises(ValueError, r"granularity"))
add("cast_transpose_granularity_row", lambda: _f().cast_transpose(x_(4, 16), granularity="row"),
    Raises(ValueError, r"granularity"))
add("cast_transpose_granularity_block", lambda: _f().cast_transpose(x_(4, 16), granularity="block"),
    Raises(ValueError, r"granularity"))
add("set_max_isa_unknown", lambda: _f().set_max_isa("avx1024"), Raises(ValueError, r"ISA|avx1024"))

# meta device
add("quantize_meta_input", lambda: _f().quantize(_t().ones(3, 5, device="meta")),
    MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))
add("amax_meta_input", lambda: _f().amax(_t().ones(3, 5, device="meta")),
    MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))
add("cast_transpose_meta_input", lambda: _f().cast_transpose(_t().ones(3, 5, device="meta")),
    MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))
add("quantize_cpu_input_meta_scale", lambda: _f().quantize(x_(4, 16), scale=_t().tensor(2.0, device="meta")),
    Raises((ValueError, RuntimeError, NotImplementedError), DEVICE))
add("cast_transpose_cpu_input_meta_scale",
    lambda: _f().cast_transpose(x_(4, 16), scale=_t().tensor(2.0, device="meta")),
    Raises((ValueError, RuntimeError, NotImplementedError), DEVICE))


# ---- dequantize / Float8Tensor ------------------------------------------------------------------


def _q8(shape=(4, 16), g="tensor", fmt="E4M3"):
    return _f().quantize(x_(*shape), fmt, granularity=g)


add("dequantize_plain_tensor", lambda: _f().dequantize(x_(4, 16)), Raises(TypeError, r"Float8Tensor"))
add("dequantize_none", lambda: _f().dequantize(None), Raises(TypeError, r"Float8Tensor"))
for dt in ("int32", "float64", "bool", "float8_e4m3fn"):
    add(f"dequantize_dtype_{dt}", lambda dt=dt: _f().dequantize(_q8(), getattr(_t(), dt)), Raises(TypeError, HP))
add("dequantize_dtype_str", lambda: _f().dequantize(_q8(), "float32"),
    Raises((TypeError, ValueError, RuntimeError), r"dtype"))
for label, val in (("nan", float("nan")), ("inf", float("inf")), ("zero", 0.0), ("neg", -1.0)):
    add(f"dequantize_scale_inv_{label}",
        lambda val=val: _f().Float8Tensor(_q8().data, _t().tensor(val)).dequantize(), Raises(ValueError, SCALE))
    add(f"dequantize_row_scale_inv_{label}",
        lambda val=val: _f().Float8Tensor(_q8().data, _t().tensor([[1.0], [val], [1.0], [1.0]]), None,
                                          "row").dequantize(), Raises(ValueError, SCALE))
add("dequantize_scale_inv_wrong_count",
    lambda: _f().Float8Tensor(_q8().data, _t().ones(3), None, "row").dequantize(),
    Raises(ValueError, r"scale_inv.*3 elements.*4"))
add("dequantize_block2d_scale_inv_wrong_count",
    lambda: _f().Float8Tensor(_q8((200, 300)).data, _t().ones(2, 2), None, "block2d").dequantize(),
    Raises(ValueError, r"scale_inv.*4 elements.*6"))
add("dequantize_cpu_data_meta_scale_inv",
    lambda: _f().Float8Tensor(_q8().data, _t().tensor(1.0, device="meta")).dequantize(),
    Raises((ValueError, RuntimeError, NotImplementedError), DEVICE))
add("dequantize_meta_data", lambda: _f().Float8Tensor(_q8().data.to("meta"), _t().tensor(1.0, device="meta"))
    .dequantize(), MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))


@case(Valid())
def dequantize_noncontig():
    torch = _t()
    fp8mix = _f()
    for g in ("tensor", "row", "block", "block2d"):
        q = fp8mix.quantize(x_(40, 300), granularity=g)
        views = [q.data[::2], q.data[:, 5:200], torch.as_strided(q.data, (20, 100), (7, 1))]
        for v in views:
            si = q.scale_inv
            if g == "row":
                si = torch.rand(v.shape[0], 1) + 0.5
            elif g == "block":
                si = torch.rand(v.shape[0], (v.shape[1] + 127) // 128) + 0.5
            elif g == "block2d":
                si = torch.rand((v.shape[0] + 127) // 128, (v.shape[1] + 127) // 128) + 0.5
            for dt in (torch.float32, torch.bfloat16, torch.float16):
                a = fp8mix.Float8Tensor(v, si, None, g).dequantize(dt)
                b = fp8mix.Float8Tensor(v.contiguous(), si.contiguous(), None, g).dequantize(dt)
                assert torch.equal(a, b), f"{g} {dt} {tuple(v.shape)} {v.stride()}"
    # transposed data with a per-tensor scale
    q = fp8mix.quantize(x_(16, 48))
    a = fp8mix.Float8Tensor(q.data.t(), q.scale_inv).dequantize()
    assert torch.equal(a, q.dequantize().t())


add("float8tensor_float_data", lambda: _f().Float8Tensor(x_(4, 4), _t().tensor(1.0)), Raises(TypeError, r"FP8"))
add("float8tensor_uint8_data", lambda: _f().Float8Tensor(_t().zeros(4, 4, dtype=_t().uint8), _t().tensor(1.0)),
    Raises(TypeError, r"FP8"))
add("float8tensor_fnuz_data",
    lambda: _f().Float8Tensor(_t().zeros(4, 4).to(_t().float8_e4m3fnuz), _t().tensor(1.0)),
    Raises(TypeError, r"FP8|e4m3fnuz"))
add("float8tensor_list_data", lambda: _f().Float8Tensor([1, 2], _t().tensor(1.0)),
    Raises(TypeError, r"data|tensor|FP8"))
add("float8tensor_none_data", lambda: _f().Float8Tensor(None, _t().tensor(1.0)),
    Raises(TypeError, r"data|tensor|FP8"))
add("float8tensor_scale_inv_float64", lambda: _f().Float8Tensor(_q8().data, _t().tensor(1.0, dtype=_t().float64)),
    Raises(TypeError, r"scale_inv.*float32"))
add("float8tensor_scale_inv_none", lambda: _f().Float8Tensor(_q8().data, None), Raises(TypeError, r"scale_inv"))
add("float8tensor_scale_inv_python_float", lambda: _f().Float8Tensor(_q8().data, 1.0),
    Raises(TypeError, r"scale_inv"))
add("float8tensor_granularity_unknown", lambda: _f().Float8Tensor(_q8().data, _t().tensor(1.0), None, "cols"),
    Raises(ValueError, r"granularity"))
add("float8tensor_t_3d", lambda: _f().Float8Tensor(_q8((2, 4, 16)).data, _t().tensor(1.0)).t(),
    Raises(ValueError, r"2-D"))
add("float8tensor_t_row", lambda: _q8(g="row").t(), Raises(ValueError, r"row"))
add("float8tensor_t_block", lambda: _q8(g="block").t(), Raises(ValueError, r"block"))


# ---- scaled_mm ---------------------------------------------------------------------------------


def _mm_operands(m=8, k=32, n=16):
    fp8mix = _f()
    a = fp8mix.quantize(x_(m, k, seed=1))
    w = fp8mix.quantize(x_(n, k, seed=2))
    return a, w


def _one():
    return _t().tensor(1.0)


def mm(*args, **kw):
    return _f().scaled_mm(*args, **kw)


add("scaled_mm_inner_mismatch", lambda: mm(_mm_operands()[0], _f().quantize(x_(16, 31)).t()),
    Raises(ValueError, r"inner dimensions"))
add("scaled_mm_float_a", lambda: mm(x_(8, 32), _mm_operands()[1].data.t(), _one(), _one()),
    Raises(TypeError, r"FP8"))
add("scaled_mm_uint8_b", lambda: mm(_mm_operands()[0].data, _t().zeros(32, 16, dtype=_t().uint8), _one(), _one()),
    Raises(TypeError, r"FP8"))
add("scaled_mm_fnuz_a", lambda: mm(_mm_operands()[0].data.view(_t().uint8).view(_t().float8_e4m3fnuz),
                                   _mm_operands()[1].data.t(), _one(), _one()), Raises(TypeError, r"FP8"))
add("scaled_mm_3d_a", lambda: mm(_mm_operands()[0].data.reshape(2, 4, 32), _mm_operands()[1].data.t(), _one(),
                                 _one()), Raises(ValueError, r"2-D"))
add("scaled_mm_1d_a", lambda: mm(_mm_operands()[0].data[0], _mm_operands()[1].data.t(), _one(), _one()),
    Raises(ValueError, r"2-D"))
add("scaled_mm_0d_b", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data[0, 0], _one(), _one()),
    Raises(ValueError, r"2-D"))
add("scaled_mm_scales_missing", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t()),
    Raises(TypeError, r"scale_a"))
for label, val in (("nan", float("nan")), ("inf", float("inf")), ("zero", 0.0), ("neg", -1.0)):
    add(f"scaled_mm_scale_a_{label}",
        lambda val=val: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(), _t().tensor(val), _one()),
        Raises(ValueError, SCALE))
    add(f"scaled_mm_scale_b_row_{label}",
        lambda val=val: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(), _one(),
                           _t().cat([_t().ones(1, 15), _t().tensor([[val]])], 1)), Raises(ValueError, SCALE))
add("scaled_mm_scale_float64", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(),
                                          _t().tensor(1.0, dtype=_t().float64), _one()),
    Raises(TypeError, r"scale_a.*float32"))
add("scaled_mm_scale_a_shape", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(), _t().ones(3), _one()),
    Raises(ValueError, r"scale_a.*shape"))
add("scaled_mm_scale_a_transposed_shape",
    lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(), _t().ones(1, 8), _t().ones(16, 1)),
    Raises(ValueError, r"scale_a.*shape"))
add("scaled_mm_scale_b_shape", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(), _one(), _t().ones(2, 2)),
    Raises(ValueError, r"scale_b.*shape"))
add("scaled_mm_block_mixed", lambda: mm(_f().quantize(x_(8, 300), granularity="block"),
                                        _f().quantize(x_(16, 300)).t()), Raises(ValueError, r"scale_a.*shape"))
add("scaled_mm_bias_shape", lambda: mm(*[t if i == 0 else t.t() for i, t in enumerate(_mm_operands())],
                                       bias=_t().ones(15)), Raises(ValueError, r"bias.*shape"))
add("scaled_mm_bias_2d", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), bias=_t().ones(1, 16)),
    Raises(ValueError, r"bias.*shape"))
add("scaled_mm_bias_int", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), bias=_t().ones(16, dtype=_t().int64)),
    Raises(TypeError, r"bias.*float32"))
add("scaled_mm_bias_float64",
    lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), bias=_t().ones(16, dtype=_t().float64)),
    Raises(TypeError, r"bias.*float32"))
add("scaled_mm_bias_list", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), bias=[1.0] * 16),
    Raises((TypeError, RuntimeError), r"bias"))
add("scaled_mm_out_dtype_int", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), out_dtype=_t().int32),
    Raises(TypeError, r"out_dtype"))
add("scaled_mm_out_dtype_float64", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), out_dtype=_t().float64),
    Raises(TypeError, r"out_dtype"))
add("scaled_mm_accumulate_unknown", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), accumulate="fp16"),
    Raises(ValueError, r"accumulate"))
add("scaled_mm_promote_interval_negative",
    lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), accumulate="fp22", promote_interval=-1),
    Raises(ValueError, r"promote_interval"))
add("scaled_mm_float8tensor_and_tensor", lambda: mm(_mm_operands()[0], _mm_operands()[1].data.t()),
    Raises(TypeError, r"Float8Tensor"))
add("scaled_mm_float8tensor_with_scales", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), _one(), _one()),
    Raises(ValueError, r"own scales"))
add("scaled_mm_row_scaled_b", lambda: mm(_mm_operands()[0], _f().quantize(x_(32, 16), granularity="row")),
    Raises(ValueError, r"row"))
add("scaled_mm_huge_expand", lambda: mm(_mm_operands()[0].data[:1, :1].expand(2**21, 1),
                                        _mm_operands()[1].data.t()[:1, :1].expand(1, 2**21), _one(), _one()),
    Raises((RuntimeError, MemoryError), ALLOC))
add("scaled_mm_meta_scale_a", lambda: mm(_mm_operands()[0].data, _mm_operands()[1].data.t(),
                                         _t().tensor(1.0, device="meta"), _one()),
    Raises((ValueError, RuntimeError, NotImplementedError), DEVICE))
add("scaled_mm_meta_bias", lambda: mm(_mm_operands()[0], _mm_operands()[1].t(), bias=_t().ones(16, device="meta")),
    Raises((ValueError, RuntimeError, NotImplementedError), DEVICE))
add("scaled_mm_meta_operands", lambda: mm(_mm_operands()[0].data.to("meta"), _mm_operands()[1].data.t().to("meta"),
                                          _t().tensor(1.0, device="meta"), _t().tensor(1.0, device="meta")),
    MetaOrRaises((NotImplementedError, ValueError, TypeError), DEVICE))


@case(Valid())
def scaled_mm_empty():
    torch = _t()
    a, w = _mm_operands()
    one = _one()
    y = mm(a.data[:0], w.data.t(), one, one)
    assert y.shape == (0, 16)
    y = mm(a.data, w.data.t()[:, :0], one, one)
    assert y.shape == (8, 0)
    bias = torch.arange(16.0)
    y = mm(a.data[:, :0], w.data.t()[:0], one, one, bias=bias)
    assert y.shape == (8, 16) and torch.equal(y, bias.expand(8, 16)), "K = 0 must give the bias"
    y = mm(a.data[:, :0], w.data.t()[:0], one, one)
    assert torch.equal(y, torch.zeros(8, 16)), "K = 0 must give zeros"


@case(Valid())
def scaled_mm_noncontig_operands():
    torch = _t()
    fp8mix = _f()
    a8 = fp8mix.quantize(x_(48, 64, seed=5)).data
    b8 = fp8mix.quantize(x_(40, 64, seed=6)).data         # (N, K) row-major weight
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    views_a = {
        "contig": a8,
        "t_of_t": a8.t().contiguous().t(),                  # column-major A
        "row_step": fp8mix.quantize(x_(96, 64, seed=5)).data[::2],
        "col_step": fp8mix.quantize(x_(48, 128, seed=5)).data[:, ::2],
        "stride0": a8[:1].expand(48, 64),
        "overlap": torch.as_strided(fp8mix.quantize(x_(60, 64, seed=5)).data, (48, 64), (1, 1)),
    }
    views_b = {
        "wt": b8.t(),                                       # column-major (K, N): torch's layout
        "rowmajor": b8.t().contiguous(),                    # row-major (K, N)
        "stride0": b8[:1].t().expand(64, 40),
        "step": fp8mix.quantize(x_(80, 64, seed=6)).data[::2].t(),
        "kstep": fp8mix.quantize(x_(40, 128, seed=6)).data[:, ::2].t(),
    }
    for an, a in views_a.items():
        for bn, b in views_b.items():
            for kw in ({}, {"accumulate": "fp22", "promote_interval": 16},
                       {"out_dtype": torch.bfloat16, "bias": torch.arange(40.0)}):
                y = mm(a, b, sa, sb, **kw)
                y2 = mm(a.contiguous(), b.contiguous(), sa, sb, **kw)
                assert torch.equal(y, y2), f"A {an} x B {bn} {kw}"
    # row / column scales given as strided views
    s_a = (torch.rand(48, 2) + 0.5)[:, :1]
    s_b = (torch.rand(2, 40) + 0.5)[1:]
    assert torch.equal(mm(a8, b8.t(), s_a, s_b), mm(a8, b8.t(), s_a.contiguous(), s_b.contiguous()))


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


# ---- recipes -------------------------------------------------------------------------------------


def _R(name):
    return getattr(_f().recipe, name)


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
    lin.fp8_format_report()


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


# ---- harness self-test (tests/test_hostile.py checks that a dying worker is pinned on its case) -----

if __import__("os").environ.get("FP8MIX_HOSTILE_SELFTEST"):
    def _abort():
        import os
        os.abort()

    def _segv():
        import ctypes
        import faulthandler
        faulthandler.disable()  # keep the report short: the signal is what counts
        ctypes.string_at(0)

    for _n in ("_selftest_ok", "_selftest_ok2", "_selftest_ok3"):
        add(_n, lambda: None, Valid())
    add("_selftest_abort", _abort, Valid())
    add("_selftest_segv", _segv, Valid())


# ---- worker ------------------------------------------------------------------------------------------


def _reset():
    """Undo what a case may leave behind: autocast frames, the ISA cap."""
    if "fp8mix" not in sys.modules:
        return
    try:
        from fp8mix import autocast, ops
        autocast._state.stack.clear()
        ops.set_max_isa("avx512bf16")
    except Exception:
        pass


def run_case(name):
    fn, expect = CASES[name]
    result, exc = None, None
    try:
        result = fn()
    except AssertionError as e:  # a wrong result of a valid call
        if isinstance(expect, Valid):
            return False, f"wrong result: {e}"
        exc = e
    except Exception as e:  # noqa: BLE001 - any clean Python exception is judged below
        exc = e
    finally:
        _reset()
    return expect.judge(result, exc)


def _cap_address_space(headroom):
    """Cap the address space at what is mapped now (torch and its libraries) plus
    `headroom`, so that a huge allocation fails at once with a clean error instead of
    paging the machine to death.  Linux only; a no-op elsewhere."""
    import resource
    try:
        with open("/proc/self/status") as fh:
            vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    cap = vm + headroom
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def main(argv):
    import faulthandler

    faulthandler.enable()  # a crash prints the Python stack to stderr
    names = argv or list(CASES)
    if not all(n.startswith("_selftest") for n in names):
        import torch
        torch.set_num_threads(2)
        import fp8mix  # noqa: F401
    _cap_address_space(3 << 30)

    for name in names:
        print(json.dumps({"start": name}), flush=True)
        ok, detail = run_case(name)
        print(json.dumps({"name": name, "ok": bool(ok), "detail": detail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
