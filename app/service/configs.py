"""Typed decoding configs with TensorRT-LLM's field names, validated with TensorRT-LLM's rules.

Every problem becomes one sentence a user understands (ConfigError); `check()` runs every rule
that needs no loaded model, `check_models()` the ones that do (vocabularies, heads, context).
Which configs a request may carry is the registry's (app/modes.py: `Modes.request`, what `parse` validates);
`to_runtime()` turns a valid request into the transformers backend's DecodingConfig, and
`trtllm_speculative_config()` / `trtllm_build_plan()` into what TensorRT-LLM's LLM API and
`trtllm-build` take (pure data: nothing here imports tensorrt_llm).

Support matrix (TensorRT-LLM 1.2, tensorrt_llm/llmapi/llm_args.py `supports_backend`): lookahead and
Medusa run only on its TensorRT-engine backend, NGram and draft-target only on its PyTorch backend,
EAGLE on both (the PyTorch backend takes EAGLE-3 checkpoints only, TorchLlmArgs.validate_speculative_config;
the engine backend EAGLE-1/2 ones, models/eagle/config.py). docs/tensorrt-llm.md has the whole reading.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.config import ConfigError, medusa_choices
from app.decoding.sampling import SamplingParams

MAX_DRAFT_LEN = 256  # this app's bound on the draft tokens one step verifies (every mode, every backend)
# Upper bounds of the other numeric fields, for every entry point (web, CLI, HTTP `specdec`): far above any
# useful setting, low enough that no value makes one step run for long or a number overflow.
MAX_NEW_TOKENS = 8192
MAX_SEED = 2**63 - 1  # torch's generator takes a signed 64-bit seed
MAX_TEMPERATURE = 100.0
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
# What one step of the transformers backend may do, so a step stays well under a second on a 2-core CPU
# (float32, SmolLM2-135M; measured in docs/ui.md, "Hosting publicly"): the time limit is checked between
# steps, so bounding a step bounds how long a request can outlive it. TensorRT-LLM's engines keep their own limits.
STEP_DRAFT_TOKENS = 96  # draft tokens one target pass verifies (every mode's tree or chain, merged branch included)
STEP_DRAFT_MODEL_TOKENS = 32  # draft-target: sequential draft-model passes per step
# EAGLE-2 dynamic trees (the web sliders' maxima): the draft expands top-k nodes per level, one pass per level,
# and ranks every candidate; the verified tree is smaller than the other modes' limit.
STEP_EAGLE_TOP_K = 10
STEP_EAGLE_DEPTH = 8
STEP_EAGLE_TOKENS = 63  # max_draft_len (total tokens 64)
# The transformers backend's tree pruning when a request leaves min_path_prob unset: on a CPU every verified node
# costs target compute, and an unpruned 24-node EAGLE step costs about two one-token passes (through the service,
# bfloat16, side by side: 1.01x autoregressive unpruned, 1.45x pruned at 0.05; see docs/algorithms.md). Pruning keeps every mode
# lossless: the tree stays a deterministic function of the context. TensorRT-LLM has no such setting (unset: none).
MIN_PATH_PROB = 0.05
BACKENDS = ("transformers", "tensorrt_llm", "remote", "vllm")


class _Config(BaseModel):
    """A mode's config (its entry in app/modes.py names it); `drafter()` builds its drafter from a checked one."""

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

    def drafter(self, target=None, companion=None):
        from app.decoding.drafters.autoregressive import Autoregressive

        return Autoregressive()


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

    def check_trtllm(self) -> None:
        """TensorRT-LLM's LLM API types (W, N, G) and a request's (w, n, g) as PositiveInt (llm_args.py
        LookaheadDecodingConfig; SamplingParams.lookahead_config is that class too), although its C++
        executor would take G = 0 (decodingConfig.cpp): a zero is refused on that backend, not sent."""
        for what, (w, n, g) in (("lookahead (W, N, G)", (self.max_window_size, self.max_ngram_size, self.max_verification_set_size)),
                                ("lookahead's per-request (w, n, g)", self.request)):
            if min(w, n, g) < 1:
                raise ConfigError(
                    f"{what} = ({w}, {n}, {g}): TensorRT-LLM's LookaheadDecodingConfig takes positive "
                    "integers only, so a 0 cannot be sent to it; use values >= 1 on this backend, or the transformers "
                    "backend, which runs this")
            if self.request is None:
                break

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

    def drafter(self, target=None, companion=None):
        from app.decoding.drafters.lookahead import Lookahead

        return Lookahead(self.max_window_size, self.max_ngram_size, self.max_verification_set_size, request=self.request,
                         pool_from_prompt=self.pool_from_prompt)


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

    def drafter(self, target=None, companion=None):
        from app.decoding.drafters.prompt_lookup import PromptLookup

        return PromptLookup(self.max_draft_len, self.max_matching_ngram_size, self.is_use_oldest, self.max_candidates,
                            self.ngram_draft_lens)


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

    def drafter(self, target=None, companion=None):
        from app.decoding.drafters.suffix import Suffix

        return Suffix(self.max_draft_len, self.suffix_decoding_max_tree_depth, self.suffix_decoding_max_spec_factor,
                      self.suffix_decoding_min_token_prob, self.use_tree_spec)


