"""The Engines tab: the service's builds (content-addressed directories under engines/builds/) with their vLLM servers'
state, a build or a TensorRT-LLM plan for the Run tab's current mode and settings, stopping a server, and removal.
Handlers return {component: value}."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from app.modes import ConfigError
from app.service.api import ModelError, Service
from app.ui import settings
from app.ui.run_tab import RunTab
from app.ui.sessions import visitor_of


class EnginesTab:
    """The Engines tab of one Service, building for `run`'s settings: `layout()` builds it, the methods are its handlers."""

    def __init__(self, service: Service, run: RunTab) -> None:
        self.service = service
        self.run = run

    def layout(self) -> None:
        service, run = self.service, self.run
        gr.Markdown("Builds are content-addressed directories under `engines/builds/`: built once, reused, "
                    "built atomically. **Build** prepares what the Run tab's current mode and settings need on "
                    "the chosen backend; **Plan** shows what a TensorRT-LLM build would run."
                    + (" On this public server you see the operator's builds (read-only) and the ones you made "
                       "in this page, and remove only yours." if service.policy.public else ""))
        self.status = gr.Markdown("", elem_id="eng-status")
        # A callable: each page load lists what a new visitor sees (in public mode, the operator's builds).
        self.table = gr.Dataframe(self.rows, headers=["id", "model", "mode", "backend", "kind", "server", "created",
                                                      "build s", "MB"], interactive=False, elem_id="eng-table")
        with gr.Row():
            build = gr.Button("Build for the Run tab's settings", variant="primary", elem_id="eng-build")
            plan_btn = gr.Button("Plan", elem_id="eng-plan")
        with gr.Row():
            # Custom values: a build made after this page loaded (by the CLI, or a run starting a vLLM engine) is
            # named by its id; the handlers check it against what this visitor may touch.
            self.ids = gr.Dropdown(self.removable(), label="Build (choose, or paste its id)", value=None,
                                   allow_custom_value=True, elem_id="eng-id")
            stop = gr.Button("Stop its server", elem_id="eng-stop")
            remove = gr.Button("Remove", variant="stop", elem_id="eng-rm")
        self.plan_out = gr.Code(language="json", label="Plan", elem_id="eng-plan-out")

        # The API takes the mode, then the Run tab's controls in settings.keys() order (their creation order).
        settings_in = {run.mode, *run.controls.values()}
        build.click(self.build, settings_in, [self.status, self.table, self.ids], api_name="engine_build")
        plan_btn.click(self.plan, settings_in, self.plan_out, api_name="engine_plan")
        stop.click(self.stop, self.ids, [self.status, self.table, self.ids], api_name="engine_stop")
        remove.click(self.remove, self.ids, [self.status, self.table, self.ids], api_name="engine_remove")

    def rows(self, visitor: str | None = None) -> list[list[Any]]:
        rows = []
        for m in self.service.engine_list(visitor):
            spec = m["spec"]
            server = m.get("server") or {}  # a vLLM build's server: running (at its URL) or stopped
            state = f"{server['state']} {server.get('url', '')}".strip() if server else ""
            rows.append([m["id"], spec["model"], spec["mode"], spec["backend"], m["kind"], state, m["created"][:19],
                         round(m["duration_s"], 1), round(sum(m.get("files", {}).values()) / 2**20, 1)])
        return rows

    def removable(self, visitor: str | None = None) -> list[str]:
        """The Remove menu: the builds this visitor may remove (in public mode, only their own)."""
        return self.service.engine_removable(visitor)

    def _request(self, data: dict) -> dict[str, Any]:
        return settings.to_request(data[self.run.mode], self.run.values(data), self.service.registry)

    def _listed(self, visitor: str | None, message: str, **menu) -> dict:
        return {self.status: message, self.table: self.rows(visitor),  # a value, not an update: API clients get the table
                self.ids: gr.update(choices=self.removable(visitor), **menu)}

    def build(self, data: dict, request: gr.Request, progress=gr.Progress()) -> dict:
        visitor = visitor_of(request)
        try:
            manifest = self.service.engine_build(self._request(data), progress=lambda f, msg: progress(f, desc=msg),
                                                 visitor=visitor)
        except (ConfigError, ModelError, ValueError) as err:
            return self._listed(visitor, f"⚠ {self.service.relative(str(err))}")
        return self._listed(visitor, f"✓ Build `{manifest['id']}` ready ({manifest['kind']}, {manifest['duration_s']:.1f} s).")

    def plan(self, data: dict, request: gr.Request) -> str:
        try:
            return json.dumps(self.service.engine_plan(self._request(data), visitor=visitor_of(request)), indent=1)
        except (ConfigError, ModelError, ValueError) as err:
            return f"# {self.service.relative(str(err))}"

    def stop(self, build_id: str, request: gr.Request) -> dict:
        """Stop the chosen build's vLLM server (the build stays; the next request on it starts it again)."""
        visitor = visitor_of(request)
        build_id = build_id if isinstance(build_id, str) else ""
        manifest = self.service.engine_get(build_id) if build_id in self.removable(visitor) else None
        if manifest is None:
            message = f"⚠ '{build_id[:40]}' is not a build you may stop here: choose one from the menu"
        elif manifest.get("kind") != "vllm-server":
            message = f"⚠ `{build_id}` is a {manifest['kind']} build: only a vLLM engine has a server to stop."
        elif self.service.engine_stop(build_id, visitor=visitor):
            message = f"Stopped the server of `{build_id}` (the next request on it starts it again)."
        else:
            message = f"`{build_id}` has no server running."
        return self._listed(visitor, message)

    def remove(self, build_id: str, request: gr.Request) -> dict:
        visitor = visitor_of(request)
        build_id = build_id if isinstance(build_id, str) else ""
        if build_id not in self.removable(visitor):
            return self._listed(visitor, f"⚠ '{build_id[:40]}' is not a build you may remove here: choose one from the menu")
        try:
            self.service.engine_remove(build_id, visitor=visitor)
            message = f"Removed `{build_id}`."
        except ValueError as err:
            message = f"⚠ {self.service.relative(str(err))}"
        return self._listed(visitor, message, value=None)
