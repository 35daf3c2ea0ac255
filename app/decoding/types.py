"""What drafters propose and what the verify loop reports, step by step."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class Proposal:
    """A token tree to run through the target in one forward pass, hanging off the root.

    Nodes [0, num_draft) are draft candidates the target may accept. Nodes after them are the
    drafter's own inputs (lookahead's Jacobi window): the target computes them in the same pass
    and their logits go back to the drafter, but they are never accepted.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    num_draft: int | None = None
    # Draft distributions (num_draft, vocab) of a sampled chain draft: enables Leviathan's
    # min(1, p/q) test. None means the draft is deterministic (q = 1 on the drafted token).
    q: torch.Tensor | None = None
    # JSON-serializable provenance for the trace (matched n-gram, window levels, draft probs...).
    source: dict[str, Any] = field(default_factory=dict)
    # A non-lossless rule the drafter asks for under sampling (greedy stays exact): Medusa's
    # {"rule": "typical", "posterior_threshold": ..., "posterior_alpha": ...}. None = lossless rules.
    acceptance: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("a proposal needs one parent per token")
        if self.num_draft is None:
            self.num_draft = len(self.tokens)

    @property
    def draft_tokens(self) -> list[int]:
        return self.tokens[: self.num_draft]

    @property
    def draft_parents(self) -> list[int]:
        return self.parents[: self.num_draft]


@dataclass
class Forward:
    """What one target forward pass returns: logits per fed position and the final (normed) hidden
    states under them, which feature-level drafters (Medusa heads, EAGLE) draft from."""

    logits: torch.Tensor  # (positions, vocab)
    hidden: torch.Tensor | None  # (positions, hidden_size); None when the target was asked for logits only
    # Every hidden state transformers returns, each (positions, hidden_size): 0 = the embeddings,
    # i = the output of layer i (the last is `hidden`), for drafters that fuse several layers (EAGLE-3).
    layers: tuple[torch.Tensor, ...] = ()


@dataclass
class Verdict:
    """The verification of one proposal: the accepted path and the token the target added."""

    accepted: list[int]  # node indices, root to deepest accepted node
    added: int  # correction (a draft child was rejected), bonus (path fully accepted) or plain next token
    added_kind: str  # "next" | "correction" | "bonus"


@dataclass
class Totals:
    new_tokens: int = 0
    target_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.target_steps if self.target_steps else 0.0


@dataclass
class StepEvent:
    """One target forward pass and what it committed. `tokens` = accepted draft tokens + added token
    (cut short at EOS or max_new_tokens), so the concatenated `tokens` of all events is the output."""

    step: int
    kind: str  # "prefill" | "decode"
    proposed: dict[str, list[int]]  # {"tokens": [...], "parents": [...]}: the draft tree
    accepted: list[int]  # node indices on the accepted path
    rejected: list[int]  # draft node indices not committed (rejected, or cut by EOS / max_new_tokens)
    accepted_tokens: list[int]
    added_token: int | None  # None when EOS or max_new_tokens fell inside the accepted draft
    added_kind: str
    tokens: list[int]
    source: dict[str, Any]
    draft_time_s: float
    verify_time_s: float
    totals: dict[str, float]
    finish_reason: str | None = None  # "eos" | "length" | "cancelled" on the last event
    # The target's side of the step (loop.target_view): its top token where it decided, and the
    # probability it gave each draft token it weighed and the token it added.
    target: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
