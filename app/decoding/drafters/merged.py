"""A merged draft tree (SpecInfer, arXiv 2305.09781): a tree drafter's tree plus another drafter's
candidates, verified together in one target pass.

Here: Medusa's or EAGLE's tree plus prompt lookup's copied continuations. Each drafter is good where
the other is weak: the heads or the draft guess the next few tokens of free text, prompt lookup copies long runs
where the output repeats its context (summaries, extraction, code edits). Both drafts are
deterministic functions of the context, so the merged tree is too, and verification stays what it
is for any tree: greedy match, or recursive rejection under sampling (lossless); Medusa's typical
acceptance, when asked for, stays not lossless.
"""

from __future__ import annotations

from app.decoding.tree import graft
from app.decoding.types import Proposal


class Merged:
    def __init__(self, primary, extra) -> None:
        self.primary, self.extra = primary, extra
        self.name = primary.name
        self.needs_hidden = primary.needs_hidden or extra.needs_hidden

    def start(self, prompt, sampling, gen, prefill) -> None:
        self.primary.start(prompt, sampling, gen, prefill)
        self.extra.start(prompt, sampling, gen, prefill)

    def propose(self, context: list[int], room: int) -> Proposal:
        first = self.primary.propose(context, room)
        second = self.extra.propose(context, room - len(first.tokens))
        for p in (first, second):
            if p.q is not None or p.num_draft != len(p.tokens):
                # A sampled chain's q (Leviathan) or lookahead's non-draft inputs do not survive merging.
                raise ValueError(f"{type(self).__name__} merges deterministic draft trees only")
        tokens, parents, where = graft(first.tokens, first.parents, second.tokens, second.parents)
        source = {
            **first.source,
            self.extra.name: {**second.source, "nodes": where, "new_nodes": len(tokens) - len(first.tokens)},
        }
        return Proposal(tokens, parents, source=source, acceptance=first.acceptance)

    def observe(self, proposal, verdict, out) -> None:
        # Node indices in `verdict` and slots in `out` are the merged tree's; the primary's own nodes
        # kept their indices, and feature drafters read only the accepted path's slots.
        self.primary.observe(proposal, verdict, out)
        self.extra.observe(proposal, verdict, out)
