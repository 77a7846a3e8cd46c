"""Benchmark: the fused Transformer Engine modules against their unfused compositions, CPU.

    python benchmarks/bench_modules.py                  # M=2048 tokens, hidden 1024, ffn 4096
    python benchmarks/bench_modules.py --quick          # M=512, hidden 512, ffn 2048, fewer repeats
    python benchmarks/bench_modules.py --tokens 1024 --hidden 768 --ffn 3072 --recipe current

Pairs, same parameters, same FP8 recipe (DelayedScaling by default), run in one process:

    LayerNormLinear            vs  fp8mix.LayerNorm -> fp8mix.Linear            (hidden -> 3 hidden, QKV)
    LayerNormMLP (gelu)        vs  fp8mix.LayerNorm -> fp8mix.Linear -> F.gelu -> fp8mix.Linear
    LayerNormMLP (swiglu)      vs  the same with swiglu (chunk, silu, mul)

One step = a no-op weight update (so FP8 weights are re-cast, as in training), forward
and backward with the input requiring grad. Times are medians of round-robin
interleaved steps (load from other processes hits every variant alike).

Memory columns:
  peak MB    resident-set high-water mark of one step above the resident set before it
             (VmHWM after clear_refs; the script re-executes itself with
             MALLOC_MMAP_THRESHOLD_=65536 so that freed tensors leave the resident set)
  saved MB   bytes of every tensor autograd saves for backward in one forward that is not
             a parameter's own storage (saved_tensors_hooks, each storage counted once)
  hp saved   of those, high-precision storages of at least the input's size other than
             the input itself and, in an MLP, fc1's output h (the activation's input, which
             both variants keep for the activation's backward, as TE does): a normalized
             activation, an activation output or a piece of one

Targets (issue #14): the fused module's step is faster than the unfused one's and it
saves no high-precision normalized activation (or activation output): PASS/FAIL per pair.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

ENV_KEY = "MALLOC_MMAP_THRESHOLD_"
if os.environ.get(ENV_KEY) is None and sys.platform.startswith("linux"):
    os.environ[ENV_KEY] = "65536"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_model  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.nn.activations import act_hp  # noqa: E402
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling  # noqa: E402

RECIPES = {"delayed": DelayedScaling, "current": CurrentScaling, "block": BlockScaling}


def _status(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class UnfusedLinear(nn.Module):
    """fp8mix.LayerNorm then fp8mix.Linear, sharing a LayerNormLinear's parameters."""

    def __init__(self, f):
        super().__init__()
        self.ln, self.fc = fp8mix.LayerNorm(f.in_features), fp8mix.Linear(f.in_features, f.out_features)
        self.ln.weight, self.ln.bias = f.layer_norm_weight, f.layer_norm_bias
        self.fc.weight, self.fc.bias = f.weight, f.bias

    def forward(self, x):
        return self.fc(self.ln(x))


class UnfusedMLP(nn.Module):
    """fp8mix.LayerNorm -> fp8mix.Linear -> activation (torch) -> fp8mix.Linear."""

    def __init__(self, f):
        super().__init__()
        self.act = f._act
        self.ln = fp8mix.LayerNorm(f.hidden_size)
        self.fc1 = fp8mix.Linear(f.hidden_size, f.fc1_weight.shape[0])
        self.fc2 = fp8mix.Linear(f.ffn_hidden_size, f.hidden_size)
        self.ln.weight, self.ln.bias = f.layer_norm_weight, f.layer_norm_bias
        self.fc1.weight, self.fc1.bias = f.fc1_weight, f.fc1_bias
        self.fc2.weight, self.fc2.bias = f.fc2_weight, f.fc2_bias

    def forward(self, x):
        return self.fc2(act_hp(self.act, self.fc1(self.ln(x))))


