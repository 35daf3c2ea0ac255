"""Typed decoding configs with TensorRT-LLM's field names, validated with TensorRT-LLM's rules.

Every problem becomes one sentence a user understands (ConfigError); `check()` runs every rule of the mode
itself. What a backend adds (the transformers backend's step limits, TensorRT-LLM's support matrix, vLLM's
methods) is that backend's `check` (app/backends/), which the service runs once per request; what only a
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
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.modes.errors import ConfigError, one_line
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
# costs target compute, so nodes the draft finds unlikely cost more than they bring (measured in docs/algorithms.md,
# "Pruning trees by path probability"). Pruning keeps every mode lossless: the tree stays a deterministic function of
# the context. TensorRT-LLM has no such setting (unset: none).
MIN_PATH_PROB = 0.05
PRUNE_HELP = ("Medusa / EAGLE dynamic tree: drop draft nodes whose path probability under the draft is lower "
              f"(0 = keep all; default {MIN_PATH_PROB} on the transformers backend, none on TensorRT-LLM)")


@dataclass(frozen=True)
class Bound:
    """A numeric setting's legal range, in its field's metadata (`Annotated[int, Bound(1, 256)]`): the one place it is
    written. `_Config.check` refuses a value outside it in one sentence; the command line's help, the Run tab's
    sliders and docs/settings.md read it from there (`bound`)."""

    low: float
    high: float
    low_open: bool = False  # (low, …: low itself is refused
    high_open: bool = False
    aka: str = ""  # its other name, said beside it: "prompt_lookup_num_tokens"
    note: str = ""  # after the range: "(0 = off)"
    slider: tuple[float, float] | None = None  # the Run tab's range where narrower than the legal one
    high_text: str = ""  # the top as the sentence writes it ("2^63 - 1")
    what: str = ""  # "a whole number": what the sentence says it must be

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def range(self) -> str:
        def number(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"
        return (f"{'(' if self.low_open else '['}{number(self.low)}, {self.high_text or number(self.high)}"
                f"{')' if self.high_open else ']'}")

    def refusal(self, name: str, value: Any) -> str:
        what = self.what
        named = f"{name} ({self.aka})" if self.aka else name
        return f"{named} must be {what + ' ' if what else ''}in {self.range()}{' ' + self.note if self.note else ''}, got {_short(value)}"


def bound(config: type[BaseModel], name: str) -> Bound | None:
    """Field `name`'s Bound, if it has one."""
    return next((m for m in config.model_fields[name].metadata if isinstance(m, Bound)), None)


def kinds_of(annotation: Any) -> list[type]:
    """The types a field takes besides None: [int] for `int | None`."""
    return [k for k in (getattr(annotation, "__args__", None) or (annotation,)) if k is not type(None)]


def help_of(config: type[BaseModel], name: str) -> str:
    """Field `name`'s help (its description), with its range where it has one."""
    text, b = config.model_fields[name].description or "", bound(config, name)
    if b is None:
        return text
    said = "; ".join(x for x in (b.aka if b.aka and b.aka not in text else "", f"in {b.range()}") if x)
    return f"{text} ({said})".strip()


