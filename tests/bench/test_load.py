"""The load sweep's arithmetic, sentence and chart (pure; the sweep on real engines is in test_vllm.py)."""

import html
import json
import math
import re
import time
from types import SimpleNamespace

import pytest

from app import traces
from app.bench import load
from app.ui import charts, load_tab
from helpers import Job  # a finished job's batches


def pt(row, n, tps, spt, tau=1.0, identical=1.0, at=None):
    return {"row": row, "n": n, "tokens_per_s": tps, "seconds_per_token": spt, "ttft_s": 0.1, "tau": tau,
            "identical_share": identical, "at_s": at if at is not None else float(n)}


# Plain: 50 ms a token alone, 80 ms at 4, 160 ms at 8 (throughput 20 -> 50 -> 50 tok/s); ngram: τ 2 throughout, a
# step costing 1.25, 2.4 and 3 plain steps: 1.6x, 0.83x, 0.67x per request.
SWEEP = {"points": [pt("vllm_generate", 1, 20.0, 0.050), pt("vllm_ngram", 1, 30.0, 0.050 * 1.25 / 2, 2.0),
                    pt("vllm_generate", 4, 50.0, 0.080), pt("vllm_ngram", 4, 45.0, 0.080 * 2.4 / 2, 2.0),
                    pt("vllm_generate", 8, 50.0, 0.160), pt("vllm_ngram", 8, 30.0, 0.160 * 3.0 / 2, 2.0)],
         "ours": {"speedup": 1.7, "tau": 2.3}}


def test_speedups_split_into_tau_over_step_cost():
    rows = load.speedups(SWEEP["points"], "vllm_ngram")
    assert [r["n"] for r in rows] == [1, 4, 8]
    assert [r["latency"] for r in rows] == pytest.approx([1.6, 2 / 2.4, 2 / 3])
    assert [r["step_cost"] for r in rows] == pytest.approx([1.25, 2.4, 3.0])
    assert all(r["latency"] == pytest.approx(r["tau"] / r["step_cost"]) for r in rows)
    assert [r["throughput"] for r in rows] == pytest.approx([1.5, 0.9, 0.6])
    assert load.speedups(SWEEP["points"][:1], "vllm_ngram") == []  # no speculative point: nothing to compare


def test_crossover_states():
    def rows(*values):
        return [{"n": 2 ** i, "latency": v} for i, v in enumerate(values)]

    assert load.crossover(rows(1.6, 1.2, 0.9, 0.7)) == {"state": "crosses", "last": 2, "at": 4}
    assert load.crossover(rows(0.9, 0.8)) == {"state": "never_pays", "at": 1}
    assert load.crossover(rows(1.5, 1.1)) == {"state": "always_pays", "last": 2}
    assert load.crossover(rows(None, None)) == {"state": "unknown"}
    # A dip under 1 followed by a recovery: the first N where it no longer paid is the crossover.
    assert load.crossover(rows(1.3, 0.95, 1.05)) == {"state": "crosses", "last": 1, "at": 2}


def test_note_explains_the_crossover_from_the_numbers():
    text = load_tab.note(SWEEP)
    assert "stops paying per request between N = 1 and N = 4" in text
    assert "τ 2.00 tokens and costs 1.25 plain steps: 1.60× per request" in text
    assert "costs 2.40 plain steps: 0.83× per request" in text
    assert "throughput grew 2.5× from N = 1 to N = 8" in text
    assert "By total throughput it stops paying at N = 4" in text
    assert "made 1.70× at batch 1" in text  # SWEEP's `ours` has no `raced`: a recording's whole-run ratio
    always = {"points": SWEEP["points"][:2]}
    assert "still pays per request at N = 1" in load_tab.note(always)
    never = {"points": [pt("vllm_generate", 1, 20.0, 0.05), pt("vllm_suffix", 1, 10.0, 0.08, 1.2)]}
    assert "does not pay per request even at N = 1" in load_tab.note(never) and "vLLM suffix" in load_tab.note(never)
    assert load_tab.note({"points": []}) == "" and load_tab.note(None) == ""


