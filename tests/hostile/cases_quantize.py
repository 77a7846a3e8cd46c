"""Hostile-input cases: quantize, amax, cast_transpose and the raw cast ops."""
from __future__ import annotations

import math  # noqa: F401

from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

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
