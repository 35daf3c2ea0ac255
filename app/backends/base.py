"""What every backend offers the service: what it can run, and a generation as a stream of messages.

Messages are plain JSON-like dicts, the same over HTTP as in process:
  {"type": "start", "prompt_ids": [...], "texts": {id: piece}, ...}   once, first
  {"type": "step", <StepEvent fields>, "texts": {id: piece}}          one per target forward pass
  {"type": "end", "finish_reason": ..., "text": ..., "totals": {...}, "error": None}   once, last
`texts` maps every token id the message mentions to its text, so a UI never needs a tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from app.modes import Mode
from app.modes.configs import DecodeRequest
from app.service.jobs import Limits, Work


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""  # why not, in words a user understands (empty when available)


@dataclass(frozen=True)
class Prompt:
    """A user turn (`text`, chat template applied by the backend) or a raw completion prompt (`raw=True`)."""

    text: str
    raw: bool = False
    messages: list[dict[str, str]] = field(default_factory=list)  # chat history; when set, `text` is ignored


class Backend(Protocol):
    name: str

    def availability(self) -> Availability: ...

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        """None when this backend can run `mode` (its entry in app/modes/) for `model`, else the reason it cannot."""

    def check(self, request: DecodeRequest) -> None:
        """This backend's own rules for a request of a valid mode (ConfigError, one sentence); the service runs it once,
        when it checks the request."""

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        """Everything that can fail before generation starts (load, encode, check the prompt against the
        context and the limits) runs here and raises ConfigError / ModelError; the returned work streams
        the messages when a job worker runs it."""


def encode(tok, prompt: Prompt) -> list[int]:
    """The prompt's token ids as the transformers backend makes them (the chat template for a user turn)."""
    if prompt.messages or (not prompt.raw and getattr(tok, "chat_template", None)):
        messages = prompt.messages or [{"role": "user", "content": prompt.text}]
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    return tok.encode(prompt.text, add_special_tokens=True)
