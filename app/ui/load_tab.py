"""The Load tab: speculative decoding under concurrent load on vLLM engines (app/bench/load.py). A sweep sends N
requests at once to the plain engine and to the speculative engine of the same model and draws the speedup against
N, per request and in total throughput, with τ beside it and the crossover where speculation stops paying; a
sentence under the chart explains it from the measured numbers. Recorded sweeps (assets/load/) replay with no
engine running. This project's own verify loop runs one request at a time: its batch-1 point is drawn beside them."""

from __future__ import annotations

import html
import json
import re
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import gradio as gr

from app import figures, models
from app.modes import ConfigError, Modes
from app.bench import load
from app.service.api import ModelError, Service
from app.service.jobs import QueueFull
from app.ui import charts, lessons, settings
from app.ui.controls import Slider
from app.ui.sessions import Sessions
from app.ui.streams import REDRAW_S, prepared, session_of, skippable, stop, ticks

RECORDINGS_DIR = models.ROOT / "assets" / "load"
RECORDINGS = sorted(p.stem for p in RECORDINGS_DIR.glob("*.json"))
REPLAY_S = 20.0

INTRO = """\
Speculation spends spare compute to cut latency. At one request a verify pass over a few drafted tokens costs
little more than a one-token pass; an engine that batches concurrent requests fills that spare compute with other
requests' tokens, and at some number of requests speculation costs more than it saves. A sweep sends N requests at
once (distinct Spec-Bench prompts, greedy, float32) to vLLM's plain engine and to its speculative engine of the same
model, on this machine. **This app's own loop runs one request at a time (batch 1)**: its point is the star at N = 1."""


def _x(value: float) -> str:
    return f"{value:.2f}×"


def note(sweep: dict | None, row: str | None = None) -> str:
    """The sentence under the chart: where speculation stops paying, and why, from the measured numbers (τ, what a
    speculative step costs in plain steps, and how much the plain engine's throughput grew with N)."""
    points = (sweep or {}).get("points") or []
    row = row or next((p["row"] for p in points if p.get("row") != load.PLAIN), None)
    measured = load.speedups(points, row) if row else []
    method = html.escape((row or "").removeprefix("vllm_"))
    # figures (load.speedups): one request's verify step contains a plain step; a reading past that was timed under
    # changing load, and its sweep's figures are said, not printed. So is a growth past N requests' N times one's.
    withheld = next((r["doubt"] for r in measured if r["doubt"]), None)
    if withheld:
        return f"**{html.escape(figures.withheld(withheld))}** vLLM {method}: sweep again for its figures."
    rows = [r for r in measured if r["latency"] is not None and r["step_cost"] is not None]
    if not rows:
        return ""
    first, last = rows[0], rows[-1]
    growth = (last["plain_tokens_per_s"] / first["plain_tokens_per_s"]) if first["plain_tokens_per_s"] and last is not first else None
    past_n = bool(growth) and not figures.within(growth, last["n"] / first["n"])

    def at(r: dict) -> str:
        cost = max(r["step_cost"], 1.0) if r["n"] == 1 else r["step_cost"]  # load.speedups: taken at the bound
        return (f"at N = {r['n']} a verify step commits τ {r['tau']:.2f} tokens and costs {cost:.2f} plain "
                f"steps: {_x(r['latency'])} per request")

    spare = (f"the plain engine's throughput grew {growth:.1f}× from N = {first['n']} to N = {last['n']}: the batch "
             "filled the compute a verify pass had spare" if growth and not past_n else "")
    cross = load.crossover(rows, "latency")
    throughput = load.crossover(rows, "throughput")
    if cross["state"] == "crosses":
        head = f"vLLM {method} stops paying per request between N = {cross['last']} and N = {cross['at']}"
        by_at = {r["n"]: r for r in rows}
        body = f"{at(first)}; {at(by_at[cross['at']])}, while {spare}" if spare else f"{at(first)}; {at(by_at[cross['at']])}"
    elif cross["state"] == "never_pays":
        head = f"vLLM {method} does not pay per request even at N = {first['n']} here"
        body = f"{at(first)}: a verify step costs more plain steps than the tokens it commits"
    else:
        head = f"vLLM {method} still pays per request at N = {last['n']}, the largest N measured"
        body = (f"{at(first)}; {at(last)}" if last is not first else at(first)) + (f", while {spare}" if spare else "")
    tail = {"crosses": f" By total throughput it stops paying at N = {throughput.get('at')}.",
            "never_pays": " By total throughput it does not pay either.",
            "always_pays": f" By total throughput it pays up to N = {throughput.get('last')}."}.get(throughput["state"], "")
    if past_n:
        tail += (f" (No growth of the plain engine's throughput is read: from N = {first['n']} to N = {last['n']} it "
                 "measured more than that many requests can give, its first point timed under other load.)")
    return f"**{head}**: {body}.{tail}{ours_said((sweep or {}).get('ours'))}"


