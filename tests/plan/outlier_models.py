"""Models for the planner's outlier tests: an MLP whose fc2 sees planted outlier channels.

``PlantChannels`` multiplies some input channels of a Linear by k (a power of two) and divides
the same weight columns by k at construction: the float32 function is bit for bit the
plain one (power-of-two products are exact), only the input's channel structure changes --
the activation outliers of trained LLMs, whose outlier channels meet small weights.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from plan_models import MLP


class PlantChannels(nn.Module):
    def __init__(self, lin: nn.Linear, channels, k: float):
        super().__init__()
        self.lin, self.channels, self.k = lin, list(channels), float(k)
        with torch.no_grad():
            lin.weight[:, self.channels] /= self.k

    def forward(self, x):
        x = x.clone()
        x[..., self.channels] *= self.k
        return self.lin(x)


class OutlierMLP(MLP):
    """plan_models.MLP(planted=False) (64 -> 128 -> 128 -> 128 -> 10) whose fc2 input has
    `channels` scaled by k."""

    def __init__(self, k: float = 1.0, channels=(0, 1, 2, 3)):
        super().__init__(planted=False)
        self.fc2 = PlantChannels(self.fc2, channels, k)


class AppendOutlier(nn.Module):
    """`lin` (in_features K) behind one extra *last* input channel of k x rms(input) in every
    row, meeting a zero weight column: the function is lin's. With K = 160 the outlier sits
    alone in its 1x32 MX block but shares its 1x128 tile with 32 real channels."""

    def __init__(self, lin: nn.Linear, k: float):
        super().__init__()
        self.lin = nn.Linear(lin.in_features + 1, lin.out_features)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.weight[:, :-1] = lin.weight
            self.lin.bias.copy_(lin.bias)
        self.k = k

    def forward(self, x):
        rms = x.detach().pow(2).mean().sqrt()
        return self.lin(torch.cat([x, (self.k * rms).expand(*x.shape[:-1], 1)], -1))


class WideOutlierMLP(nn.Module):
    """64 -> 160 -> 128 -> 10 with fc2 behind AppendOutlier."""

    def __init__(self, k: float):
        super().__init__()
        self.fc1 = nn.Linear(64, 160)
        self.fc2 = AppendOutlier(nn.Linear(160, 128), k)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


class SensitiveWeightMLP(OutlierMLP):
    """OutlierMLP(1) whose fc2 has weight columns 0, 1 multiplied by 2^20 and the input
    channels 0, 1 divided by 2^20 (the same function): outliers in the weight, tiny input
    channels."""

    def __init__(self):
        super().__init__(k=2.0 ** -20, channels=(0, 1))


class Conv1DOutlierMLP(nn.Module):
    """64 -> 128 (Linear) -> 48 (Hugging Face Conv1D, weight (in, out)) -> 10; the Conv1D's
    input channels 0-3 multiplied by k and the same weight rows divided by k."""

    def __init__(self, k: float):
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.conv = Conv1D(48, 128)
        nn.init.normal_(self.conv.weight, std=0.1)
        with torch.no_grad():
            self.conv.weight[:4] /= k
        self.k = k
        self.head = nn.Linear(48, 10)

    def forward(self, x):
        h = F.relu(self.fc1(x)).clone()
        h[..., :4] *= self.k
        return self.head(F.relu(self.conv(h)))
