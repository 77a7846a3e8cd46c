"""Byte-level text for the examples, with no download: the running interpreter's own
standard-library sources (the top-level ``*.py`` files, sorted), or any text file.

    from byte_corpus import load, split, windows
    train, val = split(load(path=None, max_bytes=1 << 20))
    x, y = windows(train, batch_size=16, seq_len=64, generator=g)   # y is x shifted by one byte

Imported by the example scripts beside it (``python examples/<script>.py`` puts this
folder on sys.path). Tokens are bytes, so the vocabulary is 256.
"""
from __future__ import annotations

import os
import sysconfig
from typing import Optional

import torch

VOCAB = 256


def load(path: Optional[str] = None, max_bytes: int = 1 << 20) -> torch.Tensor:
    """Up to `max_bytes` bytes as an int64 tensor: `path`'s, or the stdlib sources'."""
    if path is not None:
        with open(path, "rb") as f:
            raw = f.read(max_bytes)
    else:
        root = sysconfig.get_paths()["stdlib"]
        chunks, size = [], 0
        for name in sorted(os.listdir(root)):
            if name.endswith(".py") and size < max_bytes:
                with open(os.path.join(root, name), "rb") as f:
                    chunks.append(f.read(max_bytes - size))
                size += len(chunks[-1])
        raw = b"".join(chunks)
    if len(raw) < 1024:
        raise ValueError(f"the corpus has {len(raw)} bytes; the examples need at least 1024")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def split(data: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first (1 - val_fraction) of the bytes for training, the rest for validation."""
    cut = int(len(data) * (1 - val_fraction))
    return data[:cut], data[cut:]


def windows(data: torch.Tensor, *, batch_size: int, seq_len: int,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` random windows of `seq_len` bytes (x) and the bytes after each (y)."""
    start = torch.randint(0, len(data) - seq_len - 1, (batch_size, 1), generator=generator)
    idx = start + torch.arange(seq_len + 1)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


class WindowDataset(torch.utils.data.Dataset):
    """Fixed windows (drawn once from `seed`) for the loops that want a Dataset."""

    def __init__(self, data: torch.Tensor, *, count: int, seq_len: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = windows(data, batch_size=count, seq_len=seq_len, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]
