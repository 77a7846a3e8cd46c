"""Checks shared by the recipe tests: an FP8 layer and its float64 twin, their SQNR, a small
two-block net, and the "bit-identical to eager" comparisons for activation checkpointing and
torch.compile (aot_eager)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
from helpers import sqnr_db
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import fp8mix
from fp8mix import fp8_autocast


def float64_pair(k=96, n=40, seed=0, conv=False):
    """An FP8 layer (fp8mix.Linear, or fp8mix.nn.Conv1D with conv=True) of k inputs and n
    outputs, and its float64 nn.Linear twin with the same weight and bias."""
    torch.manual_seed(seed)
    lin = fp8mix.nn.Conv1D(n, k) if conv else fp8mix.Linear(k, n)
    ref = nn.Linear(k, n).double()
    with torch.no_grad():
        ref.weight.copy_(lin.weight.t() if conv else lin.weight)
        ref.bias.copy_(lin.bias)
    return lin, ref


def sqnr_vs_float64(lin, ref, x: torch.Tensor, recipe, *, conv: bool):
    """(forward, dgrad, wgrad) SQNR in dB of the FP8 layer `lin` under `recipe` against its
    float64 nn.Linear twin `ref` (a Conv1D's weight is compared transposed), for input x
    and a random dy."""
    x = x.clone().requires_grad_()
    xr = x.detach().double().requires_grad_()
    with fp8_autocast(fp8_recipe=recipe):
        y = lin(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    yr = ref(xr)
    yr.backward(dy.double())
    wg = lin.weight.grad.t() if conv else lin.weight.grad
    return sqnr_db(yr, y), sqnr_db(xr.grad, x.grad), sqnr_db(ref.weight.grad, wg)


class Net(nn.Module):
    """fc1 -> gelu -> fc2 (+ residual), optionally checkpointed, then a head."""

    def __init__(self, d=64, mode=None):
        super().__init__()
        self.fc1, self.fc2, self.head = fp8mix.Linear(d, 2 * d), fp8mix.Linear(2 * d, d), fp8mix.Linear(d, 16)
        self.mode = mode

    def _block(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    def forward(self, x):
        if self.mode is None:
            x = self._block(x)
        else:
            x = torch_checkpoint(self._block, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


def _train(model, recipe, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(steps):
        x = (torch.randn(24, 64, generator=g) * (1 + i)).requires_grad_()
        with fp8_autocast(fp8_recipe=recipe):
            loss = model(x).square().mean()
        loss.backward()
        out.append((loss.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
        opt.zero_grad()
    return out


def check_checkpointing_bit_identical(recipe, mode: str) -> None:
    """Three SGD steps of Net with its block checkpointed equal the plain steps bit for bit."""
    torch.manual_seed(1)
    plain = Net()
    ckpt = copy.deepcopy(plain)
    ckpt.mode = mode
    for i, (a, b) in enumerate(zip(_train(plain, recipe), _train(ckpt, recipe))):
        assert torch.equal(a[0], b[0]), f"step {i}: loss"
        assert torch.equal(a[1], b[1]), f"step {i}: input gradient"
        for k, (ga, gb) in enumerate(zip(a[2], b[2])):
            assert torch.equal(ga, gb), f"step {i}: gradient of parameter {k}"


def check_compile_bit_identical(recipe) -> None:
    """torch.compile(fullgraph=True, backend="aot_eager") of Net equals eager bit for bit."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    eager = Net()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for step in range(2):
        x = torch.randn(16, 64) * (1 + step)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        with fp8_autocast(fp8_recipe=recipe):
            yc = compiled(xc)
            ye = eager(xe)
        g = torch.randn_like(ye)
        yc.backward(g)
        ye.backward(g)
        assert torch.equal(yc, ye), f"step {step}: output"
        assert torch.equal(xc.grad, xe.grad), f"step {step}: input gradient"
        for (n, pc), pe in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(pc.grad, pe.grad), f"step {step}: gradient of {n}"
            pc.grad = pe.grad = None
