"""Every Run-tab control changes what runs (issue 59, item 5): the page's own wiring (the Studio's Gradio events, called
as the page calls them) from a user's move of one control to the DecodeRequest the Service receives when Run is
pressed, and for a mode whose drafter needs no model, to the drafter that request builds. Generic over the registry's
controls: a control the Run event drops, or one whose value never reaches the request, fails it."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

import gradio as gr
import pytest

from app import runner
from app.modes import MODES, ConfigError, Modes
from app.service.api import Service
from app.ui import links, settings
from app.ui.web import Studio

TRAINED = "trained:" + "0" * 16  # a training run's name, as the Train tab adds it to an artifact picker


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    service = Service(engines=tmp_path_factory.mktemp("engines"))
    studio = Studio(service)
    studio.demo = studio.blocks()
    yield studio
    service.close()


def _value(update: Any) -> tuple[bool, Any]:
    if isinstance(update, dict) and update.get("__type__") == "update":
        return "value" in update, update.get("value")
    return True, update


def fire(studio, component, values: dict, event: str = "input") -> None:
    """What the page does on `event` of `component`: each handler the event triggers, called with its inputs as Gradio
    passes them ({component: value} for a set of inputs, else in order), its outputs written back into `values`."""
    for fn in studio.demo.fns.values():
        if fn.fn is None or not any(t[0] == component._id and t[1] == event for t in fn.targets):
            continue
        if fn.inputs_as_dict:
            out = fn.fn({c: values.get(c) for c in fn.inputs})
        else:
            out = fn.fn(*(values.get(c) for c in fn.inputs))
        if not isinstance(out, dict):
            out = dict(zip(fn.outputs, out if isinstance(out, (list, tuple)) and len(fn.outputs) > 1 else [out]))
        for c, update in out.items():
            has, value = _value(update)
            if has:
                values[c] = value


def page(studio) -> dict:
    """A fresh page's values: every component of the Run tab at its start value."""
    run = studio.run
    return {c: c.value for c in (run.prompt, run.mode, run.race, run.baselines, *run.controls.values())}


def received(studio, values: dict, monkeypatch) -> dict:
    """The DecodeRequest data the Service receives when Run is pressed (the run_controls event), without running it."""
    run_fn = next(fn for fn in studio.demo.fns.values() if fn.api_name == "run_controls")
    got = []

    def check(data, visitor=None):
        got.append(data)
        raise ConfigError("received")

    monkeypatch.setattr(studio.service, "check", check)
    with pytest.raises(gr.Error):
        for _ in run_fn.fn({c: values.get(c) for c in run_fn.inputs}, None):
            pass
    monkeypatch.undo()
    assert got, "Run never asked the service"
    return got[0]


def others(component, value: Any) -> list[Any]:
    """Non-default values of a control, by its kind, nearest first."""
    if isinstance(component, gr.Checkbox):
        return [not value]
    if isinstance(component, gr.Slider):
        step = component.step or 1
        return [x for k in (1, 2) for x in (value + k * step, value - k * step)
                if component.minimum <= x <= component.maximum]
    if isinstance(component, gr.Number):
        return [value + 1]
    if isinstance(component, (gr.Dropdown, gr.Radio)):
        # A picker with one entry (a fresh store has no training run) takes what the Train tab would add to it.
        return [v for _, v in component.choices if v != value] or [TRAINED]
    if isinstance(component, gr.Textbox):
        return [f"{value},7" if value else "3"]
    raise AssertionError(f"a control of a kind this test does not know: {type(component).__name__}")


def runs(service, mode: str, data: dict):
    """What a mode whose drafter needs no model runs: the drafter its request builds (None when the request is refused)."""
    if not service.registry[mode].drafts_free:
        return None
    try:
        request = service.request(data)
    except ConfigError:
        return None
    return vars(runner.drafter(runner.to_runtime(request), modes=service.registry))


def moved(studio, mode: str, key: str, start: dict) -> tuple[dict, Any]:
    """`start` with control `key` moved as a user moves it (its events fired), to the first non-default value whose
    request the service accepts (else the first one)."""
    service, component = studio.service, studio.run.controls[key]
    tried = []
    for value in others(component, start[component]):
        values = {**start, component: value}
        fire(studio, component, values)
        tried.append((values, value))
        try:
            service.request(settings.to_request(mode, studio.run.values(values), service.registry))
            return values, value
        except ConfigError:
            continue
    return tried[0]


CASES = [(mode, None, key) for mode, controls in settings.groups().items() for key in (c.key for c in controls)] + [
    (mode, None, key) for mode in MODES.names for key in (*settings.SAMPLING, *settings.ENGINE)] + [
    (mode, box, c.key) for mode, box in settings.merge_boxes().items() for c in settings.controls(MODES["prompt_lookup"])]


def test_the_cases_cover_every_control_of_the_run_tab():
    assert {key for _, _, key in CASES} == set(settings.CONTROLS)


