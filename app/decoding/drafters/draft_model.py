"""Draft-target: a small model sharing the target's tokenizer drafts a chain, one token at a time.

With a draft vocabulary (`d2t`, see heads/vocab.py) the draft scores only those tokens: its
vocabulary-sized LM head is most of what a one- or two-layer draft costs per token, and the
tokens outside are seldom drafted right. The draft's distribution q is then zero outside the
draft vocabulary, which Leviathan's rule handles like any other q: still lossless.
"""

from __future__ import annotations

import torch

from app.decoding import linear
from app.decoding.attention import kv_dtype
from app.decoding.kv_cache import new_cache
from app.decoding.sampling import probs, sample
from app.decoding.types import Proposal
from app.heads import vocab


class DraftModel:
    name = "draft_target"
    needs_hidden = False

    @classmethod
    def from_config(cls, config, target, companion) -> DraftModel:
        """From a checked DraftTargetDecodingConfig; `companion`: the draft model runner.load_companion loaded."""
        return cls(companion.model, config.max_draft_len, d2t=companion.draft_vocab)

    def __init__(self, model: torch.nn.Module, max_draft_len: int = 4, d2t: torch.Tensor | None = None) -> None:
        if max_draft_len < 1:
            raise ValueError("max_draft_len must be >= 1")
        self.model = model
        self.max_draft_len = max_draft_len
        head = model.get_output_embeddings()
        self.vocab_size = head.weight.shape[0]
        self.ids = None
        if d2t is not None:
            reason = vocab.problem(d2t, len(d2t), self.vocab_size)
            if reason:
                raise ValueError(f"the draft vocabulary: {reason}")
            self.ids = vocab.target_ids(d2t).to(head.weight.device)

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.sampling, self.gen = sampling, gen
        if self.ids is not None:
            # Gathered here, not in __init__: building a drafter only validates (the service does that on the
            # caller's thread), computing happens where the generation runs.
            head = self.model.get_output_embeddings()
            bias = getattr(head, "bias", None)
            self.head = linear.rows(head.weight[self.ids], bias[self.ids] if bias is not None else None)
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

    def _logits(self, feed: list[int]) -> torch.Tensor:
        """The draft's next-token logits after `feed`: over its whole vocabulary, or the draft vocabulary's."""
        x = torch.tensor([feed], device=self.model.device)
        if self.ids is None:
            return self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        hidden = self.model.get_decoder()(input_ids=x, past_key_values=self.cache, use_cache=True).last_hidden_state[0, -1]
        return self.head(hidden[None])[0]

    @torch.inference_mode()
    def propose(self, context: list[int], room: int) -> Proposal:
        feed = self._rewind(context)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        draft_probs: list[float] = []
        for _ in range(min(self.max_draft_len, room)):
            logits = self._logits(feed)
            self.fed += feed
            if self.sampling.greedy:
                logits = logits.float()
                j = int(logits.argmax())
                draft_probs.append(float(logits.softmax(-1)[j]))
            else:
                q = probs(logits, self.sampling)
                j = sample(q, self.gen)
                draft_probs.append(float(q[j]))
                if self.ids is not None:  # q over the whole vocabulary, zero outside the draft's
                    q = torch.zeros(self.vocab_size, dtype=q.dtype, device=q.device).index_copy_(0, self.ids, q)
                qs.append(q)
            tok = int(self.ids[j]) if self.ids is not None else j
            tokens.append(tok)
            feed = [tok]
        q = torch.stack(qs) if qs else None
        source = {"draft_probs": draft_probs}
        if self.ids is not None:
            source["draft_vocab"] = len(self.ids)
        return Proposal(tokens, list(range(-1, len(tokens) - 1)), q=q, source=source)

    def observe(self, proposal, verdict, out) -> None:
        pass
