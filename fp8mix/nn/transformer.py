"""fp8mix.TransformerLayer: Transformer Engine's pre-norm encoder layer, its QKV and output
projections and its MLP in FP8, attention through torch's scaled_dot_product_attention.

    x = hidden_states                                   [s, b, H] ("sbhd") or [b, s, H] ("bshd")
    q, k, v = self_attention.layernorm_qkv(x)           LayerNormLinear: H -> (np + 2 ng) hn
    a = sdpa(q, k, v, mask, dropout=attention_dropout)  np query heads, ng key/value groups
    x = x + dropout(self_attention.proj(a), hidden_dropout)
    y = x + dropout(layernorm_mlp(x), hidden_dropout)   LayerNormMLP
    (output_layernorm=True: y = layernorm(y))

Module names and parameters are TE's (``self_attention.layernorm_qkv.*``,
``self_attention.proj.*``, ``layernorm_mlp.*``). TE's default (fuse_qkv_params=False)
keeps query / key / value weights as separate parameters and concatenates them every
step; fp8mix keeps one QKV weight ``[query; key; value]`` (TE's non-interleaved layout)
and loads TE's ``query_weight`` / ``key_weight`` / ``value_weight`` (and biases) into it.
With fuse_qkv_params=True and qkv_weight_interleaved=True (TE's fused default) the weight
is interleaved per group ``[ng, (np/ng + 2), hn]``, as TE's. Query head h attends with
key/value group h // (np / ng), as TE's (and SDPA's enable_gqa).

Masks (TE's convention: True = masked out): "causal" (no tensor), "no_mask",
"padding" ([b, 1, 1, s_k]), "padding_causal", "arbitrary" (broadcastable to
[b, np, s_q, s_k]). Not implemented (TypeError/NotImplementedError naming them):
cross attention (layer_type="decoder"), rotary embeddings, attention biases, inference
caches, sliding windows, drop path, parallel attention-MLP, tensor/sequence parallelism.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .norms import LayerNorm, RMSNorm
from .te_options import TECheckpointMixin, apply_init, te_default_init, te_options

__all__ = ["TransformerLayer", "MultiheadAttention", "DotProductAttention"]

_MASKS = ("causal", "no_mask", "padding", "padding_causal", "arbitrary")
_SPLIT = ("query", "key", "value")


class DotProductAttention(nn.Module):
    """softmax(q k^T / sqrt(hn) + mask) v through F.scaled_dot_product_attention, on
    [b, heads, s, hn] tensors; attention_dropout in training only."""

    def __init__(self, attention_dropout: float):
        super().__init__()
        self.attention_dropout = float(attention_dropout)

    def forward(self, q, k, v, mask_type: str, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        p = self.attention_dropout if self.training else 0.0
        sq, sk = q.shape[-2], k.shape[-2]
        allowed = None  # SDPA's convention: True = attend
        if mask_type in ("padding", "padding_causal", "arbitrary"):
            if attention_mask is None:
                raise ValueError(f"fp8mix.TransformerLayer: self_attn_mask_type={mask_type!r} needs attention_mask "
                                 "(bool, True = masked out)")
            if attention_mask.dtype != torch.bool:
                raise TypeError(f"fp8mix.TransformerLayer: attention_mask must be bool (True = masked out), got "
                                f"{attention_mask.dtype}")
            allowed = ~attention_mask
        causal = mask_type in ("causal", "padding_causal")
        if causal and allowed is not None:
            tril = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            allowed, causal = allowed & tril, False
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal,
                                              enable_gqa=gqa)


class MultiheadAttention(TECheckpointMixin, nn.Module):
    """TE's self-attention block: layernorm_qkv (LayerNormLinear), core_attention, proj."""

    def __init__(self, hidden_size: int, num_attention_heads: int, *, kv_channels, num_gqa_groups, attention_dropout,
                 layernorm_epsilon, init_method, output_layer_init_method, attn_mask_type, fuse_qkv_params,
                 qkv_weight_interleaved, zero_centered_gamma, bias, normalization, params_dtype, device, qkv_format,
                 return_layernorm_output):
        super().__init__()
        np_ = num_attention_heads
        ng = np_ if num_gqa_groups is None else num_gqa_groups
        if not isinstance(ng, int) or ng < 1 or np_ % ng:
            raise ValueError(f"fp8mix.TransformerLayer: num_attention_heads ({np_}) must be a multiple of "
                             f"num_gqa_groups ({num_gqa_groups})")
        hn = kv_channels or hidden_size // np_
        self.num_attention_heads, self.num_gqa_groups, self.hidden_size_per_attention_head = np_, ng, hn
        self.qkv_weight_interleaved = bool(fuse_qkv_params and qkv_weight_interleaved)
        self.attn_mask_type, self.qkv_format = attn_mask_type, qkv_format
        common = dict(params_dtype=params_dtype, device=device)
        self.layernorm_qkv = LayerNormLinear(hidden_size, (np_ + 2 * ng) * hn, eps=layernorm_epsilon, bias=bias,
                                             normalization=normalization, zero_centered_gamma=zero_centered_gamma,
                                             return_layernorm_output=return_layernorm_output,
                                             init_method=init_method, **common)
        self.core_attention = DotProductAttention(attention_dropout)
        self.proj = Linear(np_ * hn, hidden_size, bias=bias, device=device, dtype=params_dtype)
        apply_init("TransformerLayer", self.proj.weight, output_layer_init_method or te_default_init)
        if bias:
            with torch.no_grad():
                self.proj.bias.zero_()

    def _split(self, mixed: torch.Tensor):
        """[..., (np + 2 ng) hn] -> q [..., np, hn], k and v [..., ng, hn] (TE's layouts)."""
        np_, ng, hn = self.num_attention_heads, self.num_gqa_groups, self.hidden_size_per_attention_head
        lead = mixed.shape[:-1]
        if self.qkv_weight_interleaved:
            g = mixed.view(*lead, ng, np_ // ng + 2, hn)
            q, k, v = g.split([np_ // ng, 1, 1], dim=-2)
            return q.reshape(*lead, np_, hn), k.reshape(*lead, ng, hn), v.reshape(*lead, ng, hn)
        q, k, v = mixed.split([np_ * hn, ng * hn, ng * hn], dim=-1)
        return q.view(*lead, np_, hn), k.view(*lead, ng, hn), v.view(*lead, ng, hn)

    def forward(self, x, attention_mask, mask_type: str, is_first_microbatch, checkpoint_core_attention: bool):
        out = self.layernorm_qkv(x, is_first_microbatch=is_first_microbatch)
        mixed, ln_out = out if isinstance(out, tuple) else (out, None)
        q, k, v = self._split(mixed)
        # to [b, heads, s, hn]: sbhd [s, b, h, d] -> [b, h, s, d]; bshd [b, s, h, d] -> [b, h, s, d]
        perm = (1, 2, 0, 3) if self.qkv_format == "sbhd" else (0, 2, 1, 3)
        q, k, v = (t.permute(*perm) for t in (q, k, v))
        if checkpoint_core_attention:
            a = torch.utils.checkpoint.checkpoint(self.core_attention, q, k, v, mask_type, attention_mask,
                                                  use_reentrant=False)
        else:
            a = self.core_attention(q, k, v, mask_type, attention_mask)
        back = (2, 0, 1, 3) if self.qkv_format == "sbhd" else (0, 2, 1, 3)
        a = a.permute(*back).reshape(*mixed.shape[:-1], -1)
        return self.proj(a, is_first_microbatch=is_first_microbatch), ln_out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """TE's split QKV parameters (fuse_qkv_params=False) load into the one QKV weight."""
        base = prefix + "layernorm_qkv."
        for kind in ("weight", "bias"):
            parts = [base + f"{n}_{kind}" for n in _SPLIT]
            if all(p in state_dict for p in parts) and base + kind not in state_dict:
                state_dict[base + kind] = torch.cat([state_dict.pop(p) for p in parts], dim=0)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def _check_layer_options(hidden_dropout, attention_dropout, self_attn_mask_type, attn_input_format, layer_type,
                         drop_path_rate, parallel_attention_mlp, window_size) -> None:
    for name, p in (("hidden_dropout", hidden_dropout), ("attention_dropout", attention_dropout)):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"fp8mix.TransformerLayer: {name} must be a probability in [0, 1], got {p!r}")
    if self_attn_mask_type not in _MASKS:
        raise ValueError(f"fp8mix.TransformerLayer: self_attn_mask_type must be one of {list(_MASKS)}, got "
                         f"{self_attn_mask_type!r}")
    if attn_input_format not in ("sbhd", "bshd"):
        raise ValueError(f"fp8mix.TransformerLayer: attn_input_format must be 'sbhd' (TE's default) or 'bshd', got "
                         f"{attn_input_format!r}")
    for name, bad in (("layer_type='decoder' (cross attention)", layer_type != "encoder"),
                      ("drop_path_rate > 0", drop_path_rate), ("parallel_attention_mlp=True", parallel_attention_mlp),
                      ("window_size (sliding-window attention)", window_size not in (None, (-1, -1), (-1, 0)))):
        if bad:
            raise NotImplementedError(f"fp8mix.TransformerLayer: {name} is Transformer Engine's; fp8mix does not "
                                      "implement it")


# TE forward arguments with no counterpart here, and the value that means "not used".
_FORWARD_OFF = {"window_size": None, "encoder_output": None, "enc_dec_attn_mask": None,
                "enc_dec_attn_mask_type": None, "enc_dec_window_size": None, "inference_params": None,
                "rotary_pos_emb": None, "core_attention_bias_type": "no_bias", "core_attention_bias": None,
                "alibi_slopes": None, "cu_seqlens_q": None, "cu_seqlens_kv": None, "cu_seqlens_q_padded": None,
                "cu_seqlens_kv_padded": None, "max_seqlen_q": None, "max_seqlen_kv": None, "pad_between_seqs": None}
_FORWARD_IGNORED = ("fast_zero_fill",)


def _check_forward_options(options: dict) -> None:
    for name, v in options.items():
        if name in _FORWARD_IGNORED:
            continue
        if name not in _FORWARD_OFF:
            raise TypeError(f"fp8mix.TransformerLayer.forward() got an unexpected keyword argument {name!r}")
        off = _FORWARD_OFF[name]
        if not (v is off or (isinstance(v, str) and v == off) or (name == "window_size" and v in ((-1, -1), (-1, 0)))):
            raise NotImplementedError(f"fp8mix.TransformerLayer.forward: {name}={v!r} is Transformer Engine's; fp8mix "
                                      "does not implement it (rotary embeddings, attention biases, inference caches, "
                                      "packed sequences, cross attention)")


class TransformerLayer(TECheckpointMixin, nn.Module):
    """Transformer Engine's TransformerLayer (encoder, pre-norm): self-attention and MLP
    blocks with residual connections, every GEMM in FP8 under fp8_autocast.

    Args (TE's names and defaults): hidden_size, ffn_hidden_size, num_attention_heads,
    num_gqa_groups=None, layernorm_epsilon=1e-5, hidden_dropout=0.1, attention_dropout=0.1,
    init_method / output_layer_init_method (callables on QKV+FC1 / PROJ+FC2 weights;
    default normal(0, 0.023)), kv_channels, self_attn_mask_type="causal", params_dtype,
    apply_residual_connection_post_layernorm, output_layernorm, fuse_qkv_params,
    qkv_weight_interleaved, zero_centered_gamma, bias=True, activation="gelu",
    normalization="LayerNorm", device, attn_input_format="sbhd" | "bshd". TE's
    parallelism and overlap options raise NotImplementedError; get_rng_state_tracker,
    layer_number, seq_length, micro_batch_size, name are accepted and ignored."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.1,
                 attention_dropout: float = 0.1, init_method: Optional[Callable] = None,
                 output_layer_init_method: Optional[Callable] = None, kv_channels: Optional[int] = None,
                 self_attn_mask_type: str = "causal", window_size=None, params_dtype: Optional[torch.dtype] = None,
                 apply_residual_connection_post_layernorm: bool = False, output_layernorm: bool = False,
                 parallel_attention_mlp: bool = False, layer_type: str = "encoder", drop_path_rate: float = 0.0,
                 fuse_qkv_params: bool = False, zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 bias: bool = True, activation: str = "gelu", normalization: str = "LayerNorm", device=None,
                 attn_input_format: str = "sbhd", **te_kwargs):
        super().__init__()
        te_options("TransformerLayer", te_kwargs)
        _check_layer_options(hidden_dropout, attention_dropout, self_attn_mask_type, attn_input_format, layer_type,
                             drop_path_rate, parallel_attention_mlp, window_size)
        self.hidden_dropout, self.self_attn_mask_type = float(hidden_dropout), self_attn_mask_type
        self.attn_input_format = attn_input_format
        self.apply_residual_connection_post_layernorm = bool(apply_residual_connection_post_layernorm)
        post = self.apply_residual_connection_post_layernorm
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, kv_channels=kv_channels, num_gqa_groups=num_gqa_groups,
            attention_dropout=attention_dropout, layernorm_epsilon=layernorm_epsilon, init_method=init_method,
            output_layer_init_method=output_layer_init_method, attn_mask_type=self_attn_mask_type,
            fuse_qkv_params=fuse_qkv_params, qkv_weight_interleaved=qkv_weight_interleaved,
            zero_centered_gamma=zero_centered_gamma, bias=bias, normalization=normalization,
            params_dtype=params_dtype, device=device, qkv_format=attn_input_format, return_layernorm_output=post)
        self.layernorm_mlp = LayerNormMLP(hidden_size, ffn_hidden_size, eps=layernorm_epsilon, bias=bias,
                                          normalization=normalization, activation=activation,
                                          zero_centered_gamma=zero_centered_gamma, return_layernorm_output=post,
                                          params_dtype=params_dtype, device=device, init_method=init_method,
                                          output_layer_init_method=output_layer_init_method)
        self.layernorm: Optional[nn.Module] = None
        if output_layernorm:
            cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = cls(hidden_size, eps=layernorm_epsilon, zero_centered_gamma=zero_centered_gamma,
                                 params_dtype=params_dtype, device=device)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                self_attn_mask_type: Optional[str] = None, is_first_microbatch=None,
                checkpoint_core_attention: bool = False, **unsupported) -> torch.Tensor:
        """TE's forward for an encoder layer. attention_mask: bool, True = masked out (for
        "padding" [b, 1, 1, s], "arbitrary" broadcastable to [b, np, s, s]; None for
        "causal" / "no_mask"); self_attn_mask_type overrides the constructor's."""
        _check_forward_options(unsupported)
        mask_type = self_attn_mask_type or self.self_attn_mask_type
        if mask_type not in _MASKS:
            raise ValueError(f"fp8mix.TransformerLayer: self_attn_mask_type must be one of {list(_MASKS)}, got "
                             f"{mask_type!r}")
        if hidden_states.dim() != 3:
            raise ValueError(f"fp8mix.TransformerLayer: hidden_states must be 3-D ({self.attn_input_format}), got "
                             f"shape {tuple(hidden_states.shape)}")
        p = self.hidden_dropout if self.training else 0.0
        attn, ln1 = self.self_attention(hidden_states, attention_mask, mask_type, is_first_microbatch,
                                        checkpoint_core_attention)
        residual = ln1 if ln1 is not None else hidden_states
        x = residual + F.dropout(attn, p)
        mlp = self.layernorm_mlp(x, is_first_microbatch=is_first_microbatch)
        mlp, ln2 = mlp if isinstance(mlp, tuple) else (mlp, None)
        y = (ln2 if ln2 is not None else x) + F.dropout(mlp, p)
        return self.layernorm(y) if self.layernorm is not None else y
