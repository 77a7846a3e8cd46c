"""The planner's measurements: run a model on a few batches with a chosen set of layers in
FP8 (each under its own recipe) and read the loss, each layer's own output error and the
FP8 formats Format.AUTO's rule would give each tensor role.

One *configuration* is {layer name: recipe, or None for high precision}. :meth:`Session.run`
sets the layers' policy attributes (``fp8_enabled``, ``fp8_recipe``), forgets their FP8
state (each configuration starts as a fresh run would: the first cast of a role scales by
its own amax), and runs every batch once -- forward only, or forward and backward -- in
``eval()`` mode (no dropout noise between configurations) under
``fp8_autocast(calibrating=True)``, so delayed scaling records its histories as in training.
The session counts the passes it ran and, when it ends, restores what it changed: the
policy attributes, the FP8 state, the parameters' ``.grad``, the train/eval mode and
torch's random state.

Not here: which configurations to run and what to conclude (search.py).
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional

import torch
import torch.nn as nn

from .. import auto_format
from ..context import fp8_autocast
from ..formats import Format
from ..nn.fp8_state import FP8_STATE_KEYS
from ..recipe import ROLES
from .layers import channel_input, gemm_weights, hp_output
from .plan import fp8_layers

__all__ = ["Session", "sqnr_db", "LayerProbe"]

_POLICY = ("fp8_enabled", "fp8_recipe", "fp8_smooth")  # the per-module attributes a configuration sets


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise); inf for an exact result, nan for no signal."""
    if signal <= 0:
        return math.nan
    return math.inf if noise <= 0 else 10.0 * math.log10(signal / noise)


