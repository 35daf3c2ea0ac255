"""The Run tab: one prompt through one mode, drawn step by step, raced against autoregressive decoding; replays of
recorded traces, the tour of every mode, the step inspector, presenter mode, and links to a setup.

Its settings are generated from the mode registry (app/ui/settings.py reads each entry's `controls`): a mode added
to the registry gets its group of controls here with no edit. Handlers take and return {component: value}.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from app.modes import ConfigError
from app.modes import MERGED_SUFFIX, MODES, Control, Modes
from app.modes import configs
from app import traces
from app.service.api import Checked, ModelError, Service
from app.traces import Recording, TraceError
from app.ui import charts, explain, lessons, links, presenter, render, settings
from app.ui.controls import QUIET, Number, Slider, dtype_radio, examples_dropdown
from app.ui.sessions import Sessions
from app.ui.streams import paced, replayed, session_of, skippable, stop, stream
from app.ui.train_tab import artifact_choices

RECORDINGS_DIR = Path(__file__).resolve().parents[2] / "assets" / "traces"
RECORDINGS = tuple(sorted(p.stem for p in RECORDINGS_DIR.glob("*.json")))
DEFAULT_MODE = "prompt_lookup"  # the Run tab's mode on a fresh page
# A fresh page's prompt: its answer copies the prompt, so the first Run shows prompt lookup earning. The counter-example
# is Spec-Bench's writing prompt: a new text, nothing to copy, nothing gained.
FIRST_PROMPT = ("Correct the spelling mistakes in this paragraph and return the whole corrected paragraph: The quick "
                "brown fox jumpd over the lazy dog. The dog was not amused, and it barkd loudly at the fox, who ran "
                "away into the forrest. Later that day the fox came back and apologised to the dog.")
COUNTER_EXAMPLE = 81  # Spec-Bench question id: a travel blog post
WHY_FIRST = ("<small><b>Why this prompt:</b> the answer copies the paragraph it was given, so prompt lookup finds the "
             "text that comes next in the prompt and the target accepts several tokens per pass. The counter-example "
             "asks for new text: nothing to copy, so prompt lookup drafts little, the target rejects most of it, and "
             "the run goes no faster than plain decoding.</small>")
WHY_COUNTER = ("<small><b>Why this prompt:</b> it asks for new text (a travel blog post): nothing in the prompt to "
               "copy, so prompt lookup drafts little, the target rejects most of it, and the run goes no faster than plain "
               "decoding. A mode that guesses (a draft model, Medusa, EAGLE) drafts here all the same.</small>")


def why_prompt(prompt: str, counter: str) -> str:
    """The note beside the prompt: why the page's first prompt or the counter-example shows what it shows; nothing
    for any other prompt (a note about another text would mislead)."""
    return WHY_FIRST if prompt == FIRST_PROMPT else WHY_COUNTER if prompt == counter else ""


# Copy link: the server gives the query string; the browser adds its own address (a proxy's or a Space's, which
# the server cannot know) and copies it where the page may use the clipboard.
COPY_LINK_JS = """(q) => {
  const url = location.origin + location.pathname + (q ? '?' + q : '');
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""
# The tour's order for the shipped modes (a mode not listed follows, in the registry's order).
def tour_modes(modes: Modes = MODES) -> list[str]:
    """The tour's order: the entries' (Mode.tour), then every other mode and merged tree of `modes`."""
    return modes.tour()


def tour_stops(modes: Modes = MODES) -> list[str]:
    """The shipped recording of each mode that has one (the first by name), in tour order."""
    return [next(n for n in RECORDINGS if n.split("-")[0] == mode) for mode in tour_modes(modes)
            if any(n.split("-")[0] == mode for n in RECORDINGS)]


def recording_why(name: str, modes: Modes) -> str:
    """What a mode's shipped recording shows, in one line (its explainer's; a merged tree's is its tree's)."""
    base, merged = modes.split(name)
    said = explain.of(base, modes)
    return said.recording_merged if merged else said.recording


def recording_path(name: str | None) -> str | None:
    """A shipped recording's file, by its menu name: the menu's names are the only paths this opens."""
    return str(RECORDINGS_DIR / f"{name}.json") if name in RECORDINGS else None


def recording_label(name: str, modes: Modes) -> str:
    """A shipped recording's menu entry, from its file name (mode-category-dtype)."""
    mode, category, dtype = (name.split("-") + ["", ""])[:3]
    return f"{lessons.label(mode, modes) if mode in modes else mode} · {category.replace('_', ' ')} ({dtype})"


def status_line(run: Recording, modes: Modes) -> str:
    label = f"**{lessons.label(run.mode, modes)}**" + (f" ({run.dtype})" if run.dtype else "")
    if run.engine:
        method = (run.engine.get("speculative_config") or {}).get("method")
        label += f" on vLLM {run.engine.get('version') or ''}".rstrip() + (f" (`{method}`)" if method else "")
    if not run.events:
        return f"{label}: {run.waiting or 'loading and prefilling…'}"
    line = render.totals_line(run.events[-1])
    if run.end is None:
        return f"{label} · {line}"
    reason = run.end.get("finish_reason")
    word = {"eos": "finished (end of sequence)", "stop": "finished (end of sequence or a stop word)",
            "length": "finished (max_new_tokens)", "cancelled": "■ stopped",
            "timeout": "◷ stopped by the time limit"}.get(reason, "finished")
    counters = render.spec_decode_line(run.spec_decode)
    where = f" · {render.esc(run.pass_note)}" if run.pass_note else ""
    return f"{label} {word} · {line}" + (f" · {counters}" if counters else "") + where


def against_recording(run: Recording, recorded: Recording, name: str) -> str:
    """Why a live run of a recording's own setup gave another τ than the recording ("" when τ and the tokens agree):
    what differs of dtype and pass, else the machine. Greedy outputs are the same only where every logit is: bfloat16
    rounds by its kernel (CPU, compiled or eager pass), so outputs part after a while and τ with them."""
    if not run.events or not recorded.events or run.request != recorded.request or run.prompt != recorded.prompt:
        return ""
    # τ after the prefill, as the status beside this note says it (render.totals_line): one τ on one status.
    taus = [(t["new_tokens"] - 1) / max(t["target_steps"] - 1, 1) for t in (r.events[-1]["totals"] for r in (run, recorded))]
    if run.token_ids == recorded.token_ids and round(taus[0], 2) == round(taus[1], 2):
        return ""
    differs = [f"{what}: {mine or '?'} here, {theirs or '?'} in the recording"
               for what, mine, theirs in (("dtype", run.dtype, recorded.dtype),
                                          ("pass", traces.pass_kind(run.pass_note), traces.pass_kind(recorded.pass_note)))
               if mine != theirs]
    where = "; ".join(differs) if differs else "the same dtype and pass, on another machine (its CPU's kernels)"
    same = next((i for i, (a, b) in enumerate(zip(run.token_ids, recorded.token_ids)) if a != b),
                min(len(run.token_ids), len(recorded.token_ids)))
    return (f"This run of {name}'s setup: τ {taus[0]:.2f} after the prefill against the recording's {taus[1]:.2f}, the outputs the same "
            f"for {same} tokens. What differs: {where}. A logit rounded otherwise changes a greedy token, and every "
            "draft after it.")


def modes_note(service: Service, backend: str) -> str:
    lines = []
    for m in service.modes(backend=backend):
        mark = "✓" if m["available"] else "✗"
        why = f" — {m['reason']}" if m["reason"] else ""
        lines.append(f"{mark} {service.registry.label(m['mode'])}{why}")
    return "<small>" + " · ".join(lines) + "</small>"


def check_message(service: Service, mode: str, v: dict[str, Any]) -> str:
    """The line shown under the controls: the service's verdict on these settings, before anything runs.
    Its marks (✓ ⚠ ✗) are text symbols, not emoji: a lecture-room Linux machine often has no emoji font."""
    info = {m["mode"]: m for m in service.modes(backend=v["backend"])}[mode]
    if not info["available"]:
        return f"✗ **{service.registry.label(mode)} is unavailable on {v['backend']}:** {info['reason']}"
    try:
        request = service.request(settings.to_request(mode, v, service.registry))
        engine = service.engine_note(request)
    except ConfigError as err:
        return f"⚠ **Invalid:** {err}"
    if engine is not None:
        return f"✓ Valid · {info['lossless']} · {engine}"
    c = request.speculative_config
    extra = ""
    if mode != "autoregressive":
        extra = f" · {explain.of(mode, service.registry).verify_note(c)}"
        if (pl := configs.merged(c)) is not None:
            extra += f" and up to **{configs.draft_tokens(pl)}** more from prompt lookup"
    if note := service.dtype_note(request.dtype):
        extra += f" · {note}"
    if service.runs_here(request.backend) and (note := service.pass_note(request.dtype)):
        extra += f" · {note}"
    # Said, not dropped silently: settings its engine has no field for (TensorRT-LLM's).
    extra += "".join(f" · ⚠ {n}" for n in service.notes(request))
    return f"✓ Valid · {info['lossless']}{extra}"


class RunTab:
    """The Run tab of one Service: `layout()` builds it inside the page's Blocks, the methods are its handlers."""

    def __init__(self, service: Service, sessions: Sessions, example_ids: dict[int, str]) -> None:
        self.service = service
        self.modes = service.registry  # the modes it offers (app/modes/)
        self.sessions = sessions
        self.example_ids = example_ids
        self.keys = settings.keys(self.modes)
        self.defaults = settings.defaults(self.modes)
        # Downloads: a folder per session, a file per mode, rewritten by the next run (Gradio serves a copy).
        self._traces = Path(tempfile.mkdtemp(prefix="specdec-traces-"))
        weakref.finalize(self, shutil.rmtree, self._traces, ignore_errors=True)

    # ------------------------------------------------------------------ values
    def values(self, data: dict) -> dict[str, Any]:
        """The control values, by name, of a handler's {component: value}."""
        return {k: data[c] for k, c in self.controls.items() if c in data}

    def page_defaults(self) -> dict[str, Any]:
        """The controls' values on a fresh page (the registry's defaults, with the choices only the server knows)."""
        drafts = self.service.drafts()
        return dict(self.defaults, **{c.key: drafts[0] if drafts else None for c in self._pickers("drafts")},
                    backend=self.service.default_backend(DEFAULT_MODE))

    def _pickers(self, *kinds: str) -> list[Control]:
        return [c for cs in settings.groups(self.modes).values() for c in cs
                if c.kind == "choice" and c.choices not in settings.STATIC_CHOICES and (not kinds or c.choices in kinds)]

    def artifact_pickers(self) -> dict[str, gr.Dropdown]:
        """The pickers of trained artifacts, by `train --mode` kind (the Train tab offers its runs in them)."""
        return {c.choices: self.controls[c.key] for c in self._pickers() if c.choices != "drafts"}

    # ------------------------------------------------------------------ layout
    def _widget(self, c: Control, value: Any):
        if c.kind == "slider":
            return Slider(c.minimum, c.maximum, value=value, step=c.step, label=c.label, elem_id=c.elem_id)
        if c.kind == "number":  # no precision: Gradio's rounding fails on NaN without a word; to_request says it
            return Number(value=value, label=c.label, step=c.step, elem_id=c.elem_id)
        if c.kind in ("checkbox", "merge"):
            return gr.Checkbox(value=bool(value), label=c.label, elem_id=c.elem_id)
        if c.kind == "text":
            return gr.Textbox(value=value, label=c.label, elem_id=c.elem_id)
        if c.choices in settings.STATIC_CHOICES:
            choices = list(settings.STATIC_CHOICES[c.choices])
        elif c.choices == "drafts":
            choices = self.service.drafts()
        else:
            choices = artifact_choices(self.service, c.choices)
        return gr.Dropdown(choices, value=value, allow_custom_value=False, label=c.label, elem_id=c.elem_id)

    def _settings_layout(self) -> None:
        d, service = self.page_defaults(), self.service
        c: dict[str, Any] = {}
        with gr.Accordion("Sampling and length", open=False):
            c["max_new_tokens"] = Slider(1, service.limits.max_new_tokens, value=d["max_new_tokens"], step=1, label="max_new_tokens")
            c["temperature"] = Slider(0, 2, value=d["temperature"], step=0.05, label="temperature (0 = greedy)")
            c["top_p"] = Slider(0.05, 1, value=d["top_p"], step=0.05, label="top_p")
            c["top_k"] = Slider(0, 100, value=d["top_k"], step=1, label="top_k (0 = off)")
            # No precision: Gradio's rounding fails on NaN without a word; to_request says what is wrong instead.
            c["seed"] = Number(value=d["seed"], label="seed (-1 = random)")
        self.groups: dict[str, gr.Group] = {}
        for name, controls in settings.groups(self.modes).items():
            entry = self.modes[name]
            with gr.Group(visible=name == DEFAULT_MODE) as self.groups[name]:
                gr.Markdown(entry.heading or f"**{entry.label}** (`{entry.config.__name__}`)")
                # Controls of one `row` (> 0) side by side, the others one under another, in their entry's order.
                for _, row in itertools.groupby(controls, key=lambda ctl: ctl.row or object()):
                    row = list(row)
                    with gr.Row() if len(row) > 1 else contextlib.nullcontext():
                        for ctl in row:
                            c[ctl.key] = self._widget(ctl, d[ctl.key])
        availability = service.availability()
        c["backend"] = gr.Dropdown(
            [(name if state.available else f"{name} (unavailable)", name) for name, state in availability.items()],
            value=d["backend"], label="Backend", elem_id="backend",
            info="; ".join(f"{n}: {s.reason}" for n, s in availability.items() if not s.available) or None,
        )
        c["dtype"] = dtype_radio(service, "dtype")
        assert tuple(c) == self.keys  # the /run_controls endpoint takes them in this order (creation order)
        self.controls = c

    def layout(self, shown_examples: list[tuple[str, str]]) -> None:
        """Build the tab inside the current gr.Tab, and its events."""
        service, modes = self.service, self.modes
        self.baselines = gr.State({})
        self.record = gr.State({})
        self.linked = gr.State(None)  # the recording a link asked to replay
        self.linked_run = gr.State(False)  # whether a link asked to run its setup on open
        with gr.Row():
            with gr.Column(scale=1, min_width=340, elem_id="controls-col"):
                self.prompt = gr.Textbox(label="Prompt", lines=5, value=FIRST_PROMPT, elem_id="prompt")
                # Run right under the prompt: in the first screenful at 1280x720, beside the status it changes.
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                    link_btn = gr.Button("Copy link", size="sm", elem_id="copy-link")
                link_box = gr.Textbox(label="Link to this setup (copied)", visible=False, elem_id="link", buttons=["copy"])
                # The tour: one mode's recording per click, at the lecturer's pace (Stop skips to a replay's end).
                self.tour_at = gr.State(0)  # the stop shown, from 1; 0 before the tour
                with gr.Row(visible=bool(tour_stops())):
                    # min_width 0: the three share the column's one line instead of wrapping
                    tour_btn = gr.Button("Tour: every mode, recorded", size="sm", elem_id="tour", scale=2, min_width=0)
                    tour_back = gr.Button("◀ previous stop", size="sm", elem_id="tour-back", scale=1, min_width=0)
                    tour_next = gr.Button("next stop ▶", size="sm", elem_id="tour-next", scale=1, min_width=0)
                with gr.Row():
                    why = gr.Markdown(WHY_FIRST, elem_id="prompt-why")
                    counter_btn = gr.Button("Counter-example: nothing to copy", size="sm", elem_id="counter-example",
                                            scale=0, min_width=200)
                example = self.examples = examples_dropdown(shown_examples, "examples", self.prompt)
                self._shown = {text for _, text in shown_examples}
                counter = self.example_ids[COUNTER_EXAMPLE]
                self.prompt.change(lambda p: why_prompt(p, counter), self.prompt, why, **QUIET)
                self.mode = gr.Radio([(m.label, m.name) for m in modes], value=DEFAULT_MODE, label="Decoding mode", elem_id="mode")
                note = gr.Markdown(modes_note(service, service.default_backend(DEFAULT_MODE)), elem_id="modes-note")
                with gr.Row():
                    presets = {name: gr.Button(f"Settings: {name}", size="sm", elem_id=f"preset-{name.split()[0]}")
                               for name in settings.PRESETS}
                gr.Markdown(f"<small>{settings.presets_note(service.fast_dtype())}</small>", elem_id="presets-note")
                # Made before the settings, shown after them: /run_controls takes prompt, mode, race, then the settings.
                self.race = gr.Checkbox(value=True, label="Race against autoregressive (its baseline measured beside it, under the same load)",
                                        render=False)
                self._settings_layout()
                self.race.render()
                self.check = gr.Markdown(check_message(service, DEFAULT_MODE, self.page_defaults()), elem_id="check")
                with gr.Accordion("Replay a recorded run", open=False, elem_id="replay"):
                    gr.Markdown("<small>A trace from <b>Download the trace</b> or <code>python -m app generate "
                                "--json</code>, drawn step by step as it ran, with the baseline it raced. No model "
                                "runs: it looks the same on any machine, busy or not.</small>")
                    self.recording = gr.Dropdown([(recording_label(n, modes), n) for n in RECORDINGS], value=None,
                                                 label="Recordings shipped with the app (2-core CPU)", elem_id="recordings",
                                                 visible=bool(RECORDINGS))
                    with gr.Row():
                        recording_btn = gr.Button("Replay the recording", size="sm", elem_id="replay-recording",
                                                  visible=bool(RECORDINGS))
                        upload = gr.UploadButton("Replay a trace file (JSON)…", file_types=[".json"], type="filepath",
                                                 size="sm", elem_id="replay-upload")
                    self.paced = gr.Checkbox(value=True, label="at the recorded pace (off: all at once)", elem_id="replay-paced")
                self.explain = gr.Markdown(lessons.explain(DEFAULT_MODE, modes), elem_id="learn-mode")
            with gr.Column(scale=2, elem_id="run-col"):
                # One bar, one line while presenting (presenter.CSS): it stays at the top of the screen while the page
                # scrolls to the inspected step, so the buttons are where the mouse left them.
                with gr.Row(elem_id="present-bar"):
                    self.present = gr.Checkbox(False, label="Presenter mode (large type; → and ← step through the run, "
                                               "space plays it)", elem_id="present", min_width=0)
                    with gr.Row(elem_id="presenter-row"):
                        back_btn = gr.Button("◀ step", size="sm", elem_id="step-back", min_width=0)
                        play_btn = gr.Button("play / pause", size="sm", elem_id="step-play", min_width=0)
                        next_btn = gr.Button("step ▶", size="sm", elem_id="step-next", min_width=0)
                        # The controls column is hidden while presenting: Run here, and C (or this button) shows them.
                        present_run = gr.Button("Run", size="sm", variant="primary", elem_id="present-run", min_width=0)
                        controls_btn = gr.Button("controls (C)", size="sm", elem_id="present-controls", min_width=0)
                        Number(value=1.5, label="seconds per step", minimum=0.2, maximum=30, step=0.1, interactive=True,
                               elem_id="pace", min_width=0)
                self.tour_note = gr.Markdown("", elem_id="tour-note")  # beside the stop's run, above its status
                self.status = gr.Markdown("Press **Run** to race the chosen mode against autoregressive decoding, or replay a recording below.", elem_id="status")
                self.view = gr.HTML(render.step_view([], {}), elem_id="step-view")
                self.step = Slider(0, 1, value=0, step=1, label="Inspect step", interactive=False, elem_id="step")
                self.detail = gr.HTML("", elem_id="step-detail")
                self.download = gr.DownloadButton("Download the trace (JSON)", value=None, interactive=False, size="sm",
                                                  elem_id="download-trace")
                # Rows: live while generating (race, tokens per pass); acceptance; speed. Empty charts at first, so the
                # browser loads Plotly before the first run instead of during it (on a 2-core machine that load slowed
                # the first run's own numbers about twofold).
                with gr.Row():
                    self.race_plot = gr.Plot(charts.race([], None, label=""), label="Race: tokens vs time", elem_id="race")
                    self.tps_plot = gr.Plot(charts.tokens_per_step([]), label="Tokens per target step", elem_id="tokens-per-step")
                with gr.Row():
                    self.hist_plot = gr.Plot(charts.tokens_per_step_hist([]), label="Tokens per step: histogram", elem_id="histogram")
                    self.depth_plot = gr.Plot(charts.acceptance_by_depth([]), label="Acceptance by draft depth", elem_id="acceptance-depth")
                with gr.Row():
                    self.speed_plot = gr.Plot(charts.throughput([]), label="Tokens/s", elem_id="throughput")
                    self.time_plot = gr.Plot(charts.timing([]), label="Draft vs verify time", elem_id="timing")
        # What a run or a replay updates, in the order the API returns them.
        self.outputs = [self.view, self.status, self.step, self.detail, self.race_plot, self.tps_plot, self.depth_plot,
                        self.hist_plot, self.speed_plot, self.time_plot, self.record, self.baselines, self.download]
        self.settings = [self.prompt, self.mode, *self.controls.values()]  # what a replay's settings set
        self._events(presets, example, note, run_btn, stop_btn, link_btn, link_box, recording_btn, upload,
                     (tour_btn, tour_back, tour_next), counter_btn, (back_btn, play_btn, next_btn, present_run, controls_btn))

    def _events(self, presets, example, note, run_btn, stop_btn, link_btn, link_box, recording_btn, upload, tour_buttons,
                counter_btn, step_buttons) -> None:
        service, c = self.service, self.controls
        inputs = set(c.values())
        # What the settings decide is shown: the service's verdict on them (before anything runs), which groups of
        # controls show, and the mode's explanation. A user's move (.input) redraws them; code that sets many controls
        # at once (a preset, a replay's settings) redraws them once after. Not on .change: the browser then sends one
        # request per changed control, some with the values half set, and answered out of order those left a
        # verdict on settings no longer shown.
        boxes = {c[k] for k in settings.merge_boxes(self.modes).values()}
        self.shown = [(self.verdict, {self.mode, *inputs}, self.check),
                      (self.visible, {self.mode, *boxes}, set(self.groups.values())),
                      (lambda m: lessons.explain(m, self.modes), [self.mode], self.explain)]
        # always_last: a move made while the answer to the one before is on its way is sent after it (Gradio's
        # default for .input, "once", drops it, and the verdict shown would be on settings no longer there).
        # A maximum's move (settings.FOLLOW) is answered by follow(): its request value and the verdict on both in one
        # answer (a verdict sent apart, on the request value before, could land last and stay shown).
        leads = {c[k]: k for k in settings.follows(self.modes)}
        for fn, ins, outs in self.shown:
            gr.on([comp.input for comp in ins if comp not in leads], fn, ins, outs, trigger_mode="always_last", **QUIET)
        for comp, key in leads.items():
            gr.on([comp.input], self._follower(key), {self.mode, *inputs}, {c[settings.FOLLOW[key]], self.check},
                  trigger_mode="always_last", **QUIET)
        for name, button in presets.items():
            self.redraw(button.click(lambda name=name: self.preset(name), None,
                                     {c[k] for k in settings.preset_keys(self.modes)}, **QUIET))
        c["backend"].change(lambda b: modes_note(service, b), c["backend"], note, **QUIET)
        example.change(lambda t: t or gr.update(), example, self.prompt, **QUIET)
        self._run_inputs = {self.prompt, self.mode, self.race, self.baselines, self.record, *inputs}
        run_evt = run_btn.click(self.run, self._run_inputs, self.outputs,
                                api_name="run_controls", show_progress="hidden", concurrency_id="generate")
        # gr.api, not an invisible event: an API-only endpoint typed by run_request's signature (one object),
        # with no hidden components in the page; it queues with the Run button (one concurrency group).
        gr.api(self.run_request, api_name="run", concurrency_id="generate")
        stop_btn.click(self.stop, None, self.status, queue=False, api_name="stop")
        # Replays use no model: their own queue, so one never waits behind a generation.
        # First the controls the trace ran with (so Run runs it again here), then the replay.
        replays = dict(show_progress="hidden", concurrency_limit=None)  # bounded by Sessions.replaying
        self.redraw(upload.upload(self.replay_settings, upload, self.settings, **QUIET)).then(
            self.replay, [upload, self.paced, self.baselines], self.outputs, api_name="replay", **replays)
        self.redraw(recording_btn.click(lambda name: self.replay_settings(recording_path(name)), self.recording,
                                        self.settings, **QUIET)).then(
            self.replay_recording, [self.recording, self.paced, self.baselines], self.outputs,
            api_name="replay_recording", **replays)
        # Only the user's moves: the run's own updates of the slider would each call inspect with the
        # record of the run before, and one answering late would blank the step the run just drew.
        # always_last: while one answer is pending, only the latest move is sent next, so quick ← → presses end on
        # the slider's step (answers of unqueued requests could land out of order and leave an older step shown).
        self.step.input(self.inspect, [self.step, self.record], [self.detail, self.race_plot, self.tps_plot], queue=False,
                        show_progress="hidden", api_name="inspect", trigger_mode="always_last")
        counter_btn.click(lambda: self.example_ids[COUNTER_EXAMPLE], None, self.prompt, **QUIET)
        for button, handler, name in zip(tour_buttons, (self.tour_start, self.tour_back, self.tour_next),
                                         ("tour", "tour_back", "tour_next")):
            self.redraw(button.click(handler, [self.paced, self.baselines, self.tour_at],
                                     [*self.outputs, *self.settings, self.explain, self.tour_note, self.tour_at],
                                     api_name=name, **replays))
        self.present.change(None, self.present, None, js=presenter.TOGGLE_JS, **QUIET)
        for button, js in zip(step_buttons, ("() => { window.sdStep(-1); }", "() => { window.sdPlay(); }",
                                             "() => { window.sdStep(1); }", "() => { document.querySelector('#run').click(); }",
                                             "() => { window.sdControls(); }")):
            button.click(None, None, None, js=js, **QUIET)
        link_btn.click(self.link, {self.mode, self.prompt, self.present, self.record, *inputs}, link_box, **QUIET).then(
            None, link_box, link_box, js=COPY_LINK_JS, **QUIET)
        del run_evt

    def redraw(self, event):
        """After `event` set the controls: the verdict, the groups shown and the explanation, once."""
        for fn, ins, outs in self.shown:
            event.then(fn, ins, outs, **QUIET)
        return event

    def open_on_load(self, demo: gr.Blocks, tabs: gr.Tabs, link_note: gr.Markdown) -> None:
        """A link opens the page set up as it says (then replays the recording it names)."""
        self.tabs, self.link_note = tabs, link_note
        self.redraw(demo.load(self.open_link, None, [tabs, *self.settings, self.present, link_note, self.recording,
                                                     self.linked, self.linked_run, self.examples], **QUIET)).then(
            self.replay_linked, [self.linked, self.paced, self.baselines], self.outputs, show_progress="hidden",
            concurrency_limit=None, api_visibility="private").then(
            # `run=1` (a link copied after a live run): Run, as the Run button does, once the setup is on the page.
            self.run_linked, {self.linked_run, *self._run_inputs}, self.outputs, show_progress="hidden",
            concurrency_id="generate", api_visibility="private")

    # ------------------------------------------------------------------ the settings shown
    def verdict(self, data: dict) -> str:
        return check_message(self.service, data[self.mode], self.values(data))

    def _follower(self, key: str):
        """The handler of a move of maximum `key`: the request value it carries (settings.follow) and the verdict."""
        def follow(data: dict) -> dict:
            v = self.values(data)
            carried = settings.follow(key, v, self.modes)
            v.update(carried)
            return {**{self.controls[k]: x for k, x in carried.items()}, self.check: check_message(self.service, data[self.mode], v)}
        return follow

    def visible(self, data: dict) -> dict:
        shown = settings.visible(data[self.mode], self.values(data), self.modes)
        return {group: gr.update(visible=shown[name]) for name, group in self.groups.items()}

    def preset(self, name: str) -> dict:
        return {self.controls[k]: v for k, v in settings.preset(name, self.service.fast_dtype(), self.modes).items()}

    # ------------------------------------------------------------------ run
    def stop(self, request: gr.Request) -> str:
        return stop(self.sessions, request)

    def run_linked(self, data: dict, request: gr.Request):
        """The Run a `run=1` link asked for on open; without one, every output stays as it is."""
        if not data[self.linked_run]:
            yield {self.status: gr.skip()}
            return
        yield from self.run(data, request)

    def run(self, data: dict, request: gr.Request):
        prompt, mode, race, baselines = data[self.prompt], data[self.mode], data[self.race], data[self.baselines]
        shown = data[self.record] if isinstance(data[self.record], dict) else {}
        recorded = shown.get("recording") if shown.get("recording") in RECORDINGS else None
        v = self.values(data)
        session = session_of(request)
        baseline: Recording | None = None
        try:  # every setting checked before anything runs: a bad one is one sentence, not a bare "Error"
            base_request = settings.to_request("autoregressive", v, self.modes)
            checked = self.service.check(settings.to_request(mode, v, self.modes), session)
        except ConfigError as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        baselines = baselines if isinstance(baselines, dict) else {}
        key = json.dumps([prompt, base_request], sort_keys=True)
        name = settings.run_name(mode, v, self.modes)
        run = Recording(name, settings.to_request(mode, v, self.modes), prompt)
        unraced = self.service.race_refusal(checked.request) if race and mode != "autoregressive" else None
        if race and mode != "autoregressive" and not unraced:
            # Measured with every run, never reused: a baseline timed under other load (a page left open while the
            # machine got busy) made ratios of 20x and more. Both in one job, stepped in turn (Service.race).
            baseline = Recording("autoregressive", base_request, prompt)
        yield from paced(stream(self.service, self.sessions, session, checked, prompt, run, baseline),
                         lambda part: self.outputs_of(part, baseline, status_line(part, self.modes), baselines, final=False))
        if baseline is not None and baseline.end and baseline.end.get("finish_reason") != "cancelled":
            baselines = {**baselines, key: baseline.record()}
        if mode == "autoregressive" and run.end and run.end.get("finish_reason") != "cancelled":
            baselines = {**baselines, key: run.record()}
        folder = self._traces / (re.sub(r"[^A-Za-z0-9_-]", "", session)[:40] or "local")
        folder.mkdir(exist_ok=True)
        trace = folder / f"specdec-{run.mode}-trace.json"
        trace.write_text(json.dumps(run.trace(baseline)))
        status = status_line(run, self.modes)
        if unraced:  # the box asked for a race this backend cannot run: the run ran alone, and says why
            status = f"{status}\n\nNo race: {unraced}."
        if recorded:  # Run right after a recording's replay: what makes this run differ from it, if it does
            said = against_recording(run, traces.read(recording_path(recorded), modes=self.modes)[0], recorded)
            status = f"{status}\n\n{said}" if said else status
        yield self.outputs_of(run, baseline, status, baselines, final=True, trace=str(trace))

    def _stream(self, session: str, data: dict[str, Any] | Checked, prompt: str, run: Recording):
        return stream(self.service, self.sessions, session, data, prompt, run)

    def run_request(self, request: dict[str, Any], session: gr.Request) -> Iterator[dict[str, Any]]:
        """Run one request object: the DecodeRequest JSON (as `generate --json` records it and `serve` takes in
        `specdec`: speculative_config, sampling, max_new_tokens, backend, dtype, trtllm_backend) plus `prompt`.
        Yields the trace as it grows; the last value is the whole trace, as `generate --json` prints it."""
        if not isinstance(request, dict):
            raise gr.Error("request must be an object: prompt plus the DecodeRequest fields (speculative_config, "
                           "sampling, max_new_tokens, backend, dtype)", duration=None)
        data = dict(request)
        prompt = data.pop("prompt", None)
        if not isinstance(prompt, str):
            raise gr.Error("request.prompt must be text: the user turn (the chat template is applied)", duration=None)
        if "mode" in data:  # the name the Run tab and the command line use; a request says it as a config's type
            raise gr.Error("a request names its mode in speculative_config.decoding_type (" + ", ".join(
                f"{m.decoding_type} = {m.name}" for m in self.modes) + "), not in 'mode'", duration=None)
        session_hash = session_of(session)
        try:
            checked = self.service.check(data, session_hash)
        except (ConfigError, ModelError) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        config = checked.request.speculative_config
        name = config.mode + MERGED_SUFFIX if configs.merged(config) is not None else config.mode
        run = Recording(name, data, prompt)
        for part in self._stream(session_hash, checked, prompt, run):
            # Through JSON, as `generate --json` prints it: Gradio sends a gr.api value as it is, and refuses the
            # token texts' int keys.
            yield json.loads(json.dumps(part.trace()))

    def outputs_of(self, run: Recording, baseline: Recording | None, status: str, baselines: dict, final: bool,
                   trace: str | None = None) -> dict:
        """What a run or a replay shows, as it stands."""
        events = run.events
        last = len(events) - 1
        history = [t for e in events[:-1] for t in e["tokens"]]
        if final and baseline is not None and run.mode != "autoregressive":
            versus = render.speedup_line(events, baseline.events, (run.pass_note, baseline.pass_note))
            status = f"{status}\n\n{versus}" if versus else status
        detail = render.step_detail(events[-1], run.texts, run.prompt_ids, history, run.mode, self.modes) if events else ""
        out = {
            self.view: render.step_view(events, run.texts),
            self.status: status,
            self.step: gr.update(maximum=max(last, 1), value=max(last, 0), interactive=final and last > 0),
            self.detail: detail,
            self.race_plot: charts.race(events, baseline.events if baseline else None, mode=run.mode,
                                        label=lessons.label(run.mode, self.modes), modes=self.modes),
            self.tps_plot: charts.tokens_per_step(events),
            self.baselines: baselines,
            self.download: gr.update(value=trace, interactive=trace is not None),
        }
        if final:  # The browser redraws every chart it is sent, on the cores the model runs on: while generating,
            # only the race and the per-step bars are live; the rest are drawn once at the end.
            out.update({self.depth_plot: charts.acceptance_by_depth(events, run.spec_decode),
                        self.hist_plot: charts.tokens_per_step_hist(events),
                        self.speed_plot: charts.throughput(events, mode=run.mode, modes=self.modes),
                        self.time_plot: charts.timing(events),
                        self.record: dict(run.record(), baseline=baseline.events if baseline else None)})
        return out

    def inspect(self, step: float, record: dict) -> tuple:
        """One step's detail, and the race and per-step charts with a cursor on it (they follow the step)."""
        if not record or not record.get("events"):
            return "", gr.skip(), gr.skip()
        events = record["events"]
        i = min(max(int(step), 0), len(events) - 1) if isinstance(step, (int, float)) and math.isfinite(step) else 0
        history = [t for e in events[:i] for t in e["tokens"]]
        try:  # a record is this session's own run or a checked trace; a shape that still slipped through gets words
            detail = render.step_detail(events[i], record["texts"], record["prompt_ids"], history, record.get("mode"), self.modes)
        except Exception as err:
            raise gr.Error(f"step {i} cannot be drawn ({type(err).__name__})") from None
        number = events[i].get("step", i)
        label = lessons.label(record["mode"], self.modes) if record.get("mode") else None
        return (detail, charts.race(events, record.get("baseline"), mode=record.get("mode"), label=label, cursor=number,
                                    modes=self.modes),
                charts.tokens_per_step(events, cursor=number))

    # ------------------------------------------------------------------ replay
    def replay(self, request: gr.Request, path: str | None, paced_: bool, baselines: dict):
        """Draw a recorded trace as if it ran now: at its recorded pace, the run and the baseline it raced
        side by side from one start (Stop skips to the end), or all at once."""
        if not path:
            return
        try:
            run, baseline = traces.read(path, modes=self.modes)
        except (TraceError, OSError) as err:
            raise gr.Error(f"cannot replay this file: {self.service.relative(str(err))}", duration=None) from None
        if run.mode is None:
            raise gr.Error("cannot replay this file: it does not say which mode made it", duration=None)
        try:  # parse checked every field the display reads; should a shape still slip through, say so in words
            for r in (run, baseline or run):
                render.step_view(r.events, r.texts)
                render.step_detail(r.events[-1], r.texts, r.prompt_ids, r.token_ids[: -len(r.events[-1]["tokens"]) or None], r.mode, self.modes)
        except Exception as err:
            raise gr.Error(f"cannot replay this file: it could not be drawn ({type(err).__name__})", duration=None) from None
        with skippable(self.sessions, request) as skip:
            if paced_:
                runs = [run] if baseline is None else [run, baseline]
                for parts in replayed(runs, skip):
                    yield self.outputs_of(parts[0], parts[1] if baseline else None,
                                          "▶ Replaying a recording · " + status_line(parts[0], self.modes), baselines, final=False)
        where = "⇥ Skipped to the end of the recording" if skip.is_set() else "Replayed a recording"
        yield self.outputs_of(run, baseline, f"{where} · {status_line(run, self.modes)}", baselines, final=True)

    def replay_settings(self, path: str | None) -> dict:
        """The prompt, mode and controls a trace ran with, so Run runs it again here; each left as it is
        where the trace does not say or the Run tab cannot express it (its replay says what is wrong)."""
        try:
            run, _ = traces.read(path, modes=self.modes) if path else (None, None)
        except (TraceError, OSError):
            return {self.prompt: gr.skip()}
        found = settings.from_request(run.request, self.modes) if run and run.request else None
        prompt = {self.prompt: run.prompt} if run and run.prompt else {}
        if found is None:
            return prompt or {self.prompt: gr.skip()}
        mode, v = found
        for c in self._pickers():  # a draft model or a run this server does not have
            if c.key in v and v[c.key] not in (self.service.drafts() if c.choices == "drafts" else
                                               {value for _, value in artifact_choices(self.service, c.choices)}):
                del v[c.key]
        if v["backend"] not in self.service.availability():
            del v["backend"]
        return {**prompt, self.mode: mode, **{self.controls[k]: x for k, x in v.items() if k in self.controls}}

    def replay_recording(self, request: gr.Request, name: str | None, paced_: bool, baselines: dict):
        """A recording shipped in assets/traces/, by its name in the menu. The record shown names it, so Copy link
        gives a link that replays it."""
        for out in self.replay(request, recording_path(name), paced_, baselines):
            if self.record in out:
                out[self.record] = {**out[self.record], "recording": name}
            yield out

    def replay_linked(self, request: gr.Request, name: str | None, paced_: bool, baselines: dict):
        """The recording a link named, after the page loaded; without one, every output stays as it is (an event
        that yields nothing would blank them)."""
        if name is None:
            yield {self.status: gr.skip()}
            return
        yield from self.replay_recording(request, name, paced_, baselines)

    def tour_start(self, request: gr.Request, paced_: bool, baselines: dict, at: Any):
        yield from self.tour(request, paced_, baselines, at, None)

    def tour_back(self, request: gr.Request, paced_: bool, baselines: dict, at: Any):
        yield from self.tour(request, paced_, baselines, at, -1)

    def tour_next(self, request: gr.Request, paced_: bool, baselines: dict, at: Any):
        yield from self.tour(request, paced_, baselines, at, 1)

    def tour(self, request: gr.Request, paced_: bool, baselines: dict, at: Any, move: int | None):
        """One stop of the tour (tour_modes): the first (move None), or the one before or after stop `at`. Its settings
        in the controls, its Learn paragraph, its note, its replay with the step narration."""
        stops = tour_stops(self.modes)
        at = at if isinstance(at, int) and 0 <= at <= len(stops) else 0
        i = 1 if move is None or at == 0 else min(len(stops), max(1, at + move))
        name = stops[i - 1]
        mode = name.split("-")[0]
        line = (f"**Tour {i}/{len(stops)}: {lessons.label(mode, self.modes)}** · "
                f"{recording_label(name, self.modes).split(' · ', 1)[1]} · {recording_why(mode, self.modes)}"
                + (" · next stop ▶ goes on" if i < len(stops) else " · the last stop"))
        extra = {**self.replay_settings(recording_path(name)), self.explain: lessons.explain(self.modes.split(mode)[0], self.modes),
                 self.tour_note: line, self.tour_at: i}
        for out in self.replay_recording(request, name, paced_, baselines):
            yield {**out, **extra}
            extra = {}

    # ------------------------------------------------------------------ links
    def open_link(self, request: gr.Request) -> dict:
        """The page's setup from its URL's query string (links.parse); what the link gets wrong, in a note."""
        query = dict(request.query_params) if request is not None else {}
        if not query:
            return {self.link_note: "", self.linked: None, self.linked_run: False}
        link = links.parse(query, self.page_defaults(), self.modes.names, self.example_ids, RECORDINGS, self._link_check,
                           self.modes.shorts())
        out = {self.controls[k]: x for k, x in link.values.items()}
        rerun = bool(link.run) and not link.replay
        said = ("This link runs its setup again on open: a link carries the settings, not the run it was copied after, "
                "so τ and the times are this machine's now." if rerun else "")
        out.update({self.link_note: " ".join(x for x in (said, link.note()) if x), self.linked: link.replay,
                    self.linked_run: rerun})
        for component, value in ((self.tabs, link.tab and gr.update(selected=link.tab)), (self.prompt, link.prompt),
                                 (self.mode, link.mode), (self.recording, link.replay), (self.present, link.present)):
            if value is not None and value != "":
                out[component] = value
        if link.replay:  # the page set up as the recording ran (mode, prompt, settings), so Run runs it again
            out.update(self.replay_settings(recording_path(link.replay)))
        if out.get(self.prompt) in self._shown:  # `example=241`: the menu shows which example it is
            out[self.examples] = out[self.prompt]
        return out

    def _link_check(self, mode: str, values: dict[str, Any]) -> str | None:
        try:
            self.service.request(settings.to_request(mode, values, self.modes))
        except (ConfigError, ValueError, TypeError) as err:
            return str(err)
        return None

    def link(self, data: dict) -> Any:
        """The query string of the Run tab's setup (the browser adds its own address and copies it); after a shipped
        recording's replay, one that replays it; after a run, one that runs it again on open (`run=1`)."""
        record = data[self.record] if isinstance(data[self.record], dict) else {}
        replayed = record.get("recording") if record.get("recording") in RECORDINGS else None
        return gr.update(value=links.build("run", data[self.mode], self.values(data), data[self.prompt] or "",
                                           self.page_defaults(), self.example_ids, DEFAULT_MODE, FIRST_PROMPT,
                                           present=bool(data[self.present]), replay=replayed,
                                           run=bool(record.get("events")), shorts=self.modes.shorts()), visible=True)
