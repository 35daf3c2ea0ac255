"""Shareable links: the Run tab's setup as a URL query string, and back. Pure functions, no Gradio.

A link names what differs from the page's defaults: `?mode=lookahead&la=4,3,4&example=81&dtype=float32`,
`?replay=eagle-roleplay-bfloat16`, `?tab=compare`, `?present=1` (presenter mode), `?run=1` (run it on open). Every control of the Run tab is a parameter under its
own name (`pl_ngram=3`, `sx_tree=1`); a mode's entry may name short forms for groups of them (`la`, `la_req`, `pl`:
`Mode.shorts`). What a link gets wrong is dropped with a one-line note, never an error page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from app.modes import MODES
from app.modes.errors import one_line
from app.modes.registry import Short

TABS = ("run", "compare", "train", "learn", "engines")
SHORT = MODES.shorts()  # the shipped modes' short forms, by name
CHOICE_NAMES = {"tab": "tabs", "mode": "modes", "replay": "recordings"}
MAX_PROMPT = 2000  # characters a link carries; longer prompts are left out of it (a note says so)
MAX_NOTE_ITEMS = 6
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass
class Link:
    """What a query string sets: each field None (or empty) where it sets nothing."""

    tab: str | None = None
    mode: str | None = None
    prompt: str | None = None
    replay: str | None = None
    present: bool | None = None
    run: bool | None = None  # run the setup on open (a link copied after a live run: it carries settings, not the run)
    values: dict[str, Any] = field(default_factory=dict)  # control name -> value
    notes: list[str] = field(default_factory=list)  # what was ignored, and why

    def note(self) -> str:
        if not self.notes:
            return ""
        more = len(self.notes) - MAX_NOTE_ITEMS
        return "Link: ignored " + "; ".join(self.notes[:MAX_NOTE_ITEMS]) + (f"; and {more} more" if more > 0 else "") + "."


def _value(text: str, default: Any) -> Any:
    """`text` as the type of the control's default; ValueError when it is not one."""
    if isinstance(default, bool):
        low = text.strip().lower()
        if low in TRUE or low in FALSE:
            return low in TRUE
        raise ValueError("not true or false")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        x = float(text)
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError("not a finite number")
        return x
    return text


def parse(query: Mapping[str, str], defaults: Mapping[str, Any], modes: tuple[str, ...], examples: Mapping[int, str],
          recordings: tuple[str, ...], check: Callable[[str, dict[str, Any]], str | None],
          shorts: Mapping[str, Short] = SHORT) -> Link:
    """The setup a query string asks for. `defaults`: the controls and their default values (their types);
    `examples`: Spec-Bench prompts by id; `check(mode, values)`: None when the settings run, else why not; `shorts`:
    the modes' short forms (Modes.shorts)."""
    link = Link()
    choices = {"tab": TABS, "mode": modes, "replay": recordings}
    for key, raw in query.items():
        text = str(raw)
        said = f"{one_line(key)}={one_line(text)}"
        if key in choices:
            value = text.lower() if key == "tab" else text
            if value in choices[key]:
                setattr(link, key, value)
            else:
                link.notes.append(f"{said} ({CHOICE_NAMES[key]}: {', '.join(choices[key])})")
        elif key == "prompt":
            link.prompt = text[:MAX_PROMPT]
        elif key == "example":
            try:
                link.prompt = examples[int(text)]
            except (ValueError, KeyError):
                link.notes.append(f"{said} (not a Spec-Bench question id, e.g. {min(examples) if examples else 81})")
        elif key in ("present", "run"):
            try:
                setattr(link, key, _value(text, False))
            except ValueError as err:
                link.notes.append(f"{said} ({err})")
        elif key in shorts or key in defaults:
            names = shorts[key].keys if key in shorts else (key,)
            parts = text.split(",") if key in shorts else [text]
            if len(parts) != len(names):
                link.notes.append(f"{said} ({len(names)} comma-separated values: {', '.join(names)})")
                continue
            try:
                link.values.update({n: _value(p, defaults[n]) for n, p in zip(names, parts)})
            except ValueError as err:
                link.notes.append(f"{said} ({err})")
                continue
            for follower in (s for s in shorts.values() if s.follows == key and s.name not in query):
                link.values.update(zip(follower.keys, (link.values[n] for n in names)))
        else:
            link.notes.append(f"{said} (unknown parameter)")
    if link.values:
        reason = check(link.mode or "autoregressive", {**defaults, **link.values})
        if reason:
            link.notes.append(f"the settings {', '.join(f'{k}={v}' for k, v in link.values.items())} ({reason})")
            link.values = {}
    return link


def build(tab: str | None, mode: str, values: Mapping[str, Any], prompt: str, defaults: Mapping[str, Any],
          examples: Mapping[int, str], default_mode: str, default_prompt: str, present: bool = False,
          replay: str | None = None, run: bool = False, shorts: Mapping[str, Short] = SHORT) -> str:
    """The query string (without '?') that `parse` reads back as this setup: only what differs from the defaults;
    `replay`, a shipped recording the page shows, replayed when the link opens; `run`, the setup run when it opens
    (after a live run: the page then shows a run of it, not an empty screen)."""
    query: dict[str, str] = {}
    if tab and tab != TABS[0]:
        query["tab"] = tab
    if replay:
        query["replay"] = replay
    if mode != default_mode:
        query["mode"] = mode
    ids = {text: i for i, text in examples.items()}
    if prompt != default_prompt:
        if prompt in ids:
            query["example"] = str(ids[prompt])
        elif len(prompt) <= MAX_PROMPT:
            query["prompt"] = prompt
    changed = {k: v for k, v in values.items() if k in defaults and v != defaults[k] and v is not None}

    def as_followed(short: Short) -> bool:  # a follower at the values it follows is left out (parse gives it them)
        return bool(short.follows) and tuple(values.get(n) for n in short.keys) == \
            tuple(values.get(n) for n in shorts[short.follows].keys)

    for short in shorts.values():
        if not any(n in changed for n in short.keys):
            continue
        if not as_followed(short):
            query[short.name] = ",".join(_text(values[n]) for n in short.keys)
        for n in short.keys:
            changed.pop(n, None)
    # parse gives a follower the values it follows unless the link says otherwise: one that differs is said whenever it
    # does, even at its defaults (N raised to 4, n left at 3: `la=4,4,4&la_req=4,3,4`).
    for short in shorts.values():
        if short.follows and short.name not in query and not as_followed(short):
            query[short.name] = ",".join(_text(values[n]) for n in short.keys)
    for k, v in changed.items():
        query[k] = _text(v)
    if present:
        query["present"] = "1"
    if run and not replay:
        query["run"] = "1"
    return urlencode(query)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
