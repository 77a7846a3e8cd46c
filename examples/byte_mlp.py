"""The small model of the Lightning and Accelerate examples: a byte-level MLP language
model (Bengio et al., 2003): the embeddings of the last `context` bytes, concatenated,
through a residual MLP to the logits of the next byte. Its nn.Linear layers are what
fp8mix converts; nothing here knows about FP8.

    model = ByteMLP(context=16, width=256, depth=3)
    logits = model(x)          # x: (batch, context) int64 bytes -> (batch, 256), the byte after x

With byte_corpus.windows(seq_len=context), the target of x is y[:, -1].
"""
from __future__ import annotations

import torch
import torch.nn as nn
from byte_corpus import VOCAB


class ByteMLP(nn.Module):
    def __init__(self, *, context: int = 16, width: int = 256, depth: int = 3, embed: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, embed)
        self.inp = nn.Linear(context * embed, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Linear(2 * width, width)) for _ in range(depth))
        self.out = nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(self.embed(x).flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)
