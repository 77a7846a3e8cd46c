"""The FP8 state of one module, shared by every fp8mix module (a mixin before nn.Module).

Buffers (all in ``state_dict()``; a module with G GEMMs has R = 3G tensor roles, GEMM g
owning roles 3g (input), 3g+1 (weight), 3g+2 (grad_output); a Linear has G = 1):

    fp8_amax_history  (C, R) float32  amaxes, row 0 newest; C = max(1024, the recipe's
                                      amax_history_len): one shape for every recipe up to
                                      1024, so torch.distributed.checkpoint loads any
                                      checkpoint into a freshly built model
    fp8_scale         (R,)   float32  the scale the next cast of each role uses
    fp8_steps         (R,)   int64    amaxes recorded per role (0: never used)
    fp8_grad_pending  (G, K) float32  gradient amaxes backward passes left for the next
                                      forward to record (-1: empty slot); K = 8
    fp8_grad_slot     (G,)   int64    the slot the next forward hands its backward
    fp8_rng           (2,)   int64    stochastic rounding: Philox key, next offset
    fp8_auto          (R, 5) int64    Format.AUTO's state per role (fp8mix.auto_format)
    fp8_version       ()     int64    the layout of this state (FP8_STATE_VERSION): a checkpoint
                                      without it is version 1 (loads), a newer one is refused

When the history rolls (DelayedScaling): every *training* forward (grad enabled and
``module.training``; or inside ``fp8_autocast(calibrating=True)``) records the amax of
its input and of the weight it casts, after first recording, oldest first, the
grad_output amaxes of the backward passes since. Several backward passes through one
forward keep the max; more forwards in flight than slots merge (max), none is dropped.
Forwards under ``torch.no_grad()``, ``inference_mode()`` or ``eval()`` read the state and
never write it (Transformer Engine's convention). Why records per use and not per
optimizer step: a use is the one event every layer sees without help from the optimizer,
and each record is one C op on tensors (no host sync, one compiled graph).

Device and dtype moves (``.to(torch.bfloat16)``, ``.half()``, ``.double()``) move the FP8
state but keep its dtypes (float32 / int64): scales never lose precision. A module built
on the meta device and materialised with ``to_empty()`` starts a fresh FP8 state, equal
to a module built normally, as does ``reset_parameters()``. A checkpoint of a plain
``nn.Linear`` loads with ``strict=True`` (the FP8 state starts fresh); checkpoints from
earlier fp8mix versions (shorter histories, no pending/rng/auto/version buffers) load too;
one written by a newer fp8mix (a higher fp8_version) raises a ValueError naming the module
and both versions, instead of loading state this version would misread. The version is a
buffer, so it travels with the state through torch.distributed.checkpoint too.
"""
from __future__ import annotations

import contextvars
import itertools
import logging
from typing import TYPE_CHECKING, Callable, Optional

import torch

from .. import auto_format
from ..formats import Format
from ..recipe import ROLES, role_format
from .recompute import ReplayQueue

__all__ = ["FP8StateMixin", "HISTORY_CAPACITY", "GRAD_SLOTS", "FP8_STATE_KEYS", "FP8_STATE_VERSION"]

log = logging.getLogger("fp8mix")

HISTORY_CAPACITY = 1024
GRAD_SLOTS = 8
_CORE_KEYS = ("fp8_amax_history", "fp8_scale", "fp8_steps")
_OPTIONAL_KEYS = ("fp8_grad_pending", "fp8_grad_slot", "fp8_rng", "fp8_auto", "fp8_version")  # newer than some
# checkpoints
FP8_STATE_VERSION = 2  # 1: every checkpoint before the version buffer; 2: + fp8_version
FP8_STATE_KEYS = _CORE_KEYS + _OPTIONAL_KEYS

# Called with every fp8mix module at the end of its construction (its weights initialised,
# its FP8 state registered), in the context that set it: fp8mix.nn.fp8_weight_init's
# fp8_model_init (per thread and asyncio task, as a ContextVar is).
ON_BUILT: contextvars.ContextVar[Optional[Callable]] = contextvars.ContextVar("fp8mix_on_built", default=None)

