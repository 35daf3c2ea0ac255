"""app.ui.charts: Plotly figures from real traces (tests/data/traces), empty and one-step input."""

import json

import plotly.graph_objects as go
import pytest

from app import figures
from app.ui import charts
from app.modes import MODES as REGISTRY
from app.ui.lessons import label
from helpers import ROOT

TRACES = ROOT / "tests" / "data" / "traces"
MODES = ["autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix"]
STEP_CHARTS = [charts.race, charts.tokens_per_step, charts.tokens_per_step_hist, charts.throughput, charts.timing]


def load(mode):
    return json.loads((TRACES / f"{mode}.json").read_text())


def _common(fig):
    assert isinstance(fig, go.Figure)
    assert fig.layout.height == charts.HEIGHT
    text = fig.to_json()
    assert "bdata" not in text, "plain lists, not base64 typed arrays"
    for trace in fig.data:
        color = (trace.line.color if hasattr(trace, "line") and trace.line and trace.line.color else None) or (
            trace.marker.color if hasattr(trace, "marker") and trace.marker else None)
        colors = color if isinstance(color, (list, tuple)) else [color]
        assert all(c is None or (isinstance(c, str) and c.startswith("#")) for c in colors), colors


@pytest.mark.parametrize("mode", MODES)
def test_race_points_and_last_value(mode):
    steps = load(mode)["steps"]
    fig = charts.race(steps, mode=mode)
    _common(fig)
    assert len(fig.data) == 1
    run = fig.data[0]
    assert run.name == label(mode)
    assert len(run.x) == len(run.y) == len(steps)
    assert run.y[-1] == steps[-1]["totals"]["new_tokens"]
    assert run.x[-1] == pytest.approx(steps[-1]["totals"]["elapsed_s"])
    assert list(run.y) == sorted(run.y)
    assert not fig.layout.annotations


@pytest.mark.parametrize("mode", ["eagle", "prompt_lookup"])
def test_race_with_baseline(mode):
    steps, base = load(mode)["steps"], load("autoregressive")["steps"]
    for baseline in (base, [(s["totals"]["elapsed_s"], s["totals"]["new_tokens"]) for s in base]):
        fig = charts.race(steps, baseline, mode=mode)
        _common(fig)
        names = [t.name for t in fig.data]
        assert names == ["Autoregressive", label(mode)]
        assert len(fig.data[0].x) == len(base)
        assert fig.data[0].y[-1] == base[-1]["totals"]["new_tokens"]
        assert len(fig.data[1].x) == len(steps)
    only_baseline = charts.race([], base)
    assert len(only_baseline.data) == 1 and only_baseline.data[0].name == "Autoregressive"


@pytest.mark.parametrize("mode", MODES)
def test_tokens_per_step(mode):
    steps = load(mode)["steps"]
    fig = charts.tokens_per_step(steps)
    _common(fig)
    bars = [t for t in fig.data if t.type == "bar"]
    line = [t for t in fig.data if t.type == "scatter"][0]
    assert len(bars) == 2 and all(len(b.y) == len(steps) for b in bars)
    accepted, added = bars
    assert list(accepted.y) == [len(s["accepted_tokens"]) for s in steps]
    assert [a + b for a, b in zip(accepted.y, added.y)] == [len(s["tokens"]) for s in steps]
    assert sum(accepted.y) + sum(added.y) == steps[-1]["totals"]["new_tokens"]
    assert len(line.y) == len(steps) - 1 and list(line.x) == [s["step"] for s in steps[1:]]  # the prefill's left out
    t = steps[-1]["totals"]
    assert line.y[-1] == pytest.approx((t["new_tokens"] - 1) / (t["target_steps"] - 1))  # the status's τ
    assert line.name == f"τ after the prefill = {line.y[-1]:.2f}"
    assert fig.layout.barmode == "stack"


@pytest.mark.parametrize("mode", MODES)
def test_tokens_per_step_hist(mode):
    steps = load(mode)["steps"]
    fig = charts.tokens_per_step_hist(steps)
    _common(fig)
    assert len(fig.data) == 1 and fig.data[0].type == "histogram"
    assert steps[0]["kind"] == "prefill" and sorted(fig.data[0].x) == sorted(len(s["tokens"]) for s in steps[1:])
    t = steps[-1]["totals"]
    assert f"(τ = {(t['new_tokens'] - 1) / (t['target_steps'] - 1):.2f})" in fig.layout.xaxis.title.text


