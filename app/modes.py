"""Every decoding mode in one place: one `Mode` entry per mode, read by the configs, the command line, the
service, the web app's controls and charts, and the bench.

A mode is its drafter (app/decoding/drafters/) and its config class (app/service/configs.py: TensorRT-LLM's or
vLLM's field names, the defaults and bounds, and `drafter()`, which builds the drafter from a checked config);
its entry here says everything else about it: its display name and colour, whether it is lossless, which
backends and engines run it and under which names, the command-line flags whose names are not simply
`--<mode>-<field>`, and its Run-tab controls (app/ui/settings.py reads them). Plain data: nothing here imports
gradio, plotly or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import Field, create_model

from app.config import ConfigError, int_list, parse_triple
from app.service import configs

MERGED_SUFFIX = "+prompt_lookup"  # a tree mode that also verifies prompt lookup's candidates: "eagle+prompt_lookup"


@dataclass(frozen=True)
class Flag:
    """A command-line flag of a mode. `field` names the config field whose default, type and help it takes;
    `to_fields` turns an irregular flag's value (a W,N,G triple, a count off by one) into config fields."""

    name: str  # argparse dest: "eagle_total_tokens" is --eagle-total-tokens
    field: str | None = None
    help: str = ""
    to_fields: Callable[[Any], dict[str, Any]] | None = None
    default: Any = None  # for a flag with to_fields (a plain flag takes its field's default)
    kind: type = str  # for a flag with to_fields: bool = a switch


@dataclass(frozen=True)
class Control:
    """A Run-tab control of a mode. Its value is config field `field` (through `to_field` / `from_field` where the
    two differ, e.g. EAGLE's total tokens = max_draft_len + 1); a control without a field is its mode's
    `to_fields` / `from_fields`' (lookahead's per-request w, n, g), or a merge box."""

    key: str  # its name in the Run tab's values and in links: "pl_ngram"
    field: str | None
    label: str
    kind: str = "slider"  # slider, number, checkbox, text, choice, merge (the box that merges prompt lookup's tree in)
    minimum: float = 0
    maximum: float = 1
    step: float = 1  # a whole step: the value is an int
    choices: str = ""  # a choice's menu: "trees", "eagle_trees", "drafts", or an artifact (train --mode's "medusa", "eagle")
    name: str = ""  # what a refusal calls it (default: its label)
    row: int = 0  # controls with the same row > 0 sit side by side
    value: Any = None  # the Run tab's start value where it is not the config's default (a smaller EAGLE tree)
    fastest: Any = None  # its value in the "fastest here" preset, where it differs from `value`
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    elem_id: str | None = None

    @property
    def preset(self) -> bool:
        """Whether settings presets set it: not the pickers of draft models and trained artifacts (the user's)."""
        return self.kind != "choice" or self.choices in ("trees", "eagle_trees")


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    config: type  # its config class (app/service/configs.py); config.decoding_type is its TensorRT-LLM name
    colour: str  # its charts' colour
    lossless: str  # in words, as the Run tab says it
    flags: tuple[Flag, ...] | None = None  # None: one flag per config field, `--<mode>-<field>`
    trtllm: tuple[str, ...] = ()  # TensorRT-LLM's backends that run it, the default first (llm_args.py supports_backend)
    trtllm_missing: str = ""  # why TensorRT-LLM has no such mode
    vllm: str | None = None  # vLLM's speculative method ("" = none needed); None = vLLM cannot
    vllm_missing: str = ""  # why vLLM cannot
    vllm_compare: bool = False  # the Compare tab offers its run on a vLLM engine
    artifact: str = ""  # the trained artifact it drafts with, by `train --mode`'s name (draft, medusa, eagle)
    artifact_label: str = ""  # that artifact in words
    mergeable: bool = False  # its tree can verify prompt lookup's candidates too (<name>+prompt_lookup)
    merged_colour: str = ""
    drafts_free: bool = False  # drafting costs almost nothing (no model runs): render's explanation says so
    # The Run tab: its controls (None: one per config field, app/ui/settings.py), the line above them, and the fields
    # the controls without a field make (to_fields: typed control values -> fields; from_fields: config -> control
    # values, None when the Run tab cannot express it).
    controls: tuple[Control, ...] | None = None
    heading: str = ""
    to_fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    from_fields: Callable[[Any], dict[str, Any] | None] | None = None
    fields_made: tuple[str, ...] = ()  # the config fields to_fields makes

    @property
    def decoding_type(self) -> str:
        return self.config.model_fields["decoding_type"].default

    @property
    def draft_model(self) -> bool:
        """It drafts with a model of its own (a draft model, by registry name or directory)."""
        return self.artifact == "draft"

    @property
    def heads(self) -> bool:
        """It drafts with a trained directory loaded beside the target (Medusa heads, an EAGLE module)."""
        return bool(self.artifact) and not self.draft_model

    @property
    def vllm_row(self) -> str | None:
        """The bench's row for vLLM doing this mode's job (None: vLLM has no method for it)."""
        return None if self.vllm is None else f"vllm_{self.vllm or 'generate'}"

    def cli_flags(self) -> tuple[Flag, ...]:
        if self.flags is not None:
            return self.flags
        return tuple(Flag(f if f.startswith(self.name + "_") else f"{self.name}_{f}", f)
                     for f in self.config.model_fields if f not in ("decoding_type", "prompt_lookup"))


