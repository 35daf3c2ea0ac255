"""Each mode's translation into the engines it also runs on, by their own field names: vLLM's `--speculative-config`
and TensorRT-LLM's `speculative_config` (llm_args.py, 1.2). An entry names these functions (`Mode.vllm_fields`,
`Mode.trtllm_fields`, …); the backends call them (app/backends/). Pure functions of a checked config: what an
engine has no field for is said in words (the *_ignored functions), never sent, and what it refuses is refused here in
one sentence (the *_check functions), before any engine starts.
"""

from __future__ import annotations

from typing import Any

from app.modes import configs
from app.modes.errors import ConfigError


# vLLM's counterparts (Mode.vllm_fields, Mode.vllm_ignored), by its --speculative-config field names.
def ngram_vllm(c: configs.NGramDecodingConfig, model: str | None, heads: int | None) -> dict[str, Any]:
    return {"num_speculative_tokens": c.max_draft_len, "prompt_lookup_max": c.max_matching_ngram_size, "prompt_lookup_min": 1}


def ngram_vllm_ignored(c: configs.NGramDecodingConfig) -> list[str]:
    return ([f"max_candidates {c.max_candidates} (vLLM verifies one match's continuation)"] if c.max_candidates != 1 else []) \
        + (["ngram_draft_lens (vLLM always drafts num_speculative_tokens after a match)"] if c.ngram_draft_lens else []) \
        + (["the newest match (vLLM picks its own match)"] if not c.is_use_oldest else [])


def draft_vllm(c: configs.DraftTargetDecodingConfig, model: str | None, heads: int | None) -> dict[str, Any]:
    return {"model": model, "num_speculative_tokens": c.max_draft_len}


def medusa_vllm(c: configs.MedusaDecodingConfig, model: str | None, heads: int | None) -> dict[str, Any]:
    return {"model": model, "num_speculative_tokens": c.num_medusa_heads or heads}  # one token per head


def medusa_vllm_ignored(c: configs.MedusaDecodingConfig) -> list[str]:
    return ["the Medusa tree (vLLM's medusa verifies one chain: each head's top token)"] \
        + (["typical acceptance"] if c.typical_acceptance else [])


def eagle_vllm(c: configs.EagleDecodingConfig, model: str | None, heads: int | None) -> dict[str, Any]:
    return {"model": model, "num_speculative_tokens": c.max_draft_len}  # eagle3 drafts a chain this deep


def suffix_vllm(c: configs.SuffixDecodingConfig, model: str | None, heads: int | None) -> dict[str, Any]:
    return {"num_speculative_tokens": c.max_draft_len,
            **{k: getattr(c, k) for k in ("suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
                                          "suffix_decoding_min_token_prob", "suffix_decoding_max_cached_requests")}}


# TensorRT-LLM's counterparts (Mode.trtllm_fields(config, backend), Mode.trtllm_ignored(config, backend),
# Mode.trtllm_check(request)): `backend` is its "pytorch" or "tensorrt" (engine) backend.
def lookahead_trtllm(c: configs.LookaheadDecodingConfig, backend: str) -> dict[str, Any]:
    return {"max_window_size": c.max_window_size, "max_ngram_size": c.max_ngram_size,
            "max_verification_set_size": c.max_verification_set_size}


def lookahead_trtllm_ignored(c: configs.LookaheadDecodingConfig, backend: str) -> list[str]:
    return [] if c.pool_from_prompt else [
        "pool_from_prompt off is this app's own: TensorRT-LLM's LookaheadDecodingConfig has no such field and always "
        "seeds its n-gram pool from the prompt (lookaheadAlgorithm.cpp setup)"]


def lookahead_trtllm_request(c: configs.LookaheadDecodingConfig) -> dict[str, Any]:
    """A request's own (w, n, g), as SamplingParams.lookahead_config (unset: the engine's (W, N, G))."""
    if c.request is None:
        return {}
    w, n, g = c.request
    return {"lookahead_config": {"max_window_size": w, "max_ngram_size": n, "max_verification_set_size": g}}