def test_note_prints_no_figure_past_what_one_step_or_n_requests_allow():
    """The issue's Load sentence: "at N = 1 a verify step … costs 0.85 plain steps: 4.18× per request" and "throughput
    grew 5.2× from N = 1 to N = 4". A step under the plain step it contains withholds the sweep's figures; within the
    noise it reads as one step; a growth past N is left out."""
    cheap = {"points": [pt("vllm_generate", 1, 20.0, 0.050), pt("vllm_ngram", 1, 30.0, 0.050 * 0.85 / 3.55, 3.55)]}
    text = load_tab.note(cheap)
    assert text.startswith("**No speedup shown: at N = 1 a verify step") and "0.85 plain steps" in text and "4.18" not in text
    near = {"points": [pt("vllm_generate", 1, 20.0, 0.050), pt("vllm_ngram", 1, 30.0, 0.050 * 0.98 / 2, 2.0)]}
    assert "costs 1.00 plain steps: 2.00× per request" in load_tab.note(near)
    grew = {"points": [pt("vllm_generate", 1, 10.0, 0.050), pt("vllm_ngram", 1, 15.0, 0.050 * 1.25 / 2, 2.0),
                       pt("vllm_generate", 4, 52.0, 0.080), pt("vllm_ngram", 4, 45.0, 0.080 * 2.4 / 2, 2.0)]}
    assert "5.2×" not in load_tab.note(grew) and "grew" not in load_tab.note(grew)
    assert "No growth of the plain engine's throughput is read: from N = 1 to N = 4" in load_tab.note(grew)
    assert "grew 2.5×" in load_tab.note(SWEEP)


def test_chart_draws_speedups_tau_ours_and_the_crossover():
    fig = charts.load_sweep(SWEEP)
    traces = {t.name: t for t in fig.data}
    assert list(traces["per request"].x) == [1, 4, 8]
    assert list(traces["per request"].y) == pytest.approx([1.6, 2 / 2.4, 2 / 3], abs=1e-4)
    assert list(traces["total throughput"].y) == pytest.approx([1.5, 0.9, 0.6], abs=1e-4)
    assert traces["τ"].yaxis == "y2" and list(traces["τ"].y) == [2.0, 2.0, 2.0]
    assert list(traces["this app's loop (batch 1 only)"].x) == [1]
    assert any(s.x0 == 4 for s in fig.layout.shapes)  # the crossover's line at N = 4
    assert any("stops paying at N = 4" in a.text for a in fig.layout.annotations)
    assert fig.layout.xaxis.type == "log" and "vLLM ngram" in fig.layout.title.text
    json.dumps(fig.to_plotly_json(), default=str)  # what Gradio sends: plain data
    assert "transition" not in fig.to_plotly_json()["layout"]  # plotly.js's transitions fail on the added τ axis
    empty = charts.load_sweep({"points": SWEEP["points"][:1]})
    assert "No sweep yet" in empty.layout.annotations[0].text and not empty.data


def test_chart_axis_ends_at_the_n_measured():
    """Issue 59.7: the x axis ran decades past the data. On a log axis an annotation's x is log10 N: the crossover's
    label is placed there (at N = 4, not 10^4), and the axis spans the N measured with a marker's margin."""
    fig = charts.load_sweep(SWEEP)
    lo, hi = fig.layout.xaxis.range
    assert list(fig.layout.xaxis.tickvals) == [1, 4, 8]
    assert -0.1 < lo < 0 and math.log10(8) < hi < math.log10(8) * 1.1
    label = next(a for a in fig.layout.annotations if "stops paying" in a.text)
    assert label.xref == "x" and label.x == pytest.approx(math.log10(4))
    line = next(s for s in fig.layout.shapes if s.xref == "x")
    assert line.x0 == 4  # a shape takes N itself
    # Measured from N = 2 only: the axis starts there, or at 1 when the batch-1 star is drawn.
    later = {"points": [p for p in SWEEP["points"] if p["n"] > 1]}
    assert charts.load_sweep(later).layout.xaxis.range[0] > math.log10(3)
    assert charts.load_sweep({**later, "ours": SWEEP["ours"]}).layout.xaxis.range[0] < 0
    one = charts.load_sweep({"points": SWEEP["points"][:2]}).layout.xaxis.range  # a single N: a margin around it
    assert one[0] < 0 < one[1]


def test_table_explains_both_taus():
    html_text = load_tab.table(SWEEP)
    titles = dict(re.findall(r"<th title='([^']*)'>([^<]*)</th>", html_text))
    by_name = {v: html.unescape(k) for k, v in titles.items()}
    assert "spec-decode counters" in by_name["τ (counters)"] and "drafting step" in by_name["τ (counters)"]
    assert "per engine step as streamed" in by_name["τ per step"] and "every step" in by_name["τ per step"]
    note = html_text.split("</table>", 1)[1]
    assert "τ (counters): vLLM&#x27;s spec-decode counters" in note and "τ per step: tokens per engine step" in note


