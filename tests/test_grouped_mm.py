"""fp8mix.ops.scaled_grouped_mm (the MoE grouped GEMM, one C call per layer): each group's
rows against fp8mix's single GEMM of that group (bit for bit) and against float64 on the
FP8 values torch itself produced (torch's float8 casts), for every scale kind, both layouts
of b, empty groups and sizes that are multiples of nothing; bad input names the problem."""
import pytest
import torch

import fp8mix
from fp8mix import Granularity as G
from fp8mix import ops

E4 = torch.float8_e4m3fn


def _operands(sizes, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = sum(sizes)
    a = (torch.randn(m, k, generator=g) * 4).to(E4)
    w = (torch.randn(len(sizes), n, k, generator=g) * 4).to(E4)  # experts' (N, K) weights
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return a, w, offs


def _scales(kind, m, n, k, groups, g):
    def pos(*shape):
        return torch.rand(*shape, generator=g) + 0.05
    def pow2(*shape):
        return torch.exp2(torch.randint(-4, 5, shape, generator=g).float())
    kb, kb32, nb = -(-k // 128), -(-k // 32), -(-n // 128)
    return {"tensor": (pos(groups), pos(groups)), "row": (pos(m), pos(groups, n)),
            "block": (pos(m, kb), pos(groups, kb, nb)), "mx": (pow2(m, kb32), pow2(groups, n, kb32))}[kind]


def _single(a_g, w_g, sa_g, sb_g, kind, bias_g):
    gran = {"tensor": (G.TENSOR, G.TENSOR), "row": (G.ROW, G.ROW), "block": (G.BLOCK, G.BLOCK2D),
            "mx": (G.MX, G.MX)}[kind]
    if kind == "row":  # torch._scaled_mm's rowwise layout: (M, 1) and (1, N)
        sa_g, sb_g = sa_g.reshape(-1, 1), sb_g.reshape(1, -1)
    return ops.scaled_mm(a_g, w_g.t(), sa_g, sb_g, bias=bias_g, scale_granularity=gran)


def _reference(a_g, w_g, sa_g, sb_g, kind):
    """float64 on the FP8 values, each product scaled by its operands' scales."""
    x, w = a_g.double(), w_g.double()  # (m, k), (n, k)
    k = x.shape[1]
    if kind == "tensor":
        return (x * sa_g.double()) @ (w * sb_g.double()).T
    if kind == "row":
        return (x * sa_g.double()[:, None]) @ (w * sb_g.double()[:, None]).T
    if kind == "mx":
        sa, sb = sa_g.double().repeat_interleave(32, 1)[:, :k], sb_g.double().repeat_interleave(32, 1)[:, :k]
        return (x * sa) @ (w * sb).T
    sa = sa_g.double().repeat_interleave(128, 1)[:, :k]
    sb = sb_g.double().repeat_interleave(128, 0)[:k].repeat_interleave(128, 1)[:, : w.shape[0]]  # (k, n)
    return (x * sa) @ (w.T * sb)


@pytest.mark.parametrize("kind", ["tensor", "row", "block", "mx"])
@pytest.mark.parametrize("column_major", [True, False])
def test_each_group_is_its_single_gemm(kind, column_major):
    sizes, n, k = [5, 0, 19, 1, 33], 24, 160
    a, w, offs = _operands(sizes, n, k, seed=len(kind))
    gen = torch.Generator().manual_seed(7)
    sa, sb = _scales(kind, a.shape[0], n, k, len(sizes), gen)
    bias = torch.randn(len(sizes), n, generator=gen)
    b = w.transpose(1, 2) if column_major else w.transpose(1, 2).contiguous()  # (G, K, N) either way
    out = ops.scaled_grouped_mm(a, b, sa, sb, offs=offs, bias=bias)
    assert out.shape == (a.shape[0], n) and out.dtype == torch.float32
    r0 = 0
    for gi, r1 in enumerate(offs.tolist()):
        if r1 > r0:
            sa_g = sa[gi] if kind == "tensor" else sa[r0:r1]
            want = _single(a[r0:r1], w[gi], sa_g, sb[gi], kind, bias[gi])
            assert torch.equal(out[r0:r1], want), f"group {gi}"
            ref = _reference(a[r0:r1], w[gi], sa_g, sb[gi], kind) + bias[gi].double()
            torch.testing.assert_close(out[r0:r1].double(), ref, rtol=k * 2 ** -23, atol=1e-3)
        r0 = r1


def test_bf16_output_and_no_bias():
    a, w, offs = _operands([3, 4], 16, 32)
    sa, sb = torch.ones(2), torch.full((2,), 0.5)
    out = ops.scaled_grouped_mm(a, w.transpose(1, 2), sa, sb, offs=offs, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    ref = torch.cat([(a[:3].float() @ w[0].float().T) * 0.5, (a[3:].float() @ w[1].float().T) * 0.5])
    assert torch.equal(out, ref.to(torch.bfloat16))  # products exact, one rounding to bf16


def test_bad_input_names_the_problem():
    a, w, offs = _operands([3, 4], 16, 32)
    b = w.transpose(1, 2)
    s2 = torch.ones(2)
    with pytest.raises(ValueError, match="offs must have one entry per group"):
        ops.scaled_grouped_mm(a, b, s2, s2, offs=offs[:1])
    with pytest.raises(ValueError):  # a negative group (decreasing offsets)
        ops.scaled_grouped_mm(a, b, s2, s2, offs=torch.tensor([5, 4], dtype=torch.int32), scale_kind=0)
    with pytest.raises(ValueError):  # offsets that do not end at M
        ops.scaled_grouped_mm(a, b, s2, s2, offs=torch.tensor([3, 6], dtype=torch.int32), scale_kind=0)
    with pytest.raises(ValueError, match="no scale layout matches"):
        ops.scaled_grouped_mm(a, b, torch.ones(3), s2, offs=offs)
    with pytest.raises(ValueError, match="b's groups are"):
        ops.scaled_grouped_mm(a, w, s2, s2, offs=offs)  # (G, N, K) instead of (G, K, N)
    with pytest.raises(ValueError, match="finite and > 0"):
        ops.scaled_grouped_mm(a, b, s2, torch.tensor([1.0, float("nan")]), offs=offs)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a = torch.empty(10, 32, dtype=E4)
        b = torch.empty(3, 32, 16, dtype=E4)
        out = ops.scaled_grouped_mm(a, b, torch.empty(3), torch.empty(3), offs=torch.empty(3, dtype=torch.int32),
                                    scale_kind=0)
        assert out.shape == (10, 16)
    assert fp8mix.ops.grouped_scale_kind(torch.empty(10, 32), torch.empty(3, 32, 16), torch.empty(10),
                                         torch.empty(3, 16)) == 1