@pytest.mark.parametrize("mode", MODES)
def test_throughput(mode):
    steps = load(mode)["steps"]
    fig = charts.throughput(steps, mode=mode)
    _common(fig)
    trace = fig.data[0]
    assert len(trace.x) == len(trace.y) == len(steps)
    t = steps[-1]["totals"]
    assert trace.y[-1] == pytest.approx(t["new_tokens"] / t["elapsed_s"])


@pytest.mark.parametrize("mode", MODES)
def test_timing(mode):
    steps = load(mode)["steps"]
    fig = charts.timing(steps)
    _common(fig)
    draft, verify = fig.data
    assert (draft.name, verify.name) == ("draft", "verify")
    # The prefill (step 0) is named, not drawn: every decoding step has its bar.
    assert steps[0]["kind"] == "prefill" and all(s["kind"] != "prefill" for s in steps[1:])
    assert list(draft.x) == list(verify.x) == [s["step"] for s in steps[1:]]
    assert verify.y[0] == pytest.approx(steps[1]["verify_time_s"] * 1000)
    assert sum(draft.y) == pytest.approx(steps[-1]["totals"]["draft_time_s"] * 1000, rel=1e-6)
    assert sum(verify.y) == pytest.approx((steps[-1]["totals"]["verify_time_s"] - steps[0]["verify_time_s"]) * 1000, rel=1e-6)
    assert [a.text for a in fig.layout.annotations] == [f"prefill {steps[0]['verify_time_s'] * 1000:.0f} ms (not drawn)"]
    assert fig.layout.barmode == "stack"


def test_timing_of_a_prefill_alone():
    prefill = load("eagle")["steps"][:1]
    fig = charts.timing(prefill)
    assert [len(t.y) for t in fig.data] == [0, 0]
    assert "prefill" in fig.layout.annotations[0].text


def test_timing_with_unknown_times():
    """An engine that does not report its steps' times (vLLM) gets a sentence, not an empty pair of axes."""
    steps = load("lookahead")["steps"]
    hidden = [{**s, "draft_time_s": None, "verify_time_s": None} for s in steps]
    fig = charts.timing(hidden)
    assert not fig.data and [a.text.replace("<br>", " ") for a in fig.layout.annotations] == [
        "Not reported: this engine does not say how long its steps' drafting and verifying took."]
    assert max(len(line) for line in fig.layout.annotations[0].text.split("<br>")) <= charts.EMPTY_LINE  # not clipped
    # One step with a time is enough for the bars (the others are gaps).
    partly = hidden[:2] + [{**hidden[2], "verify_time_s": 0.01}] + hidden[3:]
    assert list(charts.timing(partly).data[1].y)[1] == pytest.approx(10.0)


def test_compare():
    rows = [{"mode": "autoregressive", "speedup": 1.0}, {"mode": "prompt_lookup", "speedup": 1.62},
            {"mode": "medusa", "speedup": None}]
    fig = charts.compare(rows)
    _common(fig)
    bar = fig.data[0]
    assert list(bar.y) == ["Autoregressive", "Prompt lookup", "Medusa"] and bar.orientation == "h"
    assert list(bar.x) == [1.0, 1.62, None]
    assert list(bar.text) == ["1.00×", "1.62×", ""]
    assert fig.layout.shapes and fig.layout.shapes[0].x0 == 1
    assert fig.layout.xaxis.range[1] > 1.62  # the widest bar's label has room


@pytest.mark.parametrize("build", STEP_CHARTS + [charts.compare, charts.pass_cost, charts.acceptance_by_depth, charts.earnings,
                                   charts.tau_vs_cost])
def test_empty_input_gives_annotated_figure(build):
    for empty in ([], None):
        fig = build(empty)
        assert isinstance(fig, go.Figure)
        assert not fig.data
        assert fig.layout.annotations and fig.layout.annotations[0].text
        assert fig.layout.height == charts.HEIGHT


