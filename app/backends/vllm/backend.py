"""The vllm backend: generation on a vLLM engine the service starts and keeps (processes.py).

The engine is a vLLM OpenAI server; a run goes through the same streaming client as the remote
backend's vLLM path (client.py), with the prompt encoded here by the model's own tokenizer so that
vLLM and the project's loop see the same prompt token ids.
"""

from __future__ import annotations

import threading
import time

from app import models
from app.modes import ConfigError
from app.modes import configs
from app.backends.base import EngineBackend, Prompt, encode
from app.backends.processes import GroupShare
from app.backends.openai import RemoteError
from app.backends.store import Progress, Store
from app.backends.vllm import builds, processes
from app.backends.vllm.client import Engine
from app.modes import MODES, Mode
from app.modes.configs import DecodeRequest
from app.service.errors import EngineError
from app.service.jobs import Limits, Work


class VLLMBackend(EngineBackend):
    name = "vllm"
    dtype_per_request = True
    kind = "vllm-server"

    def __init__(self, store: Store, dtype: str = "float32", settings: processes.Settings = processes.Settings(),
                 max_started: int | None = None, idle_s: float | None = None) -> None:
        super().__init__(store, settings)
        self.dtype = dtype
        # Public mode (Policy.visitor_engines, Policy.engine_idle_s): how many engines requests may start and keep
        # running at a time beyond the operator's, and how long one of them may idle before it is stopped; None = no bound.
        self.max_started = max_started
        self.idle_s = idle_s
        self._last_used: dict[str, float] = {}  # an engine this backend started -> when its last request ended
        self._active: dict[str, int] = {}  # -> requests streaming from it now
        self._closed = threading.Event()
        if idle_s is not None:
            threading.Thread(target=self._reap_idle, name="vllm-idle", daemon=True).start()
        self.processes = processes.Processes(store.builds, settings)
        self._starting: dict[str, int] = {}  # build id -> requests starting its engine now (each holds the place)

    @staticmethod
    def waiting(seconds: float) -> str:
        return (f"starting the vLLM engine for these settings: {seconds:.0f} s (a first start takes 1–3 minutes: "
                "vLLM loads the model and warms it up; later runs reuse the engine)")

    def unavailable(self) -> str | None:
        return processes.unavailable(self.settings)

    def state(self, build_id: str) -> dict:
        return self.processes.state(build_id)

    def stop_server(self, build_id: str) -> bool:
        return self.processes.stop(build_id)

    def note(self, request: DecodeRequest, model: str) -> str:
        """Its method, what it ignores, whether its engine is up (a first Run starts it: a minute or more)."""
        try:
            build = builds.spec(request, model, dtype=self.dtype)
        except EngineError as err:
            raise ConfigError(str(err)) from None
        spec = build.config["speculative_config"]
        method = f"vLLM `{spec['method']}`, num_speculative_tokens {spec['num_speculative_tokens']}" if spec else "vLLM, no speculation"
        up = "its engine is running" if self.running(build.key()) else "the first Run starts its engine (1–3 minutes)"
        ignored = processes.ignored(request)
        return f"{method}; {up}" + (f"; vLLM has no counterpart for: {', '.join(ignored)}" if ignored else "")

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        reason = processes.unavailable(self.settings) or processes.missing(mode)
        if reason:
            return reason
        request = MODES.request(speculative_config={"decoding_type": mode.decoding_type})
        # vLLM's eagle3 loads EAGLE-3 modules only: whether the shipped one is (the other methods take any artifact)
        artifact = models.default_artifact(model or models.BUNDLED, mode.artifact) if mode.vllm == "eagle3" else None
        if mode.vllm == "eagle3" and artifact is None:
            return f"no EAGLE-3 module for {model}: set speculative_model"
        if mode.vllm == "suffix" and not processes.has_arctic(self.settings.python):
            return f"vLLM's suffix method needs Arctic Inference beside it: {processes.SETUP} builds it"
        return processes.method_reason(request, artifact)

    def engine(self, model: str, request: DecodeRequest, progress: Progress | None = None, cancel=None) -> tuple[dict, str]:
        """The build of the request's engine and its running server's URL (built, started or reused)."""
        try:
            spec = builds.spec(request, model, dtype=self.dtype)
            build_id = self.store.spec_id(spec)
        except EngineError as err:
            raise ConfigError(str(err)) from None
        # The budget is checked, and a place taken, before anything is built: concurrent requests cannot both pass,
        # and a refused one leaves no build directory behind.
        with self._lock:
            if self.max_started is not None and self.processes.state(build_id)["state"] != "running" \
                    and build_id not in self._starting:
                running = [i for i in self.started if self.processes.state(i)["state"] == "running"]
                if len(running) + len(self._starting) >= self.max_started:
                    raise ConfigError(f"this public server runs at most {self.max_started} vLLM engine(s) started by "
                                      "visitors at a time, besides the operator's, and that many are up: choose settings "
                                      "one of them serves, or another backend")
            self._starting[build_id] = self._starting.get(build_id, 0) + 1
        try:
            try:
                manifest = self.store.build(spec, progress=progress)
            except EngineError as err:
                raise ConfigError(str(err)) from None
            url, started = self.processes.ensure(manifest, progress or (lambda f, m: None), cancel)
            if started:
                with self._lock:
                    self.started.add(manifest["id"])
                    self._last_used[manifest["id"]] = time.monotonic()
        finally:
            with self._lock:
                self._starting[build_id] -= 1
                if not self._starting[build_id]:
                    del self._starting[build_id]
        return manifest, url

    def check(self, request: DecodeRequest) -> None:
        check(request)

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        try:
            manifest, url = self.engine(model, request)
        except processes.VLLMError as err:
            raise RemoteError(str(err)) from None
        tok = self.tokenizer(model)
        prompt_ids = encode(tok, prompt)
        configs.check_prompt_limit(len(prompt_ids), limits.max_prompt_tokens)
        configs.check_context(len(prompt_ids), request.max_new_tokens, self.settings.max_model_len - request.max_new_tokens)
        engine = {"engine": "vllm", "build": manifest["id"], "version": manifest["spec"]["versions"].get("vllm"),
                  "dtype": manifest["spec"]["config"]["dtype"],
                  "speculative_config": manifest["spec"]["config"]["speculative_config"],
                  "ignored": processes.ignored(request)}
        client = Engine(url, model, texts=lambda ids: {i: tok.decode([i]) for i in set(ids)})
        work = client.work(request, prompt_ids, engine)
        build_id = manifest["id"]
        pid = self.processes.state(build_id).get("pid")
        with self._lock:
            self._active[build_id] = self._active.get(build_id, 0) + 1

        def used(cancel: threading.Event):
            load = GroupShare(pid) if pid else None  # the machine's load, sampled as the run goes
            try:
                for message in work(cancel):
                    if load and message.get("type") in ("step", "end") and (share := load.share()) is not None:
                        message["totals"]["cpu_share"] = share
                    yield message
            finally:
                with self._lock:
                    self._active[build_id] -= 1
                    self._last_used[build_id] = time.monotonic()

        return used

    def reap(self, now: float | None = None) -> list[str]:
        """Stop the engines this backend started that no request has used for `idle_s`; their ids."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [i for i in self.started if not self._active.get(i)
                    and now - self._last_used.get(i, now) >= (self.idle_s if self.idle_s is not None else float("inf"))]
            self.started.difference_update(idle)
        for build_id in idle:
            self.stop_server(build_id)
        return idle

    def _reap_idle(self) -> None:
        while not self._closed.wait(min(30.0, self.idle_s)):
            self.reap()

    def room(self) -> int | None:
        if self.max_started is None:
            return None
        with self._lock:
            running = sum(self.running(i) for i in self.started)
            return max(0, self.max_started - running - len(self._starting))

    def release(self, build_id: str) -> None:
        with self._lock:
            if build_id not in self.started:
                return
            self.started.discard(build_id)
        self.stop_server(build_id)

    def stop_started(self) -> None:
        self._closed.set()
        super().stop_started()


def check(request: DecodeRequest) -> None:
    """vLLM's rule for a request of a valid mode: it has a method for it."""
    reason = processes.method_reason(request)
    if reason:
        raise ConfigError(reason)
