"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): draft what most often followed the context's
longest recurring suffix, with counts from a suffix trie over the prompt and the text generated so far.

The trie holds every substring of the sequence up to `suffix_decoding_max_tree_depth` tokens, each node with how many
times its string occurs. For each match length m (1, 2, ...) while the context's last m tokens occur in
the trie, a draft follows the most frequent continuation (a chain, or the most probable nodes as a tree
with `use_tree_spec`); a token's probability is its path's product of count(child) / count(parent) and
drafting stops below `min_token_prob`. A match of m tokens may draft at most max_spec_factor * m +
max_spec_offset tokens, and the draft with the highest summed probability wins. Field names and defaults
follow vLLM's `suffix_decoding_*` settings; vLLM also counts earlier requests' responses (a cache shared by
all requests), which this drafter does not: it sees only its own prompt and output.
"""

from __future__ import annotations

import heapq
import math

from app.decoding.types import Proposal


class _Node:
    __slots__ = ("children", "count", "first")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0
        self.first = -1  # where its string first ended: among equally frequent continuations the oldest wins

    def head(self) -> tuple[int, _Node] | None:
        """The most frequent child, the oldest on ties (Arctic Inference's tree, which vLLM runs, breaks most ties so)."""
        return max(self.children.items(), key=lambda kv: (kv[1].count, -kv[1].first), default=None)


class SuffixTrie:
    """Every substring of at most `depth` tokens of a growing sequence, with its number of occurrences.

    Appending a token extends the (at most `depth`) suffixes that end at the sequence's end, so a step
    indexes its new tokens in O(depth) each instead of rebuilding.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self.tokens: list[int] = []
        self.active: list[_Node] = [self.root]  # the suffixes ending at the end, shortest first, shorter than depth

    def extend(self, ids: list[int]) -> None:
        for t in ids:
            end = len(self.tokens)
            grown = [self.root]
            for node in self.active:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                    child.first = end
                child.count += 1
                grown.append(child)
            self.tokens.append(t)
            self.active = grown[: self.depth]  # a suffix of `depth` tokens is as deep as the trie goes

    def find(self, pattern: list[int]) -> _Node | None:
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node


class Suffix:
    name = "suffix"
    needs_hidden = False

    @classmethod
    def from_config(cls, config, target=None, companion=None) -> Suffix:
        """From a checked SuffixDecodingConfig (app/modes/configs.py)."""
        return cls(config.max_draft_len, config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_spec_factor,
                   config.suffix_decoding_min_token_prob, config.use_tree_spec)

    def __init__(
        self,
        max_draft_len: int = 24,
        suffix_decoding_max_tree_depth: int = 24,
        suffix_decoding_max_spec_factor: float = 1.0,
        suffix_decoding_min_token_prob: float = 0.1,
        use_tree_spec: bool = False,
        max_spec_offset: float = 0.0,
    ) -> None:
        if max_draft_len < 1 or suffix_decoding_max_tree_depth < 1:
            raise ValueError("max_draft_len and suffix_decoding_max_tree_depth must be >= 1")
        if suffix_decoding_max_spec_factor < 0 or not 0 <= suffix_decoding_min_token_prob <= 1:
            raise ValueError("suffix_decoding_max_spec_factor must be >= 0 and suffix_decoding_min_token_prob in [0, 1]")
        self.max_draft_len = max_draft_len
        self.depth = suffix_decoding_max_tree_depth
        self.factor = suffix_decoding_max_spec_factor
        self.offset = max_spec_offset
        self.min_prob = suffix_decoding_min_token_prob
        self.tree = use_tree_spec
        self.trie = SuffixTrie(suffix_decoding_max_tree_depth)
        self.prompt_len = 0

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.prompt_len = len(prompt)
        self.trie = SuffixTrie(self.depth)

    def propose(self, context: list[int], room: int) -> Proposal:
        if context[: len(self.trie.tokens)] != self.trie.tokens:  # not this generation's context (a list compare)
            self.trie = SuffixTrie(self.depth)
        self.trie.extend(context[len(self.trie.tokens) :])
        pattern = context[-self.depth :]
        best = ([], [], [], 0.0, 0, 0)
        for m in range(1, len(pattern)):  # the whole pattern is the context's own end: nothing follows it yet
            node = self.trie.find(pattern[-m:])
            if node is None:
                break
            limit = min(self.max_draft_len, room, math.floor(m * self.factor + self.offset + 1e-6))
            tokens, parents, probs = (self._tree if self.tree else self._chain)(node, limit)
            score = sum(probs)
            if tokens and score >= best[3]:
                best = (tokens, parents, probs, score, m, node.count)
        tokens, parents, probs, score, m, count = best
        # `count` includes the match at the context's end; the display lists the earlier ones
        suffix = {"match": context[-m:], "count": count, "probs": [round(p, 4) for p in probs], "score": round(score, 4),
                  "tree": self.tree} if tokens else None
        return Proposal(tokens, parents, source={"suffix": suffix})

    def _chain(self, node: _Node, limit: int):
        tokens, parents, probs, prob = [], [], [], 1.0
        while len(tokens) < limit:
            head = node.head()
            if head is None:
                break
            token, child = head
            prob *= child.count / node.count
            if prob < self.min_prob:
                break
            parents.append(len(tokens) - 1)
            tokens.append(token)
            probs.append(prob)
            node = child
        return tokens, parents, probs

    def _tree(self, node: _Node, limit: int):
        """The `limit` most probable continuations above min_token_prob, best first, each after its parent."""
        tokens, parents, probs = [], [], []
        heap: list = []
        order = 0  # ties: the order they were found, so equal probabilities keep a deterministic tree

        def push(at: _Node, prob: float, index: int) -> None:
            nonlocal order
            for token, child in at.children.items():
                p = prob * child.count / at.count
                if p >= self.min_prob:
                    heapq.heappush(heap, (-p, order, token, child, index))
                    order += 1

        push(node, 1.0, -1)
        while heap and len(tokens) < limit:
            neg, _, token, child, parent = heapq.heappop(heap)
            parents.append(parent)
            tokens.append(token)
            probs.append(-neg)
            push(child, -neg, len(tokens) - 1)
        return tokens, parents, probs

    def observe(self, proposal, verdict, out) -> None:
        pass
