"""The Engines tab: the service's builds (content-addressed directories under engines/builds/) with the state of their
vLLM servers and TensorRT-LLM workers, whether each engine can run here, a build or a TensorRT-LLM plan for the Run
tab's current mode and settings, stopping a server, and removal; and, while it runs, the build of the transformers
backend's fast pass (once per model, dtype and machine).
Handlers return {component: value}."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Any

import gradio as gr
from gradio.context import Context

from app.backends import registry
from app.modes import ConfigError
from app.modes.errors import one_line
from app.service.api import ModelError, Service
from app.ui import settings
from app.ui.controls import QUIET
from app.ui.render import esc
from app.ui.run_tab import RunTab
from app.ui.sessions import visitor_of

# Seven columns that fit a 1440 px window: mode and backend share one, so do a build's time and size; `settings`
# tells two builds of one mode and backend apart (two prompt lookup servers with other n-gram sizes).
HEADERS = ["build", "model", "mode · backend", "settings", "server", "created (UTC)", "took · size"]
COLUMN_WIDTHS = ["14%", "13%", "13%", "27%", "12%", "11%", "10%"]
PROGRESS_S = 5.0  # how often an open page redraws a fast pass build's progress (only while one runs)
# Config entries a row leaves out: said by another column (method, decoding_type), or a path or digest, not a setting.
UNSAID = {"method", "decoding_type", "model", "speculative_model_sha256", "versions", "build_config"}
OTHERS_LABEL = "Offer servers other processes started too (the CLI, a test, another app on this store)"
SERVED = ("vllm-server", "tensorrt-worker")  # the build kinds whose engine runs as a server of its own
ENGINES = {"vllm": "vLLM", "tensorrt_llm": "TensorRT-LLM"}


def _said(value: Any) -> str:
    """A config value in a table cell: a tree (a list of paths) by its size, a path by its last part."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        flat = all(not isinstance(v, (list, tuple, dict)) for v in value)
        return ",".join(map(str, value)) if flat and len(value) <= 4 else f"{len(value)} paths"
    if isinstance(value, str) and "/" in value:
        return PurePath(value).name
    return str(value)


def settings_text(spec: dict[str, Any]) -> str:
    """What a build was made with, beyond its model, mode and backend: the dtype, then its speculative config by the
    backend's own names (vLLM's num_speculative_tokens and prompt_lookup_max, TensorRT-LLM's max_window_size...)."""
    config = spec.get("config") or {}
    # A transformers build is the prepared model and artifact, loaded in whichever dtype a request asks for.
    parts = [str(config["dtype"])] if config.get("dtype") else ["any dtype"] if spec.get("backend") in registry.ANY_DTYPE else []
    speculative = config.get("speculative_config") or {}
    parts += [f"{k} {_said(v)}" for k, v in speculative.items() if k not in UNSAID and v is not None]
    if config.get("max_draft_len") is not None and "max_draft_len" not in speculative:
        parts.append(f"max_draft_len {config['max_draft_len']}")
    if "speculative_model" in config:  # None: the model's shipped artifact; its digest tells two artifacts apart
        digest = config.get("speculative_model_sha256")
        parts.append(f"speculative_model {_said(config['speculative_model'] or 'shipped')}"
                     + (f" ({str(digest)[:8]})" if digest else ""))
    if config.get("tensor_parallel_size", 1) != 1:
        parts.append(f"tensor_parallel_size {config['tensor_parallel_size']}")
    if config.get("trtllm_backend"):
        parts.append(f"trtllm_backend {config['trtllm_backend']}")
    return ", ".join(parts) or "—"


def elsewhere(manifest: dict[str, Any] | None) -> bool:
    """An engine's build whose server runs, started by another process (the CLI, a test, another app on the store)."""
    server = (manifest or {}).get("server") or {}
    return server.get("state") == "running" and not server.get("started_here")


def server_text(server: dict[str, Any] | None) -> str:
    """running (here or elsewhere, its port), loading (TensorRT-LLM's worker loads, or builds its engine), stopped."""
    if not server:
        return ""
    if server.get("state") != "running":
        return str(server.get("state", ""))
    port = server.get("port") or str(server.get("url", "")).rsplit(":", 1)[-1]
    return f"running {'here' if server.get('started_here') else 'elsewhere'} :{port}"


def engines_text(service: Service) -> str:
    """Whether each engine backend can start its servers here, and if not why, in the backend's own words."""
    availability = service.availability()
    return " · ".join(f"**{label}**: " + ("set up: a run starts its engine, listed below" if availability[name].available
                                          else esc(availability[name].reason))
                      for name, label in ENGINES.items())


