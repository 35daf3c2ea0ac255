"""The Compare tab: one prompt through several modes, one after another, with a settings preset and greedy decoding;
speed, tokens per target step and whether each output equals autoregressive decoding's, and the race replayed side
by side. Each row's speedup is over an autoregressive run on its engine kind made just before it. Handlers return
{component: value}."""

from __future__ import annotations

import time
from typing import Any

import gradio as gr

from app.modes import ConfigError
from app.modes import Modes
from app.service import traces
from app.service.api import Service
from app.service.traces import Recording
from app.ui import charts, lessons, render, settings
from app.ui.controls import QUIET, Slider, dtype_radio, examples_dropdown
from app.ui.sessions import Sessions
from app.ui.streams import clock, paced, session_of, skippable, stop, stream, ticks, with_waiting


def vllm_compared(modes: Modes) -> tuple[str, ...]:
    """Where vLLM is installed, the same jobs on its engines (their speedup is over vLLM's plain engine, run just before;
    the plain engine's own row is over this app's autoregressive run)."""
    return tuple(lessons.ENGINE_PREFIX + m.name for m in modes if m.vllm_compare)


def summary_row(mode: str, run: Recording, baseline: Recording | None, modes: Modes) -> dict[str, Any]:
    t = run.events[-1]["totals"] if run.events else {}
    tps = t.get("new_tokens", 0) / t["elapsed_s"] if t.get("elapsed_s") else 0.0
    base = baseline.events[-1]["totals"] if baseline is not None and baseline.events else None
    base_tps = base["new_tokens"] / base["elapsed_s"] if base and base.get("elapsed_s") else None
    parts = traces.speedup_parts(run.events, baseline.events, (run.pass_note, baseline.pass_note)) \
        if baseline is not None else None
    # A ratio measured under other load than its baseline's, or above what its τ allows, is left out, and says why.
    doubt = (parts["doubt"] or parts["overall_doubt"]) if parts else None
    return {"mode": lessons.label(mode, modes), "tokens_per_s": tps,
            "speedup": tps / base_tps if base_tps and not doubt else None, "doubt": doubt,
            "load": parts["load"] if parts else None, "step_cost": parts["step_cost"] if parts else None,
            "decoding_tau": parts["tau"] if parts else None,
            "tau": t.get("tokens_per_step"), "acceptance_rate": (t["accepted"] / t["drafted"]) if t.get("drafted") else None,
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
                example = examples_dropdown(shown_examples, "cmp-examples")
            with gr.Column(scale=2):
                offered = [m for m in self.modes.names + self.modes.merged if m != "autoregressive"]
                if service.backends["vllm"].availability().available:
                    offered += vllm_compared(self.modes)
                modes = gr.CheckboxGroup([(lessons.label(m, self.modes), m) for m in offered],
                                         value=["prompt_lookup", "lookahead"], label="Modes (autoregressive always runs)",
                                         elem_id="cmp-modes")
                tokens = Slider(8, 256, value=64, step=8, label="max_new_tokens", elem_id="cmp-tokens")
                preset = gr.Radio(list(settings.PRESETS), value=settings.PRESETS[0], label="settings", elem_id="cmp-preset",
                                  info=settings.presets_note(service.fast_dtype()))
                dtype = dtype_radio(service, "cmp-dtype")
        with gr.Row():
            run_btn = gr.Button("Compare", variant="primary", elem_id="compare-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="compare-stop")
            replay_btn = gr.Button("Replay the race side by side", elem_id="compare-replay")
        self.status = gr.Markdown("", elem_id="cmp-status")
        self.table = gr.HTML(render.summary_table([]), elem_id="cmp-table")
        # The race gets the page's width (a legend of every mode beside it), the other two half each.
        self.race = gr.Plot(charts.race_runs({}), label="Race", elem_id="cmp-race")
        with gr.Row():
            self.bars = gr.Plot(charts.compare([]), label="Speedup", elem_id="cmp-speedup")
            self.tau = gr.Plot(charts.tau_vs_cost([]), label="τ vs step time", elem_id="cmp-tau-cost")

        example.change(lambda t: t or gr.update(), example, prompt, **QUIET)
        preset.change(lambda name: settings.preset(name, service.fast_dtype(), self.modes)["dtype"], preset, dtype, **QUIET)
        run_btn.click(self.compare, [prompt, modes, tokens, dtype, preset],
                      [self.table, self.race, self.bars, self.tau, self.status, self.compared], api_name="compare",
                      show_progress="hidden", concurrency_id="generate")
        stop_btn.click(self.stop, None, self.status, queue=False, api_name="compare_stop")
        replay_btn.click(self.replay_race, self.compared, [self.race, self.status], api_name="compare_replay",
                         show_progress="hidden", concurrency_limit=None)

    def stop(self, request: gr.Request) -> str:
        return stop(self.sessions, request)

    def compare(self, prompt: str, modes: list[str], max_new_tokens: float, dtype: str, preset: str, request: gr.Request):
        session = session_of(request)
        backend = self.service.default_backend("lookahead")
        # `preset` is one of the radio's choices (Gradio refuses others); the dtype radio has the last word.
        try:
            overrides = dict(settings.preset(preset, self.service.fast_dtype(), self.modes), max_new_tokens=max_new_tokens,
                             backend=backend, dtype=dtype or "auto")
            settings.to_request("autoregressive", {**settings.defaults(self.modes), **overrides}, self.modes)
        except ConfigError as err:
            raise gr.Error(str(err), duration=None) from None
        compared = self.modes.names + self.modes.merged + vllm_compared(self.modes)
        chosen = ["autoregressive"] + [m for m in compared if m in (modes or []) and m != "autoregressive"]
        available = {m["mode"]: m for m in self.service.modes(backend=backend)}
        engine = {m["mode"]: m for m in self.service.modes(backend="vllm")}
        runs: dict[str, Recording] = {}
        rows: list[dict[str, Any]] = []
        notes = []
        last: tuple[str, Recording] | None = None  # the run made last, and its name: a baseline right before the next row
        # One request holds the CPU for at most twice the time limit (as a raced run does): no new mode after one.
        deadline = time.monotonic() + self.service.limits.time_limit_s
        for name in chosen:
            if time.monotonic() > deadline:
                notes.append(f"⏱ {lessons.label(name, self.modes)} and the rest were skipped: a comparison starts no new mode after "
                             f"the server's time limit ({self.service.limits.time_limit_s:g} s).")
                break
            on_vllm = name.startswith(lessons.ENGINE_PREFIX)
            mode, values = settings.mode_values(name.removeprefix(lessons.ENGINE_PREFIX), self.modes, **overrides)
            if on_vllm:
                values["backend"] = "vllm"
            state = (engine if on_vllm else available)[mode]
            if not state["available"]:
                notes.append(f"{lessons.label(name, self.modes)} skipped: {state['reason']}")
                continue
            # Each row's speedup is over an autoregressive run on the same engine kind, made just before it under the
            # same load (our loop's, or vLLM's plain engine for a vLLM row): one baseline for all would date the others.
            base_name = (lessons.ENGINE_PREFIX if on_vllm else "") + "autoregressive"
            baseline = None
            if mode != "autoregressive":
                if last is not None and last[0] == base_name:
                    baseline = last[1]
                else:
                    base_values = {**settings.mode_values("autoregressive", self.modes, **overrides)[1],
                                   **({"backend": "vllm"} if on_vllm else {})}
                    baseline = Recording(base_name)
                    status = (f"Running {lessons.label(name, self.modes)}'s baseline ({lessons.label(base_name, self.modes)}, "
                              "just before it, under the same load)…")
                    base_data = settings.to_request("autoregressive", base_values, self.modes)
                    yield from paced(stream(self.service, self.sessions, session, base_data, prompt, baseline),
                                     lambda part, status=status: {self.status: with_waiting(status, part)})
                    if baseline.end and baseline.end.get("finish_reason") == "cancelled":
                        notes.append("⏹ Stopped.")
                        break
            elif name != "autoregressive":
                baseline = runs.get("autoregressive")  # vLLM's plain engine against this app's loop
            run = runs[name] = Recording(name)

            def draw(part: Recording, name=name, baseline=baseline) -> dict:
                current = rows + [summary_row(name, part, baseline, self.modes)]
                return {self.table: render.summary_table(current), self.race: charts.race_runs(curves(runs, self.modes)),
                        self.bars: charts.compare(current), self.tau: charts.tau_vs_cost(current),
                        self.status: with_waiting(f"Running {lessons.label(name, self.modes)}…", part)}

            data = settings.to_request(mode, values, self.modes)
            yield from paced(stream(self.service, self.sessions, session, data, prompt, run), draw)
            if run.end and run.end.get("finish_reason") == "cancelled":
                notes.append("⏹ Stopped.")
                break
            rows.append(summary_row(name, run, baseline, self.modes))
            last = (name, run)
        ran_in = next((f" in {r.dtype}" for r in runs.values() if r.dtype), "")
        done = ("Done. " + " ".join(notes) if notes
                else f"Done: every mode ran the same prompt with the same settings{ran_in}, one after another, each right "
                     "after an autoregressive run on its engine (its speedup's baseline).")
        records = {name: run.record() for name, run in runs.items() if run.events}
        yield {self.table: render.summary_table(rows), self.race: charts.race_runs(curves(runs, self.modes)),
               self.bars: charts.compare(rows), self.tau: charts.tau_vs_cost(rows), self.status: done, self.compared: records}

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