class DraftTargetDecodingConfig(_Config):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"
    max_draft_len: int = 4
    speculative_model: str | None = None  # None = the target's shipped draft, when there is one
    mode: ClassVar[str] = "draft_target"

    def check(self) -> None:
        if not 0 < self.max_draft_len <= MAX_DRAFT_LEN:
            raise ConfigError(f"draft-target needs 0 < max_draft_len <= {MAX_DRAFT_LEN}, got {self.max_draft_len}")

    def drafter(self, target, companion):
        """`companion`: the draft model runner.load_companion loaded."""
        from app.decoding.drafters.draft_model import DraftModel

        return DraftModel(companion.model, self.max_draft_len, d2t=companion.draft_vocab)


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

    def drafter(self, target, companion):
        """`target`: the target torch model; `companion`: the heads runner.load_companion loaded."""
        from app.decoding.drafters.medusa import Medusa

        return _merged(self, Medusa(companion, target.get_output_embeddings(), self.paths(),
                                    posterior_threshold=self.posterior_threshold, posterior_alpha=self.posterior_alpha,
                                    typical=self.typical_acceptance, min_path_prob=self.pruning))

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

    def drafter(self, target, companion):
        """`target`: the target torch model; `companion`: the EAGLE module runner.load_companion loaded."""
        from app.decoding.drafters.eagle import Eagle

        static = None if self.use_dynamic_tree else self.paths()
        return _merged(self, Eagle(companion, target.get_input_embeddings(), total_tokens=self.max_draft_len + 1,
                                   depth=self.num_eagle_layers, top_k=self.dynamic_tree_max_topK, static_choices=static,
                                   min_path_prob=self.pruning))

    @property
    def pruning(self) -> float:
        """The min path probability the transformers backend prunes the dynamic tree at (MIN_PATH_PROB when unset);
        a static tree keeps its shape."""
        if not self.use_dynamic_tree:
            return 0.0
        return MIN_PATH_PROB if self.min_path_prob is None else self.min_path_prob


def _merged(c: MedusaDecodingConfig | EagleDecodingConfig, tree):
    """The tree drafter, with prompt lookup's candidates merged into its tree when the config asks for them."""
    if c.prompt_lookup is None:
        return tree
    from app.decoding.drafters.merged import Merged

    return Merged(tree, c.prompt_lookup.drafter())