class _Config(BaseModel):
    """A mode's config (its entry in app/modes/shipped.py names it); its drafter builds from a checked one (`from_config`).
    `check` refuses a field outside its Bound, then runs the config's own rules (`rules`: what binds fields together)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def check(self) -> None:
        mode = getattr(type(self), "mode", None)  # a mode's config names its mode: `bench --modes a,b` says whose
        for name in type(self).model_fields:
            b, value = bound(type(self), name), getattr(self, name)
            if b is not None and value is not None and not b.holds(value):
                raise ConfigError((f"{mode}: " if isinstance(mode, str) else "") + b.refusal(name, value))
        self.rules()

    def rules(self) -> None:
        pass


class SamplingConfig(_Config):
    temperature: Annotated[float, Bound(0, MAX_TEMPERATURE, note="(0 = greedy)", what="a number")] = Field(
        0.0, description="0: greedy; else sample from softmax(logits / temperature)")
    top_p: Annotated[float, Bound(0, 1, low_open=True)] = Field(1.0, description="sample from the smallest set of tokens this likely")
    top_k: Annotated[int, Bound(0, MAX_TOP_K, note="(0 = off)")] = Field(0, description="sample from the k likeliest tokens (0: all)")
    seed: Annotated[int | None, Bound(0, MAX_SEED, high_text="2^63 - 1", what="a whole number",
                                      note="(or unset for a random one)")] = Field(None, description="the sampler's seed (unset: a random one)")
    beam_width: int = Field(1, description="1 only: speculative decoding has no beam search here")

    @field_validator("seed", "top_k", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        return _whole(v)

    def rules(self) -> None:
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / 1e-308 overflow to inf, and sampling them fails
            raise ConfigError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        if self.beam_width != 1:
            raise ConfigError(f"speculative decoding needs beam width 1 (TensorRT-LLM has no beam search here), got {self.beam_width}")


class AutoregressiveConfig(_Config):
    decoding_type: Literal["Autoregressive"] = "Autoregressive"
    mode: ClassVar[str] = "autoregressive"


class LookaheadDecodingConfig(_Config):
    """(W, N, G): window, n-gram size, verification set; per request (w, n, g) <= (W, N, G)."""

    decoding_type: Literal["Lookahead"] = "Lookahead"
    max_window_size: Annotated[int, Bound(1, MAX_LOOKAHEAD, aka="W", slider=(1, 8))] = Field(
        4, description="the engine's window size W: Jacobi iterations decoded in parallel")
    max_ngram_size: Annotated[int, Bound(1, MAX_LOOKAHEAD, aka="N", slider=(1, 6))] = Field(
        3, description="the engine's n-gram size N: how far back the window reaches")
    max_verification_set_size: Annotated[int, Bound(0, MAX_LOOKAHEAD, aka="G", slider=(0, 8))] = Field(
        4, description="the engine's verification set size G: n-grams verified per step")
    request: tuple[int, int, int] | None = Field(None, description="this request's (w, n, g) <= (W, N, G); unset = (W, N, G)")
    pool_from_prompt: bool = Field(True, description="seed the n-gram pool from the context (the prompt too)")
    mode: ClassVar[str] = "lookahead"

    @property
    def max_total_draft_tokens(self) -> int:
        """The draft tokens one step verifies: TensorRT-LLM's formula, which it calls the engine's max_draft_len (the
        engine must be built with exactly this)."""
        return lookahead_draft_tokens(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)

    def calculate_speculative_resource(self) -> tuple[int, int, int, int]:
        """(maxDecodingTokens, maxPathLen, maxDraftTokens, maxDraftPathLen) as TensorRT-LLM computes them."""
        n, tokens = self.max_ngram_size, self.max_total_draft_tokens
        return tokens + 1, n, tokens, n - 1

    def rules(self) -> None:
        lookahead_rules((self.max_window_size, self.max_ngram_size, self.max_verification_set_size), self.request)


def lookahead_draft_tokens(w: int, n: int, g: int) -> int:
    """TensorRT-LLM's draft-token budget for (W, N, G): (0 if N == 1 else N - 2) + (W - 1 + G)(N - 1)."""
    return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)


def _lookahead_legal(w: int, n: int, g: int, what: str) -> None:
    if w < 1 or n < 1 or g < 0:
        raise ConfigError(f"{what} needs W >= 1, N >= 1 and G >= 0, got ({_short(w)}, {_short(n)}, {_short(g)})")
    if max(w, n, g) > MAX_LOOKAHEAD:
        raise ConfigError(f"{what}: each of W, N and G is at most {MAX_LOOKAHEAD}, got ({_short(w)}, {_short(n)}, {_short(g)})")
    if n == 1 and w != 1:
        raise ConfigError(f"{what}: an n-gram size of 1 requires a window size of 1 (got W={w}); (1, 1, 0) is autoregressive")
    if n == 1 and g != 0:
        raise ConfigError(f"{what}: an n-gram size of 1 requires a verification set size of 0 (got G={g})")


