"""Activation checkpointing of fp8mix modules: the recomputed forward repeats the
original forward's FP8 decisions (formats, scales, random streams) and records nothing.

Both modes of ``torch.utils.checkpoint`` recompute a forward during backward:

* ``use_reentrant=False`` (what Hugging Face's ``gradient_checkpointing_enable`` uses):
  the original forward runs with grad enabled under checkpoint's saved-tensor hooks,
  records its amaxes as any training forward and leaves a *replay plan* (the scales
  and streams it used) with the module; the recompute, which runs inside a backward
  pass, takes that plan instead of reading the (since updated) state and records
  nothing. The recomputed tensors then equal the original ones bit for bit.
* ``use_reentrant=True``: the original forward runs under ``torch.no_grad()``, which
  fp8mix treats as a read-only forward (it records nothing and remembers its
  fp8_autocast frame); the recompute inside backward finds no replay plan and is the
  step's one recording forward, with the frame of the original forward even when
  backward runs outside fp8_autocast.

Plans are matched to recomputes per module in call order (first in, first out), as
Transformer Engine does; ``fp8mix.checkpoint`` passes a context to torch's checkpoint
that matches them exactly per checkpointed call, for unusual orders (a module shared
by several checkpointed regions whose recomputes run in reverse order).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Any, Callable, Optional

import torch

__all__ = ["checkpoint", "in_recompute", "under_saved_tensor_hooks", "ReplayQueue"]


class _Local(threading.local):
    def __init__(self):
        self.region: list = []       # ids of fp8mix.checkpoint regions whose forward is running
        self.recompute: list = []    # ids of fp8mix.checkpoint regions being recomputed


_local = _Local()
_region_ids = itertools.count(1)


def in_recompute(*, eager: "bool | None" = None) -> bool:
    """Whether a forward runs inside a backward pass (a checkpoint's recomputation).
    eager: the caller's torch.compiler.is_compiling() answer (negated), when it has one."""
    if not (eager if eager is not None else not torch.compiler.is_compiling()):
        return False
    return bool(_local.recompute) or torch._C._current_graph_task_id() != -1


def under_saved_tensor_hooks(*, eager: "bool | None" = None) -> bool:
    """Whether saved-tensor hooks (non-reentrant checkpoint, offloading) are active, i.e.
    this forward's saved tensors may be recomputed later. eager: as in_recompute."""
    if not (eager if eager is not None else not torch.compiler.is_compiling()):
        return False
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def current_region() -> int:
    """The innermost fp8mix.checkpoint region of this forward or recompute (0: none)."""
    if _local.recompute:
        return _local.recompute[-1]
    return _local.region[-1] if _local.region else 0


class ReplayQueue:
    """A module's replay plans, oldest first. Plans are held weakly: a plan lives as long
    as the autograd graph of its forward (the graph's node keeps it), so plans of
    abandoned graphs disappear on their own."""

    def __init__(self):
        self._refs: list = []

    def push(self, plan: Any) -> None:
        plan.region = current_region()
        plan.replayed_by = set()
        plan.backward_done = False
        self._refs.append(weakref.ref(plan))

    def take(self) -> Optional[Any]:
        """The plan the running recompute repeats: within the same fp8mix.checkpoint region
        when there is one; the oldest whose backward has not run and that this backward pass
        has not replayed yet; else the oldest not replayed by it (a second backward through
        a retained graph). None: no plan (a reentrant recompute)."""
        live = [p for p in (r() for r in self._refs) if p is not None]
        self._refs = [weakref.ref(p) for p in live]
        gid = torch._C._current_graph_task_id()
        region = current_region()
        if region:
            live = [p for p in live if p.region == region]
        for want_undone in (True, False):
            for p in live:
                if gid not in p.replayed_by and (not want_undone or not p.backward_done):
                    p.replayed_by.add(gid)
                    return p
        return None

    def __len__(self) -> int:
        return sum(r() is not None for r in self._refs)


def _region_contexts(region: int):
    @contextlib.contextmanager
    def forward_ctx():
        _local.region.append(region)
        try:
            yield
        finally:
            _local.region.pop()

    @contextlib.contextmanager
    def recompute_ctx():
        _local.recompute.append(region)
        try:
            yield
        finally:
            _local.recompute.pop()

    return forward_ctx(), recompute_ctx()


def checkpoint(function: Callable, *args, use_reentrant: bool = False, **kwargs):
    """``torch.utils.checkpoint.checkpoint`` for models with fp8mix modules (Transformer
    Engine's ``te.checkpoint`` spelling). Plain ``torch.utils.checkpoint`` is right on its
    own (see this module's docstring); this wrapper also matches each recompute to its
    own forward when a module appears in several checkpointed regions.

    Non-reentrant only (``use_reentrant=False``, torch's recommended mode): its
    ``context_fn`` is how the recompute is told apart; ``context_fn`` of your own is not
    combined with it (TypeError)."""
    if use_reentrant:
        raise ValueError("fp8mix.checkpoint supports use_reentrant=False only; plain torch.utils.checkpoint "
                         "with use_reentrant=True works with fp8mix modules as well")
    if "context_fn" in kwargs:
        raise TypeError("fp8mix.checkpoint sets context_fn itself; use torch.utils.checkpoint.checkpoint to pass "
                        "your own")
    region = next(_region_ids)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False,
                                             context_fn=lambda: _region_contexts(region), **kwargs)