def row(manifest: dict[str, Any]) -> list[Any]:
    spec = manifest["spec"]
    created = str(manifest.get("created", ""))[:16].replace("T", " ")
    size = sum(manifest.get("files", {}).values()) / 2**20
    return [manifest["id"], spec["model"], f"{spec['mode']} · {spec['backend']}", settings_text(spec),
            server_text(manifest.get("server")), created, f"{manifest.get('duration_s', 0):.1f} s · {size:.1f} MB"]


def clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if minutes < 10 and rest else f"{minutes} min"


def fast_pass_text(passes: list[dict[str, Any]]) -> str:
    """One line per fast pass of the server's model (Service.fast_passes): a build's stage, time so far and estimate
    while it runs, else which pass runs."""
    lines = []
    for p in passes:
        name = f"{esc(p['model'])} ({esc(p['dtype'])})"
        if p["state"] != "building":
            lines.append(f"Fast pass of {name}: {esc(p['note'])}")
            continue
        elapsed, estimate = p["elapsed_s"], p["estimate_s"]
        about = "typical on 2 cores" if p.get("estimated_from") == "typical" else "as long as the last build here"
        when = (f"{clock(elapsed)} so far of about {clock(estimate)} ({about})" if elapsed <= estimate
                else f"{clock(elapsed)} so far, longer than the {clock(estimate)} expected ({about}): a busy machine builds slower")
        lines.append(f"**Building the fast pass** of {name}, once per machine, while eager passes serve the runs: {when}"
                     + (f"; now {esc(p['stage'])}" if p.get("stage") else ""))
    return "\n\n".join(lines)


