"""tensorrt_llm/sampling_params.py: SamplingParams is a dataclass; an unknown keyword is a TypeError."""

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    end_id: Optional[int] = None
    return_perf_metrics: bool = False
    lookahead_config: Any = None  # a llmapi.LookaheadDecodingConfig (its PositiveInt fields apply per request too)

    def __post_init__(self):
        from .llmapi import LookaheadDecodingConfig

        if self.lookahead_config is not None and not isinstance(self.lookahead_config, LookaheadDecodingConfig):
            raise TypeError("lookahead_config must be a tensorrt_llm.llmapi.LookaheadDecodingConfig")
