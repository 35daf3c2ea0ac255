"""The Train tab: the seed workflow in the browser. Medusa heads or an EAGLE module are trained on the frozen
model through the service (a training run is a build of its store, service/training.py), the loss is drawn as
it falls, the run ends with its acceptance check, and the result is offered to the Run tab by name.

Pure helpers first (the controls' values -> the service's TrainConfig data, the verdict line, the table rows,
the status lines), then the tab itself. Nothing here touches tensors or paths: runs are named trained:<id>.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app.modes import MODES, ConfigError
from app.service.api import TRAINING_OFF, ModelError, Service, TrainingTimeout
from app.service.training import KINDS, PREFIX, STAGES, TrainConfig, shipped_answers
from app.ui import charts
from app.ui.controls import QUIET, Number, Slider, finite
from app.ui.sessions import Sessions, session_of, visitor_of
from app.ui.settings import SHIPPED

# The tab's controls, by TrainConfig field, in the order they are made (the one the /train endpoint takes).
FIELDS = ("kind", "init_from", "data_source", "data_offset", "data_limit", "epochs", "lr", "eval_prompts",
          "medusa_num_heads", "medusa_num_layers", "eagle_steps", "eagle3", "max_len", "answer_tokens", "dtype")
KIND_LABELS = {m.artifact: m.artifact_label for m in MODES if m.artifact in KINDS}  # what each kind of training run makes
# A CPU answers about one ShareGPT prompt a second at 256 new tokens, batched (assets/defaults/README.md: ~17 min
# per 1000): said before a run that must generate, so nobody waits blind.
ANSWER_S = 1.0 / 256

INTRO = """\
### Train draft heads on the frozen model (the seed workflow)
ModelOpt's speculative-decoding example at this model's scale. The target model stays **frozen**:
1. **Answers**: it answers ShareGPT prompts itself (*self-distillation*: the heads learn the text the model
   really writes). The answers to conversations {shipped} ship with the app: those need no generation.
2. **Reads**: it reads every conversation once; its hidden states are cached under `engines/data/`.
3. **Trains**: the heads learn to predict its next tokens from those states. Medusa: one small head per
   position ahead. EAGLE: one decoder layer that predicts the next hidden state, then the token.
4. **Checks**: τ (tokens per target pass) on Spec-Bench prompts, next to what the heads it started from measured.

