"""KV caches that do not copy themselves every step.

`SlotLayer` (the target's): a fixed buffer per layer that a pass writes at a position the target
sets, attended whole under a mask that hides what is not committed yet. Nothing is cropped or
re-allocated between passes, so every pass has the same shapes apart from its own width: what a
compiled forward needs to run without recompiling (target.py).

`GrowingLayer` (the drafters'): a cache that grows in place: amortised O(1) appends instead of one full copy per step.

transformers' DynamicLayer appends with torch.cat, which copies the whole cache of every layer at
every forward pass; at a few hundred tokens of context that copy costs more than the attention.
This layer keeps a buffer with spare room and hands out views of its filled part, so attention
sees exactly the cached tokens (same shapes, same numerics as DynamicCache).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, StaticLayer


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


class SlotLayer(StaticLayer):
    """`capacity` slots of keys and values. A pass writes its n tokens at slots `cumulative_length`..+n
    (the target sets it to its committed length first) and attends to all slots: the target's mask
    hides the ones past what the pass may see, so stale drafts there are never read."""

    def __init__(self, capacity: int, dtype: torch.dtype | None = None) -> None:
        super().__init__(max_cache_len=capacity)
        self.storage_dtype = dtype  # None: the dtype of the incoming keys and values

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor, at: torch.Tensor) -> SlotLayer:
        """A layer over these (1, heads, slots, dim) tensors that writes the next pass at slot `at` (a tensor of its
        own, which update() advances): the compiled pass's view of a cache it is handed (compiled.py)."""
        layer = cls(keys.shape[2], keys.dtype)
        layer.keys, layer.values = keys, values
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.cumulative_length = at.clone()
        return layer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # StaticLayer's, minus mark_static_address (for CUDA graphs; it would pin the capacity a compiled
        # forward sees, which `grow` changes).
        self.dtype, self.device = self.storage_dtype or key_states.dtype, key_states.device
        shape = (*key_states.shape[:2], self.max_cache_len)
        self.keys = torch.zeros((*shape, key_states.shape[-1]), dtype=self.dtype, device=self.device)
        self.values = torch.zeros((*shape, value_states.shape[-1]), dtype=self.dtype, device=self.device)
        self.cumulative_length = self.cumulative_length.to(self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
        self.cumulative_length.add_(key_states.shape[-2])
        self.keys.index_copy_(2, slots, key_states.to(self.dtype))
        self.values.index_copy_(2, slots, value_states.to(self.dtype))
        return self.keys, self.values

    def grow(self, capacity: int) -> None:
        """More slots, the filled ones kept (a compiled forward takes the new size without recompiling)."""
        if self.is_initialized:
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[-1]))
                new[..., : old.shape[-2], :] = old
                setattr(self, name, new)
        self.max_cache_len = capacity


def write_at(cache: Cache, at: int, n: int, capacity: int) -> int:
    """Point a SlotLayer cache's layers at slot `at` for a pass of n entries, doubling the slots first when they do
    not hold at + n. Returns the slot count."""
    if at + n > capacity:
        capacity = max(2 * capacity, at + n)
        for layer in cache.layers:
            layer.grow(capacity)
    for layer in cache.layers:
        layer.cumulative_length.fill_(at)
    return capacity


def full_attention(config) -> bool:
    """Whether every layer of this model attends to the whole context (no sliding windows)."""
    text = config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    return set(types) == {"full_attention"} and not getattr(text, "sliding_window", None)


def slot_cache(config, capacity: int, dtype: torch.dtype | None = None) -> Cache:
    """A SlotLayer cache (storing `dtype`, default the model's); only for `full_attention` models."""
    return Cache(layers=[SlotLayer(capacity, dtype) for _ in range(_layers(config))])


def new_cache(config, dtype: torch.dtype | None = None) -> Cache:
    """A growing cache (storing `dtype`, default the model's) for models whose every layer is full
    attention; DynamicCache otherwise."""
    if not full_attention(config):
        return DynamicCache(config=config)
    return Cache(layers=[GrowingLayer(dtype) for _ in range(_layers(config))])


def _layers(config) -> int:
    return config.get_text_config(decoder=True).num_hidden_layers
