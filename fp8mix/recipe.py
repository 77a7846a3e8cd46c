"""Scaling recipes: where each FP8 tensor's scale comes from.

- :class:`DelayedScaling` (default): scales from a history of past amaxes (no extra
  pass over the data; a sudden spike saturates until the history catches up).
- :class:`CurrentScaling`: the tensor's own amax right before the cast (one extra read).
- :class:`BlockScaling`: DeepSeek-V3 style 1x128 tiles for activations and gradients,
  128x128 blocks for weights, each with its own current scale.
- :class:`RowwiseScaling`: torchao's ``rowwise`` / ``rowwise_with_gw_hp``: current scales
  per row of each GEMM operand along that GEMM's reduction dimension.
- :class:`MXFP8BlockScaling`: OCP MX (Blackwell's MXFP8): 1x32 blocks along each GEMM's
  reduction dimension, one power-of-two (E8M0) scale per block.
  :func:`from_recipe_name` gives torchao's three recipe names.

Tensor roles of a linear layer: ``"input"`` and ``"weight"`` (forward, E4M3 under
HYBRID) and ``"grad_output"`` (backward, E5M2 under HYBRID).

Recipes are frozen dataclasses, validated once when built (``dataclasses.replace``
makes a changed copy). Modules ask a recipe what to do per role —
:meth:`~_Recipe.granularity`, :meth:`~_Recipe.format`, :meth:`~_Recipe.rounding_of`,
:meth:`~_Recipe.delayed` — instead of testing its class.

Fields every recipe has besides its scaling:

- ``fp8_format``: ``Format.E4M3``, ``E5M2``, ``HYBRID`` or ``AUTO`` (chosen per layer and
  role from statistics; ``auto`` holds the policy, see :class:`fp8mix.auto_format.AutoFormat`).
- ``rounding``: ``"nearest"`` (default) or ``"stochastic"`` for every role, or a dict
  from role (``"input"``, ``"weight"``, ``"grad_output"``; ``"grad"`` is an alias) to
  mode, e.g. ``{"grad": "stochastic"}``. Stochastic rounding draws its random words
  from a per-layer Philox stream whose offset advances with every cast, so no two
  casts (and no two steps) reuse random bits; the stream's key is drawn from torch's
  generator at the layer's first stochastic cast (``torch.manual_seed`` makes runs
  repeatable) and is saved in the layer's state_dict.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
from typing import TYPE_CHECKING, Callable, Optional, Union

from .auto_format import AutoFormat
from .formats import Format, Granularity

__all__ = ["DelayedScaling", "CurrentScaling", "BlockScaling", "RowwiseScaling", "MXFP8BlockScaling",
           "NVFP4BlockScaling", "Float8CurrentScaling", "Float8BlockScaling", "ROLES", "role_format", "RECIPES",
           "from_recipe_name", "TORCHAO_RECIPE_NAMES", "from_config"]

ROLES = ("input", "weight", "grad_output")
MAX_HISTORY = 2 ** 20  # amaxes per role; the history is rolled on every record, so longer is only slower
_ROUNDINGS = ("nearest", "stochastic")
_ROLE_ALIASES = {"grad": "grad_output", "gradient": "grad_output", "activation": "input"}


def _check_format(fmt, allowed=(Format.E4M3, Format.E5M2, Format.HYBRID, Format.AUTO)):
    if isinstance(fmt, str):
        try:
            fmt = Format[fmt.upper()]
        except KeyError:
            raise ValueError(f"unknown fp8_format {fmt!r}") from None
    if fmt not in allowed:
        raise ValueError(f"fp8_format must be one of {[f.name for f in allowed]}, got {fmt!r}")
    return fmt


def _check_bool(name, v):
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def _check_margin(owner: str, margin) -> None:
    if not isinstance(margin, int) or isinstance(margin, bool) or not 0 <= margin <= 126:
        raise ValueError(f"{owner}.margin must be an int in [0, 126], got {margin!r}")


def role_format(fmt: Format, role: str) -> Format:
    """The encoding a tensor role gets under `fmt` (HYBRID: E5M2 for gradients only;
    AUTO: HYBRID's assignment until a layer has decided otherwise)."""
    if fmt in (Format.HYBRID, Format.AUTO):
        return Format.E5M2 if role == "grad_output" else Format.E4M3
    return fmt


def _check_rounding(owner: str, rounding) -> types.MappingProxyType:
    """`rounding` as a read-only mapping role -> mode with every role present."""
    if isinstance(rounding, str):
        if rounding not in _ROUNDINGS:
            raise ValueError(f"{owner}.rounding must be 'nearest', 'stochastic' or a dict role -> mode, "
                             f"got {rounding!r}")
        return types.MappingProxyType({r: rounding for r in ROLES})
    if not isinstance(rounding, (dict, types.MappingProxyType)):
        raise TypeError(f"{owner}.rounding must be a str or a dict role -> mode, got {type(rounding).__name__}")
    out = {r: "nearest" for r in ROLES}
    for k, v in rounding.items():
        role = _ROLE_ALIASES.get(k, k)
        if role not in ROLES:
            raise ValueError(f"{owner}.rounding: unknown tensor role {k!r}; roles are {list(ROLES)} "
                             "(or 'grad')")
        if v not in _ROUNDINGS:
            raise ValueError(f"{owner}.rounding[{k!r}] must be 'nearest' or 'stochastic', got {v!r}")
        out[role] = v
    return types.MappingProxyType(out)


def _rebuild(cls, fields: dict):
    return cls(**fields)


_TE_FIELDS = ("use_power_2_scales", "reduce_amax", "fp8_dpa", "fp8_mha")


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class _Recipe:
    """What every recipe answers for the modules (no isinstance ladders there), and the fields
    every recipe takes from Transformer Engine's recipe classes (keyword-only: each recipe's
    own fields keep TE's positional order)."""

    if TYPE_CHECKING:  # every recipe's own fields, declared by each recipe in its own (TE's) order
        fp8_format: Format
        rounding: Union[str, dict, types.MappingProxyType]  # a read-only mapping role -> mode once checked
        auto: AutoFormat
        margin: int
        power_2_scale: bool
    _: dataclasses.KW_ONLY
    use_power_2_scales: Optional[bool] = None  # Transformer Engine's spelling of power_2_scale
    reduce_amax: bool = True  # all-reduce amaxes over fp8_autocast's group (False: every rank its own)
    fp8_dpa: bool = False  # Transformer Engine's FP8 attention: not supported (True raises)
    fp8_mha: bool = False

    def __repr__(self) -> str:  # each recipe's own fields first, then TE's
        own = [f for f in dataclasses.fields(self) if f.name not in _TE_FIELDS and f.repr]
        te = [f for f in dataclasses.fields(self) if f.name in _TE_FIELDS]
        return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in own + te)})"

    def _check_common(self) -> None:
        name = type(self).__name__
        if self.use_power_2_scales is not None:  # Transformer Engine's name for power_2_scale
            _check_bool(f"{name}.use_power_2_scales", self.use_power_2_scales)
            object.__setattr__(self, "power_2_scale", self.use_power_2_scales)
        object.__setattr__(self, "use_power_2_scales", None)  # one source: power_2_scale
        _check_bool(f"{name}.reduce_amax", self.reduce_amax)
        for te_field in ("fp8_dpa", "fp8_mha"):
            _check_bool(f"{name}.{te_field}", getattr(self, te_field))
            if getattr(self, te_field):
                raise NotImplementedError(f"{name}.{te_field}=True: fp8mix does not run attention in FP8 (its "
                                          "modules' linear layers are FP8; attention stays in high precision)")
        object.__setattr__(self, "fp8_format", _check_format(self.fp8_format))
        object.__setattr__(self, "rounding", _check_rounding(name, self.rounding))
        if not isinstance(self.auto, AutoFormat):
            raise TypeError(f"{name}.auto must be an fp8mix.auto_format.AutoFormat, got {type(self.auto).__name__}")
        _check_bool("power_2_scale", self.power_2_scale)
        _check_margin(name, self.margin)

    def delayed(self) -> bool:
        """Whether scales come from an amax history (DelayedScaling)."""
        return False

    def along_reduction(self) -> bool:
        """Whether every GEMM quantises both operands along its own reduction dimension
        (RowwiseScaling): x, W and dy are then cast once per GEMM that reads them."""
        return False

    def hp_wgrad(self) -> bool:
        """Whether the weight-gradient GEMM runs in high precision (rowwise_with_gw_hp)."""
        return False

    def granularity(self, role: str) -> Granularity:
        """Where the scales of `role`'s tensor apply."""
        return Granularity.TENSOR

    def format(self, role: str) -> Format:
        """The encoding of `role` (Format.AUTO: HYBRID's until a layer decides otherwise)."""
        return role_format(self.fp8_format, role)

    def rounding_of(self, role: str) -> str:
        """``"nearest"`` or ``"stochastic"`` for `role`."""
        assert isinstance(self.rounding, types.MappingProxyType)  # normalised by __post_init__
        return self.rounding[role]

    def stochastic(self) -> bool:
        """Whether any role rounds stochastically."""
        assert isinstance(self.rounding, types.MappingProxyType)
        return any(v == "stochastic" for v in self.rounding.values())

    def __reduce__(self):  # pickle / deepcopy: rebuilt from the fields (a mappingproxy does not pickle)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        fields["rounding"] = dict(fields["rounding"])
        return (_rebuild, (type(self), fields))

    def __deepcopy__(self, memo):  # frozen: a copy is the same value
        return self

    def __hash__(self) -> int:  # rounding is a read-only mapping: hash its items
        items = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            items.append(tuple(sorted(v.items())) if isinstance(v, types.MappingProxyType) else v)
        return hash((type(self).__name__, *items))


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class DelayedScaling(_Recipe):
    """Delayed scaling, as Transformer Engine's default recipe.

    Each layer keeps, per tensor role, a history of the last `amax_history_len` amaxes.
    The scale used for a cast is ``fp8_max / amax / 2**margin`` where amax is the max of
    the history (``"max"``), its newest entry (``"most_recent"``) or a callable on the
    (L,) history tensor (run in Python, ~10 small ops per record). The history rolls once
    per use of the role: every training forward of the layer records the amax of its
    input and weight, and the next training forward records the grad_output amax of each
    backward since (see fp8mix.nn.fp8_state). Scales are recomputed every `interval` such
    records. An amax of 0 or not finite keeps the previous scale; a scale that would be
    infinite becomes the largest float32. The first cast of a role (empty history) uses
    the tensor's own amax instead of an uninitialised scale of 1.
    """

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    power_2_scale: bool = False
    rounding: Union[str, dict, types.MappingProxyType] = "nearest"
    auto: AutoFormat = dataclasses.field(default_factory=AutoFormat)
    scaling_factor_compute_algo: Optional[Callable] = None  # Transformer Engine's; only None

    def __post_init__(self):
        if self.scaling_factor_compute_algo is not None:
            raise NotImplementedError("DelayedScaling.scaling_factor_compute_algo: fp8mix computes scales by its own "
                                      "rule (fp8_max / amax / 2**margin, power_2_scale); pass None")
        if not isinstance(self.interval, int) or isinstance(self.interval, bool) or self.interval < 1:
            raise ValueError(f"DelayedScaling.interval must be an int >= 1, got {self.interval!r}")
        if (not isinstance(self.amax_history_len, int) or isinstance(self.amax_history_len, bool)
                or not 1 <= self.amax_history_len <= MAX_HISTORY):
            raise ValueError(f"DelayedScaling.amax_history_len must be an int in [1, {MAX_HISTORY}], "
                             f"got {self.amax_history_len!r}")
        if not callable(self.amax_compute_algo) and self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("DelayedScaling.amax_compute_algo must be 'max', 'most_recent' or a callable, "
                             f"got {self.amax_compute_algo!r}")
        self._check_common()

    def delayed(self) -> bool:
        return True

    __hash__ = _Recipe.__hash__


