"""What anonymous visitors may do: one immutable Policy, made from the command line at start-up and passed
down explicitly (the service holds it; nothing reads it from anywhere else).

Off (the default, an operator on their own machine): every build and training run is anyone's, speculative_model
takes registry names, trained:<id>, local directories and hub ids. Public (`python -m app --public`, or a Hugging
Face Space, whose SPACE_ID turns it on at start-up): builds and training runs belong to the visitor who made
them, training is bounded, models are named from the registry and the builds list only (unless the operator opts
in), and the engine processes a visitor may cause are bounded.

A visitor is one page load of the web app from one address: the connection's address (or, behind a proxy the operator
names with --forwarded-allow-ips, the address that proxy reports), with Gradio's session hash as a sub-bucket of it.
The session hash is the client's to choose, so every bound counts per address too: twenty hashes from one address
share that address's bound. Reloading the page starts a new visitor, whose list of builds is empty; what the old page
made stays, read-only, until the operator removes it. The HTTP server has no visitors: its clients are addresses, and
in public mode they use the operator's builds and engines only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.modes import ConfigError

PUBLIC_TIME_LIMIT_S = 60.0  # a generation in public mode (the operator's default is 300 s)
PUBLIC_MAX_NEW_TOKENS = 512
PUBLIC_TRAIN_TIME_LIMIT_S = 240.0  # the default run (128 conversations whose answers ship) takes about 2-3 min here
PUBLIC_ADDRESS_UPLOAD_BYTES = 26_000_000  # three trace files at the replay limit (traces.MAX_BYTES), with their forms
PUBLIC_UPLOAD_BYTES = 128_000_000  # every address together
UPLOAD_WINDOW_S = 600.0  # an upload counts (and is kept, unread) this long


def visitor(address: str | None, session: str | None) -> str | None:
    """The key a web visitor's work is counted and owned under: its address, then its page's session hash. The address
    comes first and holds no space, so address_of reads it back whatever session hash a client chose."""
    if address is None and session is None:
        return None
    return f"{address or 'unknown'} {session or ''}"


def address_of(key: str | None) -> str | None:
    """The address part of a visitor key (an HTTP client's key is its address alone)."""
    return None if key is None else key.split(" ", 1)[0]


@dataclass(frozen=True)
class TrainCaps:
    """Upper bounds on a public training run's TrainConfig fields (TrainConfig's own rules still apply)."""

    data_limit: int = 128
    epochs: float = 1.0
    max_len: int = 640
    answer_tokens: int = 256
    eval_prompts: int = 4

    def check(self, config: Any) -> None:
        for name in ("data_limit", "epochs", "max_len", "answer_tokens", "eval_prompts"):
            cap, value = getattr(self, name), getattr(config, name)
            if value > cap:
                raise ConfigError(f"{name} is at most {cap:g} on this public server, got {value:g}: a visitor's run must "
                                  "stay within a few minutes of the shared CPU")


@dataclass(frozen=True)
class Policy:
    public: bool = False
    # speculative_model may name a local directory / a hub id (off in public mode unless the operator opts in)
    allow_model_paths: bool = True
    allow_hub: bool = True
    # training: off, or bounded per run; one run per visitor (and one at a time on the server in any case)
    train: bool = True
    train_time_limit_s: float = math.inf  # the service stops the training child after this long
    train_caps: TrainCaps | None = None  # None: TrainConfig's own rules only
    # Engine processes (one OpenAI server per model, dtype and speculative config): how many a visitor may start
    # beyond the ones the operator prepared, at a time, and how long one may idle before it is stopped.
    visitor_engines: int = 1
    engine_idle_s: float = 600.0
    # Generations (runs, races, Measure, Load sweeps) one visitor (a page of the web app) or client (for the HTTP
    # server) may have running or waiting at once, and all the visitors of one address together; None = no bound.
    # Public mode: a race is two in turn, so 2 leaves room and fills no queue; 3 per address leaves a second tab room
    # while twenty forged session hashes from one address still hold 3 places, not the queue.
    visitor_jobs: int | None = None
    address_jobs: int | None = None
    # Replays at the recorded pace one address may play at once (the server plays at most Sessions.max_replays).
    address_replays: int | None = None
    # Uploads (trace files, each at most traces.MAX_BYTES): how many bytes one address may have stored, and all
    # addresses together, within UPLOAD_WINDOW_S; None = no bound. An upload is removed once read, or after the window.
    address_upload_bytes: int | None = None
    upload_bytes: int | None = None
    # Measure (the pass-cost curve): the longest prompt it times after. A curve needs no long context, and one after
    # 4,000 tokens held both cores for two minutes.
    measure_prompt_tokens: int | None = None

    @classmethod
    def for_public(cls, *, allow_model_paths: bool = False, allow_hub: bool = False,
                   train_time_limit_s: float | None = None) -> Policy:
        """Public mode: `train_time_limit_s` None = PUBLIC_TRAIN_TIME_LIMIT_S, 0 = training off."""
        limit = PUBLIC_TRAIN_TIME_LIMIT_S if train_time_limit_s is None else train_time_limit_s
        if not limit >= 0:
            raise ConfigError(f"--train-time-limit must be a number of seconds >= 0 (0 = training off), got {limit}")
        return cls(public=True, allow_model_paths=allow_model_paths, allow_hub=allow_hub, train=limit > 0,
                   train_time_limit_s=limit if limit > 0 else math.inf, train_caps=TrainCaps(), visitor_jobs=2,
                   address_jobs=3, address_replays=1, address_upload_bytes=PUBLIC_ADDRESS_UPLOAD_BYTES,
                   upload_bytes=PUBLIC_UPLOAD_BYTES, measure_prompt_tokens=512)

    def check_model_name(self, name: str, registry: tuple[str, ...]) -> None:
        """Whether a request may name `name` as its speculative_model (registry names and trained:<id> are checked
        elsewhere). One answer whether a directory exists or not: a refusal must not tell them apart."""
        if len(name) > 1024 or "\x00" in name:  # no path or hub id is; the file system would raise, not answer
            raise ConfigError("speculative_model must be a name of at most 1024 characters without NUL")
        try:
            exists = Path(name).expanduser().exists()
        except (OSError, RuntimeError):  # a component too long for the file system, ~user of nobody: no usable path
            raise ConfigError(f"speculative_model '{name[:80]}' is neither a usable path nor a name") from None
        looks_like_path = name.startswith((".", "/", "~")) or exists
        if (looks_like_path and self.allow_model_paths) or (not looks_like_path and self.allow_hub):
            return
        known = ", ".join(registry) or "none"
        raise ConfigError(f"speculative_model '{name[:80]}' is not allowed here: name a registry model ({known}), "
                          "trained:<id> of a training run of yours, or leave it unset for the shipped one")


def relative(value: Any, roots: dict[str, str]) -> Any:
    """`value` (text, or JSON-like data) with every absolute path under one of `roots` ({absolute: shown as})
    rewritten relative to it: no response tells a visitor where the server keeps its files."""
    if isinstance(value, str):
        for root, shown in sorted(roots.items(), key=lambda kv: -len(kv[0])):
            value = value.replace(root + "/", shown + "/" if shown else "").replace(root, shown or ".")
        return value
    if isinstance(value, dict):
        return {k: relative(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative(v, roots) for v in value]
    return value
