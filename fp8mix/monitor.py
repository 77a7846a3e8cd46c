"""fp8mix.Monitor: what the FP8 casts of a training run did, per layer, tensor role and step.

Every ``every`` optimizer steps (the monitor is *sampling*), each fp8mix.Linear running
under ``fp8_autocast(monitor=m)`` hands every cast it makes (roles ``"input"`` and
``"weight"`` in forward, ``"grad_output"`` in backward) to :meth:`Monitor.record`, which
keeps one row of plain Python numbers:

    amax, scale            what the recipe scaled by (given by the layer; or derived)
    underflow_frac         non-zero finite values that became 0           } of the non-zero
    subnormal_frac         values whose FP8 value is subnormal (few bits)  } values, from
    saturation_frac        values whose FP8 value is +-max                 } the C kernel
    overflow_frac          values beyond max after scaling (clipped), plus } fp8mix_quant_stats
                           NaN/inf (as QuantStats.overflow_frac)           } (one pass)
    nonfinite, nan         NaN/inf values (the kernel), of which NaN (torch, only when > 0)
    sqnr_db                10 log10(sum x^2 / sum (x - dequant(q))^2) (the kernel)
    kurtosis               E[(x-mu)^4] / E[(x-mu)^2]^2 of the finite values (3 for a Gaussian)
    log2_range             log2(max |x| / min non-zero |x|) over finite x, in binades
    hist                   counts of log2|x * scale| (finite, non-zero) in ``hist_bins``
                           equal bins over ``hist_range`` -- in FP8 units, i.e. after
                           scaling (per element for row/block scales), so the formats'
                           ranges are fixed: E4M3 [2^-9, 448], E5M2 [2^-16, 57344].
                           The first and last bins also hold everything beyond them.

plus step, call (0, 1, ... when a layer runs more than once in a step), layer, role,
fmt, granularity, rows, cols and the raw counts. No tensor is kept. Between samples the
layers do not call the monitor at all, so leaving it on costs one integer test per cast;
a sampled step pays about one extra pass of the kernel and ~10 torch passes per cast
(benchmarks/bench_monitor.py; :attr:`Monitor.seconds` is the time spent in record()).
Appends are under a lock: backward may record from autograd's thread.

Warnings: a :class:`NumericsWarning` (a UserWarning) naming the layer, role and step when
a cast's overflow_frac exceeds ``overflow_warn``, its underflow_frac exceeds
``underflow_warn``, a NaN/inf appears, or its scale_inv is not finite and positive. Each
(layer, role, kind) warns at most once per ``warn_interval`` steps, so that a persistent
problem does not flood the log; every warning also goes to :attr:`Monitor.alerts`
(``warn=False`` keeps the alerts and skips ``warnings.warn``).

Export: :meth:`to_csv`, :meth:`to_json` (read back with :func:`read_csv`, :func:`read_json`),
:meth:`to_tensorboard` (when tensorboard is installed), :meth:`plot` (PNGs, matplotlib)
and :meth:`summary` (a markdown table). Usage::

    mon = fp8mix.Monitor(every=100).attach(model)     # rows named by module path
    for batch in data:
        with fp8mix.fp8_autocast(monitor=mon):
            loss = model(batch).loss
        loss.backward(); opt.step(); opt.zero_grad()
        mon.step()                                     # once per optimizer step
    print(mon.summary()); mon.plot("fp8_plots"); mon.to_csv("fp8.csv")

What it does not do: decide anything (the recipes and the gradient scaler do), or look
at tensors that are not cast to FP8.
"""
from __future__ import annotations

import csv
import json
import math
import os
import threading
import time
import warnings
from typing import Any, Iterable, Optional

import torch

from . import ops
from .formats import GRANULARITIES, Format, format_of_dtype
from .numerics import stats_from_counts

__all__ = ["Monitor", "NumericsWarning", "read_csv", "read_json", "FIELDS", "FP8_RANGES"]


class NumericsWarning(UserWarning):
    """An FP8 cast overflowed, underflowed, met a NaN/inf or a bad scale (fp8mix.Monitor)."""


