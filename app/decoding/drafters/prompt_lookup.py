"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens where they occurred before.

Names and defaults follow TensorRT-LLM's NGram / prompt-lookup config.
"""

from __future__ import annotations

import numpy as np

from app.decoding.types import Proposal


def find_draft(context: np.ndarray, max_ngram: int, oldest: bool = True) -> tuple[int, int, int] | None:
    """(start, n, continuation_start) of an earlier occurrence of the longest suffix n-gram (n <= max_ngram):
    the earliest one, or the latest when `oldest` is False.

    The search covers prompt and generated text; the suffix itself is excluded.
    """
    size = len(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = context[size - n :]
        windows = np.lib.stride_tricks.sliding_window_view(context[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[0] if oldest else hits[-1])
            return start, n, start + n
    return None


class PromptLookup:
    name = "prompt_lookup"

    def __init__(
        self, prompt_lookup_num_tokens: int = 10, max_matching_ngram_size: int = 2, is_use_oldest: bool = True
    ) -> None:
        if prompt_lookup_num_tokens < 1:
            raise ValueError("prompt_lookup_num_tokens must be >= 1")
        if max_matching_ngram_size < 1:
            raise ValueError("max_matching_ngram_size must be >= 1")
        self.num_tokens = prompt_lookup_num_tokens
        self.max_ngram = max_matching_ngram_size
        self.oldest = is_use_oldest
        self.prompt_len = 0

    def start(self, prompt, sampling, gen) -> None:
        self.prompt_len = len(prompt)

    def propose(self, context: list[int], room: int) -> Proposal:
        ids = np.asarray(context)
        hit = find_draft(ids, self.max_ngram, self.oldest)
        if hit is None:
            return Proposal(source={"match": None})
        start, n, cont = hit
        draft = ids[cont : min(cont + self.num_tokens, cont + room)].tolist()
        source = {
            "match": {
                "ngram": ids[start:cont].tolist(),
                "position": start,
                "in_prompt": start < self.prompt_len,
                "continuation_position": cont,
            }
        }
        return Proposal(draft, list(range(-1, len(draft) - 1)), source=source)

    def observe(self, proposal, verdict, logits) -> None:
        pass