class _JustInTime(_Recipe):
    """Checks shared by the recipes whose scales come from the tensor itself."""

    amax_epsilon: float

    def __post_init__(self):
        self._check_common()
        eps = self.amax_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= float(eps) < float("inf"):
            raise ValueError(f"{type(self).__name__}.amax_epsilon must be finite and >= 0, got {eps!r}")


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class CurrentScaling(_JustInTime):
    """Current (just-in-time) per-tensor scaling: ``scale = fp8_max / max(amax, amax_epsilon)``
    from the tensor itself at cast time; amax of 0 or not finite gives scale 1."""

    fp8_format: Format = Format.HYBRID
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    margin: int = 0
    rounding: Union[str, dict, types.MappingProxyType] = "nearest"
    auto: AutoFormat = dataclasses.field(default_factory=AutoFormat)

    __hash__ = _Recipe.__hash__


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class BlockScaling(_JustInTime):
    """DeepSeek-V3 block scaling: activations and gradients in 1x128 tiles along the
    reduction dimension, weights in 128x128 blocks, each tile with its own current
    scale. E4M3 everywhere by default (fine-grained scales make its range suffice)."""

    fp8_format: Format = Format.E4M3
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    margin: int = 0
    rounding: Union[str, dict, types.MappingProxyType] = "nearest"
    auto: AutoFormat = dataclasses.field(default_factory=AutoFormat)
    x_block_scaling_dim: int = 1  # Transformer Engine's: 1 = 1x128 tiles, 2 = 128x128 blocks
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1

    def __post_init__(self):
        dims = (self.x_block_scaling_dim, self.w_block_scaling_dim, self.grad_block_scaling_dim)
        if dims != (1, 2, 1):
            raise NotImplementedError("BlockScaling: fp8mix implements DeepSeek-V3's layout, x_block_scaling_dim=1, "
                                      f"w_block_scaling_dim=2, grad_block_scaling_dim=1; got {dims}")
        super().__post_init__()

    def granularity(self, role: str) -> Granularity:
        return Granularity.BLOCK2D if role == "weight" else Granularity.BLOCK

    __hash__ = _Recipe.__hash__


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class RowwiseScaling(_JustInTime):
    """torchao's rowwise recipes: current scaling with one scale per row of each GEMM
    operand, taken along that GEMM's reduction dimension (torchao's "axiswise"):

        forward  y  = x . W^T   x per row (amax over K), W per row (over K)
        dgrad    dx = dy . W    dy per row (over N), W per column (over N)
        wgrad    dW = dy^T . x  dy per column, x per column (over the M tokens)

    so x, W and dy are each cast twice (once per GEMM that reads them; the second copy of
    x is kept for backward at 1 byte per element). ``gw_hp=True`` is torchao's
    ``rowwise_with_gw_hp``: the weight gradient is computed in high precision from the
    saved input and dy, and dgrad reads a per-tensor FP8 weight. Scales are local to
    their rows: nothing is all-reduced across ranks (``reduce_amax`` has no effect).
    torchao's own settings are :func:`from_recipe_name` ("rowwise": E4M3 for every role
    and power-of-two scales).
    """

    fp8_format: Format = Format.HYBRID
    gw_hp: bool = False
    power_2_scale: bool = True  # torchao's round_scales_to_power_of_2 for its rowwise recipes
    amax_epsilon: float = 0.0
    margin: int = 0
    rounding: Union[str, dict, types.MappingProxyType] = "nearest"
    auto: AutoFormat = dataclasses.field(default_factory=AutoFormat)

    def __post_init__(self):
        _check_bool("RowwiseScaling.gw_hp", self.gw_hp)
        super().__post_init__()

    def granularity(self, role: str) -> Granularity:
        return Granularity.ROW

    def along_reduction(self) -> bool:
        return True

    def hp_wgrad(self) -> bool:
        return self.gw_hp

    __hash__ = _Recipe.__hash__


