"""`python -m fp8mix demo`: train one small GPT in float32, bfloat16 and FP8 and compare.

The model is a byte-level GPT (vocab 256): token + position embeddings, pre-LayerNorm
blocks of causal self-attention and a GELU MLP, a final LayerNorm and an untied output
head. For FP8 runs every nn.Linear (qkv, attention projection, both MLP layers, head)
becomes an fp8mix.Linear (convert_model); embeddings, LayerNorms, attention scores and
softmax and the loss stay in float32. The bfloat16 run uses torch.autocast.

The corpus is read from disk and needs no download: by default the running
interpreter's own standard library (``sysconfig.get_paths()["stdlib"]``, every ``*.py``
outside site-packages, sorted by path, read as bytes); ``--data`` points at any text
file or folder. The last 10% of the bytes are the validation split. Every run starts
from the same initial weights (deep copies of one seeded model) and sees the same
batches (start offsets drawn up front from a seeded generator).

Outputs (in ``--out``): ``loss_curves.png``, ``loss_curves.csv`` (run, step, split,
loss) and ``results.json`` (config, and one entry per run with its summary and curves).
The exit code is 1 when any run diverged (non-finite loss), else 0.

Checkpoints and resume (``--checkpoint-dir DIR``, ``--checkpoint-every N``, ``--resume``):
every N steps, and after a run's last step, each run writes ``DIR/<run>.stepNNNNNNNN.pt``
(NNNNNNNN = steps done) atomically: a hidden temp file in DIR, flushed and fsynced, then
os.replace onto the final name and an fsync of DIR; the last two are kept. A checkpoint
holds the model's state_dict (with the FP8 buffers of fp8mix.Linear layers), the
optimizer's, the gradient scaler's (None when the run has none), the steps done, torch's
RNG state (and CUDA's), the batch start offsets, the run's curves and counters, and its
configuration. ``--resume`` continues every run from its newest readable checkpoint (an
unreadable one is skipped with a warning, temp files are never read), refuses one written
with another configuration, and does not retrain a run whose final checkpoint exists.
The continued losses are bit-identical to an uninterrupted run's on the same machine,
library versions and thread count. ``--loss-log FILE`` writes one line per training step,
``<run> <step> <repr(loss)> <loss.hex()>``, flushed each step; on resume each run's lines
are rewritten from its checkpoint first, so after a killed and resumed run the file equals
an uninterrupted run's.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import functools
import hashlib
import json
import math
import os
import re
import statistics
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cli import UsageError

VAL_FRACTION = 0.10
MAX_CORPUS_BYTES = 256 * 2 ** 20  # reading stops after this much
RUN_NAMES = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block")
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "fp8": "fp8-delayed", "delayed": "fp8-delayed",
           "current": "fp8-current", "block": "fp8-block"}


# ---- data ----------------------------------------------------------------------------
def _stdlib_files() -> list[str]:
    """The stdlib's *.py files, sorted, without site-packages/dist-packages."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    return sorted(files)


def _folder_files(root: str) -> list[str]:
    """Every regular, non-hidden file under `root`, sorted by path."""
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        files += [os.path.join(d, n) for n in names if not n.startswith(".")]
    return sorted(f for f in files if os.path.isfile(f))


