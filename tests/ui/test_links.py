"""app.ui.links: a setup as a query string and back; what a link gets wrong is a note, never an error."""

from urllib.parse import parse_qsl

import pytest

from app.modes import MODES
from app.ui import links
from app.ui.settings import CONTROLS, DEFAULTS

EXAMPLES = {81: "Compose an engaging travel blog post.", 241: "Summarize this article."}
RECORDINGS = ("eagle-roleplay-bfloat16", "lookahead-math_reasoning-bfloat16")


def refuse_big_windows(mode, values):
    return "W is at most 8 here" if values["la_W"] > 8 else None


def parse(query: str, check=refuse_big_windows) -> links.Link:
    return links.parse(dict(parse_qsl(query, keep_blank_values=True)), DEFAULTS, MODES.names, EXAMPLES, RECORDINGS, check)


def build(mode, values, prompt, tab="run"):
    return links.build(tab, mode, {**DEFAULTS, **values}, prompt, DEFAULTS, EXAMPLES, "prompt_lookup", EXAMPLES[81])


def test_the_issue_example():
    link = parse("mode=lookahead&la=4,3,4&example=241&present=1&slides=1")
    assert link.mode == "lookahead" and link.prompt == EXAMPLES[241] and link.present is True
    assert link.values == {"la_W": 4, "la_N": 3, "la_G": 4, "la_w": 4, "la_n": 3, "la_g": 4}
    assert link.notes == ["slides=1 (unknown parameter)"]
    assert parse(links.build("run", "eagle", DEFAULTS, "z", DEFAULTS, EXAMPLES, "prompt_lookup", "", present=True)).present


@pytest.mark.parametrize("mode,values,prompt", [
    ("lookahead", {"la_W": 5, "la_N": 4, "la_G": 2, "la_w": 5, "la_n": 4, "la_g": 2}, EXAMPLES[241]),
    ("lookahead", {"la_W": 5, "la_w": 3}, "my own prompt, with & and = and ?"),
    ("prompt_lookup", {"pl_ngram": 3, "pl_oldest": False, "pl_candidates": 2, "pl_draft_lens": ""}, EXAMPLES[81]),
    ("suffix", {"sx_tree": True, "sx_factor": 2.5, "sx_len": 10}, "x"),
    ("eagle", {"eg_total": 24, "eg_depth": 5, "eg_pl": True, "dtype": "float32", "temperature": 0.7, "seed": 3}, "y"),
    ("prompt_lookup", {}, EXAMPLES[81]),
])
def test_round_trip(mode, values, prompt):
    query = build(mode, values, prompt)
    link = parse(query, check=lambda m, v: None)
    assert link.notes == []
    assert (link.mode or "prompt_lookup") == mode and (link.prompt or EXAMPLES[81]) == prompt
    assert {**DEFAULTS, **link.values} == {**DEFAULTS, **values}
    if not values and mode == "prompt_lookup":
        assert query == ""  # the page's own defaults need no parameters


def test_every_control_round_trips_alone():
    for key in CONTROLS:
        default = DEFAULTS[key]
        if default is None or key == "backend":
            continue
        other = (not default if isinstance(default, bool) else default + 1 if isinstance(default, (int, float))
                 else "3,7" if key == "pl_draft_lens" else default + "x")
        link = parse(build("prompt_lookup", {key: other}, EXAMPLES[81]), check=lambda m, v: None)
        assert link.values.get(key) == other and not link.notes, key


@pytest.mark.parametrize("query,note", [
    ("mode=fast", "mode=fast (modes:"),
    ("tab=nowhere", "tab=nowhere (tabs:"),
    ("example=7", "example=7 (not a Spec-Bench question id"),
    ("replay=../../etc/passwd", "replay=../../etc/passwd (recordings:"),
    ("la=4,3", "la=4,3 (3 comma-separated values"),
    ("pl_oldest=maybe", "pl_oldest=maybe (not true or false)"),
    ("la_W=four", "la_W=four (invalid literal"),
    ("temperature=nan", "temperature=nan (not a finite number)"),
    ("mode=lookahead&la=9,3,4", "(W is at most 8 here)"),
])
def test_bad_parameters_are_ignored_with_a_note(query, note):
    link = parse(query)
    assert note in link.note() and link.note().startswith("Link: ignored ")
    assert link.values == {} and link.replay is None


