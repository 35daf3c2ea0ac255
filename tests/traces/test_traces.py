"""app.traces: a run recorded from service messages, written as a trace, read back for replay.

A trace to replay may come from anyone: every malformed one is refused with a sentence, and whatever
survives parsing draws without an error and without markup of its own."""

import copy
import json
import random

import pytest

from app import traces
from app.traces import Recording, TraceError
from app.ui import charts, render
from helpers import ROOT

FIXTURES = ROOT / "tests" / "data" / "traces"
MODES = ["autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix"]
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))


def messages(tokens_per_step=((5,), (6, 7)), finish="length"):
    ids = [t for step in tokens_per_step for t in step]
    yield {"type": "start", "model": "m", "mode": "prompt_lookup", "dtype": "float32", "prompt_ids": [1, 2],
           "texts": {1: "a", 2: "b"}}
    elapsed = 0.0
    for i, step in enumerate(tokens_per_step):
        elapsed += 0.05
        yield {"type": "step", "step": i, "kind": "decode" if i else "prefill", "tokens": list(step),
               "proposed": {"tokens": [], "parents": []}, "accepted": [], "rejected": [], "accepted_tokens": [],
               "added_token": step[-1], "added_kind": "next", "source": {}, "target": {}, "draft_time_s": 0.0,
               "verify_time_s": 0.05, "texts": {t: chr(ord("w") + t - 4) for t in step},
               "text": "".join(chr(ord("w") + t - 4) for t in step),
               "totals": {"new_tokens": len([t for s in tokens_per_step[: i + 1] for t in s]), "target_steps": i + 1,
                          "elapsed_s": elapsed}, "finish_reason": finish if i == len(tokens_per_step) - 1 else None}
    yield {"type": "end", "finish_reason": finish, "text": "xyz", "token_ids": ids,
           "totals": {"new_tokens": len(ids), "elapsed_s": elapsed}, "error": None}


def recorded(mode="prompt_lookup", request=None, prompt="say xyz", **kw):
    run = Recording(mode, request or {"speculative_config": {"decoding_type": "NGram"}}, prompt)
    for m in messages(**kw):
        run.add(m)
    return run


def test_a_recording_becomes_a_trace_with_the_cli_fields_and_reads_back_the_same(tmp_path):
    run, base = recorded(), recorded("autoregressive", {"speculative_config": {}}, tokens_per_step=((5,), (6,), (7,)))
    trace = run.trace(base)
    assert {"text", "token_ids", "prompt_ids", "steps"} <= set(trace)  # what `generate --json` always printed
    assert trace["token_ids"] == [t for s in trace["steps"] for t in s["tokens"]] == [5, 6, 7]
    assert trace["text"] == "xyz" and trace["finish_reason"] == "length" and trace["dtype"] == "float32"
    assert trace["texts"] == {1: "a", 2: "b", 5: "x", 6: "y", 7: "z"} and trace["model"] == "m"
    assert trace["prompt"] == "say xyz" and trace["request"] == {"speculative_config": {"decoding_type": "NGram"}}
    assert all("type" not in s and "texts" not in s for s in trace["steps"])
    assert trace["baseline"]["mode"] == "autoregressive" and "baseline" not in trace["baseline"]

    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))  # JSON turns the texts' int keys into strings
    back, back_base = traces.read(path)
    assert back.record() == {**run.record(), "end": back.end} and back.texts[5] == "x"
    assert back.end["finish_reason"] == "length" and back.end["token_ids"] == [5, 6, 7]
    assert back_base.events == base.events and back_base.mode == "autoregressive"


def test_prefix_is_the_run_as_it_stood_after_some_steps():
    run = recorded()
    part = run.prefix(1)
    assert part.events == run.events[:1] and part.end is None and part.token_ids == [5]
    assert (part.mode, part.prompt, part.request, part.texts) == (run.mode, run.prompt, run.request, run.texts)
    assert run.prefix(0).events == [] and len(run.events) == 2  # the run itself is untouched


