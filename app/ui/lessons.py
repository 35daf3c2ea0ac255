"""The "Learn" texts: the overview, the cost curve and earnings notes, and each mode's text (its explainer's,
app/ui/explain/: what it does, its parameters with TensorRT-LLM's names, whether it is lossless, and why it is or is
not fast on a small CPU). Markdown; the methods as their papers and TensorRT-LLM's documentation define them."""

from app import figures, runner
from app.modes import MODES, Modes
from app.ui import explain as explainers

ENGINE_PREFIX = "vllm:"  # a Compare row run on the vLLM engine: `vllm:prompt_lookup`


def label(name: str, modes: Modes = MODES) -> str:
    """A mode's display name (its entry's); a merged tree's (`eagle+prompt_lookup`) reads "EAGLE + prompt lookup",
    a vLLM row's (`vllm:prompt_lookup`) "Prompt lookup on vLLM"."""
    if name.startswith(ENGINE_PREFIX):
        return label(name.removeprefix(ENGINE_PREFIX), modes) + " on vLLM"
    return modes.label(name)


def explain(name: str, modes: Modes = MODES) -> str:
    """A mode's Learn text: its explainer's (app/ui/explain/), or for a mode without one its config's own description."""
    return explainers.of(name, modes).learn

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
        return f"**{cost['dtype']}**: {figures.withheld(doubt)}"
    draft_cost = max(draft_cost, 0.0)
    sizes = earning_sizes(cost)
    if not sizes:  # every pass that drafts was withheld (runner.verify_cost)
        return f"**{cost['dtype']}**: " + " ".join(left_out(cost))
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


def unsteady(cost: dict) -> str | None:
    """Why a measured cost curve is not one (a wider pass measured cheaper than a narrower one), or None."""
    if fall := runner.falls(cost):
        (k0, r0), (k1, r1) = fall
        return (f"a pass over {k1} tokens measured {r1:.2f}× and over {k0} tokens {r0:.2f}×, but the wider pass "
                "does all the narrower one does: the machine's load changed while measuring; measure again")
    return None


def left_out(cost: dict) -> list[str]:
    """The rule's sentence for each pass width a measured curve left out (runner.verify_cost's `withheld`: timed under
    other load than the one-token pass)."""
    return [figures.withheld(w["reason"]) for w in cost.get("withheld") or []]


def pass_cost_note(costs: list[dict]) -> str:
    """One line per measured dtype: the one-token pass and what a pass over more tokens costs in those (or why the
    curve is not one, or why a width is left out of it)."""
    lines = []
    for c in costs:
        rel = dict(zip(c["tokens"], c["relative"]))
        more = ", ".join(f"{k} tokens {r:.2f}×" for k, r in rel.items() if k > 1)
        where = f" ({c['pass']})" if c.get("pass") else ""
        doubts = [figures.withheld(doubt)] if (doubt := unsteady(c)) else []
        lines.append(f"- **{c['dtype']}**{where}: one-token pass {c['ms'][0]:.1f} ms after {c['context']} tokens of "
                     + (f"context; a pass over {more} of that." if more else "context.")
                     + "".join(f" ⚠ {said}" for said in doubts + left_out(c)))
    return "\n".join(lines)


LOAD = """\
### When speculation stops paying: concurrent requests
Everything above is one request at a time, and this app's own loop only ever runs one. Speculation pays there
because a pass is limited by reading the weights: the arithmetic units have **spare compute**, and verifying a few
drafted tokens in the same pass uses it almost for free. A serving engine batches the requests that arrive together
(continuous batching): each pass then carries one token of every request, and that batch fills the same spare
compute. A verify pass of a speculative engine carries k + 1 positions per request, so as the batch grows its
**compute per verify pass** grows k + 1 times as fast as the plain engine's, the drafts that are rejected cost real
time, and at some number of requests speculation costs more than it saves, even with τ unchanged. Where that
happens depends on the hardware's spare compute: a 2-core CPU has little, a GPU a lot. Published GPU figures
(EAGLE-3 paper, as published: 1.81× at batch 2 and 1.38× at batch 64 on an H100) show the same decline at far larger
batches. The **Load** tab measures it on this machine's vLLM engines, and its recorded sweeps replay without one.
"""