@pytest.mark.parametrize("build", STEP_CHARTS)
def test_one_event(build):
    # The timing chart names a prefill instead of drawing it (test_timing_of_a_prefill_alone) and the histogram counts
    # decoding passes (τ after the prefill): give them a decoding step.
    one = load("medusa")["steps"][1:2] if build in (charts.timing, charts.tokens_per_step_hist) else load("medusa")["steps"][:1]
    fig = build(one)
    _common(fig)
    assert fig.data and not fig.layout.annotations
    assert all(len(t.x) == 1 for t in fig.data)


def test_long_run_has_one_point_per_step():
    base = load("lookahead")["steps"][2]
    steps = []
    for i in range(2000):
        s = json.loads(json.dumps(base))
        s["step"] = i
        s["totals"] = {**s["totals"], "new_tokens": 3 * (i + 1), "elapsed_s": 0.1 * (i + 1)}
        steps.append(s)
    for build in STEP_CHARTS:
        fig = build(steps)
        assert all(len(t.x) == 2000 for t in fig.data), build.__name__
    assert charts.race(steps).data[0].y[-1] == 6000


def test_race_runs_shares_axes_across_modes():
    runs = {m: load(m)["steps"] for m in ("autoregressive", "prompt_lookup", "eagle")}
    fig = charts.race_runs(runs)
    _common(fig)
    assert [t.name for t in fig.data] == ["Autoregressive", "Prompt lookup", "EAGLE"]
    for trace, steps in zip(fig.data, runs.values()):
        assert len(trace.x) == len(steps)
        assert trace.y[-1] == steps[-1]["totals"]["new_tokens"]
    assert fig.data[0].line.dash == "dash" and fig.data[1].line.dash == "solid"
    by_label = charts.race_runs({label(m): s for m, s in runs.items()})
    assert [t.line.color for t in by_label.data] == [t.line.color for t in fig.data]
    empty = charts.race_runs({})
    assert not empty.data and empty.layout.annotations
    assert charts.race_runs({"medusa": []}).layout.annotations


def test_race_lines_differ_without_colour():
    """Compare's race with every mode: no two lines share both their dash and their marker (read in grey too)."""
    recorded = {m: load(m)["steps"] for m in ("autoregressive", "prompt_lookup", "eagle", "medusa", "lookahead",
                                               "draft_target", "suffix")}
    runs = {**recorded, "eagle+prompt_lookup": recorded["eagle"], "medusa+prompt_lookup": recorded["medusa"],
            "vllm:autoregressive": recorded["autoregressive"], "vllm:prompt_lookup": recorded["prompt_lookup"]}
    fig = charts.race_runs(runs)
    looks = [(t.line.dash, t.marker.symbol) for t in fig.data]
    assert len(looks) == len(runs) and len(set(looks)) == len(looks), looks
    assert len({symbol for _, symbol in looks}) == len(looks)  # a marker each, whatever the dashes


def test_race_runs_until_cuts_every_run_at_that_time_on_the_whole_race_axes():
    runs = {m: load(m)["steps"] for m in ("autoregressive", "prompt_lookup", "eagle")}
    end = max(s[-1]["totals"]["elapsed_s"] for s in runs.values())
    tokens = max(s[-1]["totals"]["new_tokens"] for s in runs.values())
    frames = [charts.race_runs(runs, until=t) for t in (0.0, end / 3, end)]
    for fig in frames:
        _common(fig)
        assert [t.name for t in fig.data] == ["Autoregressive", "Prompt lookup", "EAGLE"]
        assert fig.layout.xaxis.range[0] == 0 and end <= fig.layout.xaxis.range[1] <= end * 1.05  # a still frame
        assert tokens <= fig.layout.yaxis.range[1] <= tokens * 1.06
    middle = frames[1]
    for trace, steps in zip(middle.data, runs.values()):
        assert len(trace.x) == sum(s["totals"]["elapsed_s"] <= end / 3 for s in steps) and max(trace.x, default=0) <= end / 3
    assert any(0 < len(t.x) < len(s) for t, s in zip(middle.data, runs.values()))  # mid-race: someone is partway
    assert [len(t.x) for t in frames[2].data] == [len(s) for s in runs.values()]  # the end: every step drawn


