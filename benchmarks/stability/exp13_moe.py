"""Experiment 13: a tiny mixture-of-experts GPT — bf16, FP8 (delayed, current, block, MX)
and NVFP4 on fp8mix.GroupedLinear experts.

The byte-level GPT of experiment 12 with each block's MLP replaced by a top-2 mixture of
4 experts (router nn.Linear(d, 4) in float32 — fewer than 16 outputs, so fp8mix keeps it
in high precision — softmax over the two chosen logits as the combine weights, no
auxiliary load-balancing loss), the experts' two layers as fp8mix.GroupedLinear (one
grouped GEMM per layer, per-expert scales). The attention and head nn.Linears become
fp8mix.Linear through convert_model as in every experiment. 3 seeds at one learning rate,
gaps paired per seed against float32 and bf16 autocast with 95% Student-t intervals.
The per-tensor recipes run the experts through the grouped ops (one C call per step);
block, MX and NVFP4 run each expert as its own fp8mix GEMM step (fp8mix.nn._grouped).
NVFP4 as in experiment 12: every layer in 4 bits (``keep_last_layers_hp=0``).
"""
from __future__ import annotations

import statistics
import time

import common as C
import exp12_recipes as E12
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix
from fp8mix.recipe import BlockScaling, DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling
from fp8mix.tools import demo
from fp8mix.tools.demo.model import Block

SEEDS = (0, 1, 2)
LR = 3e-3
EXPERTS, TOP_K = 4, 2


class MoE(nn.Module):
    """Top-k mixture of GELU MLP experts on GroupedLinear layers: tokens sorted by expert,
    one grouped GEMM per layer, outputs weighted and added back per token."""

    def __init__(self, d_model: int, experts: int = EXPERTS, top_k: int = TOP_K):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d_model, experts)
        self.fc = fp8mix.GroupedLinear(experts, d_model, 4 * d_model)
        self.fc_out = fp8mix.GroupedLinear(experts, 4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        t = x.reshape(-1, shape[-1])
        top, idx = self.router(t).topk(self.top_k, dim=-1)
        w = top.softmax(dim=-1).flatten()
        expert = idx.flatten()
        order = torch.argsort(expert, stable=True)
        token = order // self.top_k
        splits = torch.bincount(expert, minlength=self.fc.num_gemms).tolist()
        h = self.fc_out(F.gelu(self.fc(t[token], splits)), splits) * w[order, None]
        return torch.zeros_like(t).index_add_(0, token, h.to(t.dtype)).reshape(shape)


class MoEBlock(Block):
    def __init__(self, d_model: int, heads: int):
        super().__init__(d_model, heads)
        del self.fc, self.fc_out
        self.moe = MoE(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, Cm = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(Cm, dim=-1)
        q, k, v = (u.reshape(B, T, self.heads, Cm // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, Cm))
        return x + self.moe(self.ln2(x))


def moe_task() -> C.Task:
    base = C.gpt_task()
    c = C.GPT_CFG

    def build(seed):
        torch.manual_seed(seed)
        model = demo.GPT(c["layers"], c["d_model"], c["heads"], c["seq_len"])
        model.blocks = nn.ModuleList(MoEBlock(c["d_model"], c["heads"]) for _ in range(c["layers"]))
        for name, p in model.blocks.named_parameters():  # the demo's GPT-2 initialisation
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / (2 * c["layers"]) ** 0.5 if "fc_out" in name or "proj" in name
                                else 0.02)
            elif "bias" in name:
                nn.init.zeros_(p)
        return model

    n = sum(p.numel() for p in build(0).parameters())
    desc = base.desc.split(" on ", 1)
    return C.Task("moe-gpt", build, base.batches, base.loss_fn, warmup=base.warmup,
                  desc=(f"{desc[0].split(' (')[0]} with a top-{TOP_K} MoE of {EXPERTS} GELU experts per block "
                        f"(GroupedLinear; {n / 1e3:.0f}k parameters) on {desc[1]}"))


def variants():
    return [C.FP32, C.Variant("bf16 autocast", "bf16", cache="bf16"),
            C.Variant("FP8 delayed (HYBRID)", "recipe", recipe=DelayedScaling(), monitor_every=0),
            C.Variant("FP8 current (HYBRID)", "recipe", recipe=Float8CurrentScaling(), monitor_every=0),
            C.Variant("FP8 block 1x128 / 128x128", "recipe", recipe=BlockScaling(), monitor_every=0),
            C.Variant("MXFP8 1x32", "recipe", recipe=MXFP8BlockScaling(), monitor_every=0),
            C.Variant("NVFP4 (RHT, SR, 2-D weights)", "recipe", recipe=NVFP4BlockScaling(keep_last_layers_hp=0),
                      monitor_every=0)]


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    task = moe_task()
    res = C.sweep(task, variants(), m, seeds=SEEDS, lrs=(LR,), label="exp13 ")
    secs = {k: statistics.mean(r.seconds for r in v) for k, v in res.items()}

    def metrics(name, runs):
        return {"gap vs fp32 %, 95% CI": E12.fmt_gap(E12.gap(runs, res["fp32"])),
                "gap vs bf16 %, 95% CI": E12.fmt_gap(E12.gap(runs, res["bf16 autocast"])),
                "s / run": f"{secs[name]:.1f}"}
    rows = C.summarize(res, metrics=metrics)
    fig, ax = C.figure(1)
    C.plot_losses(ax[0][0], res, "MoE GPT: loss by recipe", ylim=(1.8, 4.0))
    plot = C.save(fig, "exp13_moe.png")
    gaps = {k: E12.gap(v, res["fp32"]) for k, v in res.items() if k != "fp32"}
    apart = [k for k, g in gaps.items() if g[1] == g[1] and abs(g[0]) > g[1]]
    verdict = ("**No recipe's gap to float32 is distinguishable from zero with 3 seeds** (every 95% interval "
               "contains 0)" if not apart else
               "**Gaps distinguishable from zero: " + ", ".join(f"{k} {E12.fmt_gap(gaps[k])}%" for k in apart) + "**")
    verdict += (". The experts have per-expert scales (grouped ops for delayed / current, one GEMM step per "
                "expert for block / MX / NVFP4); intervals are 95% Student-t over the paired seeds; s / run is "
                "wall time on a shared machine (MX and NVFP4 run scalar-heavy GEMMs).")
    body = "\n".join([
        f"MoE GPT: {task.desc}. Runs: {C.runs_text(m, seeds=SEEDS, lrs=(LR,))}. Every variant from the same "
        "initial weights on the same batches; gaps are 100 (L - L_ref) / L_ref of the final loss (mean of the last "
        "10% of steps), paired per seed, mean ± the 95% half-width.", "", C.md_table(rows), f"![exp13]({plot})", "",
        verdict, ""])
    return C.Section(13, "A tiny mixture of experts: bf16, FP8 (delayed, current, block, MX) and NVFP4", body, rows,
                     [plot],
                     time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
