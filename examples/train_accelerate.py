"""Train a byte-level language model with Hugging Face Accelerate in FP8.

    python examples/train_accelerate.py [--steps 400] [--mixed-precision bf16] [--save-dir DIR] [--resume DIR]
    torchrun --nproc_per_node 2 examples/train_accelerate.py   # DDP (gloo on CPU): amaxes all-reduced, same scales

The one change to an Accelerate loop: ``fp8mix.integrations.accelerate.prepare(accelerator,
model, optimizer, loader, recipe=...)`` instead of ``accelerator.prepare(model, optimizer,
loader)``. It converts the model in place before Accelerate wraps it (the optimizer made
before keeps its Parameters) and wraps the model's forward in ``fp8_autocast``. Keep the
Accelerator's ``mixed_precision`` at "no" or "bf16": "fp8" would add Accelerate's own FP8
backend on top (refused). The FP8 state is buffers of the model, so ``save_state`` /
``load_state`` carry it with the weights, optimizer and RNG states.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from byte_corpus import WindowDataset, load, split
from byte_mlp import ByteMLP

import fp8mix
from fp8mix.integrations.accelerate import prepare


@torch.no_grad()
def evaluate(model, loader) -> float:
    model.eval()  # FP8, read-only: evaluation changes no FP8 state
    losses = [F.cross_entropy(model(x).float(), y[:, -1]).item() for x, y in loader]
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    ap.add_argument("--save-dir", default=None, help="accelerator.save_state here at the end")
    ap.add_argument("--resume", default=None, help="accelerator.load_state from here first")
    ap.add_argument("--data", default=None, help="a text file (default: the Python stdlib's sources)")
    args = ap.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    train, val = split(load(args.data))
    train_dl = torch.utils.data.DataLoader(WindowDataset(train, count=args.steps * args.batch_size,
                                                         seq_len=args.context), batch_size=args.batch_size)
    val_dl = torch.utils.data.DataLoader(WindowDataset(val, count=8 * args.batch_size, seq_len=args.context, seed=1),
                                         batch_size=args.batch_size)
    model = ByteMLP(context=args.context, width=args.width, depth=args.depth)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model, opt, train_dl, val_dl = prepare(accelerator, model, opt, train_dl, val_dl,
                                           recipe=fp8mix.recipe.DelayedScaling(amax_history_len=16),
                                           module_filter_fn=lambda m, fqn: fqn != "out")
    done = 0
    if args.resume:
        accelerator.load_state(args.resume)  # weights, FP8 state, optimizer, RNG states
        done = int(open(os.path.join(args.resume, "step.txt")).read())
        train_dl = accelerator.skip_first_batches(train_dl, done)
    first, step = None, done - 1
    for step, (x, y) in enumerate(train_dl, start=done):
        loss = F.cross_entropy(model(x).float(), y[:, -1])
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        first = loss.item() if first is None else first
        if (step + 1) % 100 == 0:
            accelerator.print(f"step {step + 1:5d}  train loss {loss.item():.4f}  "
                              f"val loss {evaluate(model, val_dl):.4f}")
    accelerator.print(f"done: {step + 1} steps on {accelerator.num_processes} process(es), train loss {first:.4f} -> "
                      f"{loss.item():.4f}, val loss {evaluate(model, val_dl):.4f}")
    if args.save_dir:
        accelerator.save_state(args.save_dir)
        if accelerator.is_main_process:
            with open(os.path.join(args.save_dir, "step.txt"), "w") as f:
                f.write(str(step + 1))


if __name__ == "__main__":
    main()
