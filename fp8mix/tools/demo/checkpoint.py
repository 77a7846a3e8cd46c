"""The demo's checkpoints, resume and per-step loss log.

``--checkpoint-dir DIR``, ``--checkpoint-every N``, ``--resume``: every N steps, and after
a run's last step, each run writes ``DIR/<run>.stepNNNNNNNN.pt`` (NNNNNNNN = steps done)
atomically: a hidden temp file in DIR, flushed and fsynced, then os.replace onto the final
name and an fsync of DIR; the last two are kept. A checkpoint holds the model's state_dict
(with the FP8 buffers of fp8mix.Linear layers), the optimizer's, the gradient scaler's
(None when the run has none), the steps done, torch's RNG state (and CUDA's), the batch
start offsets, the run's curves and counters, and its configuration. ``--resume``
continues every run from its newest readable checkpoint (an unreadable one is skipped
with a warning, temp files are never read), refuses one written with another
configuration, and does not retrain a run whose final checkpoint exists. The continued
losses are bit-identical to an uninterrupted run's on the same machine, library versions
and thread count.

``--loss-log FILE`` writes one line per training step, ``<run> <step> <repr(loss)>
<loss.hex()>``, flushed each step; on resume each run's lines are rewritten from its
checkpoint first, so after a killed and resumed run the file equals an uninterrupted run's.

A run's name in file names is its variant (``fp8-delayed``), with ``-seedS`` appended
when the demo trains several seeds.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from typing import TextIO

import torch

import fp8mix

from .._common import UsageError
from .variants import RunSpec, fp8_recipe, is_fp8

__all__ = ["CKPT_FORMAT", "CONFIG_KEYS", "KEEP_CHECKPOINTS", "Checkpointing", "LossLog", "checkpoint_name",
           "list_checkpoints", "atomic_save", "remove_stale_temp_files", "run_config", "corpus_identity",
           "env_info", "find_resume_checkpoint", "prepare_checkpoints"]

CKPT_FORMAT = 1
_CKPT_RE = re.compile(r"^(?P<run>[a-z0-9][a-z0-9-]*)\.step(?P<step>\d{8})\.pt$")
KEEP_CHECKPOINTS = 2
# The options a run's numbers depend on: a checkpoint resumes only under the same values.
CONFIG_KEYS = ("steps", "batch_size", "seq_len", "layers", "d_model", "heads", "lr", "warmup", "eval_every",
               "eval_batches", "seed")


def checkpoint_name(run: str, step: int) -> str:
    """File name of run `run`'s checkpoint after `step` steps."""
    return f"{run}.step{step:08d}.pt"


