"""The drafter interface: every decoding mode is a drafter plugged into the one verify loop."""

from __future__ import annotations

from typing import Protocol

import torch

from app.decoding.sampling import SamplingParams
from app.decoding.types import Forward, Proposal, Verdict


class Drafter(Protocol):
    name: str
    needs_hidden: bool  # drafts from the target's hidden states (Forward.hidden / .layers), not only its tokens

    def start(self, prompt: list[int], sampling: SamplingParams, gen: torch.Generator, prefill: Forward) -> None:
        """Reset per-generation state for a new prompt; `prefill` is the target's pass over it."""

    def propose(self, context: list[int], room: int) -> Proposal:
        """Propose a tree after context[-1] (the root), with at most `room` nodes (what fits in the context)."""

    def observe(self, proposal: Proposal, verdict: Verdict, out: Forward) -> None:
        """Feedback after verification: the target's pass over [root, *proposal.tokens] (slot i+1 = after node i)."""