def test_starting_line_says_which_engine_and_the_seconds():
    from app.modes import MODES

    assert load_tab.starting_line(None, 0.2, MODES).startswith("Starting the engines: 0 s so far")
    line = load_tab.starting_line("prompt_lookup", 42.4, MODES)
    assert line.startswith("Starting vLLM's Prompt lookup engine: 42 s so far") and "1–3 minutes" in line
    assert load_tab.starting_line("autoregressive", 75, MODES).startswith("Starting vLLM's plain engine (the baseline): 75 s")


class SlowSweep:
    """A Service whose load_sweep starts two engines a second or so each (as vLLM's take minutes), saying which."""

    def __init__(self):
        from app.modes import MODES

        self.registry, self.jobs = MODES, []
        self.limits = SimpleNamespace(time_limit_s=300.0)

    def load_sweep(self, data, ns, max_new_tokens, ours=False, visitor=None, starting=None):
        for mode in ("prompt_lookup", "autoregressive"):
            starting(mode)
            time.sleep(1.3)
        point = pt("vllm_ngram", 1, 30.0, 0.05, 2.0)
        self.jobs.append(Job([{"type": "point", "point": pt("vllm_generate", 1, 20.0, 0.05)},
                              {"type": "point", "point": point}, {"type": "end", "finish_reason": "length"}]))
        return self.jobs[-1]

    @staticmethod
    def relative(text):
        return text


def test_the_load_tab_counts_the_seconds_while_the_engines_start():
    from app.ui.sessions import Sessions

    tab = load_tab.LoadTab(SlowSweep(), Sessions())
    tab.plot, tab.note, tab.table, tab.status, tab.download = "plot", "note", "table", "status", "download"
    lines = [out["status"] for out in tab.run("prompt_lookup", "1", 8, False, None)]
    starting = [line for line in lines if line.startswith("Starting")]
    assert starting[0].startswith("Starting the engines: 0 s")
    seconds = {line.split(": ")[0]: int(line.split(": ")[1].split(" s ")[0]) for line in starting[1:]}
    assert seconds["Starting vLLM's Prompt lookup engine"] >= 1, lines  # counted each second, from the sweep's start
    assert seconds["Starting vLLM's plain engine (the baseline)"] >= 2, lines
    assert lines[-1].startswith("Done")


def test_point_and_table_from_request_records():
    records = [{"token_ids": [1, 2, 3, 4, 5], "chunks": 3, "first_s": 0.5, "last_s": 0.9, "finish_reason": "length"},
               {"token_ids": [6, 7, 8], "chunks": 2, "first_s": 0.6, "last_s": 1.0, "finish_reason": "length"}]
    p = load.point("vllm_ngram", records, 1.0, {"num_accepted_tokens": 4, "num_drafts": 2}, speculates=True)
    assert p["n"] == 2 and p["tokens_per_s"] == 8.0
    assert p["seconds_per_token"] == pytest.approx((0.4 / 4 + 0.4 / 2) / 2)
    assert p["tau"] == pytest.approx(1 + 4 / 2) and p["tau_streamed"] == pytest.approx(8 / 5)
    plain = load.point("vllm_generate", records, 1.0, {}, speculates=False)
    assert plain["tau"] == 1.0 and plain["spec_decode"] is None
    p["identical_share"] = 1.0
    assert load.table([p]) == {"vllm_ngram": {"2": {"tokens_per_s": 8.0, "seconds_per_token": p["seconds_per_token"],
                                                   "ttft_s": pytest.approx(0.55), "tau": p["tau"], "identical_share": 1.0}}}


def test_concurrency_and_prompts_are_bounded():
    assert load.parse_ns("4, 1,2") == [1, 2, 4] and load.parse_ns(None) == list(load.DEFAULT_N)
    with pytest.raises(ValueError, match="between 1 and 4"):
        load.parse_ns("1,8", allowed=4)
    with pytest.raises(ValueError, match="comma-separated"):
        load.parse_ns("one,two")
    rows = [{"id": i, "category": c, "text": "x" * (2000 if i == 1 else 10)} for i, c in enumerate("aabbc")]
    assert [r["id"] for r in load.pick_prompts(rows, 4)] == [0, 2, 4, 3]  # categories in turn, the long one left out
    with pytest.raises(ValueError, match="only 4 prompts"):
        load.pick_prompts(rows, 5)


