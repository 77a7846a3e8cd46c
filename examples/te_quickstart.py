"""Transformer Engine's quickstart ("Getting Started", docs/examples/quickstart.ipynb),
ported by changing only the two import lines:

    import transformer_engine.pytorch as te                        ->  import fp8mix as te
    from transformer_engine.common.recipe import Format, ...       ->  from fp8mix.recipe import Format, ...

It builds the same four versions of a GPT encoder layer — plain PyTorch, then with
te.Linear / te.LayerNorm, then with the fused te.LayerNormLinear / te.LayerNormMLP, then
te.TransformerLayer — shares one set of parameters between them as the quickstart's
utilities do, times forward + backward of each, and finally runs the TransformerLayer
under te.fp8_autocast with the quickstart's DelayedScaling recipe. The only other
changes from the notebook: the device is the CPU unless CUDA is there (timing with
time.perf_counter instead of CUDA events), the sizes are small by default
(--hidden 4096 --seq 2048 --batch 4 --ffn 16384 --heads 32 are the notebook's), and the
layer uses fuse_qkv_params=True so that TE's interleaved QKV layout matches the plain
layer's fused projection and the four versions compute the same function.

    python examples/te_quickstart.py [--hidden 256 --seq 128 --batch 4 --ffn 1024 --heads 8]
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Optional

import torch

import fp8mix as te
from fp8mix.recipe import DelayedScaling, Format

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def speedometer(module, inp, output_grad, forward_kwargs=None, fp8_autocast_kwargs=None, timing_iters=5,
                warmup_iters=2) -> float:
    """Mean forward + backward time in ms (the quickstart's, with a host timer)."""
    forward_kwargs = forward_kwargs or {}
    fp8_autocast_kwargs = fp8_autocast_kwargs or {"enabled": False}
    for _ in range(warmup_iters):
        with te.fp8_autocast(**fp8_autocast_kwargs):
            output = module(inp, **forward_kwargs)
        output.backward(output_grad)
    start = time.perf_counter()
    for _ in range(timing_iters):
        with te.fp8_autocast(**fp8_autocast_kwargs):
            output = module(inp, **forward_kwargs)
        output.backward(output_grad)
    return (time.perf_counter() - start) * 1e3 / timing_iters


class DotProductAttention(torch.nn.Module):
    """Attention in plain PyTorch (the quickstart's utility), [s, b, np, hn] inputs."""

    def __init__(self, num_attention_heads: int, kv_channels: int, attention_dropout: float) -> None:
        super().__init__()
        self.projection_size = kv_channels * num_attention_heads
        self.norm_factor = math.sqrt(kv_channels)
        self.dropout = torch.nn.Dropout(attention_dropout)

    def forward(self, query, key, value, attention_mask: Optional[torch.Tensor] = None):
        sq, b, np_, hn = query.shape
        scores = torch.einsum("sbhd,tbhd->bhst", query, key) / self.norm_factor
        if attention_mask is None:  # TE's default mask type is causal
            attention_mask = torch.ones(sq, sq, dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(attention_mask, float("-inf"))
        probs = self.dropout(torch.softmax(scores, dim=-1))
        context = torch.einsum("bhst,tbhd->sbhd", probs, value)
        return context.reshape(sq, b, self.projection_size)


class BasicMLP(torch.nn.Module):
    def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(hidden_size, ffn_hidden_size, bias=True)
        self.linear2 = torch.nn.Linear(ffn_hidden_size, hidden_size, bias=True)

    def forward(self, x):
        return self.linear2(torch.nn.functional.gelu(self.linear1(x), approximate="tanh"))


class BasicTransformerLayer(torch.nn.Module):
    """The quickstart's plain-PyTorch GPT encoder layer."""

    def __init__(self, hidden_size, ffn_hidden_size, num_attention_heads, layernorm_eps=1e-5, attention_dropout=0.1,
                 hidden_dropout=0.1, ln=torch.nn.LayerNorm, linear=torch.nn.Linear, mlp=BasicMLP):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.kv_channels = hidden_size // num_attention_heads
        self.ln1 = ln(hidden_size, eps=layernorm_eps)
        self.qkv_projection = linear(hidden_size, 3 * hidden_size, bias=True)
        self.attention = DotProductAttention(num_attention_heads, self.kv_channels, attention_dropout)
        self.projection = linear(hidden_size, hidden_size, bias=True)
        self.dropout = torch.nn.Dropout(hidden_dropout)
        self.ln2 = ln(hidden_size, eps=layernorm_eps)
        self.mlp = mlp(hidden_size=hidden_size, ffn_hidden_size=ffn_hidden_size)

    def attention_block(self, x, qkv, attention_mask):
        qkv = qkv.view(qkv.size(0), qkv.size(1), self.num_attention_heads, 3 * self.kv_channels)
        q, k, v = torch.split(qkv, qkv.size(3) // 3, dim=3)
        return x + self.dropout(self.projection(self.attention(q, k, v, attention_mask)))

    def forward(self, x, attention_mask=None):
        x = self.attention_block(x, self.qkv_projection(self.ln1(x)), attention_mask)
        return x + self.mlp(self.ln2(x))


class BasicTEMLP(torch.nn.Module):
    def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__()
        self.linear1 = te.Linear(hidden_size, ffn_hidden_size, bias=True)
        self.linear2 = te.Linear(ffn_hidden_size, hidden_size, bias=True)

    def forward(self, x):
        return self.linear2(torch.nn.functional.gelu(self.linear1(x), approximate="tanh"))


class FusedTETransformerLayer(BasicTransformerLayer):
    """The quickstart's third version: te.LayerNormLinear for LN + QKV, te.LayerNormMLP."""

    def __init__(self, hidden_size, ffn_hidden_size, num_attention_heads, layernorm_eps=1e-5, attention_dropout=0.1,
                 hidden_dropout=0.1):
        torch.nn.Module.__init__(self)
        self.num_attention_heads = num_attention_heads
        self.kv_channels = hidden_size // num_attention_heads
        self.ln_qkv = te.LayerNormLinear(hidden_size, 3 * hidden_size, eps=layernorm_eps, bias=True)
        self.attention = DotProductAttention(num_attention_heads, self.kv_channels, attention_dropout)
        self.projection = te.Linear(hidden_size, hidden_size, bias=True)
        self.dropout = torch.nn.Dropout(hidden_dropout)
        self.ln_mlp = te.LayerNormMLP(hidden_size, ffn_hidden_size, eps=layernorm_eps, bias=True)

    def forward(self, x, attention_mask=None):
        x = self.attention_block(x, self.ln_qkv(x), attention_mask)
        return x + self.ln_mlp(x)


def share_parameters(models: dict, basic) -> None:
    """The quickstart's share_parameters_with_* utilities, in one place."""
    te_basic, fused, layer = models["te_basic"], models["fused"], models["te_layer"]
    for name in ("ln1", "ln2", "qkv_projection", "projection", "mlp.linear1", "mlp.linear2"):
        src, dst = basic.get_submodule(name), te_basic.get_submodule(name)
        dst.weight, dst.bias = src.weight, src.bias
    for dst, ln, qkv in ((fused.ln_qkv, basic.ln1, basic.qkv_projection),
                         (layer.self_attention.layernorm_qkv, basic.ln1, basic.qkv_projection)):
        dst.layer_norm_weight, dst.layer_norm_bias = ln.weight, ln.bias
        dst.weight, dst.bias = qkv.weight, qkv.bias
    fused.projection.weight, fused.projection.bias = basic.projection.weight, basic.projection.bias
    layer.self_attention.proj.weight = basic.projection.weight
    layer.self_attention.proj.bias = basic.projection.bias
    for dst in (fused.ln_mlp, layer.layernorm_mlp):
        dst.layer_norm_weight, dst.layer_norm_bias = basic.ln2.weight, basic.ln2.bias
        dst.fc1_weight, dst.fc1_bias = basic.mlp.linear1.weight, basic.mlp.linear1.bias
        dst.fc2_weight, dst.fc2_bias = basic.mlp.linear2.weight, basic.mlp.linear2.bias


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args(argv)
    hidden_size, sequence_length, batch_size = args.hidden, args.seq, args.batch
    ffn_hidden_size, num_attention_heads, dtype = args.ffn, args.heads, torch.float32

    torch.manual_seed(1234)
    x = torch.rand(sequence_length, batch_size, hidden_size).to(DEVICE, dtype=dtype)
    dy = torch.rand(sequence_length, batch_size, hidden_size).to(DEVICE, dtype=dtype)
    basic = BasicTransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads).to(DEVICE, dtype)
    models = {
        "te_basic": BasicTransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads, ln=te.LayerNorm,
                                          linear=te.Linear, mlp=BasicTEMLP),
        "fused": FusedTETransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads),
        "te_layer": te.TransformerLayer(hidden_size, ffn_hidden_size, num_attention_heads, fuse_qkv_params=True),
    }
    for m in models.values():
        m.to(DEVICE, dtype)
    share_parameters(models, basic)

    results: dict = {"input": x, "outputs": {}, "ms": {}}
    for name, m in [("basic", basic), *models.items()]:
        m.eval()  # dropout off, so the versions can be compared
        torch.manual_seed(1234)
        results["outputs"][name] = m(x, attention_mask=None).detach()
        m.train()
        results["ms"][name] = speedometer(m, x, dy, forward_kwargs={"attention_mask": None},
                                          timing_iters=args.iters)
        print(f"{name:>9}: mean time {results['ms'][name]:.1f} ms")

    fp8_recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    te_transformer = models["te_layer"]
    te_transformer.eval()
    torch.manual_seed(1234)
    with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
        results["outputs"]["te_layer_fp8"] = te_transformer(x, attention_mask=None).detach()
    te_transformer.train()
    results["ms"]["te_layer_fp8"] = speedometer(te_transformer, x, dy, forward_kwargs={"attention_mask": None},
                                                fp8_autocast_kwargs={"enabled": True, "fp8_recipe": fp8_recipe},
                                                timing_iters=args.iters)
    print(f"{'fp8':>9}: mean time {results['ms']['te_layer_fp8']:.1f} ms (TransformerLayer under fp8_autocast)")
    return results


if __name__ == "__main__":
    main()
