"""What every backend offers the service: what it can run, and a generation as a stream of messages.

Messages are plain JSON-like dicts, the same over HTTP as in process:
  {"type": "start", "prompt_ids": [...], "texts": {id: piece}, ...}   once, first
  {"type": "step", <StepEvent fields>, "texts": {id: piece}}          one per target forward pass
  {"type": "end", "finish_reason": ..., "text": ..., "totals": {...}, "error": None}   once, last
`texts` maps every token id the message mentions to its text, so a UI never needs a tokenizer.
"""

from __future__ import annotations

import threading
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from app import models
from app.modes import Mode
from app.modes.configs import DecodeRequest
from app.backends.store import BuildSpec, Progress, Store
from app.service.errors import EngineError
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


class Backend:
    """What the service asks of every engine. The defaults are an engine's that starts no process of its own and
    makes no build per request (the transformers and remote backends); an engine overrides what it has."""

    name: str
    # Requests run on a build of the store made for their settings (an engine), which a public server's anonymous
    # client may use but not make (Service._check_operators_engine).
    engine_builds = False
    # Its engines run in processes the service starts and keeps (vLLM's servers, TensorRT-LLM's workers): their builds
    # are listed with their server, and a request may start one.
    managed = False
    kind: str | None = None  # the kind of build (its manifest's "kind") whose server this backend keeps
    # A request may ask for its dtype (the model loaded, or an engine started, in it); else the engine runs in the dtype
    # its build or server was made with.
    dtype_per_request = False
    started: AbstractSet[str] = frozenset()  # the engines this backend started: stopped when the service closes

    def availability(self) -> Availability:
        return Availability(True)

    def tokenizer(self, model: str):
        """The tokenizer this backend encodes `model`'s prompts with; EngineError where they are encoded elsewhere (a
        remote server takes text)."""
        raise EngineError(f"the {self.name} backend encodes prompts on its server: this app holds no tokenizer for it")

    @staticmethod
    def waiting(seconds: float) -> str:
        """What a run waits for before its first step, `seconds` so far, in words."""
        return f"loading the model and what this mode drafts with: {seconds:.0f} s"

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        """None when this backend can run `mode` (its entry in app/modes/) for `model`, else the reason it cannot."""
        raise NotImplementedError

    def check(self, request: DecodeRequest) -> None:
        """This backend's own rules for a request of a valid mode (ConfigError, one sentence); the service runs it once,
        when it checks the request."""

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        """Everything that can fail before generation starts (load, encode, check the prompt against the
        context and the limits) runs here and raises ConfigError / ModelError; the returned work streams
        the messages when a job worker runs it."""
        raise NotImplementedError

    def auto(self, mode: str) -> bool:
        """Whether a request for `auto` runs `mode` here (the registry's AUTO says in which order backends are asked)."""
        return False

    def notes(self, request: DecodeRequest) -> list[str]:
        """What of a valid request this engine does not take, in words (said, not dropped silently)."""
        return []

    def note(self, request: DecodeRequest, model: str) -> str | None:
        """What a user should know before running `request` here, said in place of this app's own notes; None: nothing."""
        return None

    def race_refusal(self, request: DecodeRequest) -> str | None:
        """Why `request` cannot race an autoregressive baseline here, or None."""
        return None

    def spec(self, request: DecodeRequest, model: str) -> BuildSpec | None:
        """The build of a request where this backend makes its own; None: the one registry.spec_for says."""
        return None

    def engine(self, model: str, request: DecodeRequest, progress: Progress | None = None) -> tuple[dict[str, Any], str]:
        """A managed backend's build of the request and the URL of its running server (built, started or reused)."""
        raise EngineError(f"the {self.name} backend starts no engine")

    def running(self, build_id: str) -> bool:
        """Whether the engine of a build runs now."""
        return False

    def server(self, build_id: str) -> dict[str, Any]:
        """A build's server as the Engines tab lists it: its state, and whether this backend started it."""
        return {"state": "stopped"}

    def stop(self, build_id: str) -> bool:
        """Stop a build's engine, whoever started it (the build stays); True when one was running."""
        return False

    def room(self) -> int | None:
        """How many more engines requests may start now (None: no bound)."""
        return None

    def release(self, build_id: str) -> None:
        """Stop an engine this backend started (a load sweep's, when it ends); others' are left alone."""

    def stop_started(self) -> None:
        """Stop the engines this backend started (the service's close)."""

    def close(self) -> None:
        """Let go of what this backend holds in this process."""


class EngineBackend(Backend):
    """An engine whose servers the service starts and keeps in processes of their own, each serving a build of the
    store (vLLM's servers, TensorRT-LLM's workers); `state` and `stop_server` are the engine's, by build id."""

    engine_builds = True
    managed = True

    def __init__(self, store: Store, settings: Any) -> None:
        self.store = store
        self.settings = settings  # the operator's choices for this engine (its processes' Settings)
        self.started: set[str] = set()
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        """Why this engine cannot run here, or None."""
        raise NotImplementedError

    def state(self, build_id: str) -> dict[str, Any]:
        """{"state": "running" | "stopped" | ..., and what the engine's processes say of it} of a build's server."""
        raise NotImplementedError

    def stop_server(self, build_id: str) -> bool:
        """Stop a build's server, started here or not; True when one was running."""
        raise NotImplementedError

    def availability(self) -> Availability:
        reason = self.unavailable()
        return Availability(reason is None, reason or "")

    def tokenizer(self, model: str):
        """The model's own tokenizer: prompts are encoded, and outputs decoded, here (the engine gets token ids)."""
        with self._lock:
            if model not in self._tokenizers:
                self._tokenizers[model] = models.load_tokenizer(model, self.store.root)
            return self._tokenizers[model]

    def running(self, build_id: str) -> bool:
        return self.state(build_id)["state"] == "running"

    def server(self, build_id: str) -> dict[str, Any]:
        # started_here: this process started it (the rest were started by the CLI, a test or another app on the store).
        return {**self.state(build_id), "started_here": build_id in self.started}

    def stop(self, build_id: str) -> bool:
        with self._lock:
            self.started.discard(build_id)
        return self.stop_server(build_id)

    def stop_started(self) -> None:
        with self._lock:
            started, self.started = self.started, set()
        for build_id in started:
            self.stop_server(build_id)


def encode(tok, prompt: Prompt) -> list[int]:
    """The prompt's token ids as the transformers backend makes them (the chat template for a user turn)."""
    if prompt.messages or (not prompt.raw and getattr(tok, "chat_template", None)):
        messages = prompt.messages or [{"role": "user", "content": prompt.text}]
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    return tok.encode(prompt.text, add_special_tokens=True)