# Stochastic-rounding keys: derived from torch's initial seed and the order modules are
# built in, so they consume nothing of torch's generator (a model inits as nn.Linear
# would) and a seeded script gets the same keys every run.
_keys = itertools.count(1)


def _splitmix64(v: int) -> int:
    v = (v + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (v ^ (v >> 31)) & 0x3FFFFFFFFFFFFFFF or 1  # int64-positive, never 0


def _auto_initial(roles: int) -> list:
    """Format.AUTO's starting state per role: HYBRID's assignment, nothing counted."""
    return [auto_format.initial_state(role_format(Format.HYBRID, ROLES[r % 3])) for r in range(roles)]


if TYPE_CHECKING:  # the mixin sits before an nn.Module in every fp8mix module's bases
    _Module = torch.nn.Module
else:
    _Module = object


class FP8StateMixin(_Module):
    """Buffers, resets, dtype/device moves, checkpoint loading and the Python-side
    companions (weight cache, replay plans, Format.AUTO mirrors) of a module's FP8 state.
    Put it before the torch module class: ``class Linear(FP8StateMixin, nn.Linear)``."""

    fp8_gemms = 1  # GEMMs of the module; its FP8 state has 3 roles per GEMM
    # Per-module policy (a precision plan sets these): fp8_enabled=False keeps the module in
    # high precision inside fp8_autocast; fp8_recipe, when set, replaces the autocast's recipe.
    fp8_enabled = True
    fp8_recipe = None
    fp8_amax_history: torch.Tensor
    fp8_scale: torch.Tensor
    fp8_steps: torch.Tensor
    fp8_grad_pending: torch.Tensor
    fp8_grad_slot: torch.Tensor
    fp8_rng: torch.Tensor
    fp8_auto: torch.Tensor
    fp8_version: torch.Tensor

    # ---- construction ------------------------------------------------------------------
    @property
    def fp8_roles(self) -> int:
        return 3 * self.fp8_gemms

    def _init_fp8_state(self, device=None) -> None:
        R, G = self.fp8_roles, self.fp8_gemms
        self._fp8_key = _splitmix64(torch.initial_seed() * 0x100000001B3 + next(_keys))
        self.register_buffer("fp8_amax_history", torch.zeros(HISTORY_CAPACITY, R, device=device))
        self.register_buffer("fp8_scale", torch.ones(R, device=device))
        self.register_buffer("fp8_steps", torch.zeros(R, dtype=torch.int64, device=device))
        self.register_buffer("fp8_grad_pending", torch.full((G, GRAD_SLOTS), -1.0, device=device))
        self.register_buffer("fp8_grad_slot", torch.zeros(G, dtype=torch.int64, device=device))
        self.register_buffer("fp8_rng", torch.tensor([self._fp8_key, 0], dtype=torch.int64, device=device))
        self.register_buffer("fp8_auto", torch.tensor(_auto_initial(R), dtype=torch.int64, device=device))
        self.register_buffer("fp8_version", torch.tensor(FP8_STATE_VERSION, dtype=torch.int64, device=device))
        self._reset_python_state()
        self._fp8_absent: list = []
        self._fp8_hooks = [self.register_load_state_dict_post_hook(_after_load),
                           self._register_state_dict_hook(_before_save)]
        built = ON_BUILT.get()
        if built is not None:
            built(self)

    def _reset_python_state(self) -> None:
        G = self.fp8_gemms
        self._wcache = [None] * G    # per GEMM (key, wq, wqt, w_sinv): is_first_microbatch=True's FP8 weight
        self._replay = [ReplayQueue() for _ in range(G)]  # plans of checkpointed forwards, for their recompute
        self._nograd_frame = None    # the fp8_autocast frame of the last read-only forward
        self._auto_state = _auto_initial(self.fp8_roles)
        self._auto_reasons: dict = {}
        # Python mirror of "steps == 0" for the distributed path only, which must
        # all-reduce a first use's amax before casting; it never guards a compiled graph
        # in single-process training.
        self._maybe_fresh = [True] * self.fp8_roles

    def reset_fp8_state(self) -> None:
        """Forget amax histories, scales, pending gradient amaxes, the stochastic-rounding
        offset, Format.AUTO's decisions and the cached FP8 weight."""
        with torch.no_grad():
            self.fp8_amax_history.zero_()
            self.fp8_scale.fill_(1.0)
            self.fp8_steps.zero_()
            self._reset_optional_state()
        self._reset_python_state()

    def _reset_optional_state(self, keys=_OPTIONAL_KEYS) -> None:
        """Fresh values for the buffers `keys` (of _OPTIONAL_KEYS: those a checkpoint may lack)."""
        with torch.no_grad():
            if "fp8_grad_pending" in keys:
                self.fp8_grad_pending.fill_(-1.0)
            if "fp8_grad_slot" in keys:
                self.fp8_grad_slot.zero_()
            if "fp8_rng" in keys:
                self.fp8_rng.copy_(torch.tensor([self._fp8_key, 0], dtype=torch.int64))
            if "fp8_auto" in keys:
                self.fp8_auto.copy_(torch.tensor(_auto_initial(self.fp8_roles), dtype=torch.int64))
            if "fp8_version" in keys:
                self.fp8_version.fill_(FP8_STATE_VERSION)
        if "fp8_auto" in keys:
            self._auto_state = _auto_initial(self.fp8_roles)
            self._auto_reasons = {}

    def _ensure_history(self, length: int) -> None:
        """Grow the history buffer for a recipe longer than it (rows kept, new rows empty)."""
        # from _buffers, not through nn.Module.__getattr__: this runs every forward (always registered)
        h: torch.Tensor = self._buffers["fp8_amax_history"]  # type: ignore[assignment]
        if length <= h.shape[0]:
            return
        new = torch.zeros(length, h.shape[1], dtype=h.dtype, device=h.device)
        new[: h.shape[0]] = h
        self.fp8_amax_history = new

    # ---- dtype / device moves ------------------------------------------------------------
    def _apply(self, fn, recurse=True):
        # nn.Module._apply would cast the FP8 buffers with the parameters (model.half()
        # turning scales into float16): move them without changing their dtype.
        held = {k: self._buffers.pop(k) for k in FP8_STATE_KEYS if self._buffers.get(k) is not None}
        try:
            out = super()._apply(fn, recurse)  # type: ignore[misc]
        finally:
            was_meta = any(t.is_meta for t in held.values())
            for k, t in held.items():
                moved = fn(t)
                if moved.dtype != t.dtype:
                    moved = t.to(device=moved.device)
                self._buffers[k] = moved
        if was_meta and not self.fp8_scale.is_meta:  # materialised (to_empty): the bytes are garbage
            self.reset_fp8_state()
        self._wcache = [None] * self.fp8_gemms
        return out

    def reset_parameters(self) -> None:
        super().reset_parameters()  # type: ignore[misc]
        if "fp8_scale" in getattr(self, "_buffers", {}):  # not during nn.Linear.__init__
            self.reset_fp8_state()

    # ---- checkpoints -------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "fp8_amax_history"
        src = state_dict.get(key)
        have = self.fp8_amax_history
        if isinstance(src, torch.Tensor) and src.dim() == 2 and src.shape[1] == have.shape[1] \
                and src.shape[0] != have.shape[0]:
            # a history of another capacity (older fp8mix saved the recipe's length): rows
            # beyond the saved ones are empty, and a longer history grows the buffer
            rows = max(src.shape[0], HISTORY_CAPACITY)
            if rows != have.shape[0]:
                self.fp8_amax_history = torch.zeros(rows, have.shape[1], device=have.device)
            padded = torch.zeros(rows, have.shape[1], dtype=src.dtype, device=src.device)
            padded[: src.shape[0]] = src
            state_dict[key] = padded
        _check_version(state_dict.get(prefix + "fp8_version"), prefix, type(self).__name__)
        self._fp8_absent = [prefix + k for k in FP8_STATE_KEYS if prefix + k not in state_dict]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,  # type: ignore[misc]
                                      missing_keys, unexpected_keys, error_msgs)

    # ---- per-role format (Format.AUTO) -------------------------------------------------
    def _fmt(self, recipe, role: int) -> Format:
        """The encoding of state role `role` (3g + input/weight/grad_output) under recipe."""
        if recipe.fp8_format is Format.AUTO:
            return auto_format.current(self._auto_state[role])
        return recipe.format(ROLES[role % 3])

    def fp8_role_name(self, role: int) -> str:
        """"input", "weight", "grad_output"; "fc2.input"... for modules with several GEMMs."""
        return ROLES[role % 3] if self.fp8_gemms == 1 else f"fc{role // 3 + 1}.{ROLES[role % 3]}"

    def fp8_format_report(self) -> dict:
        """Format.AUTO's current choice per tensor role, with the reason of the last
        evaluation that changed or confirmed it: {role: (Format name, reason)}."""
        names = [self.fp8_role_name(i) for i in range(self.fp8_roles)]
        return {r: (auto_format.current(self._auto_state[i]).name, self._auto_reasons.get(r, "not evaluated yet"))
                for i, r in enumerate(names)}

    def _fp8_label(self) -> str:
        return getattr(self, "_fp8_name", None) or f"{type(self).__name__}@{id(self):x}"


