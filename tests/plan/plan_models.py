"""Small models for the planner's tests: an MLP with a planted sensitive layer, and one with
a layer whose input can be made to spike.

The fault wrappers are the stability suite's (benchmarks/stability), so the tests and the
evidence inject the same faults:

* ``ChannelOutlier`` (exp10_plan.py) gives a Linear one extra input channel holding k times
  the rms of the real input in *every* row, with a weight column of 0 that stays 0, so the
  float32 function is unchanged; with k = 1e10 (33 binades) every FP8 cast that fits the
  outlier into range flushes the real channels (E4M3 and E5M2, per tensor and in 1x128 tiles:
  the whole row is one tile for up to 127 real channels).
* ``SpikeWrap`` (common.py) multiplies a Linear's input by ``factor`` and divides the output
  back: the same float32 function, an amax jump for the FP8 casts.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "stability"))
from common import SpikeWrap  # noqa: E402
from exp10_plan import ChannelOutlier  # noqa: E402


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


class SpikyMLP(MLP):
    """MLP(planted=False) with fc2 wrapped in SpikeWrap (set ``model.fc2.factor``)."""

    def __init__(self):
        super().__init__(planted=False)
        self.fc2 = SpikeWrap(self.fc2)


def planted_mlp() -> MLP:
    """Factory for the CLI tests (``plan_models:planted_mlp``)."""
    torch.manual_seed(0)
    return MLP(planted=True)


def mse_loss(model, inputs):
    """A --loss function of the CLI tests: the output against zeros."""
    return F.mse_loss(model(*inputs), torch.zeros(inputs[0].shape[0], 10))
