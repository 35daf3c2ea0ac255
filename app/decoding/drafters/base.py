"""The drafter interface: every decoding mode is a drafter plugged into the one verify loop."""

from __future__ import annotations

from typing import Protocol

import torch

from app.decoding.sampling import SamplingParams
from app.decoding.types import Proposal, Verdict


class Drafter(Protocol):
    name: str

    def start(self, prompt: list[int], sampling: SamplingParams, gen: torch.Generator) -> None:
        """Reset per-generation state for a new prompt."""

    def propose(self, context: list[int], room: int) -> Proposal:
        """Propose a tree after context[-1] (the root), with at most `room` nodes (what fits in the context)."""

    def observe(self, proposal: Proposal, verdict: Verdict, logits: torch.Tensor) -> None:
        """Feedback after verification; logits (1 + len(proposal.tokens), vocab) of every slot."""