def _whole(v: Any) -> Any:
    """JSON's 1e30 is a whole number too: as an int, it meets the field's bound and its sentence, not pydantic's
    complaint about parsing."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else v


def _short(value: Any) -> str:
    """A number or list as a user typed it, cut short: a 300-digit integer is no message."""
    text = str(value)
    return text if len(text) <= 24 else text[:20] + "…"


def _step_budget(request: DecodeRequest) -> None:
    """The transformers backend's bounds on one step (STEP_*): each step well under a second here."""
    c = request.speculative_config
    nodes = 0 if isinstance(c, AutoregressiveConfig) else c.max_draft_len
    if isinstance(c, NGramDecodingConfig):
        nodes = c.max_draft_len * c.max_candidates
    pl = getattr(c, "prompt_lookup", None)
    if pl is not None:
        nodes += pl.max_draft_len * pl.max_candidates
    if nodes > STEP_DRAFT_TOKENS:
        raise ConfigError(f"this {c.mode} config verifies up to {nodes} draft tokens a step; the transformers backend "
                          f"verifies at most {STEP_DRAFT_TOKENS} (so a step stays well under a second on a CPU)")
    if isinstance(c, DraftTargetDecodingConfig) and c.max_draft_len > STEP_DRAFT_MODEL_TOKENS:
        raise ConfigError(f"draft-target's max_draft_len is at most {STEP_DRAFT_MODEL_TOKENS} on the transformers backend "
                          f"(one draft-model pass per drafted token), got {c.max_draft_len}")
    if isinstance(c, EagleDecodingConfig) and c.use_dynamic_tree and (
            c.dynamic_tree_max_topK > STEP_EAGLE_TOP_K or c.num_eagle_layers > STEP_EAGLE_DEPTH or c.max_draft_len > STEP_EAGLE_TOKENS):
        raise ConfigError(f"the transformers backend grows EAGLE-2 trees of top-k at most {STEP_EAGLE_TOP_K}, depth at most "
                          f"{STEP_EAGLE_DEPTH} and max_draft_len at most {STEP_EAGLE_TOKENS}, got top-k "
                          f"{c.dynamic_tree_max_topK}, depth {c.num_eagle_layers} and max_draft_len {c.max_draft_len}")


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
    modes: ClassVar[Any] = None  # the registry (app/modes.py Modes) whose request type this is

    @property
    def entry(self):
        """The mode's registry entry (app/modes.py)."""
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
        if self.backend == "transformers":
            _step_budget(self)
            if getattr(self.speculative_config, "suffix_decoding_max_cached_requests", 0):
                raise ConfigError("suffix_decoding_max_cached_requests is the vLLM engine's (a cache of earlier responses "
                                  "shared by every request): this app's loop drafts from each request's own text, use 0")
        if self.dtype != "auto" and self.backend not in ("transformers", "vllm"):
            raise ConfigError(
                f"dtype {self.dtype} can be chosen per request on the transformers and vllm backends only; "
                f"{self.backend} runs the model in the dtype it was built or served with: use auto"
            )
        if self.backend == "vllm":
            from app.service import vllm  # it builds on these configs

            reason = vllm.method_reason(self)
            if reason:
                raise ConfigError(reason)
        if self.backend == "tensorrt_llm":
            allowed = self.entry.trtllm
            if not allowed:
                raise ConfigError(f"TensorRT-LLM has no {self.mode} decoding: {self.entry.trtllm_missing}")
            flavour = self.trtllm_backend or allowed[0]
            if flavour not in allowed:
                raise ConfigError(
                    f"TensorRT-LLM runs {self.mode} only on its {' or '.join(allowed)} backend, not on {flavour}"
                )
            if self.entry.draft_model and self.speculative_config.speculative_model is None:
                raise ConfigError(f"TensorRT-LLM needs a draft model for {self.mode}: set speculative_model")
            if isinstance(self.speculative_config, LookaheadDecodingConfig):
                self.speculative_config.check_trtllm()
            if getattr(self.speculative_config, "min_path_prob", 0):
                raise ConfigError("min_path_prob (tree pruning) is this app's own: TensorRT-LLM has no such setting, use 0")
            if getattr(self.speculative_config, "prompt_lookup", None) is not None:
                raise ConfigError(f"merging prompt lookup into the {self.mode} tree is this app's own: TensorRT-LLM cannot, leave prompt_lookup unset")
            if self.mode == "medusa" and not self.sampling.temperature == 0:
                raise ConfigError("TensorRT-LLM's Medusa verifies by token match only: use temperature 0")


