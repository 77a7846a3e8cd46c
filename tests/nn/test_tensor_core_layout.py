"""The operand layouts fp8mix's layers hand FP8 tensor cores (issue #16), checked on the CPU.

cuBLASLt's FP8 GEMM reads only "TN": both operands contiguous along the reduction
dimension. On CUDA the layers therefore cast x, W and dy with their transposes where a B
operand needs it, so that no copy is made before a GEMM. fp8mix.nn._plan.TN_ON_CPU sends
the CPU through the same path; the C GEMM sums in one fixed order whatever B's layout, so
the results must equal the CPU path's bit for bit, and every B must be K-contiguous."""
from __future__ import annotations

import copy

import pytest
import torch

import fp8mix
from fp8mix import ops
from fp8mix.nn import _direct, _plan
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=4), "current": CurrentScaling, "block": BlockScaling,
           "delayed_sr": lambda: DelayedScaling(rounding="stochastic")}


def _layer(kind):
    torch.manual_seed(80)
    return fp8mix.Linear(160, 144) if kind == "linear" else fp8mix.nn.Conv1D(144, 160)


def _run(layer, rec, steps=3):
    out = []
    for i in range(steps):
        x = (torch.randn(70, 160, generator=torch.Generator().manual_seed(i)) * (i + 1)).requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            y = layer(x, is_first_microbatch=None if i < 2 else True)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(10 + i)))
        out.append((y.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]))
        layer.zero_grad()
    return out, {k: v for k, v in layer.state_dict().items() if "fp8_" in k}


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_tensor_core_layouts_give_the_same_bits_and_k_contiguous_operands(kind, recipe, monkeypatch):
    base = _layer(kind)
    ref, ref_state = _run(copy.deepcopy(base), RECIPES[recipe]())
    seen = []

    def spy(real):
        def call(a, b, *args, **kw):
            seen.append((a.stride(), b.shape, b.stride()))
            return real(a, b, *args, **kw)
        return call

    monkeypatch.setattr(ops, "scaled_mm", spy(ops.scaled_mm))
    monkeypatch.setattr(_direct, "scaled_mm", spy(_direct.scaled_mm))  # (a direct path's forward GEMM)
    monkeypatch.setattr(_plan, "TN_ON_CPU", True)
    got, got_state = _run(copy.deepcopy(base), RECIPES[recipe]())
    for (y0, x0, g0), (y1, x1, g1) in zip(ref, got):
        assert torch.equal(y0, y1) and torch.equal(x0, x1)
        assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    for k in ref_state:
        assert torch.equal(ref_state[k], got_state[k]), k
    assert len(seen) == 9
    for a_stride, b_shape, b_stride in seen:
        assert a_stride[1] == 1, f"A is not K-contiguous: strides {a_stride}"
        assert b_stride[0] == 1 or b_shape[0] == 1, f"B {tuple(b_shape)} is not K-contiguous: strides {b_stride}"
