"""Hostile-input cases: dequantize and Float8Tensor."""
from __future__ import annotations

import math  # noqa: F401

from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

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