def test_a_recording_is_checked_before_it_is_drawn():
    sweep = load.parse({**load.document({"points": [{**p, "requests": []} for p in SWEEP["points"]]}, model="m"),
                        "ours": SWEEP["ours"]})
    assert len(sweep["points"]) == 6 and sweep["model"] == "m" and sweep["ours"]["speedup"] == 1.7
    assert load_tab.note(sweep) == load_tab.note(SWEEP)
    for bad in ({"points": []}, {"kind": "load-sweep", "points": [{"row": "<b>x</b>", "n": 1, "tokens_per_s": 1}]},
                {"kind": "load-sweep", "points": [{"row": "vllm_ngram", "n": 0, "tokens_per_s": 1}]}):
        with pytest.raises(ValueError):
            load.parse(bad)
    html = load_tab.table(sweep)
    assert html.count("<tr>") == 7 and "vllm_ngram" in html


def test_a_sweep_file_is_read_back_or_refused_in_words(tmp_path):
    shipped = load_tab.RECORDINGS_DIR / f"{load_tab.RECORDINGS[0]}.json"
    assert load.read(shipped) == load.parse(json.loads(shipped.read_text()))
    cases = {"big.json": (b" " * (load.MAX_BYTES + 1), "bytes at most"), "notes.json": (b"{not json", "not JSON"),
             "latin.json": (b"\xff\xfe", "not JSON"), "deep.json": (b"[" * 100_000, "not JSON"),
             "trace.json": (b'{"steps": []}', "not a recorded load sweep")}
    for name, (body, words) in cases.items():
        (tmp_path / name).write_bytes(body)
        with pytest.raises(load.LoadError, match=words):
            load.read(tmp_path / name)


def test_shipped_recordings_parse_and_cross_over():
    assert load_tab.RECORDINGS, "assets/load/ ships recorded sweeps"
    for name in load_tab.RECORDINGS:
        sweep = load.parse(json.loads((load_tab.RECORDINGS_DIR / f"{name}.json").read_text()))
        assert {p["row"] for p in sweep["points"]} >= {"vllm_generate"} and sweep.get("cpu")
        assert all(p["identical_share"] == 1.0 for p in sweep["points"]), name  # float32 greedy: the same outputs
        assert load_tab.note(sweep).startswith("**vLLM "), name


def test_public_mode_caps_a_sweep_and_a_sweep_needs_a_speculative_mode(tmp_path):
    from app.service.api import Service
    from app.service.policy import Policy

    public, operator = Service(tmp_path, policy=Policy.for_public()), Service(tmp_path)
    try:
        with pytest.raises(ValueError, match="between 1 and 4"):
            public.load_sweep({"speculative_config": {"decoding_type": "NGram"}}, "1,8")
        with pytest.raises(ValueError, match="between 1 and 32"):
            operator.load_sweep({"speculative_config": {"decoding_type": "NGram"}}, "1,64")
        with pytest.raises(ValueError, match="choose a speculative mode"):
            operator.load_sweep({"speculative_config": {"decoding_type": "Autoregressive"}}, "1,2")
    finally:
        public.close()
        operator.close()