@pytest.mark.parametrize("mode", MODES)
def test_the_generate_json_fixtures_of_every_mode_read_back(mode):
    data = json.loads((FIXTURES / f"{mode}.json").read_text())
    run, base = traces.parse(data)
    assert run.mode == mode and base is None and run.request is None
    assert run.token_ids == data["token_ids"] and len(run.events) == len(data["steps"])
    assert run.texts and all(isinstance(k, int) for k in run.texts)
    html = render.step_view(run.events, run.texts)
    assert html.count('data-step="') == len(run.events)


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_the_shipped_recordings_read_back_with_their_baseline_and_settings(path):
    from app.ui.settings import from_request

    from app.modes import MODES as registry

    mode, category, dtype = path.stem.split("-")
    run, base = traces.read(path)
    assert (run.mode, run.dtype) == (mode, dtype)
    assert run.prompt and len(run.token_ids) == run.request["max_new_tokens"] == 128
    assert from_request(run.request)[0] == registry.split(mode)[0]
    assert run.events[-1]["totals"]["elapsed_s"] > 0
    if mode == "autoregressive":  # the baseline itself races nothing
        assert base is None
    else:
        assert base.mode == "autoregressive" and base.events[-1]["totals"]["elapsed_s"] > 0 and base.prompt == run.prompt


@pytest.mark.parametrize("data,words", [
    ([], "not a SpecDec trace"),
    ({"steps": []}, "no list of steps"),
    ({"text": "hi", "token_ids": [1]}, "no list of steps"),
    ({"steps": ["x"]}, "step 0 of the trace is malformed"),
    ({"steps": [{"kind": "decode", "tokens": [1], "totals": {}}] * (traces.MAX_STEPS + 1)}, "a replay shows at most"),
    ({"steps": [{"kind": "prefill", "tokens": [1], "totals": {}}, {"kind": "decode", "tokens": [-1], "totals": {}}]},
     "step 1 of the trace is malformed"),
    ({"steps": [{"kind": "prefill", "tokens": [True], "totals": {}}]}, "step 0"),
    ({"steps": [{"kind": "prefill", "tokens": ["1"], "totals": {}}]}, "step 0"),
    ({"steps": [{"kind": "prefill", "tokens": [1], "totals": []}]}, "step 0"),
    ({"steps": [{"kind": "verify", "tokens": [1], "totals": {}}]}, "prefill or decode"),
    ({"steps": [{"kind": "decode", "tokens": [1], "totals": {}}]}, "does not start with its prefill"),
    ({"steps": [{"kind": "prefill", "tokens": [1], "totals": {}}], "baseline": {"steps": 3}}, "its baseline"),
    ({"steps": [{"kind": "prefill", "tokens": [1], "totals": {}}],
      "baseline": {"mode": "eagle", "steps": [{"kind": "prefill", "tokens": [1], "totals": {}}]}}, "must be an autoregressive run"),
])
def test_malformed_traces_are_refused_with_a_sentence(data, words):
    if isinstance(data, dict) and isinstance(data.get("steps"), list) and data["steps"]:
        data = {"mode": "prompt_lookup", **data}  # a trace always names its mode (the next test)
    with pytest.raises(TraceError, match=words):
        traces.parse(data)


@pytest.mark.parametrize("mode", [None, "<script>alert(1)</script>", "repeat"])
def test_a_trace_names_a_mode_of_this_app(mode):
    """The display draws a step with its mode's explainer: a trace without a known mode is refused in words, not
    guessed from its steps."""
    trace = recorded().trace()
    trace["mode"] = mode
    with pytest.raises(TraceError, match="names no mode of this app"):
        traces.parse(json.loads(json.dumps(trace)))


