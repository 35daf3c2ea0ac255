"""Run one generation: a loaded model, a decoding config and a prompt in; trace events out.

Modes that draft from a trained artifact get it as a `companion`, loaded once and shared
read-only between generations: the draft model (draft_target), Medusa heads, or an EAGLE module.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import figures, models
from app.decoding import linear
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.types import StepEvent
from app.decoding.sampling import SamplingParams
from app.models import LoadedModel, ModelError
from app.modes import MODES, ConfigError, DecodeRequest, Modes
from app.modes.configs import AutoregressiveConfig, merged
from app.modes.registry import resolve


@dataclass
class DecodingConfig:
    """A checked request as the transformers backend's loop runs it."""

    speculative_config: Any = field(default_factory=AutoregressiveConfig)  # one mode's checked config
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()

    @property
    def mode(self) -> str:
        return self.speculative_config.mode


def to_runtime(request: DecodeRequest) -> DecodingConfig:
    """The transformers backend's runtime config for a checked request."""
    s = request.sampling
    return DecodingConfig(request.speculative_config, request.max_new_tokens,
                          SamplingParams(s.temperature, s.top_p, s.top_k, s.seed))


def load_companion(cfg: DecodingConfig, target: LoadedModel, engines: Path = models.DEFAULT_ENGINES,
                   modes: Modes | None = None, build: bool = True):
    """What cfg.mode drafts with (its entry's `artifact` in `modes`, default the app's registry), or None. Explicit
    paths/names win; otherwise the model's shipped default. `build` False: a compiled pass not yet built stays unbuilt."""
    entry = (modes or MODES).get(cfg.mode)
    if entry is None or not entry.artifact:
        return None
    if entry.draft_model:
        name = cfg.speculative_config.speculative_model or default_draft(target.name)
        draft = models.load(name, dtype=target.dtype, engines=engines)
        models.check_compatible(target, draft)
        return draft
    kind = entry.artifact
    path = cfg.speculative_config.speculative_model or models.default_artifact(target.name, kind)
    if path is None:
        raise ConfigError(
            f"no {kind} artifact for model '{target.name}': train one (python -m app train --mode {kind}) "
            f"and pass --{kind}-model DIR"
        )
    return load_artifact(entry, Path(path), target, engines, build)


def default_draft(target_name: str) -> str:
    for alias, (base, layers) in models.DRAFT_ALIASES.items():
        if base == target_name and (layers / "config.json").exists():
            return alias
    raise ConfigError(
        f"draft_target needs a draft model for '{target_name}': pass --draft-model NAME, or train one "
        "(python -m app train --mode draft, then python -m app export DIR --output-dir MODEL_DIR)"
    )


def load_artifact(entry, path: Path, target: LoadedModel, engines: Path = models.DEFAULT_ENGINES, build: bool = True):
    """The heads or module `entry` drafts with, loaded beside the target by its entry's loader, with its compiled
    pass where the entry has one and the target runs its own."""
    kind = entry.artifact
    if not (path / "config.json").exists():
        raise ModelError(f"--{kind}-model '{path}' is not a directory written by `python -m app train --mode {kind}`")
    try:
        module = resolve(entry.artifact_loader)(path, target.model)
    except (ValueError, OSError) as err:
        raise ModelError(str(err)) from err
    module = module.to(target.model.dtype).eval().requires_grad_(False)
    linear.pack(module)
    if entry.artifact_pass:
        models.attach_companion_pass(module, path, target, engines, resolve(entry.artifact_pass), build)
    return module


def drafter(cfg: DecodingConfig, target=None, companion=None, modes: Modes | None = None):
    """A fresh drafter for one generation: the class cfg's entry names (in `modes`, default the app's), built from its
    config (`target`: the target torch model; `companion`: what load_companion loaded), with prompt lookup's candidates
    merged into a tree mode's tree when the config asks for them. What only the loaded artifact can tell (a Medusa tree
    deeper than the heads it has) fails here, as a ConfigError."""
    c = cfg.speculative_config
    entry = (modes or MODES).by_type(c.decoding_type)
    try:
        built = resolve(entry.drafter).from_config(c, target, companion)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    extra = merged(c)
    if extra is None:
        return built
    from app.decoding.drafters.merged import Merged

    return Merged(built, drafter(DecodingConfig(extra), target, companion, modes))


