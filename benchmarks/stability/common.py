"""Shared harness of the FP8 stability ablations (benchmarks/stability/exp*.py).

What is here:

* data and models: a tiny byte-level GPT (fp8mix.tools.demo.GPT, 2 layers) on the Python
  standard library's own sources (fp8mix.tools.demo.load_corpus(None): on every machine,
  offline), and an MLP fitting a real photograph shipped inside matplotlib
  (``mpl-data/sample_data/grace_hopper.jpg``: pixel coordinates -> RGB, through fixed
  Fourier features). Every run of a comparison starts from the same initial weights and
  sees the same batches (both drawn from the seed), so variants are compared in pairs.
* the precision of a run (:class:`Variant`): float32, an fp8mix recipe (convert_model +
  fp8_autocast), or an **ablation-only** fake-quantising layer (:class:`FakeQuantLinear`)
  for the cases no fp8mix recipe offers on purpose (scale 1, i.e. no amax scaling).
* fault injection that leaves the float32 function unchanged (:class:`SpikeWrap`,
  :class:`OutlierWrap`), so any loss change comes from the FP8 handling alone.
* :func:`train`: AdamW (or the variant's optimizer), warm-up + cosine learning rate,
  gradient clipping at 1.0, an optional loss scaler, an optional per-step hook and an
  fp8mix.Monitor; returns losses, the final loss (mean of the last 10% of steps), a
  diverged flag, gradient norms, loss-spike count and per-step cast metrics.
* :func:`sweep` (variants x seeds x learning rates, float32 runs cached), :func:`summarize`
  (rows: final loss, relative difference vs float32 in %, divergence rate, metrics),
  :func:`md_table` and the plotting helpers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import statistics
import sys
import time
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix
from fp8mix import grad_stats
from fp8mix.formats import fp8_max
from fp8mix.numerics import quant_stats
from fp8mix.tools import demo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOCS = os.path.join(ROOT, "docs")
PLOTS = os.path.join(DOCS, "stability")
E4M3, E5M2 = fp8mix.Format.E4M3, fp8mix.Format.E5M2

THREADS = 1  # measured on the shared 2-core machine: 1 thread per process is fastest under load


def setup(threads: int = THREADS) -> None:
    torch.set_num_threads(threads)
    os.makedirs(PLOTS, exist_ok=True)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---- run sizes ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Mode:
    """How much to run: steps per run, seeds and learning rates of a sweep."""

    quick: bool
    steps: int
    seeds: tuple
    lrs: tuple
    mlp_steps: int
    monitor_every: int

    @property
    def runs(self) -> int:
        return len(self.seeds) * len(self.lrs)


def mode(quick: bool) -> Mode:
    if quick:
        return Mode(True, steps=100, seeds=(0,), lrs=(3e-3,), mlp_steps=150, monitor_every=10)
    return Mode(False, steps=200, seeds=(0, 1), lrs=(1e-3, 3e-3), mlp_steps=300, monitor_every=10)


# ---- tasks -------------------------------------------------------------------------------
@dataclasses.dataclass
class Task:
    """A model family and its data: build(seed) -> model; batches(seed, steps) -> [(x, y)]."""

    name: str
    build: Callable[[int], nn.Module]
    batches: Callable[[int, int], list]
    loss_fn: Callable
    warmup: int
    desc: str


GPT_CFG = dict(layers=2, d_model=64, heads=4, seq_len=64, batch=8)


@functools.lru_cache(maxsize=1)
def _corpus():
    data, desc = demo.load_corpus(None)
    train_bytes, _ = demo.split_corpus(data, GPT_CFG["seq_len"])
    return train_bytes, desc


def gpt_task() -> Task:
    c = GPT_CFG
    train_bytes, desc = _corpus()

    def build(seed):
        torch.manual_seed(seed)
        return demo.GPT(c["layers"], c["d_model"], c["heads"], c["seq_len"])

    def batches(seed, steps):
        g = torch.Generator().manual_seed(10_000 + seed)
        starts = torch.randint(0, len(train_bytes) - c["seq_len"] - 1, (steps, c["batch"]), generator=g)
        return [demo.batch(train_bytes, s, c["seq_len"], "cpu") for s in starts]

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))

    n = sum(p.numel() for p in build(0).parameters())
    return Task("gpt", build, batches, loss_fn, warmup=10,
                desc=(f"byte-level GPT ({c['layers']} layers, d_model {c['d_model']}, {c['heads']} heads, "
                      f"seq {c['seq_len']}, batch {c['batch']}, {n / 1e3:.0f}k parameters) on {desc}"))


MLP_CFG = dict(side=96, freqs=64, sigma=8.0, hidden=256, batch=512)


@functools.lru_cache(maxsize=1)
def _image():
    import matplotlib
    from PIL import Image

    path = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data", "grace_hopper.jpg")
    img = Image.open(path).convert("RGB")
    w, h = img.size
    side = MLP_CFG["side"]
    img = img.resize((side, round(side * h / w)), Image.BILINEAR)
    t = torch.tensor(list(img.getdata()), dtype=torch.float32).reshape(img.size[1], img.size[0], 3) / 255.0
    H, W = t.shape[:2]
    yy, xx = torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W), indexing="ij")
    coords = torch.stack([xx, yy], -1).reshape(-1, 2)
    g = torch.Generator().manual_seed(1234)
    B = torch.randn(2, MLP_CFG["freqs"], generator=g) * MLP_CFG["sigma"]
    proj = 2 * math.pi * coords @ B
    feats = torch.cat([proj.sin(), proj.cos()], -1)
    return feats, t.reshape(-1, 3), (H, W), path


class MLP(nn.Module):
    """Fourier features (128) -> 256 -> 256 -> 256 -> RGB (the 3-wide head stays high precision:
    fp8mix.Linear keeps layers with fewer than 16 features in high precision)."""

    def __init__(self, d_in: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return self.head(x)


def mlp_task() -> Task:
    feats, rgb, (H, W), path = _image()
    c = MLP_CFG

    def build(seed):
        torch.manual_seed(seed)
        return MLP(feats.shape[1], c["hidden"])

    def batches(seed, steps):
        g = torch.Generator().manual_seed(20_000 + seed)
        idx = torch.randint(0, feats.shape[0], (steps, c["batch"]), generator=g)
        return [(feats[i], rgb[i]) for i in idx]

    def loss_fn(out, y):
        return F.mse_loss(out.float(), y)

    return Task("mlp", build, batches, loss_fn, warmup=10,
                desc=(f"MLP ({feats.shape[1]} Fourier features -> 3x{c['hidden']} ReLU -> RGB, batch {c['batch']}) "
                      f"fitting matplotlib's sample photograph {os.path.basename(path)} ({W}x{H} px)"))


# ---- ablation-only fake quantisation -----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Q:
    """How one tensor role is cast in the ablation layer: format, "unit" (scale = 1: no
    amax scaling, the failure being demonstrated) or "amax" (current per-tensor scaling),
    rounding "nearest" or "stochastic"."""

    fmt: fp8mix.Format
    scale: str = "amax"
    rounding: str = "nearest"

    def label(self) -> str:
        s = f"{self.fmt.name} {'scale=1' if self.scale == 'unit' else 'amax-scaled'}"
        return s + (" SR" if self.rounding == "stochastic" else "")


_ABL = {"monitor": None}  # the monitor of the run in progress (ablation layers have no fp8_autocast)
_ONE = torch.ones((), dtype=torch.float32)


def _fake_quant(t: torch.Tensor, q: Optional[Q], name: str, role: str, feed_grad_stats: bool = False):
    """(dequantised FP8 cast of t per q) -- or t itself for q None -- recording the cast."""
    if q is None:
        return t
    t2 = t.detach().float().contiguous()
    f8 = fp8mix.quantize(t2, q.fmt, scale=_ONE if q.scale == "unit" else None, rounding=q.rounding)
    mon = _ABL["monitor"]
    if mon is not None and mon.sampling:
        mon.record(name, role, t2, f8.data, f8.scale_inv, "tensor", fmt=q.fmt)
    if feed_grad_stats and grad_stats.enabled():  # what fp8mix.Linear's grad_output cast reports
        s = quant_stats(t2, f8)
        grad_stats.add(torch.tensor([s.numel, s.nonzero, s.underflow, s.saturated, s.nonfinite, s.overflow],
                                    dtype=torch.float64))
    return f8.dequantize(torch.float32)


class _FakeQuantFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, layer):
        xd = _fake_quant(x2, layer.q_input, layer.qname, "input")
        wd = _fake_quant(w, layer.q_weight, layer.qname, "weight")
        ctx.save_for_backward(xd, wd)
        ctx.layer = layer
        ctx.has_bias = b is not None
        y = xd @ wd.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xd, wd = ctx.saved_tensors
        layer = ctx.layer
        gd = _fake_quant(dy, layer.q_grad, layer.qname, "grad_output", feed_grad_stats=True)
        dx = gd @ wd
        dw = gd.t() @ xd
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None


class FakeQuantLinear(nn.Linear):
    """ABLATION-ONLY construct, not an fp8mix recipe: an nn.Linear whose input, weight and
    grad_output are rounded through fp8mix.quantize (bit-exact FP8) per role -- including
    scale = 1, which no fp8mix recipe does -- and whose products are computed from the
    dequantised values in float32 (an FP8 GEMM with float32 accumulation). A role whose
    Q is None stays float32. Layers under 16 features stay float32, as fp8mix.Linear."""

    def forward(self, x):
        if min(self.in_features, self.out_features) < fp8mix.Linear.fp8_min_features:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(-1, self.in_features)
        y = _FakeQuantFn.apply(x2, self.weight, self.bias, self)
        return y.reshape(*x.shape[:-1], self.out_features)


def fake_quantize_model(model: nn.Module, q_input: Optional[Q], q_weight: Optional[Q], q_grad: Optional[Q]):
    """Every nn.Linear of `model` becomes a FakeQuantLinear (same Parameters), in place."""
    for name, m in list(model.named_modules()):
        for cname, child in list(m.named_children()):
            if type(child) is nn.Linear:
                new = FakeQuantLinear.__new__(FakeQuantLinear)
                nn.Module.__init__(new)
                new.in_features, new.out_features = child.in_features, child.out_features
                new.weight, new.bias = child.weight, child.bias
                new.q_input, new.q_weight, new.q_grad = q_input, q_weight, q_grad
                new.qname = f"{name}.{cname}" if name else cname
                setattr(m, cname, new)
    return model


# ---- fault injection that keeps the float32 function ---------------------------------------
class SpikeWrap(nn.Module):
    """Multiplies the input of `lin` by `factor` and undoes it after the layer:
    (lin(f x) + (f-1) b) / f == W x + b in exact arithmetic (and bit for bit in float32
    for powers of two without bias). The FP8 casts see the input's amax jump by f; the
    float32 reference does not change. Backward: the layer's grad_output is divided by f,
    its weight gradient (x f)(dy / f) is unchanged."""

    def __init__(self, lin: nn.Module):
        super().__init__()
        self.lin = lin
        self.factor = 1.0

    def forward(self, x):
        f = self.factor
        if f == 1.0:
            return self.lin(x)
        y = self.lin(x * f)
        if self.lin.bias is not None:
            y = y + (f - 1.0) * self.lin.bias
        return y / f


class OutlierWrap(nn.Module):
    """Adds one extra input channel to `lin` (inserted at index `channel`, so it shares a
    1x128 tile with 127 real channels) that is 0 everywhere except at sequence position
    0 of every row, where it is `k` times the rms of the real input ("massive
    activations" at the first token). Its weight column is 0 and stays 0 (gradient
    masked), so the float32 function is unchanged; an FP8 cast of the input sees an amax
    `k` times the typical value."""

    def __init__(self, lin: nn.Linear, k: float, channel: int = 5):
        super().__init__()
        new = nn.Linear(lin.in_features + 1, lin.out_features, bias=lin.bias is not None)
        with torch.no_grad():
            new.weight.zero_()
            new.weight[:, :channel] = lin.weight[:, :channel]
            new.weight[:, channel + 1:] = lin.weight[:, channel:]
            if lin.bias is not None:
                new.bias.copy_(lin.bias)
        mask = torch.ones_like(new.weight)
        mask[:, channel] = 0
        new.weight.register_hook(lambda g: g * mask)
        self.lin, self.k, self.channel = new, k, channel

    def forward(self, x):  # x: (B, T, C)
        extra = torch.zeros(*x.shape[:-1], 1, dtype=x.dtype)
        if self.k:
            rms = x.detach().float().pow(2).mean().sqrt()
            extra[:, 0, 0] = self.k * rms
        c = self.channel
        return self.lin(torch.cat([x[..., :c], extra, x[..., c:]], -1))


def wrap_linears(model: nn.Module, suffixes: tuple, factory) -> list:
    """Replace every nn.Linear whose qualified name ends with one of `suffixes` by
    factory(linear); returns the wrappers."""
    out = []
    for name, m in list(model.named_modules()):
        for cname, child in list(m.named_children()):
            full = f"{name}.{cname}" if name else cname
            if isinstance(child, nn.Linear) and full.endswith(suffixes):
                w = factory(child)
                setattr(m, cname, w)
                out.append(w)
    return out


# ---- loss scalers --------------------------------------------------------------------------
class StaticScaler:
    """A constant loss scale with torch.amp.GradScaler's calls (scale, unscale_, step,
    update); skips a step whose gradients are not finite."""

    def __init__(self, scale: float):
        self.s = float(scale)
        self._unscaled = False
        self._ok = True

    def scale(self, loss):
        return loss * self.s

    def unscale_(self, opt):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        for g in grads:
            g.mul_(1.0 / self.s)
        self._ok = all(bool(torch.isfinite(g).all()) for g in grads)
        self._unscaled = True

    def step(self, opt):
        if not self._unscaled:
            self.unscale_(opt)
        if self._ok:
            opt.step()

    def update(self):
        self._unscaled = False

    def get_scale(self):
        return self.s

    def close(self):
        pass


# ---- variants --------------------------------------------------------------------------------
@dataclasses.dataclass
class Variant:
    """One precision configuration of a comparison.

    kind: "fp32" | "bf16" | "recipe" (fp8mix.convert_model + fp8_autocast(recipe)) |
    "ablation" (FakeQuantLinear with q_input/q_weight/q_grad). inject(model, seed) adds
    fault wrappers (before conversion) and returns a per-step hook(step) or None.
    optimizer(params, lr) builds the optimizer (default torch.optim.AdamW, wd 0.01).
    scaler() builds a loss scaler (or None)."""

    name: str
    kind: str = "fp32"
    recipe: object = None
    q_input: Optional[Q] = None
    q_weight: Optional[Q] = None
    q_grad: Optional[Q] = None
    inject: Optional[Callable] = None
    optimizer: Optional[Callable] = None
    scaler: Optional[Callable] = None
    monitor_every: Optional[int] = None  # None: the mode's; 0: no monitor
    on_grads: Optional[Callable] = None  # on_grads(step, model, opt): after clipping, before opt.step
    cache: Optional[str] = None  # runs with the same cache key, task, seed, lr and steps are shared

    def cache_key(self):
        return self.cache


FP32 = Variant("fp32", cache="fp32")


# ---- training ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Run:
    variant: str
    seed: int
    lr: float
    losses: list
    grad_norms: list
    final: float
    diverged: bool
    spikes: int
    metrics: list  # per (step, role): aggregated cast statistics over the layers
    seconds: float
    extra: dict = dataclasses.field(default_factory=dict)


def final_loss(losses: list) -> float:
    n = max(1, len(losses) // 10)
    tail = losses[-n:]
    return sum(tail) / len(tail) if all(math.isfinite(v) for v in tail) else math.nan


def count_spikes(losses: list, warmup: int, window: int = 20, factor: float = 1.25) -> int:
    """Steps whose loss exceeds `factor` x the median of the `window` steps before it."""
    n = 0
    for i in range(max(warmup, window), len(losses)):
        if not math.isfinite(losses[i]):
            return n + 1
        med = statistics.median(losses[i - window:i])
        if losses[i] > factor * med:
            n += 1
    return n


def aggregate_records(records: list) -> list:
    """Monitor rows -> one row per (step, role) over the layers: fractions from the summed
    counts (underflow / saturated / overflow / subnormal over the non-zero values; "zero"
    = entries that are 0 after the cast, over all entries), mean SQNR and kurtosis, max amax
    and max saturation fraction of any layer, mean scale."""
    by = {}
    for r in records:
        by.setdefault((r["step"], r["role"]), []).append(r)
    out = []
    for (step, role), rs in sorted(by.items()):
        def mean(k):
            v = [r[k] for r in rs if r[k] is not None and math.isfinite(r[k])]
            return sum(v) / len(v) if v else math.nan

        def tot(k):
            return float(sum(r[k] for r in rs))
        nz, n = tot("nonzero"), tot("numel")
        out.append({"step": step, "role": role, "layers": len(rs),
                    "underflow_frac": tot("underflow") / nz if nz else math.nan,
                    "saturation_frac": tot("saturated") / nz if nz else math.nan,
                    "max_saturation_frac": max(r["saturation_frac"] for r in rs),
                    "overflow_frac": tot("overflow") / nz if nz else math.nan,
                    "subnormal_frac": tot("subnormal") / nz if nz else math.nan,
                    "zero_frac": 1.0 - (nz - tot("underflow")) / n if n else math.nan,
                    "sqnr_db": mean("sqnr_db"), "kurtosis": mean("kurtosis"),
                    "amax": max(r["amax"] for r in rs), "scale": mean("scale")})
    return out


def _prepare(task: Task, v: Variant, seed: int):
    """(model, context factory, hook) for variant v."""
    model = task.build(seed)
    hook = v.inject(model, seed) if v.inject else None
    if v.kind in ("fp32", "bf16"):
        pass
    elif v.kind == "recipe":
        model = fp8mix.convert_model(model)
    elif v.kind == "ablation":
        fake_quantize_model(model, v.q_input, v.q_weight, v.q_grad)
    else:
        raise ValueError(v.kind)
    return model, hook


def train(task: Task, v: Variant, seed: int, lr: float, steps: int, monitor_every: int = 10,
          on_step: Optional[Callable] = None) -> Run:
    """One training run. Returns a Run; a non-finite loss ends the run (diverged)."""
    t0 = time.perf_counter()
    model, hook = _prepare(task, v, seed)
    batches = task.batches(seed, steps)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (v.optimizer or (lambda ps, lr_: torch.optim.AdamW(ps, lr=lr_, weight_decay=0.01)))(params, lr)
    scaler = v.scaler() if v.scaler else None
    every = monitor_every if v.monitor_every is None else v.monitor_every
    mon = None
    if every and v.kind in ("recipe", "ablation"):
        mon = fp8mix.Monitor(every=every, hist_bins=0, warn=False)
        mon.attach(model)
    _ABL["monitor"] = mon if v.kind == "ablation" else None
    if v.kind == "recipe":
        ctx = functools.partial(fp8mix.fp8_autocast, enabled=True, fp8_recipe=v.recipe, monitor=mon)
    elif v.kind == "bf16":
        ctx = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    else:
        ctx = contextlib.nullcontext
    losses, gnorms, scales = [], [], []
    diverged = False
    try:
        for step, (x, y) in enumerate(batches):
            for g in opt.param_groups:
                g["lr"] = demo.lr_at(step, steps, lr, task.warmup)
            if hook:
                hook(step)
            with ctx():
                loss = task.loss_fn(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
                scaler.step(opt)
                scaler.update()
                scales.append(float(scaler.get_scale()))
            else:
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
                if v.on_grads:
                    v.on_grads(step, model, opt)
                opt.step()
            opt.zero_grad(set_to_none=True)
            if mon is not None:
                mon.step()
            lv = float(loss.detach())
            losses.append(lv)
            gnorms.append(float(gn))
            if on_step:
                on_step(step, model, opt)
            if not math.isfinite(lv):
                diverged = True
                break
    finally:
        _ABL["monitor"] = None
        if scaler is not None and hasattr(scaler, "close"):
            scaler.close()
    fin = final_loss(losses) if not diverged else math.nan
    # no progress at all (the last 10% no lower than the first steps) counts as diverged too
    head = sum(losses[:5]) / max(1, len(losses[:5]))
    if math.isfinite(fin) and fin >= head:
        diverged = True
    run = Run(v.name, seed, lr, losses, gnorms, fin, diverged, count_spikes(losses, task.warmup),
              aggregate_records(mon.records) if mon is not None else [], time.perf_counter() - t0)
    run.extra["records"] = mon.records if mon is not None else []
    run.extra["task"] = task.name
    if scales:
        run.extra["loss_scale"] = scales
        run.extra["scaler"] = scaler
    run.extra["model"] = model
    run.extra["opt"] = opt
    return run


_FP32_CACHE: dict = {}


def sweep(task: Task, variants: list, m: Mode, steps: Optional[int] = None, seeds=None, lrs=None,
          label: str = "") -> dict:
    """Run every variant for every (seed, lr). Returns {variant name: [Run]} with runs in the
    same (seed, lr) order; the plain float32 run is cached across experiments."""
    steps = steps or m.steps
    seeds = seeds or m.seeds
    lrs = lrs or m.lrs
    out = {v.name: [] for v in variants}
    for v in variants:
        for lr in lrs:
            for seed in seeds:
                key = (task.name, v.cache_key(), seed, lr, steps)
                if v.cache_key() and key in _FP32_CACHE:
                    r = _FP32_CACHE[key]
                else:
                    r = train(task, v, seed, lr, steps, m.monitor_every)
                    if v.cache_key():
                        _FP32_CACHE[key] = r
                    log(f"  {label}{task.name} {v.name:<34} seed {seed} lr {lr:g}: final {r.final:.4f}"
                        f"{' DIVERGED' if r.diverged else ''}  ({r.seconds:.1f} s)")
                out[v.name].append(r)
    return out


# ---- summaries and tables ---------------------------------------------------------------------
def rel_diffs(runs: list, ref: list) -> list:
    """Per (seed, lr) pair: 100 (final - final_ref) / final_ref (nan for a diverged run)."""
    return [100.0 * (r.final - b.final) / b.final if math.isfinite(r.final) else math.nan
            for r, b in zip(runs, ref)]


def metric_mean(runs: list, role: str, key: str, steps=None, after: int = 0, layer: Optional[str] = None,
                before: Optional[int] = None) -> float:
    """Mean of an aggregated cast metric of `role` over the runs' sampled steps (optionally
    only the steps in `steps` (a callable run -> set, or a set), or those in [after, before)).
    layer: use only the raw records of the layers whose name contains it (then the count
    fractions are recomputed from their counts)."""
    vals = []
    for r in runs:
        rows = r.metrics if layer is None else aggregate_records(
            [x for x in r.extra.get("records", []) if layer in x["layer"]])
        st = steps(r) if callable(steps) else steps
        for row in rows:
            if before is not None and row["step"] >= before:
                continue
            if st is not None and row["step"] not in st:
                continue
            if row["role"] != role or row["step"] < after:
                continue
            v = row[key]
            if v is not None and math.isfinite(v):
                vals.append(v)
    return sum(vals) / len(vals) if vals else math.nan


def paired(results: dict, a: str, b: str, ref: str = "fp32") -> tuple:
    """Paired comparison of variants a and b over the same (seed, lr) runs: the mean of
    (rel. diff of a) - (rel. diff of b) in points, its standard error (nan for one pair)
    and the number of pairs."""
    ra, rb = rel_diffs(results[a], results[ref]), rel_diffs(results[b], results[ref])
    d = [x - y for x, y in zip(ra, rb) if math.isfinite(x) and math.isfinite(y)]
    if not d:
        return math.nan, math.nan, 0
    mean = sum(d) / len(d)
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
    return mean, se, len(d)


def significant(mean: float, se: float, n: int) -> bool:
    """|mean| beyond two standard errors, with at least 3 pairs."""
    return n >= 3 and math.isfinite(se) and abs(mean) > 2 * se


# points of relative loss: with fewer than 3 runs per variant, smaller differences are not told
# from run-to-run noise (measured spread of equivalent FP8 variants in quick mode: GPT about
# +-1.5, the MLP's image fit about +-5)
QUICK_NOISE = {"gpt": 3.0, "mlp": 10.0}


def compare(results: dict, a: str, b: str, ref: str = "fp32") -> tuple:
    """(text, verdict) for 'a minus b' in points of relative loss: verdict +1 (a worse, beyond
    noise), -1 (a better), 0 (not distinguishable). With >= 3 pairs: two standard errors
    of the paired difference; with fewer: QUICK_NOISE points for the task."""
    mean, se, n = paired(results, a, b, ref)
    noise = QUICK_NOISE.get(results[a][0].extra.get("task"), 3.0)
    if not math.isfinite(mean):
        return "n/a", 0
    if n >= 3:
        sig = significant(mean, se, n)
        txt = f"{mean:+.2f} ± {se:.2f} points ({n} pairs{', significant' if sig else ', within noise'})"
    else:
        sig = abs(mean) > noise
        txt = f"{mean:+.2f} points ({n} pair{'s' if n > 1 else ''}{'' if sig else ', within noise'})"
    return txt, (0 if not sig else (1 if mean > 0 else -1))


def fmt_num(v, spec=".4f"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return format(v, spec)


def fmt_pct(v, digits=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000:
        return f"{v:+.0f}"
    return f"{v:+.{digits}f}"


def summarize(results: dict, ref_name: str = "fp32", metrics: Optional[Callable] = None) -> list:
    """One row per variant: final loss (mean over runs), rel. diff vs the reference in %
    (mean and range over the (seed, lr) pairs), divergence count, loss spikes, and the
    columns metrics(name, runs) returns (a dict)."""
    ref = results[ref_name]
    rows = []
    for name, runs in results.items():
        finals = [r.final for r in runs if math.isfinite(r.final)]
        d = rel_diffs(runs, ref)
        dv = [x for x in d if math.isfinite(x)]
        row = {"variant": name,
               "final loss": fmt_num(sum(finals) / len(finals)) if finals else "diverged",
               "vs fp32 %": (fmt_pct(sum(dv) / len(dv)) if dv else "–") + (
                   f" [{fmt_pct(min(dv))}, {fmt_pct(max(dv))}]" if len(dv) > 1 else ""),
               "diverged": f"{sum(r.diverged for r in runs)}/{len(runs)}",
               "loss spikes": str(sum(r.spikes for r in runs)),
               "_rel": sum(dv) / len(dv) if dv else math.nan,
               "_div": sum(r.diverged for r in runs), "_n": len(runs),
               "_final": sum(finals) / len(finals) if finals else math.nan,
               }
        if metrics:
            row.update(metrics(name, runs))
        rows.append(row)
    return rows


def row_of(rows: list, name: str) -> dict:
    for r in rows:
        if r["variant"] == name:
            return r
    raise KeyError(name)


def rel(rows: list, name: str) -> float:
    """Mean relative difference vs float32 (%) of variant `name` in summarize()'s rows."""
    return row_of(rows, name)["_rel"]


