"""A KV cache that grows in place: amortised O(1) appends instead of one full copy per step.

transformers' DynamicLayer appends with torch.cat, which copies the whole cache of every layer at
every forward pass; at a few hundred tokens of context that copy costs more than the attention.
This layer keeps a buffer with spare room and hands out views of its filled part, so attention
sees exactly the cached tokens (same shapes, same numerics as DynamicCache).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    def __init__(self, dtype: torch.dtype | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.storage_dtype = dtype  # None: the dtype of the incoming keys and values
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            capacity = max(end, 2 * length, 256)
            self._k = self._bigger(self._k, key_states, length, capacity, self.storage_dtype or key_states.dtype)
            self._v = self._bigger(self._v, value_states, length, capacity, self.storage_dtype or value_states.dtype)
        self._k[..., length:end, :] = key_states
        self._v[..., length:end, :] = value_states
        # crop() (inherited) shortens these views; the next update writes right after their end.
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only these batch rows (the buffers too, so later updates write into the kept rows)."""
        if self._k is None:
            return
        end = self.get_seq_length()
        self._k, self._v = self._k[indices], self._v[indices]
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]

    @staticmethod
    def _bigger(old: torch.Tensor | None, like: torch.Tensor, length: int, capacity: int, dtype) -> torch.Tensor:
        new = torch.empty((*like.shape[:-2], capacity, like.shape[-1]), dtype=dtype, device=like.device)
        if length:
            new[..., :length, :] = old[..., :length, :]
        return new


def new_cache(config, dtype: torch.dtype | None = None) -> Cache:
    """A growing cache (storing `dtype`, default the model's) for models whose every layer is full
    attention; DynamicCache otherwise."""
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    if set(types) != {"full_attention"} or getattr(text, "sliding_window", None):
        return DynamicCache(config=config)
    return Cache(layers=[GrowingLayer(dtype) for _ in types])
