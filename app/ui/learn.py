"""The "Learn" texts: what each decoding mode does, its parameters (TensorRT-LLM names), whether it
is lossless, and why it is or is not fast on a small CPU. Markdown; the methods as their papers and
TensorRT-LLM's documentation define them. The CPU numbers are the bundled SmolLM2-135M in
bfloat16 on 2 cores: a target pass costs 20-50 ms depending on the CPU, each extra position verified
in it 2-3 % of that where the CPU multiplies bfloat16 natively (`python -m app bench` records the curve)."""

from app.modes import MODES, Modes

ENGINE_PREFIX = "vllm:"  # a Compare row run on the vLLM engine: `vllm:prompt_lookup`


def label(name: str, modes: Modes = MODES) -> str:
    """A mode's display name (its entry's); a merged tree's (`eagle+prompt_lookup`) reads "EAGLE + prompt lookup",
    a vLLM row's (`vllm:prompt_lookup`) "Prompt lookup on vLLM"."""
    if name.startswith(ENGINE_PREFIX):
        return label(name.removeprefix(ENGINE_PREFIX), modes) + " on vLLM"
    return modes.label(name)


def explain(name: str, modes: Modes = MODES) -> str:
    """A mode's Learn text: LEARN's, or for a mode without one its config's own description."""
    return LEARN.get(name) or f"### {modes[name].label}\n{modes[name].config.__doc__ or ''}"

OVERVIEW = """\
### Speculative decoding in one paragraph
A language model writes one token per forward pass, and on small batches that pass is limited by
reading the weights, not by arithmetic: checking several positions costs barely more than one.
Speculative decoding exploits this. Something cheap **drafts** a few tokens (or a tree of
alternatives); the target model **verifies** them all in one pass and keeps the longest prefix it
agrees with, plus one token of its own: a **correction** where a draft token was rejected, or a
**bonus** when the whole draft path was accepted. So every pass yields at least one token.

**Lossless.** With greedy decoding the output is identical, token for token, to plain
autoregressive decoding; with sampling, exact rejection rules keep the target's distribution.
The one exception here is Medusa's optional *typical acceptance*.

**Two numbers.** τ (tokens per target pass) says how good the drafts are; the **speedup**
(tokens/s against autoregressive) is what you get after paying for drafting and for the larger
verify pass. On a 2-core CPU with native bfloat16 a pass costs about 20 ms plus about 0.5 ms per
extra verified position, so roughly: speedup ≈ τ · 20 / (20 + 0.5 · positions + draft ms). After a run
that raced the baseline, the Run tab's status splits its speedup exactly so: τ ÷ the time of one of its
steps in autoregressive steps (verify + draft + loop), and the Compare tab plots every mode that way.

**Reading the token view.** Underlined: accepted draft token. Struck through: rejected draft.
Boxed (c): the target's correction. Dashed box (+): bonus token. Plain: the target's next token
with nothing drafted. Thin bars with small numbers: one step = one target pass.
"""