class LayerProbe:
    """Forward hooks on every layer of a configuration's run: the layer's own output error
    (its FP8 output against its high-precision forward on the *same* input, so upstream
    layers' errors do not count: fp8mix.plan.layers.hp_output), the rows it saw, and on the
    first batch Format.AUTO's preferred format for its input, weights and grad_output under
    the layer's recipe (E5M2 when any of its GEMMs' tensors wants it)."""

    def __init__(self, layers: dict, formats: bool, channels: Optional[Callable] = None):
        self.layers = layers
        # channels(x2, weight, fixed_weight=) -> a report (fp8mix.plan.outliers.assess), first batch
        self.channel_fn = channels
        self.channels: dict = {}
        self.energy = {n: [0.0, 0.0] for n in layers}  # signal, noise
        self.rows = {n: 0 for n in layers}
        self.formats: dict = {n: {} for n in layers} if formats else {}
        self.batch = 0
        self._inside = False  # computing a layer's high-precision output: its own call is no sample
        self.handles = [m.register_forward_hook(self._hook(n), with_kwargs=True) for n, m in layers.items()]

    def _hook(self, name: str):
        def hook(m, args, kwargs, out):
            x = args[0] if args else None
            if isinstance(out, (tuple, list)) and out:  # (out, bias) / (out, ln_out): the output is first
                out = out[0]
            if self._inside or not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
                return
            self._inside = True
            try:
                with torch.no_grad():
                    ref = hp_output(m, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), kwargs)
            finally:
                self._inside = False
            if ref is None or ref.shape != out.shape:
                return
            with torch.no_grad():
                ref = ref.float()
                self.energy[name][0] += float(ref.pow(2).sum())
                self.energy[name][1] += float((out.detach().float() - ref).pow(2).sum())
            self.rows[name] += x.numel() // max(1, x.shape[-1])
            first = self.batch == 0 and x.numel() > 0
            gemm_in = channel_input(m, x.detach()) if first and (self.channel_fn is not None or self.formats) \
                else None
            if self.channel_fn is not None and first and name not in self.channels and gemm_in is not None:
                x2, w, fixed = gemm_in
                with torch.no_grad():
                    self.channels[name] = self.channel_fn(x2, w, fixed_weight=fixed)
            recipe = m.fp8_recipe
            if self.formats and first and recipe is not None and m.fp8_enabled:
                x2 = gemm_in[0] if gemm_in is not None else x.detach().reshape(-1, x.shape[-1])
                self._prefer(name, "input", [x2], recipe)
                self._prefer(name, "weight", [w.detach() for w in gemm_weights(m)], recipe)
                if out.requires_grad:
                    out.register_hook(lambda g: self._prefer(name, "grad_output", [g.reshape(-1, g.shape[-1])],
                                                             recipe) and None)
        return hook

    def _prefer(self, name: str, role: str, tensors: list, recipe) -> bool:
        """Format.AUTO's choice for `role` from its tensors (one per GEMM: E5M2 when any wants it)."""
        if role in self.formats[name]:
            return False
        picks = []
        for t in tensors:
            if t.numel() == 0:
                continue
            t = t.float().contiguous() if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) \
                else t.contiguous()
            picks.append(auto_format.evaluate(t, recipe.granularity(role), recipe.margin, recipe.power_2_scale,
                                              recipe.auto.range_tolerance))
        if not picks:
            return False
        self.formats[name][role] = next((p for p in picks if p[0] is Format.E5M2), picks[0])
        return True

    def sqnr(self, name: str) -> float:
        return sqnr_db(*self.energy[name])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class Session:
    """Runs configurations of `model` on `batches` with `loss_fn(model, batch) -> loss` and
    restores the model afterwards (use as a context manager)."""

    def __init__(self, model: nn.Module, batches: list, loss_fn: Callable):
        self.model, self.batches, self.loss_fn = model, batches, loss_fn
        self.layers = fp8_layers(model)
        self.forward = self.backward = 0

    def __enter__(self) -> "Session":
        m = self.model
        self._training = m.training
        self._rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self._grads = {id(p): p.grad for p in m.parameters()}
        self._policy = {n: tuple(m_.__dict__.get(a) for a in _POLICY) for n, m_ in self.layers.items()}
        self._state = {n: {k: getattr(m_, k).clone() for k in FP8_STATE_KEYS} for n, m_ in self.layers.items()}
        m.eval()
        return self

    def __exit__(self, *exc) -> None:
        m = self.model
        for n, layer in self.layers.items():
            layer.reset_fp8_state()
            with torch.no_grad():
                for k, v in self._state[n].items():
                    if getattr(layer, k).shape == v.shape:
                        getattr(layer, k).copy_(v)
                    else:  # a recipe with a longer history grew the buffer meanwhile
                        layer._buffers[k] = v
            layer._auto_state = [list(map(int, r)) for r in layer.fp8_auto.tolist()]
            layer._maybe_fresh = [int(s) == 0 for s in layer.fp8_steps.tolist()]
            for attr, v in zip(_POLICY, self._policy[n]):
                if v is None:
                    layer.__dict__.pop(attr, None)
                else:
                    setattr(layer, attr, v)
        for p in m.parameters():
            p.grad = self._grads.get(id(p))
        torch.set_rng_state(self._rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)
        m.train(self._training)

    def configure(self, config: dict, smooth=frozenset()) -> None:
        """Set each layer's policy from config (names absent from it run in high precision;
        names in `smooth` get ``fp8_smooth``) and give every layer a fresh FP8 state."""
        for n, layer in self.layers.items():
            recipe = config.get(n)
            layer.fp8_enabled = recipe is not None
            layer.fp8_recipe = recipe
            if n in smooth or "fp8_smooth" in layer.__dict__:
                layer.fp8_smooth = n in smooth
            layer.reset_fp8_state()

    def run(self, config: dict, *, backward: bool = False, probe: Optional[LayerProbe] = None,
            after_backward=None, smooth=frozenset()) -> float:
        """Mean loss over the batches under `config` (and `smooth`: see configure); with
        backward, after_backward(i) is called after batch i's backward (the parameters'
        .grad then hold its gradients)."""
        self.configure(config, smooth)
        losses = []
        for i, b in enumerate(self.batches):
            if probe is not None:
                probe.batch = i
            # an all-high-precision configuration runs without the autocast (which would warn
            # that no fp8mix module ran in it)
            ctx = fp8_autocast(enabled=True, calibrating=True) if config else contextlib.nullcontext()
            with torch.set_grad_enabled(backward), ctx:
                loss = self.loss_fn(self.model, b)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise TypeError("fp8mix.search_plan: loss_fn(model, batch) must return a scalar tensor, got "
                                f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
            self.forward += 1
            if backward:
                for p in self.model.parameters():
                    p.grad = None
                loss.backward()
                self.backward += 1
                if after_backward is not None:
                    after_backward(i)
            losses.append(float(loss.detach()))
        return sum(losses) / len(losses)


def formats_of(prefs: dict, recipe) -> tuple:
    """(fp8_format, {role: Format}) for a layer from Format.AUTO's preferences per role
    (prefs: role -> (Format, reason)); forward roles share one format, so E5M2 for either
    input or weight makes both E5M2; a delayed recipe keeps its own gradient format. The
    pair maps to the recipe's format field: E4M3/E5M2 forward with E5M2 gradients is HYBRID
    or E5M2, with E4M3 gradients E4M3 or AUTO (a recipe has no "E5M2 forward, E4M3
    backward": AUTO then decides at run time)."""
    if not prefs:
        return recipe.fp8_format, {r: recipe.format(r) for r in ROLES}
    fwd = Format.E5M2 if any(prefs.get(r, (Format.E4M3,))[0] is Format.E5M2 for r in ("input", "weight")) \
        else Format.E4M3
    grad = prefs.get("grad_output", (recipe.format("grad_output"),))[0]
    if recipe.delayed():
        # AUTO evaluates with the tensor's own amax; delayed scaling casts gradients with the
        # history's max, which early in training is far above the current amax, and E4M3's
        # narrower range then flushes them (stability suite, clean GPT: up to 41% of a layer's
        # gradient lost, SQNR 4.9 dB, vs 0.4% / 12 dB for E5M2): keep the recipe's gradient format
        grad = recipe.format("grad_output")
    fmt = {(Format.E4M3, Format.E5M2): Format.HYBRID, (Format.E4M3, Format.E4M3): Format.E4M3,
           (Format.E5M2, Format.E5M2): Format.E5M2, (Format.E5M2, Format.E4M3): Format.AUTO}[(fwd, grad)]
    return fmt, {"input": fwd, "weight": fwd, "grad_output": grad}
