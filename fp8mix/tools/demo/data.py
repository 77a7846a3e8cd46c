"""The demo's data: a byte corpus read from disk, its train/validation split, batches.

Public (benchmarks train on it too). The corpus needs no download: by default the running
interpreter's own standard library (``sysconfig.get_paths()["stdlib"]``, every ``*.py``
outside site-packages, sorted by path, read as bytes); a path names any text file or
folder. The last ``VAL_FRACTION`` of the bytes is the validation split. Batches are
windows of ``seq_len + 1`` bytes at start offsets drawn up front from a seeded generator
(``draw_starts``), so every run with the same seed sees the same batches in the same order.

Not here: the model (``model.py``) and the training loop (``train.py``).
"""
from __future__ import annotations

import os
import sys
import sysconfig

import torch

from .._common import UsageError

__all__ = ["VAL_FRACTION", "MAX_CORPUS_BYTES", "load_corpus", "split_corpus", "batch", "draw_starts"]

VAL_FRACTION = 0.10
MAX_CORPUS_BYTES = 256 * 2 ** 20  # reading stops after this much


def _stdlib_files() -> list[str]:
    """The stdlib's *.py files, sorted, without site-packages/dist-packages."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    return sorted(files)


def _folder_files(root: str) -> list[str]:
    """Every regular, non-hidden file under `root`, sorted by path."""
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        files += [os.path.join(d, n) for n in names if not n.startswith(".")]
    return sorted(f for f in files if os.path.isfile(f))


def load_corpus(path: str | None) -> tuple[torch.Tensor, str]:
    """The corpus as a uint8 tensor, and a one-line description of where it came from.
    Folders skip files that look binary (a NUL byte in their first 1 KiB)."""
    if path is None:
        stdlib = sysconfig.get_paths()["stdlib"]
        files, where = _stdlib_files(), f"Python {sys.version.split()[0]} stdlib *.py ({stdlib})"
    elif os.path.isdir(path):
        files, where = _folder_files(path), f"files under {path}"
    elif os.path.isfile(path):
        files, where = [path], path
    else:
        raise UsageError(f"--data {path!r}: no such file or folder")
    chunks, total = [], 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        if len(files) > 1 and b"\0" in b[:1024]:
            continue
        chunks.append(b)
        total += len(b)
        if total >= MAX_CORPUS_BYTES:
            break
    data = b"".join(chunks)
    if not data:
        raise UsageError(f"no readable text in {where}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), f"{where}: {len(chunks)} files, {len(data):,} bytes"


def split_corpus(data: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the last 10% of the bytes is validation; both must hold a sequence."""
    n_val = int(len(data) * VAL_FRACTION)
    train, val = data[: len(data) - n_val], data[len(data) - n_val:]
    if len(val) < seq_len + 2 or len(train) < seq_len + 2:
        raise UsageError(f"corpus of {len(data)} bytes is too small for --seq-len {seq_len} "
                         f"(need at least {int((seq_len + 2) / VAL_FRACTION) + 1} bytes)")
    return train, val


def batch(data: torch.Tensor, starts: torch.Tensor, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, (B, seq_len) int64 each, for the given start offsets."""
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    chunk = data[idx].long()
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def draw_starts(train: torch.Tensor, val: torch.Tensor, *, steps: int, batch_size: int, eval_batches: int,
                seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_starts (steps, batch_size), val_starts (eval_batches, batch_size)): batch start
    offsets from a generator seeded with `seed`, training offsets first."""
    gen = torch.Generator().manual_seed(seed)
    train_starts = torch.randint(0, len(train) - seq_len - 1, (steps, batch_size), generator=gen)
    val_starts = torch.randint(0, len(val) - seq_len - 1, (eval_batches, batch_size), generator=gen)
    return train_starts, val_starts
