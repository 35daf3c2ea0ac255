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

from app.decoding.tree import trie_within
from app.decoding.types import Proposal


class NgramIndex:
    """Where every n-gram (n <= max_n) of a growing token sequence starts, in increasing order.

    The context only grows during a generation, so each step indexes its few new tokens instead of
    searching the whole context again: right after a forward pass every array operation of such a
    search runs on cold caches, and the search cost ~0.25 ms a step, over 1 % of a step here.
    """

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.starts: dict[tuple[int, ...], list[int]] = {}
        self.indexed: list[int] = []  # the tokens whose n-grams are indexed (those ending in them)

    def extend(self, ids: list[int], end: int) -> None:
        """Index the n-grams of `ids` that end before position `end`."""
        done = len(self.indexed)
        if ids[:done] != self.indexed:  # another sequence, not a continuation (a list compare: microseconds)
            self.starts.clear()
            self.indexed, done = [], 0
        for e in range(done, end):
            for n in range(1, min(self.max_n, e + 1) + 1):
                self.starts.setdefault(tuple(ids[e - n + 1 : e + 1]), []).append(e - n + 1)
        self.indexed += ids[done:end]

    def matches(self, ids: list[int], max_ngram: int, oldest: bool = True):
        """Yield (start, n) of earlier occurrences of the suffix n-grams of `ids`, longest n first;
        within one n the earliest occurrence first (or the latest when `oldest` is False).

        The search covers prompt and generated text; the suffix itself is excluded.
        """
        size = len(ids)
        self.extend(ids, size - 1)
        for n in range(min(max_ngram, self.max_n, size - 1), 0, -1):
            hits = self.starts.get(tuple(ids[size - n :]), ())
            for start in hits if oldest else reversed(hits):
                yield start, n


class PromptLookup:
    name = "prompt_lookup"
    needs_hidden = False

    @classmethod
    def from_config(cls, config, target=None, companion=None) -> PromptLookup:
        """From a checked NGramDecodingConfig (app/modes/configs.py)."""
        return cls(config.max_draft_len, config.max_matching_ngram_size, config.is_use_oldest, config.max_candidates,
                   config.ngram_draft_lens)

    def __init__(
        self,
        max_draft_len: int = 10,
        max_matching_ngram_size: int = 2,
        is_use_oldest: bool = True,
        max_candidates: int = 1,
        ngram_draft_lens: tuple[int, ...] = (2, 5),
    ) -> None:
        if max_draft_len < 1:
            raise ValueError("max_draft_len must be >= 1")
        if max_matching_ngram_size < 1:
            raise ValueError("max_matching_ngram_size must be >= 1")
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.num_tokens = max_draft_len
        self.max_ngram = max_matching_ngram_size
        self.oldest = is_use_oldest
        self.max_candidates = max_candidates
        if any(k < 0 for k in ngram_draft_lens):
            raise ValueError("ngram_draft_lens must be >= 0")
        self.ngram_draft_lens = tuple(ngram_draft_lens)
        self.prompt_len = 0
        self.index = NgramIndex(max_matching_ngram_size)

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.prompt_len = len(prompt)  # the index needs no reset: it starts over on a context it has not seen grow

    def propose(self, context: list[int], room: int) -> Proposal:
        drafts: list[list[int]] = []
        matches = []
        for start, n in self.index.matches(context, self.max_ngram, self.oldest):
            cont = start + n
            draft = context[cont : cont + min(self.draft_len(n), room)]
            if not draft or draft in drafts:
                continue
            drafts.append(draft)
            matches.append(
                {"ngram": context[start:cont], "position": start, "in_prompt": start < self.prompt_len,
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
