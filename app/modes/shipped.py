"""The modes this app ships, in display order: one entry each (app/modes/registry.py says what an entry holds)."""

from __future__ import annotations

from typing import Any

from app.modes import configs, limits, mappings as mp
from app.modes.errors import ConfigError, one_line
from app.modes.notation import int_list, parse_triple
from app.modes.registry import Control, Flag, Mode, Modes, Short

DRAFTERS = "app.decoding.drafters."  # each entry names its drafter class and explainer by module path (registry.Mode)
EXPLAINERS = "app.ui.explain."
RECIPES = "app.training.recipes:"  # and each trained artifact's recipe

# Each mode's provenance shapes (Mode.provenance: what a step's `source` holds; app/traces.py checks a replay
# against them). NODES bounds a step's draft, as the trace reader does.
NODES = 1024
_MATCH = ("dict", {"ngram": ("list", "id", 64), "position": "int", "in_prompt": "bool", "continuation_position": "int"})
_MATCHES = ("list", _MATCH, 64)
_TREE = ("dict", {"tokens": ("list", "id", NODES), "parents": ("list", "int", NODES), "scores": ("list", "num?", NODES),
                  "paths": ("list", ("list", "int", 64), NODES)})
# A tree mode's merged branch (mergeable): what prompt lookup matched and which nodes it added.
_MERGED = {"prompt_lookup": ("dict", {"match": ("opt", _MATCH), "matches": _MATCHES, "nodes": ("list", "int", NODES),
                                      "new_nodes": "int"})}


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
        raise ConfigError(f"draft caps must be comma-separated integers such as 2,5; got '{one_line(text)}'") from None


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
_EAGLE_PRUNE = configs.bound(_EAGLE, "min_path_prob")  # the Run tab's pruning slider sets it through eg_tree's fields
# Prompt lookup's flags: its own mode's, and the candidates a Medusa or EAGLE tree merges in.
NGRAM_FLAGS = (
    Flag("prompt_lookup_num_tokens", "max_draft_len"),
    Flag("max_matching_ngram_size", "max_matching_ngram_size"),
    Flag("prompt_lookup_candidates", "max_candidates"),
    Flag("ngram_draft_lens", help=_NGRAM.model_fields["ngram_draft_lens"].description,
         default=",".join(map(str, _default(_NGRAM, "ngram_draft_lens"))),
         to_fields=lambda v: {"ngram_draft_lens": int_list(v, "--ngram-draft-lens")}),
    Flag("use_newest_match", help="prompt lookup: copy after the latest match, not the earliest", kind=bool,
         to_fields=lambda v: {"is_use_oldest": not v}),
)