class Modes:
    """A registry of modes, in display order. MODES is the app's; a test builds its own with `with_`."""

    def __init__(self, *entries: Mode) -> None:
        self.entries = entries
        self._by_name = {m.name: m for m in entries}
        self._by_type = {m.decoding_type: m for m in entries}
        self.names = tuple(m.name for m in entries)
        self.merged = tuple(m.name + MERGED_SUFFIX for m in entries if m.mergeable)
        union = Annotated[Union[tuple(m.config for m in entries)], Field(discriminator="decoding_type")]
        # The request type these modes validate: its speculative_config is one of their configs.
        self.request = create_model("DecodeRequest", __base__=configs.DecodeRequest,
                                    speculative_config=(union, Field(default_factory=configs.AutoregressiveConfig)))
        self.request.modes = self

    def with_(self, *entries: Mode) -> Modes:
        return Modes(*self.entries, *entries)

    def __iter__(self) -> Iterator[Mode]:
        return iter(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Mode:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"unknown mode '{name}': choose one of {', '.join(self.names)}") from None

    def get(self, name: str) -> Mode | None:
        return self._by_name.get(name)

    def by_type(self, decoding_type: str) -> Mode:
        return self._by_type[decoding_type]

    def split(self, name: str, where: str = "") -> tuple[str, bool]:
        """(mode, whether prompt lookup merges into its tree) of a name such as `eagle+prompt_lookup`."""
        if name not in self.names and name not in self.merged:
            raise ConfigError(f"unknown mode '{name}'{where}: choose one of {', '.join(self.names + self.merged)}")
        return name.removesuffix(MERGED_SUFFIX), name in self.merged

    def label(self, name: str) -> str:
        """A mode's display name; a merged tree's (`eagle+prompt_lookup`) reads "EAGLE + prompt lookup"."""
        base, _, extra = name.partition("+")
        return self[base].label + (f" + {self[extra].label.lower()}" if extra else "")

    def colour(self, name: str) -> str | None:
        base, merged = self.split(name) if name in self.names or name in self.merged else (name, False)
        entry = self._by_name.get(base)
        return None if entry is None else entry.merged_colour if merged else entry.colour

    def parse(self, data: Any) -> configs.DecodeRequest:
        return configs.parse(data, self)


def _eagle_tree(choices: str | None) -> dict[str, Any]:
    return {"eagle_choices": choices, "use_dynamic_tree": choices is None}


def _triple(text: str) -> dict[str, Any]:
    W, N, G = parse_triple(text, "--lookahead-config")
    return {"max_window_size": W, "max_ngram_size": N, "max_verification_set_size": G}


def _default(cls: type, field: str) -> Any:
    return cls.model_fields[field].default


# The Run tab's irregular controls: a draft-caps list as text, lookahead's per-request (w, n, g) triple, EAGLE's
# total tokens and its dynamic-or-static tree.
DYNAMIC = "dynamic (EAGLE-2)"  # the EAGLE tree menu's first choice: no eagle_choices
PRUNE_LABEL = "min path probability (prune unlikely nodes; 0 = off)"
MERGE_LABEL = "merge prompt lookup's candidates into the tree (its settings: the Prompt lookup group)"


def _draft_lens(text: Any) -> list[int]:
    lens = str(text or "").replace(" ", "")
    try:
        return [int(x) for x in lens.split(",") if x]
    except ValueError:
        raise ConfigError(f"draft caps must be comma-separated integers such as 2,5; got '{text}'") from None


