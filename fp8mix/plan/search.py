"""fp8mix.search_plan: measure what FP8 costs each linear layer, choose the layers and
recipes that maximise the FP8 share of GEMM FLOPs within a loss budget, verify.

The search, on the given batches (``loss_fn(model, batch) -> scalar loss``), B of them
for the search and H held out (default: the last third, at least one):

1. high precision, forward + backward: the reference loss L_hp, each layer's rows (for
   its FLOPs, 6 rows in out: forward, dgrad, wgrad) and the first batch's weight gradients;
2. per candidate recipe (default: HYBRID delayed, HYBRID current, 1x128 block), every
   layer in FP8, forward + backward: the loss, each layer's *own* output SQNR (its FP8
   output against its high-precision forward on the same input), its weight-gradient SQNR,
   and Format.AUTO's preferred format per tensor role (fp8mix.auto_format.evaluate: the one
   format policy) -- where AUTO would choose E4M3 for gradients, the layer's recipe does,
   except under delayed scaling (its lagging scale flushes E4M3 gradients: measure.formats_of);
3. each layer gets the candidate with the best output SQNR (within 1 dB the earlier one)
   and AUTO's formats; one forward pass with every layer under its chosen recipe measures
   the SQNR again (key "plan"), and a layer below SQNR_LIMIT_DB (20 dB, the inspect
   tool's rule) there is kept in high precision whatever its loss says. Before that pass,
   the outlier rule (fp8mix.plan.outliers, measured on the first batch's inputs during
   step 1, no extra pass): a layer whose input has outlier channels that its recipe's
   input cast spoils (a channel group below 20 dB) moves to the first fix that passes --
   per-channel smoothing (Smooth-SwiGLU's, fp8_smooth), rowwise, 1x128 block, MX -- or
   is kept in high precision; the table's reason says which and the numbers;
4. metric="loss" only, forward passes: each layer alone in FP8 (its *solo* increase over
   L_hp) and every layer in FP8 but it (its *keep gain*). Its cost is the larger of the
   two, at least 0: solo misses interactions, keep-out misses what others already spoil;
5. greedy: layers by cost per FLOP, cheapest first, into FP8 while the summed cost stays
   within ``budget * L_hp``;
6. verification on the held-out batches, forward + backward in high precision and under
   the plan: the measured increase. Beyond the budget, the FP8 layer of highest cost (or
   lowest SQNR) goes back and the plan is measured again, up to ``max_repairs`` times.

A "layer" is an fp8mix module, whatever its GEMMs (fp8mix.plan.layers): a LayerNormMLP is one
layer with two GEMMs (its FLOPs both, its gradient SQNR over both weights), measured on its
own output; its outlier rule reads fc2's input (the SwiGLU output) and its smoothing fix is
Smooth-SwiGLU's (fp8_smooth, smooth_swiglu). A TransformerLayer is its LayerNormLinear,
Linear and LayerNormMLP. The fused modules run no rowwise or MX recipe: those candidates
and fixes are not tried on them (a layer no candidate runs on stays in high precision).

Cost: B (2 + C + 2N) + H (2 + 2r) forward (B more when the SQNR rule keeps a layer) and
B (1 + C) + H (2 + 2r) backward passes for N layers, C candidates and r repairs -- e.g. 4
search and 2 held-out batches, 3 candidates and the 9 linear layers of a 2-block GPT: 96
forward and 20 backward passes, about 50 training steps' worth (a backward costs about two
forwards), never a training run per layer. metric="sqnr" skips step 4 (B (2 + C) forward).
The plan reports what it used.

Default budget 1% of the high-precision loss: an FP8 run whose loss is within about 1% of
float32 at the search point trains as well as float32 in the stability suite (docs/stability.md:
all-FP8 HYBRID runs end within about +-1.5 points of relative loss of float32, their noise),
while a layer FP8 really breaks costs tens of percent (sections 4 and 10). The search reads the
model where it stands: at initialisation losses are flat, so the SQNR rule (step 3) is what
catches a broken layer there; after a short high-precision warm-up the loss says more.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from ..formats import Format
from ..nn.convert import convert_model, unconvert_model
from ..recipe import RECIPES, BlockScaling, MXFP8BlockScaling, RowwiseScaling
from .layers import fixes_for, gemm_shapes, gemm_weights, min_features, runs_recipe, smoothable
from .measure import LayerProbe, Session, formats_of, sqnr_db
from .outliers import FIX_ORDER, GROUP_SQNR_LIMIT_DB, assess, option_key
from .plan import LayerPlan, Plan, fp8_layers
from .recipes import default_candidates, recipe_label

__all__ = ["search_plan", "DEFAULT_BUDGET", "SQNR_LIMIT_DB", "METRICS"]

DEFAULT_BUDGET = 0.01
SQNR_LIMIT_DB = 20.0  # the inspect tool's rule: below this in the best format, keep the layer
METRICS = ("loss", "sqnr")
CHOSEN = "plan"  # output_sqnr_db key of a layer's SQNR under the recipe the plan chose for it
_TIE_DB = 1.0


def _check(batches, loss_fn, candidates, budget, metric, max_repairs) -> dict:
    if not isinstance(batches, (list, tuple)) or not batches:
        raise ValueError("fp8mix.search_plan: batches must be a non-empty list of batches")
    if not callable(loss_fn):
        raise TypeError("fp8mix.search_plan: loss_fn must be callable (model, batch) -> scalar loss")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 <= float(budget) < 1.0:
        raise ValueError(f"fp8mix.search_plan: budget is a fraction of the loss in [0, 1), got {budget!r}")
    if metric not in METRICS:
        raise ValueError(f"fp8mix.search_plan: metric must be one of {METRICS}, got {metric!r}")
    if isinstance(max_repairs, bool) or not isinstance(max_repairs, int) or max_repairs < 0:
        raise ValueError(f"fp8mix.search_plan: max_repairs must be an int >= 0, got {max_repairs!r}")
    if candidates is None:
        return default_candidates()
    if isinstance(candidates, (list, tuple)):
        candidates = {recipe_label(r) if isinstance(r, RECIPES) else str(r): r for r in candidates}
    if not isinstance(candidates, dict) or not candidates:
        raise TypeError("fp8mix.search_plan: candidates must be a non-empty dict label -> recipe or list of recipes")
    bad = [k for k, r in candidates.items() if not isinstance(r, RECIPES)]
    if bad:
        raise TypeError(f"fp8mix.search_plan: candidates {bad} are not fp8mix.recipe objects")
    return dict(candidates)


@dataclasses.dataclass
class _Layer:
    """What the search knows about one layer while it runs."""

    module: nn.Module
    rows: int = 0
    sqnr: dict = dataclasses.field(default_factory=dict)
    grad_sqnr: dict = dataclasses.field(default_factory=dict)
    prefs: dict = dataclasses.field(default_factory=dict)  # label -> {role: (Format, reason)}
    candidate: Optional[str] = None
    recipe: Any = None
    formats: Optional[dict] = None
    solo: float = math.nan
    keep: float = math.nan
    cost: float = 0.0
    reason: str = ""
    channels: Any = None  # fp8mix.plan.outliers.ChannelReport of its input (first batch)
    smooth: bool = False
    outlier_note: str = ""
    outlier_keep: bool = False

    @property
    def flops(self) -> float:
        return 6.0 * self.rows * sum(i * o for i, o in gemm_shapes(self.module))

    @property
    def tiny(self) -> bool:
        m: Any = self.module
        return bool(min_features(m) < int(m.fp8_min_features))


def _weight_grads(m: nn.Module):
    """m's GEMM weights' gradients, flattened into one float32 vector (None before a backward)."""
    gs = [w.grad for w in gemm_weights(m)]
    if not gs or any(g is None for g in gs):
        return None
    return torch.cat([g.detach().float().reshape(-1) for g in gs])


def _grad_sqnr_hook(layers: dict, ref: dict, label: str):
    def after(i):
        if i != 0:
            return
        for n, st in layers.items():
            g = _weight_grads(st.module)
            if g is None or n not in ref:
                continue
            r = ref[n]
            st.grad_sqnr[label] = sqnr_db(float(r.pow(2).sum()), float((g - r).pow(2).sum()))
    return after


def _measure_candidates(s: Session, info: dict, candidates: dict) -> tuple:
    """Steps 1-2: the high-precision reference, then every candidate on every eligible layer."""
    probe = LayerProbe(s.layers, formats=False, channels=assess)
    ref: dict = {}

    def keep_ref(i):
        if i == 0:
            ref.update({n: g for n, g in ((n, _weight_grads(st.module)) for n, st in info.items()) if g is not None})
    try:
        loss_hp = s.run({}, backward=True, probe=probe, after_backward=keep_ref)
    finally:
        probe.remove()
    for n, st in info.items():
        st.rows = probe.rows[n] // len(s.batches)
        st.channels = probe.channels.get(n)
    eligible = [n for n, st in info.items() if not st.tiny and st.rows > 0]
    loss_all = {}
    for label, recipe in candidates.items():
        probe = LayerProbe(s.layers, formats=True)
        able = [n for n in eligible if runs_recipe(info[n].module, recipe)]  # (fused modules: no rowwise / MX)
        try:
            loss_all[label] = s.run({n: recipe for n in able}, backward=True, probe=probe,
                                    after_backward=_grad_sqnr_hook({n: info[n] for n in able}, ref, label))
        finally:
            probe.remove()
        for n in able:
            info[n].sqnr[label] = probe.sqnr(n)
            info[n].prefs[label] = probe.formats.get(n, {})
    return loss_hp, loss_all, eligible


def _choose_recipes(info: dict, eligible: list, candidates: dict) -> list:
    """Step 3: per layer the candidate of best output SQNR, with AUTO's formats; returns the
    layers no candidate runs on (they leave `eligible`, with the reason)."""
    none = []
    for n in eligible:
        st = info[n]
        runnable = [label for label, r in candidates.items() if runs_recipe(st.module, r)]
        if not runnable:
            st.reason = (f"no candidate recipe runs on {type(st.module).__name__} (its fused norm / activation casts "
                         f"have no rowwise or MX layout): left in high precision")
            none.append(n)
            continue
        best = None
        for label in runnable:
            v = st.sqnr.get(label, math.nan)
            if math.isnan(v):
                continue
            if best is None or v > st.sqnr[best] + _TIE_DB:
                best = label
        best = best or runnable[0]
        fmt, formats = formats_of(st.prefs.get(best, {}), candidates[best])
        st.candidate, st.formats = best, formats
        st.recipe = dataclasses.replace(candidates[best], fp8_format=fmt)
    for n in none:
        eligible.remove(n)
    return none


_OPTION = {"tensor": "tensor", "row": "row", "block": "block", "mx": "mx"}  # Granularity value -> cast option
_FIX_RECIPES = {"row": lambda: RowwiseScaling(fp8_format=Format.HYBRID), "block": lambda: BlockScaling(),
                "mx": lambda: MXFP8BlockScaling()}
_FIX_LABELS = {"smooth": "smooth", "row": "rowwise", "block": "block", "mx": "mx"}


def _fix_outliers(info: dict, eligible: list, candidates: dict) -> None:
    """Step 3b (fp8mix.plan.outliers): a layer whose input has outlier channels and whose
    chosen recipe's input cast leaves a channel group below GROUP_SQNR_LIMIT_DB gets the
    first fix in FIX_ORDER that passes, or is kept in high precision (outlier_keep)."""
    for n in eligible:
        st = info[n]
        rep = st.channels
        if rep is None or not rep.has_outliers:
            continue
        fmt = st.formats["input"] if st.formats else st.recipe.format("input")
        opt = option_key(_OPTION.get(str(st.recipe.granularity("input").value), "tensor"), fmt)
        cur = rep.loss.get(opt)
        best = max((v for v in st.sqnr.values() if not math.isnan(v)), default=math.nan)
        if rep.passes(opt) and best >= SQNR_LIMIT_DB:
            st.outlier_note = f"{rep.describe()}: harmless under its {opt} cast ({cur.text()})"
            continue
        if rep.passes(opt):  # the channel groups pass, the layer's output does not under any candidate
            head = f"{rep.describe()}: output SQNR {best:.1f} dB < {SQNR_LIMIT_DB:g} dB under every candidate"
        else:
            head = (f"{rep.describe()}: its {opt} cast leaves {cur.text() if cur else 'no measurement'} "
                    f"(< {GROUP_SQNR_LIMIT_DB:g} dB)")
        can_smooth = smoothable(st.module)
        fixes = fixes_for(st.module, FIX_ORDER)
        for fix in fixes:
            if not rep.passes(fix):
                continue
            if fix == "smooth":  # the candidate as given: AUTO's format was chosen on the unsmoothed input
                st.smooth = True
                st.recipe = candidates[st.candidate]
            else:
                st.recipe = _FIX_RECIPES[fix]()
            st.formats = {r: st.recipe.format(r) for r in ("input", "weight", "grad_output")}
            st.candidate = _FIX_LABELS[fix] if fix != "smooth" else f"{st.candidate}+smooth"
            st.outlier_note = f"{head}; {_FIX_LABELS[fix]} fixes it ({rep.loss[fix].text()})"
            break
        else:
            tried = ", ".join(f"{f} {rep.loss[f].worst_group_db:.1f} dB" for f in fixes if f in rep.loss)
            if not can_smooth and rep.passes("smooth"):
                tried += (f"; smoothing would give {rep.loss['smooth'].worst_group_db:.1f} dB but "
                          f"{type(st.module).__name__} has no fp8_smooth")
            st.outlier_keep = True
            st.outlier_note = f"{head}, and no finer cast passes ({tried}): kept in high precision"


def _smoothed(info: dict, names) -> frozenset:
    return frozenset(n for n in names if info[n].smooth)


def _measure_chosen(s: Session, info: dict, eligible: list) -> float:
    """Step 3's check: every eligible layer under its chosen recipe (forward only), each
    layer's own output SQNR there (key CHOSEN: what the SQNR rule reads); returns the loss."""
    probe = LayerProbe(s.layers, formats=False)
    try:
        loss = s.run({n: info[n].recipe for n in eligible}, probe=probe, smooth=_smoothed(info, eligible))
    finally:
        probe.remove()
    for n in eligible:
        info[n].sqnr[CHOSEN] = probe.sqnr(n)
    return loss


