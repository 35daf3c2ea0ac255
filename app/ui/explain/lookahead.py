"""Lookahead in the web app: the Jacobi window and the pool's candidates."""

from __future__ import annotations

from app.ui import markup

RECORDING = "no draft model: the window's n-grams hit on text that repeats a pattern."
LEARN = """\
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
"""

# Its panel: the window as a grid, the pool's candidates one a line.
CSS = """
body .specdec table.sd-grid{border-collapse:collapse;line-height:1.4}
body .specdec .sd-grid td,body .specdec .sd-grid th{border:1px solid var(--sd-line);padding:.1em .35em;text-align:center;white-space:pre}
body .specdec .sd-grid th{font-weight:400;font-size:.75em;opacity:.7}
body .specdec .cand{margin:.1em 0}
body .specdec .cand-accepted{font-weight:700}
"""


def drafted(source, n, texts) -> str:
    return f"Lookahead offered {n} token(s) from its n-gram pool and Jacobi window"


def verify_note(config) -> str:
    return f"engine max_draft_len = (N−2) + (W−1+G)(N−1) = **{config.max_total_draft_tokens}**"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return _lookahead_html(source, texts, context, accepted)


def _lookahead_html(source, texts, context, accepted) -> str:
    out = []
    window = source.get("window")
    root = context[-1] if context else None
    if window:
        rows = [list(r) for r in window]
        width = max([len(rows[0]) + 1] + [level + len(r) for level, r in enumerate(rows) if level > 0])
        head = "".join(f"<th>t+{c}</th>" for c in range(width))
        body = []
        for level, row in enumerate(rows):
            offset = 1 if level == 0 else level  # level 0 starts after the root; level l at t + l
            cells = ["<td></td>"] * width
            if level == 0 and root is not None:
                cells[0] = f'<td class="grid-root">{markup.tok(root, texts, "tok-root")}</td>'
            for i, t in enumerate(row):
                if offset + i < width:
                    cells[offset + i] = f"<td>{markup.tok(t, texts)}</td>"
            body.append(f"<tr><th>level {level}</th>{''.join(cells)}</tr>")
        out.append("<p>Jacobi window: each column is a trajectory of guesses at a position; one pass "
                   "refines every level, and each column's tokens become new n-grams for the pool.</p>"
                   f'<table class="sd-grid"><tr><th></th>{head}</tr>{"".join(body)}</table>')
    else:
        out.append('<p class="sd-note">No Jacobi window in this pass (warming up, or no room left).</p>')
    candidates = [list(c) for c in (source.get("candidates") or [])]
    if not candidates:
        out.append('<p class="sd-note">The n-gram pool had no candidate starting with the current token.</p>')
        return "".join(out)

    def agree(c: list[int]) -> int:
        k = 0
        while k < min(len(c), len(accepted)) and c[k] == accepted[k]:
            k += 1
        return k

    best = max(range(len(candidates)), key=lambda j: (agree(candidates[j]), -j))
    if not agree(candidates[best]):
        best = None
    key = markup.tok(root, texts, "tok-root") if root is not None else "the current token"
    out.append(f"<p>Pool candidates verified for {key} (n-grams that followed it before):</p>")
    for j, cand in enumerate(candidates):
        if j == best:
            k = agree(cand)
            toks = [markup.tok(t, texts, "tok-accepted" if i < k else "tok-rejected") for i, t in enumerate(cand)]
            out.append(f'<div class="cand cand-accepted">✓ {"".join(toks)} <span class="sd-note">'
                       f"accepted {k} of {len(cand)}</span></div>")
        else:
            out.append(f'<div class="cand">· {"".join(markup.tok(t, texts) for t in cand)}</div>')
    return "".join(out)