def _unset_prune(value: float | None) -> float:
    return configs.MIN_PATH_PROB if value is None else value  # what the transformers backend prunes at when unset


def _lookahead_values(c: configs.LookaheadDecodingConfig) -> dict[str, Any]:
    w, n, g = c.request or (c.max_window_size, c.max_ngram_size, c.max_verification_set_size)
    return {"la_w": w, "la_n": n, "la_g": g}


def _eagle_tree_fields(v: dict[str, Any]) -> dict[str, Any]:
    static = v["eg_tree"] not in (None, "", DYNAMIC)
    return {"use_dynamic_tree": not static, "eagle_choices": v["eg_tree"] if static else None,
            "min_path_prob": 0.0 if static else v["eg_prune"]}  # a static tree is never pruned


def _eagle_tree_values(c: configs.EagleDecodingConfig) -> dict[str, Any]:
    if not c.use_dynamic_tree:
        return {"eg_tree": c.eagle_choices}
    return {"eg_tree": DYNAMIC, "eg_prune": _unset_prune(c.min_path_prob)}


_NGRAM = configs.NGramDecodingConfig
_EAGLE = configs.EagleDecodingConfig
PRUNE_HELP = ("Medusa / EAGLE dynamic tree: drop draft nodes whose path probability under the draft is lower "
              f"(0 = keep all; default {configs.MIN_PATH_PROB} on the transformers backend, none on TensorRT-LLM)")
# Prompt lookup's flags: its own mode's, and the candidates a Medusa or EAGLE tree merges in.
NGRAM_FLAGS = (
    Flag("prompt_lookup_num_tokens", "max_draft_len"),
    Flag("max_matching_ngram_size", "max_matching_ngram_size"),
    Flag("prompt_lookup_candidates", "max_candidates", "prompt lookup: verify this many matches' continuations as one tree"),
    Flag("ngram_draft_lens", help="prompt lookup: draft at most this many tokens after a 1-gram, 2-gram, ... match "
         "('' = always the full length)", default=",".join(map(str, _default(_NGRAM, "ngram_draft_lens"))),
         to_fields=lambda v: {"ngram_draft_lens": int_list(v, "--ngram-draft-lens")}),
    Flag("use_newest_match", help="prompt lookup: copy after the latest match, not the earliest", kind=bool,
         to_fields=lambda v: {"is_use_oldest": not v}),
)