MODES = Modes(
    Mode("autoregressive", "Autoregressive", configs.AutoregressiveConfig, "#999999", "the baseline",
         drafter=DRAFTERS + "autoregressive:Autoregressive", explainer=EXPLAINERS + "autoregressive",
         flags=(), tour=0,
         trtllm=("pytorch", "tensorrt"), vllm="", vllm_compare=True),
    Mode("draft_target", "Draft-target", configs.DraftTargetDecodingConfig, "#0072B2",
         "lossless: greedy and exact speculative sampling",
         drafter=DRAFTERS + "draft_model:DraftModel", explainer=EXPLAINERS + "draft_target",
         provenance={"draft_probs": ("list", "num?", NODES), "draft_vocab": "int"},
         trtllm=("pytorch",), trtllm_fields=mp.draft_trtllm, trtllm_engine_mode="DRAFT_TOKENS_EXTERNAL",
         trtllm_no_overlap=True, loop_check=limits.draft_model, tour=4,
         vllm="draft_model", vllm_compare=True, vllm_fields=mp.draft_vllm,
         artifact="draft", artifact_label="draft model", artifact_recipe=RECIPES + "DRAFT",
         controls=(Control("dt_model", "speculative_model", "speculative_model (registry names only)", "choice", choices="drafts"),
                   Control("dt_len", "max_draft_len", fastest=2)),
         flags=(Flag("draft_model", "speculative_model"), Flag("max_draft_len", "max_draft_len"))),
    Mode("prompt_lookup", "Prompt lookup", configs.NGramDecodingConfig, "#E69F00", "lossless: greedy and exact sampling",
         drafter=DRAFTERS + "prompt_lookup:PromptLookup", explainer=EXPLAINERS + "prompt_lookup",
         runtime_fields=("max_candidates", "ngram_draft_lens"),
         provenance={"match": ("opt", _MATCH), "matches": _MATCHES},
         trtllm=("pytorch",), trtllm_fields=mp.ngram_trtllm, trtllm_ignored=mp.ngram_trtllm_ignored,
         trtllm_engine_mode="DRAFT_TOKENS_EXTERNAL", trtllm_no_overlap=True, tour=1, compared=True,
         shorts=(Short("pl", ("pl_ngram", "pl_num_tokens")),),
         vllm="ngram", vllm_compare=True, drafts_free=True, vllm_fields=mp.ngram_vllm, vllm_ignored=mp.ngram_vllm_ignored,
         controls=(Control("pl_num_tokens", "max_draft_len"),
                   Control("pl_ngram", "max_matching_ngram_size", fastest=3),
                   Control("pl_draft_lens", "ngram_draft_lens", "draft caps after a 1-gram, 2-gram… match (empty = none)", "text",
                           name="draft caps", to_field=_draft_lens, from_field=lambda lens: ",".join(map(str, lens))),
                   Control("pl_candidates", "max_candidates", "matches verified together (tree)",
                           name="matches verified together", fastest=2),
                   Control("pl_oldest", "is_use_oldest", "is_use_oldest (copy after the earliest match; off = the latest)",
                           "checkbox", fastest=False)),
         heading="**Prompt lookup** (TensorRT-LLM `NGramDecodingConfig`)",
         flags=NGRAM_FLAGS),
    Mode("lookahead", "Lookahead", configs.LookaheadDecodingConfig, "#009E73", "lossless: greedy and exact sampling",
         drafter=DRAFTERS + "lookahead:Lookahead", explainer=EXPLAINERS + "lookahead",
         runtime_fields=("request", "pool_from_prompt"),
         provenance={"window": ("list", ("list", "id", 256), 64),
                     "candidates": ("list", ("list", "id", 256), 256)},
         trtllm=("tensorrt",), trtllm_fields=mp.lookahead_trtllm, trtllm_ignored=mp.lookahead_trtllm_ignored,
         trtllm_check=mp.lookahead_trtllm_check, trtllm_request=mp.lookahead_trtllm_request,
         trtllm_engine_mode="LOOKAHEAD_DECODING", drafts_free=True, tour=3, compared=True,
         shorts=(Short("la", ("la_W", "la_N", "la_G")), Short("la_req", ("la_w", "la_n", "la_g"), follows="la")),
         vllm_missing="vLLM has no lookahead decoding (Jacobi window and n-gram pool): run it on the transformers backend",
         controls=(Control("la_W", "max_window_size", "max_window_size W", row=1),
                   Control("la_N", "max_ngram_size", "max_ngram_size N", row=1),
                   Control("la_G", "max_verification_set_size", "max_verification_set_size G", row=1),
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
         "lossless with greedy or exact sampling; typical acceptance is NOT lossless",
         drafter=DRAFTERS + "medusa:Medusa", explainer=EXPLAINERS + "medusa",
         runtime_fields=("typical_acceptance", "posterior_threshold", "posterior_alpha", "min_path_prob"),
         provenance={"tree": _TREE, "heads": "int", "acceptance": "str", **_MERGED},
         trtllm=("tensorrt",), trtllm_fields=mp.medusa_trtllm, trtllm_check=mp.medusa_trtllm_check,
         trtllm_engine_mode="MEDUSA", tour=5,
         vllm="medusa", vllm_compare=True, vllm_fields=mp.medusa_vllm, vllm_ignored=mp.medusa_vllm_ignored,
         artifact="medusa", artifact_label="Medusa heads", artifact_recipe=RECIPES + "MEDUSA",
         artifact_loader="app.heads.medusa:load_beside", mergeable=True,
         merged_colour="#56B4E9",  # Okabe-Ito's sky blue
         controls=(Control("md_tree", "medusa_choices", "medusa_choices (tree)", "choice", choices="trees"),
                   Control("md_typical", "typical_acceptance", "typical acceptance (sampling only — NOT lossless)", "checkbox"),
                   Control("md_threshold", "posterior_threshold", step=0.01),
                   Control("md_alpha", "posterior_alpha", step=0.05),
                   Control("md_prune", "min_path_prob", PRUNE_LABEL, step=0.01, name="min path probability",
                           from_field=_unset_prune),
                   Control("md_pl", None, MERGE_LABEL, "merge", elem_id="md-pl"),
                   Control("md_model", "speculative_model", "heads (speculative_model; train your own in the Train tab)",
                           "choice", choices="medusa", elem_id="md-model")),
         flags=(Flag("medusa_model", "speculative_model"), Flag("medusa_choices", "medusa_choices"),
                Flag("typical_acceptance", "typical_acceptance"), Flag("posterior_threshold", "posterior_threshold"),
                Flag("posterior_alpha", "posterior_alpha"), Flag("min_path_prob", "min_path_prob"))),
    Mode("eagle", "EAGLE", configs.EagleDecodingConfig, "#D55E00", "lossless: greedy and exact sampling (recursive rejection)",
         drafter=DRAFTERS + "eagle:Eagle", explainer=EXPLAINERS + "eagle",
         runtime_fields=("min_path_prob",),
         # total_tokens: recordings from before max_total_draft_tokens (the nodes, EAGLE-2's total_tokens - 1)
         provenance={"tree": _TREE, "depth": "int", "top_k": "int", "max_total_draft_tokens": "int", "total_tokens": "int",
                     "static_nodes": "int",
                     **_MERGED},
         # Not in the Compare tab on vLLM: its eagle3 loads EAGLE-3 modules only, and the shipped module is not one.
         trtllm=("pytorch", "tensorrt"), trtllm_fields=mp.eagle_trtllm, trtllm_ignored=mp.eagle_trtllm_ignored,
         trtllm_engine_mode="EAGLE", loop_check=limits.eagle, tour=6,
         vllm="eagle3", artifact="eagle", artifact_label="EAGLE module", artifact_recipe=RECIPES + "EAGLE", vllm_fields=mp.eagle_vllm,
         vllm_ignored=lambda c: ["the dynamic tree (vLLM's eagle3 drafts a chain of num_speculative_tokens)"] if c.use_dynamic_tree else [],
         artifact_loader="app.heads.eagle:load_beside", artifact_pass="app.decoding.compiled:draft_pass", mergeable=True,
         merged_colour="#882255",  # Tol's wine
         controls=(Control("eg_total", "max_total_draft_tokens", "total tokens (max_total_draft_tokens + 1)", minimum=2, maximum=64, value=12,
                           fastest=8, name="total tokens", to_field=lambda total: total - 1, from_field=lambda n: n + 1),
                   Control("eg_depth", "num_eagle_layers", "depth (num_eagle_layers)", value=4, fastest=4, name="depth"),
                   Control("eg_topk", "dynamic_tree_max_topK", "top-k (dynamic_tree_max_topK)", value=3, fastest=2,
                           name="top-k"),
                   Control("eg_tree", None, "tree (eagle_choices)", "choice", choices="eagle_trees"),
                   Control("eg_prune", None, PRUNE_LABEL + ", dynamic tree", maximum=_EAGLE_PRUNE.slider[1], step=0.01,
                           name="min path probability"),
                   Control("eg_pl", None, MERGE_LABEL, "merge", elem_id="eg-pl"),
                   Control("eg_model", "speculative_model", "module (speculative_model; train your own in the Train tab)",
                           "choice", choices="eagle", elem_id="eg-model")),
         heading="**EAGLE** (`EagleDecodingConfig`): EAGLE-2 dynamic tree or a static tree",
         to_fields=_eagle_tree_fields, from_fields=_eagle_tree_values,
         fields_made=("use_dynamic_tree", "eagle_choices", "min_path_prob"),
         flags=(Flag("eagle_model", "speculative_model"),
                Flag("eagle_total_tokens", help="EAGLE-2 dynamic tree: nodes verified per step, the root counted "
                     "(max_total_draft_tokens + 1)", kind=int, default=_default(_EAGLE, "max_total_draft_tokens") + 1,
                     to_fields=lambda v: {"max_total_draft_tokens": v - 1}),
                Flag("eagle_depth", "num_eagle_layers"),
                Flag("eagle_top_k", "dynamic_tree_max_topK"),
                Flag("eagle_choices", help=_EAGLE.model_fields["eagle_choices"].description, to_fields=_eagle_tree),
                Flag("min_path_prob", "min_path_prob"))),
    Mode("suffix", "Suffix", configs.SuffixDecodingConfig, "#DDCC77",  # Tol's sand: the last hue apart from the others
         "lossless: greedy and exact sampling",
         drafter=DRAFTERS + "suffix:Suffix", explainer=EXPLAINERS + "suffix",
         provenance={"suffix": ("opt", ("dict", {"match": ("list", "id", 256), "count": "int", "probs": ("list", "num?", NODES),
                                                 "score": "num", "tree": "bool"}))},
         vllm="suffix", vllm_compare=True, drafts_free=True, vllm_fields=mp.suffix_vllm, loop_check=limits.suffix, tour=2,
         vllm_ignored=lambda c: ["use_tree_spec (vLLM's suffix verifies one chain)"] if c.use_tree_spec else [],
         trtllm_missing="its 1.2 line has none (SADecodingConfig, a suffix automaton drafting what followed the "
                        "context's longest earlier match without counts, came later on its main branch); run suffix "
                        "decoding on the transformers or vllm backend",
         controls=(Control("sx_len", "max_draft_len"),
                   Control("sx_depth", "suffix_decoding_max_tree_depth"),
                   Control("sx_factor", "suffix_decoding_max_spec_factor",
                           "suffix_decoding_max_spec_factor (draft ≤ factor × match length)", step=0.25,
                           name="suffix_decoding_max_spec_factor"),
                   Control("sx_min_prob", "suffix_decoding_min_token_prob", "suffix_decoding_min_token_prob", step=0.05),
                   Control("sx_tree", "use_tree_spec",
                           "use_tree_spec (verify the likeliest continuations as a tree; this app's loop only)", "checkbox")),
         heading="**Suffix decoding** (vLLM's `suffix` method, `suffix_decoding_*`)",
         flags=(Flag("suffix_max_draft_len", "max_draft_len"),
                *(Flag(f, f) for f in ("suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
                                       "suffix_decoding_min_token_prob", "suffix_decoding_max_cached_requests", "use_tree_spec")))),
)
