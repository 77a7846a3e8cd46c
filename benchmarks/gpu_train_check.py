"""Training on the GPU, for benchmarks/gpu_check.sh: rows for its one table.

1. The seed text's SimpleModel loop (Linear(10, 20) -> ReLU -> Linear(20, 1), AdamW,
   MSELoss, 10 epochs x 100 steps on one fixed batch) with fp8mix in place of
   Transformer Engine: fp8mix.convert_model, DelayedScaling(margin=0, interval=1,
   HYBRID, amax_history_len=16, "max") and fp8_autocast around the forward, as the
   seed's TE sketch does.  Run three times from the same weights: float32, fp8mix as
   is (layers this small stay in high precision: fp8_min_features = 16) and fp8mix
   with fp8_min_features = 1 (every GEMM in FP8, so K = 10 and N = 1 exercise the
   padded cuBLASLt path).  PASS: losses finite; as is, the float32 losses (to
   rounding); all-FP8, the final loss below 5 % of the first (float32 overfits the
   batch to ~0, so a ratio to it means nothing).
2. ``python -m fp8mix demo --device cuda`` for a few hundred steps (fp32, bf16 and
   the three FP8 recipes); its loss table is printed, and each FP8 run's final
   validation loss must be within 5 % of float32's.

Each row is appended to --rows as one JSON line.  --device cpu dry-runs part 1 on
the CPU (verdict DRY); --demo-steps 0 skips part 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.optim as optim

import fp8mix

STATE = {"dry": False}


def emit(path, kind, what, value, reference="", ratio="", target="", ok=None):
    v = "" if ok is None else ("DRY" if STATE["dry"] else ("PASS" if ok else "FAIL"))
    r = {"kind": kind, "what": what, "value": value, "reference": reference, "ratio": ratio, "target": target,
         "verdict": v}
    print("  ".join(str(x) for x in r.values()))
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(r) + "\n")


class SimpleModel(nn.Module):
    """The seed text's model."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(20, 1)

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


def simple_loop(device, mode: str, epochs=10, steps=100, log=print) -> list[float]:
    """The seed's loop; mode 'fp32', 'fp8' or 'fp8-all' (fp8_min_features = 1).  Returns
    the loss every 10 steps."""
    torch.manual_seed(0)
    model = SimpleModel().to(device)
    old_min = fp8mix.Linear.fp8_min_features
    if mode != "fp32":
        model = fp8mix.convert_model(model)
    if mode == "fp8-all":
        fp8mix.Linear.fp8_min_features = 1
    recipe = fp8mix.recipe.DelayedScaling(margin=0, interval=1, fp8_format=fp8mix.Format.HYBRID,
                                          amax_history_len=16, amax_compute_algo="max")
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()
    g = torch.Generator().manual_seed(1)
    input_data, target_data = torch.randn(32, 10, generator=g).to(device), torch.randn(32, 1, generator=g).to(device)
    losses = []
    try:
        for epoch in range(epochs):
            for i in range(steps):
                optimizer.zero_grad()
                with fp8mix.fp8_autocast(enabled=mode != "fp32", fp8_recipe=recipe):
                    output = model(input_data)
                loss = criterion(output.float(), target_data)
                loss.backward()
                optimizer.step()
                if (i + 1) % 10 == 0:
                    losses.append(loss.item())
                if (i + 1) % 100 == 0:
                    log(f"  [{mode}] Epoch [{epoch + 1}/{epochs}], Step [{i + 1}/{steps}], Loss: {loss.item():.4f}")
    finally:
        fp8mix.Linear.fp8_min_features = old_min
    return losses


def check_simple(device, rows, epochs):
    ref = simple_loop(device, "fp32", epochs=epochs)
    for mode in ("fp8", "fp8-all"):
        try:
            got = simple_loop(device, mode, epochs=epochs)
        except Exception as e:  # noqa: BLE001 - a row, not a crash
            emit(rows, "train", f"SimpleModel {mode}", f"error: {type(e).__name__}: {e}"[:150], ok=False)
            continue
        finite = all(math.isfinite(v) for v in got)
        if mode == "fp8":  # the layers stay in high precision: the float32 run, to rounding
            ok, target = abs(got[-1] - ref[-1]) <= 1e-3 + 0.01 * abs(ref[-1]), "= fp32 (+-1e-3)"
        else:  # FP8 GEMMs: it must train (the float32 run overfits the batch to ~0)
            ok, target = got[-1] <= 0.05 * got[0], "< 5% of first"
        emit(rows, "train", f"SimpleModel {mode} loss first -> final ({len(got) * 10} steps)",
             f"{got[0]:.4f} -> {got[-1]:.4g}", f"fp32 {ref[0]:.4f} -> {ref[-1]:.4g}", "", f"finite, {target}",
             finite and ok)


def check_demo(rows, steps, out_dir, timeout):
    cmd = [sys.executable, "-m", "fp8mix", "demo", "--device", "cuda", "--steps", str(steps), "--no-progress",
           "--recipes", "fp32,bf16,fp8-delayed,fp8-current,fp8-block", "--eval-every", str(max(steps // 4, 1)),
           "--out", out_dir]
    print("$ " + " ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        emit(rows, "train", f"demo --device cuda --steps {steps}", f"timed out after {timeout} s", ok=False)
        return
    try:
        with open(os.path.join(out_dir, "results.json")) as f:
            runs = {r["run"]: r for r in json.load(f)["runs"]}
    except (OSError, ValueError, KeyError) as e:
        emit(rows, "train", f"demo --device cuda --steps {steps}", f"rc {rc}, no results.json ({e})", ok=False)
        return
    ref = runs.get("fp32", {}).get("final_val_loss", float("nan"))
    for name, r in runs.items():
        v = r.get("final_val_loss", float("nan"))
        rel = abs(v - ref) / ref if math.isfinite(v) and math.isfinite(ref) else float("inf")
        is_fp8 = name.startswith("fp8")
        emit(rows, "train", f"demo {name} final val loss ({steps} steps, {r.get('run_wall_s', 0):.0f} s)",
             f"{v:.4f}", f"fp32 {ref:.4f}", f"{rel:.3f}", "within 5%" if is_fp8 else "",
             (not r.get("diverged") and rel <= 0.05) if is_fp8 else None)
    emit(rows, "train", "demo exit code", str(rc), "", "", "0", rc == 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", help="append the rows here (JSON lines)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--demo-steps", type=int, default=300)
    ap.add_argument("--demo-timeout", type=int, default=150)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/fp8mix_gpu_check"))
    args = ap.parse_args()
    STATE["dry"] = args.device != "cuda"
    if not STATE["dry"] and not torch.cuda.is_available():
        print("gpu_train_check.py: no GPU; use --device cpu for a dry run")
        return 3
    check_simple(torch.device(args.device), args.rows, args.epochs)
    if args.demo_steps > 0 and not STATE["dry"]:
        check_demo(args.rows, args.demo_steps, os.path.join(args.out, "demo"), args.demo_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
