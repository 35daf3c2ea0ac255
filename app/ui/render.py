"""Trace events -> HTML for the web UI: the token stream, one step in detail, token trees, the
Compare table and a status line.

Pure functions: data in, a string out (no gradio, no I/O, no state). Every piece of model text goes
through `esc`: html.escape plus `$ { } backtick` as character references, so token text can neither
close a tag or an attribute nor reach a template engine (gr.HTML evaluates its template as a JS
template literal). A browser shows the references as the original characters.

Stable CSS classes, all under the root class `specdec` (tests and the browser test use them):
  legend          the key to the marks; its samples use lg-* classes, never tok-*
  step            one target pass in the stream: data-step="N", title = its details
  tok             every token span (data-tok = token id); plus one of
  tok-accepted    a draft token the target accepted: tinted and underlined
  tok-rejected    a draft token not committed: struck through and faded
  tok-added       the token the target added itself; plus one of
    tok-next        plain next token (no draft, or no draft child at that node): no mark
    tok-engine      an engine's own token, correction or bonus (vLLM does not say which): solid box, superscript "?"
    tok-correction  replaces a rejected draft token: solid box, superscript "c"
    tok-bonus       the whole draft path was accepted: dashed box, superscript "+"
  more-rejected   "✗k": draft nodes rejected in other branches of a tree (not shown inline)
  sd-rejected     the <del> around a step's rejected branch (removed text for assistive technology)
  special         a special token such as <|im_end|>;  ws  a visible whitespace mark (↵ ⇥ ∅)
  sd-finish       why the generation stopped;  sd-empty  the empty state;  sd-view  the stream's root
Step detail: sd-detail, sd-draft, sd-source, tok-root; prompt lookup context: ctx (data-pos = index
in prompt + output), ctx-ngram (the matched n-gram), ctx-cont (the continuation copied as the draft),
ctx-key (the context's last n tokens), ctx-out (output, not prompt); a mode's own panel's classes are its
explainer's (its CSS: lookahead's sd-grid, grid-root, cand, cand-accepted; draft-target's sd-probs, bar; `css`); the
target's side: sd-target, sd-target-table,
weighed (a draft token and its p). Tree SVG: sd-tree, root, node (+ accepted |
rejected (+ unweighed: the target decided nothing there), + copied: from prompt lookup in a merged tree), edge
(+ accepted), tree-note; its key: tree-legend (samples lg-node-accepted | -rejected | -unweighed, lg-tag). Table: sd-table, best, identical-yes / identical-no.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.modes import MODES, Modes
from app import figures, traces
from app.traces import ADDED_KINDS, is_number, steps
from app.decoding import tree
from app.ui import explain, markup
# The display's helpers, used as render.esc etc. across the UI:
from app.ui.markup import draft_q, esc, norm_texts, num, quotes, tok  # noqa: F401

MAX_TREE_NODES = 64
# Tree SVG node looks (group attributes, box attributes, label weight): the accepted path is thick,
# tinted and bold; the other nodes are dimmed with a dashed outline (a cue that is not colour).
NODE_ON_PATH = ('class="node accepted"', 'fill="#56B4E9" fill-opacity="0.35" stroke="#0072B2" stroke-width="3"',
                ' font-weight="700"')
NODE_OFF_PATH = ('class="node rejected" opacity="0.7"',
                 'fill="#8c8c8c" fill-opacity="0.12" stroke="#8c8c8c" stroke-width="1" stroke-dasharray="4 3"', "")
# Below a rejected node the target decided nothing: fainter still, dotted (the trace's target p is None there).
NODE_UNWEIGHED = ('class="node rejected unweighed" opacity="0.45"',
                  'fill="none" stroke="#8c8c8c" stroke-width="1" stroke-dasharray="1 3"', "")

# Okabe-Ito hues (colour-blind safe; on light pages the marks darkened to 5:1 on white, WCAG AA); every colour
# also has a non-colour cue (underline, strike, box, superscript). Backgrounds are translucent tints so the text keeps the page's own colour on
# light and dark themes; the thin marks switch to lighter shades on dark pages. Given once, to the page (web.launch),
# not in every fragment; every rule starts at <body>, so Gradio's scoped copy of it matches as well.
CSS = """
body .specdec{--sd-acc:#0072B2;--sd-rej:#B84F00;--sd-cor:#8A5E00;--sd-bon:#007A5A;--sd-line:rgba(128,128,128,.55);
--sd-acc-bg:rgba(86,180,233,.28);--sd-rej-bg:rgba(213,94,0,.12);--sd-cor-bg:rgba(230,159,0,.24);--sd-bon-bg:rgba(0,158,115,.2);
line-height:1.9;font-size:1.05em}
body.dark .specdec,body .dark .specdec{--sd-acc:#56B4E9;--sd-rej:#F0864A;--sd-cor:#E69F00;--sd-bon:#35C79B}
@media (prefers-color-scheme:dark){body .specdec{--sd-acc:#56B4E9;--sd-rej:#F0864A;--sd-cor:#E69F00;--sd-bon:#35C79B}}
body .specdec .sd-text{white-space:pre-wrap;overflow-wrap:anywhere;font-size:1.2em}
body .specdec .step{border-left:1px solid var(--sd-line);padding-left:1px}
body .specdec .step::before{content:attr(data-step);font-size:.6em;vertical-align:super;opacity:.7;margin-right:1px}
body .specdec .tok{border-radius:3px}
body .specdec .tok+.tok{margin-left:1px}
body .specdec .tok-accepted,body .specdec .lg-accepted{background:var(--sd-acc-bg);border-bottom:3px solid var(--sd-acc)}
body .specdec .tok-rejected,body .specdec .lg-rejected{background:var(--sd-rej-bg);text-decoration:line-through 2px var(--sd-rej);opacity:.75}
body .specdec del.sd-rejected{text-decoration:none}
body .specdec .tok-correction,body .specdec .lg-correction{background:var(--sd-cor-bg);outline:2px solid var(--sd-cor);outline-offset:-1px}
body .specdec .tok-bonus,body .specdec .lg-bonus{background:var(--sd-bon-bg);outline:2px dashed var(--sd-bon);outline-offset:-1px}
body .specdec .tok-correction::after,body .specdec .lg-correction::after{content:"c";font-size:.6em;vertical-align:super;font-weight:700;color:var(--sd-cor)}
body .specdec .tok-bonus::after,body .specdec .lg-bonus::after{content:"+";font-size:.7em;vertical-align:super;font-weight:700;color:var(--sd-bon)}
body .specdec .lg-next{border-bottom:1px dotted var(--sd-line)}
body .specdec .tok-engine,body .specdec .lg-engine{outline:2px solid var(--sd-line);outline-offset:-1px}
body .specdec .tok-engine::after,body .specdec .lg-engine::after{content:"?";font-size:.6em;vertical-align:super;font-weight:700}
body .specdec .special{opacity:.6;font-size:.85em}
body .specdec .ws{opacity:.55}
body .specdec .more-rejected{font-size:.6em;vertical-align:super;color:var(--sd-rej)}
body .specdec .legend{display:flex;flex-wrap:wrap;gap:.3em 1.2em;font-size:.85em;margin-bottom:.5em;line-height:1.6}
body .specdec .legend .lg-item{white-space:nowrap}
body .specdec .legend .lg-step{border-left:1px solid var(--sd-line);padding-left:2px}
body .specdec .legend .lg-step::before{content:"7";font-size:.6em;vertical-align:super;opacity:.6}
body .specdec .sd-finish{font-size:.75em;opacity:.75;border:1px solid var(--sd-line);border-radius:3px;padding:0 .3em;margin-left:.4em}
body .specdec .sd-empty,body .specdec .tree-note,body .specdec .sd-note{opacity:.7;font-style:italic}
body .specdec p{margin:.3em 0}
body .specdec .sd-detail h4{margin:.2em 0}
body .specdec .sd-detail h5{margin:.6em 0 .2em 0;font-size:.9em;opacity:.85}
body .specdec .sd-row{white-space:pre-wrap;overflow-wrap:anywhere}
body .specdec .tok-root{outline:1px dotted var(--sd-line);outline-offset:-1px}
body .specdec .ctx-ngram{outline:2px solid var(--sd-cor);outline-offset:-1px;background:var(--sd-cor-bg)}
body .specdec .ctx-key{outline:2px dashed var(--sd-cor);outline-offset:-1px}
body .specdec .ctx-cont{background:var(--sd-acc-bg);border-bottom:3px solid var(--sd-acc)}
body .specdec .ctx-out{font-style:italic}
body .specdec table.sd-table{border-collapse:collapse;line-height:1.4}
body .specdec .sd-target-table td,body .specdec .sd-target-table th{padding:.1em .5em;text-align:left;vertical-align:top}
body .specdec .sd-target-table{border-collapse:collapse;line-height:1.6}
body .specdec .sd-target-table tr+tr td{border-top:1px solid var(--sd-line)}
body .specdec .weighed{white-space:nowrap;margin-right:.8em}
body .specdec .sd-tree{overflow:auto;max-height:80vh}
body .specdec .tree-legend .lg-node{display:inline-block;width:1.6em;height:.9em;border-radius:3px;vertical-align:middle;margin-right:.3em}
body .specdec .tree-legend .lg-node-accepted{background:rgba(86,180,233,.35);border:3px solid #0072B2}
body .specdec .tree-legend .lg-node-rejected{background:rgba(140,140,140,.12);border:1px dashed #8c8c8c;opacity:.7}
body .specdec .tree-legend .lg-node-unweighed{border:1px dotted #8c8c8c;opacity:.45}
body .specdec .tree-legend .lg-tag{font-size:.8em;opacity:.75;font-family:ui-monospace,Menlo,Consolas,monospace}
body .specdec .sd-table th,body .specdec .sd-table td{padding:.25em .7em;border-bottom:1px solid var(--sd-line);text-align:right}
body .specdec .sd-table th:first-child,body .specdec .sd-table td:first-child{text-align:left}
body .specdec .sd-table tr.best td{font-weight:700}
"""


def css(modes: Modes = MODES) -> str:
    """The token view's styles and those of each mode's own panel (its explainer's CSS), given once to the page."""
    return CSS + "".join(explain.of(m.name, modes).css for m in modes)


LEGEND = (
    '<div class="legend" role="note" aria-label="legend">'
    '<span class="lg-item"><span class="lg-accepted">token</span> accepted draft (underlined)</span>'
    '<span class="lg-item"><span class="lg-rejected">token</span> rejected draft (struck through)</span>'
    '<span class="lg-item"><span class="lg-correction">token</span> target\'s correction (box, c)</span>'
    '<span class="lg-item"><span class="lg-bonus">token</span> bonus after a fully accepted draft (dashed box, +)</span>'
    '<span class="lg-item"><span class="lg-next">token</span> target\'s next token, nothing drafted (plain)</span>'
    '<span class="lg-item"><span class="lg-engine">token</span> an engine\'s own token, correction or bonus: it does not say (box, ?)</span>'
    '<span class="lg-item"><span class="more-rejected">✗k</span> k more draft tokens rejected in other branches of a tree</span>'
    '<span class="lg-item"><span class="lg-step">&#8203;</span>step boundary and number (one target pass)</span>'
    "</div>"
)


# ----------------------------------------------------------------------------- text helpers


# ----------------------------------------------------------------------------- tree helpers


def _parents(event: Mapping) -> tuple[list[int], list[int]]:
    proposed = event.get("proposed") or {}
    tokens = list(proposed.get("tokens") or [])
    return tokens, markup.clean_parents(list(proposed.get("parents") or []), len(tokens))


def rejected_branch(parents: list[int], accepted: list[int], rejected: Iterable[int]) -> list[int]:
    """The draft nodes shown struck through inline: from the deepest accepted node (or the root),
    its first rejected child, then that child's first rejected child, and so on. For a chain this
    is every rejected node; for a tree, the drafter's best-ranked branch at the first rejection."""
    rej = set(rejected)
    kids = tree.children(parents)  # slot 0 the root, slot i + 1 node i
    branch: list[int] = []
    node = accepted[-1] if accepted else -1
    while True:
        nxt = next((c for c in kids[node + 1] if c in rej), None)
        if nxt is None:
            return branch
        branch.append(nxt)
        node = nxt


def _engine_step(event: Mapping) -> bool:
    """A step an engine streamed (vLLM): its committed tokens are known, its draft is not."""
    source = event.get("source")
    return isinstance(source, Mapping) and isinstance(source.get("engine"), str)


def spec_decode_line(counters: Mapping | None) -> str:
    """An engine's acceptance counters for one run, in words (vLLM: /metrics before and after the request)."""
    if not isinstance(counters, Mapping) or not counters.get("num_drafts"):
        return ""
    drafts, drafted, accepted = counters["num_drafts"], counters["num_draft_tokens"], counters["num_accepted_tokens"]
    per_pos = " / ".join(str(x) for x in counters.get("accepted_per_pos") or [])
    return (f"engine counters: {drafts} drafts of {drafted} tokens, {accepted} accepted "
            f"({accepted / drafted:.0%}; mean acceptance length {1 + accepted / drafts:.2f})"
            + (f"; accepted by draft position {per_pos}" if per_pos else ""))


def _split(event: Mapping) -> tuple[list[int], list[int], str]:
    """(accepted draft tokens, tokens the target added, added kind), both cut to what was committed."""
    tokens = list(event.get("tokens") or [])
    n_acc = min(len(event.get("accepted_tokens") or []), len(tokens))
    kind = event.get("added_kind")
    return tokens[:n_acc], tokens[n_acc:], kind if kind in ADDED_KINDS else "next"


# ----------------------------------------------------------------------------- narration


def _drafted(mode: str | None, source: Mapping, n: int, texts: dict[int, str], modes: Modes) -> str:
    """Where this step's n draft tokens came from, in one clause (its mode's explainer's)."""
    text = explain.of(mode, modes).drafted(source, n, texts)
    return text + (" and prompt lookup added its copy to the tree" if isinstance(source.get("prompt_lookup"), Mapping) else "")


def narrate(event: Mapping | None, texts: Mapping[Any, str], mode: str | None = None, modes: Modes = MODES) -> str:
    """One or two plain sentences on a step, from its trace alone: what was drafted and from where, what the
    target accepted, what it added, and what the pass bought. Plain text (the caller escapes it)."""
    if not event or not isinstance(event, Mapping):
        return ""
    texts = norm_texts(texts)
    accepted, added, kind = _split(event)
    committed = len(event.get("tokens") or [])
    if event.get("kind") == "prefill":
        return (f"The target read the whole prompt in one pass and wrote its first token, "
                f"{quotes(added or accepted, texts)}. Nothing is drafted before the first token.")
    if _engine_step(event):
        return (f"The engine's step committed {committed} token(s), {quotes(accepted + added, texts)}: "
                f"{len(accepted)} of its draft accepted plus the target's own. Its draft is not visible.")
    drafted = len(event.get("proposed", {}).get("tokens") or []) if isinstance(event.get("proposed"), Mapping) else 0
    tokens, _ = _parents(event)
    drafted = len(tokens) or drafted
    own = quotes(added, texts) if added else ""
    if not drafted:
        return (f"Nothing matched, so nothing was drafted: one pass, one token, {own}." if mode != "autoregressive"
                else f"No draft: one target pass writes one token, {own}.")
    first = _drafted(mode, event.get("source") or {}, drafted, texts, modes) + "."
    if accepted:
        took = f"The target accepted {len(accepted)} of them, {quotes(accepted, texts)}"
    else:
        took = "The target accepted none of them"
    why = {"correction": f"and wrote {own} where the draft went wrong",
           "bonus": f"and, as every drafted token on the path held, added {own} for free",
           "next": f"and added {own}"}.get(kind, "") if added else "and the output ended there"
    cost = "cost almost nothing" if mode in modes and modes[mode].drafts_free else "cost its drafting time"
    gain = (f" One pass, {committed} tokens." if committed > 1 else
            f" One pass, one token: this step's draft {cost} and earned nothing.")
    return f"{first} {took}, {why}.{gain}"


# ----------------------------------------------------------------------------- step view


def _step_title(event: Mapping, texts: dict[int, str], number: Any) -> str:
    tokens, parents = _parents(event)
    accepted, added, kind = _split(event)
    lines = [f"Step {number} · {event.get('kind') or 'decode'}"]
    engine = _engine_step(event)
    if event.get("kind") != "prefill":
        lines.append(f"accepted {len(accepted)} (the engine does not show its draft)" if engine else
                     f"drafted {len(tokens)} · accepted {len(accepted)} · rejected {len(event.get('rejected') or [])}")
    if added:
        lines.append(f"target added {markup.quote(added[0], texts)} ({kind})")
    elif event.get("added_token") is None and event.get("tokens"):
        lines.append("nothing added: the output ended inside the accepted draft")
    if not engine:
        lines.append(f"draft {markup.ms(event.get('draft_time_s'))} · verify {markup.ms(event.get('verify_time_s'))}")
    if event.get("finish_reason"):
        lines.append(f"finished: {event['finish_reason']}")
    return esc("\n".join(lines))


def step_view(events: list[dict], texts: Mapping[Any, str]) -> str:
    """The output with every target pass marked: accepted drafts, the first rejected branch struck
    through, the target's own token (next / correction / bonus), one `step` element per pass."""
    texts = norm_texts(texts)
    events = steps(events)
    if not events:
        return markup.wrap(LEGEND + '<div class="sd-empty">No tokens yet. Run a prompt: every target pass '
                     "appears here as a numbered step.</div>", "sd-view")
    parts: list[str] = []
    for i, event in enumerate(events):
        number = event.get("step", i)
        accepted, added, kind = _split(event)
        inner = [tok(t, texts, "tok-accepted", breaks=True) for t in accepted]
        tokens, parents = _parents(event)
        rejected = [r for r in (event.get("rejected") or []) if isinstance(r, int) and 0 <= r < len(tokens)]
        branch = rejected_branch(parents, list(event.get("accepted") or []), rejected)
        if branch:  # not output: marked as removed text, so a screen reader does not read it as the answer
            inner.append('<del class="sd-rejected" aria-label="rejected draft">'
                         + "".join(tok(tokens[r], texts, "tok-rejected") for r in branch) + "</del>")
        if len(rejected) > len(branch):
            more = len(rejected) - len(branch)
            said = f"{more} more draft tokens rejected in other branches of the tree"
            inner.append(f'<span class="more-rejected" title="{said}" aria-label="{said}">✗{more}</span>')
        inner += [tok(t, texts, f"tok-added tok-{kind}", breaks=True) for t in added]
        if not event.get("tokens") and event.get("text"):
            inner.append(f'<span class="tok tok-text">{markup.show(str(event["text"]), breaks=True)}</span>')
        # The step's numbers for a pointer (title) and for a screen reader (aria-label): not behind a hover only.
        said = _step_title(event, texts, number)
        parts.append(f'<span class="step" data-step="{esc(number)}" title="{said}" role="group" aria-label="{said}">'
                     f'{"".join(inner)}</span>')
    finish = events[-1].get("finish_reason")
    if finish:
        parts.append(f'<span class="sd-finish" title="why the generation stopped">■ {esc(finish)}</span>')
    return markup.wrap(LEGEND + '<div class="sd-text">' + "".join(parts) + "</div>", "sd-view")


# ----------------------------------------------------------------------------- step detail


def step_detail(event: Mapping | None, texts: Mapping[Any, str], prompt_ids: list[int] | None,
                history_ids: list[int] | None, mode: str | None = None, modes: Modes = MODES) -> str:
    """One target pass in detail: the draft (chain or tree) with the accepted path and the rejected
    nodes, what was committed, and where the draft came from (per mode). `history_ids` = the output
    before this step, so the context the drafter saw is prompt_ids + history_ids. `mode`: the trace's
    (a merged tree's name counts as its tree's); `modes` the registry that knows it."""
    texts = norm_texts(texts)
    if not event or not isinstance(event, Mapping):
        return markup.wrap('<div class="sd-empty">Pick a step to see its draft, what the target accepted, '
                     "and where the draft came from.</div>", "sd-detail")
    context = list(prompt_ids or []) + list(history_ids or [])
    number = event.get("step", "?")
    tokens, parents = _parents(event)
    accepted_nodes = [a for a in (event.get("accepted") or []) if isinstance(a, int) and 0 <= a < len(tokens)]
    accepted, added, kind = _split(event)
    source = event.get("source") or {}
    mode = (mode or "").partition("+")[0]
    said = explain.of(mode, modes)

    out = [f"<h4>Step {esc(number)} · {esc(event.get('kind') or 'decode')}</h4>",
           f'<p class="sd-narration">{esc(narrate(event, texts, mode, modes))}</p>']
    if _engine_step(event):
        summary = [f"accepted {len(accepted)}", f"committed {len(event.get('tokens') or [])}",
                   f"{source.get('engine')} engine step: its draft and timings are not visible"]
    else:
        summary = [f"drafted {len(tokens)}", f"accepted {len(accepted)}",
                   f"draft {markup.ms(event.get('draft_time_s'))}, verify {markup.ms(event.get('verify_time_s'))}"]
    out.append(f'<p class="sd-summary">{esc(" · ".join(summary))}</p>')

    committed = [tok(t, texts, "tok-accepted") for t in accepted]
    committed += [tok(t, texts, f"tok-added tok-{kind}") for t in added]
    what = {"correction": "the target's correction replaces the first rejected draft token",
            "bonus": "every draft token on the path was accepted, so the target's next token comes free",
            "next": "the target's own next token",
            "engine": "the target's own token: a correction of a rejected draft token, or its next token after a step "
                      "that drafted nothing (the engine does not say which)"}[kind] if added else "the output ended inside the accepted draft"
    out.append(f'<div class="sd-row">Committed: {"".join(committed) or "nothing"} '
               f'<span class="sd-note">({esc(what)})</span></div>')

    out.append('<section class="sd-draft"><h5>Draft</h5>')
    root = context[-1] if context else None
    if event.get("kind") == "prefill":
        out.append('<p class="sd-note">The prefill pass runs the whole prompt and gives the first token; '
                   "nothing is drafted.</p>")
    elif _engine_step(event):  # the engine reports what it committed, not what it drafted
        out.append(f'<p class="sd-note">Not visible: the engine does not report its draft. Of it, {len(accepted)} '
                   "token(s) were accepted (the committed tokens but the last); how many were drafted and rejected is "
                   "unknown.</p>")
    elif not tokens:
        out.append('<p class="sd-note">Nothing drafted this step: one target pass, one token.</p>')
    # Medusa and EAGLE keep the tree drawing (and its node scores) when pruning leaves a single path.
    elif tree.is_chain(parents) and not said.scored_tree:
        acc = set(accepted_nodes)
        row = [tok(root, texts, "tok-root") + " → "] if root is not None else []
        row += [tok(t, texts, "tok-accepted" if i in acc else "tok-rejected") for i, t in enumerate(tokens)]
        out.append(f'<div class="sd-row">{"".join(row)}</div>')
    else:
        scores = (source.get("tree") or {}).get("scores") if said.scored_tree else None
        branch = source.get("prompt_lookup") if said.scored_tree else None
        copied = (branch.get("nodes") or []) if isinstance(branch, Mapping) else []
        q = draft_q(scores, parents, said.tree_scores) if scores else None
        out.append(tree_svg(tokens, parents, accepted_nodes, texts, q=q, root=root, copied=copied,
                            target_p=(event.get("target") or {}).get("p")))
    out.append("</section>")

    view = event.get("target")
    if isinstance(view, Mapping) and view.get("decided"):
        out.append('<section class="sd-target"><h5>What the target made of it</h5>')
        out.append(_target_html(view, event, texts, tokens, parents, root, source))
        out.append("</section>")

    out.append('<section class="sd-source"><h5>Where the draft came from</h5>')
    out.append(_source_html(said, event, source, texts, context, len(prompt_ids or []), tokens, parents, accepted))
    out.append("</section>")
    return markup.wrap("".join(out), "sd-detail")


def _p(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "–"
    if value == 0:
        return "0"
    return "&lt;0.001" if value < 0.0005 else f"{value:.3f}"


def _target_html(view: Mapping, event: Mapping, texts, tokens, parents, root, source) -> str:
    """The target's side of the step (the trace's `target`): one row per position where it decided
    (the root and each accepted node) with its own top token, the draft tokens it weighed there and
    the probability it gave each; then the token it added."""
    decided = [d for d in view.get("decided") or [] if isinstance(d, Mapping)]
    p = list(view.get("p") or [])
    sampled = view.get("distribution") == "sampling"
    q = source.get("draft_probs") if sampled and isinstance(source.get("draft_probs"), list) else None
    accepted = {a for a in (event.get("accepted") or []) if isinstance(a, int)}
    kids = tree.children(parents)  # slot 0 the root, slot i + 1 node i
    rows = []
    for d in decided:
        after = d.get("after")
        if isinstance(after, int) and 0 <= after < len(tokens):
            where = tok(tokens[after], texts, "tok-accepted")
        else:
            where = tok(root, texts, "tok-root") if root is not None else "the root"
        weighed = []
        for c in kids[after + 1] if isinstance(after, int) and -1 <= after < len(parents) else []:
            pc = p[c] if c < len(p) else None
            cell = f'{tok(tokens[c], texts, "tok-accepted" if c in accepted else "tok-rejected")} {_p(pc)}'
            if q is not None and c < len(q) and isinstance(q[c], (int, float)) and q[c] > 0 and isinstance(pc, (int, float)):
                cell += f' <span class="sd-note">q {_p(q[c])}, min(1, p/q) = {_p(min(1.0, pc / q[c]))}</span>'
            weighed.append(f'<span class="weighed">{cell}</span>')
        cells = " ".join(weighed) or '<span class="sd-note">none drafted</span>'
        rows.append(f"<tr><td>{where}</td><td>{tok(d.get('top'), texts)} {_p(d.get('top_p'))}</td><td>{cells}</td></tr>")
    _, added, kind = _split(event)
    tail = ""
    if added:
        tail = (f'<p>Added {tok(added[0], texts, f"tok-added tok-{kind}")} ({esc(kind)}), p {_p(view.get("added_p"))}'
                + (" — sampled from the target's distribution at that position" if sampled and kind == "next" else "")
                + (" — drawn from what the rejections left of p" if sampled and kind == "correction" else "")
                + ".</p>")
    if not sampled:
        how = ("p is the target's probability for a token there (the softmax of its logits). Greedy verification "
               "keeps a draft token only if it is the target's top token, so a rejected token with a high p was "
               "a near miss.")
    elif source.get("acceptance") == "typical":
        how = ("p is the target's sampling distribution there (temperature, top-k, top-p). Medusa's typical "
               "acceptance keeps a token when p &gt; min(ε, δ·exp(−H(p))) — <b>not lossless</b>.")
    elif q is not None:
        how = ("p is the target's sampling distribution there (temperature, top-k, top-p), q the draft model's. "
               "Speculative sampling keeps each draft token with probability min(1, p/q); at the first rejection "
               "the target samples from max(0, p − q), renormalised — exactly the target's distribution overall.")
    else:
        how = ("p is the target's sampling distribution there (temperature, top-k, top-p). This draft is "
               "deterministic, so a token is kept with probability p; if it is rejected the next sibling is "
               "tried against what is left of p, and when all fail the target samples from the rest "
               "(recursive rejection: exactly the target's distribution).")
    return (f'<p class="sd-note">{how}</p><table class="sd-target-table"><tr><th>after</th>'
            f"<th>target's top token, p</th><th>draft tokens weighed there, p</th></tr>{''.join(rows)}</table>{tail}")


def _source_html(said: explain.Explainer, event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
    if source.get("not_visible"):
        hidden = ", ".join(str(x) for x in source["not_visible"])
        return f'<p class="sd-note">This backend does not expose: {esc(hidden)}. Only the committed tokens are known.</p>'
    if event.get("kind") == "prefill":
        return '<p class="sd-note">Prefill: no draft yet.</p>'
    panel = said.source_html
    if isinstance(source.get("prompt_lookup"), Mapping):  # a merged tree: its own drafter's panel, then the copy's
        own = {k: v for k, v in source.items() if k != "prompt_lookup"}
        return (panel(event, own, texts, context, prompt_len, tokens, parents, accepted)
                + _merged_html(source["prompt_lookup"], texts, tokens, event.get("accepted") or []))
    return panel(event, source, texts, context, prompt_len, tokens, parents, accepted)


def _merged_html(branch: Mapping, texts, tokens, accepted_nodes) -> str:
    """The prompt lookup branch of a merged tree: what it matched and which nodes it added or shared."""
    match = branch.get("match")
    head = ('<p><b>Merged with prompt lookup</b> (a SpecInfer-style merged tree: both drafts verified in the same '
            "target pass, still lossless).")
    if not isinstance(match, Mapping):
        return head + " No n-gram at the end of the text occurs earlier, so it added nothing this step.</p>"
    ngram = [t for t in (match.get("ngram") or []) if isinstance(t, int)]
    key = "".join(tok(t, texts, "ctx-key") for t in ngram)
    where = "the prompt" if match.get("in_prompt") else "the output so far"
    nodes = [i for i in (branch.get("nodes") or []) if isinstance(i, int) and 0 <= i < len(tokens)]
    new = branch.get("new_nodes")
    shared = len(nodes) - new if isinstance(new, int) else None
    accepted = {i for i in accepted_nodes if isinstance(i, int)}
    copied = "".join(tok(tokens[i], texts, "tok-accepted" if i in accepted else "tok-rejected") for i in nodes)
    counts = f"{esc(new)} new node(s)" + (f", {esc(shared)} shared with the tree's own" if shared else "")
    won = [i for i in nodes if i in accepted]
    return (head + f" The last {len(ngram)} token(s), {key}, occur earlier in {where} at position "
            f"{esc(match.get('position'))}; the continuation copied from there, {copied}, went into the tree as "
            f"{counts} (tagged PL). {esc(len(won))} of them were accepted.</p>")


# ----------------------------------------------------------------------------- tree SVG


def _label(piece: str, limit: int = 12) -> str:
    text = piece.replace("\n", "↵").replace("\t", "⇥").replace("\r", "").replace(" ", "␣")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _keep(parents: list[int], accepted: list[int], limit: int) -> list[int]:
    """At most `limit` nodes, ancestor-closed: the accepted path, then nodes in order (parents come
    before children, so every prefix of the node list is ancestor-closed)."""
    keep = set(accepted)
    for i in range(len(parents)):
        if len(keep) >= limit:
            break
        keep.add(i)
    # Close under ancestors in case `accepted` was not a root path.
    for i in list(keep):
        p = parents[i]
        while p >= 0 and p not in keep:
            keep.add(p)
            p = parents[p]
    return sorted(keep)


def _q(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if value >= 10 ** -digits / 2 or value == 0 else f"<{10 ** -digits:.{digits}f}"


def tree_legend(q: bool = False, weighed: bool = False, unweighed: bool = False, copied: bool = False) -> str:
    """The key to a tree drawing's marks; an entry for q, target-weighed nodes and PL tags only where the tree has
    them. Its samples are the node looks (NODE_ON_PATH, NODE_OFF_PATH, NODE_UNWEIGHED) in CSS."""
    off = "weighed by the target and rejected (dashed, faded)" if weighed else "not accepted (dashed, faded)"
    items = ['<span class="lg-item"><span class="lg-node lg-node-accepted"></span>✓ accepted path (thick, tinted)</span>',
             f'<span class="lg-item"><span class="lg-node lg-node-rejected"></span>{off}</span>']
    if unweighed:
        items.append('<span class="lg-item"><span class="lg-node lg-node-unweighed"></span>not weighed: below a rejected '
                     "node, the target decided nothing there (dotted, fainter)</span>")
    if q:
        items.append('<span class="lg-item"><span class="lg-tag">q 0.83</span> the draft\'s own probability for the token '
                     "(hover a node for its path's product of q and the target's p)</span>")
    if copied:
        items.append('<span class="lg-item"><span class="lg-tag">PL</span> copied by prompt lookup into the merged tree'
                     "</span>")
    return f'<div class="legend tree-legend" role="note" aria-label="tree legend">{"".join(items)}</div>'


def tree_svg(tokens: list[int], parents: list[int], accepted: list[int], texts: Mapping[Any, str],
             q: list[float | None] | None = None, *, root: int | None = None, copied: Iterable[int] = (),
             target_p: list[float | None] | None = None) -> str:
    """An inline SVG of a token tree with its legend: root at the left, one column per depth, one row per leaf.
    The accepted path is drawn thick with ✓; other nodes are faded with a dashed outline, dotted where the target
    never weighed them (`target_p`, the trace's target probabilities, None there; they go into the tooltips). `q`
    (draft_q: the draft's own probability per node) tags each node. Nodes in `copied` came from prompt lookup (a
    merged tree) and carry a "PL" tag. Trees over MAX_TREE_NODES nodes are cut to the accepted path plus the
    first-ranked nodes."""
    texts = norm_texts(texts)
    tokens = list(tokens or [])
    if not tokens:
        return '<div class="sd-tree tree-empty sd-note">No draft tree this step.</div>'
    parents = markup.clean_parents(list(parents or []), len(tokens))
    acc_path = [a for a in (accepted or []) if isinstance(a, int) and 0 <= a < len(tokens)]
    acc = set(acc_path)
    keep = _keep(parents, acc_path, MAX_TREE_NODES)
    kids: dict[int, list[int]] = {}
    for i in keep:
        kids.setdefault(parents[i], []).append(i)
    depth = tree.depths(parents)
    rows, y = _rows(kids)

    q = list(q) if q else []
    own = {i: float(q[i]) for i in keep if i < len(q) and is_number(q[i])}
    score = {i: f"q {_q(own[i])}" for i in own}
    path_q: dict[int, float] = {}
    for i in sorted(own):  # parents come before children
        above = 1.0 if parents[i] < 0 else path_q.get(parents[i])
        if above is not None:
            path_q[i] = above * own[i]
    weighed_p = list(target_p or [])
    unweighed = {i for i in keep if target_p and i not in acc and not is_number(weighed_p[i] if i < len(weighed_p) else None)}

    char, pad, node_h, pitch, gap, root_w, x0 = 7.9, 10, 24, 32, 36, 54, 8
    copied = {i for i in copied if isinstance(i, int)}
    tag = {i: ("PL " + score[i] if i in score else "PL") if i in copied else score.get(i) for i in keep}
    labels = {i: ("✓ " if i in acc else "") + _label(markup.text_of(tokens[i], texts)) for i in keep}
    widths = {i: (len(labels[i]) + (len(tag[i]) + 1 if tag[i] else 0)) * char + 2 * pad for i in keep}
    col = max(widths.values()) + gap
    width = int(x0 + root_w + gap + max(depth[i] for i in keep) * col)
    height = int(max(rows, 1) * pitch + 12)

    def cx(d: int) -> float:
        return x0 + root_w + gap + (d - 1) * col

    def cy(node: int) -> float:
        return 6 + y[node] * pitch + pitch / 2

    edges, nodes = [], []
    for i in keep:
        on_path = i in acc
        p = parents[i]
        x1, y1 = (x0 + root_w if p < 0 else cx(depth[p]) + widths[p]), cy(p)
        x2, y2 = cx(depth[i]), cy(i)
        mid = (x1 + x2) / 2
        look = ('class="edge accepted" stroke="#0072B2" stroke-width="3.5"' if on_path
                else 'class="edge" stroke="#8c8c8c" stroke-width="1.2" opacity="0.6"')
        curve = f"M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
        edges.append(f'<path {look} fill="none" d="{curve}"/>')
    for i in keep:
        on_path = i in acc
        x, yy = cx(depth[i]), cy(i)
        tip = f"node {i} · depth {depth[i]} · {markup.quote(tokens[i], texts)}"
        if i in own:
            tip += f" · draft q {_q(own[i], 3)}"
            tip += f", its path's {_q(path_q[i], 3)}" if i in path_q and depth[i] > 1 else ""
        tip += " · from prompt lookup" if i in copied else ""
        weighed = target_p[i] if target_p and i < len(target_p) else None
        if is_number(weighed):
            tip += f" · target p {weighed:.3f}"
        elif target_p:
            tip += " · not weighed (below a rejected node)"
        tip += " · accepted" if on_path else " · not accepted"
        group, box, weight = NODE_ON_PATH if on_path else NODE_UNWEIGHED if i in unweighed else NODE_OFF_PATH
        if i in copied:
            group = group.replace('class="node ', 'class="node copied ')
        extra = f'<tspan font-size="11" opacity="0.75"> {esc(tag[i])}</tspan>' if tag[i] else ""
        nodes.append(
            f'<g {group} data-node="{i}"><title>{esc(tip)}</title>'
            f'<rect x="{x:.1f}" y="{yy - node_h / 2:.1f}" width="{widths[i]:.1f}" height="{node_h}" rx="5" {box}/>'
            f'<text x="{x + pad:.1f}" y="{yy + 4.5:.1f}" font-size="13" fill="currentColor"{weight}>'
            f"{esc(labels[i])}{extra}</text></g>"
        )
    root_tip = "root: the last committed token" + (f" {markup.quote(root, texts)}" if root is not None else "")
    root_label = _label(markup.text_of(root, texts), 6) if root is not None else "root"
    root_svg = (f'<g class="root"><title>{esc(root_tip)}</title>'
                f'<rect x="{x0}" y="{cy(-1) - node_h / 2:.1f}" width="{root_w}" height="{node_h}" rx="12" '
                'fill="none" stroke="currentColor" stroke-width="1.5"/>'
                f'<text x="{x0 + root_w / 2}" y="{cy(-1) + 4.5:.1f}" font-size="12" text-anchor="middle" '
                f'fill="currentColor">{esc(root_label)}</text></g>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" class="sd-tree-svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" font-family="ui-monospace,Menlo,Consolas,monospace" '
           f'aria-label="draft token tree: {len(keep)} nodes, {len(acc)} accepted">'
           f'{"".join(edges)}{root_svg}{"".join(nodes)}</svg>')
    note = ""
    if len(keep) < len(tokens):
        note = (f'<div class="tree-note">Showing {len(keep)} of {len(tokens)} nodes: the accepted path and '
                "the first-ranked nodes.</div>")
    legend = tree_legend(q=bool(own), weighed=bool(target_p), unweighed=bool(unweighed), copied=bool(copied & set(keep)))
    return f'<div class="sd-tree">{legend}{svg}{note}</div>'


def _rows(kids: dict[int, list[int]]) -> tuple[int, dict[int, float]]:
    """Vertical slots: leaves take rows in depth-first order; a parent sits midway between its
    first and last child, so a chain draws as a straight line."""
    y: dict[int, float] = {}
    rows = 0
    stack: list[tuple[int, bool]] = [(-1, False)]
    while stack:
        node, done = stack.pop()
        children = kids.get(node, [])
        if not children:
            y[node] = rows
            rows += 1
        elif done:
            y[node] = (y[children[0]] + y[children[-1]]) / 2
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children))
    return rows, y

# ----------------------------------------------------------------------------- compare table and status


def summary_table(rows: list[dict] | None) -> str:
    """The Compare tab's table: one row per mode; ✓ / ✗ = output identical to autoregressive."""
    rows = [r for r in (rows or []) if isinstance(r, Mapping)]
    if not rows:
        return markup.wrap('<div class="sd-empty">No comparison yet. Run one prompt through several modes to '
                     "compare their speed.</div>", "sd-compare")
    speedups = [r.get("speedup") for r in rows if isinstance(r.get("speedup"), (int, float))]
    best = max(speedups) if speedups else None
    head = ("<tr><th>Mode</th><th>tokens/s</th><th>speedup</th><th>τ (tokens/step)</th>"
            '<th title="time of one step of this mode after the prefill, in autoregressive steps: speedup ≈ τ ÷ this">'
            "step time (× AR)</th><th>acceptance</th><th>identical to AR</th><th>new tokens</th><th>time (s)</th></tr>")
    body, notes = [], []
    for r in rows:
        mode = str(r.get("mode", ""))
        mode = {MODES.label(k): k for k in MODES.names}.get(mode, mode)  # a label works as well as a key
        label = MODES.label(mode) if mode in MODES else mode
        identical = r.get("identical")
        mark = {True: '<span class="identical-yes" title="identical">✓</span>',
                False: '<span class="identical-no" title="differs">✗</span>'}.get(identical, "–")
        rate = r.get("acceptance_rate")
        rate_text = f"{rate * 100:.0f}%" if is_number(rate) else "–"
        speed = r.get("speedup")
        is_best = best is not None and speed == best and best > 1 and len(rows) > 1  # no star for the least slow
        best_attr = ' class="best"' if is_best else ""
        doubt = r.get("doubt")
        after = r.get("decoding_speedup")
        if isinstance(doubt, str) and speed is None:  # withheld: what still stands, marked; the sentence under the table
            sentence = figures.withheld(doubt)
            said = f"{after:.2f}× after the prefill" if is_number(after) else "not shown"
            speed_cell = f'<span class="doubt" title="{esc(sentence)}">{said}*</span>'
            notes.append(f'<p class="sd-note withheld">* {esc(label)}: {esc(sentence)}</p>')
        else:
            speed_cell = num(speed, '{:.2f}×')
        load = r.get("load")
        if isinstance(load, Mapping) and is_number(load.get("run")) and is_number(load.get("baseline")):
            speed_cell += f' <span class="doubt" title="{esc(traces.load_said(load))}">⚠</span>'
        body.append(
            f'<tr data-mode="{esc(mode)}"{best_attr}>'
            f"<td>{esc(label)}{' ★' if is_best else ''}</td><td>{num(r.get('tokens_per_s'), '{:.1f}')}</td>"
            f"<td>{speed_cell}</td><td>{num(r.get('tau'))}</td><td>{num(r.get('step_cost'))}</td><td>{rate_text}</td>"
            f"<td>{mark}</td><td>{num(r.get('new_tokens'), '{:.0f}')}</td>"
            f"<td>{num(r.get('elapsed_s'))}</td></tr>"
        )
    return markup.wrap(f'<table class="sd-table">{head}{"".join(body)}</table>{"".join(notes)}', "sd-compare")


def speedup_line(events: list[dict] | None, baseline: list[dict] | None,
                 passes: tuple[str | None, str | None] = (None, None)) -> str:
    """traces.speedup_parts in one line of Markdown for the Run tab's status ("" when there is nothing to compare); a
    ratio measured under changing load, or against a baseline on another pass, is said to be one, not printed."""
    parts = traces.speedup_parts(events, baseline, passes)
    if not parts:
        return ""
    if parts["doubt"]:
        return f"⚠ {figures.withheld(parts['doubt'])} τ {parts['tau']:.2f} tokens/pass does not depend on the clock."
    overall = f"**{parts['overall']:.2f}×** the autoregressive run's tokens/s · " if "overall" in parts else ""
    if parts["overall_doubt"]:
        overall = f"⚠ {parts['overall_doubt']} · "
    interval = f" (95 % of the step times' spread: {parts['interval'][0]:.2f}–{parts['interval'][1]:.2f}×)" if parts["interval"] else ""
    split = (f" (verify {parts['verify']:.2f} + draft {parts['draft']:.2f} + loop {parts['loop']:.2f})"
             if parts["verify"] is not None else " (no draft and verify times to split it: an engine does not report them)")
    load = parts["load"]
    changed = f" · ⚠ {traces.load_said(load)}; read the ratio with its spread, or run both again" if load else ""
    return (f"{overall}after the prefill {parts['decoding']:.2f}×{interval} = τ {parts['tau']:.2f} ÷ a step costing "
            f"{parts['step_cost']:.2f} autoregressive steps{split}{changed}")


def totals_line(event: Mapping | None) -> str:
    """A one-line plain-text status: tokens, target passes, τ, acceptance, time, tokens/s, finish."""
    if not event or not isinstance(event, Mapping):
        return "Ready."
    t = event.get("totals") or {}
    parts = []
    new, steps = t.get("new_tokens"), t.get("target_steps")
    if isinstance(new, (int, float)):
        parts.append(f"{new:.0f} tokens")
    if isinstance(steps, (int, float)) and steps:
        parts.append(f"{steps:.0f} target passes")
        if isinstance(new, (int, float)) and steps > 1:
            # The prefill's pass commits one token whatever the mode: τ is the decoding steps', as the speedup's is
            # (traces.speedup_parts), so one status shows one τ.
            parts.append(f"τ {(new - 1) / (steps - 1):.2f} tokens/pass after the prefill")
    drafted, accepted = t.get("drafted"), t.get("accepted")
    if isinstance(drafted, (int, float)) and drafted:
        rate = f" ({accepted / drafted:.0%})" if isinstance(accepted, (int, float)) else ""
        parts.append(f"accepted {accepted}/{drafted:.0f} drafted{rate}")
    elapsed = t.get("elapsed_s")
    if isinstance(elapsed, (int, float)) and elapsed > 0:
        parts.append(f"{elapsed:.2f} s")
        if isinstance(new, (int, float)):
            parts.append(f"{new / elapsed:.1f} tokens/s")
    if event.get("finish_reason"):
        parts.append(f"finished: {event['finish_reason']}")
    return " · ".join(parts) if parts else "Running…"