@dataclasses.dataclass(frozen=True, eq=True, repr=False)
class MXFP8BlockScaling(_JustInTime):
    """MXFP8 (OCP Microscaling v1.0; Transformer Engine's name): every GEMM operand cast in
    blocks of 32 consecutive elements along that GEMM's reduction dimension, each block
    scaled by a power of two 2^e, e in [-127, 127] (E8M0), from the block's own amax:

        forward  x along K, W along K;   dgrad  dy along N, W along N;
        wgrad    dy along M, x along M   (so x, W and dy are each quantised twice)

    ``scale_rule``: ``"rceil"`` (default; NVIDIA's: the smallest 2^e with amax / 2^e <=
    fp8_max) or ``"floor"`` (the OCP spec's floor(log2(amax)) - emax, which lets a block's
    largest element saturate); ``margin`` adds to e. Elements round to nearest even (or
    stochastically), saturating. E4M3 for every role by default (``Format.HYBRID``: E5M2
    gradients). Scales are local to their blocks: nothing is all-reduced. CPU (the C
    core); the fused norm/activation modules refuse it. ``power_2_scale`` is always True.
    """

    fp8_format: Format = Format.E4M3
    margin: int = 0
    scale_rule: str = "rceil"
    power_2_scale: bool = True
    amax_epsilon: float = 0.0
    rounding: Union[str, dict, types.MappingProxyType] = "nearest"
    auto: AutoFormat = dataclasses.field(default_factory=AutoFormat)

    def __post_init__(self):
        object.__setattr__(self, "fp8_format", _check_format(self.fp8_format,
                                                              (Format.E4M3, Format.E5M2, Format.HYBRID)))
        if self.scale_rule not in ("rceil", "floor"):
            raise ValueError(f"MXFP8BlockScaling.scale_rule must be 'rceil' or 'floor', got {self.scale_rule!r}")
        super().__post_init__()
        if not self.power_2_scale:
            raise ValueError("MXFP8BlockScaling: MX scales are powers of two by definition; power_2_scale must "
                             "be True")

    def granularity(self, role: str) -> Granularity:
        return Granularity.MX

    def along_reduction(self) -> bool:
        return True

    __hash__ = _Recipe.__hash__


