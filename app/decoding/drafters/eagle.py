"""EAGLE: a one-layer draft module on the target's features drafts a token tree (EAGLE-2 dynamic or static).

Alignment: the draft's entry at position i reads (embed(t_{i+1}), f_i), where f_i is the target's
final normed hidden state at position i. The feature of a position is known after the target's
pass over it, its next token only one step later, so features wait in `pending` until propose()
sees their next tokens in the context; the last of those is the root. Feeding them leaves the
draft's output at the root's entry, whose distribution gives the root's children (depth 1). A
depth-d node sits at position (root position + d), reads (embed(its token), its parent's draft
output) and attends to the committed entries, its ancestors and itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from app.decoding.attention import additive, kv_dtype
from app.decoding.kv_cache import slot_cache, write_at
from app.decoding.target import RESERVE
from app.decoding.tree import depths, from_paths
from app.decoding.types import Proposal


@dataclass
class DraftTree:
    """Draft-vocabulary tokens, parents (-1 = the root) and cumulative path log-probabilities."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(float(score))
        return len(self.tokens) - 1


# expand(tree so far, nodes) -> (len(nodes), draft vocab) log q of each node's children.
Expand = Callable[[DraftTree, list[int]], torch.Tensor]


def _topk(rows: torch.Tensor, k: int):
    values, ids = rows.double().topk(min(k, rows.shape[-1]), dim=-1)
    return values, ids


def best_nodes(cand: DraftTree, n: int, min_score: float = float("-inf")) -> DraftTree:
    """The n best-scoring candidates scoring at least `min_score`, best first, parents re-indexed.

    A node ranks by the lowest score on its path, ties to the lower index, which a parent always
    has: so it ranks after its parent and any best-n set is ancestor-closed. With real log-
    probabilities (log q <= 0) that is just its own score.
    """
    rank_score: list[float] = []
    for i, p in enumerate(cand.parents):
        rank_score.append(cand.scores[i] if p < 0 else min(cand.scores[i], rank_score[p]))
    kept = [i for i in range(len(cand.tokens)) if rank_score[i] >= min_score]
    order = sorted(kept, key=lambda i: (-rank_score[i], i))[: max(0, n)]
    new_index: dict[int, int] = {}
    out = DraftTree()
    for i in order:
        p = cand.parents[i]
        new_index[i] = out.add(cand.tokens[i], new_index[p] if p >= 0 else -1, cand.scores[i])
    return out


def dynamic_tree(root_logq: torch.Tensor, expand: Expand, *, depth: int, top_k: int, max_nodes: int,
                 min_score: float = float("-inf")) -> DraftTree:
    """EAGLE-2's tree: level 1 = top_k of the root's log q; then, up to `depth` levels, each frontier
    node proposes top_k children (score = parent score + log q), all of them are candidates and the
    best top_k become the next frontier (fed in one expand call). Returns the `max_nodes` best
    candidates over all levels (`best_nodes`).

    `min_score` (a log path probability) prunes as it goes: no frontier node or returned node scores
    below it, so a level whose candidates all fall short ends the drafting early. A node's path
    probability estimates its chance of acceptance, and every node costs target compute, so when the
    draft is unsure the tree shrinks instead of paying for guesses."""
    if max_nodes <= 0 or depth <= 0:
        return DraftTree()
    cand = DraftTree()
    values, ids = _topk(root_logq, top_k)
    for v, t in zip(values.tolist(), ids.tolist()):
        cand.add(t, -1, v)
    frontier = [i for i in range(len(cand.tokens)) if cand.scores[i] >= min_score]
    for _ in range(min(depth, max_nodes) - 1):
        if not frontier:
            break
        values, ids = _topk(expand(cand, frontier), top_k)
        scores = values + torch.tensor([cand.scores[f] for f in frontier], dtype=torch.float64)[:, None]
        first = len(cand.tokens)
        for r, f in enumerate(frontier):
            for v, t in zip(scores[r].tolist(), ids[r].tolist()):
                cand.add(t, f, v)
        best = torch.argsort(-scores.flatten(), stable=True)[:top_k]
        frontier = [first + int(b) for b in best if cand.scores[first + int(b)] >= min_score]
    return best_nodes(cand, max_nodes, min_score)


