"""Run one generation: a loaded model, a decoding config and a prompt in; trace events out."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from app.config import DecodingConfig
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.types import StepEvent
from app.models import LoadedModel


def run(
    target: LoadedModel,
    cfg: DecodingConfig,
    prompt_ids: list[int],
    draft: LoadedModel | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[StepEvent]:
    cfg.validate()
    return generate(
        TransformersTarget(target.model),
        cfg.drafter(draft),
        prompt_ids,
        sampling=cfg.sampling,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_ids=target.eos_token_ids,
        cancel=cancel,
    )


def output_ids(events: list[StepEvent]) -> list[int]:
    return [t for e in events for t in e.tokens]
