"""Attention in float32 for any model dtype, registered through transformers' AttentionInterface.

On CPU, PyTorch's bfloat16 scaled-dot-product attention is several times slower than float32
for single-token decoding (about 650 us vs 75 us per layer at 900 cached tokens on this 2-core
machine), so bfloat16 models spend a third of each step in attention. Here attention runs in
float32 over a float32 KV cache (see kv_cache.py: stored once, not re-cast per step); the
projections and MLPs stay in the model's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "specdec_sdpa_fp32"
SMALL_QUERY = 128


def sdpa_fp32(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """query (b, heads, q, d); key/value (b, kv_heads, kv, d); returns (b, q, heads, d) like transformers' own."""
    q = query.shape[2]
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    if q > SMALL_QUERY or (attention_mask is None and q > 1):
        # Prefill: transformers' own call (it works out causality when there is no mask).
        out, _ = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, scaling=scaling, **kwargs
        )
        return out.to(query.dtype), None
    # Decoding and tree verification: a few query rows against the whole cache. transformers would
    # repeat the KV heads here (it keeps enable_gqa for mask-free calls); the fused CPU kernel takes
    # the mask and the grouped heads as they are, 25-40 % faster than two matmuls and a softmax at a
    # few hundred cached tokens (even at ~900). A fully masked row (left padding in a batch) comes
    # out as zeros.
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, -q:, -key.shape[2] :]
    out = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous().to(query.dtype), None


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean (queries, keys) mask as the additive mask the attention functions take: 0 where
    allowed, the dtype's most negative value elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def register() -> str:
    """Make NAME usable as `attn_implementation`; idempotent. Returns NAME."""
    AttentionInterface.register(NAME, sdpa_fp32)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def kv_dtype(config) -> torch.dtype | None:
    """The dtype a KV cache should store for this model: float32 under NAME, else the model's own."""
    return torch.float32 if getattr(config, "_attn_implementation", None) == NAME else None
