"""Hostile-input cases: scaled_mm."""
from __future__ import annotations

import math  # noqa: F401

from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

# ---- scaled_mm ---------------------------------------------------------------------------------


def _mm_operands(m=8, k=32, n=16):
    fp8mix = _f()
    a = fp8mix.quantize(x_(m, k, seed=1))
    w = fp8mix.quantize(x_(n, k, seed=2))
    return a, w


def _one():
    return _t().tensor(1.0)


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
