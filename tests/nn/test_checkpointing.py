"""Activation checkpointing of fp8mix layers (issue #12, item 1).

A checkpointed FP8 model must give the same gradients, bit for bit, as the same steps
without checkpointing, and leave the same FP8 state: for torch.utils.checkpoint in both
modes and fp8mix.checkpoint, backward inside or outside fp8_autocast, every recipe,
stochastic rounding included. The reference is the same model run without checkpointing
(and, for the recipe's numerics, nn.Linear in tests/test_linear.py)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import fp8mix
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": lambda: CurrentScaling(),
    "block": lambda: BlockScaling(),
    "delayed_sr": lambda: DelayedScaling(amax_history_len=4, rounding="stochastic"),
    "current_sr_grad": lambda: CurrentScaling(rounding={"grad": "stochastic"}),
    "block_sr": lambda: BlockScaling(rounding="stochastic"),
}


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = fp8mix.Linear(d, 2 * d), fp8mix.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d=128, mode=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.head = fp8mix.Linear(d, 32)
        self.mode = mode

    def forward(self, x):
        for b in self.blocks:
            if self.mode is None:
                x = b(x)
            elif self.mode == "fp8mix":
                x = fp8mix.checkpoint(b, x)
            else:
                x = torch_checkpoint(b, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


def _run(model, recipe, steps, bwd_inside, seed=0):
    """Train `steps` steps; returns per-step (loss, grads) and the final FP8 state."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(steps):
        x = (torch.randn(48, 128, generator=g) * (1 + i)).requires_grad_()
        ctx = fp8mix.fp8_autocast(fp8_recipe=recipe)
        with ctx:
            loss = model(x).square().mean()
            if bwd_inside:
                loss.backward()
        if not bwd_inside:
            loss.backward()
        out.append((loss.detach().clone(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
        opt.zero_grad()
    state = {k: v.clone() for k, v in model.state_dict().items() if "fp8_" in k}
    return out, state


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant", "fp8mix"])
@pytest.mark.parametrize("bwd_inside", [True, False], ids=["bwd_in", "bwd_out"])
def test_checkpointed_steps_equal_plain_steps(recipe, mode, bwd_inside):
    torch.manual_seed(1)
    plain = Net()
    ckpt = copy.deepcopy(plain)
    ckpt.mode = mode
    steps = 3
    ref, ref_state = _run(plain, RECIPES[recipe](), steps, bwd_inside)
    got, got_state = _run(ckpt, RECIPES[recipe](), steps, bwd_inside)
    for i, ((l0, x0, g0), (l1, x1, g1)) in enumerate(zip(ref, got)):
        assert torch.equal(l0, l1), f"step {i}: loss"
        assert torch.equal(x0, x1), f"step {i}: input gradient"
        for k, (a, b) in enumerate(zip(g0, g1)):
            assert torch.equal(a, b), f"step {i}: gradient of parameter {k}"
    assert ref_state.keys() == got_state.keys()
    for k in ref_state:
        assert torch.equal(ref_state[k], got_state[k]), f"FP8 state {k} differs after checkpointed steps"
    assert any(v.abs().sum() > 0 for k, v in got_state.items() if k.endswith("fp8_amax_history")) \
        or not recipe.startswith("delayed")


def test_recompute_records_nothing_and_reuses_scales():
    """With backward inside fp8_autocast (where the old recompute re-recorded amaxes and
    used the updated scales): one step records each role exactly once."""
    torch.manual_seed(2)
    model = Net(mode="non_reentrant")
    rec = DelayedScaling(amax_history_len=8)
    with fp8mix.fp8_autocast(fp8_recipe=rec):
        model(torch.randn(16, 128).requires_grad_()).sum().backward()
        model(torch.randn(16, 128).requires_grad_()).sum().backward()
    for m in model.modules():
        if isinstance(m, fp8mix.Linear):
            assert m.fp8_steps.tolist() == [2, 2, 1], m.fp8_steps  # the 2nd grad amax is pending


def test_retain_graph_backwards_through_a_checkpoint():
    """Two backward passes through one retained checkpointed graph recompute twice; both
    give the plain model's gradients."""
    torch.manual_seed(3)
    plain = Net()
    ckpt = copy.deepcopy(plain)
    ckpt.mode = "non_reentrant"
    x = torch.randn(16, 128)
    grads = []
    for model in (plain, ckpt):
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
            y = model(x).sum()
        y.backward(retain_graph=True)
        y.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_shared_block_in_two_checkpointed_regions_with_fp8mix_checkpoint():
    """One block applied twice, each application checkpointed: fp8mix.checkpoint matches
    each recompute to its own forward (the second application saw updated scales)."""
    torch.manual_seed(4)

    class Shared(nn.Module):
        def __init__(self, ck):
            super().__init__()
            self.b, self.ck = Block(128), ck

        def forward(self, x):
            for _ in range(2):
                x = fp8mix.checkpoint(self.b, x) if self.ck else self.b(x)
            return x

    plain = Shared(False)
    ckpt = copy.deepcopy(plain)
    ckpt.ck = True
    rec = DelayedScaling(amax_history_len=4)
    out = []
    for model in (plain, ckpt):
        for step in range(2):
            x = torch.randn(16, 128, generator=torch.Generator().manual_seed(step)) * (step + 1)
            with fp8mix.fp8_autocast(fp8_recipe=rec):
                model(x).square().mean().backward()
        out.append(([p.grad.clone() for p in model.parameters()], model.b.fc1.fp8_steps.tolist()))
    for a, b in zip(out[0][0], out[1][0]):
        assert torch.equal(a, b)
    assert out[0][1] == out[1][1]


def test_fp8mix_checkpoint_arguments():
    with pytest.raises(ValueError, match="use_reentrant=False"):
        fp8mix.checkpoint(nn.Identity(), torch.ones(2), use_reentrant=True)
    with pytest.raises(TypeError, match="context_fn"):
        fp8mix.checkpoint(nn.Identity(), torch.ones(2), context_fn=lambda: None)