def list_checkpoints(folder: str, run: str) -> list[tuple[int, str]]:
    """(steps done, path) of run `run`'s checkpoints in `folder`, oldest first. Only final
    names count: temp files (hidden, ``.tmp.`` suffix) are never listed."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for n in names:
        m = _CKPT_RE.match(n)
        if m and m["run"] == run:
            found.append((int(m["step"]), os.path.join(folder, n)))
    return sorted(found)


def _fsync_dir(folder: str) -> None:
    """Make a rename in `folder` durable (where the platform allows opening folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(obj, path: str) -> None:
    """torch.save `obj` to `path` so that `path` is either absent, its old content or the
    complete new content, whenever the process dies: write a hidden temp file in the same
    folder, flush and fsync it, os.replace it onto `path`, fsync the folder."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def remove_stale_temp_files(folder: str, run: str) -> None:
    """Delete temp files a killed writer of run `run` left behind (never read anyway)."""
    prefix = f".{run}.step"
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for n in names:
        if n.startswith(prefix) and ".pt.tmp." in n:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, n))


def run_config(spec: RunSpec, cfg, device: torch.device, corpus_id: dict) -> dict:
    """What run `spec`'s numbers depend on; a checkpoint resumes only under an equal one."""
    c = {k: getattr(cfg, k) for k in CONFIG_KEYS}
    c.update(seed=spec.seed, run=spec.id, device=device.type,
             recipe=repr(fp8_recipe(spec.variant)) if is_fp8(spec.variant) else None)
    c.update(corpus_id)
    return c


def corpus_identity(corpus: torch.Tensor) -> dict:
    """Size and SHA-256 of the corpus bytes (the data a checkpoint was trained on)."""
    return {"corpus_bytes": int(corpus.numel()), "corpus_sha256": hashlib.sha256(corpus.numpy().data).hexdigest()}


def env_info() -> dict:
    """Not checked on resume, only reported: bit-identity also needs these to match."""
    return {"torch": str(torch.__version__), "fp8mix": str(fp8mix.__version__),
            "threads": torch.get_num_threads(), "isa": str(fp8mix.cpu_isa())}


def _describe_diff(saved: dict, now: dict) -> str:
    keys = [k for k in list(now) + [k for k in saved if k not in now] if saved.get(k) != now.get(k)]
    return ", ".join(f"{k.replace('_', '-')} {saved.get(k)!r} (checkpoint) vs {now.get(k)!r} (now)" for k in keys)


def _set_aside(path: str) -> None:
    """Rename an unreadable checkpoint out of the way (kept for inspection, never listed),
    so that the run's new checkpoints are the newest and pruning keeps them."""
    with contextlib.suppress(OSError):
        os.replace(path, path + ".unreadable")


def find_resume_checkpoint(folder: str, name: str, config: dict):
    """The newest readable checkpoint of run `name` in `folder` as (path, dict), or None.
    Unreadable files (truncated, corrupt) are skipped with a warning on stderr and renamed
    to ``*.unreadable``; one written under another configuration is a UsageError."""
    skipped = []
    for step, path in reversed(list_checkpoints(folder, name)):
        try:
            ck = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(ck, dict) or "format" not in ck:
                raise ValueError("not an fp8mix demo checkpoint")
        except Exception as exc:  # noqa: BLE001 - any unreadable file: fall back to an older one
            why = " ".join(str(exc).split())[:200]
            print(f"warning: skipping unreadable checkpoint {path} ({type(exc).__name__}: {why})",
                  file=sys.stderr, flush=True)
            skipped.append(path)
            continue
        if ck.get("format") != CKPT_FORMAT:
            raise UsageError(f"checkpoint {path} has format {ck.get('format')!r}, this demo reads format "
                             f"{CKPT_FORMAT}; use another --checkpoint-dir")
        if ck.get("config") != config:
            raise UsageError(f"cannot resume from {path}: it was written with a different configuration "
                             f"({_describe_diff(ck.get('config') or {}, config)}); rerun with the same options "
                             "or use another --checkpoint-dir")
        if ck.get("step") != step:
            print(f"warning: skipping checkpoint {path}: it holds step {ck.get('step')}", file=sys.stderr)
            skipped.append(path)
            continue
        env = env_info()
        if ck.get("env") != env:
            print(f"warning: {path} was written under {ck.get('env')}, resuming under {env}: the continued losses "
                  "may differ in the last bits from an uninterrupted run", file=sys.stderr, flush=True)
        for p in skipped:
            _set_aside(p)
        return path, ck
    for p in skipped:
        _set_aside(p)
    return None


class LossLog:
    """``--loss-log``: one line per training step, ``<run> <step> <repr(loss)> <loss.hex()>``,
    flushed each step. Each run starts by rewriting the file (atomically) to the lines of
    the runs before it plus its own restored steps, so resumed steps are never doubled."""

    def __init__(self, path: str, resume: bool):
        self.path = path
        self.f: TextIO | None = None
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
            if not resume or not os.path.exists(path):
                open(path, "w").close()
        except OSError as exc:
            raise UsageError(f"cannot write --loss-log {path!r}: {exc.strerror}") from None
        stale = f".{os.path.basename(path)}.tmp."  # left by a rewrite that was killed
        for n in os.listdir(folder):
            if n.startswith(stale):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, n))

    @staticmethod
    def line(name: str, step: int, loss: float) -> str:
        return f"{name} {step} {loss!r} {loss.hex()}\n"

    def start_run(self, name: str, earlier: list[str], restored: list) -> None:
        """Keep the earlier runs' lines, add `restored` (step, loss) of run `name`."""
        self.close()
        with open(self.path) as f:
            lines = f.readlines()
        keep = [ln for ln in lines if ln.endswith("\n") and ln.split(" ", 1)[0] in earlier]
        keep += [self.line(name, s, v) for s, v in restored]
        tmp = os.path.join(os.path.dirname(os.path.abspath(self.path)),
                           f".{os.path.basename(self.path)}.tmp.{os.getpid()}")
        with open(tmp, "w") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.f = open(self.path, "a")

    def write(self, name: str, step: int, loss: float) -> None:
        assert self.f is not None, "LossLog.write before start_run"
        self.f.write(self.line(name, step, loss))
        self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


class Checkpointing:
    """Where and how often a demo invocation checkpoints, and whether it resumes."""

    def __init__(self, folder: str, every: int, resume: bool):
        self.folder, self.every, self.resume = folder, every, resume

    def due(self, steps_done: int, total: int) -> bool:
        return steps_done % self.every == 0 or steps_done == total

    def save(self, name: str, step: int, state: dict) -> str:
        path = os.path.join(self.folder, checkpoint_name(name, step))
        atomic_save(state, path)
        for _, old in list_checkpoints(self.folder, name)[:-KEEP_CHECKPOINTS]:
            with contextlib.suppress(OSError):
                os.unlink(old)
        return path




def prepare_checkpoints(args, runs: list[RunSpec], device: torch.device, corpus: torch.Tensor):
    """(Checkpointing or None, {run id: config}, {run id: (path, checkpoint) to resume from}).
    Every run's checkpoints are checked before anything trains: without --resume a folder
    that already holds some is refused, with --resume a different configuration is."""
    folder = getattr(args, "checkpoint_dir", None)
    if folder is None:
        return None, {}, {}
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --checkpoint-dir {folder!r}: {exc.strerror}") from None
    every = args.checkpoint_every if args.checkpoint_every is not None else args.eval_every
    ckpt = Checkpointing(folder, every, bool(args.resume))
    cid = corpus_identity(corpus)
    configs = {r.id: run_config(r, args, device, cid) for r in runs}
    resume = {}
    for r in runs:
        if not args.resume:
            existing = list_checkpoints(folder, r.id)
            if existing:
                raise UsageError(f"--checkpoint-dir {folder} already holds checkpoints of run {r.id} (step "
                                 f"{existing[-1][0]}); pass --resume to continue from them or use an empty folder")
            continue
        found = find_resume_checkpoint(folder, r.id, configs[r.id])
        if found is not None:
            resume[r.id] = found
    return ckpt, configs, resume
