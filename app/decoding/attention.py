"""Attention in float32 for any model dtype, registered through transformers' AttentionInterface.

On CPU, PyTorch's bfloat16 scaled-dot-product attention is several times slower than float32
for single-token decoding (about 650 us vs 75 us per layer at 900 cached tokens on this 2-core
machine), so bfloat16 models spend a third of each step in attention. Here attention runs in
float32 over a float32 KV cache (see kv_cache.py: stored once, not re-cast per step); the
projections and MLPs stay in the model's dtype.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "specdec_sdpa_fp32"
SMALL_QUERY = 128


def sdpa_fp32(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """query (b, heads, q, d); key/value (b, kv_heads, kv, d); returns (b, q, heads, d) like transformers' own."""
    b, heads, q, d = query.shape
    if q > SMALL_QUERY or (attention_mask is None and q > 1):
        # Prefill: PyTorch's fused kernel, which never materialises the q x kv score matrix.
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        out, _ = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, scaling=scaling, **kwargs
        )
        return out.to(query.dtype), None
    # Decoding and tree verification: a few query rows. The fused CPU kernel is slow with an explicit
    # mask, so do it with two matmuls, query heads grouped under their shared KV head (no repeat_kv copy).
    kv_heads, kv = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else d**-0.5
    scores = (query.float().reshape(b, kv_heads, group * q, d) @ key.float().transpose(-1, -2)) * scale
    if attention_mask is not None:
        scores = scores.view(b, kv_heads, group, q, kv)
        mask = attention_mask[:, :, -q:, -kv:].unsqueeze(1)  # (b, 1, 1, q, kv) over (kv_heads, group)
        # The lowest finite value, not -inf: a row with no allowed key (a left-padding query of a
        # batch) must stay finite, or its NaN becomes the next layer's keys and reaches every row.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask.float()
    out = scores.view(b, kv_heads, group * q, kv).softmax(-1) @ value.float()
    return out.view(b, heads, q, d).transpose(1, 2).contiguous().to(query.dtype), None


def register() -> str:
    """Make NAME usable as `attn_implementation`; idempotent. Returns NAME."""
    AttentionInterface.register(NAME, sdpa_fp32)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def kv_dtype(config) -> torch.dtype | None:
    """The dtype a KV cache should store for this model: float32 under NAME, else the model's own."""
    return torch.float32 if getattr(config, "_attn_implementation", None) == NAME else None