def ours_said(ours: dict | None) -> str:
    """The sentence on this app's own loop at batch 1 (load.our_point): its ratio after the prefill with its
    interval, or why none is shown."""
    if not isinstance(ours, dict):
        return ""
    if ours.get("speedup") and not ours.get("raced"):  # a recording made before the race: its whole-run ratio
        return f" This app's own loop, which runs one request at a time, made {_x(ours['speedup'])} at batch 1."
    if ours.get("speedup"):
        interval = ours.get("interval")
        spread = f" (95 % of the step times' spread: {_x(interval[0])}–{_x(interval[1])})" if interval else ""
        return (f" This app's own loop, which runs one request at a time, made {_x(ours['speedup'])} after the prefill at "
                f"batch 1{spread}, raced step by step against its autoregressive run.")
    if ours.get("doubt"):
        return f" This app's own loop at batch 1: {html.escape(figures.withheld(str(ours['doubt'])))}"
    return ""


def starting_line(mode: str | None, seconds: float, modes: Modes) -> str:
    """The status while a sweep starts its two vLLM engines (a first start takes minutes): which one, by `mode` (the
    speculative one's, or autoregressive for the plain one; None before either), and the seconds so far."""
    if mode is None:
        which = "the engines"
    elif mode == "autoregressive":
        which = "vLLM's plain engine (the baseline)"
    else:
        which = f"vLLM's {html.escape(lessons.label(mode, modes))} engine"
    return (f"Starting {which}: {seconds:.0f} s so far (a first start takes 1–3 minutes: vLLM loads the model and "
            "warms it up; a later sweep reuses both engines)…")


# The table's two τ: they differ when some steps draft nothing (an n-gram or suffix match not found), and the chart
# divides a step's time by the second.
TAU_COUNTERS = ("vLLM's spec-decode counters: 1 + accepted tokens ÷ drafting steps, tokens per step that drafted "
                "(1 for the plain engine)")
TAU_STEP = ("tokens per engine step as streamed: new tokens ÷ streamed chunks, every step, drafted or not "
            "(what the chart shows)")


