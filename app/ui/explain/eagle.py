"""EAGLE in the web app: a draft layer on the target's features, a tree grown by its confidence."""

from __future__ import annotations

from app.ui import markup

RECORDING = "a draft layer on the target's features grows a tree per step; the target keeps the best branch."
RECORDING_MERGED = "EAGLE's tree with prompt lookup's copy merged in: the best of both in one pass."
LEARN = """\
### EAGLE (draft on the target's features)
A tiny draft model, one decoder layer, reads the target's **features** (hidden states after
layers 2, 15 and 27 of 30, fused) with the next token and predicts the token after; the target's
output rows for its 8192 most written tokens score the guesses (EAGLE-3). Deeper in the tree it
reads its own output, as trained. EAGLE-2 grows
a **dynamic tree**: for `depth` levels, expand the top_k most confident nodes; score each node by
its path's cumulative log-probability; keep the best max_total_draft_tokens nodes. One target pass verifies
the tree.

**Parameters** (TensorRT-LLM `EagleDecodingConfig` / `Eagle3DecodingConfig`): `max_total_draft_tokens` (the
tree nodes, eagle_total_tokens − 1; > 0 and ≤ 256; the CLI's default 23, this app starts at 11),
`num_eagle_layers` (the depth, which TensorRT-LLM sends as `max_draft_len`; 5 and 4; EAGLE-2 uses 7), `dynamic_tree_max_topK` (top_k; 4 and 3;
EAGLE-2 uses 10), `use_dynamic_tree`, or a
static tree in `eagle_choices`; `speculative_model` (the draft) is required. TensorRT-LLM's PyTorch
backend runs EAGLE-3 checkpoints only; the engine backend runs static or dynamic trees.

**Lossless:** yes: greedy match, or recursive rejection sampling with deterministic drafts.

**On a 2-core CPU:** the draft layer is cheap but runs `depth` passes in sequence; verifying grows
with the tree (fast pass, bfloat16: 8 tokens 1.4× one, 16 1.8×, 32 2.8×): small trees win.
`min path probability` (this app's own) prunes nodes whose draft path probability is lower and stops drafting
deeper when a level has none, so unsure steps stay cheap.
Published GPU results: EAGLE-2 3.05–4.26×, EAGLE-3 up to 6.5×.

**Merged with prompt lookup** (checkbox): prompt lookup's copies join the tree (SpecInfer's merged
tree), verified in one pass; tagged PL.
"""
SCORED_TREE = True  # its tree is drawn with the draft's scores, even when pruning leaves a chain
TREE_SCORES = "path_log_q"  # dynamic_tree ranks nodes by their path's cumulative log q: drawn as each node's own q


def drafted(source, n, texts) -> str:
    return f"EAGLE's draft layer grew a tree of {n} token(s) from the target's features"


def _kept(source) -> str:
    """The nodes the tree kept at most; a recording from before max_total_draft_tokens said EAGLE-2's total_tokens."""
    if "max_total_draft_tokens" in source:
        return markup.esc(source["max_total_draft_tokens"])
    return f"{markup.esc(source.get('total_tokens', '?'))} − 1"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    if source.get("static_nodes"):
        shape = f"a static tree of {markup.esc(source['static_nodes'])} rank paths"
    else:
        shape = (f"an EAGLE-2 dynamic tree: depth {markup.esc(source.get('depth', '?'))}, top_k "
                 f"{markup.esc(source.get('top_k', '?'))}, the best {_kept(source)} nodes kept")
    return (f"<p>EAGLE: a one-layer draft model reads the target's features and grows {shape}. "
            "A node's q is the draft's probability for its token after its parent's path; the tree keeps the nodes "
            "whose paths have the highest product of q (the draft's confidence); "
            "verification is greedy match or recursive rejection (lossless).</p>"
            + markup.pruning_html(source, "its cumulative draft probability; a level with no such node ends the drafting"))
