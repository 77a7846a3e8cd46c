"""Tests of fp8_autocast / autocast: context manager and decorator, nesting (innermost
wins), enabled=False, default recipe, TE 2.x spelling, backward under the forward's recipe,
several uses of a module in one context."""
from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F
from helpers import RECIPE_IDS, RECIPES, make_pair, sqnr_db

import fp8mix
from fp8mix import fp8_autocast
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


# --------------------------------------------------------------------------------------
# fp8_autocast
# --------------------------------------------------------------------------------------
def test_autocast_signatures_and_default_recipe():
    sig = inspect.signature(fp8mix.fp8_autocast)
    assert [(p.name, p.default) for p in sig.parameters.values()] == \
        [("enabled", True), ("fp8_recipe", None), ("fp8_group", None), ("monitor", None), ("calibrating", False)]
    sig = inspect.signature(fp8mix.autocast)
    assert [(p.name, p.default) for p in sig.parameters.values()] == \
        [("enabled", True), ("recipe", None), ("amax_reduction_group", None), ("monitor", None),
         ("calibrating", False)]
    from fp8mix.context import get_fp8_recipe
    assert not fp8mix.is_fp8_enabled() and get_fp8_recipe() is None
    with fp8_autocast():
        assert fp8mix.is_fp8_enabled()
        r = get_fp8_recipe()
        assert isinstance(r, DelayedScaling) and r == DelayedScaling()
        assert r.fp8_format is fp8mix.Format.HYBRID
        with fp8_autocast():  # built once: every context without a recipe shares that value
            assert get_fp8_recipe() is r
    with fp8mix.autocast():
        assert get_fp8_recipe() is r
    assert not fp8mix.is_fp8_enabled()
    # default recipe really is delayed scaling: the layer records its amaxes
    lin = fp8mix.Linear(32, 32)
    with fp8_autocast():
        lin(torch.randn(4, 32))
    assert lin.fp8_steps.tolist()[:2] == [1, 1]


def test_autocast_non_recipe_raises():
    for bad in ("delayed", DelayedScaling, 3, object()):
        with pytest.raises(TypeError, match="must be a DelayedScaling, CurrentScaling, BlockScaling"):
            fp8_autocast(fp8_recipe=bad)
        with pytest.raises(TypeError, match="must be a DelayedScaling, CurrentScaling, BlockScaling"):
            fp8mix.autocast(recipe=bad)


def test_autocast_decorator_equals_context():
    _, a = make_pair(48, 40, seed=10)
    b = copy.deepcopy(a)
    x = torch.randn(6, 48)

    @fp8_autocast(fp8_recipe=CurrentScaling())
    def run(m, x):
        assert fp8mix.is_fp8_enabled()
        return m(x)

    ya = run(a, x)
    assert not fp8mix.is_fp8_enabled()
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        yb = b(x)
    assert torch.equal(ya, yb)
    assert not torch.equal(ya, F.linear(x, a.weight, a.bias))
    # the decorated function is reusable, also recursively
    assert torch.equal(run(a, x), ya)

    @fp8mix.autocast(enabled=False)
    def off(m, x):
        return m(x)

    assert torch.equal(off(a, x), F.linear(x, a.weight, a.bias))


def test_autocast_te_spelling_equivalent():
    _, a = make_pair(64, 48, seed=11)
    b = copy.deepcopy(a)
    for step in range(3):
        x = torch.randn(5, 64) * (step + 1)
        g = torch.randn(5, 48)
        with fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(amax_history_len=4), fp8_group=None):
            ya = a(x)
        with fp8mix.autocast(enabled=True, recipe=DelayedScaling(amax_history_len=4), amax_reduction_group=None):
            yb = b(x)
        ya.backward(g)
        yb.backward(g)
        assert torch.equal(ya, yb)
    assert torch.equal(a.weight.grad, b.weight.grad)
    for k in ("fp8_amax_history", "fp8_scale", "fp8_steps"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k


def test_autocast_nesting_innermost_wins():
    _, lin = make_pair(64, 48, seed=12)
    x = torch.randn(8, 64)
    plain = F.linear(x, lin.weight, lin.bias)
    with fp8_autocast(fp8_recipe=DelayedScaling()):
        with fp8_autocast(fp8_recipe=CurrentScaling()):
            y_cur = lin(x)
        assert lin.fp8_steps.tolist() == [0, 0, 0], "inner CurrentScaling must not record delayed state"
        with fp8_autocast(enabled=False):
            assert not fp8mix.is_fp8_enabled()
            y_off = lin(x)
            with fp8_autocast(fp8_recipe=BlockScaling()):
                y_blk = lin(x)
            assert not fp8mix.is_fp8_enabled()
        assert fp8mix.is_fp8_enabled()
        y_del = lin(x)
    assert not fp8mix.is_fp8_enabled()
    assert torch.equal(y_off, plain)
    assert lin.fp8_steps.tolist()[:2] == [1, 1]
    twin = copy.deepcopy(lin)
    with fp8_autocast(fp8_recipe=CurrentScaling()):
        assert torch.equal(y_cur, twin(x))
    with fp8_autocast(fp8_recipe=BlockScaling()):
        assert torch.equal(y_blk, twin(x))
    for y in (y_cur, y_blk, y_del):
        assert not torch.equal(y, plain) and sqnr_db(plain, y) >= 25
    # an exception inside unwinds the stack
    with pytest.raises(ZeroDivisionError):
        with fp8_autocast():
            1 / 0
    assert not fp8mix.is_fp8_enabled()


@pytest.mark.parametrize("recipe", RECIPE_IDS)
@pytest.mark.parametrize("bwd_ctx", ["outside", "disabled", "other_recipe"])
def test_backward_uses_forward_recipe(recipe, bwd_ctx):
    _, a = make_pair(64, 48, seed=13)
    b = copy.deepcopy(a)
    torch.manual_seed(14)
    x0, g = torch.randn(8, 64), torch.randn(8, 48)
    xa, xb = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        ya = a(xa)
        ya.backward(g)          # backward inside the forward's context
        yb = b(xb)
    other = BlockScaling() if recipe != "block" else DelayedScaling()
    if bwd_ctx == "outside":
        yb.backward(g)
    elif bwd_ctx == "disabled":
        with fp8_autocast(enabled=False):
            yb.backward(g)
    else:
        with fp8_autocast(fp8_recipe=other):
            yb.backward(g)
    assert torch.equal(ya, yb)
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(a.weight.grad, b.weight.grad)
    assert torch.equal(a.bias.grad, b.bias.grad)
    for k in ("fp8_amax_history", "fp8_scale", "fp8_steps"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k


@pytest.mark.parametrize("recipe", RECIPE_IDS)
def test_module_used_several_times_in_one_context(recipe):
    ref, lin = make_pair(48, 48, seed=15)
    torch.manual_seed(16)
    # same magnitudes: delayed scaling saturates by design when a use's amax jumps
    xs = [torch.randn(6, 48) for _ in range(3)]
    g = torch.randn(6, 48)
    with fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = sum(lin(x) for x in xs)
        z = lin(lin(xs[0]))           # used twice in a chain, too
    (y * g).sum().backward()
    z.sum().backward()
    yr = sum(ref(x) for x in xs)
    (yr * g).sum().backward()
    ref(ref(xs[0])).sum().backward()
    assert sqnr_db(yr, y) >= 25
    assert sqnr_db(ref.weight.grad, lin.weight.grad) >= 18
    # (how the grad_output history rolls for several backward uses: test_recipe.py)