def load_corpus(path: str | None) -> tuple[torch.Tensor, str]:
    """The corpus as a uint8 tensor, and a one-line description of where it came from.
    Folders skip files that look binary (a NUL byte in their first 1 KiB)."""
    if path is None:
        stdlib = sysconfig.get_paths()["stdlib"]
        files, where = _stdlib_files(), f"Python {sys.version.split()[0]} stdlib *.py ({stdlib})"
    elif os.path.isdir(path):
        files, where = _folder_files(path), f"files under {path}"
    elif os.path.isfile(path):
        files, where = [path], path
    else:
        raise UsageError(f"--data {path!r}: no such file or folder")
    chunks, total = [], 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        if len(files) > 1 and b"\0" in b[:1024]:
            continue
        chunks.append(b)
        total += len(b)
        if total >= MAX_CORPUS_BYTES:
            break
    data = b"".join(chunks)
    if not data:
        raise UsageError(f"no readable text in {where}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), f"{where}: {len(chunks)} files, {len(data):,} bytes"


def split_corpus(data: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the last 10% of the bytes is validation; both must hold a sequence."""
    n_val = int(len(data) * VAL_FRACTION)
    train, val = data[: len(data) - n_val], data[len(data) - n_val:]
    if len(val) < seq_len + 2 or len(train) < seq_len + 2:
        raise UsageError(f"corpus of {len(data)} bytes is too small for --seq-len {seq_len} "
                         f"(need at least {int((seq_len + 2) / VAL_FRACTION) + 1} bytes)")
    return train, val


def batch(data: torch.Tensor, starts: torch.Tensor, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, (B, seq_len) int64 each, for the given start offsets."""
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    chunk = data[idx].long()
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


# ---- model ---------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small byte-level GPT: logits (B, T, 256) for input bytes (B, T)."""

    def __init__(self, layers: int, d_model: int, heads: int, seq_len: int, vocab: int = 256):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        for name, p in self.named_parameters():  # GPT-2 initialisation
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


# ---- runs ----------------------------------------------------------------------------
def pick_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown --device {name!r}; use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device available")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"unsupported --device {name!r}; use auto, cpu or cuda")
    return dev


def parse_recipes(spec: str) -> list[str]:
    """'fp32,bf16,delayed' -> canonical run names, in order, without duplicates."""
    names = []
    for raw in spec.split(","):
        n = raw.strip().lower()
        n = ALIASES.get(n, n)
        if n not in RUN_NAMES:
            raise UsageError(f"unknown recipe {raw.strip()!r}; choose from {', '.join(RUN_NAMES)} "
                             f"(aliases: {', '.join(ALIASES)})")
        if n not in names:
            names.append(n)
    if not names:
        raise UsageError("--recipes is empty")
    return names


@functools.lru_cache(maxsize=None)
def _fp8_recipe(name: str):
    """The recipe object of FP8 run `name` (one per name, shared by its steps)."""
    import fp8mix

    if name == "fp8-delayed":
        return fp8mix.recipe.DelayedScaling(fp8_format=fp8mix.Format.HYBRID, amax_history_len=16)
    if name == "fp8-current":
        return fp8mix.recipe.CurrentScaling(fp8_format=fp8mix.Format.HYBRID)
    return fp8mix.recipe.BlockScaling()


def precision_context(name: str, device: torch.device):
    """The context one training/eval step of run `name` executes in."""
    import fp8mix

    if name == "fp32":
        return contextlib.nullcontext()
    if name == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return fp8mix.fp8_autocast(enabled=True, fp8_recipe=_fp8_recipe(name))


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay towards 0 (the runs end near a minimum, so their
    final losses compare endpoints rather than points on a steep slope)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * t))


class SavedBytes:
    """saved_tensors_hooks that add up the bytes autograd keeps for backward (unique
    storages; parameters themselves excluded, since they exist anyway)."""

    def __init__(self, model: nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen = {}

    def pack(self, t: torch.Tensor):
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in self.params:
                self.seen[ptr] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. wrappers)
            pass
        return t

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @property
    def mib(self) -> float:
        return sum(self.seen.values()) / 2 ** 20


