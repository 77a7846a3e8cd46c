"""FP8 expert layers for Hugging Face mixture-of-experts blocks (transformers >= 5): the
``*Experts`` modules that hold every expert's weights as two stacked 3-D Parameters,

    gate_up_proj  (E, 2I, H)   gate rows [0, I), up rows [I, 2I) (``is_concatenated``)
    down_proj     (E, H, I)

and run ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k))``
(Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3, ... : the classes decorated by
``transformers.integrations.moe.use_experts_implementation`` with its default layout).

:func:`fp8mix.convert_model` gives such a module a subclass of its own class (so
``isinstance`` checks in transformers still hold) whose forward routes the tokens as
Hugging Face's eager implementation does and runs both projections through
:func:`fp8mix.nn._grouped.grouped_linear_forward`: gate_up as FP8 GEMMs 0 .. E-1, down as
GEMMs E .. 2E-1 (``fp8_gemms = 2E``). The Parameters stay the same objects under the same
names, so Hugging Face checkpoints load and save unchanged (the FP8 state buffers are
extra keys, optional on load). Outside fp8_autocast the output equals the eager
implementation's bit for bit (same rows per expert in the same order, same GEMMs, the
top-k contributions summed in the same order), whatever ``config._experts_implementation``
says (grouped_mm and batched_mm sum in another order; they agree to rounding).

Not covered (left in high precision by convert_model, with the reason): transposed
weights (``is_transposed``: GPT-OSS, Aria), expert biases, interleaved gate/up
(``is_concatenated=False``), a gate other than ``act_fn(gate) * up`` (a class that
overrides ``_apply_gate``), ungated experts (``has_gate=False``), post-expert norms, and
expert parallelism (sentinel expert ids).

The router stays in high precision (small, and its logits choose the experts: Transformer
Engine and torchao leave it out too): in the stacked-3-D models it is no nn.Linear (a bare
Parameter and F.linear), so nothing converts it; where it is one (SwitchTransformers,
NLLB-MoE, DBRX, JetMoE, AFMoE, HunYuan-MoE, LongCat-Flash: an nn.Linear child of a
transformers ``*Router`` / ``*Gating`` module, or of a ``*Gate`` one with num_experts
outputs) :func:`router_linears` names it and convert_model leaves it out.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ._grouped import grouped_linear_forward
from .fp8_state import FP8StateMixin

__all__ = ["HFExperts", "experts_skip_reason", "is_hf_experts", "fp8_experts_class", "router_linears", "ROUTER_REASON"]

ROUTER_REASON = "the router of a mixture-of-experts block: kept in high precision"

_DEFAULT_GATE = ("transformers.integrations.moe", "_default_apply_gate")


def is_hf_experts(m: nn.Module) -> bool:
    """Whether `m` is a transformers experts module of the stacked-3-D kind (any layout)."""
    t = type(m)
    return (t.__module__.startswith("transformers") and hasattr(m, "has_gate") and hasattr(t, "_apply_gate")
            and isinstance(m._parameters.get("down_proj"), torch.Tensor))


def experts_skip_reason(m: nn.Module) -> Optional[str]:
    """Why an experts module (is_hf_experts) is left in high precision (None: converted)."""
    gate = getattr(type(m), "_apply_gate")
    layout = [flag for flag, bad in (("is_transposed", getattr(m, "is_transposed", True)),
                                     ("has_bias", getattr(m, "has_bias", True)),
                                     ("has_post_expert_norm", getattr(m, "has_post_expert_norm", True)),
                                     ("has_gate=False", not getattr(m, "has_gate", False)),
                                     ("is_concatenated=False", not getattr(m, "is_concatenated", False)),
                                     ("expert parallel", getattr(m, "_is_expert_parallel", True))) if bad]
    if (getattr(gate, "__module__", None), getattr(gate, "__name__", None)) != _DEFAULT_GATE:
        layout.append(f"its own _apply_gate ({type(m).__qualname__}._apply_gate)")
    up, down = m._parameters.get("gate_up_proj"), m._parameters.get("down_proj")
    shapes_ok = (isinstance(up, torch.Tensor) and isinstance(down, torch.Tensor) and up.dim() == 3 and down.dim() == 3
                 and up.shape[0] == down.shape[0] and up.shape[1] == 2 * down.shape[2] and up.shape[2] == down.shape[1])
    if not shapes_ok:
        layout.append("gate_up_proj / down_proj not shaped (E, 2I, H) / (E, H, I)")
    if not layout:
        return None
    return (f"a Hugging Face experts module ({type(m).__module__}.{type(m).__qualname__}) with "
            f"{', '.join(layout)}: fp8mix converts only the (E, 2I, H) / (E, H, I) layout with "
            "act_fn(gate) * up; left in high precision")


def router_linears(model: nn.Module) -> dict:
    """{id(linear): reason} for the nn.Linear routers of Hugging Face MoE blocks in `model`:
    the nn.Linear children of a transformers module whose class name ends in Router or
    Gating, and of one ending in Gate that has ``num_experts`` outputs (HunYuan-MoE's; a
    linear-attention ForgetGate or a detector's Gate is no router)."""
    out = {}
    for m in model.modules():
        t = type(m)
        if not t.__module__.startswith("transformers"):
            continue
        router = t.__name__.endswith(("Router", "Gating"))
        experts = getattr(m, "num_experts", None)
        if not router and not (t.__name__.endswith("Gate") and isinstance(experts, int)):
            continue
        for child in m.children():
            if isinstance(child, nn.Linear) and (router or child.out_features == experts):
                out[id(child)] = f"{ROUTER_REASON} ({t.__qualname__})"
    return out


class HFExperts(FP8StateMixin, nn.Module):
    """The forward of a converted Hugging Face experts module (mixed into a subclass of its
    class by :func:`fp8_experts_class`; see the module docstring)."""

    gate_up_proj: nn.Parameter
    down_proj: nn.Parameter
    act_fn: nn.Module
    fp8_min_features = 16

    @property
    def fp8_gemms(self) -> int:  # type: ignore[override]
        return 2 * int(self.gate_up_proj.shape[0])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """(T, H) for hidden_states (T, H), top_k_index (T, k) expert ids, top_k_weights (T, k)."""
        owner = type(self).__qualname__
        experts = int(self.gate_up_proj.shape[0])
        if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0] \
                or top_k_weights.shape != top_k_index.shape:
            raise ValueError(f"fp8mix.{owner}: expected hidden_states (T, H), top_k_index and top_k_weights (T, k); "
                             f"got {tuple(hidden_states.shape)}, {tuple(top_k_index.shape)}, "
                             f"{tuple(top_k_weights.shape)}")
        tokens, k = top_k_index.shape
        with torch.no_grad():
            # Row p = j*T + t is token t's j-th choice; a stable sort by expert keeps, within
            # an expert, the (top-k slot, token) order of the eager implementation's
            # torch.where(expert_mask[e]), so every expert's GEMM sees the same rows.
            flat = top_k_index.t().reshape(-1)
            order = torch.sort(flat, stable=True).indices
            if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
                raise ValueError(f"fp8mix.{owner}: top_k_index holds expert ids outside [0, {experts})")
            counts = torch.bincount(flat, minlength=experts)
            token, slot = order % tokens, order // tokens
            # Where each token's choices land in the sorted rows, in ascending expert order:
            # the order the eager implementation adds them (index_add_ expert by expert).
            where = torch.empty_like(order)
            where[order] = torch.arange(order.numel(), device=order.device)
            combine = where.view(k, tokens).t().sort(dim=1).values
        splits = counts.tolist()
        h = grouped_linear_forward(self, hidden_states[token], self.gate_up_proj, None, splits, gemm0=0)
        h = self._apply_gate(h)  # type: ignore[operator]
        y = grouped_linear_forward(self, h, self.down_proj, None, splits, gemm0=experts)
        y = y * top_k_weights[token, slot, None]
        out = torch.zeros_like(hidden_states)
        for j in range(k):  # a fixed order on every device (no atomics): deterministic
            out = out + y[combine[:, j]].to(out.dtype)
        return out

    def __reduce_ex__(self, protocol):
        # The class is made at run time (fp8_experts_class), so pickle cannot find it by
        # name: pickle the Hugging Face class it derives from and rebuild it on load.
        return (_rebuild, (self.__dict__["_fp8_orig_class"],), self.__dict__)


def _rebuild(cls: type) -> nn.Module:
    """An empty converted experts module of Hugging Face class `cls` (for unpickling)."""
    return object.__new__(fp8_experts_class(cls))


_CLASSES: dict = {}


def fp8_experts_class(cls: type) -> type:
    """The converted class of a Hugging Face experts class: HFExperts' forward before
    `cls`, one class per `cls`."""
    got = _CLASSES.get(cls)
    if got is None:
        got = type(f"FP8{cls.__name__}", (HFExperts, cls), {"__module__": __name__, "__doc__": (
            f"{cls.__module__}.{cls.__qualname__} with FP8 expert GEMMs (fp8mix.nn.hf_experts)")})
        _CLASSES[cls] = got
    return got
