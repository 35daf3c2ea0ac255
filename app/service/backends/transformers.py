"""The default backend: this project's verify loop on PyTorch + transformers (CPU here, CUDA if present).

Models and trained companions (draft model, Medusa heads, EAGLE module) are loaded once per
backend and shared read-only by every job; each generation gets its own KV cache and drafter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app import models, runner
from app.config import ConfigError
from app.models import LoadedModel
from app.service import configs
from app.service.backends.base import Availability, Prompt
from app.modes import Mode
from app.service.configs import DecodeRequest
from app.service.jobs import Limits, Work


class TransformersBackend:
    name = "transformers"

    def __init__(self, engines: Path = models.DEFAULT_ENGINES, dtype: str = "float32",
                 compute: Callable[[Callable[[], Any]], Any] = lambda load: load(), fast: str = "eager") -> None:
        self.engines = engines
        self.fast = fast  # how each target model gets its fast pass when it loads (models.load)
        self.dtype = dtype
        self._compute = compute  # runs a load where the generations run (JobManager.call says why)
        self._lock = threading.Lock()
        self._loading: dict[tuple, threading.Lock] = {}
        self._loaded: dict[tuple, Any] = {}

    def availability(self) -> Availability:
        return Availability(True)

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        if model is None or not mode.artifact:
            return None
        if models.default_artifact(model, mode.artifact) is None:
            return (f"no {mode.artifact_label} ships for '{model}': name one in the mode's settings, or train one "
                    f"(python -m app train --mode {mode.artifact})")
        return None

    def model(self, name: str, dtype: str = "auto") -> LoadedModel:
        dtype = self.dtype if dtype == "auto" else dtype
        return self._once(("model", name, dtype), lambda: models.load(name, dtype=dtype, engines=self.engines,
                                                                         fast=self.fast))

    def pass_note(self, name: str, dtype: str = "auto") -> str | None:
        """Which pass `name` runs in now, once it is loaded: the fast pass, or eager ones while it builds."""
        dtype = self.dtype if dtype == "auto" else dtype
        with self._lock:
            loaded = self._loaded.get(("model", name, dtype))
        if loaded is None:
            return None
        if loaded.fast["state"] == "building":
            return f"{loaded.fast['note']}: {time.monotonic() - loaded.fast['started']:.0f} s so far"
        return loaded.fast["note"]

    def companion(self, target: LoadedModel, cfg, modes) -> Any:
        """What the mode drafts with (`modes`: the request's registry, whose entry names its artifact)."""
        key = ("companion", target.name, target.dtype, cfg.mode, getattr(cfg.speculative_config, "speculative_model", None))
        return self._once(key, lambda: runner.load_companion(cfg, target, self.engines, modes))

    def _once(self, key: tuple, load):
        """Load what `key` names once, even when several jobs ask at the same time."""
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._loaded:
                    return self._loaded[key]
            value = self._compute(load)
            with self._lock:
                self._loaded[key] = value
            return value

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        cfg = configs.to_runtime(request)
        target = self.model(model, request.dtype)
        if prompt.messages:
            prompt_ids = target.encode_chat(prompt.messages)
        else:
            prompt_ids = target.encode(prompt.text, chat=not prompt.raw)
        configs.check_prompt_limit(len(prompt_ids), limits.max_prompt_tokens)
        configs.check_context(len(prompt_ids), request.max_new_tokens, _context(target))
        companion = self.companion(target, cfg, request.modes)
        try:
            # What only the loaded artifact can tell (a Medusa tree deeper than its heads) fails here, not in the job.
            # Building a drafter only validates, so this runs on the caller's thread without waiting for the workers.
            cfg.drafter(target.model, companion)
        except ValueError as err:
            raise ConfigError(str(err)) from err

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            # Which pass serves this run (a fast pass that becomes ready during it serves the next one).
            yield {"type": "start", "backend": self.name, "model": model, "mode": cfg.mode, "dtype": target.dtype,
                   "pass": target.fast["note"], "prompt_ids": prompt_ids, "texts": _texts(target, prompt_ids)}
            ids: list[int] = []
            shown = ""
            last = None
            for event in runner.run(target, cfg, prompt_ids, companion, cancel):
                ids += event.tokens
                text = target.decode(ids)
                # A piece ending in U+FFFD is half a multi-byte character: wait for the rest before sending it.
                delta = "" if text.endswith("\ufffd") else text[len(shown):]
                shown += delta
                message = event.to_dict()
                yield {"type": "step", **message, "text": delta, "texts": _texts(target, _ids_in(message))}
                last = event
            text = target.decode(ids)
            yield {"type": "end", "finish_reason": last.finish_reason if last else "cancelled", "text": text,
                   "text_tail": text[len(shown):], "token_ids": ids, "totals": last.totals if last else {}, "error": None}

        return work


def _context(target: LoadedModel) -> int:
    return int(getattr(target.model.config, "max_position_embeddings", 0) or 2**31)


def _texts(target: LoadedModel, ids) -> dict[int, str]:
    return {i: target.tokenizer.decode([i]) for i in set(ids)}


def _ids_in(event: dict[str, Any]) -> list[int]:
    """Every token id a step message mentions: the draft tree, what was committed, the draft's source
    and the target's own top tokens."""
    ids = list(event["proposed"]["tokens"]) + list(event["tokens"])
    ids += [d["top"] for d in (event.get("target") or {}).get("decided") or []]
    if event.get("added_token") is not None:
        ids.append(event["added_token"])
    source = event.get("source") or {}
    for match in source.get("matches") or []:
        ids += match["ngram"]
    for seq in (source.get("candidates") or []) + (source.get("window") or []):
        ids += seq
    return ids
