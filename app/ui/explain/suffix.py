"""Suffix decoding in the web app: the recurring suffix it continued and what followed it each time."""

from __future__ import annotations

from collections.abc import Mapping

from app.ui import markup

RECORDING = 'the answer repeats what it has written, and the counts pick the continuation that recurs most.'
LEARN = """\
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
positions verified. With nothing recurring it drafts nothing and runs at baseline speed; drafts rejected every time
cost those positions and the loop's own work for nothing, so such a run can read below 1×.
"""


def drafted(source, n, texts) -> str:
    suffix = source.get("suffix")
    if not isinstance(suffix, Mapping):
        return f"Suffix decoding drafted {n} token(s)"
    key = [t for t in suffix.get("match") or [] if isinstance(t, int)]
    count = suffix.get("count")
    seen = f", seen {count - 1} time(s) before" if isinstance(count, int) and count > 1 else ""
    return f"Suffix decoding drafted the most frequent continuation of {markup.quotes(key, texts)}{seen}: {n} token(s)"


def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    return _suffix_html(source.get("suffix"), texts, context, prompt_len, tokens, parents)


def _suffix_html(suffix, texts, context, prompt_len, tokens, parents) -> str:
    """Which recurring suffix the draft continues, where it occurred before and what followed it each time."""
    if not isinstance(suffix, Mapping) or not suffix.get("match"):
        return ('<p class="sd-note">Suffix decoding: the text\'s last token does not occur earlier with a continuation '
                "likely enough, so nothing was drafted.</p>")
    match = [t for t in suffix["match"] if isinstance(t, int)]
    m, size = len(match), len(context)
    key = "".join(markup.tok(t, texts, "ctx-key") for t in match)
    earlier = [i for i in range(size - m) if context[i : i + m] == match] if context[size - m :] == match else []
    follows: dict[int, int] = {}
    for i in earlier:
        follows[context[i + m]] = follows.get(context[i + m], 0) + 1
    probs = suffix.get("probs") or []
    shape = "tree of the most probable continuations" if suffix.get("tree") else "chain along the most frequent continuation"
    drafted = "".join(markup.tok(t, texts, "ctx-cont") + (f'<sub class="sd-note">{markup.esc(probs[i])}</sub>' if i < len(probs) else "")
                      for i, t in enumerate(tokens))
    rows = "".join(f"<tr><td>{markup.tok(t, texts, '')}</td><td>{markup.esc(n)}</td></tr>"
                   for t, n in sorted(follows.items(), key=lambda kv: -kv[1])[:8])
    table = (f'<table class="sd-table"><tr><th>what followed it</th><th>times</th></tr>{rows}</table>'
             if rows else "")
    where = (f"at position{'s' if len(earlier) > 1 else ''} {markup.esc(', '.join(str(i) for i in earlier[:12]))}"
             + (" …" if len(earlier) > 12 else "")) if earlier else ""
    return (f"<p>Suffix decoding: the last {m} token(s) of the text, {key}, occurred {markup.esc(len(earlier))} time(s) "
            f"before {where} (prompt: positions below {markup.esc(prompt_len)}). The draft is a {shape}; each token's "
            f"estimated probability is how often it followed, over how often its path occurred: {drafted}. "
            f"Their sum, {markup.esc(suffix.get('score'))}, was the best of the match lengths tried (a match of m tokens "
            "drafts at most spec-factor × m).</p>" + table)
