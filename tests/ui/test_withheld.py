"""Issue 59: a figure the rule (app/figures.py) withholds is said the same way on every surface: the Run tab's status,
a Compare row, a Load sweep and this app's point in it, Learn's measured curve, the CLI and the bench each print
figures.withheld(reason), the rule's reason inside. Fabricated readings, no timing: each surface's pure function."""

from app import bench, cli, figures, runner, traces
from app.modes import MODES
from app.bench import load
from app.traces import Recording
from app.ui import charts, compare_tab, lessons, load_tab, render
from app.ui.markup import esc


def steps(per_step: list[int], seconds: float) -> list[dict]:
    """A prefill and decoding steps committing `per_step` tokens each, `seconds` apart (a little spread, as a clock has)."""
    out, elapsed, new = [{"kind": "prefill", "tokens": [1], "totals": {"elapsed_s": 0.2, "new_tokens": 1}}], 0.2, 1
    for i, n in enumerate(per_step):
        elapsed += seconds * (1.0 + 0.01 * (i % 3))
        new += n
        out.append({"kind": "decode", "tokens": [1] * n, "draft_time_s": 0.0, "verify_time_s": seconds,
                    "totals": {"elapsed_s": elapsed, "new_tokens": new}})
    return out


# A step of τ 2 that took half an autoregressive step: cheaper than the one-token pass it contains.
RUN, BASELINE = steps([2] * 12, 0.05), steps([1] * 24, 0.1)
PARTS = traces.speedup_parts(RUN, BASELINE)
# A cost curve whose 2-token pass measured 0.67 of the 1-token pass.
FELL = {"dtype": "float32", "tokens": [1, 2, 4], "ms": [40.0, 26.8, 41.0], "relative": [1.0, 1.0, 1.03], "context": 9}
# A curve whose 8-token passes got half the CPU share of the one-token pass (runner.verify_cost leaves that width out),
# and one whose every pass that drafts did.
LOADED = runner.load_changed(8, 0.45, 0.95)
PART = {"dtype": "float32", "tokens": [1, 2, 4], "ms": [40.0, 42.0, 46.0], "relative": [1.0, 1.05, 1.15], "context": 9,
        "cpu_share": [0.95, 0.95, 0.94], "withheld": [{"tokens": 8, "ms": 120.0, "cpu_share": 0.45, "reason": LOADED}]}
NONE = {**PART, "tokens": [1], "ms": [40.0], "relative": [1.0], "cpu_share": [0.95],
        "withheld": [{"tokens": k, "ms": 90.0, "cpu_share": 0.45, "reason": runner.load_changed(k, 0.45, 0.95)}
                     for k in (2, 4, 8)]}


def test_a_pass_width_timed_under_other_load_than_the_one_token_pass_is_withheld_by_the_rule():
    assert LOADED.startswith("a pass over 8 tokens got 45% of the CPU it asked for while timed, the one-token pass it "
                             "is divided by 95%: the machine's load changed")
    assert runner.load_changed(8, 0.9, 0.95) is None and runner.load_changed(8, None, 0.95) is None
    assert "other work had most of the machine" in runner.load_changed(8, 0.2, 0.21)  # alike, but mostly switched out


def test_the_fabricated_readings_are_withheld_by_the_rule():
    assert PARTS["doubt"].startswith("a step took 0.50 of an autoregressive step")
    assert lessons.unsteady(FELL).startswith("a pass over 2 tokens measured 0.67×")
    assert figures.withheld("a reason.") == "No speedup shown: a reason."