def _measure_costs(s: Session, info: dict, fp8: list, loss_hp: float, loss_mix: Optional[float]) -> None:
    """Step 4: solo increase and keep gain of every layer of `fp8` (forward only);
    loss_mix: the loss with exactly `fp8` in FP8, when already measured."""
    config = {n: info[n].recipe for n in fp8}
    sm = _smoothed(info, fp8)
    if loss_mix is None:
        loss_mix = s.run(config, smooth=sm)
    for n in fp8:
        info[n].solo = s.run({n: info[n].recipe}, smooth=sm & {n}) - loss_hp
        info[n].keep = loss_mix - s.run({k: v for k, v in config.items() if k != n}, smooth=sm - {n})
        info[n].cost = max(info[n].solo, info[n].keep, 0.0)


def _select(info: dict, candidates_ok: list, allowance: float, metric: str) -> list:
    """Step 5: cheapest cost per FLOP first, while the summed cost fits `allowance`."""
    chosen, spent = [], 0.0
    order = sorted(candidates_ok, key=lambda n: (info[n].cost / max(info[n].flops, 1.0), n))
    for n in order:
        st = info[n]
        if metric == "sqnr" or spent + st.cost <= allowance:
            chosen.append(n)
            spent += st.cost if metric == "loss" else 0.0
            sq = st.sqnr[CHOSEN]
            st.reason = (f"cost {st.cost:.3g} fits the budget; output SQNR {sq:.1f} dB" if metric == "loss" else
                         f"output SQNR {sq:.1f} dB >= {SQNR_LIMIT_DB:g} dB")
        else:
            st.reason = f"cost {st.cost:.3g} exceeds the budget left ({allowance - spent:.3g} of {allowance:.3g})"
    return chosen