class CastCounter:
    """FP8 overflow/underflow bookkeeping of one run.

    - ``saturated_casts`` (delayed scaling, every step): casts whose recorded amax times
      the scale they were cast with is out of the format's range (beyond what rounds to
      max: 464 for E4M3, 61440 for E5M2), i.e. at least one element saturated. Counted per
      layer and role from the layers' fp8_amax_history and fp8_scale.
    - ``sampled`` (every sample step): each layer's input, weight and grad_output is cast
      again with fp8mix.quantize using the scale the layer used (current/block recipes: its
      own amax) and elements are counted: overflow = out of range (non-finite in a
      non-saturating cast), underflow = nonzero that became 0.
    """

    def __init__(self, model: nn.Module, name: str):
        import fp8mix

        self.recipe = _fp8_recipe(name)
        self.delayed = name == "fp8-delayed"
        self.layers = [m for m in model.modules() if isinstance(m, fp8mix.Linear)
                       and min(m.in_features, m.out_features) >= fp8mix.Linear.fp8_min_features]
        self.saturated_casts = 0
        self.casts = 0
        self.sampled = {r: {"numel": 0, "overflow": 0, "underflow": 0} for r in ("input", "weight", "grad_output")}
        self._before = None
        self._handles = []

    def before_step(self, sample: bool) -> None:
        """Snapshot scales/step counts; with `sample`, hook this step's casts."""
        if self.delayed:
            self._before = [(m.fp8_scale.clone(), m.fp8_steps.clone()) for m in self.layers]
        if sample:
            for m in self.layers:
                self._handles.append(m.register_forward_pre_hook(self._pre_hook))
                self._handles.append(m.register_forward_hook(self._post_hook))

    def after_step(self) -> None:
        """Count saturated casts of the step just run and remove the sampling hooks."""
        from .quantize import quantize
        from .recipe import role_format

        for h in self._handles:
            h.remove()
        self._handles = []
        if not self.delayed:
            return
        for m, (scale, steps) in zip(self.layers, self._before):
            for r, role in enumerate(("input", "weight", "grad_output")):
                if int(m.fp8_steps[r]) == int(steps[r]) or int(steps[r]) == 0:
                    continue  # not cast this step, or first cast (scaled from its own amax)
                self.casts += 1
                fmt = role_format(self.recipe.fp8_format, role)
                top = (m.fp8_amax_history[0, r] * scale[r]).reshape(1)  # fp32(amax * scale), as the cast
                if not torch.isfinite(quantize(top, fmt, 1.0, saturate=False).data.float()).all():
                    self.saturated_casts += 1  # the largest element was out of range: saturated

    @contextlib.contextmanager
    def saving(self):
        """Around model.state_dict(): fp8mix.Linear records the pending grad_output amaxes
        there (otherwise the next forward would), so count those casts as after_step does."""
        if not self.delayed:
            yield
            return
        self.before_step(False)
        try:
            yield
        finally:
            self.after_step()

    def _count(self, m, role: str, r: int, x: torch.Tensor) -> None:
        from .inspect_model import cast_stats
        from .recipe import BlockScaling, role_format

        fmt = role_format(self.recipe.fp8_format, role)
        gran = ("block2d" if role == "weight" else "block") if isinstance(self.recipe, BlockScaling) else "tensor"
        scale = m.fp8_scale[r] if self.delayed and int(m.fp8_steps[r]) > 0 else None
        st = cast_stats(x, fmt, scale, gran, sqnr=False)
        for k in ("numel", "overflow", "underflow"):
            self.sampled[role][k] += st[k]

    def _pre_hook(self, m, args):
        self._count(m, "input", 0, args[0])
        self._count(m, "weight", 1, m.weight)

    def _post_hook(self, m, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: self._count(m, "grad_output", 2, g))

    def summary(self) -> dict:
        """The counts, plus percentages of sampled elements."""
        s = {"saturated_casts": self.saturated_casts if self.delayed else None,
             "casts_checked": self.casts if self.delayed else None, "sampled": {}}
        for role, c in self.sampled.items():
            n = max(c["numel"], 1)
            s["sampled"][role] = dict(c, overflow_pct=100.0 * c["overflow"] / n,
                                      underflow_pct=100.0 * c["underflow"] / n)
        tot = {k: sum(c[k] for c in self.sampled.values()) for k in ("numel", "overflow", "underflow")}
        s["sampled_overflow_pct"] = 100.0 * tot["overflow"] / max(tot["numel"], 1)
        s["sampled_underflow_pct"] = 100.0 * tot["underflow"] / max(tot["numel"], 1)
        return s


@torch.no_grad()
def evaluate(model, name, device, val, val_starts, seq_len) -> float:
    """Mean validation loss over the fixed validation batches, in the run's precision."""
    model.eval()
    losses = []
    for starts in val_starts:
        x, y = batch(val, starts, seq_len, device)
        with precision_context(name, device):
            logits = model(x)
        losses.append(float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))))
    model.train()
    return sum(losses) / len(losses)


# ---- checkpoints -------------------------------------------------------------------------
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


def run_config(name: str, cfg, device: torch.device, corpus_id: dict) -> dict:
    """What run `name`'s numbers depend on; a checkpoint resumes only under an equal one."""
    c = {k: getattr(cfg, k) for k in CONFIG_KEYS}
    c.update(run=name, device=device.type, recipe=repr(_fp8_recipe(name)) if name.startswith("fp8") else None)
    c.update(corpus_id)
    return c


def corpus_identity(corpus: torch.Tensor) -> dict:
    """Size and SHA-256 of the corpus bytes (the data a checkpoint was trained on)."""
    return {"corpus_bytes": int(corpus.numel()), "corpus_sha256": hashlib.sha256(corpus.numpy()).hexdigest()}