def table(sweep: dict | None) -> str:
    """The sweep's points as an HTML table (numbers and known row names only)."""
    points = (sweep or {}).get("points") or []
    if not points:
        return ""

    def cell(value: Any, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    head = ("<tr><th>engine</th><th>N</th><th>tokens/s (all)</th><th>ms per token (per request)</th>"
            f"<th>first token (s)</th><th title='{html.escape(TAU_COUNTERS)}'>τ (counters)</th>"
            f"<th title='{html.escape(TAU_STEP)}'>τ per step</th>"
            "<th>identical</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(p['row'])}</td><td>{p['n']}</td><td>{cell(p.get('tokens_per_s'), '.1f')}</td>"
        f"<td>{cell(p['seconds_per_token'] * 1000 if p.get('seconds_per_token') else None, '.1f')}</td>"
        f"<td>{cell(p.get('ttft_s'), '.2f')}</td><td>{cell(p.get('tau'), '.2f')}</td><td>{cell(p.get('tau_streamed'), '.2f')}</td>"
        f"<td>{cell(p['identical_share'] * 100 if p.get('identical_share') is not None else None, '.0f')}%</td></tr>"
        for p in points)
    return (f"<table class='load-table'>{head}{body}</table>"
            f"<p class='load-table-note'><small>τ (counters): {html.escape(TAU_COUNTERS)}. τ per step: "
            f"{html.escape(TAU_STEP)}.</small></p>")


def about(sweep: dict | None) -> str:
    """What a sweep ran on, in one line."""
    s = sweep or {}
    parts = [s.get("model"), s.get("dtype"), f"vLLM {s['vllm']}" if s.get("vllm") else None, s.get("cpu"),
             f"{s['max_new_tokens']} new tokens a request" if s.get("max_new_tokens") else None, s.get("recorded")]
    return html.escape(" · ".join(str(p) for p in parts if p))


class LoadTab:
    """The Load tab of one Service: `layout()` builds it, the methods are its handlers."""

    def __init__(self, service: Service, sessions: Sessions) -> None:
        self.service = service
        self.modes: Modes = service.registry
        self.sessions = sessions
        self._files = Path(tempfile.mkdtemp(prefix="specdec-load-"))
        weakref.finalize(self, shutil.rmtree, self._files, ignore_errors=True)

    def layout(self) -> None:
        gr.Markdown(INTRO)
        offered = [m.name for m in self.modes if m.vllm and m.name != "autoregressive"]
        cap = load.allowed(self.service.policy)
        with gr.Row():
            with gr.Column(scale=2):
                first = "prompt_lookup" if "prompt_lookup" in offered else (offered or [None])[0]
                mode = gr.Radio([(lessons.label(m, self.modes), m) for m in offered], value=first,
                                label="Speculative mode on vLLM (against vLLM's plain engine)", elem_id="load-mode")
                ns = gr.Textbox(value=",".join(str(n) for n in load.DEFAULT_N if n <= cap), elem_id="load-ns",
                                label=f"Concurrent requests N (comma-separated, at most {cap} here)")
            with gr.Column(scale=2):
                tokens = Slider(8, 128, value=32, step=8, label="max_new_tokens per request", elem_id="load-tokens")
                ours = gr.Checkbox(value=True, label="Also run this app's own loop at batch 1 (the mode and autoregressive)",
                                   elem_id="load-ours")
        with gr.Row():
            run_btn = gr.Button("Run the sweep", variant="primary", elem_id="load-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="load-stop")
            recorded = gr.Dropdown([(n, n) for n in RECORDINGS], value=RECORDINGS[0] if RECORDINGS else None,
                                   label="Recorded sweeps (2-core CPU)", elem_id="load-recordings")
            replay_btn = gr.Button("Replay", elem_id="load-replay")
            upload = gr.UploadButton("Replay a downloaded sweep (JSON)…", file_types=[".json"], type="filepath",
                                     size="sm", elem_id="load-upload")
        self.status = gr.Markdown("", elem_id="load-status")
        self.plot = gr.Plot(charts.load_sweep(None), label="Speedup under load", elem_id="load-plot")
        self.note = gr.Markdown("", elem_id="load-note")
        self.table = gr.HTML("", elem_id="load-table")
        self.download = gr.DownloadButton("Download the sweep (JSON)", value=None, interactive=False, size="sm",
                                          elem_id="load-download")
        outputs = [self.plot, self.note, self.table, self.status, self.download]
        run_btn.click(self.run, [mode, ns, tokens, ours], outputs, api_name="load_sweep", show_progress="hidden",
                      concurrency_id="generate")
        stop_btn.click(self.stop, None, self.status, queue=False, api_name="load_stop")
        # Bounded by Sessions.replaying (a worded refusal past its limit), as the Run tab's replays are.
        replay_btn.click(self.replay, recorded, outputs, api_name="load_replay", show_progress="hidden",
                         concurrency_limit=None)
        upload.upload(self.replay_file, upload, outputs, api_name="load_replay_file", show_progress="hidden",
                      concurrency_limit=None)

    def stop(self, request: gr.Request) -> str:
        return stop(self.sessions, request)

    def _draw(self, sweep: dict, status: str, file: str | None = None) -> dict:
        return {self.plot: charts.load_sweep(sweep), self.note: note(sweep), self.table: table(sweep),
                self.status: status, self.download: gr.update(value=file, interactive=file is not None)}

    def run(self, mode: str, ns: str, max_new_tokens: float, ours: bool, request: gr.Request):
        session = session_of(request)
        if mode not in [m.name for m in self.modes]:
            raise gr.Error("choose a speculative mode")
        try:
            name, values = settings.mode_values(mode, self.modes, max_new_tokens=int(max_new_tokens), backend="vllm",
                                                dtype="auto")
            data = settings.to_request(name, values, self.modes)
        except ConfigError as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        engine: dict[str, str] = {}  # the mode of the engine being started, as load.submit tells it

        def sweep_job():
            return self.service.load_sweep(data, ns, int(max_new_tokens), ours=bool(ours), visitor=session,
                                           starting=lambda m: engine.update(mode=m))

        def waiting(seconds: float) -> dict:
            return {self.status: starting_line(engine.get("mode"), seconds, self.modes)}

        yield self._draw({}, starting_line(None, 0, self.modes))  # the last sweep's chart and table cleared
        try:
            job = yield from prepared(sweep_job, waiting)
        except (ConfigError, ModelError, QueueFull) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        sweep: dict[str, Any] = {"points": []}
        end: dict[str, Any] = {}
        with self.sessions.running(session, job):
            try:
                for batch in job.batches(REDRAW_S):
                    for message in batch:
                        if message["type"] == "point":
                            sweep["points"].append(message["point"])
                        elif message["type"] == "end":
                            end = message
                    if not end:
                        last = sweep["points"][-1] if sweep["points"] else None
                        where = f" (N = {last['n']}, {last['row']} done)" if last else ""
                        yield self._draw(sweep, f"Measuring{where}…")
            finally:
                job.cancel()
        if end.get("error"):
            raise gr.Error(f"the sweep failed: {self.service.relative(end['error'])}")
        recorded = end.get("sweep") or sweep
        file = self._write(session, recorded) if end.get("sweep") else None
        stopped = {"cancelled": "■ Stopped: the points measured so far. ",
                   "timeout": f"◷ Stopped by the server's time limit ({self.service.limits.time_limit_s:g} s). "}
        yield self._draw(recorded, stopped.get(end.get("finish_reason"), "") + f"Done: {about(recorded)}.", file)

    def _write(self, session: str, sweep: dict) -> str:
        folder = self._files / (re.sub(r"[^A-Za-z0-9_-]", "", session)[:40] or "local")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"load-{sweep.get('method', 'sweep')}.json"
        path.write_text(json.dumps(sweep, indent=1))
        return str(path)

    def replay(self, name: str, request: gr.Request):
        """A shipped sweep (assets/load/), replayed."""
        if name not in RECORDINGS:
            raise gr.Error("choose a recorded sweep")
        path = RECORDINGS_DIR / f"{name}.json"
        try:
            sweep = load.read(path)
        except (OSError, ConfigError) as err:
            raise gr.Error(str(err)) from None
        yield from self._replay(sweep, name, str(path), request)

    def replay_file(self, path: str | None, request: gr.Request):
        """A sweep downloaded from this tab (here or on another machine), replayed like a shipped one."""
        if not path:
            return
        try:
            sweep = load.read(path)
        except (OSError, ConfigError) as err:
            raise gr.Error(f"cannot replay this file: {self.service.relative(str(err))}", duration=None) from None
        yield from self._replay(sweep, "the uploaded sweep", None, request)

    def _replay(self, sweep: dict, name: str, file: str | None, request: gr.Request):
        """Its points drawn in the order and at the relative times they were measured, in REPLAY_S; Stop skips to
        the end."""
        points = sweep["points"]
        total = max([p.get("at_s") or 0.0 for p in points] + [0.0])
        # A sweep takes minutes; its points come far apart: REPLAY_S shows how they came without the wait.
        shown_s = min(total, REPLAY_S)
        with skippable(self.sessions, request) as skip:
            for tick in ticks(shown_s, skip):
                now = tick * total / shown_s if shown_s else total
                shown = {**sweep, "points": [p for p in points if (p.get("at_s") or 0.0) <= now]}
                yield self._draw(shown, f"▶ Replaying {html.escape(name)}: {now:.0f} s of {total:.0f} s")
        yield self._draw(sweep, f"Replayed {html.escape(name)}: {about(sweep)}.", file)


def shipped_notes() -> str:
    """What the shipped sweeps measured, one line each, for the Learn tab (empty without recordings)."""
    lines = []
    for name in RECORDINGS:
        try:
            sweep = load.read(RECORDINGS_DIR / f"{name}.json")
        except (OSError, ConfigError):
            continue
        if text := note(sweep):
            lines.append(f"- Measured on {about(sweep)}: {text}")
    return "\n".join(lines)
