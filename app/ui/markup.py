"""The display's smallest pieces of HTML, below everything that draws a step: escaping (`esc`: every piece of model
text goes through it), a token's span, quoted token text, numbers, and a tree's draft probabilities. The mode
explainers (app/ui/explain) build on these; render builds on them and on the explainers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from app.traces import is_number


def esc(text: Any) -> str:
    """html.escape, plus the characters template engines act on ($ { } `) as character references."""
    return (
        html.escape(str(text), quote=True)
        .replace("$", "&#36;")
        .replace("{", "&#123;")
        .replace("}", "&#125;")
        .replace("`", "&#96;")
    )


def norm_texts(texts: Mapping[Any, str] | None) -> dict[int, str]:
    """Token id -> text piece; JSON turns the int keys into strings, so accept both."""
    out: dict[int, str] = {}
    for key, value in (texts or {}).items():
        try:
            out[int(key)] = str(value)
        except (TypeError, ValueError):
            continue
    return out


def text_of(tid: Any, texts: dict[int, str]) -> str:
    try:
        return texts.get(int(tid), f"⟨{int(tid)}⟩")
    except (TypeError, ValueError):
        return "⟨?⟩"


def show(piece: str, breaks: bool = False) -> str:
    """Escaped piece with whitespace made visible: ↵ for a newline (plus a real line break where the text is
    the output, `breaks`; a rejected or drafted newline must not break the line), ⇥ for a tab."""
    if piece == "":
        return '<span class="ws">∅</span>'
    out = esc(piece)
    if "\n" in out or "\t" in out or "\r" in out:
        out = (
            out.replace("\r", "")
            .replace("\t", '<span class="ws">⇥</span>\t')
            .replace("\n", '<span class="ws">↵</span>' + ("<br>" if breaks else ""))
        )
    return out


def is_special(piece: str) -> bool:
    return piece.startswith("<|") and piece.endswith("|>")


def tok(tid: Any, texts: dict[int, str], cls: str = "", attrs: str = "", breaks: bool = False) -> str:
    piece = text_of(tid, texts)
    classes = "tok" + (" " + cls if cls else "") + (" special" if is_special(piece) else "")
    return f'<span class="{classes}" data-tok="{esc(tid)}"{attrs}>{show(piece, breaks)}</span>'


def quote(tid: Any, texts: dict[int, str]) -> str:
    """A token's text for a tooltip or a sentence: quoted, with whitespace spelled out."""
    piece = text_of(tid, texts).replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    return f"“{piece}”"


def ms(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "–"
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def num(value: Any, fmt: str = "{:.2f}") -> str:
    return fmt.format(value) if is_number(value) else "–"


def wrap(body: str, cls: str = "") -> str:
    return f'<div class="specdec{" " + cls if cls else ""}">{body}</div>'


def clean_parents(parents: list[Any], n: int) -> list[int]:
    # A parent must precede its child (anything else hangs off the root); missing ones make a chain.
    out = [p if isinstance(p, int) and -1 <= p < i else -1 for i, p in enumerate(parents[:n])]
    return out + [i - 1 for i in range(len(out), n)]


def quotes(ids: list[int], texts: dict[int, str], most: int = 6) -> str:
    shown = "".join(text_of(t, texts) for t in ids[:most]).replace("\n", "↵")
    return f"“{shown}”" + ("…" if len(ids) > most else "")


def pruning_html(source, measure: str) -> str:
    threshold = source.get("min_path_prob")
    if not threshold:
        return ""
    return (f'<p class="sd-note">Pruned: nodes whose path probability ({esc(measure)}) is below '
            f"min_path_prob = {esc(threshold)} were not verified — fewer nodes, a cheaper target pass; "
            "verification itself is unchanged, so the output is too.</p>")


def draft_q(scores: list[Any] | None, parents: list[int], kind: str = "q") -> list[float | None]:
    """Each node's q, the draft's own probability for its token, from the scores a tree drafter reports (its
    explainer's TREE_SCORES): "q" are that already (Medusa: its head's probability); "path_log_q" are the cumulative
    log q of the node's path (EAGLE: q given the parent's path), so q = exp(score − its parent's score). None where
    unknown (a merged tree's prompt lookup nodes have no score)."""
    scores = list(scores or [])
    known = [float(x) if is_number(x) else None for x in scores]
    if kind != "path_log_q":
        return [x if x is not None and 0 <= x <= 1 else None for x in known]
    parents = clean_parents(list(parents or []), len(known))
    out: list[float | None] = []
    for x, parent in zip(known, parents):
        above = 0.0 if parent < 0 else known[parent]
        if x is None or above is None:
            out.append(None)
        else:  # a path of probability 0 is stored as -1e9 (JSON has no -inf): its q is 0, whatever its parent's
            out.append(0.0 if x <= -1e8 else min(1.0, math.exp(x - above)))
    return out
