"""The default backend: this project's verify loop on PyTorch + transformers (CPU here, CUDA if present).

Models and trained companions (draft model, Medusa heads, EAGLE module) are loaded once per
backend and shared read-only by every job; each generation gets its own KV cache and drafter.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app import models, runner
from app.models import LoadedModel
from app.modes import ConfigError, DecodeRequest, Mode, configs
from app.modes.limits import STEP_DRAFT_TOKENS
from app.backends.base import Backend, Prompt
from app.decoding import fast_build
from app.service.jobs import Limits, Work


def check(request: DecodeRequest) -> None:
    """The transformers backend's bounds on one step (app/modes/limits.py): each step well under a second here."""
    c = request.speculative_config
    nodes = configs.draft_tokens(c)
    pl = configs.merged(c)
    if pl is not None:
        nodes += configs.draft_tokens(pl)
    if nodes > STEP_DRAFT_TOKENS:
        raise ConfigError(f"this {c.mode} config verifies up to {nodes} draft tokens a step; the transformers backend "
                          f"verifies at most {STEP_DRAFT_TOKENS} (so a step stays well under a second on a CPU)")
    if request.entry.loop_check:
        request.entry.loop_check(c)


FAST_BUILD_S = 600.0  # a fast pass's build on 2 cores with nothing of its own to go by (docs/ui.md: about 10 minutes)