def test_tau_vs_cost_places_each_mode_between_iso_speedup_rays():
    rows = [{"mode": "Autoregressive", "decoding_tau": None, "step_cost": None},
            {"mode": "Prompt lookup", "decoding_tau": 2.4, "step_cost": 1.2},
            {"mode": "EAGLE", "decoding_tau": 3.0, "step_cost": 1.5},
            {"mode": "Medusa", "decoding_tau": None, "step_cost": None}]  # still running: not drawn yet
    fig = charts.tau_vs_cost(rows)
    _common(fig)
    points = {t.name: (t.x[0], t.y[0]) for t in fig.data if t.name}
    assert points == {"Autoregressive": (1.0, 1.0), "Prompt lookup": (1.2, 2.4), "EAGLE": (1.5, 3.0)}
    assert fig.data[-1].marker.color == REGISTRY["eagle"].colour
    rays = [t for t in fig.data if not t.name]
    assert all(list(t.x)[0] == 0 and list(t.y)[0] == 0 for t in rays)  # through the origin: speedup = τ ÷ step time
    slopes = sorted(round(t.y[1] / t.x[1], 3) for t in rays)
    assert 1.0 in slopes and 2.0 in slopes  # both points lie on the 2× ray
    assert {a.text for a in fig.layout.annotations} >= {"1×", "2×"}
    assert fig.layout.xaxis.range[1] >= 1.5 and fig.layout.yaxis.range[1] >= 3.0  # every point inside
    assert "= 2.00× after the prefill" in fig.data[-1].hovertemplate
    assert not charts.tau_vs_cost(rows[:1]).data  # autoregressive alone: nothing to compare
    cheap = charts.tau_vs_cost(rows[:1] + [{"mode": "prompt_lookup", "decoding_tau": 2.0, "step_cost": 0.77}])
    assert cheap.layout.xaxis.range[0] < 0.77  # a step measured cheaper than autoregressive's stays in view
    # The chart: EAGLE drawn at step 0.82, past the 1.5× ray, while its table row said "load changed".
    withheld = charts.tau_vs_cost(rows[:2] + [{"mode": "EAGLE", "decoding_tau": 2.9, "step_cost": 0.82,
                                               "step_doubt": "a step took 0.82 of an autoregressive step"}])
    assert {t.name for t in withheld.data if t.name} == {"Autoregressive", "Prompt lookup"}
    said = "EAGLE: " + figures.withheld("a step took 0.82 of an autoregressive step")
    assert any(a.text.replace("<br>", " ") == said for a in withheld.layout.annotations)
    assert said in charts.tau_vs_cost([rows[0], withheld_row := {
        "mode": "EAGLE", "decoding_tau": 2.9, "step_cost": 0.82,
        "step_doubt": "a step took 0.82 of an autoregressive step"}]).layout.annotations[0].text.replace("<br>", " ")
    # A whole-run ratio above τ (a cheaper prefill) withholds that ratio only: the step still stands, and is drawn.
    prefill = charts.tau_vs_cost(rows[:2] + [{**withheld_row, "step_cost": 1.4, "step_doubt": None,
                                              "doubt": "the whole run's 3.1× … more than τ 2.90 allows"}])
    assert {t.name for t in prefill.data if t.name} == {"Autoregressive", "Prompt lookup", "EAGLE"}


def test_compare_with_every_speedup_withheld_says_so():
    fig = charts.compare([{"mode": "autoregressive", "speedup": None}, {"mode": "suffix", "speedup": None}])
    assert not fig.data and fig.layout.annotations[0].text.startswith("No speedup shown: the table says")
    # With the rule's reasons: each mode's own sentence, whole.
    fig = charts.compare([{"mode": "autoregressive", "speedup": None}, {"mode": "suffix", "speedup": None, "doubt": "why"},
                          {"mode": "lookahead", "speedup": None, "doubt": "another reason"}])
    assert fig.layout.annotations[0].text.replace("<br>", " ") == (
        f"Suffix: {figures.withheld('why')} Lookahead: {figures.withheld('another reason')}")


def test_compare_accepts_labels():
    by_key = charts.compare([{"mode": "lookahead", "speedup": 1.2}])
    by_label = charts.compare([{"mode": "Lookahead", "speedup": 1.2}])
    assert by_key.data[0].marker.color == by_label.data[0].marker.color
    assert list(by_label.data[0].y) == ["Lookahead"]