def _verify(model, held: list, loss_fn, info: dict, chosen: list, budget: float, max_repairs: int,
            notes: list, passes: dict) -> Optional[float]:
    """Step 6: measured increase on the held-out batches, repairing while over budget."""
    with Session(model, held, loss_fn) as v:
        loss_hp = v.run({}, backward=True)
        measured = math.nan
        for attempt in range(max_repairs + 1):
            loss_plan = v.run({n: info[n].recipe for n in chosen}, backward=True, smooth=_smoothed(info, chosen))
            measured = (loss_plan - loss_hp) / loss_hp if loss_hp else math.nan
            if not chosen or not measured > budget or attempt == max_repairs:
                break
            worst = max(chosen, key=lambda n: (info[n].cost, -info[n].sqnr.get(CHOSEN, 0.0)))
            chosen.remove(worst)
            info[worst].reason = (f"moved back by verification: the plan measured {100 * measured:+.3f}% > budget "
                                  f"{100 * budget:.2f}% (highest cost {info[worst].cost:.3g})")
            notes.append(f"verification: {100 * measured:+.3f}% over budget, {worst} kept in high precision")
        passes["forward"] += v.forward
        passes["backward"] += v.backward
    if measured > budget:
        notes.append(f"verification: the plan still measures {100 * measured:+.3f}% > budget "
                     f"{100 * budget:.2f}% after {max_repairs} repair(s)")
    return measured