@pytest.mark.parametrize("mode, box, key", CASES, ids=[f"{m}{'+pl' if b else ''}-{k}" for m, b, k in CASES])
def test_every_run_tab_control_changes_what_runs(studio, monkeypatch, mode, box, key):
    run, service = studio.run, studio.service
    start = page(studio)
    start[run.mode] = mode
    fire(studio, run.mode, start)
    if box:  # the merged tree: prompt lookup's controls set the branch merged into the mode's tree
        start[run.controls[box]] = True
        fire(studio, run.controls[box], start)
    before = received(studio, start, monkeypatch)
    values, value = moved(studio, mode, key, start)
    after = received(studio, values, monkeypatch)
    assert json.dumps(after, sort_keys=True) != json.dumps(before, sort_keys=True), \
        f"{key} = {value!r} on {mode}: the request is the same as at {start[run.controls[key]]!r}"
    own = key in {c.key for c in settings.groups().get(mode, ())}
    if own and not box and (drafter := runs(service, mode, after)) is not None:
        assert drafter != runs(service, mode, before), f"{key} = {value!r} on {mode}: the drafter runs as before"


def test_lookaheads_n_reaches_the_request(studio, monkeypatch):
    """The issue's case: N from 3 to 4 moves the request's n with it, so the run is wider, as the check line says."""
    run, service = studio.run, studio.service
    values = page(studio)
    values[run.mode] = "lookahead"
    fire(studio, run.mode, values)
    values[run.controls["la_N"]] = 4
    fire(studio, run.controls["la_N"], values)
    assert values[run.controls["la_n"]] == 4
    assert "= **23**" in values[run.check]  # the verdict on the moved pair: (4, 4, 4)'s max_draft_len
    config = received(studio, values, monkeypatch)["speculative_config"]
    assert (config["max_ngram_size"], config["request"]) == (4, [4, 4, 4])
    assert runs(service, "lookahead", received(studio, values, monkeypatch))["n"] == 4
    # The request stays lowerable, and lowering it moves no maximum.
    values[run.controls["la_n"]] = 2
    fire(studio, run.controls["la_n"], values)
    assert values[run.controls["la_N"]] == 4
    assert received(studio, values, monkeypatch)["speculative_config"]["request"] == [4, 2, 4]


def test_only_the_maxima_carry_a_value_along():
    assert settings.follow("la_N", {"la_N": 5, "la_n": 2}) == {"la_n": 5}
    assert settings.follow("la_n", {"la_N": 5, "la_n": 2}) == {}
    without = Modes(*(m for m in MODES if m.name != "lookahead"))
    assert settings.follows(without) == {} and settings.follow("la_N", {"la_N": 5}, without) == {}


def test_every_control_alone_comes_back_from_its_link_with_the_whole_setup():
    """A link opens the setup it was copied from: la_N alone (n left at 3) is `la=4,4,4&la_req=4,3,4`, not `la=4,4,4`,
    which parse reads as n = 4."""
    defaults = settings.DEFAULTS
    for key in settings.CONTROLS:
        default = defaults[key]
        if default is None or key == "backend":
            continue
        other = (not default if isinstance(default, bool) else default + 1 if isinstance(default, (int, float))
                 else "3,7" if key == "pl_draft_lens" else default + "x")
        values = {**defaults, key: other}
        for mode in ("prompt_lookup", "lookahead"):
            query = links.build("run", mode, values, "p", defaults, {}, "prompt_lookup", "p")
            link = links.parse(dict(parse_qsl(query)), defaults, MODES.names, {}, (), lambda m, v: None)
            assert {**defaults, **link.values} == values and not link.notes, (key, query)


def test_the_examples_menu_names_the_example_the_prompt_holds(studio):
    """Issue 59.7: the menu stayed blank while its prompt box held one of its examples (Compare's on a fresh page; a
    link's, a tour stop's or a replay's prompt): whatever sets the box, the menu follows (its prompt's change event)."""
    from app.ui.controls import example_shown

    shown = [("writing", "Write a poem."), ("math", "What is 2 + 2?")]
    assert example_shown("What is 2 + 2?", shown) == "What is 2 + 2?"
    assert example_shown("What is 2 + 2", shown) is None and example_shown(None, shown) is None
    blocks = {b.elem_id: b for b in studio.demo.blocks.values() if getattr(b, "elem_id", None)}
    for box, menu in (("prompt", "examples"), ("cmp-prompt", "cmp-examples")):
        prompt, examples = blocks[box], blocks[menu]
        texts = [text for _, text in examples.choices]
        assert examples.value == example_shown(prompt.value, [("", t) for t in texts])  # a fresh page
        values = {prompt: texts[2], examples: None}
        fire(studio, prompt, values, "change")  # as a tour stop, a link or a replay's settings set it
        assert values[examples] == texts[2]
        values[prompt] = texts[2] + " And in French."  # typed on: no longer the example
        fire(studio, prompt, values, "change")
        assert values[examples] is None
    assert blocks["cmp-examples"].value == blocks["cmp-prompt"].value  # Compare opens on its first example
