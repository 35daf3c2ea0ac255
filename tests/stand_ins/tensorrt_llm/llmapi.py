"""tensorrt_llm/llmapi/llm_args.py (1.2): the speculative configs with upstream's field types and validators.

Only the fields this project may send are mirrored; like upstream (StrictBaseModel, llmapi/utils.py) any other
field is an error, so a name upstream does not have cannot slip through.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import List, Literal, Optional, Set, Union

from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator,
                      model_validator)


logger = logging.getLogger("tensorrt_llm")  # upstream's own logger name (tensorrt_llm/logger.py)


class StrictBaseModel(BaseModel):
    # llmapi/utils.py StrictBaseModel: extra="forbid"
    model_config = ConfigDict(extra="forbid")


class DecodingBaseConfig(StrictBaseModel):
    # llm_args.py DecodingBaseConfig: max_draft_len is "The number of drafter layers" (NonNegativeInt);
    # max_total_draft_tokens the nodes of the draft tree; speculative_model also read as speculative_model_dir.
    max_draft_len: Optional[NonNegativeInt] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model: Optional[Union[str, Path]] = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
    # llm_args.py DecodingBaseConfig.allow_advanced_sampling: without it a one-model path samples greedily.
    allow_advanced_sampling: bool = False

    def supports_backend(self, backend: str) -> bool:
        return True


class LookaheadDecodingConfig(DecodingBaseConfig):
    # llm_args.py LookaheadDecodingConfig: (W, N, G) are PositiveInt (G = 0 is refused here, although
    # cpp/tensorrt_llm/executor/decodingConfig.cpp's own check allows it).
    decoding_type: Literal["Lookahead"] = "Lookahead"
    max_window_size: PositiveInt = 4
    max_ngram_size: PositiveInt = 3
    max_verification_set_size: PositiveInt = 4

    @model_validator(mode="after")
    def set_max_total_draft_tokens(self):
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def calculate_speculative_resource(self):
        # cpp/tensorrt_llm/executor/decodingConfig.cpp calculateSpeculativeResourceTuple
        w, n, g = self.max_window_size, self.max_ngram_size, self.max_verification_set_size
        draft = (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)
        return draft + 1, n, draft, n - 1

    def supports_backend(self, backend: str) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class MedusaDecodingConfig(DecodingBaseConfig):
    # llm_args.py MedusaDecodingConfig; the engine backend only.
    decoding_type: Literal["Medusa"] = "Medusa"
    medusa_choices: Optional[List[List[int]]] = None
    num_medusa_heads: Optional[int] = None

    @model_validator(mode="after")
    def set_max_total_draft_tokens(self):
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: str) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle_choices: Optional[List[List[int]]] = None
    greedy_sampling: Optional[bool] = True
    posterior_threshold: Optional[float] = None
    use_dynamic_tree: Optional[bool] = False
    dynamic_tree_max_topK: Optional[int] = None
    num_eagle_layers: Optional[int] = None
    max_non_leaves_per_layer: Optional[int] = None
    eagle3_one_model: Optional[bool] = True
    # "Target model layer indices to capture hidden states from for the EAGLE3 draft model.
    #  Defaults to {1, num_layers//2-1, num_layers-4}."
    eagle3_layers_to_capture: Optional[Set[int]] = None

    @field_validator("eagle_choices", mode="before")
    @classmethod
    def validate_eagle_choices(cls, v):
        # llm_args.py EagleDecodingConfig.validate_eagle_choices (1.2): a static tree is accepted, with this warning.
        if v is not None:
            logger.warning("NOTE: The Draft token tree is still under development, PLEASE DO NOT USE IT !!!")
        return v

    @property
    def num_capture_layers(self) -> int:
        # llm_args.py EagleDecodingConfig.num_capture_layers: the set's size, else "the Eagle3 base set": 3.
        return len(self.eagle3_layers_to_capture) if self.eagle3_layers_to_capture is not None else 3

    @model_validator(mode="after")
    def validate_eagle_config(self):
        # llm_args.py EagleDecodingConfig.validate_eagle_config: max_draft_len is the number of drafting
        # steps; num_eagle_layers and max_total_draft_tokens are overwritten from it, and a static tree
        # (eagle_choices) resets max_draft_len to the tree's depth and max_total_draft_tokens to its nodes.
        if not self.max_draft_len:
            raise ValueError("max_draft_len must be > 0 for Eagle")
        self.num_eagle_layers = self.max_draft_len
        self.max_total_draft_tokens = self.max_draft_len
        if self.eagle_choices is not None:
            if self.use_dynamic_tree:
                raise ValueError("If eagle_choices is provided, use_dynamic_tree should be False")
            depth = max(len(c) for c in self.eagle_choices)
            self.num_eagle_layers = self.max_draft_len = depth
            self.max_total_draft_tokens = len(self.eagle_choices)
        if self.use_dynamic_tree and not (self.dynamic_tree_max_topK or 0) > 0:
            raise ValueError("dynamic_tree_max_topK should be provided, which indicates the number of nodes to expand each time")
        return self

    @model_validator(mode="after")
    def validate_speculative_model(self):
        if self.speculative_model is None:
            raise ValueError("Draft model must be provided for EAGLE")
        return self


class Eagle3DecodingConfig(EagleDecodingConfig):
    # llm_args.py (1.2): the PyTorch backend's EAGLE-3; TrtLlmArgs.validate_speculative_config refuses it (see llm.py).
    decoding_type: Literal["Eagle3"] = "Eagle3"


# TorchLlmArgs.validate_speculative_config (1.2): what it logs when it turns an EagleDecodingConfig into an Eagle3 one.
EAGLE_ON_PYTORCH = ("speculative_config.decoding_type 'Eagle' is not supported on the PyTorch backend; only 'Eagle3' is "
                    "supported. 'Eagle' is treated as 'Eagle3' for backward compatibility. EAGLE (v1/v2) draft "
                    "checkpoints are incompatible with Eagle3—use an Eagle3 draft model.")
# TrtLlmArgs.validate_speculative_config (1.2): Eagle3 on the engine backend.
EAGLE3_ON_ENGINE = ("speculative_config.decoding_type 'Eagle3' is only supported on the PyTorch backend. "
                    "Use decoding_type 'Eagle' for the TensorRT backend.")


class NGramDecodingConfig(DecodingBaseConfig):
    # llm_args.py NGramDecodingConfig; the PyTorch backend only. No max_candidates, no ngram_draft_lens.
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def validate_ngram_config(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    # llm_args.py DraftTargetDecodingConfig; the PyTorch backend only.
    decoding_type: Literal["Draft_Target"] = "Draft_Target"

    @model_validator(mode="after")
    def validate_draft_target_config(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("speculative_model must be specified for DraftTarget")
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: str) -> bool:
        return backend in ("pytorch", "_autodeploy")


@dataclass
class BuildConfig:
    # tensorrt_llm/builder.py BuildConfig (the fields this project sets); TrtLlmArgs only. max_input_len defaults to
    # 1024 (BuildConfig, and BaseLlmArgs.max_input_len's default): a longer prompt is refused by the engine built.
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_input_len: int = 1024
    max_seq_len: Optional[int] = None
    max_draft_len: int = 0