def run(
    target: LoadedModel,
    cfg: DecodingConfig,
    prompt_ids: list[int],
    companion=None,
    cancel: threading.Event | None = None,
    drafter_=None,
    modes: Modes | None = None,
) -> Iterator[StepEvent]:
    """The generation's steps. `drafter_`: the one built for it (the service builds it once while it prepares the
    run), else built here from cfg's entry in `modes`."""
    drafter_ = drafter_ or drafter(cfg, target.model, companion, modes)
    return generate(
        TransformersTarget(target.model, hidden_states=drafter_.needs_hidden, forward=target.forward),
        drafter_,
        prompt_ids,
        sampling=cfg.sampling,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_ids=target.eos_token_ids,
        cancel=cancel,
    )


def output_ids(events: list[StepEvent]) -> list[int]:
    return [t for e in events for t in e.tokens]


# A verify pass of k tokens (k - 1 drafted), for k in:
VERIFY_SIZES = (1, 2, 4, 8, 16, 32)


def falls(cost: dict) -> tuple[tuple[int, float], tuple[int, float]] | None:
    """The first (tokens, relative) pair of a measured curve after which a wider pass measured cheaper by more than
    the noise (figures.NOISE), read from its milliseconds, or None. A pass over more tokens does all a narrower one
    does: such a curve was measured while the machine's load changed."""
    ms = cost.get("ms") or []
    relative = [m / ms[0] for m in ms] if ms and ms[0] else list(cost.get("relative") or [])
    fell = figures.monotone(relative)[1]
    if fell is None:
        return None
    before = max(range(fell), key=lambda i: relative[i])
    return (cost["tokens"][before], round(relative[before], 2)), (cost["tokens"][fell], round(relative[fell], 2))


def verify_cost(target: LoadedModel, prompt_ids: list[int], sizes=VERIFY_SIZES, repeats: int = 5,
                most: int = 40, budget_s: float = 30.0) -> dict:
    """Milliseconds of one target pass over k new tokens after `prompt_ids` (a verify step of k - 1
    drafted tokens), the fastest of its readings, and each relative to k = 1.

    This curve decides what speculation can earn on a machine: a step that verifies k tokens pays
    only when it yields more than relative[k] tokens. It differs a lot between CPUs (bfloat16
    without native instructions grows about linearly in k), so the bench records it with its results.

    The sizes are timed round-robin, so drift of the machine hits all alike (round 0 warms up), for at least `repeats`
    rounds and then on, up to `most` rounds or `budget_s` seconds (someone is waiting for it), while the fastest
    readings still have a wider pass cheaper than a narrower one beyond the noise: other load only ever adds time, so a
    burst that hit one size's readings is outlasted by the next quiet one. `relative` is the curve as it may be printed (figures.monotone); `falls` says whether it needed
    more than the noise for that.
    """
    session = TransformersTarget(target.model, hidden_states=False, forward=target.forward)
    session.prefill(prompt_ids)
    best = {k: math.inf for k in sizes}
    start = time.perf_counter()
    for r in range(most + 1):
        for k in sizes:
            tokens = [prompt_ids[i % len(prompt_ids)] for i in range(k - 1)]
            t = time.perf_counter()
            session.forward(prompt_ids[-1], tokens, list(range(-1, k - 2)))
            elapsed = time.perf_counter() - t
            session.commit([])  # keep only the root: the context grows by one token per pass
            if r:
                best[k] = min(best[k], elapsed)
        if r >= repeats and (figures.monotone([best[k] for k in sizes])[1] is None
                             or time.perf_counter() - start > budget_s):
            break
    ms = [round(1000 * best[k], 2) for k in sizes]
    return {"tokens": list(sizes), "ms": ms,
            "relative": [round(x, 2) for x in figures.monotone([best[k] / best[sizes[0]] for k in sizes])[0]],
            "context": len(prompt_ids)}
