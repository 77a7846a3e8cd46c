"""Train a byte-level language model with PyTorch Lightning in FP8: one plugin.

    python examples/train_lightning.py [--epochs 3] [--dtype bf16] [--ckpt-dir DIR] [--resume DIR/last.ckpt]
    python examples/train_lightning.py --devices 2     # DDP: amaxes all-reduced, every rank the same scales

The LightningModule below knows nothing about FP8. ``Trainer(plugins=[FP8Precision(...)])``
converts its nn.Linear layers to fp8mix.Linear when the fit starts (``module_filter_fn``
keeps the output layer in high precision here), runs every training step inside
``fp8_autocast`` (with ``--dtype bf16`` inside ``torch.autocast`` too), and runs
validation in FP8 without touching the FP8 state. ``--ckpt-dir`` writes a checkpoint per
epoch (``last.ckpt`` too): the FP8 state is saved under ``checkpoint["FP8Precision"]``, its
``state_dict`` loads into the plain module, and ``--resume`` continues bit for bit.
"""
from __future__ import annotations

import argparse

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from byte_corpus import WindowDataset, load, split
from byte_mlp import ByteMLP

import fp8mix
from fp8mix.integrations.lightning import FP8Precision


class ByteLM(L.LightningModule):
    def __init__(self, *, context: int, width: int, depth: int, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.model = ByteMLP(context=context, width=width, depth=depth)

    def _loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.model(x).float(), y[:, -1])  # the byte after the window

    def training_step(self, batch, idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, idx):
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train-windows", type=int, default=16384)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--devices", type=int, default=1, help="processes (DDP over gloo on CPU when > 1)")
    ap.add_argument("--ckpt-dir", default=None, help="write a checkpoint per epoch here")
    ap.add_argument("--resume", default=None, help="a checkpoint to continue from")
    ap.add_argument("--data", default=None, help="a text file (default: the Python stdlib's sources)")
    args = ap.parse_args()

    L.seed_everything(0, verbose=False)
    train, val = split(load(args.data))
    train_dl = torch.utils.data.DataLoader(WindowDataset(train, count=args.train_windows, seq_len=args.context),
                                           batch_size=args.batch_size, shuffle=False)
    val_dl = torch.utils.data.DataLoader(WindowDataset(val, count=max(args.train_windows // 8, args.batch_size),
                                                       seq_len=args.context, seed=1), batch_size=args.batch_size)
    module = ByteLM(context=args.context, width=args.width, depth=args.depth, lr=args.lr)
    plugin = FP8Precision(recipe=fp8mix.recipe.DelayedScaling(amax_history_len=16),
                          module_filter_fn=lambda m, fqn: fqn != "model.out",
                          dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    callbacks = []
    if args.ckpt_dir:
        callbacks.append(L.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, every_n_epochs=1, save_top_k=-1,
                                                     save_last=True, filename="{epoch}"))
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, plugins=[plugin], logger=False,
                        strategy="ddp" if args.devices > 1 else "auto",
                        callbacks=callbacks, enable_checkpointing=bool(args.ckpt_dir), enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, train_dl, val_dl, ckpt_path=args.resume)
    if not trainer.is_global_zero:
        return
    report = module.fp8_conversion
    print(f"FP8 layers: {len(report)}; kept in high precision: {sorted(report.skipped)}")
    m = trainer.callback_metrics
    print(f"done: {trainer.current_epoch} epochs, {trainer.global_step} steps, train loss "
          f"{float(m['train_loss']):.4f}, val loss {float(m['val_loss']):.4f}")


if __name__ == "__main__":
    main()
