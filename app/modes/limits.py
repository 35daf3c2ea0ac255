"""What one step of this app's own loop (the transformers backend) may do, so a step stays well under a second on a
2-core CPU (float32, SmolLM2-135M; measured in docs/ui.md, "Hosting publicly"): the time limit is checked between
steps, so bounding a step bounds how long a request can outlive it. TensorRT-LLM's and vLLM's engines keep their own.

STEP_DRAFT_TOKENS bounds every mode (the backend checks it); a mode whose drafting has costs of its own names its
bounds here in its entry (`Mode.loop_check`).
"""

from __future__ import annotations

from app.modes import configs
from app.modes.errors import ConfigError

STEP_DRAFT_TOKENS = 96  # draft tokens one target pass verifies (every mode's tree or chain, merged branch included)
STEP_DRAFT_MODEL_TOKENS = 32  # draft-target: sequential draft-model passes per step
# EAGLE-2 dynamic trees (the web sliders' maxima): the draft expands top-k nodes per level, one pass per level,
# and ranks every candidate; the verified tree is smaller than the other modes' limit.
STEP_EAGLE_TOP_K = 10
STEP_EAGLE_DEPTH = 8
STEP_EAGLE_TOKENS = 63  # max_total_draft_tokens (total tokens 64)


def draft_model(c: configs.DraftTargetDecodingConfig) -> None:
    if c.max_draft_len > STEP_DRAFT_MODEL_TOKENS:
        raise ConfigError(f"draft-target's max_draft_len is at most {STEP_DRAFT_MODEL_TOKENS} on the transformers backend "
                          f"(one draft-model pass per drafted token), got {c.max_draft_len}")


def eagle(c: configs.EagleDecodingConfig) -> None:
    if c.use_dynamic_tree and (c.dynamic_tree_max_topK > STEP_EAGLE_TOP_K or c.num_eagle_layers > STEP_EAGLE_DEPTH
                               or c.max_total_draft_tokens > STEP_EAGLE_TOKENS):
        raise ConfigError(f"the transformers backend grows EAGLE-2 trees of top-k at most {STEP_EAGLE_TOP_K}, depth at most "
                          f"{STEP_EAGLE_DEPTH} and max_total_draft_tokens at most {STEP_EAGLE_TOKENS}, got top-k "
                          f"{c.dynamic_tree_max_topK}, depth {c.num_eagle_layers} and max_total_draft_tokens "
                          f"{c.max_total_draft_tokens}")


def suffix(c: configs.SuffixDecodingConfig) -> None:
    if c.suffix_decoding_max_cached_requests:
        raise ConfigError("suffix_decoding_max_cached_requests is the vLLM engine's (a cache of earlier responses "
                          "shared by every request): this app's loop drafts from each request's own text, use 0")
