"""`python -m fp8mix inspect`: which tensors of a model are safe in FP8, and in which format.

The model (a ``module.path:factory`` or a torch.save'd file) is converted with
:func:`fp8mix.convert_model` and run for a few forward/backward steps under
``fp8_autocast(DelayedScaling(HYBRID))`` on random (or given) inputs. The loss for
backward is ``out.float().pow(2).mean()`` (no targets needed; for a tuple/dict output
the first tensor is used). On the last step, hooks capture every fp8mix.Linear's
input, weight and grad_output; each is cast with fp8mix.quantize to E4M3 and to E5M2,
using the scale delayed scaling had for it (same amax basis for both formats), and the
report gives per layer and role:

- the amax range recorded in the layer's ``fp8_amax_history``;
- the tensor's dynamic range, log2(max |x| / min nonzero |x|), in binades
  (E4M3 spans ~17.8 binades from min subnormal to max, E5M2 ~31.8);
- per format, from fp8mix.numerics.quant_stats of the saturating cast (what training
  uses): overflow (non-zero values beyond the range after scaling, i.e. clipped, or not
  finite) and underflow (non-zero values cast to 0), both as % of the non-zero values,
  and the SQNR in dB;
- a recommended format with its reason, by Format.AUTO's rule (fp8mix.auto_format.prefer):
  E5M2 when E4M3 would lose (underflow + overflow) more than AutoFormat's range tolerance
  (1%) of the values and E5M2 less than half as many, else the format with the higher
  SQNR (E4M3 for nearly every tensor whose range fits: one more mantissa bit);
- whether the layer should stay in high precision (SQNR below 20 dB in its recommended
  format, or a tiny layer).

torch.load of a model file uses ``weights_only=False``: it runs code from the file, so
only inspect files you trust.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys

import torch
import torch.nn as nn

import fp8mix
from fp8mix.auto_format import AutoFormat, prefer
from fp8mix.numerics import QuantStats, quant_stats
from fp8mix.recipe import role_format

from ._common import UsageError, json_safe, pick_device

AUTO_POLICY = AutoFormat()  # Format.AUTO's defaults: the same range tolerance as training's choice
SQNR_LIMIT_DB = fp8mix.plan.SQNR_LIMIT_DB  # one rule with the planner: below it, keep the layer in high precision
TINY_WEIGHTS = 4096  # layers with fewer weights save little in FP8
ROLES = ("input", "weight", "grad_output")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32}


# ---- tensor statistics --------------------------------------------------------------
def cast_stats(x: torch.Tensor, fmt, scale=None, granularity: str = "tensor") -> QuantStats:
    """Statistics of the saturating cast of `x` to FP8 `fmt` with `scale` (None: current
    scaling), from fp8mix.numerics.quant_stats (the C kernel): counts of underflow
    (finite non-zero -> 0), overflow (beyond the range after scaling: what saturation
    clips), non-finite inputs, and the SQNR."""
    x = x.detach()
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        x = x.float()
    x = x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(1, -1)
    if scale is not None and isinstance(scale, torch.Tensor):
        scale = scale.detach().to(device=x.device, dtype=torch.float32).reshape(())
    return quant_stats(x, fp8mix.quantize(x, fmt, scale, granularity=granularity))


def dynamic_range(x: torch.Tensor) -> float:
    """log2(max |x| / min nonzero |x|) over finite values, in binades (0 for an all-zero tensor)."""
    a = x.detach().float().abs().flatten()
    a = a[torch.isfinite(a) & (a > 0)]
    if a.numel() == 0:
        return 0.0
    return float(torch.log2(a.max() / a.min()))


def recommend(stats: dict) -> tuple[str, str]:
    """(format name, reason) for one tensor from its E4M3 and E5M2 QuantStats: the rule of
    Format.AUTO (fp8mix.auto_format.prefer, with AutoFormat's default range tolerance),
    so inspect and AUTO give the same advice for the same casts."""
    fmt, reason = prefer(stats["E4M3"], stats["E5M2"], AUTO_POLICY.range_tolerance)
    return fmt.name, reason


# ---- loading the model and its input -----------------------------------------------
def load_model(target: str, device: torch.device) -> nn.Module:
    """An nn.Module from a torch.save'd file (trusted: weights_only=False) or from
    ``module.path:factory`` (the factory is called with no arguments)."""
    if os.path.exists(target):
        try:
            obj = torch.load(target, map_location=device, weights_only=False)
        except Exception as exc:
            raise UsageError(f"cannot load model file {target!r}: {type(exc).__name__}: {exc}") from None
        what = f"file {target!r}"
    elif ":" in target:
        mod_name, _, attr = target.partition(":")
        try:
            obj = importlib.import_module(mod_name)
        except Exception as exc:
            raise UsageError(f"cannot import module {mod_name!r}: {type(exc).__name__}: {exc}") from None
        for part in attr.split("."):
            if not part or not hasattr(obj, part):
                raise UsageError(f"module {mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise UsageError(f"{target!r} is not callable")
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"factory {target!r} failed: {type(exc).__name__}: {exc}") from None
        what = f"factory {target!r}"
    else:
        raise UsageError(f"model {target!r}: no such file, and not of the form module.path:factory")
    if not isinstance(obj, nn.Module):
        raise UsageError(f"{what} gave a {type(obj).__name__}, not a torch.nn.Module")
    return obj.to(device)


def parse_shape(spec: str) -> tuple[int, ...]:
    """'8,128' -> (8, 128); every dimension a positive int."""
    try:
        shape = tuple(int(s) for s in spec.replace("x", ",").split(","))
    except ValueError:
        raise UsageError(f"bad --input-shape {spec!r}: expected comma-separated positive ints, e.g. 8,128") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"bad --input-shape {spec!r}: expected comma-separated positive ints, e.g. 8,128")
    return shape


def make_inputs(args, device: torch.device):
    """A function step -> tuple of model inputs: the --input-file tensors (same every step)
    or fresh random ones of --input-shape/--input-dtype (randn; ints in [0, --int-high))."""
    if args.input_file:
        if not os.path.exists(args.input_file):
            raise UsageError(f"--input-file {args.input_file!r} does not exist")
        try:
            obj = torch.load(args.input_file, map_location=device, weights_only=True)
        except Exception as exc:
            raise UsageError(f"cannot load --input-file {args.input_file!r}: {type(exc).__name__}: {exc}") from None
        items = tuple(obj) if isinstance(obj, (tuple, list)) else (obj,)
        if not items or not all(isinstance(t, torch.Tensor) for t in items):
            raise UsageError("--input-file must hold a tensor or a tuple/list of tensors")
        return lambda step: items
    if not args.input_shape:
        raise UsageError("give --input-shape (e.g. 8,128) or --input-file")
    shape = parse_shape(args.input_shape)
    if args.input_dtype not in DTYPES:
        raise UsageError(f"unknown --input-dtype {args.input_dtype!r}; choose from {', '.join(DTYPES)}")
    dtype = DTYPES[args.input_dtype]
    gen = torch.Generator().manual_seed(args.seed)

    def inputs(step):
        if dtype.is_floating_point:
            return (torch.randn(shape, generator=gen).to(device=device, dtype=dtype),)
        return (torch.randint(0, args.int_high, shape, generator=gen).to(device=device, dtype=dtype),)
    return inputs


def first_tensor(out):
    """The first floating-point tensor in a model output (tensor, tuple/list or dict)."""
    if isinstance(out, torch.Tensor):
        return out
    vals = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for v in vals:
        t = first_tensor(v)
        if t is not None:
            return t
    return None


# ---- capture -----------------------------------------------------------------------
class _Capture:
    """Hooks on each fp8mix.Linear that keep its input, weight and grad_output (last step)
    and the scale delayed scaling cast each with (None where the cast used its own amax)."""

    def __init__(self, layers: dict):
        self.layers = layers
        self.data: dict = {name: {} for name in layers}
        self.handles = []
        for name, layer in layers.items():
            self.handles.append(layer.register_forward_pre_hook(self._pre(name)))
            self.handles.append(layer.register_forward_hook(self._post(name)))

    @staticmethod
    def _scale(layer, role):
        return layer.fp8_scale[role].clone() if int(layer.fp8_steps[role]) > 0 else None

    def _pre(self, name):
        def hook(layer, args):
            self.data[name]["input"] = (args[0].detach().clone(), self._scale(layer, 0))
            self.data[name]["weight"] = (layer.weight.detach().clone(), self._scale(layer, 1))
        return hook

    def _post(self, name):
        def hook(layer, args, out):
            if isinstance(out, torch.Tensor) and out.requires_grad:
                def grad_hook(g):
                    self.data[name]["grad_output"] = (g.detach().clone(), self._scale(layer, 2))
                out.register_hook(grad_hook)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def _amax_range(layer, role: int):
    n = min(int(layer.fp8_steps[role]), layer.fp8_amax_history.shape[0])
    if n == 0:
        return None
    h = layer.fp8_amax_history[:n, role]
    return [float(h.min()), float(h.max())]


def _role_report(role: str, tensor: torch.Tensor, scale, amax_range) -> dict:
    """Stats of one captured tensor under E4M3 and E5M2, both scaled from the same amax basis."""
    used = role_format(fp8mix.Format.HYBRID, role)
    basis = None if scale is None else fp8mix.fp8_max(used) / float(scale)  # the amax the used scale came from
    stats = {}
    for fmt in (fp8mix.Format.E4M3, fp8mix.Format.E5M2):
        s = None if basis is None or not math.isfinite(basis) or basis <= 0 else fp8mix.fp8_max(fmt) / basis
        s = s if s is None or (math.isfinite(s) and s > 0) else None
        stats[fmt.name] = cast_stats(tensor, fmt, s)
    drange = dynamic_range(tensor)
    rec, reason = recommend(stats)
    pct = {f: {"overflow_pct": 100.0 * st.overflow_frac, "underflow_pct": 100.0 * st.underflow_frac,
               "sqnr_db": st.sqnr_db} for f, st in stats.items()}
    return {"amax_range": amax_range, "dynamic_range_binades": drange, "recommended": rec, "reason": reason,
            "formats": pct, "scale_basis_amax": basis}


def _layer_report(name: str, layer, captured: dict) -> dict:
    """The JSON entry of one fp8mix.Linear."""
    entry = {"layer": name, "in_features": layer.in_features, "out_features": layer.out_features,
             "ran_in_fp8": int(layer.fp8_steps[0]) > 0, "roles": {}}
    for i, role in enumerate(ROLES):
        if role in captured:
            t, s = captured[role]
            entry["roles"][role] = _role_report(role, t, s, _amax_range(layer, i))
    reasons = []
    if min(layer.in_features, layer.out_features) < fp8mix.Linear.fp8_min_features:
        reasons.append(f"fewer than {fp8mix.Linear.fp8_min_features} features (runs in high precision anyway)")
    elif layer.in_features * layer.out_features < TINY_WEIGHTS:
        reasons.append(f"tiny ({layer.in_features * layer.out_features} < {TINY_WEIGHTS} weights): FP8 saves little")
    for role, r in entry["roles"].items():
        sq = r["formats"][r["recommended"]]["sqnr_db"]
        if sq < SQNR_LIMIT_DB:
            reasons.append(f"{role} SQNR {sq:.1f} dB < {SQNR_LIMIT_DB:g} dB in {r['recommended']}")
    entry["called"] = bool(entry["roles"])
    entry["keep_high_precision"] = bool(reasons)
    entry["high_precision_reasons"] = reasons
    return entry


# ---- the command ---------------------------------------------------------------------
def _fmt_range(r):
    return "-" if r is None else f"{r[0]:.3g}..{r[1]:.3g}"


def print_report(entries: list, out=None) -> None:
    """One row per layer and role, then the layers to keep in high precision (to `out`,
    default sys.stdout)."""
    out = out or sys.stdout
    hdr = (f"{'layer':<28} {'role':<11} {'amax range':>19} {'bin':>5} {'rec':>4}  "
           f"{'E4M3 ovf%/unf%/SQNR':>22}  {'E5M2 ovf%/unf%/SQNR':>22}")
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    for e in entries:
        label = f"{e['layer']} ({e['in_features']}->{e['out_features']})"
        if not e["roles"]:
            print(f"{label:<28.28} (not called in the last step: no statistics)", file=out)
        for role, r in e["roles"].items():
            cells = []
            for f in ("E4M3", "E5M2"):
                s = r["formats"][f]
                cells.append(f"{s['overflow_pct']:.2f}/{s['underflow_pct']:.2f}/{s['sqnr_db']:.1f}")
            print(f"{label:<28.28} {role:<11} {_fmt_range(r['amax_range']):>19} "
                  f"{r['dynamic_range_binades']:>5.1f} {r['recommended']:>4}  {cells[0]:>22}  {cells[1]:>22}",
                  file=out)
            label = ""
    print(file=out)
    print("recommendations:", file=out)
    for e in entries:
        for role, r in e["roles"].items():
            print(f"  {e['layer']}.{role}: {r['recommended']} - {r['reason']}", file=out)
    keep = [e for e in entries if e["keep_high_precision"]]
    print(file=out)
    if keep:
        print("keep in high precision (module_filter_fn should return False for these):", file=out)
        for e in keep:
            print(f"  {e['layer']}: {'; '.join(e['high_precision_reasons'])}", file=out)
    else:
        print("keep in high precision: none (every layer is fine in FP8)", file=out)


def run(args: argparse.Namespace) -> int:
    """Entry point of `python -m fp8mix inspect` (args from fp8mix.tools.cli)."""
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise UsageError(f"--json {args.json!r}: its folder does not exist")
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    model = load_model(args.model, device)
    make = make_inputs(args, device)
    fp8mix.convert_model(model)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, fp8mix.Linear)}
    if not layers:
        raise UsageError(f"{args.model!r} has no nn.Linear layers to inspect")
    model.train()
    recipe = fp8mix.recipe.DelayedScaling(fp8_format=fp8mix.Format.HYBRID)
    cap = None
    for step in range(args.steps):
        if step == args.steps - 1:
            cap = _Capture(layers)
        model.zero_grad(set_to_none=True)
        try:
            with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe):
                out = first_tensor(model(*make(step)))
            if out is None:
                raise UsageError("the model's output holds no tensor")
            loss = out.float().pow(2).mean()
            if loss.requires_grad:
                loss.backward()
        except UsageError:
            raise
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UsageError(f"model step failed with this input: {type(exc).__name__}: {msg}") from None
    assert cap is not None  # args.steps >= 1: the last step captured
    cap.remove()
    entries = [_layer_report(n, layers[n], cap.data[n]) for n in layers]
    if args.json:
        report = {"model": args.model, "steps": args.steps, "loss": "out.float().pow(2).mean()",
                  "thresholds": {"e4m3_lost": AUTO_POLICY.range_tolerance, "sqnr_db": SQNR_LIMIT_DB,
                                 "tiny_weights": TINY_WEIGHTS},
                  "layers": entries}
        try:
            with open(args.json, "w") as f:
                json.dump(json_safe(report), f, indent=2)
        except OSError as exc:
            raise UsageError(f"cannot write --json {args.json!r}: {exc.strerror}") from None
    print(f"fp8mix inspect: {args.model} - {len(layers)} linear layers, {args.steps} steps under "
          "DelayedScaling(HYBRID), loss = out.float().pow(2).mean(); stats of the last step")
    print("columns: amax range from fp8_amax_history; bin = log2(max/min nonzero |x|); per format "
          "overflow% (clipped or not finite) / underflow% (-> 0), of the non-zero values, / SQNR dB, scaled from "
          "the amax delayed scaling used; rec: Format.AUTO's rule")
    print()
    print_report(entries)
    if args.json:
        print(f"\nwrote {args.json}")
    return 0

