"""The Compare tab: one prompt through several modes, one after another, with a settings preset and greedy decoding;
speed, tokens per target step and whether each output equals autoregressive decoding's, and the race replayed side
by side. Each row's speedup is over an autoregressive run on its engine kind raced with it in one job. Before anything
runs, every row is estimated (its runs' tokens at the pace measured here, else a 2-core CPU's, and the vLLM engines it
must start): a comparison over the server's time limit is refused in words, since it would start no row after it.
Handlers return {component: value}."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.modes import ConfigError
from app.modes import Modes
from app import traces
from app.service.api import ModelError, Service
from app.traces import Recording
from app.ui import charts, lessons, render, settings
from app.ui.controls import QUIET, Slider, dtype_radio, examples_dropdown
from app.ui.sessions import Sessions
from app.ui.streams import clock, paced, session_of, skippable, stop, stream, ticks, with_waiting


def vllm_compared(modes: Modes) -> tuple[str, ...]:
    """Where vLLM is installed, the same jobs on its engines (their speedup is over vLLM's plain engine, run just before;
    the plain engine's own row is over this app's autoregressive run)."""
    return tuple(lessons.ENGINE_PREFIX + m.name for m in modes if m.vllm_compare)


# What a comparison's estimate assumes (before it starts, and for the rows still to run):
# seconds per generated token where this page has measured none yet in the dtype: an autoregressive run's on the 2-core
# CPU the shipped recordings were made on (76 ms in float32), rounded up;
UNMEASURED_TOKEN_S = 0.08
# a run's prefill, its turn in the queue, its redraws and, the first time, loading what its mode drafts with (measured
# on a 2-core CPU under the test suite's load: 1–4 s);
RUN_OVERHEAD_S = 2.5
# a vLLM engine's start when it is not running: 1–3 minutes (vllm/processes.py Processes.ensure says so as it starts one).
ENGINE_START_S = 120.0


@dataclass(frozen=True)
class Row:
    """One ticked row of a comparison, as estimated before it runs."""

    name: str  # a mode, a merged tree (eagle+prompt_lookup) or a vLLM row (vllm:eagle)
    runs: int  # its generations: its own, and its baseline's unless it is an autoregressive row
    starts: tuple[str, ...]  # the vLLM engines it starts first (rows' names: vllm:eagle, vllm:autoregressive)
    seconds: float


def estimate(names: list[str], tokens: int, token_s: float, running: Callable[[str], bool]) -> list[Row]:
    """Each row's seconds, in the order a comparison runs them: `tokens` per run at `token_s` seconds a token plus
    RUN_OVERHEAD_S, and ENGINE_START_S for each vLLM engine it is the first to need that is not `running` (a vLLM
    row needs its own and, for its baseline, vLLM's plain engine)."""
    rows, started = [], set()
    for name in names:
        on_vllm = name.startswith(lessons.ENGINE_PREFIX)
        mode = name.removeprefix(lessons.ENGINE_PREFIX)
        base = (lessons.ENGINE_PREFIX if on_vllm else "") + "autoregressive"
        # Every row races its own baseline (Service.race): on this app's loop step by step, on vLLM back to back.
        runs = 1 if mode == "autoregressive" else 2
        needs = (name, base) if on_vllm and mode != "autoregressive" else (name,) if on_vllm else ()
        starts = tuple(dict.fromkeys(e for e in needs if e not in started and not running(e)))
        started.update(starts)
        rows.append(Row(name, runs, starts, runs * (RUN_OVERHEAD_S + tokens * token_s) + len(starts) * ENGINE_START_S))
    return rows


def measured_token_s(records: Mapping[str, Any] | None, dtype: str) -> float | None:
    """Seconds per token of the autoregressive run on this app's loop among a comparison's `records` (gr.State: a
    name's Recording.record()) in `dtype`, after its prefill, by the loop's clock; None when there is none."""
    record = records.get("autoregressive") if isinstance(records, Mapping) else None
    if not isinstance(record, Mapping) or record.get("dtype") != dtype:
        return None
    spent = traces.decoding(record.get("events") if isinstance(record.get("events"), list) else None)
    return spent["seconds"] / spent["tokens"] if spent and spent["tokens"] > 0 else None


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def pace_words(token_s: float, measured: bool) -> str:
    said = "measured on this page's last comparison" if measured else "nothing measured on this page yet: a 2-core CPU's"
    return f"{1000 * token_s:.0f} ms a token ({said})"


def row_words(row: Row, modes: Modes) -> str:
    engines = [("its vLLM engine" if e == row.name else "vLLM's plain engine for its baseline") for e in row.starts]
    started = f", starting {' and '.join(engines)}" if engines else ""
    runs = "its run and its baseline's" if row.runs == 2 else "one run"
    return f"{lessons.label(row.name, modes)} ≈ {duration(row.seconds)} ({runs}{started})"


def refusal(rows: list[Row], tokens: int, token_s: float, measured: bool, limit_s: float, modes: Modes) -> str | None:
    """Why a comparison of `rows` does not start, in words, with what would fit; None when its estimate is within
    `limit_s` (a comparison starts no new row after the server's time limit: a row left over would never run)."""
    total = sum(r.seconds for r in rows)
    if total <= limit_s:
        return None
    fixed = sum(r.runs * RUN_OVERHEAD_S + len(r.starts) * ENGINE_START_S for r in rows)
    per_token = sum(r.runs for r in rows) * token_s
    fits = int((limit_s - fixed) / per_token) // 8 * 8 if per_token > 0 and fixed < limit_s else 0
    starting = [r for r in rows if r.starts]
    ways = []
    if starting:
        ways.append("untick the vLLM rows whose engines are not running ("
                    + ", ".join(lessons.label(r.name, modes) for r in starting)
                    + "), or start their engines first: one keeps running after a Run on the vLLM backend with the "
                    "same settings, or after Build on the Engines tab")
    if fits >= 8:
        ways.append(f"lower max_new_tokens to {fits} or fewer")
    ways.append("untick some rows")
    engines = f" and {duration(ENGINE_START_S)} per vLLM engine start" if starting else ""
    return (f"**Not started:** the {len(rows)} rows (autoregressive and the {len(rows) - 1} ticked) need about "
            f"{duration(total)} here at {tokens} tokens each, over the server's time limit for one comparison "
            f"({limit_s:g} s), after which it starts no new row. Estimated at "
            f"{pace_words(token_s, measured)}, {RUN_OVERHEAD_S:g} s more per run{engines}: "
            + " · ".join(row_words(r, modes) for r in rows) + ". To compare within it: " + "; or ".join(ways) + ".")


def summary_row(mode: str, run: Recording, baseline: Recording | None, modes: Modes) -> dict[str, Any]:
    t = run.events[-1]["totals"] if run.events else {}
    tps = t.get("new_tokens", 0) / t["elapsed_s"] if t.get("elapsed_s") else 0.0
    base = baseline.events[-1]["totals"] if baseline is not None and baseline.events else None
    base_tps = base["new_tokens"] / base["elapsed_s"] if base and base.get("elapsed_s") else None
    parts = traces.speedup_parts(run.events, baseline.events, (run.pass_note, baseline.pass_note)) \
        if baseline is not None else None
    # A ratio measured under other load than its baseline's, or above what its τ allows, is left out, and says why.
    # Only a step's own doubt (`step_doubt`) withholds the ratio after the prefill and the step time; a whole-run ratio
    # above τ (a cheaper prefill) withholds the whole-run figure alone.
    step_doubt = parts["doubt"] if parts else None
    doubt = step_doubt or (parts["overall_doubt"] if parts else None)
    speedup = (parts.get("overall") if parts else tps / base_tps) if base_tps and not doubt else None  # at most τ (figures)
    return {"mode": lessons.label(mode, modes), "tokens_per_s": tps, "speedup": speedup, "doubt": doubt,
            "step_doubt": step_doubt, "decoding_speedup": parts["decoding"] if parts and not step_doubt else None,
            "load": parts["load"] if parts else None, "step_cost": parts["step_cost"] if parts else None,
            "decoding_tau": parts["tau"] if parts else None,
            "tau": parts["tau"] if parts else t.get("tokens_per_step"), "acceptance_rate": (t["accepted"] / t["drafted"]) if t.get("drafted") else None,
            "identical": None if baseline is None else run.token_ids == baseline.token_ids,
            "new_tokens": t.get("new_tokens", 0), "elapsed_s": t.get("elapsed_s")}


def curves(runs: dict[str, Recording], modes: Modes) -> dict[str, list[dict]]:
    return {lessons.label(m, modes): r.events for m, r in runs.items()}


class CompareTab:
    """The Compare tab of one Service: `layout()` builds it, the methods are its handlers."""

    def __init__(self, service: Service, sessions: Sessions) -> None:
        self.service = service
        self.modes = service.registry
        self.sessions = sessions

    def layout(self, shown_examples: list[tuple[str, str]]) -> None:
        service = self.service
        gr.Markdown("One prompt through several modes, one after another, with the chosen settings of each mode "
                    "and greedy decoding: speed, tokens per target step, and whether the output is identical to "
                    "autoregressive decoding (always in float32; in bfloat16 outputs can part after a while).")
        self.compared = gr.State({})  # the last comparison's runs, for its race replay
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=3, value=shown_examples[0][1], elem_id="cmp-prompt")
                example = examples_dropdown(shown_examples, "cmp-examples", prompt)
                # Under the prompt, not under the settings column (every mode's box, two radios): in the first
                # screenful at 1440x900, as the Run tab's Run is.
                with gr.Row():
                    run_btn = gr.Button("Compare", variant="primary", elem_id="compare-run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                    replay_btn = gr.Button("Replay the race side by side", elem_id="compare-replay")
                self.status = gr.Markdown("", elem_id="cmp-status")  # beside the button it answers
            with gr.Column(scale=2):
                offered = [m for m in self.modes.names + self.modes.merged if m != "autoregressive"]
                if service.available("vllm").available:
                    offered += vllm_compared(self.modes)
                modes = gr.CheckboxGroup([(lessons.label(m, self.modes), m) for m in offered],
                                         value=self.ticked(), label="Modes (autoregressive always runs)",
                                         elem_id="cmp-modes")
                tokens = Slider(8, 256, value=64, step=8, label="max_new_tokens", elem_id="cmp-tokens")
                preset = gr.Radio(list(settings.PRESETS), value=settings.PRESETS[0], label="settings", elem_id="cmp-preset",
                                  info=settings.presets_note(service.fast_dtype()))
                dtype = dtype_radio(service, "cmp-dtype")
        self.table = gr.HTML(render.summary_table([]), elem_id="cmp-table")
        # The race gets the page's width (a legend of every mode beside it), the other two half each.
        self.race = gr.Plot(charts.race_runs({}), label="Race", elem_id="cmp-race")
        with gr.Row():
            self.bars = gr.Plot(charts.compare([]), label="Speedup", elem_id="cmp-speedup")
            self.tau = gr.Plot(charts.tau_vs_cost([]), label="τ vs step time", elem_id="cmp-tau-cost")

        example.change(lambda t: t or gr.update(), example, prompt, **QUIET)
        preset.change(lambda name: settings.preset(name, service.fast_dtype(), self.modes)["dtype"], preset, dtype, **QUIET)
        run_btn.click(self.compare, [prompt, modes, tokens, dtype, preset, self.compared],
                      [self.table, self.race, self.bars, self.tau, self.status, self.compared], api_name="compare",
                      show_progress="hidden", concurrency_id="generate")
        stop_btn.click(self.stop, None, self.status, queue=False, api_name="compare_stop")
        replay_btn.click(self.replay_race, self.compared, [self.race, self.status], api_name="compare_replay",
                         show_progress="hidden", concurrency_limit=None)

    def ticked(self) -> list[str]:
        """The modes a fresh page ticks (Mode.compared)."""
        return [m.name for m in self.modes if m.compared]

    def stop(self, request: gr.Request) -> str:
        return stop(self.sessions, request)

    def compare(self, prompt: str, modes: list[str], max_new_tokens: float, dtype: str, preset: str, request: gr.Request,
                compared: dict | None = None):
        """Every ticked row, estimated first and refused in words when the estimate is over the server's time limit;
        `compared`: the page's last comparison (its autoregressive run's pace is this machine's, measured)."""
        session = session_of(request)
        backend = self.service.default_backend(self.ticked()[0])  # the backend a fresh page's modes run on
        # `preset` is one of the radio's choices (Gradio refuses others); the dtype radio has the last word.
        try:
            overrides = dict(settings.preset(preset, self.service.fast_dtype(), self.modes), max_new_tokens=max_new_tokens,
                             backend=backend, dtype=dtype or "auto")
            settings.to_request("autoregressive", {**settings.defaults(self.modes), **overrides}, self.modes)
        except ConfigError as err:
            raise gr.Error(str(err), duration=None) from None
        compared_names = self.modes.names + self.modes.merged + vllm_compared(self.modes)
        chosen = ["autoregressive"] + [m for m in compared_names if m in (modes or []) and m != "autoregressive"]
        available = {m["mode"]: m for m in self.service.modes(backend=backend)}
        engine = {m["mode"]: m for m in self.service.modes(backend="vllm")}
        notes = []
        ready = []
        for name in chosen:
            state = (engine if name.startswith(lessons.ENGINE_PREFIX) else available)[self._mode(name, overrides)[0]]
            if state["available"]:
                ready.append(name)
            else:
                notes.append(f"{lessons.label(name, self.modes)} skipped: {state['reason']}")
        # Every row estimated before anything runs: a comparison starts no new row after the server's time limit, so
        # one that cannot finish within it is refused now, in words, instead of dropping its last rows unseen.
        limit = self.service.limits.time_limit_s
        tokens = int(overrides["max_new_tokens"])
        ran_dtype = self.service.dtype if overrides["dtype"] == "auto" else overrides["dtype"]
        measured = measured_token_s(compared, ran_dtype)
        token_s = measured or UNMEASURED_TOKEN_S
        planned = estimate(ready, tokens, token_s, lambda name: self._engine_running(name, overrides))
        refused = refusal(planned, tokens, token_s, measured is not None, limit, self.modes)
        if refused:
            yield {self.status: refused + ("" if not notes else " " + " ".join(notes))}
            return
        total = sum(r.seconds for r in planned)
        plan = (f"Estimated ≈ {duration(total)} of the server's {limit:g} s for one comparison, at "
                f"{pace_words(token_s, measured is not None)}: " + " · ".join(row_words(r, self.modes) for r in planned))
        yield {self.status: plan}
        runs: dict[str, Recording] = {}
        rows: list[dict[str, Any]] = []
        started = time.monotonic()
        # One request holds the CPU for at most twice the time limit (as a raced run does): no new row after one. The
        # estimate keeps a comparison inside it; a machine slower than estimated still meets this bound, and every row
        # it leaves out is named.
        deadline = started + limit
        skipped = []
        for i, row in enumerate(planned):
            name = row.name
            label = lessons.label(name, self.modes)
            on_vllm = name.startswith(lessons.ENGINE_PREFIX)
            mode, values = self._mode(name, overrides)
            base_name = (lessons.ENGINE_PREFIX if on_vllm else "") + "autoregressive"
            # The row again, with this comparison's own pace once its autoregressive run has one, against what is left.
            token_s = measured_token_s({k: r.record() for k, r in runs.items()}, ran_dtype) or token_s
            seconds = row.runs * (RUN_OVERHEAD_S + tokens * token_s) + len(row.starts) * ENGINE_START_S
            left = deadline - time.monotonic()
            if seconds > left:
                skipped.append(f"{label} (≈ {duration(seconds)}, {max(0.0, left):.0f} s left)")
                continue
            where = (f"row {i + 1} of {len(planned)}, ≈ {duration(seconds)}; {time.monotonic() - started:.0f} s so far "
                     f"of ≈ {duration(total)}")
            # Each row's speedup is over an autoregressive run on the same engine kind under the same load, raced with
            # it in one job (Service.race): on this app's loop step by step, on vLLM back to back, its plain engine's
            # run first. A baseline made at another time (an earlier row's), or on another engine, would date the
            # ratio or measure the engine. An autoregressive row is the baseline itself: no ratio.
            baseline = None
            if mode != "autoregressive":
                base_values = {**settings.mode_values("autoregressive", self.modes, **overrides)[1],
                               **({"backend": "vllm"} if on_vllm else {})}
                baseline = Recording(base_name, settings.to_request("autoregressive", base_values, self.modes), prompt)
            run = runs[name] = Recording(name)

            def draw(part: Recording, name=name, baseline=baseline, label=label, where=where) -> dict:
                current = rows + [summary_row(name, part, baseline, self.modes)]
                return {self.table: render.summary_table(current), self.race: charts.race_runs(curves(runs, self.modes)),
                        self.bars: charts.compare(current), self.tau: charts.tau_vs_cost(current),
                        self.status: with_waiting(f"Running {label} ({where})…", part)}

            data = settings.to_request(mode, values, self.modes)
            yield from paced(stream(self.service, self.sessions, session, data, prompt, run, baseline), draw)
            if run.end and run.end.get("finish_reason") == "cancelled":
                notes.append("■ Stopped.")
                break
            rows.append(summary_row(name, run, baseline, self.modes))
        if skipped:
            notes.append(f"Skipped, not started: {', '.join(skipped)}: a comparison starts no new row after the server's "
                         f"time limit ({limit:g} s), and these would have run past it (this machine ran slower than "
                         "estimated).")
        ran_in = next((f" in {r.dtype}" for r in runs.values() if r.dtype), "")
        spent = f" in {duration(time.monotonic() - started)} (estimated ≈ {duration(total)})"
        done = ("Done" + spent + ". " + " ".join(notes) if notes
                else f"Done{spent}: every mode ran the same prompt with the same settings{ran_in}, one after another, each "
                     "raced step by step with an autoregressive run on this app's loop, or a vLLM row back to back with "
                     "one on vLLM's plain engine (its speedup's baseline).")
        records = {name: run.record() for name, run in runs.items() if run.events}
        yield {self.table: render.summary_table(rows), self.race: charts.race_runs(curves(runs, self.modes)),
               self.bars: charts.compare(rows), self.tau: charts.tau_vs_cost(rows), self.status: done, self.compared: records}

    def _mode(self, name: str, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A row's mode and control values (a vLLM row's on the vLLM backend)."""
        mode, values = settings.mode_values(name.removeprefix(lessons.ENGINE_PREFIX), self.modes, **overrides)
        if name.startswith(lessons.ENGINE_PREFIX):
            values["backend"] = "vllm"
        return mode, values

    def _engine_running(self, name: str, overrides: dict[str, Any]) -> bool:
        """Whether a vLLM row's engine runs now (a row that cannot be built into an engine counts as not running: its
        run says why)."""
        mode, values = self._mode(name, overrides)
        try:
            request = self.service.request(settings.to_request(mode, values, self.modes))
            return self.service.engine_running(request.backend, self.service.engine_id(request, self.service.model))
        except (ConfigError, ModelError, ValueError, OSError):
            return False

    def replay_race(self, records: dict, request: gr.Request):
        """The last comparison's race again, every mode on one clock from one start, as if they had run side
        by side (they ran one after another); Stop skips to the end."""
        runs = {name: Recording.from_record(r) for name, r in (records or {}).items()}
        if not runs:
            raise gr.Error("Nothing to replay yet: compare first.")
        lines = curves(runs, self.modes)
        total = max(clock(r.events)[-1] for r in runs.values())
        with skippable(self.sessions, request) as skip:
            for now in ticks(total, skip):
                yield charts.race_runs(lines, until=now), f"▶ Replaying the race side by side: {now:.1f} s of {total:.1f} s"
        yield charts.race_runs(lines, until=total), "Replayed the race: every mode on one clock, from one start."