# Representable magnitudes of each format, in FP8 units (after scaling):
# (min subnormal, min normal, max).
FP8_RANGES = {"E4M3": (2.0 ** -9, 2.0 ** -6, 448.0), "E5M2": (2.0 ** -16, 2.0 ** -14, 57344.0)}

# Columns of a record, in CSV order, by type.
_INT = ("step", "call", "rows", "cols", "numel", "nonzero", "nonfinite", "nan", "underflow", "subnormal",
        "saturated", "overflow")
_FLOAT = ("amax", "scale", "scale_min", "scale_max", "underflow_frac", "subnormal_frac", "saturation_frac",
          "overflow_frac", "sqnr_db", "kurtosis", "log2_range", "min_nonzero")
_STR = ("layer", "role", "fmt", "granularity")
FIELDS = ("step", "call", "layer", "role", "fmt", "granularity", "rows", "cols", "amax", "scale", "scale_min",
          "scale_max", "numel", "nonzero", "nonfinite", "nan", "underflow", "subnormal", "saturated", "overflow",
          "underflow_frac", "subnormal_frac", "saturation_frac", "overflow_frac", "sqnr_db", "kurtosis",
          "log2_range", "min_nonzero", "hist")
_ROLE_ORDER = ("input", "weight", "grad_output")
_STATE_VERSION = 1


def _check_threshold(name: str, v) -> Optional[float]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"fp8mix.Monitor: {name} must be a fraction in [0, 1] or None, got {v!r}")
    return float(v)


def _check_int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"fp8mix.Monitor: {name} must be an int >= {lo}, got {v!r}")
    return v