def lookahead_rules(limits: tuple[int, int, int], request: tuple[int, int, int] | None) -> None:
    """Lookahead's rules, for its config and its drafter alike: the engine's (W, N, G) and a request's (w, n, g)."""
    W, N, G = limits
    _lookahead_legal(W, N, G, "lookahead (W, N, G)")
    tokens = lookahead_draft_tokens(W, N, G)
    if tokens > MAX_DRAFT_LEN:
        raise ConfigError(
            f"lookahead ({W}, {N}, {G}) needs {tokens} draft tokens per step = (N-2) + (W-1+G)(N-1) (TensorRT-LLM's "
            f"max_draft_len), more than this app's limit of {MAX_DRAFT_LEN}"
        )
    if request is not None:
        w, n, g = request
        _lookahead_legal(w, n, g, "the per-request (w, n, g)")
        if w > W or n > N or g > G:
            raise ConfigError(f"the per-request (w, n, g) = ({w}, {n}, {g}) exceeds the engine's (W, N, G) = ({W}, {N}, {G})")



class NGramDecodingConfig(_Config):
    """Prompt lookup. `max_draft_len` is the draft length (prompt_lookup_num_tokens in the engine flow)."""

    decoding_type: Literal["NGram"] = "NGram"
    max_draft_len: Annotated[int, Bound(1, MAX_DRAFT_LEN, aka="prompt_lookup_num_tokens", slider=(1, 32))] = Field(
        10, description="prompt lookup: tokens copied after a match")
    max_matching_ngram_size: Annotated[int, Bound(1, MAX_NGRAM_SIZE, slider=(1, 6))] = Field(
        2, description="prompt lookup: the longest n-gram matched (it tries this size first, then shorter)")
    is_keep_all: bool = Field(True, description="TensorRT-LLM's: keep every match in its pool (this app keeps all)")
    is_use_oldest: bool = Field(True, description="copy after the earliest match (off: the latest)")
    is_public_pool: bool = Field(True, description="TensorRT-LLM's: one pool shared by the requests of an engine")
    # Our extensions (not TensorRT-LLM's): several matches as one tree; drafts capped by match length.
    max_candidates: Annotated[int, Bound(1, MAX_CANDIDATES, slider=(1, 4))] = Field(
        1, description="prompt lookup: verify this many matches' continuations as one tree")
    ngram_draft_lens: tuple[int, ...] = Field(
        (2, 5), description="prompt lookup: draft at most this many tokens after a 1-gram, 2-gram, … match (empty: always "
                            "max_draft_len)")
    mode: ClassVar[str] = "prompt_lookup"

    @property
    def max_total_draft_tokens(self) -> int:
        """Each match verified together drafts its own chain (max_candidates > 1: a tree)."""
        return self.max_draft_len * self.max_candidates

    def rules(self) -> None:
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
    max_draft_len: Annotated[int, Bound(1, MAX_DRAFT_LEN, aka="num_speculative_tokens", slider=(1, 64))] = Field(
        24, description="suffix: draft at most this many tokens")
    suffix_decoding_max_tree_depth: Annotated[int, Bound(1, MAX_SUFFIX_DEPTH)] = Field(
        24, description="suffix: the suffix tree's depth (match + draft)")
    suffix_decoding_max_spec_factor: Annotated[float, Bound(0, MAX_SPEC_FACTOR, slider=(0, 4))] = Field(
        1.0, description="suffix: draft at most this times the match length")
    suffix_decoding_min_token_prob: Annotated[float, Bound(0, 1)] = Field(
        0.1, description="suffix: stop drafting below this estimated probability")
    # vLLM also counts up to this many earlier requests' responses, shared by every request an engine serves:
    # 0 keeps each request's drafts its own (on a public Space, nobody's drafts come from another visitor's text).
    suffix_decoding_max_cached_requests: Annotated[int, Bound(0, MAX_CACHED_REQUESTS)] = Field(
        0, description="suffix on vLLM: also count this many earlier requests' responses (shared by all requests; 0 = none)")
    # Ours (the transformers backend): verify the most probable continuations as a tree instead of one chain.
    use_tree_spec: bool = Field(False, description="suffix: verify the most probable continuations as a tree (transformers backend)")
    mode: ClassVar[str] = "suffix"



class DraftTargetDecodingConfig(_Config):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"
    max_draft_len: Annotated[int, Bound(1, MAX_DRAFT_LEN, slider=(1, 16))] = Field(
        4, description="draft-target: tokens the draft model proposes per step")
    speculative_model: str | None = Field(
        None, description="the draft model (same tokenizer as the target; unset: the target's shipped draft)")
    mode: ClassVar[str] = "draft_target"



