"""Pre-train a small Hugging Face Llama from scratch in FP8, keeping lm_head in high precision.

    python examples/pretrain_llama.py [--steps 300] [--hidden 256] [--layers 4] [--recipe delayed]

A plain PyTorch loop around ``transformers.LlamaForCausalLM`` built from a config (no
download; byte-level tokens from the Python standard library's sources, or ``--data FILE``).
``fp8mix.convert_model`` swaps the attention and MLP projections for ``fp8mix.Linear`` in
place, and its ``module_filter_fn`` keeps ``lm_head`` in high precision: the output
projection is the layer whose FP8 error reaches the loss most directly, and the usual
first layer to leave out. What the conversion did is in ``model.fp8_conversion``.

The forward runs inside ``fp8mix.fp8_autocast``; backward needs no context (it uses the
recipe its forward used). Evaluation runs in FP8 too, under ``torch.no_grad()`` and
``model.eval()``, where the layers read their scales and record nothing. ``--checkpoint``
turns on Hugging Face's gradient checkpointing (bit-identical to none with fp8mix). At
the end the model is saved with ``save_pretrained`` (``--save DIR``): the FP8 state is in
the file, and ``fp8mix.load_fp8_state`` restores it after ``from_pretrained`` + convert_model.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
from byte_corpus import VOCAB, load, split, windows

import fp8mix

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402

RECIPES = {"delayed": lambda: fp8mix.recipe.DelayedScaling(amax_history_len=16),
           "current": fp8mix.recipe.CurrentScaling, "block": fp8mix.recipe.BlockScaling}


def build(args) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                   num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 32),
                                   num_key_value_heads=max(1, args.hidden // 64), max_position_embeddings=args.seq_len)
    return transformers.LlamaForCausalLM(cfg)


def keep_lm_head(module: torch.nn.Module, fqn: str) -> bool:
    """convert_model's filter (torchao's signature): False keeps the layer in high precision."""
    return fqn != "lm_head"


@torch.no_grad()
def evaluate(model, val, recipe, args, g) -> float:
    model.eval()
    losses = []
    with fp8mix.fp8_autocast(fp8_recipe=recipe):  # FP8, read-only: no FP8 state changes here
        for _ in range(args.eval_batches):
            x, _ = windows(val, batch_size=args.batch_size, seq_len=args.seq_len, generator=g)
            losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="delayed")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--checkpoint", action="store_true", help="Hugging Face gradient checkpointing")
    ap.add_argument("--data", default=None, help="a text file (default: the Python stdlib's sources)")
    ap.add_argument("--save", default=None, help="save_pretrained the trained model to this folder")
    args = ap.parse_args()

    torch.manual_seed(0)
    train, val = split(load(args.data))
    model = build(args)
    fp8mix.convert_model(model, module_filter_fn=keep_lm_head)
    report = model.fp8_conversion
    print(f"FP8 layers: {len(report)}; kept in high precision: {dict(report.skipped)}")
    if args.checkpoint:
        model.gradient_checkpointing_enable()
    model.train()
    recipe = RECIPES[args.recipe]()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    warmup = max(1, min(100, args.steps // 10))  # linear warm-up, then cosine decay to 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 *
                                              (1 + math.cos(math.pi * min(s, args.steps) / max(args.steps, 1))))
    g, g_val = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    first = None
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, _ = windows(train, batch_size=args.batch_size, seq_len=args.seq_len, generator=g)
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            loss = model(input_ids=x, labels=x).loss  # Hugging Face shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        first = loss.item() if first is None else first
        if (step + 1) % args.eval_every == 0:
            print(f"step {step + 1:5d}  train loss {loss.item():.4f}  val loss "
                  f"{evaluate(model, val, recipe, args, g_val):.4f}  {time.perf_counter() - t0:.1f}s")
    print(f"done: {args.steps} steps, train loss {first:.4f} -> {loss.item():.4f}, "
          f"val loss {evaluate(model, val, recipe, args, g_val):.4f}")
    if args.save:
        model.save_pretrained(args.save)  # the FP8 state buffers are in the file
        print(f"saved to {args.save} (restore the FP8 state with fp8mix.load_fp8_state after convert_model)")


if __name__ == "__main__":
    main()