def md_table(rows: list, columns: Optional[list] = None) -> str:
    if not rows:
        return "(no rows)\n"
    cols = columns or [k for k in rows[0].keys() if not k.startswith("_")]

    def numeric(c):
        vals = [str(r.get(c, "")) for r in rows]
        return all(re.fullmatch(r"[-+–]?[\d.,]*(e[-+]?\d+)?x?( \[.*\])?|–|diverged|\d+/\d+|[\d ]+/[\d ]+", v.strip())
                   for v in vals if v.strip())
    out = ["| " + " | ".join(cols) + " |",
           "|" + "|".join("---:" if (i and numeric(c)) else "---" for i, c in enumerate(cols)) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |")
    return "\n".join(out) + "\n"


def pct(v, digits=2):
    """A fraction as a percentage string."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{100 * v:.{digits}f}"


# ---- plots ---------------------------------------------------------------------------------------
def figure(ncols: int, nrows: int = 1, w: float = 5.2, h: float = 3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def smooth(v: list, k: int = 9) -> list:
    out = []
    for i in range(len(v)):
        w = [x for x in v[max(0, i - k + 1):i + 1] if math.isfinite(x)]
        out.append(sum(w) / len(w) if w else math.nan)
    return out


def mean_curve(runs: list, attr: str = "losses") -> list:
    n = max(len(getattr(r, attr)) for r in runs)
    out = []
    for i in range(n):
        v = [getattr(r, attr)[i] for r in runs if i < len(getattr(r, attr)) and math.isfinite(getattr(r, attr)[i])]
        out.append(sum(v) / len(v) if v else math.nan)
    return out


def plot_losses(ax, results: dict, title: str, names=None, ylim=None, logy=False, attr="losses", ylabel=None):
    """Mean (over seeds and learning rates) smoothed training loss per variant."""
    for name in names or results:
        runs = results[name]
        c = smooth(mean_curve(runs, attr))
        style = dict(lw=2.2, color="black") if name == "fp32" else dict(lw=1.3)
        ax.plot(range(len(c)), c, label=name, **style)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or ("training loss (smoothed, mean over runs)"))
    if ylim:
        ax.set_ylim(*ylim)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_metric(ax, results: dict, role: str, key: str, title: str, names=None, scale=100.0, ylabel="%",
                logy=False):
    """An aggregated cast metric of `role` over the sampled steps, first run of each variant."""
    for name in names or results:
        rows = [r for r in results[name][0].metrics if r["role"] == role]
        if not rows:
            continue
        xs = [r["step"] for r in rows]
        ys = [scale * r[key] if r[key] is not None else math.nan for r in rows]
        ax.plot(xs, ys, marker=".", ms=3, lw=1, label=name)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize=7)


def save(fig, name: str) -> str:
    path = os.path.join(PLOTS, name)
    fig.savefig(path, dpi=85)
    return os.path.relpath(path, DOCS)


def write_metrics_csv(results: dict, name: str) -> str:
    """Per variant, sampled step and role: the aggregated cast metrics of the variant's first
    (seed, lr) run (docs/stability/<name>; the first run only, to keep the file small)."""
    import csv

    path = os.path.join(PLOTS, name)
    keys = ["variant", "seed", "lr", "step", "role", "layers", "amax", "scale", "underflow_frac",
            "saturation_frac", "max_saturation_frac", "overflow_frac", "subnormal_frac", "zero_frac", "sqnr_db",
            "kurtosis",
            "loss", "grad_norm"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for vname, runs in results.items():
            for r in runs[:1]:
                for row in r.metrics:
                    s = row["step"]
                    rest = {"variant": vname, "seed": r.seed, "lr": r.lr,
                            "loss": r.losses[s] if s < len(r.losses) else "",
                            "grad_norm": r.grad_norms[s] if s < len(r.grad_norms) else ""}
                    w.writerow([_csv(rest.get(k, row.get(k))) for k in keys])
    return os.path.relpath(path, DOCS)


def _csv(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


@dataclasses.dataclass
class Section:
    """What an experiment hands to run_all: a markdown section and its table rows."""

    key: int
    title: str
    body: str
    rows: list
    plots: list
    seconds: float = 0.0


def runs_text(m: Mode, steps=None, seeds=None, lrs=None, task: Optional[Task] = None) -> str:
    s = steps or m.steps
    se = seeds or m.seeds
    lr = lrs or m.lrs
    return (f"{s} steps x {len(se)} seed(s) {list(se)} x {len(lr)} learning rate(s) "
            f"{[float(x) for x in lr]} = {len(se) * len(lr)} run(s) per variant"
            + (f" ({task.name})" if task else ""))


def python_info() -> str:
    return f"Python {sys.version.split()[0]}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


__all__ = [n for n in dir() if not n.startswith("_")] + ["_ABL", "fp8_max"]