class MedusaDecodingConfig(_Config):
    decoding_type: Literal["Medusa"] = "Medusa"
    medusa_choices: str | list[list[int]] = Field(
        "default", description="the Medusa tree: a name in assets/medusa_choices/ or a JSON list of rank paths")
    num_medusa_heads: Annotated[int | None, Bound(1, MAX_TREE_DEPTH)] = Field(
        None, description="heads used (unset: the checkpoint's medusa_num_heads)")
    speculative_model: str | None = Field(None, description="the Medusa heads directory (unset: the target's shipped heads)")
    typical_acceptance: bool = Field(False, description="under sampling: typical acceptance (faster, NOT lossless)")
    posterior_threshold: Annotated[float, Bound(0, 1, low_open=True, slider=(0.01, 1))] = Field(
        0.09, description="typical acceptance: the probability a draft token always passes at")
    posterior_alpha: Annotated[float, Bound(0, 1)] = Field(
        0.3, description="typical acceptance: how the threshold falls with the target's entropy")
    min_path_prob: Annotated[float | None, Bound(0, 1, high_open=True, note="(0 = no pruning)", slider=(0, 0.5))] = Field(
        None, description=PRUNE_HELP)  # ours (transformers backend)
    prompt_lookup: NGramDecodingConfig | None = None  # ours (transformers backend): merge its candidates into the tree
    mode: ClassVar[str] = "medusa"

    def paths(self) -> list[list[int]]:
        spec = self.medusa_choices
        return medusa_choices(spec if isinstance(spec, str) else _json(spec))

    @property
    def max_total_draft_tokens(self) -> int:
        """The tree's nodes (TensorRT-LLM's Medusa engine takes them as its max_draft_len)."""
        return len(self.paths())

    def rules(self) -> None:
        paths = self.paths()
        if self.num_medusa_heads is not None:
            deepest = max(map(len, paths))
            if deepest > self.num_medusa_heads:
                raise ConfigError(f"the Medusa tree is {deepest} deep but there are only {self.num_medusa_heads} heads")
        if self.prompt_lookup is not None:
            self.prompt_lookup.check()


    @property
    def pruning(self) -> float:
        """The min path probability the transformers backend prunes the tree at (MIN_PATH_PROB when unset)."""
        return MIN_PATH_PROB if self.min_path_prob is None else self.min_path_prob


class EagleDecodingConfig(_Config):
    """EAGLE-2 dynamic tree (use_dynamic_tree) or a static tree (eagle_choices).

    As in TensorRT-LLM (llm_args.py), max_total_draft_tokens counts the tree's nodes and max_draft_len is its depth (the
    drafting steps): num_eagle_layers for the dynamic tree, the deepest path of a static one."""

    decoding_type: Literal["Eagle"] = "Eagle"
    max_total_draft_tokens: Annotated[int, Bound(1, MAX_DRAFT_LEN, aka="eagle_total_tokens - 1")] = Field(
        23, description="EAGLE: tree nodes verified per step")
    speculative_model: str | None = Field(None, description="the EAGLE module directory (unset: the target's shipped module)")
    eagle_choices: str | list[list[int]] | None = Field(
        None, description="a static tree (a name in assets/medusa_choices/ or JSON rank paths) instead of the dynamic one")
    use_dynamic_tree: bool = Field(True, description="EAGLE-2's dynamic tree (off: eagle_choices)")
    dynamic_tree_max_topK: Annotated[int, Bound(1, MAX_EAGLE_TOP_K, aka="eagle_top_k", slider=(1, 10))] = Field(
        4, description="EAGLE dynamic tree: children expanded per node")
    num_eagle_layers: Annotated[int, Bound(1, MAX_TREE_DEPTH, aka="the tree depth, eagle_depth", slider=(1, 8))] = Field(
        5, description="EAGLE: drafting steps")
    min_path_prob: Annotated[float | None, Bound(0, 1, high_open=True, note="(0 = no pruning)", slider=(0, 0.5))] = Field(
        None, description=PRUNE_HELP)  # ours (transformers backend): the dynamic tree only
    prompt_lookup: NGramDecodingConfig | None = None  # ours (transformers backend): merge its candidates into the tree
    mode: ClassVar[str] = "eagle"

    @model_validator(mode="before")
    @classmethod
    def _nodes_were_max_draft_len(cls, data: Any) -> Any:
        """Requests and traces from before depth and nodes were two fields gave the nodes as max_draft_len."""
        if isinstance(data, dict) and "max_draft_len" in data and "max_total_draft_tokens" not in data:
            data = {("max_total_draft_tokens" if k == "max_draft_len" else k): v for k, v in data.items()}
        return data

    @property
    def max_draft_len(self) -> int:
        """The drafting steps: the dynamic tree's depth, or the static tree's deepest path."""
        return self.num_eagle_layers if self.eagle_choices is None else max(map(len, self.paths()))

    def paths(self) -> list[list[int]]:
        """The static tree's paths (eagle_choices); ConfigError without one."""
        if self.eagle_choices is None:
            raise ConfigError("this EAGLE config has no static tree (eagle_choices)")
        spec = self.eagle_choices
        return medusa_choices(spec if isinstance(spec, str) else _json(spec))

    def rules(self) -> None:
        if self.min_path_prob and not self.use_dynamic_tree:
            raise ConfigError("min_path_prob prunes the dynamic tree; a static tree (eagle_choices) keeps its shape")
        if self.use_dynamic_tree == (self.eagle_choices is not None):
            raise ConfigError("EAGLE needs either use_dynamic_tree or eagle_choices (a static tree), not both or neither")
        if self.eagle_choices is not None:
            paths = self.paths()
            if len(paths) > self.max_total_draft_tokens:
                raise ConfigError(f"eagle_choices has {len(paths)} nodes but max_total_draft_tokens is {self.max_total_draft_tokens}")
        if self.prompt_lookup is not None:
            self.prompt_lookup.check()


    @property
    def pruning(self) -> float:
        """The min path probability the transformers backend prunes the dynamic tree at (MIN_PATH_PROB when unset);
        a static tree keeps its shape."""
        if not self.use_dynamic_tree:
            return 0.0
        return MIN_PATH_PROB if self.min_path_prob is None else self.min_path_prob