def test_every_surface_prints_the_one_sentence_for_a_withheld_speedup():
    said = figures.withheld(PARTS["doubt"])
    # Run: the status line (the vLLM backend's runs print the same function's line).
    assert f"⚠ {said}" in render.speedup_line(RUN, BASELINE)
    # Compare: the row's cell is marked, the sentence is under the table.
    run, base = Recording("prompt_lookup"), Recording("autoregressive")
    run.events, base.events = RUN, BASELINE
    row = compare_tab.summary_row("prompt_lookup", run, base, MODES)
    table = render.summary_table([row])
    assert row["speedup"] is None and f"* Prompt lookup: {esc(said)}</p>" in table and "not shown*" in table
    # ... and its two charts leave it out with the same sentence, the mode named, whether drawn beside others or alone.
    ar = compare_tab.summary_row("autoregressive", base, base, MODES)
    drawn = {"mode": "Suffix", "speedup": 1.5, "decoding_tau": 2.0, "step_cost": 1.25}
    for fig in (charts.compare([ar, row]), charts.tau_vs_cost([ar, row]), charts.tau_vs_cost([ar, row, drawn])):
        assert [a.text.replace("<br>", " ") for a in fig.layout.annotations if a.name == "left out" or not fig.data] \
            == [f"Prompt lookup: {said}"]
    # Load: this app's own point at batch 1 (load.our_point's reading of the same race) ...
    ours = {"raced": True, "tau": PARTS["tau"], "speedup": None, "interval": None, "doubt": PARTS["doubt"]}
    assert f"This app's own loop at batch 1: {esc(said)}" in load_tab.ours_said(ours)
    # ... and a sweep whose verify step at N = 1 cost less than the plain step it contains.
    sweep = {"points": [
        {"row": load.PLAIN, "n": 1, "tokens_per_s": 20.0, "seconds_per_token": 0.05, "ttft_s": 0.1, "tau": 1.0,
         "identical_share": 1.0, "at_s": 1.0},
        {"row": "vllm_ngram", "n": 1, "tokens_per_s": 30.0, "seconds_per_token": 0.05 * 0.5 / 2, "ttft_s": 0.1,
         "tau": 2.0, "identical_share": 1.0, "at_s": 1.0}]}
    reason = next(r["doubt"] for r in load.speedups(sweep["points"], "vllm_ngram"))
    assert load_tab.note(sweep).startswith(f"**{esc(figures.withheld(reason))}**")
    # The CLI's `generate --race`.
    assert cli.versus_lines(PARTS) == [f"[vs autoregressive] {said}"]
    # The bench: the cell marked, the sentence in its footnote.
    mode = {"tokens_per_s": 20.0, "speedup": 1.0, "speedup_ci": None, "mean_accepted_tokens": 2.0, "step_cost": 0.5,
            "draft_cost": 0.0, "identical_share": 1.0}
    mode.update(bench._possible(mode))
    table = bench.format_table({"autoregressive": {**mode, "speedup": 1.0, "step_cost": None, "doubt": None},
                                "prompt_lookup": mode})
    assert f"* overall / prompt_lookup: {figures.withheld(mode['doubt'])}" in table


def test_learn_prints_the_one_sentence_for_a_curve_that_fell():
    said = figures.withheld(lessons.unsteady(FELL))
    assert lessons.earnings_note(FELL, 0.0) == f"**float32**: {said}"
    assert f"⚠ {said}" in lessons.pass_cost_note([FELL])
    fig = charts.earnings(FELL)  # nor drawn: speedups read off it would contradict each other
    assert not fig.data and fig.layout.annotations[0].text.replace("<br>", " ") == said


def test_learn_prints_the_one_sentence_for_a_pass_width_timed_under_other_load():
    said = figures.withheld(LOADED)
    assert f"⚠ {said}" in lessons.pass_cost_note([PART])
    fig = charts.pass_cost([PART])  # the width not drawn as a measured point, its sentence under the chart
    assert list(fig.data[0].x) == [1, 2, 4] and fig.layout.annotations[0].text.replace("<br>", " ") == f"float32: {said}"
    assert charts.earnings(PART).data and "α ≥" in lessons.earnings_note(PART, 0.0)  # read off the widths that stand
    assert f"* 8: {said}" in bench.format_verify_cost(PART)
    # Every width that drafts left out: no break-even rates, each width's sentence instead.
    every = " ".join(figures.withheld(w["reason"]) for w in NONE["withheld"])
    assert lessons.earnings_note(NONE, 0.0) == f"**float32**: {every}"
    fig = charts.earnings(NONE)
    assert not fig.data and fig.layout.annotations[0].text.replace("<br>", " ") == every
    assert "context." in lessons.pass_cost_note([NONE]) and every.split(". ")[0] in lessons.pass_cost_note([NONE])
