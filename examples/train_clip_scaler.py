"""Train a small MLP in FP8 with loss scaling and gradient clipping.

    python examples/train_clip_scaler.py [--steps 200] [--recipe delayed|current|block]

The usual torch.amp recipe, with fp8mix's pieces: convert_model swaps the nn.Linear
layers for fp8mix.Linear, fp8_autocast runs their GEMMs in FP8, FP8GradScaler scales
the loss (and reads back how the FP8 gradient casts fared). Clipping must see the true
gradients, so it comes after scaler.unscale_(). Step 120 multiplies the loss by inf to
show a skipped step. Runs in a few seconds on a CPU.

What to look for in the output: the skipped step and its backoff; and, with the delayed
recipe, a line "backoff" right after each growth of the loss scale: delayed grad_output
scales lag the loss scale by one step, so the first step at a doubled scale clips the top
of dy, the FP8 counts see it (overflow) and the scaler backs off without skipping.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--recipe", choices=("delayed", "current", "block"), default="delayed")
    ap.add_argument("--max-norm", type=float, default=1.0)
    args = ap.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(2048, 64, generator=g)
    y_all = torch.tanh(x_all @ (torch.randn(64, 32, generator=g) / 8))

    model = fp8mix.convert_model(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                                               nn.Linear(128, 32)))
    recipe = {"delayed": fp8mix.recipe.DelayedScaling(amax_history_len=16),
              "current": fp8mix.recipe.CurrentScaling(),
              "block": fp8mix.recipe.BlockScaling()}[args.recipe]
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)

    with fp8mix.FP8GradScaler(init_scale=2.0 ** 12, growth_interval=50) as scaler:
        for step in range(args.steps):
            idx = torch.randint(0, x_all.shape[0], (64,), generator=g)
            with fp8mix.fp8_autocast(fp8_recipe=recipe):
                loss = F.mse_loss(model(x_all[idx]), y_all[idx])
            if step == 120:
                loss = loss * float("inf")  # a broken batch: the scaler skips this step
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # gradients are now the true ones (inf/NaN recorded, not hidden)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
            scaler.step(opt)  # skipped when a gradient is inf/NaN, or an FP8 cast saw one
            scaler.update()
            skipped = not torch.isfinite(norm).item() or scaler.last_fp8_action == "skip"
            if step % 50 == 0 or skipped or scaler.last_fp8_action:
                st = scaler.last_fp8_stats or {}
                print(f"step {step:4d}  loss {loss.item():.5f}  grad-norm {norm.item():9.4f}  "
                      f"scale {scaler.get_scale():8.0f}  fp8 underflow {st.get('underflow_frac', 0):.4f}  "
                      f"overflow {st.get('overflow_frac', 0):.4f}  {'skipped ' if skipped else ''}"
                      f"{scaler.last_fp8_action or ''}")
        with torch.no_grad():
            final = F.mse_loss(model(x_all), y_all).item()
        print(f"final loss (fp32 eval) {final:.5f}; skipped steps by FP8 counts {scaler.fp8_skips}, "
              f"FP8 backoffs {scaler.fp8_backoffs}, FP8 growths {scaler.fp8_growths}")


if __name__ == "__main__":
    main()
