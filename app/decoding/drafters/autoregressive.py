"""The baseline: propose nothing, so every step adds exactly the target's next token."""

from __future__ import annotations

from app.decoding.types import Proposal


class Autoregressive:
    name = "autoregressive"
    needs_hidden = False

    @classmethod
    def from_config(cls, config, target=None, companion=None) -> Autoregressive:
        return cls()

    def start(self, prompt, sampling, gen, prefill) -> None:
        pass

    def propose(self, context: list[int], room: int) -> Proposal:
        return Proposal()

    def observe(self, proposal, verdict, out) -> None:
        pass