def test_good_parameters_survive_bad_ones_and_the_note_stays_short():
    link = parse("mode=eagle&" + "&".join(f"junk{i}=1" for i in range(20)) + "&tab=compare&replay=eagle-roleplay-bfloat16")
    assert link.mode == "eagle" and link.tab == "compare" and link.replay == "eagle-roleplay-bfloat16"
    assert link.note().endswith("and 14 more.") and len(link.note()) < 300


def test_a_link_of_a_replay_replays_it():
    query = links.build("run", "eagle", DEFAULTS, "z", DEFAULTS, EXAMPLES, "prompt_lookup", "", replay=RECORDINGS[0])
    assert query.startswith(f"replay={RECORDINGS[0]}&") and parse(query).replay == RECORDINGS[0]
    assert "replay" not in links.build("run", "eagle", DEFAULTS, "z", DEFAULTS, EXAMPLES, "prompt_lookup", "")


def test_a_run_of_a_recordings_setup_says_what_differs_when_tau_does():
    """The issue's `?replay=eagle-roleplay-bfloat16` then Run: τ 2.84 / 45 passes against the recording's 3.28 / 39
    with no word why. Run after a replay names what differs (dtype, pass), else the machine; nothing when they agree."""
    import copy

    from app import traces
    from app.ui.run_tab import against_recording, recording_path

    recorded = traces.read(recording_path("eagle-roleplay-bfloat16"))[0]
    same = traces.Recording.from_record(copy.deepcopy(recorded.record()))
    assert against_recording(same, recorded, "eagle-roleplay-bfloat16") == ""
    live = traces.Recording.from_record(copy.deepcopy(recorded.record()))
    live.events = live.events[:20] + [dict(e, tokens=e["tokens"][:1]) for e in live.events[20:]]
    live.events[-1]["totals"] = {**live.events[-1]["totals"], "new_tokens": 84, "target_steps": len(live.events) - 1}
    live.pass_note = "compiled pass, built in 240 s and loaded in 0.8 s"
    said = against_recording(live, recorded, "eagle-roleplay-bfloat16")
    assert said.startswith("This run of eagle-roleplay-bfloat16's setup: τ ") and "against the recording's" in said
    t = recorded.events[-1]["totals"]  # τ after the prefill, as the status beside it says τ (one τ on one status)
    assert f"τ {83 / (len(live.events) - 2):.2f} after the prefill against the recording's " \
           f"{(t['new_tokens'] - 1) / (t['target_steps'] - 1):.2f}" in said
    assert "pass: compiled here, eager in the recording" in said and "dtype" not in said
    live.pass_note = recorded.pass_note
    assert "the same dtype and pass, on another machine" in against_recording(live, recorded, "x")
    live.request = {**live.request, "max_new_tokens": 64}  # another setup: nothing to say about the recording
    assert against_recording(live, recorded, "x") == ""


def test_a_link_copied_after_a_run_runs_its_setup_on_open():
    query = links.build("run", "lookahead", DEFAULTS, "Summarize this article.", DEFAULTS, EXAMPLES, "prompt_lookup",
                        "Compose an engaging travel blog post.", run=True)
    assert "run=1" in query and parse(query).run is True
    assert parse("run=0").run is False and parse("run=maybe").notes == ["run=maybe (not true or false)"]
    replayed = links.build("run", "eagle", DEFAULTS, "x", DEFAULTS, EXAMPLES, "prompt_lookup", "y",
                           replay="eagle-roleplay-bfloat16", run=True)
    assert "run=" not in replayed, "a recording's link replays it; it does not run it as well"