LEARN = {
    "autoregressive": """\
### Autoregressive (the baseline)
One target pass per token: feed the last token, pick the next (argmax, or a sample), append, repeat.
Nothing is drafted, so τ = 1 token per pass, and every other mode is measured against this one:
same prompt, same sampling settings, tokens per second compared.

**Parameters:** only generation settings (`max_new_tokens`, temperature, top-k / top-p, seed).
TensorRT-LLM: `speculative_config=None`. On a lookahead engine a request with (w, n, g) = (1, 1, 0)
also decodes autoregressively.

**Lossless:** it is the reference. Under greedy decoding every speculative mode must reproduce this
output exactly.

**On a 2-core CPU:** a pass of the bundled 135M model takes 20-50 ms, mostly streaming the weights
through the cores for a single position. Adding positions to the same pass costs only a few percent
of that each (where the CPU multiplies bfloat16 natively). That spare capacity is what the other modes spend: guess several tokens, check them all
in one pass.
""",
    "draft_target": """\
### Draft-target (speculative sampling)
A small **draft model** with the target's vocabulary proposes γ tokens one after another (it keeps
its own KV cache and rewinds it after each step). The target runs one pass over
[root, d₁ … d_γ]. Greedy: keep draft tokens while they equal the target's argmax. Sampling: keep
dᵢ with probability min(1, p(dᵢ)/q(dᵢ)); at the first rejection the target samples a
**correction** from norm(max(0, p − q)); if all γ pass it adds a **bonus** token (Leviathan et al.,
Chen et al.).

**Parameters** (TensorRT-LLM `DraftTargetDecodingConfig`, PyTorch backend): `max_draft_len` γ
(> 0, here default 4, at most 256) and `speculative_model`, the draft, which must share the target's
vocabulary.

**Lossless:** yes, under greedy and under exact rejection sampling.

**Expected gain:** with per-token acceptance α, a pass yields (1 − α^(γ+1)) / (1 − α) tokens on
average, and each of them costs a draft forward.

**On a 2-core CPU:** verifying 4 extra tokens adds only about 10 % to a pass, but drafting is
sequential, γ draft passes per step. The draft must be far cheaper than the target and agree with it
often. A 135M target leaves little room for a smaller draft, so this mode is usually slower here. It
pays with big targets: StarCoder-15B with a 164M draft on a Xeon got about 3.3× from assisted
generation.
""",
    "prompt_lookup": """\
### Prompt lookup (n-gram)
No draft model. Take the last n tokens of the text (n from `max_matching_ngram_size` down to 1),
find an earlier occurrence in the prompt or the output, and propose the tokens that followed it
there. The target verifies that chain in one pass and commits the agreeing prefix plus its own
next token.

**Parameters** (TensorRT-LLM `NGramDecodingConfig`, PyTorch backend): `max_draft_len` (> 0, here
default 10; `prompt_lookup_num_tokens` in the older engine flow), `max_matching_ngram_size`
(≥ 1, default 2), `is_use_oldest` (the earliest match wins, default true). specdec adds
`max_candidates` (verify several matches as one tree) and `ngram_draft_lens` (shorter drafts after
short matches).

**Lossless:** yes, under greedy and exact sampling (the draft is deterministic).

**When it helps:** when the answer copies from its input: summaries, retrieval-augmented answers,
code edits, quotes. Published: about 2.4× on CNN/DM summarisation (Mistral-7B, A100); Spec-Bench
1.66× overall and 2.66× on summarisation.

**On a 2-core CPU:** drafting is a search over token ids (well under a millisecond) and each drafted
token adds only a few percent to a pass, so a good match is nearly free speed and a bad one costs
little. On free text that shares nothing with the prompt there is nothing to draft, and it runs at
baseline speed.
""",
    "lookahead": """\
### Lookahead (Jacobi window + n-gram pool)
No draft model either. Each target pass does two jobs. The **lookahead branch** refines a 2D window
of guesses (N − 1 levels by W columns) by Jacobi iteration; every column yields an n-gram for the
**pool**. The **verification branch** checks up to G pooled n-grams that start with the current
token; the longest agreeing one wins, plus the target's token. The window shifts one column a step.

**Parameters** (TensorRT-LLM `LookaheadDecodingConfig`, TensorRT engine backend only):
`max_window_size` W (≥ 1, default 4), `max_ngram_size` N (≥ 1, default 3),
`max_verification_set_size` G (≥ 0, default 4; the LLM API class requires ≥ 1). N = 1 requires W = 1
and G = 0: (1, 1, 0) is plain autoregressive, (2, 2, 1) the smallest real setting. A request's
(w, n, g) must not exceed (W, N, G).

**Draft budget:** `max_draft_len = (0 if N == 1 else N − 2) + (W − 1 + G)(N − 1)`: 15 for
(4, 3, 4), 23 for (4, 4, 4), 83 for (7, 7, 7), 0 for (1, 1, 0). TensorRT-LLM needs exactly this value.

**Lossless:** yes: greedy match, or recursive rejection with deterministic drafts when sampling.

**On a 2-core CPU:** the default window and candidates add 15 positions, 40 % or more to a pass,
so a step must commit at least 1.4 tokens to break even, and it commits at most N (N − 1 drafted plus
the target's). On GPUs, where extra positions are nearly free, it pays far more (1.5–2.3× published).
""",
    "medusa": """\
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
""",
    "suffix": """\
### Suffix decoding
No draft model: prompt lookup with counts. A suffix tree holds every substring of the prompt and the
output so far (up to `suffix_decoding_max_tree_depth` tokens) with how often it occurs. For m = 1,
2, … while the text's last m tokens recur, the draft follows their **most frequent continuation**: a
token's probability is how often it followed over how often its path occurred. It stops below
`suffix_decoding_min_token_prob` or after `suffix_decoding_max_spec_factor` × m tokens, and the draft
whose probabilities sum highest is verified (SuffixDecoding, Oliaro et al., 2024).

**Parameters** (vLLM's `suffix` method): `num_speculative_tokens` (here `max_draft_len`, 24),
`suffix_decoding_max_tree_depth` (24), `…_max_spec_factor` (1.0), `…_min_token_prob` (0.1),
`…_max_cached_requests`: vLLM can also count earlier requests' responses, shared by all requests;
this app sets 0 so each request drafts from its own text. specdec adds `use_tree_spec` (verify the
likeliest continuations as a tree; vLLM verifies a chain). TensorRT-LLM 1.2 has no such method; the
`SADecodingConfig` of its later main branch (a suffix automaton) copies the longest earlier match, without counts.

**Lossless:** yes, under greedy and exact sampling (the draft is deterministic).

**When it helps:** text that repeats within the answer or from the prompt: code, lists, structured
output, quoting answers, agent loops. The counts choose among earlier continuations, and the match
length says how far to trust one.

**On a 2-core CPU:** drafting is a dictionary walk (well under a millisecond); the cost is the extra
positions verified. With nothing recurring it drafts nothing and runs at baseline speed.
""",
    "eagle": """\
### EAGLE (draft on the target's features)
A tiny draft model, one decoder layer, predicts the target's next **feature** (its final hidden
state) from the current feature and the next token; the target's own output rows for the 8192
tokens it writes most turn features into tokens. As in EAGLE-3, committed positions also bring the
target's hidden states after a low, a middle and a high layer (2, 15, 27 of 30). EAGLE-2 grows
a **dynamic tree**: for `depth` levels, expand the top_k most confident nodes; score each node by
its path's cumulative log-probability; keep the best total_tokens − 1 nodes. One target pass verifies
the tree.

**Parameters** (TensorRT-LLM `EagleDecodingConfig` / `Eagle3DecodingConfig`): `max_draft_len` (the
tree nodes, eagle_total_tokens − 1; > 0 and ≤ 256; the CLI's default 23, this app starts at 11),
`num_eagle_layers` (the depth; 5 and 4; EAGLE-2 uses 7), `dynamic_tree_max_topK` (top_k; 4 and 3;
EAGLE-2 uses 10), `use_dynamic_tree`, or a
static tree in `eagle_choices`; `speculative_model` (the draft) is required. TensorRT-LLM's PyTorch
backend runs EAGLE-3 checkpoints only; the engine backend runs static or dynamic trees.

**Lossless:** yes: greedy match, or recursive rejection sampling with deterministic drafts.

**On a 2-core CPU:** the draft layer is cheap, but it runs `depth` small passes in sequence, and 23
verified nodes add 40–90 % to a pass with native bfloat16, more without. `min path probability`
(this app's own setting) prunes nodes whose draft path probability is lower and stops drafting
deeper when a level has none, so unsure steps stay cheap.
Published GPU results: EAGLE-2 3.05–4.26×, EAGLE-3 up to 6.5×.

**Merged with prompt lookup** (checkbox): prompt lookup's copies join the tree (SpecInfer's merged
tree), verified in one pass; tagged PL.
""",
}

