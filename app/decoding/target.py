"""The target model: runs a token tree in one forward pass and keeps the KV cache of what was committed."""

from __future__ import annotations

from typing import Protocol

import torch

from app.decoding.attention import additive, kv_dtype
from app.decoding.kv_cache import new_cache
from app.decoding.tree import ancestor_mask, depths, is_chain
from app.decoding.types import Forward


class Target(Protocol):
    vocab_size: int
    max_length: int  # context window in tokens

    def prefill(self, ids: list[int]) -> Forward:
        """Cache the prompt; return the last position's logits (1, vocab) and every position's hidden state."""

    def forward(self, root: int, tokens: list[int], parents: list[int]) -> Forward:
        """Run [root, *tokens] as a tree over the cache; logits and hidden (1 + n, ...), slot i+1 = after node i."""

    def commit(self, accepted: list[int]) -> None:
        """Keep the root and the accepted nodes (a root-to-node path) in the cache; drop the rest."""


class TransformersTarget:
    """One generation's session on a transformers causal LM (the model itself is shared and read-only)."""

    def __init__(self, model: torch.nn.Module, hidden_states: bool = True) -> None:
        self.model = model
        # Feature-level drafters read the hidden states; the others spare transformers collecting them.
        self.hidden_states = hidden_states
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 2**31)
        self.cache = new_cache(model.config, kv_dtype(model.config))
        self.length = 0  # tokens in the cache
        self.fed = 0  # tokens fed by the last forward

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> Forward:
        x = torch.tensor([ids], device=self.model.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=self.hidden_states)
        self.length = len(ids)
        return _forward(out)

    @torch.inference_mode()
    def forward(self, root: int, tokens: list[int], parents: list[int]) -> Forward:
        device = self.model.device
        x = torch.tensor([[root, *tokens]], device=device)
        self.fed = x.shape[1]
        if is_chain(parents):
            # A chain is ordinary causal attention: let the model build its own (faster) mask.
            out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, output_hidden_states=self.hidden_states)
            return _forward(out)
        positions = torch.tensor([[0, *depths(parents)]], device=device) + self.length
        allowed = torch.cat(
            [torch.ones(self.fed, self.length, dtype=torch.bool), ancestor_mask(parents)], dim=1
        )
        dtype = self.model.dtype
        mask = additive(allowed, dtype)
        out = self.model(
            input_ids=x,
            attention_mask=mask[None, None].to(device),
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=self.hidden_states,
        )
        return _forward(out)

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
        if self.fed > keep:
            self.cache.crop(keep - self.fed)
        self.length += keep
        self.fed = 0


def _forward(out) -> Forward:
    if out.hidden_states is None:
        return Forward(out.logits[0], None)
    layers = tuple(h[0] for h in out.hidden_states)
    return Forward(out.logits[0], layers[-1], layers)
