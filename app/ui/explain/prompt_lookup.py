"""Prompt lookup in the web app: the n-gram it matched and the continuation it copied."""

from __future__ import annotations

from collections.abc import Mapping

from app.ui import markup

RECORDING = 'the answer copies its input, so matches in the prompt are accepted many tokens at a time.'
LEARN = """\
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
baseline speed; a match that drafts and is rejected every time costs its verify pass's extra positions and the
loop's own work for nothing, so such a run can read below 1× (the Compare tab's step column says by how much).
"""


def drafted(source, n, texts) -> str:
    match = source.get("match")
    if not isinstance(match, Mapping):
        return f"Prompt lookup copied {n} token(s)"
    where = "the prompt" if match.get("in_prompt") else "the text written so far"
    key = [t for t in match.get("ngram") or [] if isinstance(t, int)]
    return f"Prompt lookup copied {n} token(s) that followed {markup.quotes(key, texts)} earlier in {where}"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return _prompt_lookup_html(source, texts, context, prompt_len, tokens, parents)


def _prompt_lookup_html(source, texts, context, prompt_len, tokens, parents) -> str:
    match = source.get("match")
    if not match:
        return ('<p class="sd-note">No n-gram at the end of the text occurs earlier in the prompt or the '
                "output, so nothing was drafted.</p>")
    ngram = list(match.get("ngram") or [])
    n, pos = len(ngram), match.get("position")
    cont = match.get("continuation_position", (pos or 0) + n)
    if not isinstance(pos, int) or pos < 0 or pos + n > len(context) or context[pos : pos + n] != ngram:
        key = "".join(markup.tok(t, texts, "ctx-key") for t in ngram)
        return f'<p>Matched n-gram {key} (its context is not available here).</p>'
    if not isinstance(cont, int):
        cont = pos + n
    draft_len = 0  # how much of the draft's first branch copies the context after the match
    while (draft_len < len(tokens) and cont + draft_len < len(context) and parents[draft_len] == draft_len - 1
           and tokens[draft_len] == context[cont + draft_len]):
        draft_len += 1
    lo = max(0, pos - 10)
    hi = min(len(context), max(lo + 30, cont + draft_len + 2), lo + 40)
    size = len(context)
    classes: dict[int, str] = {i: "ctx-key" for i in range(size - n, size)}
    classes.update({i: "ctx-cont" for i in range(cont, cont + draft_len)})
    classes.update({i: "ctx-ngram" for i in range(pos, pos + n)})
    where = "the prompt" if match.get("in_prompt") else "the output so far"
    row = ['<span class="sd-note">… </span>' if lo > 0 else ""]
    for i in range(lo, hi):
        cls = " ".join(c for c in ("ctx", classes.get(i), "ctx-out" if i >= prompt_len else None) if c)
        row.append(markup.tok(context[i], texts, cls, f' data-pos="{i}"'))
    if hi < size:
        row.append('<span class="sd-note"> …</span>')
    key = "".join(markup.tok(t, texts, "ctx-key") for t in context[size - n :])
    others = [m.get("position") for m in (source.get("matches") or [])[1:] if isinstance(m, Mapping)]
    extra = (f'<p class="sd-note">{len(others)} more match(es) at positions '
             f'{markup.esc(", ".join(str(p) for p in others))} were drafted as other branches.</p>') if others else ""
    return (f"<p>Prompt lookup: the last {n} token(s) of the text, {key}, occur earlier in {where} at "
            f"position {markup.esc(pos)}. The draft copies the {draft_len} token(s) that followed there.</p>"
            f'<div class="sd-row">{"".join(row)}</div>'
            '<p class="sd-note">boxed: the matched n-gram · underlined: the continuation copied as the draft · '
            "dashed box: the end of the text it matched</p>" + extra)