PASS_COST = """\
### What a pass costs on this machine
A target pass reads every weight once however many tokens it carries, so verifying a few drafted
tokens costs little more than decoding one, until the arithmetic for more tokens (and the attention
over a long context) starts to count. **Measure** times passes over k = 1 to 32 new tokens after the
Run tab's prompt, in float32 and in bfloat16, each relative to a one-token pass. A speculative step
that verifies k tokens pays only if it commits more tokens than that, on average (its τ).
"""


EARNINGS = """\
### What speculation can earn here
The measured curve and Leviathan et al.'s model (Fast Inference from Transformers via Speculative Decoding, 2023) say what a drafter must achieve to pay on this
machine. If each drafted token is accepted with probability α, independently of the others, a step that drafts
γ tokens commits (1 − α^(γ+1)) / (1 − α) tokens on average (the target's own token included) and costs a pass
over γ + 1 tokens plus γ drafts. Each curve divides the two: above the dotted line, drafting γ tokens beats
autoregressive decoding. Set the draft's cost to what your drafter spends per token, in one-token passes:
prompt lookup drafts for free (0), a draft model costs a pass of its own per token. The model is a chain's:
lookahead also verifies its window, and Medusa and EAGLE verify a tree of alternatives, whose extra nodes
cost more positions and raise τ; their τ in the Run tab tells what they achieved.
"""