MODES = Modes(
    Mode("autoregressive", "Autoregressive", configs.AutoregressiveConfig, "#999999", "the baseline", flags=(),
         trtllm=("pytorch", "tensorrt"), vllm="", vllm_compare=True),
    Mode("draft_target", "Draft-target", configs.DraftTargetDecodingConfig, "#0072B2",
         "lossless: greedy and exact speculative sampling", trtllm=("pytorch",), vllm="draft_model", vllm_compare=True,
         artifact="draft", artifact_label="draft model",
         controls=(Control("dt_model", "speculative_model", "speculative_model (registry names only)", "choice", choices="drafts"),
                   Control("dt_len", "max_draft_len", "max_draft_len", maximum=16, minimum=1, fastest=2)),
         flags=(Flag("draft_model", "speculative_model", "draft model for draft_target (same tokenizer as --model; "
                     "default: the shipped distilled draft)"),
                Flag("max_draft_len", "max_draft_len"))),
    Mode("prompt_lookup", "Prompt lookup", configs.NGramDecodingConfig, "#E69F00", "lossless: greedy and exact sampling",
         trtllm=("pytorch",), vllm="ngram", vllm_compare=True, drafts_free=True,
         controls=(Control("pl_num_tokens", "max_draft_len", "max_draft_len (prompt_lookup_num_tokens)", minimum=1, maximum=32),
                   Control("pl_ngram", "max_matching_ngram_size", "max_matching_ngram_size", minimum=1, maximum=6, fastest=3),
                   Control("pl_draft_lens", "ngram_draft_lens", "draft caps after a 1-gram, 2-gram… match (empty = none)", "text",
                           name="draft caps", to_field=_draft_lens, from_field=lambda lens: ",".join(map(str, lens))),
                   Control("pl_candidates", "max_candidates", "matches verified together (tree)", minimum=1, maximum=4,
                           name="matches verified together", fastest=2),
                   Control("pl_oldest", "is_use_oldest", "is_use_oldest (copy after the earliest match; off = the latest)",
                           "checkbox", fastest=False)),
         heading="**Prompt lookup** (TensorRT-LLM `NGramDecodingConfig`)",
         flags=NGRAM_FLAGS),
    Mode("lookahead", "Lookahead", configs.LookaheadDecodingConfig, "#009E73", "lossless: greedy and exact sampling",
         trtllm=("tensorrt",), drafts_free=True,
         vllm_missing="vLLM has no lookahead decoding (Jacobi window and n-gram pool): run it on the transformers backend",
         controls=(Control("la_W", "max_window_size", "max_window_size W", minimum=1, maximum=8, row=1),
                   Control("la_N", "max_ngram_size", "max_ngram_size N", minimum=1, maximum=6, row=1),
                   Control("la_G", "max_verification_set_size", "max_verification_set_size G", maximum=8, row=1),
                   Control("la_w", None, "w", minimum=1, maximum=8, row=2),
                   Control("la_n", None, "n", minimum=1, maximum=6, row=2),
                   Control("la_g", None, "g", maximum=8, row=2)),
         heading="**Lookahead** (`LookaheadDecodingConfig`): engine maxima (W, N, G) and this request's (w, n, g) ≤ them",
         to_fields=lambda v: {"request": [v["la_w"], v["la_n"], v["la_g"]]}, from_fields=_lookahead_values,
         fields_made=("request",),
         flags=(Flag("lookahead_config", help="W,N,G: window, n-gram size, verification set", to_fields=_triple,
                     default=",".join(str(_default(configs.LookaheadDecodingConfig, f))
                                      for f in ("max_window_size", "max_ngram_size", "max_verification_set_size"))),
                Flag("lookahead_request", help="per-request w,n,g <= W,N,G (default W,N,G)",
                     to_fields=lambda v: {"request": parse_triple(v, "--lookahead-request") if v else None}),
                Flag("no_pool_from_prompt", help="lookahead: do not seed the n-gram pool from the context", kind=bool,
                     to_fields=lambda v: {"pool_from_prompt": not v}))),
    Mode("medusa", "Medusa", configs.MedusaDecodingConfig, "#CC79A7",
         "lossless with greedy or exact sampling; typical acceptance is NOT lossless", trtllm=("tensorrt",),
         vllm="medusa", vllm_compare=True, artifact="medusa", artifact_label="Medusa heads", mergeable=True,
         merged_colour="#56B4E9",  # Okabe-Ito's sky blue
         controls=(Control("md_tree", "medusa_choices", "medusa_choices (tree)", "choice", choices="trees"),
                   Control("md_typical", "typical_acceptance", "typical acceptance (sampling only — NOT lossless)", "checkbox"),
                   Control("md_threshold", "posterior_threshold", "posterior_threshold", minimum=0.01, step=0.01),
                   Control("md_alpha", "posterior_alpha", "posterior_alpha", step=0.05),
                   Control("md_prune", "min_path_prob", PRUNE_LABEL, maximum=0.5, step=0.01, name="min path probability",
                           from_field=_unset_prune),
                   Control("md_pl", None, MERGE_LABEL, "merge", elem_id="md-pl"),
                   Control("md_model", "speculative_model", "heads (speculative_model; train your own in the Train tab)",
                           "choice", choices="medusa", elem_id="md-model")),
         flags=(Flag("medusa_model", "speculative_model", "Medusa heads directory (default: the shipped heads of --model)"),
                Flag("medusa_choices", "medusa_choices", "Medusa tree: a name in assets/medusa_choices/ or a JSON list of rank paths"),
                Flag("typical_acceptance", "typical_acceptance", "Medusa under sampling: typical acceptance (faster, NOT lossless)"),
                Flag("posterior_threshold", "posterior_threshold"),
                Flag("posterior_alpha", "posterior_alpha"),
                Flag("min_path_prob", "min_path_prob", PRUNE_HELP))),
    Mode("eagle", "EAGLE", configs.EagleDecodingConfig, "#D55E00", "lossless: greedy and exact sampling (recursive rejection)",
         # Not in the Compare tab on vLLM: its eagle3 loads EAGLE-3 modules only, and the shipped module is not one.
         trtllm=("pytorch", "tensorrt"), vllm="eagle3", artifact="eagle", artifact_label="EAGLE module", mergeable=True,
         merged_colour="#882255",  # Tol's wine
         controls=(Control("eg_total", "max_draft_len", "total tokens (max_draft_len + 1)", minimum=2, maximum=64, value=12,
                           fastest=24, name="total tokens", to_field=lambda total: total - 1, from_field=lambda n: n + 1),
                   Control("eg_depth", "num_eagle_layers", "depth (num_eagle_layers)", minimum=1, maximum=8, value=4, fastest=5,
                           name="depth"),
                   Control("eg_topk", "dynamic_tree_max_topK", "top-k (dynamic_tree_max_topK)", minimum=1, maximum=10, value=3,
                           fastest=4, name="top-k"),
                   Control("eg_tree", None, "tree (eagle_choices)", "choice", choices="eagle_trees"),
                   Control("eg_prune", None, PRUNE_LABEL + ", dynamic tree", maximum=0.5, step=0.01,
                           name="min path probability"),
                   Control("eg_pl", None, MERGE_LABEL, "merge", elem_id="eg-pl"),
                   Control("eg_model", "speculative_model", "module (speculative_model; train your own in the Train tab)",
                           "choice", choices="eagle", elem_id="eg-model")),
         heading="**EAGLE** (`EagleDecodingConfig`): EAGLE-2 dynamic tree or a static tree",
         to_fields=_eagle_tree_fields, from_fields=_eagle_tree_values,
         fields_made=("use_dynamic_tree", "eagle_choices", "min_path_prob"),
         flags=(Flag("eagle_model", "speculative_model", "EAGLE module directory (default: the shipped module of --model)"),
                Flag("eagle_total_tokens", help="EAGLE-2 dynamic tree: nodes verified per step", kind=int,
                     default=_default(_EAGLE, "max_draft_len") + 1, to_fields=lambda v: {"max_draft_len": v - 1}),
                Flag("eagle_depth", "num_eagle_layers"),
                Flag("eagle_top_k", "dynamic_tree_max_topK"),
                Flag("eagle_choices", help="EAGLE static tree (rank paths) instead of the dynamic tree", to_fields=_eagle_tree),
                Flag("min_path_prob", "min_path_prob", PRUNE_HELP))),
    Mode("suffix", "Suffix", configs.SuffixDecodingConfig, "#DDCC77",  # Tol's sand: the last hue apart from the others
         "lossless: greedy and exact sampling", vllm="suffix", vllm_compare=True, drafts_free=True,
         trtllm_missing="its 1.2 line has none (SADecodingConfig, a suffix automaton drafting what followed the "
                        "context's longest earlier match without counts, came later on its main branch); run suffix "
                        "decoding on the transformers or vllm backend",
         controls=(Control("sx_len", "max_draft_len", "max_draft_len (num_speculative_tokens)", minimum=1, maximum=64),
                   Control("sx_depth", "suffix_decoding_max_tree_depth", "suffix_decoding_max_tree_depth", minimum=1, maximum=64),
                   Control("sx_factor", "suffix_decoding_max_spec_factor",
                           "suffix_decoding_max_spec_factor (draft ≤ factor × match length)", maximum=4, step=0.25,
                           name="suffix_decoding_max_spec_factor"),
                   Control("sx_min_prob", "suffix_decoding_min_token_prob", "suffix_decoding_min_token_prob", step=0.05),
                   Control("sx_tree", "use_tree_spec",
                           "use_tree_spec (verify the likeliest continuations as a tree; this app's loop only)", "checkbox")),
         heading="**Suffix decoding** (vLLM's `suffix` method, `suffix_decoding_*`)",
         flags=(Flag("suffix_max_draft_len", "max_draft_len", "suffix: draft at most this many tokens (vLLM's num_speculative_tokens)"),
                Flag("suffix_decoding_max_tree_depth", "suffix_decoding_max_tree_depth", "suffix: the suffix tree's depth (match + draft)"),
                Flag("suffix_decoding_max_spec_factor", "suffix_decoding_max_spec_factor", "suffix: draft at most this times the match length"),
                Flag("suffix_decoding_min_token_prob", "suffix_decoding_min_token_prob", "suffix: stop drafting below this estimated probability"),
                Flag("suffix_decoding_max_cached_requests", "suffix_decoding_max_cached_requests",
                     "suffix on vLLM: also count this many earlier requests' responses (shared by all requests; 0 = none)"),
                Flag("use_tree_spec", "use_tree_spec", "suffix: verify the most probable continuations as a tree (transformers backend)"))),
)