def _expand_tiles(t: torch.Tensor, rows: int, cols: int, granularity: str) -> torch.Tensor:
    """A per-tile tensor (scale_inv's shape for `granularity`) as one value per element of
    the (rows, cols) view, or a 0-d tensor for per-tensor scaling."""
    if granularity == "tensor":
        return t.reshape(())
    if granularity == "row":
        return t.reshape(rows, 1)
    if granularity == "block":
        return t.reshape(rows, -1).repeat_interleave(128, 1)[:, :cols]
    return t.reshape((rows + 127) // 128, -1).repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]


class Monitor:
    """Numerics monitor of FP8 casts; see the module docstring for what a record holds.

    Args:
        every: sample every `every`-th step (steps 0, every, 2*every, ...).
        overflow_warn: warn when a cast's overflow_frac exceeds this (None: never).
        underflow_warn: warn when a cast's underflow_frac exceeds this (None: never).
        hist_bins: bins of the log2|x*scale| histogram (0: no histograms).
        hist_range: (lo, hi) of the histogram, in log2 of FP8 units.
        log_dir: where :meth:`to_tensorboard` writes by default.
        tensorboard: also write each record to TensorBoard as it is recorded (needs the
            tensorboard package; raises ImportError here when it is missing).
        warn: emit :class:`NumericsWarning` (alerts are kept either way).
        warn_interval: at most one warning per (layer, role, kind) per this many steps.
        max_records: keep only the newest this many records (None: all; a record with a
            histogram of 80 bins is about 1-3 KB of Python objects).
    """

    def __init__(self, every: int = 100, *, overflow_warn: Optional[float] = 1e-3,
                 underflow_warn: Optional[float] = 0.05, hist_bins: int = 80,
                 hist_range: tuple = (-40.0, 20.0), log_dir: Optional[str] = None, tensorboard: bool = False,
                 warn: bool = True, warn_interval: int = 1000, max_records: Optional[int] = None):
        self.every = _check_int("every", every, 1)
        self.overflow_warn = _check_threshold("overflow_warn", overflow_warn)
        self.underflow_warn = _check_threshold("underflow_warn", underflow_warn)
        self.hist_bins = _check_int("hist_bins", hist_bins, 0)
        try:
            lo, hi = (float(v) for v in hist_range)
        except (TypeError, ValueError):
            raise ValueError(f"fp8mix.Monitor: hist_range must be (lo, hi), got {hist_range!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"fp8mix.Monitor: hist_range must be finite with lo < hi, got {hist_range!r}")
        self.hist_range = (lo, hi)
        if not isinstance(warn, bool) or not isinstance(tensorboard, bool):
            raise TypeError("fp8mix.Monitor: warn and tensorboard must be bools")
        self.warn = warn
        self.warn_interval = _check_int("warn_interval", warn_interval, 1)
        self.max_records = None if max_records is None else _check_int("max_records", max_records, 1)
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._tb_lock = threading.Lock()
        self._writer = self._tb_writer(log_dir) if tensorboard else None
        self.reset()

    # ---- state ---------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every record, note and alert, and start again at step 0."""
        with self._lock:
            self._step = 0
            self._records: list = []
            self._events: list = []
            self._alerts: list = []
            self._last_warned: dict = {}  # (layer, role, kind) -> step of the last warning
            self._calls: dict = {}  # (layer, role) -> (step, calls recorded in that step)
            self.seconds = 0.0  # wall time spent in record(), for measuring the overhead

    @property
    def global_step(self) -> int:
        """Optimizer steps counted by :meth:`step` so far."""
        return self._step

    @property
    def sampling(self) -> bool:
        """True on the steps whose casts are recorded (step % every == 0)."""
        return self._step % self.every == 0

    def step(self) -> int:
        """Advance the step counter; call once per optimizer step, after backward."""
        with self._lock:
            self._step += 1
            return self._step

    @property
    def records(self) -> list:
        """The records so far (a new list of the row dicts), oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def events(self) -> list:
        """Notes from :meth:`note` (e.g. format decisions): dicts step, layer, role, key, value."""
        with self._lock:
            return list(self._events)

    @property
    def alerts(self) -> list:
        """Warnings raised (rate-limited as the warnings): dicts step, layer, role, kind, message."""
        with self._lock:
            return list(self._alerts)

    def attach(self, model: torch.nn.Module) -> "Monitor":
        """Name every fp8mix.Linear in `model` by its module path (records' ``layer``)."""
        from .nn.fp8_state import FP8StateMixin as Linear

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"fp8mix.Monitor.attach: expected an nn.Module, got {type(model).__name__}")
        for name, m in model.named_modules():
            if isinstance(m, Linear):
                m._fp8_name = name or type(model).__name__
        return self

    def state_dict(self) -> dict:
        """The step counter, records, notes, alerts and warning clock (plain Python objects,
        loadable with ``torch.load(weights_only=True)``)."""
        with self._lock:
            return {"version": _STATE_VERSION, "step": self._step,
                    "records": [dict(r, hist=list(r["hist"])) for r in self._records],
                    "events": [dict(e) for e in self._events], "alerts": [dict(a) for a in self._alerts],
                    "last_warned": [[k[0], k[1], k[2], s] for k, s in self._last_warned.items()],
                    "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (the configuration stays this monitor's)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError("fp8mix.Monitor.load_state_dict: not a Monitor state_dict (version "
                             f"{state.get('version') if isinstance(state, dict) else None!r}, "
                             f"expected {_STATE_VERSION})")
        missing = [k for k in ("step", "records", "events", "alerts", "last_warned") if k not in state]
        if missing:
            raise ValueError(f"fp8mix.Monitor.load_state_dict: missing keys {missing}")
        with self._lock:
            self._step = int(state["step"])
            self._records = [dict(r, hist=list(r["hist"])) for r in state["records"]]
            self._events = [dict(e) for e in state["events"]]
            self._alerts = [dict(a) for a in state["alerts"]]
            self._last_warned = {(k[0], k[1], k[2]): int(k[3]) for k in state["last_warned"]}
            self._calls = {}
            self.seconds = float(state.get("seconds", 0.0))

    def __repr__(self) -> str:
        return (f"Monitor(every={self.every}, step={self._step}, records={len(self._records)}, "
                f"alerts={len(self._alerts)})")

    # ---- recording -----------------------------------------------------------------
    def note(self, layer_name: str, role: str, key: str, value: Any) -> None:
        """Keep an event of this step (e.g. key "format", value "E5M2 (reason ...)")."""
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            value = str(value)
        with self._lock:
            self._events.append({"step": self._step, "layer": str(layer_name), "role": str(role),
                                 "key": str(key), "value": value})

    def record(self, layer_name: str, role: str, x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor,
               granularity: str = "tensor", *, fmt=None, scale: Optional[torch.Tensor] = None,
               amax: Optional[torch.Tensor] = None) -> dict:
        """Record one cast: `x` (high precision) became `q` (a torch.float8 tensor of the same
        shape) with dequantisation factors `scale_inv` laid out for `granularity`, as a
        Float8Tensor holds them. `fmt` (optional) must agree with q's dtype; `scale` and
        `amax` (optional) are what the recipe used, else they are derived (scale from
        scale_inv when it is one number, amax from x). Returns the new row."""
        t0 = time.perf_counter()
        if not isinstance(x, torch.Tensor) or not isinstance(q, torch.Tensor):
            raise TypeError("fp8mix.Monitor.record: x and q must be tensors")
        fmt_name = format_of_dtype(q.dtype).name  # TypeError for a non-FP8 q
        if isinstance(fmt, Format) and fmt in (Format.E4M3, Format.E5M2) and fmt.name != fmt_name:
            raise ValueError(f"fp8mix.Monitor.record: fmt={fmt!r} but q is {q.dtype}")
        if x.shape != q.shape:
            raise ValueError(f"fp8mix.Monitor.record: x has shape {tuple(x.shape)} but q has {tuple(q.shape)}")
        if granularity not in GRANULARITIES:
            raise ValueError(f"fp8mix.Monitor.record: granularity must be one of {list(GRANULARITIES)}, "
                             f"got {granularity!r}")
        if not isinstance(scale_inv, torch.Tensor):
            scale_inv = torch.tensor(float(scale_inv), dtype=torch.float32)
        layer_name, role = str(layer_name), str(role)
        with torch.no_grad():
            row = self._measure(x.detach(), q.detach(), scale_inv.detach().float(), granularity, fmt_name,
                                scale, amax)
        row["layer"], row["role"] = layer_name, role
        bad_scale = row.pop("bad_scale")
        with self._lock:
            step = self._step
            last_step, n = self._calls.get((layer_name, role), (None, 0))
            call = n if last_step == step else 0
            self._calls[(layer_name, role)] = (step, call + 1)
            row["step"], row["call"] = step, call
            row = {k: row[k] for k in FIELDS}
            self._records.append(row)
            if self.max_records is not None and len(self._records) > self.max_records:
                del self._records[: len(self._records) - self.max_records]
            alerts = self._check(row, bad_scale)
        if self._writer is not None:
            self._write_tb(self._writer, [row])
        for a in alerts:
            if self.warn:
                warnings.warn(a["message"], NumericsWarning, stacklevel=2)
        with self._lock:
            self.seconds += time.perf_counter() - t0
        return dict(row)

    def _measure(self, x, q, sinv, granularity, fmt_name, scale, amax) -> dict:
        """The row's numbers (no step/call/layer/role yet). The counts and the SQNR come from
        one pass of the C kernel; kurtosis, range and histogram from torch."""
        if x.dim() == 0:
            x, q = x.reshape(1, 1), q.reshape(1, 1)
        cols = x.shape[-1]
        rows = math.prod(x.shape[:-1])
        x2, q2 = x.reshape(rows, cols), q.reshape(rows, cols)
        if x2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            x2 = x2.float()
        row = {"fmt": fmt_name, "granularity": granularity, "rows": rows, "cols": cols}

        bad_scale = not bool((torch.isfinite(sinv) & (sinv > 0)).all())  # False for no scales
        sinv_ok = torch.where(torch.isfinite(sinv) & (sinv > 0), sinv, torch.ones_like(sinv)) if bad_scale \
            else sinv
        st = stats_from_counts(ops.quant_stats(x2, q2, sinv_ok.contiguous(), GRANULARITIES[granularity]))
        nz = st.nonzero
        row.update(numel=int(st.numel), nonzero=int(nz), nonfinite=int(st.nonfinite), underflow=int(st.underflow),
                   subnormal=int(st.subnormal), saturated=int(st.saturated), overflow=int(st.overflow),
                   underflow_frac=st.underflow_frac, subnormal_frac=st.subnormal / nz if nz else 0.0,
                   saturation_frac=st.saturation_frac, overflow_frac=st.overflow_frac,
                   sqnr_db=math.nan if bad_scale else st.sqnr_db, min_nonzero=st.min_nonzero)
        row["bad_scale"] = bad_scale

        # scale and amax: as the recipe gave them, else derived
        if sinv.numel():
            smax, smin = float(sinv.max()), float(sinv.min())
            row["scale_min"] = 1.0 / smax if smax > 0 else math.nan
            row["scale_max"] = 1.0 / smin if smin > 0 else math.nan
        else:
            row["scale_min"] = row["scale_max"] = math.nan
        if scale is not None:
            row["scale"] = float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)
        elif sinv.numel() == 1:
            row["scale"] = row["scale_min"]
        else:
            row["scale"] = math.nan  # one scale per tile: see scale_min / scale_max
        # torch side, over the finite values only
        xf = x2.float()
        ax = xf.abs()
        fin = torch.isfinite(xf) if st.nonfinite else None
        row["nan"] = int(torch.isnan(xf).sum()) if st.nonfinite else 0
        vals, ax_f = (xf[fin], ax[fin]) if fin is not None else (xf.reshape(-1), ax.reshape(-1))
        amax_fin = float(ax_f.max()) if ax_f.numel() else 0.0
        if amax is not None:
            a = amax.detach() if isinstance(amax, torch.Tensor) else torch.tensor(float(amax))
            row["amax"] = float(a.float().max()) if a.numel() else 0.0
        else:  # as fp8mix.amax: NaN if any NaN, else inf if any inf
            row["amax"] = math.nan if row["nan"] else math.inf if st.nonfinite else amax_fin
        row["log2_range"] = math.log2(amax_fin / st.min_nonzero) if amax_fin > 0 and \
            math.isfinite(st.min_nonzero) else 0.0
        row["kurtosis"] = math.nan
        n = vals.numel()
        if amax_fin > 0 and n >= 2:
            d = vals - vals.mean()
            if not 2.0 ** -20 < amax_fin < 2.0 ** 20:  # keep d^4 inside float32's range
                d.mul_(1.0 / amax_fin)
            m2 = float(torch.dot(d, d)) / n
            d.square_()
            m4 = float(torch.dot(d, d)) / n
            if m2 > 0:
                row["kurtosis"] = m4 / (m2 * m2)
        row["hist"] = [0] * self.hist_bins
        if self.hist_bins and x2.numel():
            lo, hi = self.hist_range
            # bin position (log2|x| + log2(scale) - lo) * bins / (hi - lo), per element
            lg = torch.log2(ax)  # zeros: -inf, which clamps into the first bin and is taken out
            if granularity == "tensor":
                lg.sub_(math.log2(float(sinv_ok.reshape(-1)[0])) + lo)
            else:
                lg.sub_(_expand_tiles(torch.log2(sinv_ok) + lo, rows, cols, granularity))
            lg = lg[fin] if fin is not None else lg.reshape(-1)
            idx = lg.mul_(self.hist_bins / (hi - lo)).clamp_(0, self.hist_bins - 1).to(torch.int32)  # floor
            h = torch.bincount(idx, minlength=self.hist_bins)  # int64 counts (histc counts in float32)
            h[0] -= int(st.numel - st.nonzero)  # the zeros (finite by definition)
            row["hist"] = h.tolist()
        return row

    def _check(self, row: dict, bad_scale: bool) -> list:
        """Alerts for `row` (called with the lock held); updates the warning clock."""
        found = []
        where = f"layer {row['layer']!r} {row['role']} (step {row['step']}, {row['fmt']}"
        if row["nonfinite"]:
            found.append(("nonfinite", f"{where}): {row['nonfinite']} non-finite values "
                                       f"({row['nan']} NaN, {row['nonfinite'] - row['nan']} inf) of {row['numel']}"))
        if bad_scale:
            found.append(("scale", f"{where}): scale_inv not finite and positive; counts use 1 there"))
        if self.overflow_warn is not None and row["overflow_frac"] > self.overflow_warn:
            found.append(("overflow", f"{where}): {100 * row['overflow_frac']:.3g}% of non-zero values overflowed "
                                      f"(clipped to max or not finite; threshold {100 * self.overflow_warn:.3g}%), "
                                      f"amax {row['amax']:.4g}, scale {row['scale']:.4g}"))
        if self.underflow_warn is not None and row["underflow_frac"] > self.underflow_warn:
            found.append(("underflow", f"{where}): {100 * row['underflow_frac']:.3g}% of non-zero values "
                                       f"underflowed to 0 (threshold {100 * self.underflow_warn:.3g}%), "
                                       f"log2 range {row['log2_range']:.1f} binades"))
        out = []
        for kind, msg in found:
            key = (row["layer"], row["role"], kind)
            last = self._last_warned.get(key)
            if last is not None and row["step"] - last < self.warn_interval:
                continue
            self._last_warned[key] = row["step"]
            a = {"step": row["step"], "layer": row["layer"], "role": row["role"], "kind": kind,
                 "message": "fp8mix: " + msg}
            self._alerts.append(a)
            out.append(a)
        return out

    # ---- export --------------------------------------------------------------------
    def to_csv(self, path: str) -> str:
        """Write the records as CSV (one row each, columns FIELDS; hist as space-separated
        counts over this monitor's hist_range). Returns `path`."""
        rows = self.records
        _makedirs_for(path)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(FIELDS)
            for r in rows:
                w.writerow([" ".join(str(c) for c in r["hist"]) if k == "hist" else
                            repr(r[k]) if isinstance(r[k], float) else r[k] for k in FIELDS])
        return path

    def to_json(self, path: str) -> str:
        """Write records, notes, alerts and the histogram's bins as JSON (strict: non-finite
        floats as the strings "inf", "-inf", "nan"). Returns `path`."""
        with self._lock:
            doc = {"version": _STATE_VERSION, "step": self._step, "every": self.every,
                   "hist_range": list(self.hist_range), "hist_bins": self.hist_bins,
                   "fields": list(FIELDS), "records": list(self._records), "events": list(self._events),
                   "alerts": list(self._alerts)}
        _makedirs_for(path)
        with open(path, "w") as f:
            json.dump(_json_safe(doc), f, allow_nan=False)
        return path

    @staticmethod
    def _tb_writer(log_dir):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("fp8mix.Monitor: TensorBoard export needs the tensorboard package "
                              f"(pip install tensorboard); importing torch.utils.tensorboard failed: {e}") from None
        return SummaryWriter(log_dir=log_dir)

    def _write_tb(self, writer, rows: Iterable[dict]) -> None:
        lo, hi = self.hist_range
        for r in rows:
            tag, s = f"fp8/{r['layer']}/{r['role']}", r["step"]
            with self._tb_lock:
                for k in ("amax", "scale", "underflow_frac", "subnormal_frac", "saturation_frac", "overflow_frac",
                          "sqnr_db", "kurtosis", "log2_range"):
                    if math.isfinite(r[k]):
                        writer.add_scalar(f"{tag}/{k}", r[k], s)
                n = sum(r["hist"])
                if n:
                    w = (hi - lo) / len(r["hist"])
                    centres = [lo + (i + 0.5) * w for i in range(len(r["hist"]))]
                    used = [i for i, c in enumerate(r["hist"]) if c]
                    writer.add_histogram_raw(
                        f"{tag}/log2_abs_scaled", min=centres[used[0]], max=centres[used[-1]], num=n,
                        sum=sum(c * m for c, m in zip(r["hist"], centres)),
                        sum_squares=sum(c * m * m for c, m in zip(r["hist"], centres)),
                        bucket_limits=[lo + (i + 1) * w for i in range(len(r["hist"]))],
                        bucket_counts=r["hist"], global_step=s)

    def to_tensorboard(self, log_dir: Optional[str] = None) -> str:
        """Write every record so far to TensorBoard under `log_dir` (default: the monitor's
        log_dir, else TensorBoard's runs/<date>): scalars ``fp8/<layer>/<role>/<field>``
        and the log2|x*scale| histogram. Returns the directory. ImportError without the
        tensorboard package."""
        writer = self._tb_writer(log_dir if log_dir is not None else self.log_dir)
        try:
            self._write_tb(writer, self.records)
        finally:
            writer.close()
        return writer.log_dir

    def close(self) -> None:
        """Flush and close the TensorBoard writer of ``tensorboard=True`` (if any)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ---- reports -------------------------------------------------------------------
    def _series(self) -> dict:
        """(layer, role) -> {step: [rows of that step]}; layers in order of first appearance,
        then roles as input, weight, grad_output, others by name."""
        out: dict = {}
        for r in self.records:
            out.setdefault((r["layer"], r["role"]), {}).setdefault(r["step"], []).append(r)
        first = {}
        for layer, _ in out:
            first.setdefault(layer, len(first))
        return dict(sorted(out.items(), key=lambda kv: (first[kv[0][0]], _role_key(kv[0][1]))))

    def summary(self) -> str:
        """A markdown table: per layer and role, its latest record."""
        series = self._series()
        if not series:
            return f"fp8mix.Monitor: no records (step {self._step}, every {self.every})\n"
        notes: dict = {}
        for e in self.events:
            notes[(e["layer"], e["role"])] = f"{e['key']}: {e['value']}"
        head = ["layer", "role", "step", "fmt", "amax", "scale", "underflow %", "overflow %", "SQNR dB", "kurtosis"]
        if notes:
            head.append("note")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (layer, role), by_step in series.items():
            r = by_step[max(by_step)][-1]
            cells = [layer, role, str(r["step"]), r["fmt"], _g(r["amax"]), _g(r["scale"]),
                     _g(100 * r["underflow_frac"]), _g(100 * r["overflow_frac"]), _g(r["sqnr_db"], ".1f"),
                     _g(r["kurtosis"], ".2f")]
            if notes:
                cells.append(notes.get((layer, role), ""))
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        n_alerts = len(self.alerts)
        lines.append("")
        lines.append(f"{len(self._records)} records over {len({r['step'] for r in self.records})} sampled steps "
                     f"(every {self.every}); {n_alerts} warnings; {self.seconds:.3f} s in record()")
        return "\n".join(lines) + "\n"

    def plot(self, out_dir: str) -> list:
        """Write PNGs to `out_dir` and return their paths: ``amax.png`` (amax per layer over
        steps, one panel per role), ``sqnr.png``, ``flush.png`` (underflow and overflow %),
        and ``hist_<role>.png`` (each layer's latest log2|x*scale| histogram against the
        E4M3 and E5M2 ranges). No records: no files, an empty list."""
        try:
            from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
        except ImportError as e:
            raise ImportError(f"fp8mix.Monitor.plot needs matplotlib (pip install matplotlib): {e}") from None
        series = self._series()
        if not series:
            return []
        os.makedirs(out_dir, exist_ok=True)
        roles = sorted({role for _, role in series}, key=_role_key)
        layers = list(dict.fromkeys(layer for layer, _ in series))
        colours = _colours(len(layers))
        paths = []

        def per_role(fname, panels, ylabel_of, value_of, logy_of):
            fig = Figure(figsize=(5.0 * len(roles), 3.6 * len(panels)), layout="constrained")
            axes = fig.subplots(len(panels), len(roles), squeeze=False)
            for pi, panel in enumerate(panels):
                for ri, role in enumerate(roles):
                    ax = axes[pi][ri]
                    for li, layer in enumerate(layers):
                        by_step = series.get((layer, role))
                        if not by_step:
                            continue
                        pts = [(s, value_of(panel, rs)) for s, rs in sorted(by_step.items())]
                        pts = [(s, v) for s, v in pts if math.isfinite(v)]
                        if pts:
                            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", ms=3, lw=1,
                                    color=colours[li], label=layer)
                    if logy_of(panel) and ax.has_data():
                        ax.set_yscale("log")
                    elif not logy_of(panel) and panel != "sqnr":
                        ax.set_ylim(bottom=0)
                    ax.set_title(f"{role}", fontsize=9)
                    ax.set_xlabel("step")
                    ax.set_ylabel(ylabel_of(panel))
                    ax.grid(alpha=0.3)
            _legend(fig, axes, len(layers))
            p = os.path.join(out_dir, fname)
            fig.savefig(p, dpi=90)
            paths.append(p)

        per_role("amax.png", ["amax"], lambda _: "amax (max over calls)",
                 lambda _, rs: max(r["amax"] for r in rs), lambda _: True)
        per_role("sqnr.png", ["sqnr"], lambda _: "SQNR dB (worst call)",
                 lambda _, rs: min(r["sqnr_db"] for r in rs), lambda _: False)
        per_role("flush.png", ["underflow_frac", "overflow_frac"],
                 lambda k: ("underflow" if k.startswith("under") else "overflow") + " % of non-zero",
                 lambda k, rs: 100 * max(r[k] for r in rs), lambda _: False)
        if self.hist_bins:
            lo, hi = self.hist_range
            w = (hi - lo) / self.hist_bins
            edges = [lo + i * w for i in range(self.hist_bins + 1)]
            for role in roles:
                fig = Figure(figsize=(8.0, 4.2), layout="constrained")
                ax = fig.subplots()
                for name, colour in (("E5M2", "tab:orange"), ("E4M3", "tab:blue")):
                    mn, mnorm, mx = FP8_RANGES[name]
                    ax.axvspan(math.log2(mn), math.log2(mnorm), color=colour, alpha=0.07)
                    ax.axvspan(math.log2(mnorm), math.log2(mx), color=colour, alpha=0.15,
                               label=f"{name} [2^{math.log2(mn):.0f}, {mx:g}] (pale: subnormal)")
                steps = set()
                for li, layer in enumerate(layers):
                    by_step = series.get((layer, role))
                    if not by_step:
                        continue
                    s = max(by_step)
                    h = [sum(c) for c in zip(*(r["hist"] for r in by_step[s]))]
                    n = sum(h)
                    if not n:
                        continue
                    steps.add(s)
                    ax.stairs([c / n for c in h], edges, color=colours[li], label=f"{layer} ({by_step[s][-1]['fmt']})")
                ax.set_xlim(lo, hi)
                ax.set_xlabel("log2 |x * scale|  (FP8 units; first/last bin hold everything beyond)")
                ax.set_ylabel("fraction of non-zero values")
                ax.set_title(f"{role}: latest sample per layer (step {_steps_text(steps)})", fontsize=9)
                ax.grid(alpha=0.3)
                if len(layers) <= 16:
                    ax.legend(fontsize=7, loc="upper left")
                p = os.path.join(out_dir, f"hist_{role}.png")
                fig.savefig(p, dpi=90)
                paths.append(p)
        return paths


# ---- helpers ---------------------------------------------------------------------------
def _role_key(role: str) -> tuple:
    return (_ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER), role)


def _g(v: float, spec: str = ".4g") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else str(v)


def _steps_text(steps: set) -> str:
    return ", ".join(str(s) for s in sorted(steps)) if len(steps) <= 3 else f"{min(steps)}..{max(steps)}"


def _colours(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    return [cmap(i if n <= 20 else i / max(n - 1, 1)) for i in range(n)]


def _legend(fig, axes, n_layers: int) -> None:
    if n_layers > 16:  # unreadable; the CSV has the names
        return
    for row in axes:
        for ax in row:
            if ax.has_data():
                ax.legend(fontsize=7)
                return


def _makedirs_for(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)


def _json_safe(o):
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


def _typed(r: dict) -> dict:
    """A record read back from CSV/JSON with the types it was written with."""
    out = {}
    for k in FIELDS:
        v = r[k]
        if k in _INT:
            out[k] = int(v)
        elif k in _FLOAT:
            out[k] = float(v)
        elif k == "hist":
            out[k] = [int(c) for c in v.split()] if isinstance(v, str) else [int(c) for c in v]
        else:
            out[k] = str(v)
    return out


def read_csv(path: str) -> list:
    """The records a :meth:`Monitor.to_csv` file holds, as typed dicts."""
    with open(path, newline="") as f:
        return [_typed(r) for r in csv.DictReader(f)]


def read_json(path: str) -> dict:
    """What :meth:`Monitor.to_json` wrote, with records typed (non-finite floats restored)."""
    with open(path) as f:
        doc = json.load(f)
    doc["records"] = [_typed(r) for r in doc["records"]]
    return doc