The result is kept under `engines/builds/` and offered in the Run tab (Medusa / EAGLE → heads). The same
settings give the same run (seeds are fixed): then it is reused, not trained again. One run at a time per
server; while one runs, generations share the CPU with it.
"""


def public_note(service: Service) -> str:
    """What this server allows a visitor to train, said before anything runs (public mode only)."""
    policy = service.policy
    if not policy.public:
        return ""
    if not policy.train:
        return f"**Training is off here:** {TRAINING_OFF}."
    caps = policy.train_caps
    return (f"**On this public server** a run is stopped after **{policy.train_time_limit_s:g} s** (the CPU is shared), "
            f"takes at most {caps.data_limit} conversations, {caps.epochs:g} epoch, max_len {caps.max_len}, "
            f"{caps.answer_tokens} answer tokens and {caps.eval_prompts} prompts for the τ check; one run at a time. "
            "Your runs are yours: other visitors do not see them, and they are listed only in this page (a reload "
            "starts afresh; the operator removes what is left).")


def config_from(values: dict[str, Any]) -> dict[str, Any]:
    """The service's TrainConfig data for the tab's control values (lr 0 or empty = the recipe's default).
    A value that is no number raises ConfigError naming its field."""
    def number(k: str, cast):
        value = values.get(k)
        if value in (None, ""):
            return TrainConfig.model_fields[k].default
        x = finite(value, k)
        return cast(x) if cast is float else int(x) if x == int(x) else x  # 2.5 conversations: the rules say so

    lr = number("lr", float) if values.get("lr") not in (None, "") else None
    return {"kind": values["kind"], "init_from": values.get("init_from") or SHIPPED, "data_source": values["data_source"],
            "data_offset": number("data_offset", int), "data_limit": number("data_limit", int),
            "epochs": number("epochs", float), "lr": lr if lr and lr > 0 else None,
            "eval_prompts": number("eval_prompts", int), "medusa_num_heads": number("medusa_num_heads", int),
            "medusa_num_layers": number("medusa_num_layers", int), "eagle_steps": number("eagle_steps", int),
            "max_len": number("max_len", int), "answer_tokens": number("answer_tokens", int), "dtype": values["dtype"],
            "eagle3": bool(values.get("eagle3", TrainConfig.model_fields["eagle3"].default))}


def check_message(service: Service, values: dict[str, Any], visitor: str | None = None) -> str:
    """The line under the controls: the service's verdict on the run, and what it will cost before it trains."""
    try:
        plan = service.train_plan(config_from(values), visitor)
    except (ConfigError, ModelError, ValueError) as err:
        return f"⚠ **Invalid:** {err}"
    if plan["ready"]:
        return f"✓ Valid · this exact run is done: **Train** shows `{PREFIX}{plan['id']}` at once"
    if plan["generate"]:
        minutes = plan["generate"] * int(values.get("answer_tokens") or 256) * ANSWER_S / 60
        return (f"✓ Valid · the model first writes **{plan['generate']}** answers for this slice (about {minutes:.0f} min "
                f"on a 2-core CPU; conversations {shipped_answers()} ship theirs)")
    return "✓ Valid · the answers for this slice are at hand: it starts with reading the conversations"


def artifact_choices(service: Service, kind: str, visitor: str | None = None) -> list[tuple[str, str]]:
    """The Run tab's choices of heads for `kind`: the shipped ones, then every finished run the visitor sees, newest first."""
    return [("shipped (assets/defaults)", SHIPPED)] + [(_run_label(m), PREFIX + m["id"]) for m in service.trained(kind, visitor)]


def start_choices(service: Service, kind: str, visitor: str | None = None) -> list[tuple[str, str]]:
    """Where a run of `kind` may start: the shipped heads, new ones, or any finished run of that kind (to go on)."""
    return [("the shipped heads (fine-tune)", SHIPPED), ("from scratch", "scratch")] + [
        ("go on from " + _run_label(m), PREFIX + m["id"]) for m in service.trained(kind, visitor)]


def _run_label(manifest: dict) -> str:
    source, train = manifest.get("source") or {}, manifest["spec"]["config"]["train"]
    tau = (source.get("eval") or {}).get("mean_accepted_tokens")
    return (f"trained {manifest['id'][:8]} · {train['data_limit']} conv. from {train['data_offset']}"
            + (f" · τ {tau:.2f}" if tau else "") + f" · {manifest['created'][:16].replace('T', ' ')}")


def trained_rows(manifests: list[dict]) -> list[list[Any]]:
    rows = []
    for m in manifests:
        s, t = m.get("source") or {}, m["spec"]["config"]["train"]
        tau = (s.get("eval") or {}).get("mean_accepted_tokens")
        rows.append([PREFIX + m["id"], KIND_LABELS.get(m["spec"]["mode"], m["spec"]["mode"]), t["init_from"],
                     f"{t['data_source']} {t['data_offset']}+{t['data_limit']}", t["epochs"], s.get("steps"),
                     None if s.get("last_loss") is None else round(s["last_loss"], 3),
                     None if tau is None else round(tau, 2), m["created"][:19].replace("T", " "), round(m["duration_s"])])
    return rows


TABLE_HEADERS = ["name", "what", "from", "data", "epochs", "steps", "last loss", "τ", "created (UTC)", "s"]


def progress_line(event: dict | None, elapsed: float) -> str:
    if event is None:
        return f"▶ Starting: loading the model… ({elapsed:.0f} s)"
    stage = STAGES.index(event["stage"]) + 1
    what = {"self-distil": "the model answers the prompts", "features": "the model reads the conversations",
            "train": "training the heads", "eval": "measuring τ on Spec-Bench prompts"}[event["stage"]]
    loss = f" · loss {event['loss']:.3f}" if event.get("loss") is not None else ""
    return f"▶ Step {stage} of {len(STAGES)}, {what}: {event['done']}/{event['total']}{loss} ({elapsed:.0f} s)"


def finished_line(manifest: dict) -> str:
    s = manifest.get("source") or {}
    name = f"`{PREFIX}{manifest['id']}`"
    what = KIND_LABELS.get(manifest["spec"]["mode"], manifest["spec"]["mode"])
    steps = s.get("steps") or 0
    line = (f"✓ **{what}** {name}: {steps} step{'' if steps == 1 else 's'}, loss {s.get('first_loss', 0):.3f} → "
            f"{s.get('last_loss', 0):.3f}")
    ev, before = s.get("eval"), s.get("start_eval")
    if ev:
        line += f" · **τ {ev['mean_accepted_tokens']:.2f}** on {ev['prompts']} Spec-Bench prompts ({ev['max_new_tokens']} tokens)"
        shared = sorted(set(ev.get("per_category") or {}) & set((before or {}).get("per_category") or {}))
        if shared:
            mean = lambda per: sum(per[c] for c in shared) / len(shared)  # noqa: E731
            line += (f"; over those categories τ averages {mean(ev['per_category']):.2f}, and the heads it started "
                     f"from averaged {mean(before['per_category']):.2f} in the same check when they were made")
    return line + ". Pick it in the Run tab under its mode's heads."


class TrainTab:
    """The tab's layout and handlers, around the Studio's service."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.sessions = Sessions()  # each page's training run, for its Stop
        # The downloads Gradio serves: one copy per run and format, replaced by a later export, gone with the tab.
        self._exports = Path(tempfile.mkdtemp(prefix="specdec-export-"))
        weakref.finalize(self, shutil.rmtree, self._exports, ignore_errors=True)

    def layout(self, run_heads: dict[str, gr.Dropdown]) -> None:
        """Build the tab inside the current Blocks context; `run_heads` are the Run tab's heads pickers per kind,
        whose choices a finished run refreshes."""
        d = TrainConfig.model_fields
        kind = d["kind"].default
        fast = self.service.fast_dtype()
        gr.Markdown(INTRO.format(shipped=shipped_answers()))
        if self.service.policy.public:
            gr.Markdown(public_note(self.service), elem_id="tr-public")
        c: dict[str, Any] = {}
        with gr.Row():
            c["kind"] = gr.Radio([(v, k) for k, v in KIND_LABELS.items()], value=kind, label="what to train", elem_id="tr-kind")
            c["init_from"] = gr.Dropdown(start_choices(self.service, kind), value=SHIPPED, allow_custom_value=False,
                                         label="start from", elem_id="tr-start")
            c["data_source"] = gr.Radio([("the model's own answers", "self"), ("ShareGPT's answers", "sharegpt")],
                                        value="self", label="data (data_source)", elem_id="tr-source")
        with gr.Row():
            # Numbers without precision: Gradio's rounding fails on NaN without a word; config_from says what is wrong.
            c["data_offset"] = Number(d["data_offset"].default, label="first ShareGPT conversation (data_offset)")
            c["data_limit"] = Number(d["data_limit"].default, label="conversations (data_limit)", elem_id="tr-limit")
            c["epochs"] = Number(d["epochs"].default, label="epochs")
            c["lr"] = Number(0, label="lr (0 = the recipe's default)")
            c["eval_prompts"] = Slider(0, 13, value=d["eval_prompts"].default, step=1,
                                          label="Spec-Bench prompts for the τ check (eval_prompts)")
        with gr.Accordion("Architecture (from scratch) and data details", open=False):
            with gr.Row():
                c["medusa_num_heads"] = Slider(1, 5, value=d["medusa_num_heads"].default, step=1, label="medusa_num_heads")
                c["medusa_num_layers"] = Slider(1, 3, value=d["medusa_num_layers"].default, step=1, label="medusa_num_layers")
                c["eagle_steps"] = Slider(1, 6, value=d["eagle_steps"].default, step=1,
                                             label="EAGLE: training-time test steps (eagle_steps)")
                c["eagle3"] = gr.Checkbox(d["eagle3"].default, label="EAGLE from scratch: EAGLE-3 (the layout engines load)",
                                          elem_id="tr-eagle3")
            with gr.Row():
                c["max_len"] = Number(d["max_len"].default, label="tokens kept per conversation (max_len)")
                c["answer_tokens"] = Number(d["answer_tokens"].default, label="answer_tokens (self-distilled)")
                c["dtype"] = gr.Radio(["bfloat16", "float32"], value=fast, label="dtype of the frozen model")
        check = gr.Markdown(check_message(self.service, {**{k: d[k].default for k in FIELDS if k in d}, "kind": kind,
                                                         "lr": 0, "dtype": fast}), elem_id="tr-check")
        with gr.Row():
            start = gr.Button("Train", variant="primary", elem_id="tr-run", interactive=self.service.policy.train)
            stop = gr.Button("Stop", variant="stop", elem_id="tr-stop")
        status = gr.Markdown("", elem_id="tr-status")
        plot = gr.Plot(charts.training_loss([]), label="Loss", elem_id="tr-loss")
        # A callable: each page load lists what that visitor sees (in public mode, a new page sees the operator's runs).
        table = gr.Dataframe(lambda: trained_rows(self.service.trained()), headers=TABLE_HEADERS, interactive=False,
                             elem_id="tr-table")
        with gr.Row():
            picked = gr.Textbox("", label="run to export (pick a row)", placeholder="trained:…", elem_id="tr-picked",
                                max_lines=1)
            export = gr.Button("Export the picked run for engines", elem_id="tr-export", size="sm")
            download = gr.File(label="for vLLM, TensorRT-LLM, SGLang (zip)", elem_id="tr-download", interactive=False)

        assert tuple(c) == FIELDS
        self.controls, self.check, self.status, self.plot, self.table = c, check, status, plot, table
        self.run_heads = run_heads
        # A set: the handlers receive {component: value}; the /train endpoint takes them in FIELDS order (their
        # creation order).
        inputs = set(c.values())
        # always_last: a move made while the last verdict is on its way is answered after it, not dropped (run_tab.py).
        gr.on([comp.input for comp in inputs if comp is not c["kind"]], self.verdict, inputs, check,
              trigger_mode="always_last", **QUIET)
        # Another kind starts from its own shipped heads: the choices and the verdict in one answer, so the
        # verdict never speaks of a start the other kind had.
        c["kind"].input(self.kind_changed, inputs, [c["init_from"], check], trigger_mode="always_last", **QUIET)
        table.select(self.show_run, None, [status, plot, picked], **QUIET)
        export.click(self.export, picked, download, api_name="train_export", show_progress="minimal", concurrency_id="train",
                     concurrency_limit=None)
        # A run waits only for another run (one at a time on the server), never for a generation's queue.
        start.click(self.train, inputs, [status, plot, table, check, c["init_from"], *run_heads.values()], api_name="train",
                    show_progress="hidden", concurrency_id="train", concurrency_limit=None)
        stop.click(self.stop, None, status, queue=False, api_name="train_stop")

    def values(self, data: dict) -> dict[str, Any]:
        """The control values, by TrainConfig field, of a handler's {component: value}."""
        return {k: data[c] for k, c in self.controls.items()}

    def verdict(self, data: dict, request: gr.Request) -> str:
        return check_message(self.service, self.values(data), visitor_of(request))

    def kind_changed(self, data: dict, request: gr.Request):
        """The starts a run of the new kind may take. The start is set back only when it was a run of the other kind:
        sent always, it would undo a start the user picked while this answer was on its way."""
        v, visitor = self.values(data), visitor_of(request)
        choices = start_choices(self.service, v["kind"], visitor)
        if v.get("init_from") in [value for _, value in choices]:
            return gr.update(choices=choices), check_message(self.service, v, visitor)
        v["init_from"] = SHIPPED
        return gr.update(choices=choices, value=SHIPPED), check_message(self.service, v, visitor)

    def show_run(self, event: gr.SelectData, request: gr.Request):
        """A row of the runs' table picked: that run's result and loss curve."""
        name = (event.row_value or [None])[0]
        manifest = self.service.training_run(name, visitor_of(request)) if isinstance(name, str) else None
        if manifest is None:
            return gr.skip(), gr.skip(), gr.skip()
        return finished_line(manifest), charts.training_loss((manifest.get("source") or {}).get("losses")), name

    def export(self, picked: str | None, request: gr.Request) -> str:
        """The picked run exported for engines, as a zip to download (a copy in the temporary directory, which
        Gradio serves from; the store may be anywhere)."""
        picked = (picked or "").strip()
        if not picked:
            raise gr.Error("Pick a finished run in the table first.", duration=None)
        try:
            made = self.service.export_trained(picked, visitor=visitor_of(request))
        except (ConfigError, ModelError, ValueError) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        copy = self._exports / re.sub(r"[^A-Za-z0-9_-]", "_", picked)[:80] / made.name
        if not copy.is_file() or copy.stat().st_mtime < made.stat().st_mtime:
            copy.parent.mkdir(exist_ok=True)
            shutil.copyfile(made, copy)
        return str(copy)

    def train(self, data: dict, request: gr.Request):
        """Run the training (in a thread; this generator only draws), drawing the loss as it falls."""
        v = self.values(data)
        visitor = visitor_of(request)
        try:
            config = config_from(v)
            self.service.train_config(config, visitor)
        except (ConfigError, ModelError, ValueError) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        session = session_of(request)
        cancel = threading.Event()
        events: list[dict] = []
        result: dict[str, Any] = {}

        def work():
            try:
                result["manifest"] = self.service.train(config, events=events.append, cancel=cancel, visitor=visitor)
            except Exception as err:  # shown to the user below; nothing escapes the thread
                result["error"] = err

        worker = threading.Thread(target=work, daemon=True)
        started = time.monotonic()
        worker.start()
        with self.sessions.running(session, SimpleNamespace(cancel=cancel.set)):
            try:
                while worker.is_alive():
                    worker.join(0.75)
                    losses = [e["loss"] for e in events if e["stage"] == "train"]
                    yield {self.status: progress_line(events[-1] if events else None, time.monotonic() - started),
                           self.plot: charts.training_loss(losses)}
            finally:
                if worker.is_alive():  # the page went away mid-run: stop it, free the CPU
                    cancel.set()
        if "error" in result:
            err = result["error"]
            if isinstance(err, TrainingTimeout):
                line = f"◷ Stopped: {err} (cached data stays: a new run resumes from it)."
            elif cancel.is_set():
                line = "■ Stopped: the run was ended before it finished (cached data stays: a new run resumes from it)."
            else:
                line = f"⚠ {self.service.relative(str(err))}"
            yield {self.status: line}
            return
        manifest = result["manifest"]
        losses = (manifest.get("source") or {}).get("losses") or [e["loss"] for e in events if e["stage"] == "train"]
        yield {self.status: finished_line(manifest), self.plot: charts.training_loss(losses),
               self.table: trained_rows(self.service.trained(visitor=visitor)), self.check: check_message(self.service, v, visitor),
               self.controls["init_from"]: gr.update(choices=start_choices(self.service, v["kind"], visitor)),
               **{picker: gr.update(choices=artifact_choices(self.service, k, visitor)) for k, picker in self.run_heads.items()}}

    def stop(self, request: gr.Request) -> Any:
        if self.sessions.cancel(session_of(request)) is None:
            return "No training run of yours is under way."
        return gr.skip()  # the run says itself that it stopped

    def visitor_left(self, request: gr.Request) -> None:
        """The page closed (Gradio's unload): its run, if any, stops and frees the CPU."""
        self.sessions.cancel(session_of(request))