RECIPES = (DelayedScaling, CurrentScaling, BlockScaling, RowwiseScaling, MXFP8BlockScaling)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


@dataclasses.dataclass(frozen=True, eq=True)
class NVFP4BlockScaling:
    """NVFP4 training (Transformer Engine's ``NVFP4BlockScaling``, its field names and
    environment defaults): every GEMM operand in E2M1 (4-bit) with an E4M3 scale per 16
    consecutive elements along that GEMM's reduction dimension and one float32 scale per
    tensor (current scaling: from the tensor's own amax; fp8mix.nvfp4 has the arithmetic):

        forward  x 1x16, W 16x16 tiles (``disable_2d_quantization``: 1x16), nearest;
        dgrad    dy 1x16 along N, stochastic (``disable_stochastic_rounding``: nearest),
                 W as in the forward (the 16x16 tiles give W^T the same values);
        wgrad    dy^T and x^T along the tokens after the 16-point random Hadamard
                 transform (``disable_rht``: without), dy^T stochastic.

    CPU, scalar GEMMs (slow: a reference, not a speed path); fp8mix.Linear and the modules
    that call it (convert_model's layers); the fused TE modules refuse it. in_features and
    out_features must be multiples of 16. The stochastic words come from the layer's
    ``fp8_rng`` stream, drawn in backward (so activation checkpointing, which repeats only
    the forward, changes nothing). No FP8 state is read or written. ``rht_signs``: the
    Hadamard transform's 16 random signs as a bit mask (fixed, as TE's).

    ``keep_last_layers_hp`` (fp8mix's, TE has no such field: Megatron-LM keeps such layers
    in BF16 by its own options): the last layers of the model, in module order, run in high
    precision, the rule of "Pretraining Large Language Models with NVFP4" (NVIDIA, 2025,
    arXiv:2509.25149: a few sensitive linear layers stay in BF16, about 15% of them and
    mostly at the end of the network; the last layers show the largest wgrad quantisation
    errors, and training diverged with every linear layer in FP4). A float in [0, 1) is a
    fraction of the model's fp8mix layers (the count rounded half up: 0.15 of 9 layers is
    1, of 2 layers 0), an int a count; 0 turns the rule off. Default 0.15, the paper's
    share. Which layers are "last" is fp8mix.nn.layer_order's (set by convert_model, or
    fp8mix.mark_layer_order(model)); a layer with its own policy (``fp8_enabled`` /
    ``fp8_recipe`` set by a precision plan or by hand) follows that policy instead."""

    fp4_format: str = "E2M1"
    fp8_format: Format = Format.E4M3
    disable_rht: bool = dataclasses.field(default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_RHT"))
    disable_stochastic_rounding: bool = dataclasses.field(
        default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"))
    disable_2d_quantization: bool = dataclasses.field(
        default_factory=lambda: _env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION"))
    rht_signs: int = 0xB4E1
    fp8_dpa: bool = False
    fp8_mha: bool = False
    keep_last_layers_hp: Union[float, int] = 0.15

    def __post_init__(self):
        _check_keep_last(self.keep_last_layers_hp)
        if getattr(self.fp4_format, "name", self.fp4_format) != "E2M1":  # (TE's Format.E2M1 has that name)
            raise ValueError(f"NVFP4BlockScaling.fp4_format must be 'E2M1', got {self.fp4_format!r}")
        object.__setattr__(self, "fp4_format", "E2M1")
        if _check_format(self.fp8_format) != Format.E4M3:
            raise ValueError(f"NVFP4BlockScaling.fp8_format (the block scales' format) must be Format.E4M3, got "
                             f"{self.fp8_format!r}")
        object.__setattr__(self, "fp8_format", Format.E4M3)
        for name in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "fp8_dpa", "fp8_mha"):
            _check_bool(f"NVFP4BlockScaling.{name}", getattr(self, name))
        if self.fp8_dpa or self.fp8_mha:
            raise NotImplementedError("NVFP4BlockScaling: fp8mix does not run attention in low precision")
        if type(self.rht_signs) is not int or not 0 <= self.rht_signs <= 0xFFFF:
            raise ValueError(f"NVFP4BlockScaling.rht_signs must be a 16-bit mask, got {self.rht_signs!r}")

    def delayed(self) -> bool:  # (what fp8_autocast's calibration asks of a recipe)
        return False

    reduce_amax = False  # current scaling of local tensors: nothing is all-reduced

    def high_precision_tail(self, layers: int) -> int:
        """How many of a model's `layers` fp8mix layers, counted from its last one,
        keep_last_layers_hp keeps in high precision."""
        k = self.keep_last_layers_hp
        n = math.floor(k * layers + 0.5) if isinstance(k, float) else k
        return min(int(n), layers)


def _check_keep_last(k) -> None:
    name = "NVFP4BlockScaling.keep_last_layers_hp"
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise TypeError(f"{name} must be a float fraction in [0, 1) or an int count >= 0, got "
                        f"{type(k).__name__} {k!r}")
    if isinstance(k, float) and not 0.0 <= k < 1.0:
        raise ValueError(f"{name}: a float is a fraction of the layers and must be in [0, 1), got {k!r} "
                         "(give an int for a count of layers)")
    if isinstance(k, int) and k < 0:
        raise ValueError(f"{name}: a count of layers must be >= 0, got {k!r}")



TORCHAO_RECIPE_NAMES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def from_recipe_name(name) -> _Recipe:
    """torchao's ``Float8LinearConfig.from_recipe_name`` names as fp8mix recipes:

    - ``"tensorwise"``: ``CurrentScaling(fp8_format=Format.HYBRID)`` (dynamic per-tensor
      scales, E4M3 forward and E5M2 gradients as torchao's default, scales not rounded);
    - ``"rowwise"``: ``RowwiseScaling(fp8_format=Format.E4M3, power_2_scale=True)``;
    - ``"rowwise_with_gw_hp"``: the same with ``gw_hp=True``.

    `name` may also be torchao's ``Float8LinearRecipeName`` member (its ``.value`` is used).
    """
    value = getattr(name, "value", name)
    if not isinstance(value, str):
        raise TypeError(f"from_recipe_name: name must be a str, got {type(name).__name__}")
    if value == "tensorwise":
        return CurrentScaling(fp8_format=Format.HYBRID)
    if value in ("rowwise", "rowwise_with_gw_hp"):
        return RowwiseScaling(fp8_format=Format.E4M3, power_2_scale=True, gw_hp=value == "rowwise_with_gw_hp")
    raise ValueError(f"from_recipe_name: unknown recipe name {value!r}; the names are {list(TORCHAO_RECIPE_NAMES)}")


def _listing_init(cls) -> None:
    """An unknown keyword is a TypeError that lists the recipe's fields (the dataclass one does not)."""
    init = cls.__init__

    @functools.wraps(init)  # (inspect.signature shows the fields)
    def __init__(self, *args, **kwargs):
        names = [f.name for f in dataclasses.fields(cls) if f.name not in _TE_FIELDS] + list(_TE_FIELDS)
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown field(s) {unknown}; the fields are {names}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


for _cls in RECIPES:
    _listing_init(_cls)

# Transformer Engine 2.x spellings
Float8CurrentScaling = CurrentScaling
Float8BlockScaling = BlockScaling


_TORCHAO_CASTS = ("cast_config_input", "cast_config_weight", "cast_config_grad_output")
_TORCHAO_GW = ("cast_config_input_for_grad_weight", "cast_config_grad_output_for_grad_weight")


def _cast_kind(cfg, name: str):
    """(scaling type, granularity, dtype name) of one of torchao's CastConfig fields (None: absent)."""
    c = getattr(cfg, name, None)
    if c is None:
        return None
    kind = getattr(getattr(c, "scaling_type", None), "value", None)
    gran = getattr(getattr(c, "scaling_granularity", None), "value", None)
    return kind, gran, str(getattr(c, "target_dtype", None) or "torch.float8_e4m3fn")


def _torchao_format(cfg) -> Format:
    dts = [_cast_kind(cfg, n)[2] for n in _TORCHAO_CASTS]
    if all(d == "torch.float8_e4m3fn" for d in dts):
        return Format.E4M3
    if dts[:2] == ["torch.float8_e4m3fn"] * 2 and dts[2] == "torch.float8_e5m2":
        return Format.HYBRID
    if all(d == "torch.float8_e5m2" for d in dts):
        return Format.E5M2
    raise NotImplementedError(f"from_config: target dtypes {dts} (input, weight, grad_output) have no fp8mix format")


def from_config(config) -> _Recipe:
    """An fp8mix recipe from a recipe (returned as is), one of torchao's recipe names
    (:func:`from_recipe_name`) or an object with the fields of torchao's
    ``Float8LinearConfig``: dynamic tensorwise casts give :class:`CurrentScaling`, axiswise
    ones :class:`RowwiseScaling` (``gw_hp`` when the weight gradient's casts are disabled, as
    torchao's rowwise_with_gw_hp), with ``round_scales_to_power_of_2`` as ``power_2_scale``.
    Other combinations raise NotImplementedError naming the field."""
    if isinstance(config, RECIPES):
        return config
    if isinstance(config, str) or hasattr(config, "value") and isinstance(config.value, str):
        return from_recipe_name(config)
    if not all(hasattr(config, n) for n in _TORCHAO_CASTS):
        raise TypeError("config must be an fp8mix recipe, a torchao recipe name or a torchao Float8LinearConfig, "
                        f"got {type(config).__name__}")
    kinds = {n: _cast_kind(config, n) for n in _TORCHAO_CASTS}
    for n, (kind, gran, _) in kinds.items():
        if kind != "dynamic" or gran not in ("tensorwise", "axiswise"):
            raise NotImplementedError(f"from_config: {n} has scaling {kind!r}/{gran!r}; fp8mix maps dynamic "
                                      "tensorwise or axiswise casts only")
    grans = {g for _, g, _ in kinds.values()}
    if len(grans) != 1:
        raise NotImplementedError(f"from_config: mixed granularities {sorted(grans)} across input, weight and "
                                  "grad_output have no fp8mix recipe")
    pow2 = bool(getattr(config, "round_scales_to_power_of_2", False))
    fmt = _torchao_format(config)
    # torchao fills each per-GEMM override with its main cast config when not given
    same = {n: _cast_kind(config, n) in (None, kinds[n.replace("_for_grad_weight", "")]) for n in _TORCHAO_GW}
    gw_off = all(_cast_kind(config, n) is not None and _cast_kind(config, n)[0] == "disabled" for n in _TORCHAO_GW)
    w_dgrad = _cast_kind(config, "cast_config_weight_for_grad_input")
    if not (all(same.values()) or gw_off):
        raise NotImplementedError("from_config: cast_config_input_for_grad_weight and "
                                  "cast_config_grad_output_for_grad_weight must equal the main casts or both be "
                                  "disabled (torchao's rowwise_with_gw_hp)")
    if grans == {"tensorwise"}:
        if gw_off or w_dgrad not in (None, kinds["cast_config_weight"]):
            raise NotImplementedError("from_config: per-GEMM cast overrides of a tensorwise config are not mapped")
        return CurrentScaling(fp8_format=fmt, power_2_scale=pow2)
    want_w = ("dynamic", "tensorwise") if gw_off else kinds["cast_config_weight"][:2]
    if w_dgrad is not None and w_dgrad[:2] != want_w:
        raise NotImplementedError(f"from_config: cast_config_weight_for_grad_input {w_dgrad[:2]} is not torchao's "
                                  f"{'rowwise_with_gw_hp' if gw_off else 'rowwise'} choice {want_w}")
    return RowwiseScaling(fp8_format=fmt, power_2_scale=pow2, gw_hp=gw_off)
