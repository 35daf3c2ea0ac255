"""Draft-target: a small model sharing the target's tokenizer drafts a chain, one token at a time."""

from __future__ import annotations

import torch

from app.decoding.attention import kv_dtype
from app.decoding.kv_cache import new_cache

from app.decoding.sampling import probs, sample
from app.decoding.types import Proposal


class DraftModel:
    name = "draft_target"

    def __init__(self, model: torch.nn.Module, max_draft_len: int = 4) -> None:
        if max_draft_len < 1:
            raise ValueError("max_draft_len must be >= 1")
        self.model = model
        self.max_draft_len = max_draft_len

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.sampling, self.gen = sampling, gen
        self.cache = new_cache(self.model.config, kv_dtype(self.model.config))
        self.fed: list[int] = []  # tokens whose KV is in the draft's cache

    def _rewind(self, context: list[int]) -> list[int]:
        """Drop cached tokens the target rejected; return the context tokens still to feed (at least one)."""
        common = 0
        for a, b in zip(self.fed, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)
        if common < len(self.fed):
            self.cache.crop(common - len(self.fed))
            del self.fed[common:]
        return context[common:]

    @torch.inference_mode()
    def propose(self, context: list[int], room: int) -> Proposal:
        feed = self._rewind(context)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        draft_probs: list[float] = []
        for _ in range(min(self.max_draft_len, room)):
            x = torch.tensor([feed], device=self.model.device)
            logits = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            self.fed += feed
            if self.sampling.greedy:
                tok = int(logits.argmax())
                draft_probs.append(float(logits.float().softmax(-1)[tok]))
            else:
                q = probs(logits, self.sampling)
                tok = sample(q, self.gen)
                qs.append(q)
                draft_probs.append(float(q[tok]))
            tokens.append(tok)
            feed = [tok]
        q = torch.stack(qs) if qs else None
        return Proposal(tokens, list(range(-1, len(tokens) - 1)), q=q, source={"draft_probs": draft_probs})

    def observe(self, proposal, verdict, out) -> None:
        pass
