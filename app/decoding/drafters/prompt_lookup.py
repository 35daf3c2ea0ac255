"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens where they occurred before.

Names and defaults follow TensorRT-LLM's NGram / prompt-lookup config. With `max_candidates` > 1
the continuations of several matches are verified together as one token tree (shared prefixes merged).

`ngram_draft_lens` caps the draft by how long the matched n-gram is: a 1-gram match is weak
evidence (on Spec-Bench about one in seven of its drafts gets its first token accepted in writing and
rag), and on a CPU every drafted token costs target compute (about 2 ms each against a 41 ms step for
the bundled model), so short matches get short drafts. An empty tuple drafts the full length on every
match, as TensorRT-LLM does.
"""

from __future__ import annotations

import numpy as np

from app.decoding.tree import trie_within
from app.decoding.types import Proposal


def find_matches(context: np.ndarray, max_ngram: int, oldest: bool = True):
    """Yield (start, n) of earlier occurrences of the context's suffix n-grams, longest n first;
    within one n the earliest occurrence first (or the latest when `oldest` is False).

    The search covers prompt and generated text; the suffix itself is excluded.
    """
    size = len(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[: size - 1], n)
        hits = np.flatnonzero((windows == context[size - n :]).all(axis=1))
        for start in hits if oldest else hits[::-1]:
            yield int(start), n


class PromptLookup:
    name = "prompt_lookup"
    needs_hidden = False

    def __init__(
        self,
        prompt_lookup_num_tokens: int = 10,
        max_matching_ngram_size: int = 2,
        is_use_oldest: bool = True,
        max_candidates: int = 1,
        ngram_draft_lens: tuple[int, ...] = (2, 5),
    ) -> None:
        if prompt_lookup_num_tokens < 1:
            raise ValueError("prompt_lookup_num_tokens must be >= 1")
        if max_matching_ngram_size < 1:
            raise ValueError("max_matching_ngram_size must be >= 1")
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.num_tokens = prompt_lookup_num_tokens
        self.max_ngram = max_matching_ngram_size
        self.oldest = is_use_oldest
        self.max_candidates = max_candidates
        if any(k < 0 for k in ngram_draft_lens):
            raise ValueError("ngram_draft_lens must be >= 0")
        self.ngram_draft_lens = tuple(ngram_draft_lens)
        self.prompt_len = 0

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.prompt_len = len(prompt)

    def propose(self, context: list[int], room: int) -> Proposal:
        ids = np.asarray(context)
        drafts: list[list[int]] = []
        matches = []
        for start, n in find_matches(ids, self.max_ngram, self.oldest):
            cont = start + n
            draft = ids[cont : cont + min(self.draft_len(n), room)].tolist()
            if not draft or draft in drafts:
                continue
            drafts.append(draft)
            matches.append(
                {"ngram": ids[start:cont].tolist(), "position": start, "in_prompt": start < self.prompt_len,
                 "continuation_position": cont}
            )
            if len(drafts) == self.max_candidates:
                break
        tokens, parents, kept = trie_within(drafts, room)
        matches = matches[:kept]
        source = {"match": matches[0] if matches else None, "matches": matches}
        return Proposal(tokens, parents, source=source)

    def draft_len(self, ngram_size: int) -> int:
        """How many tokens to draft after a matched n-gram of this size."""
        caps = self.ngram_draft_lens
        return min(self.num_tokens, caps[ngram_size - 1]) if ngram_size <= len(caps) else self.num_tokens

    def observe(self, proposal, verdict, out) -> None:
        pass
