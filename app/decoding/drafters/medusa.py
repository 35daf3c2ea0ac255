"""Medusa: K heads on the target's last hidden state guess the next tokens; a static tree of their
top-k guesses is verified in one target pass.

The tree (`medusa_choices`) is a list of rank paths: [r0, .., rd] is the node whose token is the
r_d-th guess of head d, under the node [r0, .., r(d-1)]. A node's token depends only on its depth
and rank, so one batched LM-head call over all heads gives every token of the tree.

Greedy verification is exact (lossless). Under sampling the default is recursive rejection, also
exact; `typical_acceptance=True` asks the loop for Medusa's typical acceptance instead, which is NOT lossless
(see acceptance.typical).
"""

from __future__ import annotations

import torch
from torch import nn

from app.decoding import linear
from app.decoding.tree import from_paths
from app.decoding.types import Proposal
from app.heads.medusa import MedusaHeads


class Medusa:
    name = "medusa"
    needs_hidden = True

    @classmethod
    def from_config(cls, config, target, companion) -> Medusa:
        """From a checked MedusaDecodingConfig; `target`: the target torch model; `companion`: its heads."""
        return cls(companion, target.get_output_embeddings(), config.paths(), posterior_threshold=config.posterior_threshold,
                   posterior_alpha=config.posterior_alpha, typical_acceptance=config.typical_acceptance, min_path_prob=config.pruning)

    def __init__(
        self,
        heads: MedusaHeads,
        lm_head: nn.Module,
        medusa_choices: list[list[int]],
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        typical_acceptance: bool = False,
        min_path_prob: float = 0.0,
    ) -> None:
        paths = sorted({tuple(int(r) for r in p) for p in medusa_choices}, key=lambda p: (len(p), p))
        num_heads = heads.config.medusa_num_heads
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"medusa_choices: {list(p)} is not a path of ranks >= 0")
            if len(p) > num_heads:
                raise ValueError(
                    f"medusa_choices: path {list(p)} has depth {len(p)} but there are {num_heads} heads; "
                    "use a shallower tree or more heads"
                )
        self.parents = from_paths([list(p) for p in paths])  # also checks every prefix is a path
        self.paths = [list(p) for p in paths]
        self.top_k = 1 + max((max(p) for p in paths), default=0)
        vocab, hidden = heads.config.vocab_size, heads.config.hidden_size
        ranked = heads.config.draft_vocab_size or vocab
        if tuple(lm_head.weight.shape) != (vocab, hidden):
            raise ValueError(
                f"the heads are for (vocab, hidden) = ({vocab}, {hidden}), the LM head is {tuple(lm_head.weight.shape)}"
            )
        if self.top_k > ranked:
            raise ValueError(f"medusa_choices uses rank {self.top_k - 1} but the heads rank {ranked} tokens")
        if not 0 < posterior_threshold <= 1:
            raise ValueError(f"posterior_threshold must be in (0, 1], got {posterior_threshold}")
        if posterior_alpha < 0:
            raise ValueError(f"posterior_alpha must be >= 0, got {posterior_alpha}")
        if not 0.0 <= min_path_prob < 1.0:
            raise ValueError(f"min_path_prob must be in [0, 1), got {min_path_prob}")
        self.min_path_prob = float(min_path_prob)
        self.heads, self.lm_head = heads, lm_head
        self.ids = heads.target_ids
        self.num_heads = num_heads
        self.typical_args = {
            "rule": "typical",
            "posterior_threshold": float(posterior_threshold),
            "posterior_alpha": float(posterior_alpha),
        }
        self.typical = typical_acceptance

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.sampling = sampling
        # Once per generation (a reduced vocabulary's rows are a copy); here and not in __init__, which only
        # validates: the service builds drafters on the caller's thread, and computes where generations run.
        self.head = linear.rows(*self.heads.head_rows(self.lm_head))
        # The hidden state that produced the logits of the first token (the first root).
        self.hidden = prefill.hidden[-1]

    @torch.inference_mode()
    def propose(self, context: list[int], room: int) -> Proposal:
        # Nodes are ordered by (depth, path), so any prefix of them is ancestor-closed.
        n = max(0, min(room, len(self.paths)))
        paths, parents = self.paths[:n], self.parents[:n]
        tokens: list[int] = []
        scores: list[float] = []
        if n:
            depth = len(paths[-1])
            probs = self.heads.logits(self.hidden, self.lm_head, self.head)[:depth].softmax(-1)  # (depth, ranked)
            values, indices = probs.topk(self.top_k, dim=-1)
            if self.ids is not None:
                indices = self.ids[indices]
            indices, values = indices.tolist(), values.tolist()
            for p in paths:
                tokens.append(indices[len(p) - 1][p[-1]])
                scores.append(round(values[len(p) - 1][p[-1]], 5))
            if self.min_path_prob > 0:
                paths, parents, tokens, scores = self._pruned(paths, parents, tokens, scores)
        use_typical = self.typical and not self.sampling.greedy
        source = {"tree": {"paths": paths, "scores": scores}, "heads": self.num_heads}
        if self.min_path_prob > 0:
            source["min_path_prob"] = self.min_path_prob
        if use_typical:
            source["acceptance"] = "typical"
        rule = dict(self.typical_args) if use_typical else None
        return Proposal(tokens, list(parents), source=source, acceptance=rule)

    def _pruned(self, paths, parents, tokens, scores):
        """Drop the nodes whose path probability (the product of the heads' probabilities along it)
        is below min_path_prob: each node costs target compute, and that product estimates its chance
        of acceptance. A child's product never exceeds its parent's, so what is kept stays a tree."""
        prob: list[float] = []
        for i, p in enumerate(parents):
            prob.append(scores[i] * (prob[p] if p >= 0 else 1.0))
        kept = [i for i in range(len(paths)) if prob[i] >= self.min_path_prob]
        index = {old: new for new, old in enumerate(kept)}
        return ([paths[i] for i in kept], [index[parents[i]] if parents[i] >= 0 else -1 for i in kept],
                [tokens[i] for i in kept], [scores[i] for i in kept])

    def observe(self, proposal, verdict, out) -> None:
        # The next root is the token added after the accepted path; it came from the logits of the
        # path's last slot, so that slot's hidden state is what head 0 reads to guess the token after it.
        slot = verdict.accepted[-1] + 1 if verdict.accepted else 0
        self.hidden = out.hidden[slot]
