"""Medusa in the web app: heads on the target's last hidden state, a tree of their guesses."""

from __future__ import annotations

from app.ui import markup

RECORDING = "heads on the target's last hidden state guess several positions ahead, as a tree."
RECORDING_MERGED = "Medusa's tree and prompt lookup's copy verified in one pass: each wins where the other misses."
LEARN = """\
### Medusa (extra decoding heads)
K small **heads** read the target's last hidden state; head k (from 0) guesses the token k + 2
places ahead, the target's own head gives the next one. Each head is a residual block
(x + SiLU(Wx)) and a vocabulary projection, trained with the target frozen. The heads' top-ranked
tokens fill a **static tree** of rank paths (`medusa_choices` such as [0], [0, 0], [1], …; the
reference tree has 63 nodes). One target pass verifies the whole tree under a tree attention mask;
the longest accepted path wins, plus the target's token.

**Parameters** (TensorRT-LLM `MedusaDecodingConfig`, TensorRT engine backend only):
`medusa_choices` (rank paths; depth ≤ number of heads), `num_medusa_heads` (from the checkpoint when
unset), `max_draft_len` (> 0, the number of tree nodes; the examples use 63). Typical acceptance
(specdec `typical_acceptance`): `posterior_threshold` ε = 0.09, `posterior_alpha` δ = 0.3. TensorRT-LLM's
Medusa does token matching only.

**Lossless:** with greedy matching or exact rejection sampling, yes. **Typical acceptance is NOT
lossless**: it accepts x when p(x) > min(ε, δ·exp(−H(p))), trading exactness for longer accepted
runs under sampling.

**On a 2-core CPU:** every tree node is a verified position: 16 nodes add 40 % to a pass where the
CPU multiplies bfloat16 natively, several times that elsewhere. The heads rank only the 8192 tokens
the model writes most. `min path probability` (this app's own setting) drops every node whose
product of head probabilities along its path is below it, so a step verifies only guesses likely
enough to pay. Published GPU speedups: 2.2–3.6×.

**Merged with prompt lookup** (checkbox): prompt lookup's copies join the tree (SpecInfer's merged
tree), verified in one pass; tagged PL.
"""
SCORED_TREE = True  # its tree is drawn with the heads' scores, even when pruning leaves a chain


def drafted(source, n, texts) -> str:
    return f"Medusa's heads proposed a tree of {n} token(s) from the target's last hidden state"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    heads = source.get("heads")
    rule = ("typical acceptance: accept x if p(x) &gt; min(ε, δ·exp(−H(p))) — <b>not lossless</b>"
            if source.get("acceptance") == "typical" else "greedy match / exact rejection sampling (lossless)")
    return (f'<p>Medusa: {markup.esc(heads if heads is not None else "?")} heads read the target\'s last hidden state; '
            "a node at depth d is head d's rank-r guess for the token d places after the root (the tree "
            "choices list these rank paths). A node's q is its head's probability for its token.</p>"
            f"{markup.pruning_html(source, 'the product of the heads’ probabilities along it')}"
            f"<p>Verification: {rule}.</p>")
