"""The tensorrt_llm backend where TensorRT-LLM has an environment of its own (`.venv-trtllm`): generation on this
project's worker, which the service starts, reuses and stops (processes.py), the way the vllm backend
runs vLLM's servers (app/backends/vllm/).

A request becomes the store's build of its TensorRT-LLM plan (builds.trtllm_plan, built by
builds.trtllm_worker_builder: the model prepared and the app's artifacts exported, each named by absolute path), then
the worker serving that build, started or found running. One worker holds the GPU at a time: a request for another
configuration is refused in words while one is up (the Engines tab stops it). The prompt is encoded, and the output
decoded, with the model's own tokenizer here; each step is one engine iteration's committed tokens as the worker
streams them, the end totals carry the request's own perf metrics, and the draft itself is not exposed by TensorRT-LLM
(backend.NOT_VISIBLE).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from app.modes import ConfigError, DecodeRequest, Mode, configs
from app.backends.base import EngineBackend, Prompt, encode
from app.backends.openai import RemoteError
from app.backends.store import BuildSpec, Progress, Store
from app.backends.tensorrt_llm import backend as trt
from app.backends.tensorrt_llm import builds, processes
from app.service.errors import EngineError
from app.service.jobs import Limits, Work

STARTED = "TensorRT-LLM engine started for this configuration, in its own environment"


class TRTLLMEngineBackend(EngineBackend):
    name = "tensorrt_llm"
    kind = "tensorrt-worker"

    def __init__(self, store: Store, settings: processes.Settings = processes.Settings(),
                 tensor_parallel_size: int = 1) -> None:
        super().__init__(store, settings)
        self.tensor_parallel_size = tensor_parallel_size
        self.processes = processes.Processes(store.builds, settings)

    waiting = staticmethod(trt.TensorRTLLMBackend.waiting)  # either way it runs, a run waits for the same

    def unavailable(self) -> str | None:
        return processes.unavailable(self.settings)

    def state(self, build_id: str) -> dict[str, Any]:
        return self.processes.state(self.store.builds / build_id)

    def stop_server(self, build_id: str) -> bool:
        return self.processes.stop(self.store.builds / build_id)

    def auto(self, mode: str) -> bool:
        return self.availability().available and mode != "autoregressive"

    def notes(self, request: DecodeRequest) -> list[str]:
        return trt.trtllm_notes(request)

    def race_refusal(self, request: DecodeRequest) -> str | None:
        return ("TensorRT-LLM runs one engine per GPU, so an autoregressive baseline cannot run beside this mode's "
                "engine to race it: run it without the race (untick \"Race against autoregressive\"); the step "
                "view shows τ per engine iteration all the same")

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        if not mode.trtllm:
            return f"TensorRT-LLM has no {mode.name} decoding: {mode.trtllm_missing or 'the mode is this app’s own'}"
        return processes.unavailable(self.settings)

    def check(self, request: DecodeRequest) -> None:
        trt.check(request)

    def spec(self, request: DecodeRequest, model: str) -> BuildSpec:
        """The store's build of a request for the worker (builds.trtllm_worker_builder), by the TensorRT-LLM of its
        environment: another build than the in-process backend's, which saves a TensorRT engine."""
        spec = builds.spec(request, model, tensor_parallel_size=self.tensor_parallel_size)
        return replace(spec, config={**spec.config, "worker": True},
                       versions={"tensorrt_llm": processes.version(self.settings.python)})

    def engine(self, model: str, request: DecodeRequest, progress: Progress | None = None) -> tuple[dict, str]:
        manifest, port, _ = self.worker(model, request, progress)
        return manifest, f"http://127.0.0.1:{port}"

    def worker(self, model: str, request: DecodeRequest, progress: Progress | None = None,
               cancel: threading.Event | None = None) -> tuple[dict, int, bool]:
        """The request's build (prepared now or reused), the port of the worker serving it, and whether this call
        started that worker. Nothing is prepared for a configuration the GPU cannot take now."""
        progress = progress or (lambda fraction, message: None)
        try:
            spec = self.spec(request, model)
            build_id = self.store.spec_id(spec)
            plan = self.store.plan(spec)
        except EngineError as err:
            raise ConfigError(str(err)) from None
        if plan["cannot_run"]:
            raise ConfigError(f"TensorRT-LLM would refuse this: {'; '.join(plan['cannot_run'])}")
        directory = self.store.builds / build_id
        file = processes.worker_file(plan, directory, f"{request.mode} on {model} with its {plan['trtllm_backend']} backend")
        if builds.overlap_off(plan["trtllm_backend"], request.mode):
            file["llm"]["disable_overlap_scheduler"] = True
        if reason := self.processes.busy(directory, file):
            raise ConfigError(reason)
        try:
            # Off any lock of this backend: the store's lock is this build's only, so other submits are answered.
            manifest = self.store.build(spec, progress=progress)
        except EngineError as err:
            raise ConfigError(str(err)) from None
        try:
            port, started = self.processes.ensure(directory, file, progress, cancel)
        except processes.TRTLLMError as err:
            raise RemoteError(str(err)) from None
        if started:
            with self._lock:
                self.started.add(build_id)
        return manifest, port, started

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        manifest, port, started = self.worker(model, request)
        tok = self.tokenizer(model)
        prompt_ids = encode(tok, prompt)
        configs.check_prompt_limit(len(prompt_ids), limits.max_prompt_tokens)
        health = processes.health(port)
        served = health[1] if health else {}
        llm = served.get("llm") or {}
        engine = {"engine": "tensorrt_llm", "build": manifest["id"], "version": served.get("tensorrt_llm"),
                  "trtllm_backend": served.get("trtllm_backend"), "speculative_config": llm.get("speculative_config"),
                  "ignored": trt.trtllm_notes(request)}
        sampling = trt.sampling_kwargs(request)

        def texts(ids: list[int]) -> dict[int, str]:
            return {i: tok.decode([i]) for i in set(ids)}

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            yield {"type": "start", "backend": self.name, "model": model, "mode": request.mode, "prompt_ids": prompt_ids,
                   "texts": texts(prompt_ids), "not_visible": trt.NOT_VISIBLE, "engine": engine,
                   "pass": STARTED if started else trt.REUSED}
            end: dict[str, Any] = {}
            for message in processes.generate(port, prompt_ids, sampling, cancel):
                if message["type"] == "end":
                    end = message
                else:
                    yield {**message, "texts": texts(message["tokens"])}
            ids = end["token_ids"]
            yield {"type": "end", "finish_reason": end["finish_reason"] or ("cancelled" if cancel.is_set() else None),
                   "text": tok.decode(ids, skip_special_tokens=True), "token_ids": ids, "totals": end["totals"],
                   "error": end["error"]}

        return work
