"""A stand-in for TensorRT-LLM 1.2 (never the real one: it needs a GPU), for the tests of this project's glue code.

It enforces what upstream enforces where this project's code meets it, each rule citing the upstream file it
follows (NVIDIA/TensorRT-LLM, the 1.2 line): the speculative configs' fields and validators and the support matrix,
`model` / `speculative_model` as a local directory or else a hub id to download (llm_args.py _ModelWrapper), the
engine's max_input_len (cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate), `Eagle` turned into
`Eagle3` on the PyTorch backend with upstream's warning, the streamed result (decoding_iter,
avg_decoded_tokens_per_iter, request_perf_metrics, finish reasons), EAGLE-3 weights loaded by name with fc's width
from the capture list, the GPU memory one engine holds, and engine-wide iteration statistics that block for their
timeout. It computes nothing: generation replays a scripted token stream.
`tensorrt_llm.LLM` is the PyTorch backend's LLM, `tensorrt_llm._tensorrt_engine.LLM` the TensorRT-engine one,
as upstream names them (tensorrt_llm/__init__.py, tensorrt_llm/_tensorrt_engine/__init__.py).

Its pins. Upstream's requirements.txt pins numpy<2 (and torch, transformers below this app's), so it does not run
in this app's environment (numpy 2): importing the stand-in there fails the same way, on purpose, so that nothing
can mistake this environment for one TensorRT-LLM runs in. The tests of the glue code opt out knowingly: they set
TRTLLM_STAND_IN_IGNORE_PINS=1 while they import it (tests/helpers.py `trtllm_stand_in`, which does it by default;
`trtllm_stand_in(pins=True)` keeps the check).
"""

import os

import numpy

IGNORE_PINS = "TRTLLM_STAND_IN_IGNORE_PINS"
if int(numpy.__version__.split(".")[0]) >= 2 and os.environ.get(IGNORE_PINS) != "1":
    raise ImportError(f"TensorRT-LLM 1.2 requires numpy<2 (its requirements.txt) and numpy {numpy.__version__} is "
                      f"installed: it runs in an environment of its own, not beside this app (the stand-in's check; "
                      f"tests that only exercise glue code set {IGNORE_PINS}=1)")

from .llm import LLM  # noqa: E402
from .sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams"]