class _Engine:
    """A vLLM-shaped HTTP server on 127.0.0.1: /v1/completions streams `tokens` tokens `per_chunk` at a time, each
    chunk `delays.pop(0)` seconds apart (the load of the moment); /metrics counts drafts when it speculates."""

    def __init__(self, per_chunk: int, delays: list[float], calls: list[str], name: str, tokens: int = 8):
        import http.server
        import threading

        engine = self
        self.drafts = self.accepted = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                text = "" if per_chunk == 1 else "".join(
                    f'vllm:spec_decode_{k}_total{{model_name="m"}} {v}\n'
                    for k, v in (("num_drafts", engine.drafts), ("num_draft_tokens", 3 * engine.drafts),
                                 ("num_accepted_tokens", engine.accepted)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(text.encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append(f"{name}:{body['max_tokens']}")
                delay = delays.pop(0) if body["max_tokens"] == tokens else 0.0
                self.send_response(200)
                self.end_headers()
                for i in range(0, body["max_tokens"], per_chunk):
                    time.sleep(delay)
                    ids = list(range(i, min(i + per_chunk, body["max_tokens"])))
                    if per_chunk > 1:
                        engine.drafts, engine.accepted = engine.drafts + 1, engine.accepted + len(ids) - 1
                    self.wfile.write(f"data: {json.dumps({'choices': [{'token_ids': ids}]})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_one_request_point_runs_each_engine_twice_a_b_b_a_and_pools_them():
    """One request's point is what the figures rule reads (a verify step contains a plain step), and engines run one
    after the other: a load that rose during the pair would make the second engine look slow. At N = 1 each engine
    runs twice, A B B A, pooled; at N > 1 once each. The load here falls, then rises: the first pair alone reads a
    step of τ 2 at 0.4 plain steps (withheld); pooled, (20 + 80) ÷ (50 + 10) = 1.67."""
    import threading

    calls: list[str] = []
    # Per-chunk delays in run order: plain 50 ms, spec 20 ms (2 tokens), spec 80 ms, plain 10 ms; then N = 2.
    plain = _Engine(1, [0.050, 0.010, 0.02, 0.02], calls, "plain")
    spec = _Engine(2, [0.020, 0.080, 0.04, 0.04], calls, "spec")
    targets = (load.Target(load.PLAIN, plain.url, "m"), load.Target("vllm_ngram", spec.url, "m", {"method": "ngram"}))
    points = list(load.points(targets[0], [targets[1]], [[1, 2, 3]] * 2, [1, 2], 8, threading.Event(), timeout_s=10))
    assert [c for c in calls if c.endswith(":8")] == ["plain:8", "spec:8", "spec:8", "plain:8"] + ["plain:8"] * 2 + ["spec:8"] * 2
    one = {p["row"]: p for p in points if p["n"] == 1}
    assert {p["n"] for p in points} == {1, 2} and len(one) == 2
    assert [q["prompt"] for q in one["vllm_ngram"]["requests"]] == [0, 0]  # two runs of one request, pooled
    assert one["vllm_ngram"]["tau"] == pytest.approx(2.0) and one["vllm_ngram"]["moments"]["n"] == 6
    first = load.speedups(points, "vllm_ngram")[0]
    assert first["n"] == 1 and 1.3 < first["step_cost"] < 2.2, first
    assert first["reach"] >= 1.0 and load_tab.note({"points": points}).startswith("**vLLM ngram")
    for e in (plain, spec):
        e.server.shutdown()


def test_a_one_request_step_under_its_plain_step_is_withheld_unless_its_spread_reaches_it():
    """The figures rule with the step times' spread, as the Run tab reads its race: a bursty plain run (a few slow
    steps) whose interval reaches one plain step is read at the bound; steady steps with the same mean are withheld."""
    def point(row, steps, tau):
        spt = sum(s for _, s in steps) / sum(t for t, _ in steps)
        return {**pt(row, 1, 1 / spt, spt, tau), "tau_streamed": tau, "moments": traces.moments(steps)}

    steady_spec = [(2, 0.016)] * 8 + [(2, 0.018)] * 8  # a step of 17 ms, τ 2
    bursty_plain = [(1, 0.010)] * 12 + [(1, 0.070)] * 4  # mean 25 ms: the step reads 0.68 plain steps
    steady_plain = [(1, 0.024), (1, 0.026)] * 8  # the same mean, steady
    bursty = load_tab.note({"points": [point(load.PLAIN, bursty_plain, 1.0), point("vllm_ngram", steady_spec, 2.0)]})
    assert "costs 1.00 plain steps: 2.00× per request" in bursty, bursty
    assert bursty.count("at N = 1") == 2 and "grew" not in bursty  # one N: said once (its head and its step)
    steady_points = [point(load.PLAIN, steady_plain, 1.0), point("vllm_ngram", steady_spec, 2.0)]
    steady = load_tab.note({"points": steady_points})
    assert "N=1: - per request (time per token), - tokens/s (all requests), tau 2.00 (No speedup shown: at N = 1 a verify " \
           "step measured 0.68 plain steps" in load.format_lines(steady_points)  # the bench's lines alike
    assert [t.y for t in charts.load_sweep({"points": steady_points}).data[:2]] == [(None,), (None,)]  # nor drawn
    assert steady.startswith("**No speedup shown: at N = 1 a verify step") and "0.68 plain steps (its spread reaching 0.7" in steady
    recorded = json.loads(json.dumps(load.document({"points": [
        {**point(load.PLAIN, bursty_plain, 1.0), "requests": []}, {**point("vllm_ngram", steady_spec, 2.0), "requests": []}]})))
    assert load_tab.note(load.parse(recorded)) == bursty  # a recording keeps what the rule reads
