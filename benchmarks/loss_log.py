"""Loss logs of short FP8 trainings, written bit for bit: the check that a refactor kept
every byte (``python benchmarks/loss_log.py --out a.json`` before, ``--out b.json`` after,
then ``--compare a.json b.json``).

Each case trains a small model for 30 steps (AdamW, fixed seeds, one thread) under one
recipe / module family / feature and records every step's loss as ``float.hex`` and a
SHA-256 of the final parameters and FP8 buffers. Nothing here times anything.

Covers: fp8mix.Linear under delayed, current, block, rowwise, MX and stochastic-rounding
recipes; torch.utils.checkpoint; gradient accumulation (is_first_microbatch); the fused TE
modules (LayerNormLinear, LayerNormMLP, TransformerLayer); a Hugging Face Conv1D layer's
in_out layout; bfloat16 autocast around fp8_autocast; the FP8 gradient scaler.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch
import torch.nn as nn

import fp8mix
from fp8mix import recipe as R

STEPS = 30


def _mlp(d: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.GELU(), nn.Linear(d, 16))


class _Ckpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _mlp(), nn.Linear(16, 16)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=False)
        return self.b(h)


class _TE(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_lin = fp8mix.LayerNormLinear(64, 128)
        self.mlp = fp8mix.LayerNormMLP(128, 256, activation="swiglu")
        self.layer = fp8mix.TransformerLayer(128, 256, 4, hidden_dropout=0.0, attention_dropout=0.0)
        self.head = fp8mix.Linear(128, 16)

    def forward(self, x):
        h = self.ln_lin(x)
        h = h + self.mlp(h)
        h = self.layer(h.reshape(4, 8, 128))
        return self.head(h.reshape(32, 128))


class _Conv1D(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers.pytorch_utils import Conv1D
        self.c1, self.c2 = Conv1D(256, 64), Conv1D(16, 256)

    def forward(self, x):
        return self.c2(torch.nn.functional.gelu(self.c1(x)))


def _state_hash(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        if isinstance(v, torch.Tensor) and not k.endswith("fp8_version"):  # (the layout's number, not state)
            h.update(k.encode())
            t = v.detach().cpu().contiguous()
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _train(make, recipe, *, convert: bool = True, micro: int = 1, bf16: bool = False, scaler: bool = False):
    torch.manual_seed(0)
    model = make()
    if convert:
        model = fp8mix.convert_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sc = fp8mix.FP8GradScaler(init_scale=2.0 ** 8) if scaler else None
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for k in range(micro):
            x = torch.randn(32, 64, generator=g)
            y = torch.randint(0, 16, (32,), generator=g)
            kw = {} if micro == 1 else {"is_first_microbatch": k == 0}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe):
                    out = model(x, **kw) if kw else model(x)
                loss = torch.nn.functional.cross_entropy(out.float(), y) / micro
            (sc.scale(loss) if sc else loss).backward()
            total += float(loss.detach())
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        losses.append(float(total).hex())
    return {"losses": losses, "state": _state_hash(model)}


class _MicroMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = fp8mix.Linear(64, 256), fp8mix.Linear(256, 16)

    def forward(self, x, is_first_microbatch=None):
        return self.b(torch.nn.functional.gelu(self.a(x, is_first_microbatch)), is_first_microbatch)


def cases():
    hy = fp8mix.Format.HYBRID
    return {
        "delayed": lambda: _train(_mlp, R.DelayedScaling(fp8_format=hy, amax_history_len=16)),
        "delayed_most_recent": lambda: _train(_mlp, R.DelayedScaling(fp8_format=hy, amax_history_len=4,
                                                                      amax_compute_algo="most_recent", margin=1)),
        "current": lambda: _train(_mlp, R.CurrentScaling(fp8_format=hy)),
        "current_pow2": lambda: _train(_mlp, R.CurrentScaling(fp8_format=hy, power_2_scale=True)),
        "block": lambda: _train(_mlp, R.BlockScaling()),
        "rowwise": lambda: _train(_mlp, R.RowwiseScaling()),
        "mxfp8": lambda: _train(_mlp, R.MXFP8BlockScaling()),
        "stochastic": lambda: _train(_mlp, R.DelayedScaling(fp8_format=hy, rounding={"grad": "stochastic"})),
        "stochastic_current": lambda: _train(_mlp, R.CurrentScaling(rounding="stochastic")),
        "checkpoint": lambda: _train(_Ckpt, R.DelayedScaling()),
        "microbatch": lambda: _train(_MicroMLP, R.DelayedScaling(), convert=False, micro=2),
        "te_modules": lambda: _train(_TE, R.DelayedScaling(), convert=False),
        "te_modules_block": lambda: _train(_TE, R.BlockScaling(), convert=False),
        "conv1d": lambda: _train(_Conv1D, R.DelayedScaling()),
        "bf16_autocast": lambda: _train(_mlp, R.DelayedScaling(), bf16=True),
        "grad_scaler": lambda: _train(_mlp, R.DelayedScaling(), scaler=True),
        "auto_format": lambda: _train(_mlp, R.DelayedScaling(fp8_format=fp8mix.Format.AUTO)),
        "rowwise_gw_hp": lambda: _train(_mlp, R.from_recipe_name("rowwise_with_gw_hp")),
        "e4m3_current_eps": lambda: _train(_mlp, R.CurrentScaling(fp8_format=fp8mix.Format.E4M3, amax_epsilon=1e-3)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the logs here (JSON)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two logs; exit 1 when they differ")
    p.add_argument("--only", nargs="*", help="case names")
    a = p.parse_args(argv)
    if a.compare:
        x, y = (json.load(open(f)) for f in a.compare)
        bad = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        for k in sorted(set(x) | set(y)):
            print(f"{k:22s} {'DIFFERENT' if k in bad else 'equal'}")
        print(f"{len(set(x) | set(y)) - len(bad)} equal, {len(bad)} different")
        return 1 if bad else 0
    torch.set_num_threads(1)
    fp8mix.set_gemm_order("canonical")  # the logs are compared byte for byte across machines
    out = {}
    for name, fn in cases().items():
        if a.only and name not in a.only:
            continue
        out[name] = fn()
        print(f"{name:22s} loss[0] {float.fromhex(out[name]['losses'][0]):.6f} "
              f"loss[-1] {float.fromhex(out[name]['losses'][-1]):.6f} state {out[name]['state'][:12]}",
              flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
