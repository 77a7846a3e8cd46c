"""fp8mix.Monitor: recording (one row of plain numbers per FP8 cast on the sampled steps),
its state, and the alerts it raises. What a row holds is described in the package
docstring (fp8mix/monitor/__init__.py); the numbers come from one call of the C
statistics kernel (fp8mix.numerics.measure) and one host read per record. Export, plots
and reports live beside this file and are reached through the Monitor's methods."""
from __future__ import annotations

import math
import threading
import time
import warnings
from typing import Any, Optional

import torch

from .. import numerics
from ..formats import GRANULARITIES, Format, format_of_dtype
from . import alerts, export, plots, report
from .fields import FIELDS, STATE_VERSION

__all__ = ["Monitor"]

_LO, _HI = numerics.HIST_MIN_LOG2, numerics.HIST_MIN_LOG2 + numerics.HIST_BINS  # the kernel's histogram span
_HALF = (torch.float32, torch.bfloat16, torch.float16)  # the element types the kernel reads


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


def _check_hist(bins: int, hist_range) -> tuple:
    """(lo, hi) as ints: whole binades within the kernel's span, a whole number per bin."""
    try:
        lo, hi = (float(v) for v in hist_range)
    except (TypeError, ValueError):
        raise ValueError(f"fp8mix.Monitor: hist_range must be (lo, hi), got {hist_range!r}") from None
    if not (lo.is_integer() and hi.is_integer() and _LO <= lo < hi <= _HI):
        raise ValueError(f"fp8mix.Monitor: hist_range must be whole binades with {_LO} <= lo < hi <= {_HI} "
                         f"(log2 of FP8 units), got {hist_range!r}")
    if bins and (hi - lo) % bins:
        raise ValueError(f"fp8mix.Monitor: hist_bins must divide hist_range's {int(hi - lo)} binades "
                         f"(each bin a whole number of binades), got {bins}")
    return int(lo), int(hi)


def _rebin(hist: tuple, bins: int, lo: int, hi: int) -> list:
    """The kernel's one-binade bins (numerics.HIST_MIN_LOG2 ...) as `bins` bins over [lo, hi):
    everything below lo in the first, at or above hi in the last."""
    out = [0] * bins
    width = (hi - lo) // bins
    for b, c in enumerate(hist):
        if c:
            k = (b + _LO - lo) // width
            out[min(max(k, 0), bins - 1)] += c
    return out


def _scalar(v) -> float:
    """A recipe-given scale or amax as a float (tiles: the first scale, the max amax)."""
    if not isinstance(v, torch.Tensor):
        return float(v)
    return float(v.detach().reshape(-1)[0])


