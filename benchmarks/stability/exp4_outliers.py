"""Experiment 4: an outlier channel under per-tensor scaling flushes the inliers.

OutlierWrap gives the input of both MLP output projections (fc_out, 256 channels) one
extra channel, inserted at index 5 so that it shares a 1x128 tile with real channels,
holding K x rms(input) at the first token of every sequence ("massive activations") and 0
elsewhere; its weight column is 0 and stays 0, so float32 computes the same function
(sanity row). Per-tensor scaling must fit K into 448, which pushes the inliers down by K
into E4M3's subnormals and below; 1x128 block scaling confines the damage to the one tile
of each first token that holds the outlier.
"""
from __future__ import annotations

import time

import common as C
import torch

import fp8mix

K_MAIN = 1e5
CHANNEL = 5


def outliers(k: float):
    def inject(model, seed):
        C.wrap_linears(model, ("fc_out",), lambda lin: C.OutlierWrap(lin, k, CHANNEL))
        return None
    return inject


def variants(k: float, with_refs: bool = True):
    R = fp8mix.recipe
    H = fp8mix.Format.HYBRID
    inj = outliers(k)
    tag = f"K={k:.0e}"
    vs = []
    if with_refs:
        vs += [C.FP32,
               C.Variant("current per-tensor, no outliers", "recipe", recipe=R.CurrentScaling(fp8_format=H))]
    vs += [
        C.Variant(f"fp32 + outliers {tag} (sanity)", inject=inj, cache=f"fp32+outlier{k:g}"),
        C.Variant(f"delayed per-tensor + outliers {tag}", "recipe", inject=inj,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=16)),
        C.Variant(f"current per-tensor + outliers {tag}", "recipe", inject=inj, recipe=R.CurrentScaling(fp8_format=H)),
        C.Variant(f"block 1x128 + outliers {tag}", "recipe", inject=inj, recipe=R.BlockScaling()),
    ]
    return vs


def mechanism() -> list:
    g = torch.Generator().manual_seed(0)
    rows = []
    for k in (1e3, 1e4, 1e5):
        x = torch.randn(512, 256, generator=g)
        rms = float(x.pow(2).mean().sqrt())
        x[::64, CHANNEL] = k * rms  # the first token of each of 8 sequences
        inl = torch.ones_like(x, dtype=torch.bool)
        inl[::64, CHANNEL] = False
        for gran in ("tensor", "block"):
            q = fp8mix.quantize(x, C.E4M3, granularity=gran)
            d = q.dequantize()
            xi, di = x[inl], d[inl]
            und = float(((di == 0) & (xi != 0)).sum()) / float((xi != 0).sum())
            sq = 10 * torch.log10(xi.pow(2).sum() / (xi - di).pow(2).sum())
            rows.append({"outlier K x rms": f"{k:.0e}", "scaling": "per-tensor" if gran == "tensor" else "1x128 blocks",
                         "inliers flushed %": C.pct(und, 2), "inlier SQNR dB": f"{float(sq):.1f}"})
    return rows