class Case:
    """One module's training step and what its forward saves. h_numel: elements of the
    first GEMM's output h in an MLP (the activation's input, which both variants keep for
    the activation's backward, as Transformer Engine does), else None."""

    def __init__(self, module, tokens, hidden, recipe, h_numel=None):
        self.m, self.recipe, self.h_numel = module, recipe, h_numel
        self.x = torch.randn(tokens, hidden).requires_grad_()
        with torch.no_grad():
            self.g = torch.randn_like(module(self.x))

    def step(self):
        with torch.no_grad():
            for p in self.m.parameters():
                if p.dim() == 2:
                    p.add_(0.0)  # "optimizer update": new weight version
        self.x.grad = None
        for p in self.m.parameters():
            p.grad = None
        with fp8mix.fp8_autocast(fp8_recipe=self.recipe()):
            y = self.m(self.x)
        y.backward(self.g)

    def saved(self):
        """(saved bytes, bytes of saved high-precision activation-sized storages other than
        the input x and h): each storage counted once."""
        params = {p.untyped_storage().data_ptr() for p in self.m.parameters()}
        seen: dict = {}

        def pack(t):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st.data_ptr() not in params:
                    seen[st.data_ptr()] = (st.nbytes(), t.is_floating_point() and t.element_size() > 1)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), fp8mix.fp8_autocast(
                fp8_recipe=self.recipe()):
            self.m(self.x)
        seen.pop(self.x.untyped_storage().data_ptr(), None)
        hp = [n for n, is_hp in seen.values() if is_hp and n >= self.x.numel() * 4]
        if self.h_numel is not None and self.h_numel * 4 in hp:
            hp.remove(self.h_numel * 4)
        return sum(n for n, _ in seen.values()), sum(hp)

    def peak(self):
        self.x.grad = None
        for p in self.m.parameters():
            p.grad = None
        base = _status("VmRSS")
        if base is None or not _reset_hwm():
            return None
        self.step()
        hwm = _status("VmHWM")
        return None if hwm is None else hwm - base


def pairs(tokens, hidden, ffn, recipe):
    torch.manual_seed(0)
    lnl = fp8mix.LayerNormLinear(hidden, 3 * hidden)
    yield "LayerNormLinear", Case(lnl, tokens, hidden, recipe), Case(UnfusedLinear(lnl), tokens, hidden, recipe)
    for act in ("gelu", "swiglu"):
        mlp = fp8mix.LayerNormMLP(hidden, ffn, activation=act)
        h = tokens * mlp.fc1_weight.shape[0]
        yield (f"LayerNormMLP {act}", Case(mlp, tokens, hidden, recipe, h),
               Case(UnfusedMLP(mlp), tokens, hidden, recipe, h))


def mb(b):
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=None, help="rows M (batch x sequence); default 2048, quick 512")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size; default 1024, quick 512")
    ap.add_argument("--ffn", type=int, default=None, help="MLP size; default 4096, quick 2048")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="delayed")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per variant (default 7, quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per variant (default 2, quick 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tokens = a.tokens or (512 if a.quick else 2048)
    hidden = a.hidden or (512 if a.quick else 1024)
    ffn = a.ffn or (2048 if a.quick else 4096)
    iters, warmup = a.iters or (3 if a.quick else 7), a.warmup if a.warmup is not None else (1 if a.quick else 2)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print("# fused TE modules vs their unfused fp8mix compositions: forward+backward step on CPU\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"- machine: {cpu_model()}; {os.cpu_count()} logical CPUs; torch threads {torch.get_num_threads()}; "
          f"load average {load}")
    print(f"- python {platform.python_version()}, torch {torch.__version__}, fp8mix {fp8mix.__version__}, "
          f"fp8mix CPU kernels: {fp8mix.cpu_isa()}")
    print(f"- tokens {tokens}, hidden {hidden}, ffn {ffn}, recipe {a.recipe}; {warmup} warmup + {iters} timed "
          "steps per variant, median, interleaved\n")
    print("| module | variant | step ms | fused / unfused | peak MB | saved MB | hp saved MB | verdict |")
    print("|:---|:---|---:|---:|---:|---:|---:|:---|")
    t0, verdicts = time.time(), []
    for name, fused, unfused in pairs(tokens, hidden, ffn, RECIPES[a.recipe]):
        cases = {"fused": fused, "unfused": unfused}
        for _ in range(warmup):
            for c in cases.values():
                c.step()
        times = {k: [] for k in cases}
        for _ in range(iters):
            for k, c in cases.items():
                s = time.perf_counter()
                c.step()
                times[k].append(time.perf_counter() - s)
        med = {k: statistics.median(v) for k, v in times.items()}
        mem = {k: (c.peak(), *c.saved()) for k, c in cases.items()}
        ratio = med["fused"] / med["unfused"]
        ok = ratio < 1.0 and mem["fused"][2] == 0
        verdicts.append((name, ok, ratio))
        for k in cases:
            peak, saved, hp = mem[k]
            tail = f"{ratio:.3f}" if k == "fused" else ""
            verdict = ("PASS" if ok else "FAIL") if k == "fused" else ""
            print(f"| {name} | {k} | {med[k] * 1e3:.1f} | {tail} | {mb(peak)} | {mb(saved)} | {mb(hp)} | {verdict} |",
                  flush=True)
        del cases, fused, unfused
    print()
    print(f"- target (fused faster and no high-precision normalized/activation tensor saved): "
          f"{'MET' if all(v[1] for v in verdicts) else 'NOT MET'} "
          f"({', '.join(f'{n} {r:.2f}x' for n, _, r in verdicts)})")
    print(f"- total benchmark time {time.time() - t0:.0f} s")
    return 0 if all(v[1] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