def search_plan(model: nn.Module, batches, loss_fn: Callable, *, candidates=None, budget: float = DEFAULT_BUDGET,
                metric: str = "loss", heldout=None, max_repairs: int = 3) -> Plan:
    """Measure each linear layer's FP8 sensitivity on `batches` and return a :class:`fp8mix.Plan`
    (the module docstring describes the steps, their cost and the default budget).

    Args:
        model: an nn.Module (converted or not; it is left as it was: converted only for the
            search, and every policy attribute, FP8 state, .grad, mode and random state restored).
        batches: list of batches; loss_fn(model, batch) -> scalar loss tensor.
        candidates: dict label -> recipe or list of recipes (default: delayed, current, block).
        budget: allowed predicted loss increase, a fraction of the high-precision loss.
        metric: "loss" (budgeted loss increase) or "sqnr" (only the SQNR rule: no per-layer
            loss passes, the cheapest search).
        heldout: batches for the verification (default: the last third of `batches`, at
            least one; with a single batch, that batch).
        max_repairs: verification rounds that may move a layer back.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fp8mix.search_plan expects an nn.Module, got {type(model).__name__}")
    candidates = _check(batches, loss_fn, candidates, budget, metric, max_repairs)
    batches = list(batches)
    if heldout is None:
        n_h = max(1, len(batches) // 3) if len(batches) > 1 else 0
        search, held = (batches[:-n_h], batches[-n_h:]) if n_h else (batches, batches)
        if not n_h:
            warnings.warn("fp8mix.search_plan: one batch only; the plan is verified on the batch it was searched "
                          "on (give more batches, or heldout=, for an independent check)", UserWarning, stacklevel=2)
    else:
        search, held = batches, list(heldout)
        if not held:
            raise ValueError("fp8mix.search_plan: heldout must be None or a non-empty list of batches")
    converted_here = not fp8_layers(model)
    if converted_here:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert_model(model)
        if not fp8_layers(model):
            unconvert_model(model)
            raise ValueError(f"fp8mix.search_plan: {type(model).__name__} has no linear layer fp8mix converts")
    try:
        return _search(model, search, held, loss_fn, candidates, float(budget), metric, max_repairs)
    finally:
        if converted_here:
            unconvert_model(model)


def _search(model, search, held, loss_fn, candidates, budget, metric, max_repairs) -> Plan:
    notes: list = []
    with Session(model, search, loss_fn) as s:
        info = {n: _Layer(m) for n, m in s.layers.items()}
        loss_hp, loss_all, eligible = _measure_candidates(s, info, candidates)
        _choose_recipes(info, eligible, candidates)
        _fix_outliers(info, eligible, candidates)
        loss_mix = _measure_chosen(s, info, eligible)
        ok = []
        for n in eligible:
            st = info[n]
            if st.outlier_keep:
                st.reason = st.outlier_note
            elif not st.sqnr[CHOSEN] >= SQNR_LIMIT_DB:
                st.reason = (f"output SQNR {st.sqnr[CHOSEN]:.1f} dB < {SQNR_LIMIT_DB:g} dB under its best recipe "
                             f"({st.candidate} {st.recipe.fp8_format.name})")
            else:
                ok.append(n)
        if metric == "loss" and ok:
            _measure_costs(s, info, ok, loss_hp, loss_mix if len(ok) == len(eligible) else None)
        passes = {"forward": s.forward, "backward": s.backward}
    for st in info.values():
        if st.tiny:
            st.reason = f"fewer than {st.module.fp8_min_features} features: runs in high precision anyway"
        elif st.rows == 0:
            st.reason = "not called on the search batches: no measurement, left in high precision"
    chosen = _select(info, ok, budget * loss_hp, metric)
    measured = _verify(model, held, loss_fn, info, chosen, budget, max_repairs, notes, passes)
    predicted = sum(info[n].cost for n in chosen) / loss_hp if loss_hp else math.nan  # after repairs
    layers = []
    for n, st in info.items():
        fp8 = n in chosen
        reason = st.reason + (f"; {st.outlier_note}" if st.outlier_note and not st.outlier_keep else "")
        rep = st.channels
        layers.append(LayerPlan(name=n, decision="fp8" if fp8 else "keep", reason=reason, smooth=fp8 and st.smooth,
                                channel_spread=rep.spread if rep is not None else math.nan,
                                outlier_channels=rep.outliers if rep is not None else 0,
                                candidate=st.candidate if fp8 else None, recipe=st.recipe if fp8 else None,
                                formats={r: f.name for r, f in st.formats.items()} if fp8 and st.formats else None,
                                flops=st.flops, cost=st.cost, solo_increase=st.solo, keep_gain=st.keep,
                                output_sqnr_db=dict(st.sqnr), grad_sqnr_db=dict(st.grad_sqnr)))
    plan = Plan(layers=layers, metric=metric, budget=budget, loss_hp=loss_hp, loss_all_fp8=loss_all,
                predicted_increase=predicted, measured_increase=measured, passes=passes,
                candidates=dict(candidates), notes=notes)
    plan.fp8_flop_share = plan.flop_share(plan.fp8)
    return plan
