"""Run one generation: a loaded model, a decoding config and a prompt in; trace events out.

Modes that draft from a trained artifact get it as a `companion`, loaded once and shared
read-only between generations: the draft model (draft_target), Medusa heads, or an EAGLE module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from app import models
from app.config import ConfigError
from app.modes import MODES, Modes
from app.service.configs import DecodingConfig
from app.decoding import linear
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.types import StepEvent
from app.models import LoadedModel, ModelError


def load_companion(cfg: DecodingConfig, target: LoadedModel, engines: Path = models.DEFAULT_ENGINES,
                   modes: Modes | None = None):
    """What cfg.mode drafts with (its entry's `artifact` in `modes`, default the app's registry), or None. Explicit
    paths/names win; otherwise the model's shipped default."""
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
    return _load_heads(kind, Path(path), target)


def default_draft(target_name: str) -> str:
    for alias, (base, layers) in models.DRAFT_ALIASES.items():
        if base == target_name and (layers / "config.json").exists():
            return alias
    raise ConfigError(
        f"draft_target needs a draft model for '{target_name}': pass --draft-model NAME, or train one "
        "(python -m app train --mode draft, then python -m app export DIR --output-dir MODEL_DIR)"
    )


def _load_heads(kind: str, path: Path, target: LoadedModel):
    if not (path / "config.json").exists():
        raise ModelError(f"--{kind}-model '{path}' is not a directory written by `python -m app train --mode {kind}`")
    if kind == "medusa":
        from app.heads import medusa as heads

        options = {}
    else:
        from app.decoding import attention
        from app.heads import eagle as heads

        options = {"attn_implementation": attention.register(), "target_lm_head": target.model.get_output_embeddings()}
    try:
        module = heads.load(path, **options)
        heads.check_compatible(module, target.model)
    except (ValueError, OSError) as err:
        raise ModelError(str(err)) from err
    module = module.to(target.model.dtype).eval().requires_grad_(False)
    linear.pack(module)
    return module


def run(
    target: LoadedModel,
    cfg: DecodingConfig,
    prompt_ids: list[int],
    companion=None,
    cancel: threading.Event | None = None,
) -> Iterator[StepEvent]:
    try:
        # What only the loaded artifact can tell, e.g. a Medusa tree deeper than the heads it has.
        drafter = cfg.drafter(target.model, companion)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return generate(
        TransformersTarget(target.model, hidden_states=drafter.needs_hidden, forward=target.forward),
        drafter,
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


def verify_cost(target: LoadedModel, prompt_ids: list[int], sizes=VERIFY_SIZES, repeats: int = 5) -> dict:
    """Milliseconds of one target pass over k new tokens after `prompt_ids` (a verify step of k - 1
    drafted tokens), the median of `repeats`, and each relative to k = 1.

    This curve decides what speculation can earn on a machine: a step that verifies k tokens pays
    only when it yields more than relative[k] tokens. It differs a lot between CPUs (bfloat16
    without native instructions grows about linearly in k), so the bench records it with its results.
    """
    session = TransformersTarget(target.model, hidden_states=False, forward=target.forward)
    session.prefill(prompt_ids)
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for r in range(repeats + 1):  # round-robin over sizes, so drift of the machine hits all alike; round 0 warms up
        for k in sizes:
            tokens = [prompt_ids[i % len(prompt_ids)] for i in range(k - 1)]
            t = time.perf_counter()
            session.forward(prompt_ids[-1], tokens, list(range(-1, k - 2)))
            elapsed = time.perf_counter() - t
            session.commit([])  # keep only the root: the context grows by one token per pass
            if r:
                times[k].append(elapsed)
    ms = {k: 1000 * sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"tokens": list(sizes), "ms": [round(ms[k], 2) for k in sizes],
            "relative": [round(ms[k] / ms[sizes[0]], 2) for k in sizes], "context": len(prompt_ids)}