def test_files_that_are_not_traces_are_refused(tmp_path):
    for name, content in {"a.json": b"{not json", "b.json": b"\xff\xfe\x00", "c.json": b"[1, 2]"}.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(TraceError, match="not a SpecDec trace"):
            traces.read(tmp_path / name)
    (tmp_path / "big.json").write_text(json.dumps(recorded().trace()))
    with pytest.raises(TraceError, match="at most"):
        traces.read(tmp_path / "big.json", max_bytes=100)


def test_what_the_display_prints_as_markup_is_reduced_to_known_names_and_numbers():
    trace = recorded().trace()
    trace.update(dtype="<b>x</b>", finish_reason="<i>", model=["x"], prompt=3,
                 texts={"5": "<img src=x onerror=alert(1)>", "nope": "y", "-3": "z"}, request="<req>")
    trace["steps"][1]["totals"] = {"new_tokens": "<b>3</b>", "elapsed_s": float("nan"), "target_steps": 2, "accepted": True}
    trace["steps"][1]["finish_reason"] = "<u>"
    run, _ = traces.parse(json.loads(json.dumps(trace)))
    assert run.dtype is None and run.model is None and run.prompt is None and run.request is None
    assert run.end["finish_reason"] is None and run.events[1]["finish_reason"] is None
    assert run.events[1]["totals"] == {"target_steps": 2}
    assert run.texts == {5: "<img src=x onerror=alert(1)>"}
    html = render.step_view(run.events, run.texts) + "".join(
        render.step_detail(e, run.texts, run.prompt_ids, run.token_ids[:i], run.mode) for i, e in enumerate(run.events))
    assert "<img" not in html and "&lt;img src=x" in html


def _mutations(value, rng, depth=0):
    """Random damage: a value replaced by another type, a key dropped, a list cut or an int made huge."""
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        roll = rng.random()
        if roll < 0.2:
            value.pop(key)
        elif roll < 0.5 or depth > 6:
            value[key] = rng.choice([None, -1, 10**12, 1.5, "<b>", [], {}, [1, "x"], True])
        else:
            _mutations(value[key], rng, depth + 1)
    elif isinstance(value, list) and value:
        roll = rng.random()
        if roll < 0.2:
            del value[rng.randrange(len(value)):]
        else:
            i = rng.randrange(len(value))
            if isinstance(value[i], (dict, list)) and roll < 0.7:
                _mutations(value[i], rng, depth + 1)
            else:
                value[i] = rng.choice([None, -5, 10**9, "x", {}, [3], 2.5])


@pytest.mark.parametrize("mode", MODES)
def test_damaged_traces_are_refused_or_drawn_never_crash(mode):
    """What parse lets through, the step view, every step's detail and every chart draw without an error."""
    original = json.loads((FIXTURES / f"{mode}.json").read_text())
    sound, _ = traces.parse(json.loads((FIXTURES / "autoregressive.json").read_text()))
    rng = random.Random(mode)
    drawn = refused = 0
    for _ in range(60):
        data = copy.deepcopy(original)
        for _ in range(rng.randint(1, 4)):
            _mutations(data, rng)
        try:
            run, _ = traces.parse(data)
        except TraceError:
            refused += 1
            continue
        render.step_view(run.events, run.texts)
        for i, event in enumerate(run.events):
            render.step_detail(event, run.texts, run.prompt_ids, run.token_ids[: sum(len(e["tokens"]) for e in run.events[:i])])
        for figure in (charts.race(run.events, None, label="x"), charts.tokens_per_step(run.events),
                       charts.tokens_per_step_hist(run.events), charts.acceptance_by_depth(run.events),
                       charts.throughput(run.events), charts.timing(run.events)):
            assert figure is not None
        # The replay's status line: the damaged run against a sound baseline, and as the baseline of a sound run.
        assert isinstance(render.speedup_line(run.events, sound.events), str)
        assert isinstance(render.speedup_line(sound.events, run.events), str)
        drawn += 1
    assert drawn >= 10 and refused >= 5  # the damage exercised both paths
