"""The target model: runs a token tree in one forward pass and keeps the KV cache of what was committed."""

from __future__ import annotations

from typing import Protocol

import torch

from app.decoding.attention import additive, kv_dtype
from app.decoding.kv_cache import full_attention, new_cache, slot_cache, write_at
from app.decoding.tree import depths, is_chain
from app.decoding.types import Forward



def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """Boolean (n+1, n+1) matrix over [root, nodes]: row i is True at i's ancestors and i itself."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    mask[0, 0] = True
    for i, p in enumerate(parents):
        row = i + 1
        mask[row] = mask[p + 1]
        mask[row, row] = True
    return mask

class Target(Protocol):
    vocab_size: int
    max_length: int  # context window in tokens

    def prefill(self, ids: list[int]) -> Forward:
        """Cache the prompt; return the last position's logits (1, vocab) and every position's hidden state."""

    def forward(self, root: int, tokens: list[int], parents: list[int]) -> Forward:
        """Run [root, *tokens] as a tree over the cache; logits and hidden (1 + n, ...), slot i+1 = after node i."""

    def commit(self, accepted: list[int]) -> None:
        """Keep the root and the accepted nodes (a root-to-node path) in the cache; drop the rest."""


RESERVE = 256  # slots a session has beyond its prompt; they double whenever a pass needs more


class TransformersTarget:
    """One generation's session on a transformers causal LM (the model itself is shared and read-only).

    Eagerly, the cache grows in place and is cropped after each pass (kv_cache.GrowingLayer). With `forward`, the
    model's fast pass (compiled.FastPass), a model whose every layer is full attention keeps its cache in fixed slots
    instead (kv_cache.SlotLayer): each pass writes at the committed length and attends to every slot under a mask of
    what it may see, so passes differ only in their width and the slot count, which the compiled graphs take as
    symbols. The prefill, and a pass wider than the graphs take, run eagerly over the same slots. Eagerly the slots
    cost about 5 % (attention over the spare slots, a wider mask), so without a fast pass the cache grows instead.
    """

    def __init__(self, model: torch.nn.Module, hidden_states: bool = True, forward=None) -> None:
        self.model = model
        self.slotted = forward is not None and full_attention(model.config)
        self.run = forward if self.slotted else None  # the fast pass (None: all eager)
        # Feature-level drafters read the hidden states; the others spare transformers collecting them.
        self.hidden_states = hidden_states
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 2**31)
        self.cache = None
        self.capacity = 0
        self.length = 0  # tokens in the cache
        self.fed = 0  # tokens fed by the last forward

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> Forward:
        config = self.model.config
        if self.slotted:
            self.capacity = len(ids) + RESERVE
            self.cache = slot_cache(config, self.capacity, kv_dtype(config))
        else:
            self.cache = new_cache(config, kv_dtype(config))
        x = torch.tensor([ids], device=self.model.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=self.hidden_states)
        self.length = len(ids)
        return _forward(out)

    @torch.inference_mode()
    def forward(self, root: int, tokens: list[int], parents: list[int]) -> Forward:
        device = self.model.device
        x = torch.tensor([[root, *tokens]], device=device)
        self.fed = n = x.shape[1]
        if self.slotted:
            # This pass writes right after what is committed.
            slots = self.run.slots(n) if self.run.fits(n) else n
            self.capacity = width = write_at(self.cache, self.length, slots, self.capacity)
        elif is_chain(parents):
            # A chain is ordinary causal attention: let the model build its own (faster) mask.
            return _forward(self.model(input_ids=x, past_key_values=self.cache, use_cache=True,
                                       output_hidden_states=self.hidden_states))
        else:
            width = self.length + n
        allowed = torch.zeros(n, width, dtype=torch.bool)
        allowed[:, : self.length] = True
        allowed[:, self.length : self.length + n] = ancestor_mask(parents)
        mask = additive(allowed, self.model.dtype)[None, None].to(device)
        positions = torch.tensor([[0, *depths(parents)]], device=device) + self.length
        if self.slotted and self.run.fits(n):
            return self.run(x, positions, mask, self.cache)
        return _forward(self.model(input_ids=x, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                                   use_cache=True, output_hidden_states=self.hidden_states))

    @torch.inference_mode()
    def commit(self, accepted: list[int]) -> None:
        keep = 1 + len(accepted)
        if accepted != list(range(len(accepted))):
            # The accepted path is not the first nodes: move its KV rows right after the root.
            idx = torch.tensor([self.length + 1 + i for i in accepted], device=self.model.device)
            start = self.length + 1
            for layer in self.cache.layers:
                layer.keys[..., start : start + len(accepted), :] = layer.keys.index_select(-2, idx)
                layer.values[..., start : start + len(accepted), :] = layer.values.index_select(-2, idx)
        if not self.slotted and self.fed > keep:
            self.cache.crop(keep - self.fed)
        self.length += keep
        self.fed = 0


def _forward(out) -> Forward:
    if out.hidden_states is None:
        return Forward(out.logits[0], None)
    layers = tuple(h[0] for h in out.hidden_states)
    return Forward(out.logits[0], layers[-1], layers)
