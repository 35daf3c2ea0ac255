"""A stand-in for TensorRT-LLM 1.2 (never the real one: it needs a GPU), for the tests of this project's glue code.

It enforces what upstream enforces where this project's code meets it, each rule citing the upstream file it
follows (NVIDIA/TensorRT-LLM, the 1.2 line): the speculative configs' fields and validators and the support matrix,
the streamed result (decoding_iter, avg_decoded_tokens_per_iter, finish reasons), EAGLE-3 weights loaded by name
with fc's width from the capture list, the GPU memory one engine holds, and engine-wide iteration statistics that
block for their timeout. It computes nothing: generation replays a scripted token stream.
`tensorrt_llm.LLM` is the PyTorch backend's LLM, `tensorrt_llm._tensorrt_engine.LLM` the TensorRT-engine one,
as upstream names them (tensorrt_llm/__init__.py, tensorrt_llm/_tensorrt_engine/__init__.py).
"""

from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