class Monitor:
    """Numerics monitor of FP8 casts; see the package docstring for what a record holds.

    Args:
        every: sample every `every`-th step (steps 0, every, 2*every, ...).
        overflow_warn: warn when a cast's overflow_frac exceeds this (None: never).
        underflow_warn: warn when a cast's underflow_frac exceeds this (None: never).
        hist_bins: bins of the log2|x*scale| histogram (0: no histograms); must divide
            hist_range's width (each bin is a whole number of binades).
        hist_range: (lo, hi) of the histogram in log2 of FP8 units, whole numbers within
            [-47, 17] (the kernel's span); the default is one bin per binade over all of it.
        log_dir: where :meth:`to_tensorboard` writes by default.
        tensorboard: also write each record to TensorBoard as it is recorded (needs the
            tensorboard package; raises ImportError here when it is missing).
        warn: emit :class:`NumericsWarning` (alerts are kept either way).
        warn_interval: at most one warning per (layer, role, kind) per this many steps.
        max_records: keep only the newest this many records (None: all; a record with a
            histogram of 64 bins is about 1-3 KB of Python objects).
    """

    def __init__(self, every: int = 100, *, overflow_warn: Optional[float] = 1e-3,
                 underflow_warn: Optional[float] = 0.05, hist_bins: int = 64,
                 hist_range: tuple = (-47, 17), log_dir: Optional[str] = None, tensorboard: bool = False,
                 warn: bool = True, warn_interval: int = 1000, max_records: Optional[int] = None):
        self.every = _check_int("every", every, 1)
        self.overflow_warn = _check_threshold("overflow_warn", overflow_warn)
        self.underflow_warn = _check_threshold("underflow_warn", underflow_warn)
        self.hist_bins = _check_int("hist_bins", hist_bins, 0)
        self.hist_range = _check_hist(self.hist_bins, hist_range)
        if not isinstance(warn, bool) or not isinstance(tensorboard, bool):
            raise TypeError("fp8mix.Monitor: warn and tensorboard must be bools")
        self.warn = warn
        self.warn_interval = _check_int("warn_interval", warn_interval, 1)
        self.max_records = None if max_records is None else _check_int("max_records", max_records, 1)
        self.log_dir = log_dir
        self._lock = threading.Lock()
        self._tb_lock = threading.Lock()
        self._writer = export.tb_writer(log_dir) if tensorboard else None
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
        """True on the steps whose casts are recorded (step % every == 0). The layers ask
        this before anything else, so an unsampled step costs one integer test per layer."""
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
        from ..nn.fp8_state import FP8StateMixin as Linear

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"fp8mix.Monitor.attach: expected an nn.Module, got {type(model).__name__}")
        for name, m in model.named_modules():
            if isinstance(m, Linear):
                setattr(m, "_fp8_name", name or type(model).__name__)  # a plain attribute, not a submodule
        return self

    def state_dict(self) -> dict:
        """The step counter, records, notes, alerts and warning clock (plain Python objects,
        loadable with ``torch.load(weights_only=True)``)."""
        with self._lock:
            return {"version": STATE_VERSION, "step": self._step,
                    "records": [dict(r, hist=list(r["hist"])) for r in self._records],
                    "events": [dict(e) for e in self._events], "alerts": [dict(a) for a in self._alerts],
                    "last_warned": [[k[0], k[1], k[2], s] for k, s in self._last_warned.items()],
                    "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned (the configuration stays this monitor's)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("fp8mix.Monitor.load_state_dict: not a Monitor state_dict (version "
                             f"{state.get('version') if isinstance(state, dict) else None!r}, "
                             f"expected {STATE_VERSION})")
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
        scale_inv when it is one number, amax from x); each one given costs a host read.
        Returns the new row."""
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
        granularity = str(granularity)  # its name (a row holds plain values: state_dict, CSV, JSON)
        if not isinstance(scale_inv, torch.Tensor):
            scale_inv = torch.tensor(float(scale_inv), dtype=torch.float32)
        with torch.no_grad():
            row = self._measure(x.detach(), q.detach(), scale_inv.detach(), granularity, fmt_name, scale, amax)
        row["layer"], row["role"] = str(layer_name), str(role)
        self._append(row)
        with self._lock:
            self.seconds += time.perf_counter() - t0
        return dict(row)

    def _append(self, row: dict) -> None:
        """Stamp `row` with step and call, keep it, and raise its alerts."""
        bad_scale = row.pop("bad_scale")
        with self._lock:
            step = self._step
            last_step, n = self._calls.get((row["layer"], row["role"]), (None, 0))
            call = n if last_step == step else 0
            self._calls[(row["layer"], row["role"])] = (step, call + 1)
            row["step"], row["call"] = step, call
            row = {k: row[k] for k in FIELDS}
            self._records.append(row)
            if self.max_records is not None and len(self._records) > self.max_records:
                del self._records[: len(self._records) - self.max_records]
            found = alerts.problems(row, bad_scale, self.overflow_warn, self.underflow_warn)
            new = alerts.rate_limited(found, row, self._last_warned, self.warn_interval)
            self._alerts.extend(new)
        if self._writer is not None:
            export.write_tb(self._writer, [row], self.hist_range, self._tb_lock)
        for a in new:
            if self.warn:
                warnings.warn(a["message"], alerts.NumericsWarning, stacklevel=3)

    def _measure(self, x, q, sinv, granularity, fmt_name, scale, amax) -> dict:
        """The row's numbers (no step/call/layer/role yet): one kernel call, one host read
        (plus one per recipe-given scale or amax)."""
        cols = x.shape[-1] if x.dim() else 1
        rows = math.prod(x.shape[:-1]) if x.dim() else 1
        if x.dtype not in _HALF:
            x = x.float()
        if sinv.dtype != torch.float32:
            sinv = sinv.float()
        st = numerics.measure(x, q, sinv, granularity, bad_scale_as_one=True)
        nz = int(st.nonzero)
        row = {"fmt": fmt_name, "granularity": granularity, "rows": rows, "cols": cols, "numel": int(st.numel),
               "nonzero": nz, "nonfinite": int(st.nonfinite), "nan": int(st.nan), "underflow": int(st.underflow),
               "subnormal": int(st.subnormal), "saturated": int(st.saturated), "overflow": int(st.overflow),
               "underflow_frac": st.underflow_frac, "subnormal_frac": st.subnormal_frac,
               "saturation_frac": st.saturation_frac, "overflow_frac": st.overflow_frac, "sqnr_db": st.sqnr_db,
               "min_nonzero": st.min_nonzero, "log2_range": st.log2_range, "kurtosis": st.kurtosis,
               "bad_scale": st.bad_scales > 0}
        row["scale_min"] = 1.0 / st.scale_inv_max if st.scale_inv_max > 0 else math.nan
        row["scale_max"] = 1.0 / st.scale_inv_min if math.isfinite(st.scale_inv_min) else math.nan
        if scale is not None:
            row["scale"] = _scalar(scale)
        else:  # one scale: its value; one per tile: see scale_min / scale_max
            row["scale"] = row["scale_min"] if sinv.numel() == 1 else math.nan
        if amax is not None:
            a = amax.detach().float() if isinstance(amax, torch.Tensor) else torch.tensor(float(amax))
            row["amax"] = float(a.max()) if a.numel() else 0.0
        else:
            row["amax"] = st.amax
        row["hist"] = _rebin(st.hist, self.hist_bins, *self.hist_range) if self.hist_bins else []
        return row

    # ---- export and reports ----------------------------------------------------------
    def to_csv(self, path: str) -> str:
        """Write the records as CSV (one row each, columns FIELDS; hist as space-separated
        counts over this monitor's hist_range). Returns `path`."""
        return export.write_csv(self.records, path)

    def to_json(self, path: str) -> str:
        """Write records, notes, alerts and the histogram's bins as JSON (strict: non-finite
        floats as the strings "inf", "-inf", "nan"). Returns `path`."""
        with self._lock:
            doc = {"version": STATE_VERSION, "step": self._step, "every": self.every,
                   "hist_range": list(self.hist_range), "hist_bins": self.hist_bins,
                   "fields": list(FIELDS), "records": list(self._records), "events": list(self._events),
                   "alerts": list(self._alerts)}
        return export.write_json(doc, path)

    def to_tensorboard(self, log_dir: Optional[str] = None) -> str:
        """Write every record so far to TensorBoard under `log_dir` (default: the monitor's
        log_dir, else TensorBoard's runs/<date>): scalars ``fp8/<layer>/<role>/<field>``
        and the log2|x*scale| histogram. Returns the directory. ImportError without the
        tensorboard package."""
        writer = export.tb_writer(log_dir if log_dir is not None else self.log_dir)
        try:
            export.write_tb(writer, self.records, self.hist_range, self._tb_lock)
        finally:
            writer.close()
        return writer.log_dir

    def close(self) -> None:
        """Flush and close the TensorBoard writer of ``tensorboard=True`` (if any)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def summary(self) -> str:
        """A markdown table: per layer and role, its latest record."""
        return report.summary(self.records, self.events, len(self.alerts), self._step, self.every, self.seconds)

    def plot(self, out_dir: str) -> list:
        """Write PNGs to `out_dir` and return their paths: ``amax.png`` (amax per layer over
        steps, one panel per role), ``sqnr.png``, ``flush.png`` (underflow and overflow %),
        and ``hist_<role>.png`` (each layer's latest log2|x*scale| histogram against the
        E4M3 and E5M2 ranges). No records: no files, an empty list."""
        return plots.plot(self.records, self.hist_bins, self.hist_range, out_dir)
