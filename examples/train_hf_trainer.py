"""Pre-train a small Llama with the Hugging Face Trainer in FP8: one callback.

    python examples/train_hf_trainer.py [--steps 200] [--out DIR] [--resume] [--bf16]

``Trainer(..., callbacks=[FP8TrainerCallback(recipe, module_filter_fn)])`` converts the
model's linear layers in place when the Trainer is built (``lm_head`` stays in high
precision here) and runs every forward inside ``fp8_autocast``; nothing else in the
Trainer setup changes. Gradient checkpointing is on (bit-identical to off with fp8mix);
checkpoints every ``--save-steps`` carry the FP8 state in ``model.safetensors``, and
``--resume`` continues from the newest one in ``--out`` bit for bit. Evaluation runs in
FP8 and changes no FP8 state. The model is a LlamaForCausalLM built from a config on
byte-level text (no download).
"""
from __future__ import annotations

import argparse
import os

import torch
from byte_corpus import VOCAB, WindowDataset, load, split

import fp8mix
from fp8mix.integrations.transformers import FP8TrainerCallback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402


class CausalLM(torch.utils.data.Dataset):
    """Byte windows as the Trainer's dict rows (the model shifts the labels itself)."""

    def __init__(self, data: torch.Tensor, *, count: int, seq_len: int, seed: int):
        self.windows = WindowDataset(data, count=count, seq_len=seq_len, seed=seed)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        x, _ = self.windows[i]
        return {"input_ids": x, "labels": x}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--save-steps", type=int, default=100)
    ap.add_argument("--out", default="fp8mix_out/hf_trainer")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    ap.add_argument("--bf16", action="store_true", help="torch.autocast bf16 for what does not run in FP8")
    ap.add_argument("--data", default=None, help="a text file (default: the Python stdlib's sources)")
    args = ap.parse_args()

    train, val = split(load(args.data))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                   num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 32),
                                   num_key_value_heads=max(1, args.hidden // 64), max_position_embeddings=args.seq_len)
    model = transformers.LlamaForCausalLM(cfg)
    training = transformers.TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=1e-3,
        warmup_steps=min(20, args.steps // 10), weight_decay=0.1, max_grad_norm=1.0, activation_checkpointing=True,
        save_strategy="steps", save_steps=args.save_steps, eval_strategy="no", logging_steps=max(1, args.steps // 10),
        report_to=[], use_cpu=not torch.cuda.is_available(), bf16=args.bf16, seed=0, dataloader_num_workers=0,
        disable_tqdm=True)
    fp8 = FP8TrainerCallback(recipe=fp8mix.recipe.DelayedScaling(amax_history_len=16),
                             module_filter_fn=lambda m, fqn: fqn != "lm_head")
    trainer = transformers.Trainer(model=model, args=training, callbacks=[fp8],
                                   train_dataset=CausalLM(train, count=args.steps * args.batch_size,
                                                          seq_len=args.seq_len, seed=0))
    report = model.fp8_conversion
    print(f"FP8 layers: {len(report)}; kept in high precision: {sorted(report.skipped)}")
    result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    metrics = trainer.evaluate(CausalLM(val, count=4 * args.batch_size, seq_len=args.seq_len, seed=1))
    print(f"done: {trainer.state.global_step} steps, train loss {result.training_loss:.4f}, "
          f"val loss {metrics['eval_loss']:.4f}")


if __name__ == "__main__":
    main()
