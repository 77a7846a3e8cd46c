"""Export of Monitor records: CSV and JSON files (and reading them back with the types
they were written with) and TensorBoard scalars and histograms. Works on plain record
dicts (fields.FIELDS); the Monitor gathers them under its lock and calls these."""
from __future__ import annotations

import csv
import json
import math
import os
import threading
from typing import Iterable, Optional

from .fields import FIELDS, FLOAT_FIELDS, INT_FIELDS

__all__ = ["write_csv", "write_json", "read_csv", "read_json", "tb_writer", "write_tb"]

# The scalars written to TensorBoard per record.
_TB_SCALARS = ("amax", "scale", "underflow_frac", "subnormal_frac", "saturation_frac", "overflow_frac", "sqnr_db",
               "kurtosis", "log2_range")


def _makedirs_for(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_csv(rows: list, path: str) -> str:
    """Write `rows` as CSV (columns FIELDS; hist as space-separated counts). Returns `path`."""
    _makedirs_for(path)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for r in rows:
            w.writerow([" ".join(str(c) for c in r["hist"]) if k == "hist" else
                        repr(r[k]) if isinstance(r[k], float) else r[k] for k in FIELDS])
    return path


def _json_safe(o):
    """`o` with non-finite floats as the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


def write_json(doc: dict, path: str) -> str:
    """Write `doc` (records, notes, alerts, configuration) as strict JSON. Returns `path`."""
    _makedirs_for(path)
    with open(path, "w") as f:
        json.dump(_json_safe(doc), f, allow_nan=False)
    return path


def _typed(r: dict) -> dict:
    """A record read back from CSV/JSON with the types it was written with."""
    out: dict = {}
    for k in FIELDS:
        v = r[k]
        if k in INT_FIELDS:
            out[k] = int(v)
        elif k in FLOAT_FIELDS:
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


def tb_writer(log_dir: Optional[str]):
    """A TensorBoard SummaryWriter; ImportError naming the package when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError("fp8mix.Monitor: TensorBoard export needs the tensorboard package "
                          f"(pip install tensorboard); importing torch.utils.tensorboard failed: {e}") from None
    return SummaryWriter(log_dir=log_dir)


def write_tb(writer, rows: Iterable[dict], hist_range: tuple, lock: threading.Lock) -> None:
    """Scalars ``fp8/<layer>/<role>/<field>`` and the log2|x*scale| histogram of each row
    (bins over `hist_range`), under `lock` (backward may record from another thread)."""
    lo, hi = hist_range
    for r in rows:
        tag, s = f"fp8/{r['layer']}/{r['role']}", r["step"]
        with lock:
            for k in _TB_SCALARS:
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