def lookahead_trtllm_check(request: configs.DecodeRequest) -> None:
    """TensorRT-LLM's LLM API types (W, N, G) and a request's (w, n, g) as PositiveInt (llm_args.py
    LookaheadDecodingConfig; SamplingParams.lookahead_config is that class too), although its C++ executor would take
    G = 0 (decodingConfig.cpp): a zero is refused on that backend, not sent."""
    c = request.speculative_config
    for what, triple in (("lookahead (W, N, G)", (c.max_window_size, c.max_ngram_size, c.max_verification_set_size)),
                         ("lookahead's per-request (w, n, g)", c.request)):
        if triple is not None and min(triple) < 1:
            raise ConfigError(
                f"{what} = {tuple(triple)}: TensorRT-LLM's LookaheadDecodingConfig takes positive integers only, so a 0 "
                "cannot be sent to it; use values >= 1 on this backend, or the transformers backend, which runs this")


def ngram_trtllm(c: configs.NGramDecodingConfig, backend: str) -> dict[str, Any]:
    return {"max_draft_len": c.max_draft_len, "max_matching_ngram_size": c.max_matching_ngram_size,
            "is_keep_all": c.is_keep_all, "is_use_oldest": c.is_use_oldest, "is_public_pool": c.is_public_pool}


def ngram_trtllm_ignored(c: configs.NGramDecodingConfig, backend: str) -> list[str]:
    if c.max_candidates == 1 and not c.ngram_draft_lens:
        return []
    return [f"max_candidates ({c.max_candidates}) and ngram_draft_lens ({', '.join(map(str, c.ngram_draft_lens))}) are "
            f"this app's own: TensorRT-LLM's NGramDecodingConfig has neither and drafts one match of up to "
            f"{c.max_draft_len} tokens"]


def draft_trtllm(c: configs.DraftTargetDecodingConfig, backend: str) -> dict[str, Any]:
    return {"max_draft_len": c.max_draft_len, "speculative_model": c.speculative_model}


def medusa_trtllm(c: configs.MedusaDecodingConfig, backend: str) -> dict[str, Any]:
    # Its engine's max_draft_len holds every draft token of a step: the tree's nodes (upstream's examples use 63).
    return {"max_draft_len": c.max_total_draft_tokens, "medusa_choices": c.paths(), "num_medusa_heads": c.num_medusa_heads,
            "speculative_model": c.speculative_model}


def medusa_trtllm_check(request: configs.DecodeRequest) -> None:
    if request.sampling.temperature != 0:
        raise ConfigError("TensorRT-LLM's Medusa verifies by token match only: use temperature 0")


def eagle_trtllm(c: configs.EagleDecodingConfig, backend: str) -> dict[str, Any]:
    """TensorRT-LLM 1.2's EagleDecodingConfig derives num_eagle_layers and max_total_draft_tokens from max_draft_len,
    the drafting steps (llm_args.py validate_eagle_config): it is sent the depth alone."""
    out: dict[str, Any] = {"max_draft_len": c.max_draft_len, "speculative_model": c.speculative_model}
    if c.eagle_choices is not None:
        out["eagle_choices"] = c.paths()
    elif backend == "tensorrt":  # the engine's EAGLE-2 tree; see eagle_trtllm_ignored for PyTorch's
        out.update(use_dynamic_tree=c.use_dynamic_tree, dynamic_tree_max_topK=c.dynamic_tree_max_topK)
    if backend == "pytorch":
        # Sampling is chosen per request: without this the one-model EAGLE-3 path samples greedily whatever
        # the temperature (llm_args.py DecodingBaseConfig.allow_advanced_sampling).
        out["allow_advanced_sampling"] = True
    return out


def eagle_trtllm_ignored(c: configs.EagleDecodingConfig, backend: str) -> list[str]:
    depth = c.max_draft_len
    notes = [f"max_draft_len, the number of drafting steps, is sent as {depth} (the tree's depth); TensorRT-LLM sets "
             f"num_eagle_layers and max_total_draft_tokens from it itself"]
    if backend == "tensorrt":
        notes.append(f"on the engine backend its LLM API also sets the engine's build_config.max_draft_len from it "
                     f"(BaseLlmArgs.validate_speculative_config), so the engine holds {depth} draft tokens per step, "
                     f"not the tree's {c.max_total_draft_tokens}")
    elif c.use_dynamic_tree:
        notes.append(f"the dynamic tree's total tokens ({c.max_total_draft_tokens + 1}) and top-K ({c.dynamic_tree_max_topK}) are "
                     f"not sent: TensorRT-LLM 1.2's PyTorch backend drafts a chain of {depth} tokens (its "
                     f"validate_eagle_config sets max_total_draft_tokens to max_draft_len)")
    return notes