@pytest.mark.parametrize("build", [charts.tokens_per_step_hist, charts.throughput, charts.timing, charts.acceptance_by_depth])
def test_titles_fit_a_third_of_the_row(build):
    """Three charts share a row in the Run tab; a title longer than ~30 characters is cut off there."""
    for steps in ([], load("prompt_lookup")["steps"]):
        layout = build(steps).layout
        for text in (layout.title.text, layout.xaxis.title.text, layout.yaxis.title.text):
            assert len(text or "") <= 30, text


def test_pass_cost_draws_one_curve_per_dtype_on_a_log_k_axis():
    costs = [{"dtype": "float32", "tokens": [1, 2, 4, 8], "ms": [45.0, 46.1, 47.3, 50.0], "relative": [1.0, 1.02, 1.05, 1.11],
              "context": 50},
             {"dtype": "bfloat16", "tokens": [1, 2, 4, 8], "ms": [31.0, 32.0, 32.5, 34.1], "relative": [1.0, 1.03, 1.05, 1.1],
              "context": 50}]
    fig = charts.pass_cost(costs)
    _common(fig)
    assert [t.name for t in fig.data] == ["float32", "bfloat16"]
    assert list(fig.data[1].x) == [1, 2, 4, 8] and list(fig.data[1].y) == [1.0, 1.03, 1.05, 1.1]
    assert list(fig.data[0].customdata) == [45.0, 46.1, 47.3, 50.0]  # the milliseconds, in the hover
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8]
    assert fig.layout.shapes[0].y0 == 1  # the one-token pass
    from app.ui.lessons import pass_cost_note
    note = pass_cost_note(costs)
    assert "**float32**: one-token pass 45.0 ms after 50 tokens of context" in note and "8 tokens 1.10×" in note


# ----------------------------------------------------------------------------- what speculation can earn

BF16_COST = {"dtype": "bfloat16", "tokens": [1, 2, 4, 8, 16, 32], "ms": [31.0, 32.0, 32.6, 36.6, 42.5, 55.2],
             "relative": [1.0, 1.03, 1.05, 1.18, 1.37, 1.78], "context": 50}


def test_expected_tokens_and_speedup_follow_leviathans_formulas():
    from app.ui.lessons import expected_speedup, expected_tokens
    assert expected_tokens(0.0, 4) == 1.0  # every draft rejected: the target's own token
    assert expected_tokens(1.0, 4) == 5.0  # every draft accepted, plus the bonus token
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(0.999999, 3) == pytest.approx(4.0, abs=1e-4)  # continuous at α = 1
    assert expected_speedup(0.5, 3, 1.05) == pytest.approx(1.875 / 1.05)
    assert expected_speedup(0.5, 3, 1.05, draft_cost=0.1) == pytest.approx(1.875 / 1.35)
    assert expected_speedup(0.0, 7, 1.18) == pytest.approx(1 / 1.18)  # drafting only costs when nothing is accepted
    assert expected_speedup(0.5, 1, 1.03, draft_cost=-1.03) == expected_speedup(0.5, 1, 1.03)  # no negative costs


def test_break_even_solves_speedup_equal_one():
    from app.ui.lessons import break_even, expected_speedup
    # One drafted token commits 1 + α for a pass costing `rel`: it pays from α = rel - 1.
    assert break_even(1, 1.03) == pytest.approx(0.03, abs=1e-9)
    assert break_even(1, 1.03, draft_cost=0.2) == pytest.approx(0.23, abs=1e-9)
    alpha = break_even(7, 1.18, draft_cost=0.04)
    assert 0 < alpha < 1 and expected_speedup(alpha, 7, 1.18, 0.04) == pytest.approx(1.0, abs=1e-9)
    assert break_even(3, 0.9) == 0.0  # a pass cheaper than one-token (noise): pays at any α
    assert break_even(3, 5.0) is None  # even accepting everything (4 tokens) cannot pay for a 5x pass


