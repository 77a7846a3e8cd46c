"""Backward re-casts the weight (fp8_recast_weight, the CPU default) instead of keeping its
FP8 copy from the forward: the same bits as keeping it, no FP8 weight among the saved
tensors, and an in-place change of the weight between forward and backward is refused
as nn.Linear refuses it."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fp8mix
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {
    "delayed": lambda: DelayedScaling(),
    "current": lambda: CurrentScaling(),
    "delayed sr": lambda: DelayedScaling(rounding="stochastic"),
    "current sr weight": lambda: CurrentScaling(rounding={"weight": "stochastic"}),
    "block": lambda: BlockScaling(),  # 128x128-block weight scales, re-cast from their amaxes
    "block sr": lambda: BlockScaling(rounding="stochastic"),
}
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_START: dict = {}


def _module(kind: str, recast: bool) -> nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        m = fp8mix.Linear(48, 40)
    elif kind == "conv1d":
        m = fp8mix.nn.Conv1D(40, 48)
    else:
        m = fp8mix.LayerNormMLP(48, 64)
    for sub in m.modules():
        sub.fp8_recast_weight = recast
    return m


def _steps(kind: str, recipe: str, recast: bool, steps: int = 3):
    """Outputs, gradients and FP8 state of a few training steps (every module starts from
    the same parameters and FP8 state, its random stream's key included)."""
    m = _module(kind, recast)
    m.load_state_dict(_module(kind, recast=False).state_dict() if not _START.get(kind) else _START[kind])
    _START.setdefault(kind, {k: v.clone() for k, v in m.state_dict().items()})
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    got = []
    for _ in range(steps):
        x = torch.randn(24, 48, generator=gen).requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = m(x)
        y.square().mean().backward()
        got += [y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad()
    return got, {k: v.clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("kind", ["linear", "conv1d", "layernorm_mlp"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recast_gives_the_bits_of_the_kept_copy(kind, recipe):
    kept, kept_state = _steps(kind, recipe, recast=False)
    again, again_state = _steps(kind, recipe, recast=True)
    for i, (a, b) in enumerate(zip(kept, again)):
        assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                           b.view(torch.int32) if b.dtype == torch.float32 else b), f"tensor {i} differs"
    assert kept_state.keys() == again_state.keys()
    for k in kept_state:
        assert torch.equal(kept_state[k], again_state[k]), k


def _saved(recast: bool, recipe: str = "delayed"):
    m = _module("linear", recast)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.randn(24, 48).requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), fp8mix.fp8_autocast(
            fp8_recipe=RECIPES[recipe]()):
        y = m(x)
    return m, x, y, saved


@pytest.mark.parametrize("recipe", ["delayed", "block"])
def test_recast_keeps_no_fp8_weight_and_the_default_is_recast_on_cpu(recipe):
    x_shape = (24, 48)
    m, _, _, saved = _saved(recast=True, recipe=recipe)
    fp8_shapes = [tuple(t.shape) for t in saved if t is not None and t.dtype in FP8]
    assert fp8_shapes == [x_shape], fp8_shapes  # x's FP8 copy only
    assert any(t is m.weight for t in saved if t is not None)
    _, _, _, kept = _saved(recast=False, recipe=recipe)
    assert sorted(tuple(t.shape) for t in kept if t is not None and t.dtype in FP8) == sorted([x_shape, (40, 48)])
    # no attribute set: the CPU default re-casts
    torch.manual_seed(0)
    plain = fp8mix.Linear(48, 40)
    saved2 = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved2.append(t) or t, lambda t: t), \
            fp8mix.fp8_autocast():
        plain(torch.randn(8, 48).requires_grad_())
    assert [tuple(t.shape) for t in saved2 if t is not None and t.dtype in FP8] == [(8, 48)]


def test_recast_choice_from_a_class_attribute():
    """fp8_recast_weight set on a subclass (not the instance) is honoured, and an instance
    attribute overrides the class's: the saved FP8 tensors show which was used."""
    class Keeping(fp8mix.Linear):
        fp8_recast_weight = False

    def fp8_saved(m):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), \
                fp8mix.fp8_autocast():
            m(torch.randn(8, 48).requires_grad_())
        return sorted(tuple(t.shape) for t in saved if t is not None and t.dtype in FP8)

    m = Keeping(48, 40)
    assert fp8_saved(m) == [(8, 48), (40, 48)]  # the class says keep: W's FP8 copy is saved
    m.fp8_recast_weight = True
    assert fp8_saved(m) == [(8, 48)]  # the instance says re-cast


def test_weight_changed_between_forward_and_backward_is_refused_like_nn_linear():
    ref = nn.Linear(48, 40)
    y = ref(torch.randn(24, 48, requires_grad=True))
    with torch.no_grad():
        ref.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    m = _module("linear", recast=True)
    with fp8mix.fp8_autocast():
        y = m(torch.randn(24, 48, requires_grad=True))
    with torch.no_grad():
        m.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_first_microbatch_cache_is_kept_not_recast():
    """is_first_microbatch=True keeps the FP8 weight for later microbatches: backward uses it."""
    m = _module("linear", recast=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), \
            fp8mix.fp8_autocast():
        m(torch.randn(8, 48).requires_grad_(), is_first_microbatch=True)
    assert sorted(tuple(t.shape) for t in saved if t is not None and t.dtype in FP8) == [(8, 48), (40, 48)]


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_two_forwards_then_one_backward(recipe):
    """The second forward records a new weight scale before the first forward's backward
    runs: each backward re-casts with its own forward's scale, as the kept copies were."""
    got = {}
    for recast in (False, True):
        m = _module("linear", recast)
        m.load_state_dict(_module("linear", recast=False).state_dict() if "two" not in _START else _START["two"])
        _START.setdefault("two", {k: v.clone() for k, v in m.state_dict().items()})
        gen = torch.Generator().manual_seed(3)
        xs = [torch.randn(24, 48, generator=gen) * s for s in (1.0, 7.0)]
        with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            with torch.no_grad():
                m.weight.mul_(1.0)
            loss = m(xs[0]).square().sum()
            loss = loss + m(xs[1]).square().sum()
        loss.backward()
        got[recast] = [m.weight.grad.clone(), m.bias.grad.clone(), m.fp8_scale.clone()]
    for a, b in zip(got[False], got[True]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", ["block", "block sr"])
def test_block_wgrad_cast_in_slabs_equals_the_whole(monkeypatch, recipe):
    """Block scaling's wgrad cast of dy^T runs in slabs of rows (so that no float32 copy of
    the whole dy^T is made): gradients, outputs and state are the bits of the one-piece
    cast, stochastic rounding's words included; and the one-piece cast is checked against
    a float64 reference of 1x128 tiles along M (amax, scale, round to nearest)."""
    from fp8mix.nn import _casts, _plan

    whole, whole_state = _steps("linear", recipe, recast=True)
    monkeypatch.setattr(_casts, "_WGRAD_CHUNK_BYTES", 24 * 4 * 3)  # 3 rows of dy^T per slab: 14 slabs of 40
    slabs, slabs_state = _steps("linear", recipe, recast=True)
    for i, (a, b) in enumerate(zip(whole, slabs)):
        assert torch.equal(a, b), f"tensor {i} differs"
    for k in whole_state:
        assert torch.equal(whole_state[k], slabs_state[k]), k
    if recipe == "block":  # the tiles against float64: dy^T (40, 24) in one 1x128 tile per row
        plan = _plan.StepPlan(BlockScaling(), None, torch.float32, [None, None, fp8mix.Format.E5M2], False, "out_in", 0)
        plan.skips = {}
        dy = torch.randn(24, 40, dtype=torch.float64)
        gw, sinv = _casts.block_wgrad_cast(dy.float(), plan, None)
        amax = dy.t().abs().amax(dim=1, keepdim=True)
        scale = (57344.0 / amax).float()  # E5M2 max over amax, margin 0
        ref = (dy.t().float() * scale).to(torch.float8_e5m2)
        assert torch.equal(gw.view(torch.uint8), ref.view(torch.uint8))
        torch.testing.assert_close(sinv, 1.0 / scale, rtol=2.4e-7, atol=0)  # within 1 ulp of float32's 1 / scale