def expected_tokens(alpha: float, drafted: int) -> float:
    """Tokens a step commits on average when each of `drafted` tokens is accepted with probability
    `alpha`, independently, until the first rejection; the target's own token included."""
    if alpha >= 1:
        return drafted + 1.0
    return (1 - alpha ** (drafted + 1)) / (1 - alpha)


def expected_speedup(alpha: float, drafted: int, relative_cost: float, draft_cost: float = 0.0) -> float:
    """Leviathan's walltime factor over autoregressive decoding: tokens per step over what a step costs in
    one-token passes (a verify pass over drafted + 1 tokens, `relative_cost` of them, plus each draft). A
    negative draft cost (typed into the slider's box) counts as free."""
    return expected_tokens(alpha, drafted) / (relative_cost + drafted * max(draft_cost, 0.0))


def break_even(drafted: int, relative_cost: float, draft_cost: float = 0.0) -> float | None:
    """The acceptance rate above which drafting `drafted` tokens beats autoregressive decoding; None when
    even α = 1 does not pay. (The speedup grows with α, so bisection finds it.)"""
    if expected_speedup(1.0, drafted, relative_cost, draft_cost) < 1:
        return None
    if expected_speedup(0.0, drafted, relative_cost, draft_cost) >= 1:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_speedup(mid, drafted, relative_cost, draft_cost) < 1 else (low, mid)
    return high


def earning_sizes(cost: dict) -> list[tuple[int, float]]:
    """(tokens drafted, relative cost of their verify pass) for the measured passes over 2 to 16 tokens."""
    return [(k - 1, r) for k, r in zip(cost["tokens"], cost["relative"]) if 2 <= k <= 16]


def earnings_note(cost: dict | None, draft_cost: float) -> str:
    """Break-even acceptance rates and the best draft length at a few rates, for one measured curve."""
    if not cost:
        return ""
    if doubt := unsteady(cost):  # break-even rates read off a broken curve would contradict each other
        return f"**{cost['dtype']}**: no break-even rates: {doubt}."
    draft_cost = max(draft_cost, 0.0)
    sizes = earning_sizes(cost)
    needs = []
    for drafted, rel in sizes:
        alpha = break_even(drafted, rel, draft_cost)
        tokens = f"{drafted} token{'s' if drafted > 1 else ''}"
        needs.append(f"{tokens} needs α ≥ {alpha:.2f}" if alpha is not None else f"{tokens} never pays")
    best = []
    for alpha in (0.3, 0.6, 0.9):
        gain, drafted = max((expected_speedup(alpha, g, r, draft_cost), g) for g, r in sizes)
        best.append(f"at α {alpha}, {drafted} ({gain:.2f}×)" if gain > 1 else f"at α {alpha}, none pays")
    return (f"**{cost['dtype']}**, a draft costing {draft_cost:.2f} of a one-token pass per token: to beat autoregressive "
            f"decoding, drafting {', '.join(needs)}. The best number to draft: {'; '.join(best)}.")


# A pass over more tokens does all a narrower one does: a curve that falls by more than this (relative to the one-token
# pass) was measured while the machine's load changed.
CURVE_NOISE = 0.2


def unsteady(cost: dict) -> str | None:
    """Why a measured cost curve is not one (a wider pass measured cheaper than a narrower one), or None."""
    points = list(zip(cost["tokens"], cost["relative"]))
    for (k0, r0), (k1, r1) in zip(points, points[1:]):
        if r1 < r0 - CURVE_NOISE:
            return (f"a pass over {k1} tokens measured {r1:.2f}× and over {k0} tokens {r0:.2f}×, but the wider pass "
                    "does all the narrower one does: the machine's load changed while measuring; measure again")
    return None


def pass_cost_note(costs: list[dict]) -> str:
    """One line per measured dtype: the one-token pass and what a pass over more tokens costs in those (or why the
    curve is not one)."""
    lines = []
    for c in costs:
        rel = dict(zip(c["tokens"], c["relative"]))
        more = ", ".join(f"{k} tokens {r:.2f}×" for k, r in rel.items() if k > 1)
        where = f" ({c['pass']})" if c.get("pass") else ""
        doubt = unsteady(c)
        lines.append(f"- **{c['dtype']}**{where}: one-token pass {c['ms'][0]:.1f} ms after {c['context']} tokens of "
                     f"context; a pass over {more} of that." + (f" ⚠ Not a cost curve: {doubt}." if doubt else ""))
    return "\n".join(lines)
