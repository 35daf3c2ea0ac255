"""tensorrt_llm/_tensorrt_engine/__init__.py: the LLM of the TensorRT-engine backend (TrtLlmArgs)."""

from .llm import BaseLLM


class LLM(BaseLLM):
    backend = "tensorrt"
