"""Lookahead decoding (Fu et al., ICML'24): a 2D Jacobi window and an n-gram pool, verified in one pass.

(W, N, G) = (max_window_size, max_ngram_size, max_verification_set_size) are the maxima, as in
TensorRT-LLM; a request runs with its own (w, n, g) <= (W, N, G). (1, 1, 0) is autoregressive.

The window has n - 1 rows. Row 0 holds w - 1 guesses after the root; rows 1..n-2 hold w tokens.
Row l, column i sits at position t + l + i and attends to the root, row 0 up to column i - 1 and
column i of rows 1..l: so the window is a tree hanging off the root, run in the same forward pass
as the verification branch (candidate n-grams from the pool) but never seen by it.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from app.decoding.tree import trie_within
from app.decoding.types import Proposal
from app.modes.configs import lookahead_rules


class Lookahead:
    name = "lookahead"
    needs_hidden = False

    @classmethod
    def from_config(cls, config, target=None, companion=None) -> Lookahead:
        """From a checked LookaheadDecodingConfig (app/modes/configs.py)."""
        return cls(config.max_window_size, config.max_ngram_size, config.max_verification_set_size,
                   request=config.request, pool_from_prompt=config.pool_from_prompt)

    def __init__(
        self,
        max_window_size: int = 4,
        max_ngram_size: int = 3,
        max_verification_set_size: int = 4,
        request: tuple[int, int, int] | None = None,
        pool_from_prompt: bool = True,
    ) -> None:
        limits = (max_window_size, max_ngram_size, max_verification_set_size)
        lookahead_rules(limits, request)  # a ConfigError (a ValueError) names what is wrong
        self.w, self.n, self.g = request or limits
        self.pool_from_prompt = pool_from_prompt

    # n-gram pool: first token -> LRU of the n - 1 tokens that followed it, at most g per key.
    def _remember(self, gram: tuple[int, ...]) -> None:
        entries = self.pool.setdefault(gram[0], OrderedDict())
        entries.pop(gram[1:], None)
        entries[gram[1:]] = None
        if len(entries) > self.g:
            entries.popitem(last=False)

    def start(self, prompt, sampling, gen, prefill) -> None:
        # A private RNG seeded from the request keeps proposals reproducible for the same seed.
        self.rng = random.Random(sampling.seed or 0)
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.rows: list[list[int]] = [self.rng.choices(list(prompt), k=self.w - 1)]
        self.seen = 0  # context tokens already scanned for n-grams (pool_from_prompt)
        self.root = -1

    def propose(self, context: list[int], room: int) -> Proposal:
        n, w = self.n, self.w
        if n < 2:
            return Proposal()
        if self.pool_from_prompt:
            for end in range(max(self.seen, n), len(context) + 1):
                self._remember(tuple(context[end - n : end]))
            self.seen = len(context) + 1
        root = self.root = context[-1]
        recent = [list(c) for c in reversed(self.pool.get(root, {}))][: self.g]  # most recent first
        tokens, parents, kept = trie_within(recent, room)
        candidates = recent[:kept]
        num_draft = len(tokens)
        window_size = (w - 1) + (len(self.rows) - 1) * w
        if num_draft + window_size > room:
            return Proposal(tokens, parents, source={"candidates": candidates, "window": None})
        # Row 0 is a chain off the root; row l's column i hangs off row l-1's column i.
        below = [-1]  # node index of block0 column i (column 0 is the root)
        for tok in self.rows[0]:
            tokens.append(tok)
            parents.append(below[-1])
            below.append(len(tokens) - 1)
        for row in self.rows[1:]:
            current = []
            for i, tok in enumerate(row):
                tokens.append(tok)
                parents.append(below[i])
                current.append(len(tokens) - 1)
            below = current
        self.last_row_nodes = below
        source = {"candidates": candidates, "window": [list(r) for r in self.rows]}
        return Proposal(tokens, parents, num_draft=num_draft, source=source)

    def observe(self, proposal, verdict, out) -> None:
        if self.n < 2 or proposal.source.get("window") is None:
            return
        # Jacobi update: the argmax after each node of the last row guesses the next row (greedy even when sampling).
        new = out.logits[[i + 1 for i in self.last_row_nodes]].float().argmax(-1).tolist()
        if len(self.rows) - 1 < self.n - 2:  # warm-up: the window is not full yet
            self.rows.append(new)
            return
        block0 = [self.root, *self.rows[0]]
        columns = [[block0[i], *(row[i] for row in self.rows[1:]), new[i]] for i in range(self.w)]
        for col in columns:
            self._remember(tuple(col))
        rows = self.rows[1:] + [new]
        self.rows = [rows[0][1:], *rows[1:]]