class EnginesTab:
    """The Engines tab of one Service, building for `run`'s settings: `layout()` builds it, the methods are its handlers."""

    def __init__(self, service: Service, run: RunTab) -> None:
        self.service = service
        self.run = run

    def layout(self) -> None:
        service, run = self.service, self.run
        public = service.policy.public
        gr.Markdown("Builds are content-addressed directories under `engines/builds/`: built once, reused, "
                    "built atomically. **Build** prepares what the Run tab's current mode and settings need on "
                    "the chosen backend; **Plan** shows what a TensorRT-LLM build would run. **Stop** and **Remove** "
                    "take a build of the list: "
                    + ("on this public server you see the operator's builds (read-only) and the ones you made "
                       "in this page, and stop or remove only yours." if public else
                       "a vLLM server another process started (the CLI, a test, another app on this store) is offered "
                       "only when you tick the box below."))
        self.state = gr.Markdown(engines_text(service), elem_id="eng-state")
        self.fast = gr.Markdown("", elem_id="eng-fast")
        self.timer = gr.Timer(PROGRESS_S, active=False)
        self.status = gr.Markdown("", elem_id="eng-status")
        self.table = gr.Dataframe([], headers=HEADERS, interactive=False, wrap=True, column_widths=COLUMN_WIDTHS,
                                   elem_id="eng-table")
        with gr.Row():
            build = gr.Button("Build for the Run tab's settings", variant="primary", elem_id="eng-build")
            plan_btn = gr.Button("Plan", elem_id="eng-plan")
        with gr.Row():
            # Custom values: a build made since the list was drawn (by the CLI, or a run starting a vLLM engine) is
            # named by its id; the handlers check it against what this page may touch.
            self.ids = gr.Dropdown([], label="Build (choose one of the list, or paste its id)", value=None,
                                   allow_custom_value=True, elem_id="eng-id")
            stop = gr.Button("Stop its server", elem_id="eng-stop")
            remove = gr.Button("Remove", variant="stop", elem_id="eng-rm")
        # The operator's choice; a public server's visitors never have it (_others).
        self.others = gr.Checkbox(False, label=OTHERS_LABEL, visible=not public, elem_id="eng-others")
        self.plan_out = gr.Code(language="json", label="Plan", elem_id="eng-plan-out")

        # The list, its menu and the fast pass's line are drawn together: when the page loads, when the tab is
        # opened (builds made meanwhile, a server stopped elsewhere), when the box changes what the menu offers.
        drawn = [self.table, self.ids, self.fast, self.timer]
        gr.on(None, self.refresh, [self.others], drawn, **QUIET)
        tab = Context.block  # the gr.Tab web.py opened around this layout
        if isinstance(tab, gr.Tab):
            tab.select(self.refresh, [self.others], drawn, **QUIET)
        self.timer.tick(self.progress, None, [self.fast, self.timer], **QUIET)
        # The API takes the mode, then the Run tab's controls in settings.keys() order (their creation order), then
        # the box (created last).
        settings_in = {run.mode, *run.controls.values()}
        listed = [self.status, self.table, self.ids]
        build.click(self.build, settings_in | {self.others}, listed, api_name="engine_build")
        plan_btn.click(self.plan, settings_in, self.plan_out, api_name="engine_plan")
        stop.click(self.stop, [self.ids, self.others], listed, api_name="engine_stop")
        remove.click(self.remove, [self.ids, self.others], listed, api_name="engine_remove")

    # ------------------------------------------------------------------ the list and its menu
    def _others(self, others: Any) -> bool:
        return others is True and not self.service.policy.public

    def menu(self, builds: list[dict[str, Any]], removable: set[str], others: bool) -> list[str]:
        """What Stop and Remove are offered: the builds this visitor may remove (in public mode, only their own), less
        the servers another process runs unless the operator asks (`others`)."""
        return [m["id"] for m in builds if m["id"] in removable and (others or not elsewhere(m))]

    def _drawn(self, visitor: str | None, others: Any, **menu) -> dict:
        builds = self.service.engine_list(visitor)
        choices = self.menu(builds, set(self.service.engine_removable(visitor)), self._others(others))
        # The table as a value, not an update: API clients get it.
        return {self.table: [row(m) for m in builds], self.ids: gr.update(choices=choices, **menu)}

    def _listed(self, visitor: str | None, others: Any, message: str, **menu) -> dict:
        return {self.status: message, **self._drawn(visitor, others, **menu)}

    def refresh(self, others: Any, request: gr.Request) -> dict:
        return {**self._drawn(visitor_of(request), others), **self.progress()}

    def progress(self) -> dict:
        """The fast pass's line, redrawn every PROGRESS_S while a build runs (the timer stops once none does)."""
        passes = self.service.fast_passes()
        return {self.fast: fast_pass_text(passes), self.timer: gr.Timer(active=any(p["state"] == "building" for p in passes))}

    def _chosen(self, build_id: Any, visitor: str | None, others: Any, verb: str) -> tuple[dict | None, str]:
        """The manifest of the build this page may `verb` (what its menu offers), or None and why not."""
        build_id = build_id if isinstance(build_id, str) else ""
        manifest = self.service.engine_get(build_id) if build_id in self.service.engine_removable(visitor) else None
        if manifest is None:
            return None, f"⚠ '{esc(one_line(build_id))}' is not a build you may {verb} here: choose one from the menu"
        if elsewhere(manifest) and not self._others(others):
            how = ("the operator manages it" if self.service.policy.public else
                   f"tick “{OTHERS_LABEL.split(' (')[0]}” to {verb} it from here")
            return None, (f"⚠ The server of `{build_id}` was started by another process (the CLI, a test, another app "
                          f"on this store), not by this app: {how}.")
        return manifest, ""

    # ------------------------------------------------------------------ handlers
    def _request(self, data: dict) -> dict[str, Any]:
        return settings.to_request(data[self.run.mode], self.run.values(data), self.service.registry)

    def build(self, data: dict, request: gr.Request, progress=gr.Progress()) -> dict:
        visitor, others = visitor_of(request), data.get(self.others)
        try:
            manifest = self.service.engine_build(self._request(data), progress=lambda f, msg: progress(f, desc=msg),
                                                 visitor=visitor)
        except (ConfigError, ModelError, ValueError) as err:
            return self._listed(visitor, others, f"⚠ {esc(self.service.relative(str(err)))}")
        return self._listed(visitor, others,
                            f"✓ Build `{manifest['id']}` ready ({manifest['kind']}, {manifest['duration_s']:.1f} s).")

    def plan(self, data: dict, request: gr.Request) -> str:
        try:
            return json.dumps(self.service.engine_plan(self._request(data), visitor=visitor_of(request)), indent=1)
        except (ConfigError, ModelError, ValueError) as err:
            return f"# {self.service.relative(str(err))}"

    def stop(self, build_id: Any, others: Any, request: gr.Request) -> dict:
        """Stop the chosen build's vLLM server or TensorRT-LLM worker (the build stays; the next request on it starts
        it again)."""
        visitor = visitor_of(request)
        manifest, message = self._chosen(build_id, visitor, others, "stop")
        if manifest is None:
            pass
        elif manifest.get("kind") not in SERVED:
            message = (f"⚠ `{build_id}` is a {manifest['kind']} build: only a vLLM engine or a TensorRT-LLM worker has "
                       "a server to stop.")
        elif self.service.engine_stop(build_id, visitor=visitor):
            message = f"Stopped the server of `{build_id}` (the next request on it starts it again)."
        else:
            message = f"`{build_id}` has no server running."
        return self._listed(visitor, others, message)

    def remove(self, build_id: Any, others: Any, request: gr.Request) -> dict:
        visitor = visitor_of(request)
        manifest, message = self._chosen(build_id, visitor, others, "remove")
        if manifest is None:
            return self._listed(visitor, others, message)
        try:
            self.service.engine_remove(build_id, visitor=visitor)
            message = f"Removed `{build_id}`."
        except ValueError as err:
            message = f"⚠ {esc(self.service.relative(str(err)))}"
        return self._listed(visitor, others, message, value=None)
