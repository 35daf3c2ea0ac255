"""Controls shared by the tabs. Numeric controls that say in words what an API client sent wrong.

Gradio's Slider and Number compare and round whatever a client posts; a string or a list there fails inside
Gradio, and the client reads a bare "Error". These check the type first and answer one sentence naming the
control. `is_template` keeps Gradio's own frontend component (the base class's name)."""

from __future__ import annotations

import math
from typing import Any

import gradio as gr

from app.modes import ConfigError
from app.modes.errors import one_line
from app.service.api import DTYPES

# The options of an event that only redraws part of the page: answered at once, no spinner, not in the API.
QUIET = dict(queue=False, show_progress="hidden", api_visibility="private")


def finite(value: Any, name: str) -> float:
    """A control's value as a finite number, or ConfigError naming the control (an API client may send anything)."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be a finite number, got '{one_line(value)}'")
    return x


def _check(payload: Any, label: str | None, empty_ok: bool) -> None:
    if payload is None and empty_ok:
        return
    if not isinstance(payload, (int, float)) or isinstance(payload, bool):  # NaN and inf go on: finite() words them
        raise gr.Error(f"{label or 'this control'} takes a number, got '{one_line(payload)}'")


class Slider(gr.Slider):
    is_template = True

    def preprocess(self, payload: Any) -> Any:
        _check(payload, self.label, empty_ok=False)
        return super().preprocess(payload)


class Number(gr.Number):
    is_template = True

    def preprocess(self, payload: Any) -> Any:
        _check(payload, self.label, empty_ok=True)
        return super().preprocess(payload)


def dtype_radio(service, elem_id: str) -> gr.Radio:
    """The dtype choice (Run and Compare tabs)."""
    return gr.Radio(["auto", *DTYPES], value="auto", label="dtype", elem_id=elem_id,
                    info=f"auto = the server's ({service.dtype}). float32: every mode's greedy output equals "
                         "autoregressive. bfloat16: half the bytes per pass; speculation pays most where the CPU has native bfloat16; "
                         "the first run in a dtype loads the model in it (transformers backend only).")


def examples(service) -> list[tuple[str, str]]:
    """One Spec-Bench prompt per category (first turns)."""
    return [(r["category"], r["text"]) for r in service.examples(1)]


def example_shown(prompt: Any, shown: list[tuple[str, str]]) -> str | None:
    """The examples menu's value for what the prompt box holds: that example, else none (the menu then names none)."""
    return prompt if isinstance(prompt, str) and any(prompt == text for _, text in shown) else None


def examples_dropdown(shown: list[tuple[str, str]], elem_id: str, prompt: gr.Textbox) -> gr.Dropdown:
    """The examples menu of `prompt`'s box. It names the example the box holds however it got there (the page's
    default, a link, the tour, a replay's settings, typing), and none otherwise."""
    menu = gr.Dropdown([(f"{c}: {t[:60]}…", t) for c, t in shown], label="Spec-Bench examples",
                       value=example_shown(prompt.value, shown), elem_id=elem_id)
    prompt.change(lambda text: example_shown(text, shown), prompt, menu, **QUIET)
    return menu