def _last_build_s(compiled_root: Path) -> float | None:
    """What the newest whole fast-pass build under `compiled_root` took (a target's pass and its companions': its
    info.json's `with_companions_s`), or None. A companion's pass built alone takes a minute, not a build's minutes."""
    infos = sorted(compiled_root.glob("*/info.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for info in infos:
        try:
            seconds = json.loads(info.read_text()).get(fast_build.WHOLE)
        except (OSError, ValueError):
            continue
        if isinstance(seconds, (int, float)) and seconds > 0:
            return float(seconds)
    return None


class TransformersBackend(Backend):
    name = "transformers"
    dtype_per_request = True

    def __init__(self, engines: Path = models.DEFAULT_ENGINES, dtype: str = "float32",
                 compute: Callable[[Callable[[], Any]], Any] = lambda load: load(), fast: str = "eager",
                 build_companions: bool = True) -> None:
        self.engines = engines
        self.fast = fast  # how each target model gets its fast pass when it loads (models.load)
        # Whether a request may build a trained module's compiled pass (a minute of both cores); a public server's
        # visitors may not: their modules run eagerly unless the operator built the pass (`python -m app compile`).
        self.build_companions = build_companions
        self.dtype = dtype
        self._compute = compute  # runs a load where the generations run (JobManager.call says why)
        self._lock = threading.Lock()
        self._loading: dict[tuple, threading.Lock] = {}
        self._loaded: dict[tuple, Any] = {}

    def auto(self, mode: str) -> bool:
        return True  # the last the registry asks: it runs every mode here

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

    def tokenizer(self, name: str):
        """`name`'s tokenizer, read once without its weights. Read here, not where the generations run (`_compute`):
        no torch work, and a caller on a job's worker would wait on itself."""
        with self._lock:
            if ("tokenizer", name) not in self._loaded:
                self._loaded[("tokenizer", name)] = models.load_tokenizer(name, self.engines)
            return self._loaded[("tokenizer", name)]

    def pass_note(self, name: str, dtype: str = "auto") -> str | None:
        """Which pass `name` runs in now, once it is loaded: the fast pass, or eager ones while it builds."""
        dtype = self.dtype if dtype == "auto" else dtype
        with self._lock:
            loaded = self._loaded.get(("model", name, dtype))
        if loaded is None:
            return None
        if loaded.fast["state"] == "building":
            stage = models.build_stage(loaded)
            return (f"{loaded.fast['note']}: {time.monotonic() - loaded.fast['started']:.0f} s so far"
                    + (f"; now {stage}" if stage else ""))
        return loaded.fast["note"]

    def fast_status(self, name: str, dtype: str = "auto") -> dict[str, Any] | None:
        """`name`'s fast pass in `dtype` once the model is loaded (None before): its state and note; while it builds,
        what the build does now (models.build_stage), the seconds so far, and how long a build takes here
        (`estimate_s`: the last finished build on this store, else FAST_BUILD_S; `estimated_from` says which)."""
        dtype = self.dtype if dtype == "auto" else dtype
        with self._lock:
            loaded = self._loaded.get(("model", name, dtype))
        if loaded is None:
            return None
        out: dict[str, Any] = {"model": name, "dtype": dtype, "state": loaded.fast["state"], "note": loaded.fast["note"]}
        if loaded.fast["state"] == "building":
            last = _last_build_s(Path(loaded.fast["log"]).parent)
            out.update(stage=models.build_stage(loaded), elapsed_s=time.monotonic() - loaded.fast["started"],
                       estimate_s=last or FAST_BUILD_S, estimated_from="the last build here" if last else "typical")
        return out

    def companion(self, target: LoadedModel, cfg, modes) -> Any:
        """What the mode drafts with (`modes`: the request's registry, whose entry names its artifact)."""
        # Once per pass of the target too: an artifact loaded while the target ran eagerly has no compiled pass of its
        # own, and gets one when loaded again beside the target's (runner.load_artifact).
        key = ("companion", target.name, target.dtype, cfg.mode, getattr(cfg.speculative_config, "speculative_model", None),
               target.forward is not None)
        return self._once(key, lambda: runner.load_companion(cfg, target, self.engines, modes, self.build_companions))

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

    def check(self, request: DecodeRequest) -> None:
        check(request)

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        cfg = runner.to_runtime(request)
        target = self.model(model, request.dtype)
        if prompt.messages:
            prompt_ids = target.encode_chat(prompt.messages)
        else:
            prompt_ids = target.encode(prompt.text, chat=not prompt.raw)
        configs.check_prompt_limit(len(prompt_ids), limits.max_prompt_tokens)
        configs.check_context(len(prompt_ids), request.max_new_tokens, _context(target))
        companion = self.companion(target, cfg, request.modes)
        # Built here, once: what only the loaded artifact can tell (a Medusa tree deeper than its heads) fails before
        # the job is queued. Building is cheap, so it runs on the caller's thread without waiting for the workers.
        drafter = runner.drafter(cfg, target.model, companion, request.modes)

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            # Which pass serves this run (a fast pass that becomes ready during it serves the next one).
            yield {"type": "start", "backend": self.name, "model": model, "mode": cfg.mode, "dtype": target.dtype,
                   "pass": target.fast["note"] + _artifact_pass(request.entry, companion, target), "prompt_ids": prompt_ids,
                   "texts": _texts(target, prompt_ids)}
            ids: list[int] = []
            shown = ""
            last = None
            load = runner.CpuShare()
            for event in runner.run(target, cfg, prompt_ids, companion, cancel, drafter):
                ids += event.tokens
                text = target.decode(ids)
                # A piece ending in U+FFFD is half a multi-byte character: wait for the rest before sending it.
                delta = "" if text.endswith("\ufffd") else text[len(shown):]
                shown += delta
                message = event.to_dict()
                if (share := load.share()) is not None:
                    message["totals"]["cpu_share"] = share
                yield {"type": "step", **message, "text": delta, "texts": _texts(target, _ids_in(message))}
                load.resume()
                last = event
            text = target.decode(ids)
            yield {"type": "end", "finish_reason": last.finish_reason if last else "cancelled", "text": text,
                   "text_tail": text[len(shown):], "token_ids": ids, "totals": last.totals if last else {}, "error": None}

        return work


def _artifact_pass(entry, companion, target: LoadedModel) -> str:
    """What the pass note adds beside a compiled target for an artifact that can run compiled (`Mode.artifact_pass`)."""
    if not entry.artifact_pass or companion is None or target.forward is None:
        return ""
    return f"; its {entry.artifact_label} {'compiled too' if companion.fast is not None else 'eager'}"


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