def draft_tokens(config: BaseModel) -> int:
    """The draft tokens one step of `config` verifies at most: a tree's max_total_draft_tokens, else its chain's
    max_draft_len (as TensorRT-LLM's DecodingBaseConfig defaults the one to the other); 0 when it drafts nothing."""
    return getattr(config, "max_total_draft_tokens", getattr(config, "max_draft_len", 0))


def merged(config: BaseModel) -> NGramDecodingConfig | None:
    """The prompt lookup config whose candidates a tree config's tree verifies too (`eagle+prompt_lookup`), if any."""
    return getattr(config, "prompt_lookup", None)


def _whole(v: Any) -> Any:
    """JSON's 1e30 is a whole number too: as an int, it meets the field's bound and its sentence, not pydantic's
    complaint about parsing."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else v


def _short(value: Any) -> str:
    """A number or list as a user typed it, cut short: a 300-digit integer is no message."""
    text = str(value)
    return text if len(text) <= 24 else text[:20] + "…"


class DecodeRequest(_Config):
    """One generation: mode config, sampling, budget, backend (TensorRT-LLM backend flavour when it applies)."""

    speculative_config: Any = Field(default_factory=AutoregressiveConfig)  # one of `modes`' configs (Modes.request)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_new_tokens: Annotated[int, Bound(1, MAX_NEW_TOKENS)] = 128
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

    @property
    def mode(self) -> str:
        return self.speculative_config.mode

    def check(self, max_new_tokens_limit: int | None = None) -> None:
        self.sampling.check()
        self.speculative_config.check()
        super().check()
        if max_new_tokens_limit is not None and self.max_new_tokens > max_new_tokens_limit:
            raise ConfigError(f"max_new_tokens is limited to {max_new_tokens_limit} here, got {self.max_new_tokens}")


def validated(model: type[BaseModel], data: Any, what: str):
    """`model` from JSON-like data; pydantic's first complaint becomes one ConfigError sentence naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(one_line(x) for x in first["loc"]) or what  # a user's key, cut (ConfigError escapes the rest)
        raise ConfigError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None


def parse(data: dict[str, Any], modes, max_new_tokens_limit: int | None = None) -> DecodeRequest:
    """A DecodeRequest of `modes` (a registry, app/modes/registry.py: `Modes.parse`) from JSON-like data, checked
    against every rule of its mode (a backend's own rules are that backend's `check`); every problem becomes one
    ConfigError sentence."""
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
