"""Typed decoding configs with TensorRT-LLM's field names, validated with TensorRT-LLM's rules.

Every problem becomes one sentence a user understands (ConfigError); `check()` runs every rule of the mode
itself. What a backend adds (the transformers backend's step limits, TensorRT-LLM's support matrix, vLLM's
methods) is that backend's `check` (app/service/backends/), which the service runs once per request; what only a
loaded model can tell, the backend's prepare. Which configs a request may carry is the registry's
(app/modes/registry.py: `Modes.request`, what `parse` validates).

Support matrix (TensorRT-LLM 1.2, tensorrt_llm/llmapi/llm_args.py `supports_backend`): lookahead and
Medusa run only on its TensorRT-engine backend, NGram and draft-target only on its PyTorch backend,
EAGLE on both (the PyTorch backend takes EAGLE-3 checkpoints only, TorchLlmArgs.validate_speculative_config;
the engine backend EAGLE-1/2 ones, models/eagle/config.py). docs/tensorrt-llm.md has the whole reading.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.modes.errors import ConfigError
from app.modes.notation import medusa_choices

MAX_DRAFT_LEN = 256  # this app's bound on the draft tokens one step verifies (every mode, every backend)
# Upper bounds of the other numeric fields, for every entry point (web, CLI, HTTP `specdec`): far above any
# useful setting, low enough that no value makes one step run for long or a number overflow.
MAX_NEW_TOKENS = 8192
MAX_SEED = 2**63 - 1  # torch's generator takes a signed 64-bit seed
MAX_TEMPERATURE = 100.0
MIN_TEMPERATURE = 1e-3  # above 0: below it a sample is the argmax anyway, and the scaled logits overflow
MAX_TOP_K = 2**20
MAX_NGRAM_SIZE = 32
MAX_CANDIDATES = 16
MAX_DRAFT_CAPS = 32  # entries of ngram_draft_lens
MAX_TREE_DEPTH = 16  # num_eagle_layers, num_medusa_heads
MAX_EAGLE_TOP_K = 16  # dynamic_tree_max_topK
MAX_LOOKAHEAD = 256  # each of W, N, G (their max_draft_len is bounded by MAX_DRAFT_LEN too)
MAX_SUFFIX_DEPTH = 64  # suffix_decoding_max_tree_depth: the suffix tree holds up to depth nodes per context token
MAX_SPEC_FACTOR = 64.0
MAX_CACHED_REQUESTS = 100_000
# The transformers backend's tree pruning when a request leaves min_path_prob unset: on a CPU every verified node
# costs target compute, and an unpruned 24-node EAGLE step costs about two one-token passes (through the service,
# bfloat16, side by side: 1.01x autoregressive unpruned, 1.45x pruned at 0.05; see docs/algorithms.md). Pruning keeps every mode
# lossless: the tree stays a deterministic function of the context. TensorRT-LLM has no such setting (unset: none).
MIN_PATH_PROB = 0.05
BACKENDS = ("transformers", "tensorrt_llm", "remote", "vllm")


class _Config(BaseModel):
    """A mode's config (its entry in app/modes/shipped.py names it); its drafter builds from a checked one (`from_config`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingConfig(_Config):
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    beam_width: int = 1

    @field_validator("seed", "top_k", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        return _whole(v)

    def check(self) -> None:
        if not math.isfinite(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ConfigError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / 1e-308 overflow to inf, and sampling them fails
            raise ConfigError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise ConfigError(f"top_k must be in [0, {MAX_TOP_K}] (0 = off), got {_short(self.top_k)}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be a whole number in [0, 2^63 - 1] (or unset for a random one), got {_short(self.seed)}")
        if self.beam_width != 1:
            raise ConfigError(f"speculative decoding needs beam width 1 (TensorRT-LLM has no beam search here), got {self.beam_width}")


class AutoregressiveConfig(_Config):
    decoding_type: Literal["Autoregressive"] = "Autoregressive"
    mode: ClassVar[str] = "autoregressive"

    @property
    def max_draft_len(self) -> int:
        return 0

    def check(self) -> None:
        pass



class LookaheadDecodingConfig(_Config):
    """(W, N, G): window, n-gram size, verification set; per request (w, n, g) <= (W, N, G)."""

    decoding_type: Literal["Lookahead"] = "Lookahead"
    max_window_size: int = 4
    max_ngram_size: int = 3
    max_verification_set_size: int = 4
    request: tuple[int, int, int] | None = None  # per-request (w, n, g); None = (W, N, G)
    pool_from_prompt: bool = True
    mode: ClassVar[str] = "lookahead"

    @staticmethod
    def draft_len(w: int, n: int, g: int) -> int:
        return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)

    @property
    def max_draft_len(self) -> int:
        """TensorRT-LLM's formula; the engine must be built with exactly this."""
        return self.draft_len(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)

    def calculate_speculative_resource(self) -> tuple[int, int, int, int]:
        """(maxDecodingTokens, maxPathLen, maxDraftTokens, maxDraftPathLen) as TensorRT-LLM computes them."""
        n = self.max_ngram_size
        return self.max_draft_len + 1, n, self.max_draft_len, n - 1

    @staticmethod
    def _legal(w: int, n: int, g: int, what: str) -> None:
        if w < 1 or n < 1 or g < 0:
            raise ConfigError(f"{what} needs W >= 1, N >= 1 and G >= 0, got ({_short(w)}, {_short(n)}, {_short(g)})")
        if max(w, n, g) > MAX_LOOKAHEAD:
            raise ConfigError(f"{what}: each of W, N and G is at most {MAX_LOOKAHEAD}, got ({_short(w)}, {_short(n)}, {_short(g)})")
        if n == 1 and w != 1:
            raise ConfigError(f"{what}: an n-gram size of 1 requires a window size of 1 (got W={w}); (1, 1, 0) is autoregressive")
        if n == 1 and g != 0:
            raise ConfigError(f"{what}: an n-gram size of 1 requires a verification set size of 0 (got G={g})")

    def check(self) -> None:
        W, N, G = self.max_window_size, self.max_ngram_size, self.max_verification_set_size
        self._legal(W, N, G, "lookahead (W, N, G)")
        if self.max_draft_len > MAX_DRAFT_LEN:
            raise ConfigError(
                f"lookahead ({W}, {N}, {G}) needs max_draft_len {self.max_draft_len} = (N-2) + (W-1+G)(N-1), "
                f"more than this app's limit of {MAX_DRAFT_LEN} draft tokens per step"
            )
        if self.request is not None:
            w, n, g = self.request
            self._legal(w, n, g, "the per-request (w, n, g)")
            if w > W or n > N or g > G:
                raise ConfigError(f"the per-request (w, n, g) = ({w}, {n}, {g}) exceeds the engine's (W, N, G) = ({W}, {N}, {G})")



class NGramDecodingConfig(_Config):
    """Prompt lookup. `max_draft_len` is the draft length (prompt_lookup_num_tokens in the engine flow)."""

    decoding_type: Literal["NGram"] = "NGram"
    max_draft_len: int = 10
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True
    # Our extensions (not TensorRT-LLM's): several matches as one tree; drafts capped by match length.
    max_candidates: int = 1
    ngram_draft_lens: tuple[int, ...] = (2, 5)
    mode: ClassVar[str] = "prompt_lookup"

    def check(self) -> None:
        if not 0 < self.max_draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(f"prompt lookup needs 0 < max_draft_len (prompt_lookup_num_tokens) <= {MAX_DRAFT_LEN}, got {self.max_draft_len}")
        if not 1 <= self.max_matching_ngram_size <= MAX_NGRAM_SIZE:
            raise ConfigError(f"max_matching_ngram_size must be in [1, {MAX_NGRAM_SIZE}], got {_short(self.max_matching_ngram_size)}")
        if not 1 <= self.max_candidates <= MAX_CANDIDATES:
            raise ConfigError(f"max_candidates must be in [1, {MAX_CANDIDATES}], got {_short(self.max_candidates)}")
        if len(self.ngram_draft_lens) > MAX_DRAFT_CAPS:
            raise ConfigError(f"ngram_draft_lens has {len(self.ngram_draft_lens)} entries; at most {MAX_DRAFT_CAPS}")
        if any(k < 0 for k in self.ngram_draft_lens):
            raise ConfigError(f"ngram_draft_lens must be non-negative, got {_short(list(self.ngram_draft_lens))}")
        if any(k > MAX_DRAFT_LEN for k in self.ngram_draft_lens):
            raise ConfigError(f"ngram_draft_lens entries are draft lengths, at most {MAX_DRAFT_LEN}; got {_short(list(self.ngram_draft_lens))}")



class SuffixDecodingConfig(_Config):
    """Suffix decoding (SuffixDecoding; vLLM's `suffix` method): the most frequent continuation of the
    context's longest recurring suffix, counted in a suffix tree over the prompt and the output so far.
    Field names are vLLM's (`suffix_decoding_*`); `max_draft_len` is its num_speculative_tokens."""

    decoding_type: Literal["Suffix"] = "Suffix"
    max_draft_len: int = 24
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # vLLM also counts up to this many earlier requests' responses, shared by every request an engine serves:
    # 0 keeps each request's drafts its own (on a public Space, nobody's drafts come from another visitor's text).
    suffix_decoding_max_cached_requests: int = 0
    # Ours (the transformers backend): verify the most probable continuations as a tree instead of one chain.
    use_tree_spec: bool = False
    mode: ClassVar[str] = "suffix"

    def check(self) -> None:
        if not 0 < self.max_draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(f"suffix decoding needs 0 < max_draft_len (num_speculative_tokens) <= {MAX_DRAFT_LEN}, got {_short(self.max_draft_len)}")
        if not 1 <= self.suffix_decoding_max_tree_depth <= MAX_SUFFIX_DEPTH:
            raise ConfigError(f"suffix_decoding_max_tree_depth must be in [1, {MAX_SUFFIX_DEPTH}], got {_short(self.suffix_decoding_max_tree_depth)}")
        if not (math.isfinite(self.suffix_decoding_max_spec_factor) and 0 <= self.suffix_decoding_max_spec_factor <= MAX_SPEC_FACTOR):
            raise ConfigError(f"suffix_decoding_max_spec_factor must be in [0, {MAX_SPEC_FACTOR:g}], got {_short(self.suffix_decoding_max_spec_factor)}")
        if not 0 <= self.suffix_decoding_min_token_prob <= 1:
            raise ConfigError(f"suffix_decoding_min_token_prob must be in [0, 1], got {_short(self.suffix_decoding_min_token_prob)}")
        if not 0 <= self.suffix_decoding_max_cached_requests <= MAX_CACHED_REQUESTS:
            raise ConfigError(f"suffix_decoding_max_cached_requests must be in [0, {MAX_CACHED_REQUESTS}], got {_short(self.suffix_decoding_max_cached_requests)}")



class DraftTargetDecodingConfig(_Config):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"
    max_draft_len: int = 4
    speculative_model: str | None = None  # None = the target's shipped draft, when there is one
    mode: ClassVar[str] = "draft_target"

    def check(self) -> None:
        if not 0 < self.max_draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(f"draft-target needs 0 < max_draft_len <= {MAX_DRAFT_LEN}, got {self.max_draft_len}")



class MedusaDecodingConfig(_Config):
    decoding_type: Literal["Medusa"] = "Medusa"
    medusa_choices: str | list[list[int]] = "default"
    num_medusa_heads: int | None = None  # None = the checkpoint's medusa_num_heads
    speculative_model: str | None = None  # heads directory; None = the target's shipped heads
    typical_acceptance: bool = False  # sampling only; NOT lossless
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    min_path_prob: float | None = None  # ours (transformers backend): prune nodes the heads find unlikely; see MIN_PATH_PROB
    prompt_lookup: NGramDecodingConfig | None = None  # ours (transformers backend): merge its candidates into the tree
    mode: ClassVar[str] = "medusa"

    def paths(self) -> list[list[int]]:
        spec = self.medusa_choices
        return medusa_choices(spec if isinstance(spec, str) else _json(spec))

    @property
    def max_draft_len(self) -> int:
        return len(self.paths())

    def check(self) -> None:
        paths = self.paths()
        if self.num_medusa_heads is not None:
            if not 1 <= self.num_medusa_heads <= MAX_TREE_DEPTH:
                raise ConfigError(f"num_medusa_heads must be in [1, {MAX_TREE_DEPTH}], got {_short(self.num_medusa_heads)}")
            deepest = max(map(len, paths))
            if deepest > self.num_medusa_heads:
                raise ConfigError(f"the Medusa tree is {deepest} deep but there are only {self.num_medusa_heads} heads")
        if not 0 < self.posterior_threshold <= 1 or not 0 <= self.posterior_alpha <= 1:
            raise ConfigError("posterior_threshold must be in (0, 1] and posterior_alpha in [0, 1]")
        _check_min_path_prob(self.min_path_prob)
        if self.prompt_lookup is not None:
            self.prompt_lookup.check()


    @property
    def pruning(self) -> float:
        """The min path probability the transformers backend prunes the tree at (MIN_PATH_PROB when unset)."""
        return MIN_PATH_PROB if self.min_path_prob is None else self.min_path_prob


class EagleDecodingConfig(_Config):
    """EAGLE-2 dynamic tree (use_dynamic_tree) or a static tree (eagle_choices).

    Here max_draft_len counts the tree's nodes and num_eagle_layers its depth (the drafting steps).
    TensorRT-LLM 1.2's EagleDecodingConfig means by max_draft_len the drafting steps and derives
    num_eagle_layers and max_total_draft_tokens from it (llm_args.py validate_eagle_config), so
    trtllm_speculative_config sends the depth as its max_draft_len."""

    decoding_type: Literal["Eagle"] = "Eagle"
    max_draft_len: int = 23  # tree nodes verified per step (our total_tokens - 1)
    speculative_model: str | None = None  # module directory; None = the target's shipped module
    eagle_choices: str | list[list[int]] | None = None
    use_dynamic_tree: bool = True
    dynamic_tree_max_topK: int = 4
    num_eagle_layers: int = 5  # tree depth
    min_path_prob: float | None = None  # ours (transformers backend): prune dynamic-tree nodes the draft finds unlikely
    prompt_lookup: NGramDecodingConfig | None = None  # ours (transformers backend): merge its candidates into the tree
    mode: ClassVar[str] = "eagle"

    def paths(self) -> list[list[int]]:
        """The static tree's paths (eagle_choices); ConfigError without one."""
        if self.eagle_choices is None:
            raise ConfigError("this EAGLE config has no static tree (eagle_choices)")
        spec = self.eagle_choices
        return medusa_choices(spec if isinstance(spec, str) else _json(spec))

    def check(self) -> None:
        if not 0 < self.max_draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(
                f"max_draft_len must be > 0 for EAGLE (and at most {MAX_DRAFT_LEN}; eagle_total_tokens = max_draft_len + 1), got {self.max_draft_len}"
            )
        if not 1 <= self.dynamic_tree_max_topK <= MAX_EAGLE_TOP_K:
            raise ConfigError(f"dynamic_tree_max_topK (eagle_top_k) must be in [1, {MAX_EAGLE_TOP_K}], got {_short(self.dynamic_tree_max_topK)}")
        if not 1 <= self.num_eagle_layers <= MAX_TREE_DEPTH:
            raise ConfigError(f"num_eagle_layers (the tree depth, eagle_depth) must be in [1, {MAX_TREE_DEPTH}], got {_short(self.num_eagle_layers)}")
        _check_min_path_prob(self.min_path_prob)
        if self.min_path_prob and not self.use_dynamic_tree:
            raise ConfigError("min_path_prob prunes the dynamic tree; a static tree (eagle_choices) keeps its shape")
        if self.use_dynamic_tree == (self.eagle_choices is not None):
            raise ConfigError("EAGLE needs either use_dynamic_tree or eagle_choices (a static tree), not both or neither")
        if self.eagle_choices is not None:
            paths = self.paths()
            if len(paths) > self.max_draft_len:
                raise ConfigError(f"eagle_choices has {len(paths)} nodes but max_draft_len is {self.max_draft_len}")
        if self.prompt_lookup is not None:
            self.prompt_lookup.check()


    @property
    def pruning(self) -> float:
        """The min path probability the transformers backend prunes the dynamic tree at (MIN_PATH_PROB when unset);
        a static tree keeps its shape."""
        if not self.use_dynamic_tree:
            return 0.0
        return MIN_PATH_PROB if self.min_path_prob is None else self.min_path_prob


def _whole(v: Any) -> Any:
    """JSON's 1e30 is a whole number too: as an int, it meets the field's bound and its sentence, not pydantic's
    complaint about parsing."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else v


def _short(value: Any) -> str:
    """A number or list as a user typed it, cut short: a 300-digit integer is no message."""
    text = str(value)
    return text if len(text) <= 24 else text[:20] + "…"


def _check_min_path_prob(p: float | None) -> None:
    if p is not None and not 0.0 <= p < 1.0:
        raise ConfigError(f"min_path_prob must be in [0, 1) (0 = no pruning), got {p}")


class DecodeRequest(_Config):
    """One generation: mode config, sampling, budget, backend (TensorRT-LLM backend flavour when it applies)."""

    speculative_config: Any = Field(default_factory=AutoregressiveConfig)  # one of `modes`' configs (Modes.request)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    backend: str = "transformers"
    trtllm_backend: Literal["pytorch", "tensorrt"] | None = None  # None = the one the mode needs
    # The transformers backend loads the model once per dtype; "auto" = the dtype the server was started with.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    modes: ClassVar[Any] = None  # the registry (app/modes/registry.py Modes) whose request type this is

    @property
    def entry(self):
        """The mode's registry entry (app/modes/registry.py)."""
        return self.modes[self.mode]

    @field_validator("max_new_tokens", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        return _whole(v)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend '{v}': choose one of {', '.join(BACKENDS)}")
        return v

    @property
    def mode(self) -> str:
        return self.speculative_config.mode

    def check(self, max_new_tokens_limit: int | None = None) -> None:
        self.sampling.check()
        self.speculative_config.check()
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ConfigError(f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {_short(self.max_new_tokens)}")
        if max_new_tokens_limit is not None and self.max_new_tokens > max_new_tokens_limit:
            raise ConfigError(f"max_new_tokens is limited to {max_new_tokens_limit} here, got {self.max_new_tokens}")
        if self.dtype != "auto" and self.backend not in ("transformers", "vllm"):
            raise ConfigError(
                f"dtype {self.dtype} can be chosen per request on the transformers and vllm backends only; "
                f"{self.backend} runs the model in the dtype it was built or served with: use auto"
            )


def validated(model: type[BaseModel], data: Any, what: str):
    """`model` from JSON-like data; pydantic's first complaint becomes one ConfigError sentence naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or what
        raise ConfigError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None


def parse(data: dict[str, Any], modes=None, max_new_tokens_limit: int | None = None) -> DecodeRequest:
    """A DecodeRequest of `modes` (a registry, app/modes/registry.py; default the app's) from JSON-like data, checked
    against every rule of its mode (a backend's own rules are that backend's `check`); every problem becomes one
    ConfigError sentence."""
    if modes is None:
        from app.modes import MODES as modes  # the shipped registry is built on these configs
    request = validated(modes.request, data, "request")
    request.check(max_new_tokens_limit)
    return request


def check_prompt_limit(prompt_tokens: int, limit: int) -> None:
    """A server's own cap on prompt length (Limits.max_prompt_tokens), below the model's context."""
    if prompt_tokens > limit:
        raise ConfigError(f"the prompt has {prompt_tokens} tokens; this server takes at most {limit}: shorten it")


def check_context(prompt_tokens: int, max_new_tokens: int, context: int) -> None:
    if prompt_tokens < 1:
        raise ConfigError("the prompt is empty: give at least one token")
    if prompt_tokens >= context:
        raise ConfigError(f"the prompt has {prompt_tokens} tokens but the model's context holds {context}: shorten it")


def _json(paths: list[list[int]]) -> str:
    return json.dumps(paths)
