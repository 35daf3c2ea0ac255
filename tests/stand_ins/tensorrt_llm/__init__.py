"""A stand-in for TensorRT-LLM 1.2 (never the real one: it needs a GPU), for the tests of this project's glue code.

It enforces what upstream enforces where this project's code meets it, each rule citing the upstream file it
follows (NVIDIA/TensorRT-LLM, the 1.2 line). It computes nothing: generation replays a scripted token stream.
`tensorrt_llm.LLM` is the PyTorch backend's LLM, `tensorrt_llm._tensorrt_engine.LLM` the TensorRT-engine one,
as upstream names them (tensorrt_llm/__init__.py, tensorrt_llm/_tensorrt_engine/__init__.py).
"""

from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
