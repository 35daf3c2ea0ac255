"""Draft-target in the web app: a small draft model's tokens and its probabilities q."""

from __future__ import annotations

from app.ui import markup

RECORDING = 'a one-layer draft, distilled from the target, drafts one token per small pass.'
LEARN = """\
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
"""

# Its panel: the draft's probabilities, a bar each.
CSS = """
body .specdec table.sd-probs{border-collapse:collapse;line-height:1.4}
body .specdec .sd-probs td{padding:.1em .5em;text-align:left;vertical-align:top}
body .specdec .bar{display:inline-block;height:.8em;background:var(--sd-acc);opacity:.75;vertical-align:middle}
"""


def drafted(source, n, texts) -> str:
    return f"The draft model proposed {n} token(s), one small pass each"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return _draft_probs_html(source, texts, tokens, event)


def _draft_probs_html(source, texts, tokens, event) -> str:
    probs = list(source.get("draft_probs") or [])
    acc = set(event.get("accepted") or [])
    rows = []
    for i, t in enumerate(tokens):
        p = probs[i] if i < len(probs) and isinstance(probs[i], (int, float)) else None
        bar = f'<span class="bar" style="width:{max(0.0, min(1.0, p)) * 8:.2f}em"></span>' if p is not None else ""
        cls = "tok-accepted" if i in acc else "tok-rejected"
        rows.append(f"<tr><td>{i + 1}</td><td>{markup.tok(t, texts, cls)}</td><td>{bar}</td><td>{markup.num(p, '{:.3f}')}</td></tr>")
    return ("<p>Draft-target: the small draft model proposed these tokens one by one; q is its probability for "
            "each. The target accepts a token when it agrees (greedy) or with probability min(1, p/q).</p>"
            f'<table class="sd-probs"><tr><th>#</th><th>token</th><th></th><th>q</th></tr>{"".join(rows)}</table>')