def validated(model: type[BaseModel], data: Any, what: str):
    """`model` from JSON-like data; pydantic's first complaint becomes one ConfigError sentence naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or what
        raise ConfigError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None


def parse(data: dict[str, Any], modes=None) -> DecodeRequest:
    """A DecodeRequest of `modes` (a registry of app/modes.py; default the app's) from JSON-like data, checked;
    every problem becomes one ConfigError sentence."""
    if modes is None:
        from app.modes import MODES as modes  # the registry is built on these configs
    request = validated(modes.request, data, "request")
    request.check()
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


@dataclass
class DecodingConfig:
    """A checked request as the transformers backend's loop runs it."""

    speculative_config: Any = field(default_factory=AutoregressiveConfig)  # one mode's checked config
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()

    @property
    def mode(self) -> str:
        return self.speculative_config.mode

    def drafter(self, target=None, companion=None):
        """A fresh drafter for one generation. `target` is the target torch model; `companion` what
        runner.load_companion loaded (draft model, Medusa heads or EAGLE module)."""
        return self.speculative_config.drafter(target, companion)


def to_runtime(request: DecodeRequest) -> DecodingConfig:
    """The transformers backend's runtime config for a checked request."""
    s = request.sampling
    return DecodingConfig(request.speculative_config, request.max_new_tokens,
                          SamplingParams(s.temperature, s.top_p, s.top_k, s.seed))


def trtllm_backend(request: DecodeRequest) -> str:
    """'pytorch' or 'tensorrt': the one asked for, or the first that runs the mode (its entry's `trtllm`)."""
    return request.trtllm_backend or request.entry.trtllm[0]


def trtllm_notes(request: DecodeRequest) -> list[str]:
    """What of a valid request TensorRT-LLM does not take, in words: settings of this app's own that its
    configs have no field for (so they are not sent), and meanings that differ (llm_args.py, 1.2)."""
    c, notes = request.speculative_config, []
    if isinstance(c, NGramDecodingConfig) and (c.max_candidates != 1 or c.ngram_draft_lens):
        notes.append(f"max_candidates ({c.max_candidates}) and ngram_draft_lens ({', '.join(map(str, c.ngram_draft_lens))}) "
                     f"are this app's own: TensorRT-LLM's NGramDecodingConfig has neither and drafts one match of up to "
                     f"{c.max_draft_len} tokens")
    if isinstance(c, LookaheadDecodingConfig) and not c.pool_from_prompt:
        notes.append("pool_from_prompt off is this app's own: TensorRT-LLM's LookaheadDecodingConfig has no such field "
                     "and always seeds its n-gram pool from the prompt (lookaheadAlgorithm.cpp setup)")
    if isinstance(c, EagleDecodingConfig):
        depth = c.num_eagle_layers if c.eagle_choices is None else max(map(len, c.paths()))
        notes.append(f"TensorRT-LLM's max_draft_len is the number of drafting steps, sent as {depth} (the tree's depth); "
                     f"it sets num_eagle_layers and max_total_draft_tokens from it itself")
        if trtllm_backend(request) == "tensorrt":
            notes.append(f"on the engine backend its LLM API also sets the engine's build_config.max_draft_len from it "
                         f"(BaseLlmArgs.validate_speculative_config), so the engine holds {depth} draft tokens per step, "
                         f"not the tree's {c.max_draft_len}")
        elif c.use_dynamic_tree:
            notes.append(f"the dynamic tree's total tokens ({c.max_draft_len + 1}) and top-K ({c.dynamic_tree_max_topK}) are "
                         f"not sent: TensorRT-LLM 1.2's PyTorch backend drafts a chain of {depth} tokens (its "
                         f"validate_eagle_config sets max_total_draft_tokens to max_draft_len)")
    return notes


def trtllm_speculative_config(request: DecodeRequest) -> dict[str, Any] | None:
    """The `speculative_config` for TensorRT-LLM's LLM(...) / trtllm-serve YAML, as plain data; None = none.
    Fields as TensorRT-LLM 1.2 names and means them (llm_args.py); what it has no field for is left out
    and said by trtllm_notes. What comes from a trained artifact (Medusa's head count, EAGLE-3's capture
    layers) is the build plan's to add (engines.trtllm_plan)."""
    c = request.speculative_config
    if isinstance(c, AutoregressiveConfig):
        return None
    if isinstance(c, LookaheadDecodingConfig):
        return {"decoding_type": "Lookahead", "max_window_size": c.max_window_size, "max_ngram_size": c.max_ngram_size,
                "max_verification_set_size": c.max_verification_set_size}
    if isinstance(c, NGramDecodingConfig):
        return {"decoding_type": "NGram", "max_draft_len": c.max_draft_len, "max_matching_ngram_size": c.max_matching_ngram_size,
                "is_keep_all": c.is_keep_all, "is_use_oldest": c.is_use_oldest, "is_public_pool": c.is_public_pool}
    if isinstance(c, DraftTargetDecodingConfig):
        return {"decoding_type": "Draft_Target", "max_draft_len": c.max_draft_len, "speculative_model": c.speculative_model}
    if isinstance(c, MedusaDecodingConfig):
        return {"decoding_type": "Medusa", "max_draft_len": c.max_draft_len, "medusa_choices": c.paths(),
                "num_medusa_heads": c.num_medusa_heads, "speculative_model": c.speculative_model}
    if not isinstance(c, EagleDecodingConfig):
        raise ConfigError(f"TensorRT-LLM has no {c.mode} decoding: {request.entry.trtllm_missing}")
    out = {"decoding_type": "Eagle", "max_draft_len": c.num_eagle_layers, "speculative_model": c.speculative_model}
    if c.eagle_choices is not None:
        paths = c.paths()
        out.update(eagle_choices=paths, max_draft_len=max(map(len, paths)))  # upstream resets it to the depth
    elif trtllm_backend(request) == "tensorrt":  # the engine's EAGLE-2 tree; see trtllm_notes for PyTorch's
        out.update(use_dynamic_tree=c.use_dynamic_tree, dynamic_tree_max_topK=c.dynamic_tree_max_topK)
    if trtllm_backend(request) == "pytorch":
        # Sampling is chosen per request: without this the one-model EAGLE-3 path samples greedily whatever
        # the temperature (llm_args.py DecodingBaseConfig.allow_advanced_sampling).
        out["allow_advanced_sampling"] = True
    return out


def trtllm_engine_draft_len(request: DecodeRequest) -> int:
    """The engine's build_config.max_draft_len as TensorRT-LLM's LLM API sets it (llm_args.py
    BaseLlmArgs.validate_speculative_config): the speculative config's max_draft_len, which for EAGLE is the
    depth trtllm_speculative_config sends, not this app's node count; lookahead's is its formula."""
    c = request.speculative_config
    if isinstance(c, EagleDecodingConfig):
        return trtllm_speculative_config(request)["max_draft_len"]
    return c.max_draft_len


def trtllm_build_plan(request: DecodeRequest, checkpoint_dir: str, output_dir: str, max_batch_size: int = 8) -> list[str]:
    """The `trtllm-build` command for users who build TensorRT engines by hand (≤ 1.2, engine backend), with the
    max_draft_len the LLM API would build the same engine with (trtllm_engine_draft_len)."""
    c = request.speculative_config
    mode = {"Lookahead": "lookahead_decoding", "Medusa": "medusa", "Eagle": "eagle",
            "Draft_Target": "draft_tokens_external", "NGram": "draft_tokens_external"}.get(c.decoding_type)
    cmd = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir,
           "--max_batch_size", str(max_batch_size), "--max_beam_width", "1"]
    if mode is not None:
        cmd += ["--speculative_decoding_mode", mode, "--max_draft_len", str(trtllm_engine_draft_len(request))]
    if c.decoding_type in ("Draft_Target", "NGram"):
        cmd += ["--use_paged_context_fmha", "enable"]
    return cmd


def _json(paths: list[list[int]]) -> str:
    return json.dumps(paths)