def _check_version(v, prefix: str, owner: str) -> None:
    """Refuse FP8 state written by a newer fp8mix (its layout may differ from this one's)."""
    if v is None or (isinstance(v, torch.Tensor) and v.is_meta):
        return  # version 1 (or a plain torch checkpoint): loads; a meta tensor has no value to check
    try:
        n = int(v.reshape(()).item()) if isinstance(v, torch.Tensor) else int(v)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"fp8mix.{owner}: the checkpoint's {prefix}fp8_version is not one integer: {v!r}") from None
    if not 1 <= n <= FP8_STATE_VERSION:
        raise ValueError(f"fp8mix.{owner}: the checkpoint's FP8 state ({prefix}fp8_version) is version {n}; this "
                         f"fp8mix reads versions 1 to {FP8_STATE_VERSION}. Upgrade fp8mix, or load the weights "
                         "without the FP8 state (fp8mix.strip_fp8_state) and start a fresh one")


def _after_load(module, incompatible_keys) -> None:
    """Let a plain nn.Linear checkpoint load with strict=True (all FP8 buffers missing:
    fresh FP8 state), and older fp8mix checkpoints without the newer buffers."""
    absent, module._fp8_absent = module._fp8_absent, []
    missing = incompatible_keys.missing_keys
    core = [k for k in absent if k.endswith(_CORE_KEYS)]
    optional = [k for k in absent if k.endswith(_OPTIONAL_KEYS) and k in missing]
    fresh = bool(core) and len(core) == len(_CORE_KEYS) and all(k in missing for k in core)
    for k in (core if fresh else []) + optional:
        missing.remove(k)
    if fresh:
        module.reset_fp8_state()
    elif optional:  # an older checkpoint: fresh values for the buffers it did not have, its own for the rest
        module._reset_optional_state(tuple(k.rsplit(".", 1)[-1] for k in optional))
    module._reset_python_state()
    module._auto_state = [list(map(int, r)) for r in module.fp8_auto.tolist()]
    module._maybe_fresh = [int(n) == 0 for n in module.fp8_steps.tolist()]


def _before_save(module, state_dict, prefix, local_metadata):
    """state_dict() hook: Format.AUTO's Python mirror into its buffer (same state, no record)."""
    with torch.no_grad():
        module.fp8_auto.copy_(torch.tensor(module._auto_state, dtype=torch.int64))
    return state_dict


def fp8_modules(model: torch.nn.Module) -> list:
    """Every module of `model` that carries fp8mix state."""
    return [m for m in model.modules() if isinstance(m, FP8StateMixin)]