def test_earnings_draws_one_curve_per_measured_draft_length():
    fig = charts.earnings(BF16_COST)
    _common(fig)
    # Passes over 2, 4, 8, 16 tokens verify 1, 3, 7, 15 drafted tokens; 32 is past what the chart shows.
    assert [t.name for t in fig.data] == ["γ = 1", "γ = 3", "γ = 7", "γ = 15"]
    assert fig.layout.title.text == "Speedup vs α, bfloat16"
    one = fig.data[0]
    assert one.x[0] == 0 and one.x[-1] == 0.99 and len(one.x) == 100
    assert one.y[0] == pytest.approx(1 / 1.03, abs=1e-4) and one.y[50] == pytest.approx(1.5 / 1.03, abs=1e-4)
    assert fig.data[3].y[0] < fig.data[0].y[0] and fig.data[3].y[-1] > fig.data[0].y[-1]  # long drafts: cost, then gain
    assert fig.layout.shapes[0].y0 == 1  # break-even line
    assert fig.layout.yaxis.range[1] == 5.0  # long drafts reach ~14× at α 0.99: the view stops at 5×
    assert charts.earnings(BF16_COST, draft_cost=0.5).layout.yaxis.range[1] < 5.0  # ... or at the highest curve
    cheaper = charts.earnings(BF16_COST, draft_cost=0.1)
    assert all(b < a for a, b in zip(fig.data[1].y, cheaper.data[1].y))


def test_earnings_note_names_break_even_rates_and_best_draft_lengths():
    from app.ui.lessons import earnings_note
    note = earnings_note(BF16_COST, 0.0)
    assert note.startswith("**bfloat16**, a draft costing 0.00 of a one-token pass per token")
    assert "drafting 1 token needs α ≥ 0.03, 3 tokens needs α ≥ 0.05" in note and "15 tokens needs α ≥ 0.27" in note
    # At α 0.3 three drafted tokens commit 1.417 for 1.05 passes (1.35×), one commits 1.3 for 1.03 (1.26×).
    assert "at α 0.3, 3 (1.35×)" in note
    assert "at α 0.9, 15 (5.95×)" in note  # near-certain drafts: the longest pays best
    costly = earnings_note(BF16_COST, 0.5)
    assert "at α 0.3, none pays" in costly and "15 tokens needs α ≥ 0.9" in costly
    assert "never pays" in earnings_note({**BF16_COST, "relative": [1.0, 2.5, 5.0, 9.0, 17.0, 33.0]}, 0.0)
    assert earnings_note(None, 0.0) == ""
    assert earnings_note(BF16_COST, -5.0) == note  # a negative cost typed into the slider's box counts as free


def test_a_curve_measured_under_changing_load_says_so_instead_of_break_even_rates():
    """The walk's Learn → Measure: a 2-token pass at 0.67× the 1-token pass, and then break-even rates that contradict
    each other (7 drafted tokens needing more than 15). A wider pass does all a narrower one does."""
    from app.ui.lessons import earnings_note, pass_cost_note, unsteady

    broken = {**BF16_COST, "relative": [1.0, 0.67, 1.2, 2.9, 2.0, 3.5], "ms": [40.0, 26.8, 48.0, 116.0, 80.0, 140.0]}
    assert "2 tokens measured 0.67×" in unsteady(broken)
    assert "No speedup shown: a pass over 2 tokens measured 0.67×" in earnings_note(broken, 0.0) and "α ≥" not in earnings_note(broken, 0.0)
    assert "⚠ No speedup shown: a pass over 2 tokens" in pass_cost_note([broken])
    # Within its noise a curve may dip (a pass over 4 tokens a little cheaper than over 2): still a curve.
    assert unsteady({**BF16_COST, "relative": [1.0, 1.1, 1.05, 1.18, 1.37, 1.78]}) is None
    assert unsteady(BF16_COST) is None and "No speedup shown" not in pass_cost_note([BF16_COST])


# ----------------------------------------------------------------------------- acceptance by depth


def _step(parents, accepted, added=1, kind="decode"):
    return {"kind": kind, "proposed": {"tokens": list(range(len(parents))), "parents": parents},
            "accepted": accepted, "added_token": added}


def test_acceptance_by_depth_counts_each_depth_only_where_the_draft_reached_it():
    steps = [
        _step([], [], kind="prefill"),
        _step([-1, 0, 1], [0, 1, 2]),       # a chain, all accepted: depths 1, 2, 3 offered and accepted
        _step([-1, 0, 1], [0]),             # accepted 1 of 3: depth 1 yes, depth 2 offered and rejected
        _step([-1, -1, 0, 2], []),          # a tree rejected at the root: depth 1 offered (once), no more
        _step([-1, -1, 1, 2], [1, 2, 3]),   # accepted down the second branch to depth 3: no depth 4 offered
        _step([-1, 0], [0, 1], added=None),  # cut by EOS: left out
        _step([], []),                      # nothing drafted
    ]
    offered, accepted = charts.acceptance_counts(steps)
    assert offered == [4, 3, 2] and accepted == [3, 2, 2]
    fig = charts.acceptance_by_depth(steps)
    _common(fig)
    assert list(fig.data[0].x) == [1, 2, 3]
    assert list(fig.data[0].y) == [0.75, 2 / 3, 1.0]
    assert list(fig.data[0].text) == ["3/4", "2/3", "2/2"]


