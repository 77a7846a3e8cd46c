"""FP8 weights: a GEMM weight held as FP8 bytes and one scale, and a high-precision weight
that FSDP2 all-gathers in FP8. The two tensor subclasses fp8mix.nn's weight cast
recognises (fp8mix.nn._casts.cast_weight, fp8mix.nn._forward.make_plan), and what moves
them through FSDP2, optimizers and checkpoints.

    FP8Weight           FP8 bytes (the weight's shape) + scale_inv (one float32): the weight
                        of a module built under fp8mix.fp8_model_init, and the weight FSDP2's
                        FP8 all-gather produces. It presents itself as a tensor of its
                        high-precision dtype; the FP8 GEMMs take its bytes as they are.
    FP8AllGatherWeight  a high-precision weight (FSDP2: its local shard) that FSDP2 casts to
                        FP8 before the all-gather (convert_model(fsdp_fp8_all_gather=True)):
                        1 byte per element on the wire instead of 2 or 4.
    WeightScaling       the one rule both follow, and which recipes it serves.

The rule (what the weight role of such a layer follows): current per-tensor scaling of the
whole weight, ``scale = fp8_max / max(amax, amax_epsilon) / 2**margin`` (power_2_scale
rounds it down to a power of two), amax = max |W| over the whole weight: over every FSDP
shard, MAX all-reduced, so every shard is cast with the scale an unsharded weight gets and
the gathered bytes are the bytes CurrentScaling casts the unsharded weight to. Round to
nearest even, saturating, infinities to NaN. Only a recipe whose weight role is exactly
this (CurrentScaling, and any recipe answering as it does: per tensor, not delayed,
nearest rounding, one format) with the same weight format, margin, power_2_scale and
amax_epsilon runs a layer holding such a weight; any other raises before a cast, naming
the module. The input and grad_output roles follow the recipe as usual.

How the FP8 weight flows: FSDP2 calls ``fsdp_pre_all_gather`` on the shard (FP8Weight: its
bytes; FP8AllGatherWeight: the shard cast with the whole weight's scale), all-gathers the
bytes (as uint8: any backend moves them) and calls ``fsdp_post_all_gather``, which makes the
unsharded FP8Weight over the all-gather output; the module's forward hands it to
fp8mix.nn._casts.cast_weight, which returns its bytes and scale as the GEMM operands (no
second cast), and the autograd function keeps those bytes for dgrad, where FSDP2 has
gathered them again before the backward. The weight gradient is a plain tensor of the
presented dtype. Any other op on an FP8Weight (outside fp8_autocast, a layer FP8 leaves in
high precision, ``weight.sum()``) computes on the dequantised weight; in-place ops other
than ``copy_`` and the initialisers (normal_, uniform_, fill_, zero_: their result does not
read the old value; computed in high precision, then cast) raise (an optimizer updating FP8
bytes in place would round every update away): fp8mix.optim.FP8MasterWeights keeps float32
masters and writes the FP8 weights back.

Checkpoints: a module with an FP8 weight ``<name>`` saves ``<name>_fp8`` (the FP8 bytes: a
float8 tensor, a DTensor of them when sharded) and ``<name>_scale_inv`` (float32) in its
place: plain tensors, so torch.save (weights_only) and torch.distributed.checkpoint store
and reshard them, and a load restores both exactly. They are not named ``<name>``: a model
built without FP8 weights then refuses them (load_state_dict: missing / unexpected keys;
torch.distributed.checkpoint: the key is missing) instead of reading FP8 codes as values;
it loads :func:`dequantize_fp8_weights`' copy. A high-precision checkpoint (``<name>``)
loads into an FP8 weight cast by the rule above (sharded: one all-reduce for the amax).
FP8AllGatherWeight saves its high-precision value under ``<name>``, as a plain weight.

Not covered: torch.compile of a module holding these weights; the meta device (build the
module on a real device); tensor parallelism (DTensor weights: fp8mix.distributed's TP files).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree

from .. import ops
from ..formats import Format, Granularity, fp8_dtype

__all__ = ["WeightScaling", "FP8WeightBase", "FP8Weight", "FP8AllGatherWeight", "gemm_weight_names",
           "fp8_weight_of", "to_fp8_weights", "enable_fp8_all_gather", "write_fp8", "global_amaxes",
           "dequantize_fp8_weights", "parameter_bytes", "check_recipe"]

aten = torch.ops.aten
_HP = (torch.float32, torch.bfloat16, torch.float16)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_BYTES_SUFFIX, _SCALE_SUFFIX = "_fp8", "_scale_inv"  # checkpoint entries of an FP8 weight


# ---- the scaling rule ---------------------------------------------------------------------
def _unservable(recipe) -> Optional[str]:
    """Why `recipe`'s weight role is not current per-tensor scaling (None: it is)."""
    if recipe.delayed():
        return "its weight role uses delayed scaling (an amax history)"
    if recipe.along_reduction():
        return "it scales the weight along the reduction dimension (per row or MX block)"
    if recipe.granularity("weight") != Granularity.TENSOR:
        return f"its weight scales are per {recipe.granularity('weight').label}, not per tensor"
    if recipe.fp8_format is Format.AUTO:
        return "Format.AUTO chooses the weight's format per layer at run time"
    if recipe.rounding_of("weight") != "nearest":
        return "it rounds the weight stochastically"
    return None


