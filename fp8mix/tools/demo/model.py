"""The demo's model: a small byte-level GPT, its learning-rate schedule and its evaluation.

Public (benchmarks train it too). The GPT (vocab 256): token + position embeddings,
pre-LayerNorm blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and
an untied output head, GPT-2 initialisation. In FP8 runs every nn.Linear (qkv,
attention projection, both MLP layers, head) becomes an fp8mix.Linear; embeddings,
LayerNorms, attention scores, softmax and the loss stay in float32.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import batch
from .variants import precision_context

__all__ = ["Block", "GPT", "lr_at", "evaluate"]


class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small byte-level GPT: logits (B, T, 256) for input bytes (B, T)."""

    def __init__(self, layers: int, d_model: int, heads: int, seq_len: int, vocab: int = 256):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        for name, p in self.named_parameters():  # GPT-2 initialisation
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay towards 0 (the runs end near a minimum, so their
    final losses compare endpoints rather than points on a steep slope)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * t))


@torch.no_grad()
def evaluate(model: nn.Module, name: str, device, val: torch.Tensor, val_starts: torch.Tensor,
             seq_len: int) -> float:
    """Mean validation loss over the fixed validation batches, in run `name`'s precision."""
    model.eval()
    losses = []
    for starts in val_starts:
        x, y = batch(val, starts, seq_len, device)
        with precision_context(name, device):
            logits = model(x)
        losses.append(float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))))
    model.train()
    return sum(losses) / len(losses)
