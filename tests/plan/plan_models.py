"""Small models for the planner's tests: an MLP with a planted sensitive layer.

``ChannelOutlier`` gives its Linear one extra input channel (index 0) holding ``k`` times the
rms of the real input in *every* row, with a weight column of 0 that stays 0 (its gradient
is masked), so the float32 function is unchanged; any FP8 cast of the input that fits the
outlier into range pushes the real channels down by ``k``. With k = 1e10 (33 binades) that
flushes them under E4M3 and E5M2, per tensor and in 1x128 tiles (the whole row is one tile
for up to 127 real channels): the layer is sensitive under every candidate recipe.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

PLANTED_K = 1e10


class ChannelOutlier(nn.Module):
    def __init__(self, lin: nn.Linear, k: float = PLANTED_K):
        super().__init__()
        self.lin = nn.Linear(lin.in_features + 1, lin.out_features, bias=lin.bias is not None)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.weight[:, 1:] = lin.weight
            if lin.bias is not None:
                self.lin.bias.copy_(lin.bias)
        mask = torch.ones_like(self.lin.weight)
        mask[:, 0] = 0
        self.lin.weight.register_hook(lambda g: g * mask)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = x.detach().float().pow(2).mean().sqrt()
        extra = (self.k * rms).to(x.dtype).expand(*x.shape[:-1], 1)
        return self.lin(torch.cat([extra, x], -1))


class MLP(nn.Module):
    """64 -> 128 -> 128 -> 128 -> 10 (ReLU); `planted` wraps fc2 in a ChannelOutlier."""

    def __init__(self, planted: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        fc2 = nn.Linear(128, 128)
        self.fc2 = ChannelOutlier(fc2) if planted else fc2
        self.fc3 = nn.Linear(128, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return self.head(x)


def batches(n: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(n)]


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


class Spiky(nn.Module):
    """Multiplies the input of `lin` by `factor` and divides the output by it (bias kept):
    the float32 function is the same (exactly, for a power of two and no bias), while the
    FP8 casts see the input's amax jump by `factor` -- the injected fault of the guard tests."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.lin = lin
        self.factor = 1.0

    def forward(self, x):
        f = self.factor
        if f == 1.0:
            return self.lin(x)
        y = self.lin(x * f)
        if self.lin.bias is not None:
            y = y + (f - 1.0) * self.lin.bias
        return y / f


class SpikyMLP(nn.Module):
    """64 -> 128 -> 128 -> 128 -> 10 with fc2 wrapped in Spiky."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = Spiky(nn.Linear(128, 128))
        self.fc3 = nn.Linear(128, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return self.head(x)


def planted_mlp() -> MLP:
    """Factory for the CLI tests (``plan_models:planted_mlp``)."""
    torch.manual_seed(0)
    return MLP(planted=True)


def mse_loss(model, inputs):
    """A --loss function of the CLI tests: the output against zeros."""
    return F.mse_loss(model(*inputs), torch.zeros(inputs[0].shape[0], 10))