def static_tree(root_logq: torch.Tensor, expand: Expand, paths: list[list[int]], max_nodes: int) -> DraftTree:
    """A fixed tree of Medusa-style rank paths: the node at path (..., r) is the rank-r child of its
    parent under the draft's distribution there. One expand call per depth, over the nodes of the
    previous depth that have children. Keeps the first `max_nodes` nodes in (depth, path) order."""
    ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))[: max(0, max_nodes)]
    parents = from_paths([list(p) for p in ordered])
    tree = DraftTree()
    rows: dict[int, torch.Tensor] = {-1: root_logq}
    level_of = depths(parents)
    for d in range(1, (max(level_of) if level_of else 0) + 1):
        level = [i for i in range(len(ordered)) if level_of[i] == d]
        if d > 1:
            need = sorted({parents[i] for i in level})
            rows.update(zip(need, expand(tree, need)))
        for i in level:
            p, rank = parents[i], ordered[i][-1]
            values, ids = _topk(rows[p], rank + 1)
            tree.add(int(ids[rank]), p, (tree.scores[p] if p >= 0 else 0.0) + float(values[rank]))
    return tree




class Eagle:
    """Drafter over an EagleModule. A proposal has at most `max_total_draft_tokens` nodes (EAGLE-2's total_tokens
    less its root); `depth` is the deepest draft level. With `static_choices` (rank paths) the tree shape is fixed
    instead and max_total_draft_tokens/top_k are unused.
    Drafts are deterministic top-k picks, so Proposal.q stays None (recursive rejection, lossless).

    The draft's cache is slots (kv_cache.SlotLayer), like the target's with a fast pass: committed entries first, a
    proposal's tree entries after them, each pass under a mask of what it sees; so every pass has the shapes the
    module's compiled pass takes (`module.fast`, decoding/compiled.py `draft_pass`), or runs eagerly without one."""

    name = "eagle"
    needs_hidden = True

    @classmethod
    def from_config(cls, config, target, companion) -> Eagle:
        """From a checked EagleDecodingConfig; `target`: the target torch model; `companion`: the EAGLE module."""
        static = None if config.use_dynamic_tree else config.paths()
        return cls(companion, target.get_input_embeddings(), max_total_draft_tokens=config.max_total_draft_tokens,
                   depth=config.num_eagle_layers, top_k=config.dynamic_tree_max_topK, static_choices=static,
                   min_path_prob=config.pruning)

    def __init__(self, module, embed: torch.nn.Module, max_total_draft_tokens: int = 23, depth: int = 5, top_k: int = 4,
                 static_choices: list[list[int]] | None = None, min_path_prob: float = 0.0) -> None:
        if max_total_draft_tokens < 1 or depth < 1 or top_k < 1:
            raise ValueError(f"EAGLE needs max_total_draft_tokens >= 1, depth >= 1, top_k >= 1 "
                             f"(got {max_total_draft_tokens}, {depth}, {top_k})")
        if not 0.0 <= min_path_prob < 1.0:
            raise ValueError(f"min_path_prob must be in [0, 1), got {min_path_prob}")
        if static_choices is not None:
            if not static_choices or any(not p or min(p) < 0 for p in static_choices):
                raise ValueError("static_choices must be a non-empty list of non-empty rank paths, e.g. [[0], [0, 0], [1]]")
            from_paths(static_choices)  # raises on a path without its parent path
            if max(max(p) for p in static_choices) >= module.config.draft_vocab_size:
                raise ValueError("static_choices asks for a rank beyond the draft vocabulary")
        self.module, self.embed = module, embed
        self.max_total_draft_tokens, self.depth, self.top_k = max_total_draft_tokens, depth, top_k
        self.static = [list(p) for p in static_choices] if static_choices is not None else None
        self.min_path_prob = min_path_prob

    @torch.inference_mode()  # as every pass is
    def start(self, prompt, sampling, gen, prefill) -> None:
        config = self.module.llama_config
        self.capacity = len(prompt) + RESERVE
        self.cache = slot_cache(config, self.capacity, kv_dtype(config))
        self.committed = 0  # draft entries in the cache (slots 0 .. committed-1)
        # Target features (final hidden, fused layers) of positions whose next token was not known yet.
        self.pending = [(prefill.hidden, self.module.aux_of(prefill.layers))]

    def _embed(self, target_ids: list[int]) -> torch.Tensor:
        x = torch.tensor([target_ids], device=self.embed.weight.device)
        return self.embed(x).to(self.module.fc.weight.device)

    def _catch_up(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the pending features with their next tokens (the last one is the root); return the
        draft's output at the root's entry and its log q."""
        device = self.module.fc.weight.device
        features = torch.cat([h for h, _ in self.pending]).to(device)
        aux = torch.cat([a for _, a in self.pending]).to(device)[None] if self.module.config.aux_layers else None
        n, start = features.shape[0], self.committed
        if start + n != len(context) - 1:
            raise RuntimeError(f"EAGLE drafter out of step: {start} + {n} entries for a context of {len(context)}")
        self._room(start, n)
        allowed = torch.zeros(n, self.capacity, dtype=torch.bool)
        allowed[:, : start + n] = torch.ones(n, start + n, dtype=torch.bool).tril(start)  # causal after the cache
        positions = torch.arange(start, start + n, device=device)[None]
        # The first catch-up is the prompt's: it runs eagerly, like the target's prefill.
        hidden, logq = self._pass(self._embed(context[start + 1 :]), self.module.stream(features[None], aux), positions,
                                  allowed, last=True, eager=start == 0)
        self.committed += n
        self.pending = []
        return hidden[-1], logq[-1]

    def _room(self, at: int, n: int) -> None:
        """Point the cache at slot `at` for n entries (more slots first when they do not hold them)."""
        self.capacity = write_at(self.cache, at, n, self.capacity)

    def _pass(self, embeds, stream, positions, allowed: torch.Tensor, last: bool = False, eager: bool = False):
        """The draft's outputs (n, H) for n entries written at the cache's slot, and their log q over the draft
        vocabulary (only the last row's when `last`); allowed: (n, slots) the slots each one sees."""
        module, n = self.module, embeds.shape[1]
        mask = additive(allowed, module.fc.weight.dtype).to(module.fc.weight.device)[None, None]
        fast = module.fast
        if fast is not None and not eager and fast.fits(n):
            hidden, logq = fast.run(n, self.cache, embeds, stream, positions, mask)
            return hidden[0], logq[0]
        hidden = module.decode(embeds, stream, self.cache, positions, mask)[0]
        return hidden, module.head(hidden[-1:] if last else hidden).float().log_softmax(-1)

    @torch.inference_mode()
    def propose(self, context: list[int], room: int) -> Proposal:
        if room <= 0:
            return Proposal(source=self._source(DraftTree(), []))
        module = self.module
        root_hidden, root_logq = self._catch_up(context)
        target_ids = module.target_ids
        fed: dict[int, tuple[int, torch.Tensor]] = {}  # node -> (speculative slot after the committed ones, draft output)

        def expand(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
            c, n_spec, k = self.committed, len(fed), len(nodes)
            self._room(c + n_spec, k)
            level = depths(tree.parents)
            allowed = torch.zeros(k, self.capacity, dtype=torch.bool)
            allowed[:, :c] = True
            for j, x in enumerate(nodes):
                a = tree.parents[x]
                while a >= 0:
                    allowed[j, c + fed[a][0]] = True
                    a = tree.parents[a]
                allowed[j, c + n_spec + j] = True
            features = torch.stack([fed[tree.parents[x]][1] if tree.parents[x] >= 0 else root_hidden for x in nodes])
            positions = torch.tensor([[c - 1 + level[x] for x in nodes]], device=module.fc.weight.device)
            tokens = target_ids[[tree.tokens[x] for x in nodes]].tolist()
            hidden, logq = self._pass(self._embed(tokens), module.stream(features[None]), positions, allowed)
            for j, x in enumerate(nodes):
                fed[x] = (n_spec + j, hidden[j])
            return logq

        if self.static is not None:
            tree = static_tree(root_logq, expand, self.static, room)
        else:
            tree = dynamic_tree(root_logq, expand, depth=self.depth, top_k=self.top_k, max_nodes=min(self.max_total_draft_tokens, room),
                                min_score=math.log(self.min_path_prob) if self.min_path_prob else float("-inf"))
        # The tree's entries (drafts on drafted features) stay in slots past the committed ones, where the next pass
        # overwrites them and no mask lets an entry see them.
        tokens = target_ids[tree.tokens].tolist() if tree.tokens else []
        return Proposal(tokens, tree.parents, source=self._source(tree, tokens))

    def _source(self, tree: DraftTree, tokens: list[int]) -> dict:
        scores = [round(max(s, -1e9), 4) for s in tree.scores]  # JSON has no -inf
        source = {"tree": {"tokens": tokens, "parents": tree.parents, "scores": scores},
                  "depth": self.depth, "top_k": self.top_k,
                  "max_total_draft_tokens": self.max_total_draft_tokens}
        if self.min_path_prob:
            source["min_path_prob"] = self.min_path_prob
        if self.static is not None:
            source["static_nodes"] = len(self.static)
        return source

    def observe(self, proposal, verdict, out) -> None:
        # The committed positions' target features: the root's and each accepted node's.
        slots = [0] + [a + 1 for a in verdict.accepted]
        aux = self.module.aux_of(out.layers)
        self.pending.append((out.hidden[slots], aux[slots] if aux is not None else None))
