"""fp8mix.Monitor: what the FP8 casts of a training run did, per layer, tensor role and step.

Every ``every`` optimizer steps (the monitor is *sampling*), each fp8mix.Linear running
under ``fp8_autocast(monitor=m)`` hands every cast it makes (roles ``"input"`` and
``"weight"`` in forward, ``"grad_output"`` in backward) to :meth:`Monitor.record`, which
keeps one row of plain Python numbers, all from one pass of the C kernel
fp8mix_quant_stats (fp8mix.numerics.measure):

    amax, scale            what the recipe scaled by (given by the layer; or derived:
                           amax as fp8mix.amax, NaN if any NaN, else inf if any inf)
    underflow_frac         non-zero finite values that became 0           } of the non-zero
    subnormal_frac         values whose FP8 value is subnormal (few bits)  } values
    saturation_frac        values whose FP8 value is +-max                 }
    overflow_frac          values beyond max after scaling (clipped), plus }
                           NaN/inf (as QuantStats.overflow_frac)           }
    nonfinite, nan         NaN/inf values, of which NaN
    sqnr_db                10 log10(sum x^2 / sum (x - dequant(q))^2)
    kurtosis               E[(x-mu)^4] / E[(x-mu)^2]^2 of the finite values (3 for a Gaussian;
                           float64 power sums about a pivot, so any mean is fine)
    log2_range             log2(max |x| / min non-zero |x|) over finite x, in binades
    scale_min, scale_max   over the tiles' scales (1 / scale_inv)
    hist                   counts of the finite non-zero values by floor(log2|x * scale|)
                           (exact, from the exponent bits: |x| / scale_inv), in
                           ``hist_bins`` equal bins of whole binades over ``hist_range``
                           -- in FP8 units, i.e. after scaling (per element for row/block
                           scales), so the formats' ranges are fixed: E4M3 [2^-9, 448],
                           E5M2 [2^-16, 57344]. The first and last bins also hold
                           everything beyond them. Default: one bin per binade, [-47, 17).

plus step, call (0, 1, ... when a layer runs more than once in a step), layer, role,
fmt, granularity, rows, cols and the raw counts. No tensor is kept. Between samples the
layers do not call the monitor at all (they test :attr:`Monitor.sampling` first), so an
unsampled step does no tensor work and no host read for the monitor; a sampled step
pays one kernel pass and one host read per cast (benchmarks/bench_monitor.py;
:attr:`Monitor.seconds` is the time spent in record()). Appends are under a lock:
backward may record from autograd's thread.

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

Files: record.py (Monitor: recording, state), alerts.py (what warns, rate limit),
export.py (CSV, JSON, TensorBoard), report.py (grouping, the summary table), plots.py
(PNGs), fields.py (the columns of a record).
"""
from __future__ import annotations

from .alerts import NumericsWarning
from .export import read_csv, read_json
from .fields import FIELDS, FP8_RANGES
from .record import Monitor

__all__ = ["Monitor", "NumericsWarning", "read_csv", "read_json", "FIELDS", "FP8_RANGES"]