@dataclasses.dataclass(frozen=True)
class WeightScaling:
    """Current per-tensor scaling of a whole weight (the module docstring's rule): what it
    takes of a recipe (the weight's format, margin, power_2_scale, amax_epsilon)."""

    fp8_dtype: torch.dtype
    margin: int = 0
    power_2_scale: bool = False
    amax_epsilon: float = 0.0

    @classmethod
    def from_recipe(cls, recipe, owner) -> "WeightScaling":
        """The rule of `recipe`'s weight role; ValueError naming `owner` (a str, or a
        callable making one: only called for the message) when it is another."""
        reason = _unservable(recipe)
        if reason is not None:
            who = owner() if callable(owner) else owner
            raise ValueError(f"{who}: an FP8 weight is scaled per tensor from its current amax (CurrentScaling's "
                             f"weight rule); {type(recipe).__name__} cannot serve it: {reason}. Use "
                             "fp8mix.recipe.CurrentScaling (or torchao's tensorwise config)")
        return cls(fp8_dtype(recipe.format("weight")), int(recipe.margin), bool(recipe.power_2_scale),
                   float(getattr(recipe, "amax_epsilon", 0.0)))

    def scales(self, amax: torch.Tensor):
        """(scale, scale_inv) for `amax` (any shape: one scale per element)."""
        return ops.compute_scale(amax, self.fp8_dtype, margin=self.margin, power_2_scale=self.power_2_scale,
                                 amax_epsilon=self.amax_epsilon)

    def cast(self, t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """`t`'s FP8 bytes under `scale` (one element); empty for an empty shard."""
        if t.numel() == 0:
            return torch.empty(t.shape, dtype=self.fp8_dtype, device=t.device)
        q, _, _ = ops.cast(t.contiguous(), scale.reshape(1), self.fp8_dtype, inf_to_nan=True)
        return q


def check_recipe(m, weight: "FP8WeightBase", recipe) -> None:
    """Raise unless `recipe` casts the weight role by `weight`'s rule (make_plan calls this
    for every forward with an FP8 weight, before any cast)."""
    def owner():
        return f"fp8mix.{type(m).__name__} {m._fp8_label()!r}"

    want = WeightScaling.from_recipe(recipe, owner)
    have = weight.scaling
    if want != have:
        diff = ", ".join(f"{f.name} {getattr(have, f.name)!r} (the recipe: {getattr(want, f.name)!r})"
                         for f in dataclasses.fields(have) if getattr(have, f.name) != getattr(want, f.name))
        raise ValueError(f"{owner()}: its FP8 weight was made with {diff}; run it with the recipe it was made for "
                         "(the module's fp8_recipe, set by fp8_model_init / convert_model)")


# ---- the tensor subclasses ------------------------------------------------------------------
class FP8WeightBase(torch.Tensor):
    """What fp8mix.nn's weight cast asks of an FP8 weight (both subclasses answer)."""

    scaling: WeightScaling

    def __tensor_flatten__(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def gemm_operands(self, plan):  # pragma: no cover - abstract
        """(wq, wqt or None, w_sinv) for the plan's GEMMs, as _casts.cast_weight returns them."""
        raise NotImplementedError


def _written_args(func, args, kwargs) -> list:
    """The values of `func`'s arguments that it writes (in-place and out= arguments)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if v is not None:
            out.append(v)
    return out


def _contains(values, cls) -> bool:
    return any(isinstance(v, cls) for v in pytree.tree_leaves(values))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `rows` (FSDP2 all-gathers padded shards)."""
    if t.shape[0] >= rows:
        return t
    pad = torch.zeros((rows - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad]) if t.numel() else pad


def _gathered(all_gather_outputs, metadata, param_dtype, scaling: WeightScaling, out):
    """fsdp_post_all_gather of both subclasses: the unsharded FP8Weight over the output."""
    (raw,) = all_gather_outputs
    sinv, dtype = metadata
    data = raw.view(dtype)
    if out is not None:  # a later all-gather into the same output: only the scale is new
        # (a new tensor, not an in-place write: the autograd graph of the last forward
        # keeps the old one, whose version must not change; the values are equal anyway)
        out._scale_inv = sinv
        return None
    return FP8Weight(data, sinv, dtype=param_dtype, scaling=scaling), (data,)


class FP8Weight(FP8WeightBase):
    """A weight stored as FP8 bytes and one scale_inv, presented as a tensor of `dtype`.

    ``_data`` (float8, the weight's shape) and ``_scale_inv`` (float32, one element) hold the
    value ``_data * _scale_inv``. Views (detach, view, slicing, split, transpose) share both;
    ``.to(dtype)`` changes only the presented dtype. FSDP2 shards it along dim 0 and
    all-gathers the bytes (fsdp_pre/post_all_gather). The module docstring has the rest."""

    _data: torch.Tensor
    _scale_inv: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, *, dtype: torch.dtype, scaling: WeightScaling,
                requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                                   storage_offset=data.storage_offset(), dtype=dtype,
                                                   device=data.device, requires_grad=requires_grad)

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor, *, dtype: torch.dtype, scaling: WeightScaling,
                 requires_grad: bool = False):
        if data.dtype not in _FP8:
            raise TypeError(f"FP8Weight: data must be float8_e4m3fn or float8_e5m2, got {data.dtype}")
        if dtype not in _HP:
            raise TypeError(f"FP8Weight: dtype must be float32, bfloat16 or float16, got {dtype}")
        if scale_inv.dtype != torch.float32 or scale_inv.numel() != 1:
            raise TypeError("FP8Weight: scale_inv must be one float32 value")
        self._data = data
        self._scale_inv = scale_inv
        self.scaling = scaling

    @classmethod
    def quantize(cls, w: torch.Tensor, scaling: WeightScaling, *, dtype: Optional[torch.dtype] = None,
                 requires_grad: bool = False) -> "FP8Weight":
        """`w` (a whole high-precision weight) cast by `scaling`."""
        scale, sinv = scaling.scales(_amax(w))
        return cls(scaling.cast(w.detach(), scale), sinv, dtype=dtype or w.dtype, scaling=scaling,
                   requires_grad=requires_grad)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The value, ``data * scale_inv`` in float32, rounded to `dtype` (default: the presented dtype)."""
        dtype = dtype or self.dtype
        if self._data.numel() == 0:
            return torch.empty(self._data.shape, dtype=dtype, device=self._data.device)
        return ops.dequantize(self._data.contiguous(), self._scale_inv.reshape(()), out_dtype=dtype)

    def get_high_precision_init_val(self) -> Optional[torch.Tensor]:
        """The high-precision value this weight was cast from (fp8_model_init's
        preserve_high_precision_init_val=True; on the CPU), else None."""
        return self.__dict__.get("_hp_init")

    def clear_high_precision_init_val(self) -> None:
        self.__dict__.pop("_hp_init", None)

    def gemm_operands(self, plan):
        wq = self._data.contiguous()
        return wq, (wq.t().contiguous() if plan.tn else None), self._scale_inv.reshape(1)

    def __repr__(self, *, tensor_contents=None):  # (the default would dispatch on the wrapper)
        return (f"FP8Weight(shape={tuple(self.shape)}, dtype={self.dtype}, fp8={self._data.dtype}, "
                f"scale_inv={float(self._scale_inv.reshape(())):.6g})")

    # -- torch protocols ------------------------------------------------------------------
    def __tensor_flatten__(self):
        return ["_data", "_scale_inv"], (self.dtype, self.scaling)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        dtype, scaling = meta
        return FP8Weight(inner["_data"], inner["_scale_inv"], dtype=dtype, scaling=scaling)

    def __reduce_ex__(self, protocol):  # pickle / deepcopy of a module: rebuilt from the parts
        return (_rebuild_fp8_weight, (self._data, self._scale_inv, self.dtype, self.scaling, self.requires_grad))

    # ``weight.data = value`` (PEFT's LoRA merge writes ``weight.data += delta``, which Python
    # runs as ``weight.data = weight.data + delta``): torch's setter swaps the wrapper's
    # storage and leaves _data / _scale_inv as they were, a silent no-op; here it is copy_
    # (a high-precision value cast by the weight's rule, an FP8 weight's bytes and scale)
    @property  # type: ignore[override]
    def data(self):
        return torch.Tensor.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, value):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(self.shape):
            raise ValueError(f"fp8mix: FP8Weight.data = value needs a tensor of shape {tuple(self.shape)}, got "
                             f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
        with torch.no_grad():
            self.copy_(value)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _FP8_OPS.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        if func._schema.is_mutable and _contains(_written_args(func, args, kwargs), FP8Weight):
            raise TypeError(f"fp8mix: {func} would write an FP8 weight in place, rounding the result to FP8 (an "
                            "optimizer step would lose every update smaller than an FP8 step). Train FP8 weights "
                            "with fp8mix.optim.FP8MasterWeights (float32 masters, FP8 written back), or set a new "
                            "value with weight.copy_(high_precision_tensor)")
        args, kwargs = pytree.tree_map_only(FP8Weight, lambda t: t.dequantize(), (args, kwargs))
        return func(*args, **kwargs)

    # -- FSDP2 ----------------------------------------------------------------------------
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """The bytes as they are (one scale for every shard: the writers all-reduce the
        amax), as uint8 so that any backend moves them, padded as FSDP2 pads the shard."""
        rows = -(-outer_size[0] // mesh.size())
        return (_pad_rows(self._data, rows).view(torch.uint8),), (self._scale_inv, self._data.dtype)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        return _gathered(all_gather_outputs, metadata, param_dtype, self.scaling, out)


def _rebuild_fp8_weight(data, scale_inv, dtype, scaling, requires_grad):
    w = FP8Weight(data, scale_inv, dtype=dtype, scaling=scaling)
    return torch.nn.Parameter(w, requires_grad=requires_grad) if requires_grad else w


def _wrap(self: FP8Weight, data: torch.Tensor, scale_inv=None, dtype=None) -> FP8Weight:
    return FP8Weight(data, self._scale_inv if scale_inv is None else scale_inv, dtype=dtype or self.dtype,
                     scaling=self.scaling)


_LIKE = (aten.empty_like.default, aten.zeros_like.default)


def _op_view(func, args, kwargs):
    """Ops on the bytes alone (views, clone): same scale (a clone gets its own copy)."""
    self, rest = args[0], args[1:]
    out = func(self._data, *rest, **kwargs)
    sinv = self._scale_inv.clone() if func is aten.clone.default else None
    if isinstance(out, torch.Tensor):
        return _wrap(self, out, sinv)
    return [_wrap(self, o, sinv) for o in out]


def _op_to_copy(func, args, kwargs):
    """.to(): the device moves the bytes; a dtype changes the presented dtype only."""
    self = args[0]
    dtype = kwargs.get("dtype") or self.dtype
    if dtype not in _HP:
        return func(self.dequantize(), **kwargs)
    rest = {k: v for k, v in kwargs.items() if k != "dtype"}
    data = func(self._data, **rest)
    return _wrap(self, data, self._scale_inv.to(device=data.device, copy=True), dtype)


def _op_new(func, args, kwargs):
    """new_zeros / new_empty / empty_like / zeros_like: an FP8Weight (zero bytes, a copy of
    the scale: FSDP2 pads a shard so) unless another dtype or device is asked for."""
    self = args[0]
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if (dtype is None or dtype == self.dtype) and (device is None or torch.device(device) == self.device):
        rest = {k: v for k, v in kwargs.items() if k not in ("dtype", "device")}
        return _wrap(self, func(self._data, *args[1:], **rest), self._scale_inv.clone())
    return func(self.dequantize(), *args[1:], **kwargs)


def _op_copy(func, args, kwargs):
    """copy_: FP8 weight to FP8 weight: bytes and scale; a high-precision value into an FP8
    weight: cast by its rule (from this tensor's own amax: a whole weight; sharded FP8
    weights are written by write_fp8 and load_state_dict, which all-reduce it);
    an FP8 weight into a plain tensor: its dequantised value."""
    dst, src = args[0], args[1]
    if isinstance(dst, FP8Weight):
        with torch.no_grad():
            if isinstance(src, FP8Weight):
                if src._data.dtype != dst._data.dtype:
                    raise TypeError(f"fp8mix: copying an FP8 weight of {src._data.dtype} into one of "
                                    f"{dst._data.dtype}")
                dst._data.copy_(src._data)
                dst._scale_inv.copy_(src._scale_inv.reshape(dst._scale_inv.shape))
            else:
                src = src.to(device=dst.device)
                scale, sinv = dst.scaling.scales(_amax(src))
                dst._data.copy_(dst.scaling.cast(src, scale))
                dst._scale_inv.copy_(sinv.reshape(dst._scale_inv.shape))
        return dst
    return func(dst, src.dequantize(dst.dtype if dst.dtype in _HP else torch.float32), *args[2:], **kwargs)


def _op_overwrite(func, args, kwargs):
    """In-place ops whose result does not read the old value (initialisers: normal_,
    uniform_, fill_, zero_): run on a high-precision tensor (the random stream consumed as
    for a plain weight), then cast by the rule, as copy_ does. (A module built under
    fp8_model_init may be initialised again by its parent: TransformerLayer's init_method.)"""
    self = args[0]
    hp = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    func(hp, *args[1:], **kwargs)
    _op_copy(aten.copy_.default, (self, hp), {})
    if "_hp_init" in self.__dict__:  # preserve_high_precision_init_val: the new initial value
        self.__dict__["_hp_init"] = hp.to("cpu", copy=True)
    return self


_FP8_OPS = {
    **{op: _op_view for op in (aten.detach.default, aten.alias.default, aten.view.default, aten._unsafe_view.default,
                               aten.t.default, aten.transpose.int, aten.as_strided.default, aten.slice.Tensor,
                               aten.select.int, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
                               aten.clone.default)},
    aten._to_copy.default: _op_to_copy,
    **{op: _op_new for op in (aten.new_zeros.default, aten.new_empty.default) + _LIKE},
    aten.copy_.default: _op_copy,
    **{op: _op_overwrite for op in (aten.normal_.default, aten.uniform_.default, aten.fill_.Scalar,
                                    aten.fill_.Tensor, aten.zero_.default)},
}


class FP8AllGatherWeight(FP8WeightBase):
    """A high-precision weight (``_tensor``) that FSDP2 casts to FP8 before all-gathering it.

    Every other op sees ``_tensor`` (the optimizer updates it in place, checkpoints save it).
    ``fsdp_pre_all_gather`` casts the shard with the whole weight's scale: from
    :func:`fp8mix.distributed.precompute_fp8_scales_for_fsdp` (every layer's amax in one
    all-reduce), else from an all-reduce of this weight's amax; either is kept until the
    weight changes, so the backward's all-gather reuses it. "Changes" is the version
    counter of the sharded Parameter (FSDP2's DTensor, which in-place updates such as an
    optimizer step or load_state_dict bump; the local tensor's own counter does not move
    under DTensor): a write through ``.data`` goes unseen, so after one call
    precompute_fp8_scales_for_fsdp again. Without a Parameter to read it from, every
    all-gather all-reduces."""

    _tensor: torch.Tensor

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, scaling: WeightScaling):
        return torch.Tensor._make_wrapper_subclass(cls, tensor.shape, strides=tensor.stride(),
                                                   storage_offset=tensor.storage_offset(), dtype=tensor.dtype,
                                                   device=tensor.device, requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, scaling: WeightScaling):
        self._tensor = tensor
        self.scaling = scaling
        self._scale_cache: Optional[tuple] = None  # (the tensor's version, scale, scale_inv)

    def gemm_operands(self, plan):
        """Unsharded (before fully_shard, or a model that is not sharded): the same cast."""
        w = self._tensor
        scale, sinv = self.scaling.scales(_amax(w))
        q, qt, _ = ops.cast(w.contiguous(), scale, self.scaling.fp8_dtype, transpose=plan.tn, inf_to_nan=True)
        return q, (qt if plan.tn else None), sinv

    def set_scale(self, scale: torch.Tensor, scale_inv: torch.Tensor, version: int) -> None:
        """Use these (the whole weight's, computed by the caller on every rank alike) while the
        sharded Parameter's version is `version`."""
        self._scale_cache = (version, scale.reshape(1), scale_inv.reshape(1))

    def __repr__(self, *, tensor_contents=None):
        return f"FP8AllGatherWeight(shape={tuple(self.shape)}, dtype={self.dtype}, fp8={self.scaling.fp8_dtype})"

    def __tensor_flatten__(self):
        return ["_tensor"], self.scaling

    @staticmethod
    def __tensor_unflatten__(inner, scaling, outer_size, outer_stride):
        return FP8AllGatherWeight(inner["_tensor"], scaling)

    def __reduce_ex__(self, protocol):
        return (FP8AllGatherWeight, (self._tensor, self.scaling))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        scaling = next(t.scaling for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, FP8AllGatherWeight))
        first = args[0] if args else None
        uargs, ukwargs = pytree.tree_map_only(FP8AllGatherWeight, lambda t: t._tensor, (args, kwargs))
        out = func(*uargs, **ukwargs)
        if func not in _AG_PRESERVE:
            return out
        if isinstance(first, FP8AllGatherWeight) and out is first._tensor:  # in place: the same wrapper
            return first
        return pytree.tree_map_only(torch.Tensor, lambda t: FP8AllGatherWeight(t, scaling), out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """The shard's FP8 bytes under the whole weight's scale (as uint8, padded as FSDP2 pads)."""
        version = _param_version(module, self)
        c = self._scale_cache
        if c is None or version is None or c[0] != version:
            (amax,) = global_amaxes([self._tensor], [[mesh.get_group()]])
            scale, sinv = self.scaling.scales(amax)
            c = (version, scale.reshape(1), sinv.reshape(1))
            if version is not None:
                self._scale_cache = c
        q = self.scaling.cast(self._tensor, c[1])
        rows = -(-outer_size[0] // mesh.size())
        return (_pad_rows(q, rows).view(torch.uint8),), (c[2], self.scaling.fp8_dtype)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        return _gathered(all_gather_outputs, metadata, param_dtype, self.scaling, out)


def _param_version(module, local: torch.Tensor) -> Optional[int]:
    """The version counter of `module`'s Parameter whose local tensor is `local`, or None."""
    for p in module._parameters.values():
        if p is not None and _local(p) is local:
            return p._version
    return None


# FSDP2 pads and moves the shard: these keep the wrapper (torchao's list, plus views)
_AG_PRESERVE = {aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default, aten.slice.Tensor,
                aten.copy_.default, aten.view.default, aten.as_strided.default, aten._to_copy.default,
                aten._pin_memory.default, aten.split.Tensor, aten.split_with_sizes.default, aten.clone.default,
                aten.detach.default, aten.alias.default}


# ---- amaxes and writes of (possibly sharded) weights --------------------------------------
def _amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a (1,) float32 tensor (0 for an empty tensor)."""
    if t.numel() == 0:
        return torch.zeros(1, dtype=torch.float32, device=t.device)
    return ops.amax(t.detach().contiguous()).reshape(1)


def _local(t: Any) -> Any:
    """A DTensor's local tensor, or the tensor itself."""
    return t._local_tensor if _is_dtensor(t) else t


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_local_tensor")


def _shard_groups(t: Any) -> list:
    """The process groups a DTensor is sharded over (whose ranks hold other parts of it)."""
    if not _is_dtensor(t):
        return []
    mesh = t.device_mesh
    return [mesh.get_group(d) for d, p in enumerate(t.placements) if p.is_shard()]


def global_amaxes(local_tensors: list, groups: list) -> list:
    """max |W| of each whole weight from its local parts: one MAX all-reduce per distinct
    list of process groups (one for all the layers of an FSDP2 model). groups[i]: the
    groups tensor i is sharded over ([] for a whole tensor). Returns (1,) float32 tensors."""
    amaxes = [_amax(t) for t in local_tensors]
    by_groups: dict = {}
    for i, gs in enumerate(groups):
        if gs:
            by_groups.setdefault(tuple(gs), []).append(i)
    for gs, idx in by_groups.items():
        stacked = torch.cat([amaxes[i] for i in idx])
        for g in gs:
            torch.distributed.all_reduce(stacked, op=torch.distributed.ReduceOp.MAX, group=g)
        for k, i in enumerate(idx):
            amaxes[i] = stacked[k:k + 1]
    return amaxes


@torch.no_grad()
def write_fp8(weights: list, values: list) -> None:
    """weights[i] (an FP8Weight, or a DTensor of them) = values[i] (high precision, a DTensor
    alike) cast by its rule, amaxes of sharded ones all-reduced together."""
    locs = [_local(w) for w in weights]
    vals = [_local(v) for v in values]
    amaxes = global_amaxes(vals, [_shard_groups(w) for w in weights])
    for w, v, am in zip(locs, vals, amaxes):  # (FP8Weights: the callers pass nothing else)
        scale, sinv = w.scaling.scales(am)
        w._data.copy_(w.scaling.cast(v.to(device=w.device), scale))
        w._scale_inv.copy_(sinv.reshape(w._scale_inv.shape))


def fp8_weight_of(p) -> Optional[FP8Weight]:
    """The FP8Weight behind parameter `p` (itself, or a DTensor's local tensor), else None."""
    t = _local(p)
    return t if isinstance(t, FP8Weight) else None


# ---- modules --------------------------------------------------------------------------------
def gemm_weight_names(m) -> tuple:
    """The GEMM weights of an fp8mix module, in GEMM order: ``weight`` (Linear, Conv1D,
    LayerNormLinear), ``fc1_weight``, ``fc2_weight`` (LayerNormMLP). TypeError for a module
    whose GEMM weights are not these."""
    names = ("weight",) if m.fp8_gemms == 1 else tuple(f"fc{g + 1}_weight" for g in range(m.fp8_gemms))
    params = m._parameters
    if not all(isinstance(params.get(n), torch.Tensor) for n in names):
        raise TypeError(f"fp8mix.{type(m).__name__}: FP8 weights need its GEMM weights as the parameters "
                        f"{list(names)}; it has {list(params)}")
    return names


def _replace(m, name: str, new: torch.Tensor, requires_grad: bool) -> None:
    m._parameters[name] = torch.nn.Parameter(new, requires_grad=requires_grad)


def to_fp8_weights(m, recipe, *, owner: str, keep_high_precision: bool = False) -> None:
    """Hold `m`'s GEMM weights as FP8Weights (cast by `recipe`'s weight rule), pin
    ``m.fp8_recipe`` to `recipe`, and add the checkpoint hooks (module docstring). With
    keep_high_precision, each keeps its high-precision value on the CPU
    (``get_high_precision_init_val()``, Transformer Engine's preserve_high_precision_init_val)."""
    scaling = WeightScaling.from_recipe(recipe, owner)
    names = gemm_weight_names(m)
    for n in names:
        p = m._parameters[n]
        if isinstance(_local(p), FP8WeightBase):
            continue
        if p.is_meta:
            raise NotImplementedError(f"{owner}: FP8 weights on the meta device are not supported (the cast needs "
                                      "the values): build the module on a real device")
        _replace(m, n, FP8Weight.quantize(p.detach(), scaling), p.requires_grad)
        if keep_high_precision:  # (on the Parameter: nn.Parameter() made a new tensor object)
            m._parameters[n]._hp_init = p.detach().to("cpu", copy=True)
    m.fp8_recipe = recipe
    _add_hooks(m)


def enable_fp8_all_gather(m, scaling: WeightScaling) -> list:
    """Wrap `m`'s high-precision GEMM weights in FP8AllGatherWeight (new Parameters, same
    storage); FP8 weights already all-gather in FP8. Returns the names wrapped."""
    done = []
    for n in gemm_weight_names(m):
        p = m._parameters[n]
        if isinstance(_local(p), FP8WeightBase):
            continue
        _replace(m, n, FP8AllGatherWeight(p.detach(), scaling), p.requires_grad)
        done.append(n)
    if done:
        _add_hooks(m)
    return done


def _add_hooks(m) -> None:
    if "_fp8_weight_hooks" in m.__dict__:
        return
    m.__dict__["_fp8_weight_hooks"] = [m._register_state_dict_hook(_save_weights),
                                       m._register_load_state_dict_pre_hook(_load_weights, with_module=True)]
    for n in gemm_weight_names(m):  # (see _CheckpointEntry)
        m.__dict__[n + _BYTES_SUFFIX] = _CheckpointEntry(n, "FP8 bytes")
        m.__dict__[n + _SCALE_SUFFIX] = _CheckpointEntry(n, "scale_inv")


class _CheckpointEntry:
    """Stands, as a module attribute, for a state_dict entry of an FP8 weight that is not a
    Parameter or buffer of its own (``<name>_fp8``, ``<name>_scale_inv``):
    torch.distributed.checkpoint's state_dict helpers (get_model_state_dict) look every key
    up as an attribute. Not a tensor: the values are the weight's (state_dict() gives them)."""

    __slots__ = ("weight", "part")

    def __init__(self, weight: str, part: str):
        self.weight, self.part = weight, part

    def __repr__(self) -> str:
        return f"<the {self.part} of FP8 weight {self.weight!r} in checkpoints: module.state_dict()>"


def _like(t: Any, local: torch.Tensor) -> torch.Tensor:
    """`local` as the DTensor `t` is (same mesh, placements, shape), or itself when `t` is plain."""
    if not _is_dtensor(t):
        return local
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


def _save_weights(module, state_dict, prefix, local_metadata):
    """state_dict() hook: an FP8Weight ``<name>`` saves ``<name>_fp8`` (its bytes) and
    ``<name>_scale_inv`` instead, aliases of the weight's own (a load in place, as
    torch.distributed.checkpoint's, writes the weight); FP8AllGatherWeight saves its
    high-precision value under ``<name>``, as a plain weight would."""
    for n in gemm_weight_names(module):
        key = prefix + n
        v = state_dict.get(key)
        if v is None:
            continue
        loc = _local(v)
        if isinstance(loc, FP8Weight):
            del state_dict[key]
            state_dict[key + _BYTES_SUFFIX] = _like(v, loc._data)
            state_dict[key + _SCALE_SUFFIX] = loc._scale_inv
        elif isinstance(loc, FP8AllGatherWeight):
            state_dict[key] = _like(v, loc._tensor)
    return state_dict


def _load_weights(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """load_state_dict() pre-hook: ``<name>_fp8`` + ``<name>_scale_inv`` load into an FP8
    weight exactly; a high-precision ``<name>`` loads cast by the weight's rule (sharded: the
    amax all-reduced); FP8 entries into a high-precision weight raise (they would be codes
    without their scale: dequantize_fp8_weights first)."""
    for n in gemm_weight_names(module):
        key = prefix + n
        p = module._parameters.get(n)
        if p is None:
            continue
        dst = _local(p)
        if key + _BYTES_SUFFIX in state_dict:
            if not isinstance(dst, FP8Weight):
                raise ValueError(f"fp8mix.{type(module).__name__}: the checkpoint holds {key} as FP8 bytes "
                                 f"({key + _BYTES_SUFFIX}) but this module's weight is high precision; load "
                                 "fp8mix.dequantize_fp8_weights(state_dict) instead")
            src = state_dict.pop(key + _BYTES_SUFFIX)
            sinv = state_dict.pop(key + _SCALE_SUFFIX, None)
            if sinv is None:
                raise ValueError(f"fp8mix.{type(module).__name__}: the checkpoint has {key + _BYTES_SUFFIX} but no "
                                 f"{key + _SCALE_SUFFIX}")
            w = FP8Weight(_local(src), _local(sinv).reshape(dst._scale_inv.shape).to(torch.float32), dtype=dst.dtype,
                          scaling=dst.scaling)
        elif isinstance(dst, FP8Weight) and key in state_dict and not isinstance(_local(state_dict[key]), FP8Weight):
            src = state_dict[key]  # a high-precision checkpoint: the whole weight's amax, all-reduced over shards
            (am,) = global_amaxes([_local(src)], [_shard_groups(p)])
            scale, s = dst.scaling.scales(am)
            w = FP8Weight(dst.scaling.cast(_local(src).to(device=dst.device), scale),
                          s.reshape(dst._scale_inv.shape), dtype=dst.dtype, scaling=dst.scaling)
        else:
            continue
        state_dict[key] = _like(src, w)


def dequantize_fp8_weights(state_dict: dict) -> dict:
    """A copy of `state_dict` with every saved FP8 weight (``<name>_fp8`` bytes +
    ``<name>_scale_inv``) replaced by ``<name>``, its float32 value: what a model built
    without FP8 weights (no fp8_model_init, or plain torch) loads."""
    out = type(state_dict)()
    for k, v in state_dict.items():
        if k.endswith(_SCALE_SUFFIX) and k[: -len(_SCALE_SUFFIX)] + _BYTES_SUFFIX in state_dict:
            continue
        if k.endswith(_BYTES_SUFFIX) and k[: -len(_BYTES_SUFFIX)] + _SCALE_SUFFIX in state_dict:
            name = k[: -len(_BYTES_SUFFIX)]
            sinv = _local(state_dict[name + _SCALE_SUFFIX]).reshape(()).to(torch.float32)
            loc = _local(v)
            val = ops.dequantize(loc.contiguous(), sinv.to(loc.device), out_dtype=torch.float32)
            out[name] = _like(v, val)
            continue
        out[k] = v
    return out


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes held by `module`'s parameters: the storage under each (an FP8 weight's bytes and
    scale; a DTensor's local part), not the presented dtype's size."""
    total = 0
    for p in module.parameters():
        total += _tensor_bytes(_local(p))
    return total


def _tensor_bytes(t: Any) -> int:
    if isinstance(t, FP8WeightBase):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()
