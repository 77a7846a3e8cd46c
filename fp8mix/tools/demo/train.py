"""One training run of the demo: a copy of the base model trained as one variant.

``train_one`` is the loop (public: benchmarks/soak.py runs it for 20k steps); ``Run``
holds a run's state (model, AdamW, gradient scaler, counters, curves) and knows how to
take one step, checkpoint itself and resume. Every run of a seed starts from deep copies
of one seeded model and sees the same batches; AdamW (betas 0.9/0.95, weight decay 0.1
on matrices), gradient clipping at 1.0, warmup + cosine learning rate (model.lr_at).
"""
from __future__ import annotations

import contextlib
import copy
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fp8mix

from .checkpoint import CKPT_FORMAT, Checkpointing, LossLog, env_info, remove_stale_temp_files
from .counters import CastCounter, SavedBytes
from .data import batch
from .model import evaluate, lr_at
from .progress import Progress
from .variants import is_fp8, make_scaler, precision_context

__all__ = ["Run", "train_one"]


class Run:
    """The state of run `name` (a variant) trained from a deep copy of `base` on `device`."""

    def __init__(self, name: str, base: torch.nn.Module, cfg, device: torch.device):
        self.name, self.cfg, self.device = name, cfg, device
        self.model = copy.deepcopy(base).to(device)
        self.counter = None
        if is_fp8(name):
            fp8mix.convert_model(self.model)
            self.counter = CastCounter(self.model, name)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
        self.scaler = make_scaler(name, device)
        self.saved = SavedBytes(self.model)
        self.train_curve: list = []
        self.val_curve: list = []
        self.times: list = []
        self.stop_reason: str | None = None
        self.diverged, self.start, self.done, self.wall_before = False, 0, False, 0.0

    def sync(self) -> None:
        """Wait for the device (timings of CUDA steps)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor, *, sample: bool) -> float:
        """One optimizer step on (x, y) at the schedule's learning rate; returns the loss.
        `sample`: count this step's FP8 casts (CastCounter)."""
        for g in self.opt.param_groups:
            g["lr"] = lr_at(step, self.cfg.steps, self.cfg.lr, self.cfg.warmup)
        if self.counter is not None:
            self.counter.before_step(sample)
        self.sync()
        t0 = time.perf_counter()
        with self.saved.hooks() if step == 0 else contextlib.nullcontext():
            with precision_context(self.name, self.device):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.opt)
            else:
                loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sync()
        self.times.append(time.perf_counter() - t0)
        if self.counter is not None:
            self.counter.after_step()
        return loss.item()

    def restore(self, path: str, ck: dict, order: tuple) -> tuple:
        """Continue from checkpoint `ck` (read from `path`); returns the batch offsets
        (train_starts, val_starts) to use: the checkpoint's."""
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        if self.scaler is not None and ck["scaler"] is not None:
            self.scaler.load_state_dict(ck["scaler"])
        torch.set_rng_state(ck["rng"]["torch"])
        if self.device.type == "cuda" and ck["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])
        saved = ck["data_order"]
        if not (torch.equal(saved["train_starts"], order[0]) and torch.equal(saved["val_starts"], order[1])):
            print(f"warning: {path}: this torch draws other batch offsets from the seed; continuing with the "
                  "checkpoint's", file=sys.stderr)
        p = ck["progress"]
        self.train_curve, self.val_curve, self.times = list(p["train_curve"]), list(p["val_curve"]), list(p["times"])
        self.diverged, self.stop_reason, self.wall_before = p["diverged"], p["stop_reason"], p["wall_s"]
        self.saved.seen = {0: int(p["saved_bytes"])}
        if self.counter is not None and p["counter"] is not None:
            self.counter.load_state(p["counter"])
        self.start, self.done = ck["step"], ck["done"]
        return saved["train_starts"], saved["val_starts"]

    def state(self, steps_done: int, final: bool, config: dict | None, order: tuple, wall_s: float) -> dict:
        """The checkpoint of this run after `steps_done` steps (see checkpoint.py)."""
        with self.counter.saving() if self.counter is not None else contextlib.nullcontext():
            model_state = self.model.state_dict()  # fp8mix.Linear records pending grad amaxes first
        return {
            "format": CKPT_FORMAT, "run": config["run"] if config else self.name, "step": steps_done, "done": final,
            "config": config, "env": env_info(), "model": model_state, "optimizer": self.opt.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None},
            "data_order": {"train_starts": order[0], "val_starts": order[1]},
            "progress": {"train_curve": self.train_curve, "val_curve": self.val_curve, "times": self.times,
                         "diverged": self.diverged, "stop_reason": self.stop_reason,
                         "saved_bytes": sum(self.saved.seen.values()), "wall_s": wall_s,
                         "counter": None if self.counter is None else self.counter.state()}}

    def close(self) -> None:
        """Stop the FP8 gradient-cast counts this run's scaler asked for."""
        if self.scaler is not None:
            self.scaler.close()

    def summary(self, run_id: str, wall_s: float) -> dict:
        """The run's results: final losses, speed, memory, FP8 counts and curves."""
        tail = [v for _, v in self.train_curve[-max(1, self.cfg.steps // 10):]]
        ok = not self.diverged
        dev = self.device
        return {
            "run": self.name, "seed": self.cfg.seed, "run_id": run_id, "diverged": self.diverged,
            "stop_reason": self.stop_reason, "steps_done": len(self.train_curve),
            "resumed_from_step": None,
            "final_train_loss": sum(tail) / len(tail) if ok and tail else float("nan"),
            "final_val_loss": self.val_curve[-1][1] if self.val_curve and ok else float("nan"),
            "step_ms_median": 1000.0 * statistics.median(self.times[1:] or self.times) if self.times else float("nan"),
            "train_steps_s": sum(self.times), "run_wall_s": wall_s,
            "saved_for_backward_mib": self.saved.mib,
            "peak_cuda_mib": torch.cuda.max_memory_allocated(dev) / 2 ** 20 if dev.type == "cuda" else None,
            "fp8": self.counter.summary() if self.counter is not None else None,
            "scaler": None if self.scaler is None else {
                "scale": self.scaler.get_scale(), "fp8_skips": self.scaler.fp8_skips,
                "fp8_backoffs": self.scaler.fp8_backoffs, "fp8_growths": self.scaler.fp8_growths},
            "train_curve": self.train_curve, "val_curve": self.val_curve,
        }


def train_one(name, base, cfg, data, device, progress=True, *, ckpt: Checkpointing | None = None,
              resume_from=None, config: dict | None = None, loss_log: LossLog | None = None,
              earlier: tuple = (), monitor=None, run_id: str | None = None) -> dict:
    """Train a copy of `base` as run `name` (a variant); returns its summary and curves.

    data: (train bytes, val bytes, train_starts, val_starts); cfg: the demo's options
    (steps, lr, warmup, seq_len, eval_every, seed, ...); run_id: the run's name in files
    (default `name`); ckpt: checkpoint every ckpt.every steps and after the last step
    (config goes in them); resume_from: (path, checkpoint dict) to continue from
    (checkpoint.find_resume_checkpoint); loss_log: per-step losses (earlier: the runs
    already in the log before this one); monitor: ``monitor(step, train_curve) -> str |
    None`` after each step (train_curve includes restored steps); a string stops the run
    as diverged, with that reason."""
    run_id = run_id or name
    train, val, train_starts, val_starts = data
    t_run = time.perf_counter()
    r = Run(name, base, cfg, device)
    if resume_from is not None:
        path, ck = resume_from
        train_starts, val_starts = r.restore(path, ck, (train_starts, val_starts))
        print(f"{run_id}: " + (f"already complete in {path} ({r.start} steps); not retraining" if r.done else
                               f"resuming from {path} (step {r.start} of {cfg.steps})"), flush=True)
    order = (train_starts, val_starts)
    if loss_log is not None:
        loss_log.start_run(run_id, list(earlier), r.train_curve)
    if ckpt is not None:
        remove_stale_temp_files(ckpt.folder, run_id)

    def checkpoint(steps_done: int, final: bool) -> None:
        assert ckpt is not None
        ckpt.save(run_id, steps_done, r.state(steps_done, final, config, order,
                                              r.wall_before + time.perf_counter() - t_run))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bar = Progress(run_id, r.start, cfg.steps, progress)
    for step in range(r.start, cfg.steps if not r.done else r.start):
        x, y = batch(train, train_starts[step], cfg.seq_len, device)
        sample = r.counter is not None and (step % cfg.eval_every == 0 or step == cfg.steps - 1)
        lv = r.step(step, x, y, sample=sample)
        r.train_curve.append((step, lv))
        if loss_log is not None:
            loss_log.write(run_id, step, lv)
        if not math.isfinite(lv):
            r.diverged, r.stop_reason = True, "non-finite loss"
        elif monitor is not None:
            r.stop_reason = monitor(step, r.train_curve)
            r.diverged = r.stop_reason is not None
        if r.diverged:
            bar.stopped(str(r.stop_reason))
            if ckpt is not None:
                checkpoint(step + 1, True)
            break
        val_loss = None
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            val_loss = evaluate(r.model, name, device, val, val_starts, cfg.seq_len)
            r.val_curve.append((step, val_loss))
        bar.update(step, lv, val_loss)
        if ckpt is not None and ckpt.due(step + 1, cfg.steps):
            checkpoint(step + 1, step + 1 == cfg.steps)
    bar.close()
    if loss_log is not None:
        loss_log.close()
    r.close()
    res = r.summary(run_id, r.wall_before + time.perf_counter() - t_run)
    res["resumed_from_step"] = r.start if resume_from is not None else None
    return res