def _env_info() -> dict:
    """Not checked on resume, only reported: bit-identity also needs these to match."""
    import fp8mix
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
        env = _env_info()
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
        self.f = None
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


def make_scaler(name: str, device: torch.device):
    """The run's gradient scaler (torch.amp.GradScaler's interface), or None: FP8 runs
    get fp8mix.FP8GradScaler (skips steps with inf/NaN gradients, reacts to the FP8
    gradient casts' counts); float32 and bfloat16 runs need none."""
    if not name.startswith("fp8"):
        return None
    import fp8mix
    return fp8mix.FP8GradScaler(device=device.type)


def train_one(name, base, cfg, data, device, progress=True, *, ckpt: Checkpointing | None = None,
              resume_from=None, config: dict | None = None, loss_log: LossLog | None = None,
              earlier: tuple = (), monitor=None) -> dict:
    """Train a copy of `base` as run `name`; returns its summary and curves.

    ckpt: checkpoint every ckpt.every steps and after the last step (config goes in them);
    resume_from: (path, checkpoint dict) to continue from (find_resume_checkpoint);
    loss_log: per-step losses (earlier: the runs already in the log before this one);
    monitor: ``monitor(step, train_curve) -> str | None`` after each step (train_curve
    includes restored steps); a string stops the run as diverged, with that reason."""
    from tqdm import tqdm

    import fp8mix

    train, val, train_starts, val_starts = data
    t_run = time.perf_counter()
    model = copy.deepcopy(base).to(device)
    counter = None
    if name.startswith("fp8"):
        fp8mix.convert_model(model)
        counter = CastCounter(model, name)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    scaler = make_scaler(name, device)
    saved = SavedBytes(model)
    train_curve, val_curve, times = [], [], []
    diverged, stop_reason, start, wall_before = False, None, 0, 0.0
    done = False
    if resume_from is not None:
        path, ck = resume_from
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        if scaler is not None and ck["scaler"] is not None:
            scaler.load_state_dict(ck["scaler"])
        torch.set_rng_state(ck["rng"]["torch"])
        if device.type == "cuda" and ck["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])
        order = ck["data_order"]
        if not (torch.equal(order["train_starts"], train_starts) and torch.equal(order["val_starts"], val_starts)):
            print(f"warning: {path}: this torch draws other batch offsets from the seed; continuing with the "
                  "checkpoint's", file=sys.stderr)
        train_starts, val_starts = order["train_starts"], order["val_starts"]
        p = ck["progress"]
        train_curve, val_curve, times = list(p["train_curve"]), list(p["val_curve"]), list(p["times"])
        diverged, stop_reason, wall_before = p["diverged"], p["stop_reason"], p["wall_s"]
        saved.seen = {0: int(p["saved_bytes"])}
        if counter is not None and p["counter"] is not None:
            counter.saturated_casts, counter.casts, counter.sampled = (
                p["counter"]["saturated_casts"], p["counter"]["casts"], p["counter"]["sampled"])
        start, done = ck["step"], ck["done"]
        print(f"{name}: " + (f"already complete in {path} ({start} steps); not retraining" if done else
                             f"resuming from {path} (step {start} of {cfg.steps})"), flush=True)
    if loss_log is not None:
        loss_log.start_run(name, list(earlier), train_curve)
    if ckpt is not None:
        remove_stale_temp_files(ckpt.folder, name)

    def checkpoint(steps_done: int, final: bool) -> None:
        with counter.saving() if counter is not None else contextlib.nullcontext():
            model_state = model.state_dict()  # fp8mix.Linear records pending grad amaxes first
        ckpt.save(name, steps_done, {
            "format": CKPT_FORMAT, "run": name, "step": steps_done, "done": final, "config": config,
            "env": _env_info(),
            "model": model_state,
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None},
            "data_order": {"train_starts": train_starts, "val_starts": val_starts},
            "progress": {"train_curve": train_curve, "val_curve": val_curve, "times": times,
                         "diverged": diverged, "stop_reason": stop_reason, "saved_bytes": sum(saved.seen.values()),
                         "wall_s": wall_before + time.perf_counter() - t_run,
                         "counter": None if counter is None else {
                             "saturated_casts": counter.saturated_casts, "casts": counter.casts,
                             "sampled": counter.sampled}}})

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bar = tqdm(range(start, cfg.steps if not done else start), desc=f"{name:>11}", unit="step",
               disable=not progress, leave=True, dynamic_ncols=True, file=sys.stderr, initial=start,
               total=cfg.steps)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        x, y = batch(train, train_starts[step], cfg.seq_len, device)
        sample = counter is not None and (step % cfg.eval_every == 0 or step == cfg.steps - 1)
        if counter is not None:
            counter.before_step(sample)
        sync()
        t0 = time.perf_counter()
        with saved.hooks() if step == 0 else contextlib.nullcontext():
            with precision_context(name, device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
            else:
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        if counter is not None:
            counter.after_step()
        lv = loss.item()
        train_curve.append((step, lv))
        if loss_log is not None:
            loss_log.write(name, step, lv)
        if not math.isfinite(lv):
            diverged, stop_reason = True, "non-finite loss"
        elif monitor is not None:
            stop_reason = monitor(step, train_curve)
            diverged = stop_reason is not None
        if diverged:
            bar.set_postfix_str(f"diverged ({stop_reason})")
            if ckpt is not None:
                checkpoint(step + 1, True)
            break
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            val_curve.append((step, evaluate(model, name, device, val, val_starts, cfg.seq_len)))
            bar.set_postfix(loss=f"{lv:.3f}", val=f"{val_curve[-1][1]:.3f}")
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{lv:.3f}")
        if ckpt is not None and ckpt.due(step + 1, cfg.steps):
            checkpoint(step + 1, step + 1 == cfg.steps)
    bar.close()
    if loss_log is not None:
        loss_log.close()
    if scaler is not None:
        scaler.close()  # stop the FP8 gradient-cast counts this run's scaler asked for
    tail = [v for _, v in train_curve[-max(1, cfg.steps // 10):]]
    res = {
        "run": name, "diverged": diverged, "stop_reason": stop_reason, "steps_done": len(train_curve),
        "resumed_from_step": start if resume_from is not None else None,
        "final_train_loss": sum(tail) / len(tail) if not diverged and tail else float("nan"),
        "final_val_loss": val_curve[-1][1] if val_curve and not diverged else float("nan"),
        "step_ms_median": 1000.0 * statistics.median(times[1:] or times) if times else float("nan"),
        "train_steps_s": sum(times), "run_wall_s": wall_before + time.perf_counter() - t_run,
        "saved_for_backward_mib": saved.mib,
        "peak_cuda_mib": torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None,
        "fp8": counter.summary() if counter is not None else None,
        "scaler": None if scaler is None else {
            "scale": scaler.get_scale(), "fp8_skips": scaler.fp8_skips, "fp8_backoffs": scaler.fp8_backoffs,
            "fp8_growths": scaler.fp8_growths},
        "train_curve": train_curve, "val_curve": val_curve,
    }
    return res


# ---- reporting -------------------------------------------------------------------------
def _pct(v):
    return "-" if v is None else f"{v:.2f}"


def format_table(results: list, on_cuda: bool) -> str:
    """The comparison table (fixed-width text)."""
    ref = next((r for r in results if r["run"] == "fp32" and not r["diverged"]), None)
    mem = "peak CUDA MiB" if on_cuda else "saved MiB"
    hdr = (f"{'run':<12} {'train loss':>10} {'val loss':>9} {'dval %':>7} {'step ms':>8} {mem:>13} "
           f"{'sat casts':>11} {'ovf %':>6} {'unf %':>6}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        dv = "-"
        if ref is not None and not r["diverged"]:
            dv = f"{100.0 * (r['final_val_loss'] - ref['final_val_loss']) / ref['final_val_loss']:+.2f}"
        m = r["peak_cuda_mib"] if on_cuda else r["saved_for_backward_mib"]
        f = r["fp8"]
        if f is None:
            sat, ovf, unf = "-", "-", "-"
        else:
            sat = "n/a" if f["saturated_casts"] is None else f"{f['saturated_casts']}/{f['casts_checked']}"
            ovf, unf = _pct(f["sampled_overflow_pct"]), _pct(f["sampled_underflow_pct"])
        status = "  DIVERGED" if r["diverged"] else ""
        lines.append(f"{r['run']:<12} {r['final_train_loss']:>10.4f} {r['final_val_loss']:>9.4f} {dv:>7} "
                     f"{r['step_ms_median']:>8.1f} {m:>13.1f} {sat:>11} {ovf:>6} {unf:>6}{status}")
    return "\n".join(lines)


LEGEND = """\
train loss: mean of the last 10% of steps; val loss: fixed validation batches after the last step;
dval %: val loss vs float32; step ms: median training step (forward+backward+optimizer);
{mem}
sat casts (delayed scaling): FP8 casts in which the tensor's amax times its scale was out of the
format's range (some elements saturated) / casts checked, over all steps, layers and roles;
ovf % / unf %: elements of sampled casts (input, weight, grad_output of every FP8 layer, every
--eval-every steps) that were out of range / nonzero but cast to 0."""


def write_outputs(out: str, cfg, corpus_desc: str, results: list) -> list[str]:
    """PNG, CSV and JSON of the curves in `out`; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .inspect_model import json_safe

    os.makedirs(out, exist_ok=True)
    png, csv_path, js = (os.path.join(out, n) for n in ("loss_curves.png", "loss_curves.csv", "results.json"))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    ref = dict(next((r["val_curve"] for r in results if r["run"] == "fp32"), []))
    for i, r in enumerate(results):
        color = f"C{i}"
        if r["train_curve"]:
            s, v = zip(*r["train_curve"])
            k = max(1, len(v) // 50)  # light smoothing: running mean over ~2% of the run
            sm = [sum(v[max(0, j - k + 1): j + 1]) / len(v[max(0, j - k + 1): j + 1]) for j in range(len(v))]
            ax.plot(s, sm, color=color, alpha=0.5, lw=1, label=f"{r['run']} train")
        if r["val_curve"]:
            s, v = zip(*r["val_curve"])
            ax.plot(s, v, color=color, marker="o", ms=3, lw=1.5, label=f"{r['run']} val")
            pts = [(k, 100.0 * (x - ref[k]) / ref[k]) for k, x in r["val_curve"] if k in ref and ref[k]]
            if pts and r["run"] != "fp32":
                ax2.plot(*zip(*pts), color=color, marker="o", ms=3, label=r["run"])
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(f"fp8mix demo: GPT {cfg.layers}x{cfg.d_model}, seq {cfg.seq_len}, batch {cfg.batch_size}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax2.axhline(0.0, color="k", lw=0.8)
    ax2.axhspan(-1.0, 1.0, color="0.9", zorder=0)
    ax2.set_xlabel("step")
    ax2.set_ylabel("val loss vs float32 (%)")
    ax2.set_title("difference from float32 (grey: within 1%)")
    ax2.grid(alpha=0.3)
    if ax2.lines[1:]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "split", "loss"])
        for r in results:
            for split in ("train", "val"):
                for s, v in r[f"{split}_curve"]:
                    w.writerow([r["run"], s, split, f"{v:.6f}"])
    with open(js, "w") as f:
        config = {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool, type(None)))}
        json.dump(json_safe({"config": config, "corpus": corpus_desc, "runs": results}), f, indent=2)
    return [png, csv_path, js]


# ---- the command -----------------------------------------------------------------------
def check_args(cfg) -> None:
    """Usage errors for sizes that cannot work."""
    for k in ("steps", "batch_size", "seq_len", "layers", "d_model", "eval_every", "eval_batches", "heads"):
        v = getattr(cfg, k)
        if v is not None and v < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    if cfg.d_model % cfg.heads:
        raise UsageError(f"--d-model {cfg.d_model} is not divisible by --heads {cfg.heads}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise UsageError(f"--lr must be > 0, got {cfg.lr}")
    ckdir, every = getattr(cfg, "checkpoint_dir", None), getattr(cfg, "checkpoint_every", None)
    if every is not None and every < 1:
        raise UsageError(f"--checkpoint-every must be >= 1, got {every}")
    if ckdir is None and every is not None:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if ckdir is None and getattr(cfg, "resume", False):
        raise UsageError("--resume needs --checkpoint-dir (the folder to resume from)")


def prepare_checkpoints(args, names: list, device: torch.device, corpus: torch.Tensor):
    """(Checkpointing or None, {run: config}, {run: (path, checkpoint) to resume from}).
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
    configs = {n: run_config(n, args, device, cid) for n in names}
    resume = {}
    for n in names:
        if not args.resume:
            existing = list_checkpoints(folder, n)
            if existing:
                raise UsageError(f"--checkpoint-dir {folder} already holds checkpoints of run {n} (step "
                                 f"{existing[-1][0]}); pass --resume to continue from them or use an empty folder")
            continue
        found = find_resume_checkpoint(folder, n, configs[n])
        if found is not None:
            resume[n] = found
    return ckpt, configs, resume


def run(args: argparse.Namespace) -> int:
    """Entry point of `python -m fp8mix demo` (args from fp8mix.cli). Returns the exit code."""
    if args.heads is None:
        args.heads = max(1, args.d_model // 32)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    check_args(args)
    names = parse_recipes(args.recipes)
    device = pick_device(args.device)
    if device.type == "cuda" and any(n.startswith("fp8") for n in names) and not \
            torch._C._dispatch_has_kernel_for_dispatch_key("fp8mix::scaled_mm", "CUDA"):
        raise UsageError("this fp8mix build has no CUDA kernels; use --device cpu or --recipes fp32,bf16")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {args.out!r}: {exc.strerror}") from None
    corpus, desc = load_corpus(args.data)
    train, val = split_corpus(corpus, args.seq_len)
    gen = torch.Generator().manual_seed(args.seed)
    train_starts = torch.randint(0, len(train) - args.seq_len - 1, (args.steps, args.batch_size), generator=gen)
    val_starts = torch.randint(0, len(val) - args.seq_len - 1, (args.eval_batches, args.batch_size), generator=gen)
    torch.manual_seed(args.seed)
    base = GPT(args.layers, args.d_model, args.heads, args.seq_len)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"fp8mix demo: corpus {desc}")
    print(f"model: GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, {n_params:,} parameters; "
          f"{args.steps} steps of {args.batch_size}x{args.seq_len} bytes, AdamW lr {args.lr:g}; device {device}, "
          f"{torch.get_num_threads()} threads")
    print(f"runs: {', '.join(names)}", flush=True)
    ckpt, configs, resume = prepare_checkpoints(args, names, device, corpus)
    loss_log = LossLog(args.loss_log, bool(getattr(args, "resume", False))) \
        if getattr(args, "loss_log", None) else None
    if ckpt is not None:
        print(f"checkpoints: {ckpt.folder} every {ckpt.every} steps"
              + (f"; resuming {len(resume)} of {len(names)} runs" if ckpt.resume else ""), flush=True)
    t0 = time.perf_counter()
    results = []
    for i, n in enumerate(names):
        results.append(train_one(n, base, args, (train, val, train_starts, val_starts), device,
                                 not args.no_progress, ckpt=ckpt, resume_from=resume.pop(n, None),
                                 config=configs.get(n), loss_log=loss_log, earlier=tuple(names[:i])))
    wall = time.perf_counter() - t0
    paths = write_outputs(args.out, args, desc, results)
    on_cuda = device.type == "cuda"
    mem = ("peak CUDA MiB: torch.cuda.max_memory_allocated during the run" if on_cuda else
           "saved MiB: bytes autograd saved for backward in one step (unique storages, parameters excluded)")
    print()
    print(format_table(results, on_cuda))
    print()
    print(LEGEND.format(mem=mem))
    print()
    _print_summary(results)
    print(f"total training time {wall:.1f} s; wrote {', '.join(paths)}")
    return 1 if any(r["diverged"] for r in results) else 0


def _print_summary(results: list) -> None:
    """A few sentences on what the table shows."""
    ref = next((r for r in results if r["run"] == "fp32" and not r["diverged"]), None)
    for r in results:
        if r["diverged"]:
            print(f"{r['run']}: DIVERGED ({r.get('stop_reason') or 'non-finite loss'} at step {r['steps_done'] - 1})")
            continue
        line = f"{r['run']}: {r['run_wall_s']:.0f} s, val loss {r['final_val_loss']:.4f}"
        if ref is not None and r is not ref:
            d = 100.0 * (r["final_val_loss"] - ref["final_val_loss"]) / ref["final_val_loss"]
            verdict = "within" if abs(d) <= 1.0 else "NOT within"
            line += f" ({d:+.2f}% vs float32, {verdict} 1%)"
        f = r["fp8"]
        if f is not None:
            unf = ", ".join(f"{role} {c['underflow_pct']:.3f}%" for role, c in f["sampled"].items())
            line += f"; sampled underflow: {unf}"
        print(line)
