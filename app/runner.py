"""Run one generation: a loaded model, a decoding config and a prompt in; trace events out.

Modes that draft from a trained artifact get it as a `companion`, loaded once and shared
read-only between generations: the draft model (draft_target), Medusa heads, or an EAGLE module.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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
from app.decoding.drafters.merged import Merged


@dataclass
class LoopConfig:
    """A checked request as the transformers backend's loop runs it."""

    speculative_config: Any = field(default_factory=AutoregressiveConfig)  # one mode's checked config
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()

    @property
    def mode(self) -> str:
        return self.speculative_config.mode


def to_runtime(request: DecodeRequest) -> LoopConfig:
    """The transformers backend's runtime config for a checked request."""
    s = request.sampling
    return LoopConfig(request.speculative_config, request.max_new_tokens,
                          SamplingParams(s.temperature, s.top_p, s.top_k, s.seed))


def load_companion(cfg: LoopConfig, target: LoadedModel, engines: Path = models.DEFAULT_ENGINES,
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


def drafter(cfg: LoopConfig, target=None, companion=None, modes: Modes | None = None):
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

    return Merged(built, drafter(LoopConfig(extra), target, companion, modes))


def run(
    target: LoadedModel,
    cfg: LoopConfig,
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
    readings still have a wider pass cheaper than a narrower one beyond the noise, or one that got another share of
    the CPU than the one-token pass's: other load only ever adds time, so a burst that hit one size's readings is
    outlasted by the next quiet one. `relative` is the curve as it may be printed (figures.monotone); `falls` says
    whether it needed more than the noise for that.

    Each pass samples the share of the CPU it got (CpuShare over its stretch); `cpu_share` is that of each size's
    fastest reading. A size whose fastest reading still got a share other than the one-token pass's (what it is
    divided by) beyond SAME_LOAD at the end was timed under other load throughout: it is left out of the curve, into
    `withheld` with the rule's reason (figures).
    """
    # The process clock reads in nanoseconds (os.times in 10 ms ticks, as long as a pass of the bundled model).

    session = TransformersTarget(target.model, hidden_states=False, forward=target.forward)
    session.prefill(prompt_ids)
    best = {k: (math.inf, None) for k in sizes}  # (seconds, CPU share) of each size's fastest reading
    start = time.perf_counter()
    for r in range(most + 1):
        for k in sizes:
            tokens = [prompt_ids[i % len(prompt_ids)] for i in range(k - 1)]
            share = CpuShare(read=lambda: (time.perf_counter(), time.process_time()))
            t = time.perf_counter()
            session.forward(prompt_ids[-1], tokens, list(range(-1, k - 2)))
            elapsed = time.perf_counter() - t
            if r and elapsed < best[k][0]:  # round 0 warms up
                best[k] = elapsed, share.share()
            session.commit([])  # keep only the root: the context grows by one token per pass
        why = {k: load_changed(k, best[k][1], best[sizes[0]][1]) for k in sizes[1:]}
        if r >= repeats and ((figures.monotone([best[k][0] for k in sizes])[1] is None and not any(why.values()))
                             or time.perf_counter() - start > budget_s):
            break
    withheld = [{"tokens": k, "ms": round(1000 * best[k][0], 2), "cpu_share": best[k][1], "reason": why[k]}
                for k in why if why[k]]
    kept = [k for k in sizes if not why.get(k)]
    return {"tokens": kept, "ms": [round(1000 * best[k][0], 2) for k in kept],
            "relative": [round(x, 2) for x in figures.monotone([best[k][0] / best[sizes[0]][0] for k in kept])[0]],
            "cpu_share": [best[k][1] for k in kept], "withheld": withheld, "context": len(prompt_ids)}


# How far apart the CPU shares of two passes' fastest readings may be for their times to be divided. Tighter than the
# Run and Compare tabs' traces.LOAD_CHANGED (said there beside a ratio whose race evened the load out step by step):
# a pass's time grows as its share falls, or faster (caches shared with the other load), and nothing evens out two
# fastest readings. Measured here under other load: a 16-token pass at a share 1.26× below the one-token pass's read
# 1.39× its repeat, an 8-token one at 1.36× below read 1.26×.
SAME_LOAD = 1.15
# Below this share a pass spends most of its time switched out, and its own CPU time grows with the switching: under
# the suite's other work, at 15 % of the CPU an 8-token pass read 1.76× the one-token pass at the same share, 1.28×
# at 70 %.
LEAST_SHARE = 1 / 3


def load_changed(tokens: int, share: float | None, one: float | None) -> str | None:
    """Why a pass over `tokens` that got `share` of the CPU it asked for is not measured against the one-token pass
    that got `one`: either got less than LEAST_SHARE, or their shares are more than SAME_LOAD apart; None when neither,
    or a share is missing."""
    if not share or not one:
        return None
    got = (f"a pass over {tokens} tokens got {share:.0%} of the CPU it asked for while timed, the one-token pass it is "
           f"divided by {one:.0%}")
    if min(share, one) < LEAST_SHARE:
        return f"{got}: other work had most of the machine; measure again when it is quieter"
    if max(share, one) / min(share, one) > SAME_LOAD:
        return f"{got}: the machine's load changed between them; measure again"
    return None


class CpuShare:
    """The share of the CPU a run asked for that it got while it computed: this process's CPU seconds over wall seconds
    times torch's threads (at most 1), summed over the run's own stretches, from a resume (`resume`, or the start) to
    the next reading (`share`, at each step). Other processes competing for the same cores lower it. The stretches
    leave out the time the run waits at its yield: in a race that steps a run and its baseline in turn in this one
    process, each side reads the load of its own steps (read since the start, both sides read the same)."""

    def __init__(self, read=None) -> None:
        self._read = read or self._clock
        self._cpu = self._wall = 0.0
        self._mark: tuple[float, float] | None = self._read()

    @staticmethod
    def _clock() -> tuple[float, float]:
        own = os.times()
        return time.perf_counter(), own.user + own.system

    def resume(self) -> None:
        self._mark = self._read()

    def share(self) -> float | None:
        if self._mark is not None:
            wall, cpu = (a - b for a, b in zip(self._read(), self._mark))
            self._wall, self._cpu, self._mark = self._wall + wall, self._cpu + cpu, None
        if self._wall <= 0:
            return None
        return round(min(1.0, self._cpu / (self._wall * torch.get_num_threads())), 3)
