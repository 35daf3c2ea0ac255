"""Decoding configs for the CLI and (later) the service: validation and drafter construction.

Field names follow TensorRT-LLM where it has them.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.decoding.drafters import lookahead
from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.sampling import SamplingParams

MODES = ("autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle")
AVAILABLE = ("autoregressive", "draft_target", "prompt_lookup", "lookahead")


class ConfigError(ValueError):
    """A decoding config that cannot run; the message is meant for the user, on one line."""


@dataclass
class DecodingConfig:
    mode: str = "autoregressive"
    # lookahead: engine maxima (W, N, G) and the per-request (w, n, g) <= (W, N, G)
    lookahead_config: tuple[int, int, int] = (4, 3, 4)
    lookahead_request: tuple[int, int, int] | None = None
    pool_from_prompt: bool = True
    # prompt lookup (NGram)
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    is_use_oldest: bool = True  # earliest match (TensorRT-LLM's default) or the latest
    max_candidates: int = 1  # continuations of this many matches verified together as a tree
    ngram_draft_lens: tuple[int, ...] = (2, 5)  # draft caps after a 1-gram, 2-gram... match; () = none
    # draft-target
    draft_model: str | None = None
    max_draft_len: int = 4
    # generation
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode '{self.mode}': choose one of {', '.join(MODES)}")
        if self.mode not in AVAILABLE:
            raise ConfigError(f"mode '{self.mode}' is not available yet on this backend")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.mode == "lookahead":
            try:
                lookahead.check(*self.lookahead_config)
                if self.lookahead_request is not None:
                    lookahead.check(*self.lookahead_request, limits=self.lookahead_config)
            except ValueError as err:
                raise ConfigError(str(err)) from err
        if self.mode == "prompt_lookup":
            if self.prompt_lookup_num_tokens < 1:
                raise ConfigError(f"prompt_lookup_num_tokens must be at least 1, got {self.prompt_lookup_num_tokens}")
            if self.max_matching_ngram_size < 1:
                raise ConfigError(f"max_matching_ngram_size must be at least 1, got {self.max_matching_ngram_size}")
            if any(k < 0 for k in self.ngram_draft_lens):
                raise ConfigError(f"ngram_draft_lens must be non-negative, got {list(self.ngram_draft_lens)}")
            if self.max_candidates < 1:
                raise ConfigError(f"max_candidates must be at least 1, got {self.max_candidates}")
        if self.mode == "draft_target":
            if not self.draft_model:
                raise ConfigError("draft_target needs a draft model (--draft-model NAME)")
            if self.max_draft_len < 1:
                raise ConfigError(f"max_draft_len must be at least 1, got {self.max_draft_len}")

    def drafter(self, draft=None):
        """A fresh drafter for one generation; `draft` is the loaded draft model for draft_target."""
        if self.mode == "lookahead":
            W, N, G = self.lookahead_config
            return Lookahead(W, N, G, request=self.lookahead_request, pool_from_prompt=self.pool_from_prompt)
        if self.mode == "prompt_lookup":
            return PromptLookup(
                self.prompt_lookup_num_tokens,
                self.max_matching_ngram_size,
                self.is_use_oldest,
                self.max_candidates,
                self.ngram_draft_lens,
            )
        if self.mode == "draft_target":
            return DraftModel(draft.model, self.max_draft_len)
        return Autoregressive()


def parse_triple(text: str, what: str) -> tuple[int, int, int]:
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ConfigError(f"{what} must be three integers W,N,G such as 4,3,4; got '{text}'")
    return parts  # type: ignore[return-value]