def metrics(name, runs):
    return {"fc_out input underflow %": C.pct(C.metric_mean(runs, "input", "underflow_frac", layer="fc_out"), 2),
            "fc_out input subnormal %": C.pct(C.metric_mean(runs, "input", "subnormal_frac", layer="fc_out"), 1),
            "fc_out input kurtosis": C.fmt_num(C.metric_mean(runs, "input", "kurtosis", layer="fc_out"), ".0f"),
            "fc_out input amax": C.fmt_num(C.metric_mean(runs, "input", "amax", layer="fc_out"), ".3g")}


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt = C.gpt_task()
    ks = (K_MAIN,) if quick else (1e3, 1e4, 1e5)
    res = {}
    for i, k in enumerate(ks):
        res.update(C.sweep(gpt, variants(k, with_refs=(i == 0)), m, label="exp4 "))
    rows = C.summarize(res, metrics=metrics)
    mech = mechanism()

    tag = f"K={K_MAIN:.0e}"
    fig, ax = C.figure(2)
    names = ["fp32", "current per-tensor, no outliers", f"fp32 + outliers {tag} (sanity)",
             f"delayed per-tensor + outliers {tag}", f"current per-tensor + outliers {tag}",
             f"block 1x128 + outliers {tag}"]
    C.plot_losses(ax[0][0], res, f"GPT with outliers {tag} at fc_out input: loss", names=names, ylim=(1.8, 4.0))
    ax2 = ax[0][1]
    for n in names[3:]:
        rs = C.aggregate_records([x for x in res[n][0].extra["records"] if "fc_out" in x["layer"]])
        rs = [x for x in rs if x["role"] == "input"]
        ax2.plot([x["step"] for x in rs], [100 * x["underflow_frac"] for x in rs], marker=".", label=n)
    ax2.set_title("fc_out input: underflow (% of non-zero), first run", fontsize=9)
    ax2.set_xlabel("step")
    ax2.set_ylabel("%")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    plot = C.save(fig, "exp4_outliers.png")
    csv = C.write_metrics_csv(res, "exp4_metrics.csv")

    parts = []
    for k in ks:
        t = f"K={k:.0e}"
        pt, bl = C.row_of(rows, f"current per-tensor + outliers {t}"), C.row_of(rows, f"block 1x128 + outliers {t}")
        parts.append(f"K={k:.0e}: per-tensor flushes {pt['fc_out input underflow %']}% of the fc_out inputs "
                     f"(loss {pt['_rel']:+.2f}% vs float32), 1x128 blocks {bl['fc_out input underflow %']}% "
                     f"(loss {bl['_rel']:+.2f}%)")
    ref = C.row_of(rows, "current per-tensor, no outliers")
    hurt = [k for k in ks if C.compare(res, f"current per-tensor + outliers K={k:.0e}",
                                       "current per-tensor, no outliers")[1] > 0]
    fixed = all(C.compare(res, f"block 1x128 + outliers K={k:.0e}", "current per-tensor, no outliers")[1] <= 0
                for k in hurt)
    cmps = "; ".join(f"K={k:.0e} per-tensor vs no outliers "
                     + C.compare(res, f"current per-tensor + outliers K={k:.0e}", "current per-tensor, no outliers")[0]
                     + ", block vs no outliers "
                     + C.compare(res, f"block 1x128 + outliers K={k:.0e}", "current per-tensor, no outliers")[0]
                     for k in ks)
    fix_note = "; block scaling fixes it" if fixed else ""
    verdict = ((f"**Reproduced (K = {', '.join(f'{k:.0e}' for k in hurt)}){fix_note}.** "
                if hurt else "**Mechanism reproduced (inliers flushed); the loss effect is within noise at this "
                "scale.** ")
               + "; ".join(parts) + f". Without outliers the same recipe has {ref['fc_out input underflow %']}% "
               f"underflow. Paired differences: {cmps}. "
               + ("Block scaling removes the flushing in the forward cast: only the tile holding the outlier is "
                  "affected. " if fixed else "Block scaling removes the flushing in the forward cast but does not "
                  "close the loss gap here. ")
               + "Caveat: fp8mix keeps the activation for the weight gradient in 128x128 blocks, so there every "
               "block column that holds the outlier channel is still scaled by it (not monitored; the remaining "
               "gap, if any, comes from there).")
    body = "\n".join([
        f"GPT: {gpt.desc}. Runs: {C.runs_text(m)}. FP8 rows: HYBRID (E4M3 forward) per-tensor, or BlockScaling "
        "(E4M3, 1x128 activation/gradient tiles, 128x128 weight blocks).",
        "", "Mechanism (N(0,1) 512x256, one channel = K x rms at 8 tokens; E4M3):", "", C.md_table(mech),
        "Training:", "", C.md_table(rows),
        f"![exp4]({plot})  (per-step metrics: [{csv}]({csv}))", "", verdict, ""])
    return C.Section(4, "An outlier channel under per-tensor scaling", body, rows, [plot], time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