def test_acceptance_by_depth_from_an_engines_counters():
    """vLLM shows no drafts, only counters: drafts reaching position d are those accepted at d − 1."""
    steps = [_step([], [], kind="prefill"), _step([], [])]
    counters = {"num_drafts": 10, "num_draft_tokens": 40, "num_accepted_tokens": 9, "accepted_per_pos": [6, 3, 0, 0]}
    fig = charts.acceptance_by_depth(steps, counters)
    assert list(fig.data[0].text) == ["6/10", "3/6", "0/3"]  # position 4: no draft reached it, no bar
    title = fig.layout.title.text
    assert "engine's counters" in title and len(title) <= 45, title  # the full phrase was cut at the chart's width


@pytest.mark.parametrize("mode", MODES)
def test_acceptance_by_depth_on_real_traces(mode):
    steps = load(mode)["steps"]
    offered, accepted = charts.acceptance_counts(steps)
    decided = [s for s in steps if s["kind"] == "decode" and s["added_token"] is not None]
    # Every accepted draft token is counted once, at its depth; depth 1 is offered once per drafting step.
    assert sum(accepted) == sum(len(s["accepted"]) for s in decided)
    assert (offered[:1] or [0])[0] == sum(1 for s in decided if s["proposed"]["tokens"])
    assert all(a <= n for a, n in zip(accepted, offered))
    assert offered == sorted(offered, reverse=True)  # reaching depth d needs reaching d - 1
    fig = charts.acceptance_by_depth(steps)
    if mode == "autoregressive":
        assert not fig.data and "Nothing drafted" in fig.layout.annotations[0].text
    else:
        _common(fig)
        assert len(fig.data[0].x) == len(offered) >= 1


def test_training_loss_draws_each_step_and_its_running_mean():
    _common(charts.training_loss([]))
    assert charts.training_loss(None).layout.annotations[0].text == "No run yet: press Train."
    losses = [float(12 - i) for i in range(12)]
    fig = charts.training_loss(losses + ["junk", None])  # what is not a number is left out
    _common(fig)
    per_step, mean = fig.data
    assert list(per_step.x) == list(range(1, 13)) and list(per_step.y) == losses
    assert mean.y[0] == 12 and mean.y[9] == pytest.approx(sum(losses[:10]) / 10) and mean.y[11] == pytest.approx(sum(losses[2:]) / 10)
    assert fig.layout.xaxis.title.text == "optimiser step"


@pytest.mark.parametrize("mode", MODES)
def test_cursor_marks_the_inspected_step(mode):
    events = load(mode)["steps"]
    step = events[len(events) // 2]["step"]
    for fig in (charts.race(events, events, cursor=step), charts.tokens_per_step(events, cursor=step)):
        assert [a.text for a in fig.layout.annotations] == [f"step {step}"] and len(fig.layout.shapes) == 1
    assert not charts.race(events).layout.shapes and not charts.tokens_per_step(events, cursor=10_000).layout.shapes


def test_tau_vs_cost_names_many_points_in_a_legend_not_in_labels_that_collide():
    names = ["autoregressive", "prompt_lookup", "lookahead", "medusa", "eagle", "draft_target", "suffix"]
    rows = [{"mode": n, "decoding_tau": 1 + i * 0.2, "step_cost": 1 + i * 0.05} for i, n in enumerate(names)]
    few, many = charts.tau_vs_cost(rows[:3]), charts.tau_vs_cost(rows)
    named = lambda fig: [t for t in fig.data if t.name]  # noqa: E731  (the rays have no name)
    assert all(t.text for t in named(few)) and not few.layout.showlegend
    assert not any(t.text for t in named(many)) and many.layout.showlegend and many.layout.legend.x > 1
    assert len({t.marker.symbol for t in named(many)}) == len(names)
