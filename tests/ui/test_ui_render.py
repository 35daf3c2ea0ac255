"""app.ui.render and app.ui.lessons: token HTML from real traces (one per mode, recorded from the
bundled model in tests/data/traces), escaping, empty and huge traces, the tree SVG."""

import json
import math
import re
from html.parser import HTMLParser

import pytest

from app.modes import MODES as REGISTRY
from app import figures, traces
from app.traces import Recording
from app.ui import compare_tab, lessons, render
from helpers import ROOT

TRACES = ROOT / "tests" / "data" / "traces"
MODES = ["autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix"]
VOID = {"br", "hr", "img", "input", "meta", "link", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.parts = [], []

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def text(self):
        return "".join(p if isinstance(p, str) else p.text() for p in self.parts)

    def iter(self):
        for child in self.children:
            yield child
            yield from child.iter()

    def find(self, cls=None, tag=None):
        return [n for n in self.iter() if (cls is None or cls in n.classes) and (tag is None or n.tag == tag)]


class TreeBuilder(HTMLParser):
    """A tiny DOM from the stdlib parser: enough to count classes and read text and attributes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#root", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.current)
        self.current.children.append(node)
        self.current.parts.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        node = Node(tag, attrs, self.current)
        self.current.children.append(node)
        self.current.parts.append(node)

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        assert node is not self.root, f"unbalanced </{tag}>"
        self.current = node.parent

    def handle_data(self, data):
        self.current.parts.append(data)


def parse(html_text):
    builder = TreeBuilder()
    builder.feed(html_text)
    builder.close()
    assert builder.current is builder.root, f"unclosed <{builder.current.tag}>"
    return builder.root


def load(mode):
    return json.loads((TRACES / f"{mode}.json").read_text())


def first_rejected_branch(parents, accepted, rejected):
    """The test's own reading of "the rejected branch of the first rejection"."""
    node, branch = (accepted[-1] if accepted else -1), []
    while True:
        kids = [i for i, p in enumerate(parents) if p == node and i in set(rejected)]
        if not kids:
            return branch
        node = kids[0]
        branch.append(node)


# ----------------------------------------------------------------------------- step_view on real traces


@pytest.mark.parametrize("mode", ["eagle", "medusa", "prompt_lookup"])
def test_step_view_marks_rejected_drafts_as_removed_text_and_says_each_steps_numbers(mode):
    """For assistive technology: a rejected draft is removed text (<del>), not output; a step's numbers are its
    aria-label, not only a hover tooltip; the ✗k mark of a tree's other rejected branches says what it counts."""
    trace = load(mode)
    dom = parse(render.step_view(trace["steps"], trace["texts"]))
    rejected = dom.find("tok-rejected")
    assert rejected and all(t.parent.tag == "del" and "sd-rejected" in t.parent.classes for t in rejected)
    steps = dom.find("step")
    assert steps and all(s.attrs.get("role") == "group" and s.attrs.get("aria-label") == s.attrs.get("title") for s in steps)
    for mark in (m for step in steps for m in step.find("more-rejected")):
        assert mark.text().startswith("✗") and "more draft tokens rejected" in mark.attrs["aria-label"]


@pytest.mark.parametrize("mode", MODES)
def test_step_view_counts_match_trace(mode):
    trace = load(mode)
    steps = trace["steps"]
    dom = parse(render.step_view(steps, trace["texts"]))
    totals = steps[-1]["totals"]

    accepted = dom.find("tok-accepted")
    added = dom.find("tok-added")
    rejected = dom.find("tok-rejected")
    assert len(accepted) == sum(len(s["accepted_tokens"]) for s in steps) == totals["accepted"]
    assert len(added) == sum(len(s["tokens"]) - len(s["accepted_tokens"]) for s in steps)
    assert len(accepted) + len(added) == totals["new_tokens"] == len(trace["token_ids"])
    expected_rejected = sum(
        len(first_rejected_branch(s["proposed"]["parents"], s["accepted"], s["rejected"])) for s in steps
    )
    assert len(rejected) == expected_rejected
    if mode in ("draft_target", "prompt_lookup"):  # chains: every rejected draft token is shown
        assert len(rejected) == sum(len(s["rejected"]) for s in steps)

    # Committed tokens appear in output order, each inside its step.
    committed = [n for n in dom.iter() if {"tok-accepted", "tok-added"} & set(n.classes)]
    assert [int(n.attrs["data-tok"]) for n in committed] == trace["token_ids"]
    step_nodes = dom.find("step")
    assert [int(n.attrs["data-step"]) for n in step_nodes] == [s["step"] for s in steps]
    for node, step in zip(step_nodes, steps):
        assert f"Step {step['step']}" in node.attrs["title"]
        assert len(node.find("tok-accepted")) + len(node.find("tok-added")) == len(step["tokens"])

    kinds = {k: len(dom.find(f"tok-{k}")) for k in ("next", "correction", "bonus")}
    for k, count in kinds.items():
        assert count == sum(1 for s in steps if s["added_kind"] == k and len(s["tokens"]) > len(s["accepted_tokens"]))

    legend = dom.find("legend")
    assert len(legend) == 1
    assert not [n for n in legend[0].iter() if any(c.startswith("tok-") for c in n.classes)]
    # The look is the page's (web.launch gives render.CSS once), not repeated in every fragment.
    assert "<style>" not in render.step_view(steps, trace["texts"]) and "body .specdec .tok-accepted" in render.CSS
    assert dom.find("sd-finish")[0].text().endswith(steps[-1]["finish_reason"])


def test_step_view_accepts_int_and_str_text_keys():
    trace = load("prompt_lookup")
    as_str = render.step_view(trace["steps"], trace["texts"])
    as_int = render.step_view(trace["steps"], {int(k): v for k, v in trace["texts"].items()})
    assert as_str == as_int
    assert " cat" in parse(as_str).text()


def test_newlines_are_visible():
    steps = [_event(0, [], [], [], 10, "next", kind="prefill"), _event(1, [], [], [], 11, "next")]
    dom = parse(render.step_view(steps, {10: "a\nb", 11: "\t"}))
    text = dom.text()
    assert "a↵b" in text and "⇥" in text
    assert dom.find(tag="br"), "a newline must also break the line"


def test_a_rejected_newline_is_shown_but_does_not_break_the_line():
    steps = [_event(0, [], [], [], 10, "next", kind="prefill"), _event(1, [12, 12], [-1, 0], [], 11, "correction")]
    html = render.step_view(steps, {10: "a", 11: "b", 12: "\n"})
    assert html.count("↵") == 2 and "<br>" not in html


# ----------------------------------------------------------------------------- escaping

NASTY = {
    5: "<script>alert(1)</script>",
    6: '" onmouseover="alert(1)',
    7: "${alert(1)}",
    8: "{{x}}",
    9: "`tick`",
    10: "<img src=x onerror=alert(1)>",
}


def _assert_safe(html_text):
    lowered = html_text.lower()
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert "${" not in html_text and "{{" not in html_text and "`" not in html_text
    dom = parse(html_text)
    for node in dom.iter():
        assert not any(name.startswith("on") for name in node.attrs), (node.tag, node.attrs)
    return dom


def _event(step, tokens, parents, accepted, added, added_kind, *, rejected=None, source=None, kind="decode"):
    accepted_tokens = [tokens[i] for i in accepted]
    committed = accepted_tokens + ([added] if added is not None else [])
    return {
        "step": step, "kind": kind, "proposed": {"tokens": tokens, "parents": parents},
        "accepted": accepted,
        "rejected": rejected if rejected is not None else [i for i in range(len(tokens)) if i not in accepted],
        "accepted_tokens": accepted_tokens, "added_token": added, "added_kind": added_kind,
        "tokens": committed, "source": source or {}, "draft_time_s": 0.001, "verify_time_s": 0.04,
        "totals": {"new_tokens": step + 1, "target_steps": step + 1, "drafted": 0, "accepted": 0,
                   "draft_time_s": 0.0, "verify_time_s": 0.0, "elapsed_s": 0.05 * (step + 1), "tokens_per_step": 1.0},
        "finish_reason": None,
    }


def _nasty_event(source):
    return _event(1, [5, 6, 7, 8], [-1, 0, 1, 2], [0, 1], 9, "correction", source=source)


def test_step_view_escapes_token_text():
    events = [_nasty_event({}), _event(2, [], [], [], 10, "next")]
    dom = _assert_safe(render.step_view(events, NASTY))
    text = dom.text()
    for piece in (NASTY[5], NASTY[6], NASTY[7], NASTY[9]):
        assert piece in text, "escaped text must still read as the original"
    titles = " ".join(n.attrs.get("title", "") for n in dom.find("step"))
    assert NASTY[9] in titles  # the added token is named in the tooltip, as text


@pytest.mark.parametrize("source", [
    {"draft_probs": [0.5, 0.25, 0.125, 0.1]},
    {"candidates": [[5, 6, 7, 8], [5, 8]], "window": [[5, 6, 7], [8, 9, 10, 5]]},
    {"tree": {"paths": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "scores": [0.9, 0.8, 0.1, 0.1]}, "heads": 4},
    {"match": {"ngram": [7], "position": 2, "in_prompt": True, "continuation_position": 3},
     "matches": [{"ngram": [7], "position": 2, "in_prompt": True, "continuation_position": 3}]},
])
def test_step_detail_escapes_token_text(source):
    event = _nasty_event(source)
    html_text = render.step_detail(event, NASTY, [5, 6, 7, 8, 9, 10], [7])
    dom = _assert_safe(html_text)
    assert NASTY[5] in dom.text()


def test_tree_svg_escapes_token_text():
    html_text = render.tree_svg([5, 6, 7, 8, 9, 10], [-1, -1, 0, 0, 1, 2], [0, 2], NASTY, q=[0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
    dom = _assert_safe(html_text)
    titles = " ".join(n.text() for n in dom.find(tag="title"))
    assert NASTY[5] in titles and NASTY[6] in titles


def test_summary_table_escapes_mode_names():
    rows = [{"mode": NASTY[5], "tokens_per_s": 1.0, "speedup": 1.0, "tau": 1.0, "acceptance_rate": 0.5,
             "identical": None, "new_tokens": 3, "elapsed_s": 3.0},
            {"mode": NASTY[6], "tokens_per_s": 2.0, "speedup": 2.0, "tau": 2.0, "acceptance_rate": None,
             "identical": True, "new_tokens": 3, "elapsed_s": 1.5}]
    dom = _assert_safe(render.summary_table(rows))
    assert NASTY[5] in dom.text()


# ----------------------------------------------------------------------------- empty, one step, huge


def test_empty_inputs_give_friendly_states():
    for html_text in (render.step_view([], {}), render.step_view(None, None)):
        dom = parse(html_text)
        assert dom.find("sd-empty") and dom.find("legend") and not dom.find("step")
    assert parse(render.step_detail(None, {}, [], [])).find("sd-empty")
    assert parse(render.step_detail({}, {}, None, None)).find("sd-empty")
    assert "tree-empty" in render.tree_svg([], [], [], {})
    assert parse(render.summary_table([])).find("sd-empty")
    assert render.totals_line(None) and render.totals_line({})


def test_one_step_trace_prefill_only():
    trace = load("medusa")
    prefill = trace["steps"][:1]
    dom = parse(render.step_view(prefill, trace["texts"]))
    assert len(dom.find("step")) == 1
    assert len(dom.find("tok-added")) == 1 and len(dom.find("tok-next")) == 1
    assert not dom.find("tok-accepted") and not dom.find("tok-rejected")
    detail = parse(render.step_detail(prefill[0], trace["texts"], trace["prompt_ids"], []))
    assert "prefill" in detail.text().lower()
    assert "1 tokens" in render.totals_line(prefill[0])


def test_stream_messages_other_than_steps_are_ignored():
    trace = load("lookahead")
    stream = [{"type": "start", "prompt_ids": trace["prompt_ids"]}] + [{"type": "step", **s} for s in trace["steps"]]
    stream.append({"type": "end", "finish_reason": "eos", "text": trace["text"]})
    assert render.step_view(stream, trace["texts"]) == render.step_view(trace["steps"], trace["texts"])


def test_two_thousand_steps():
    texts = {i: f"w{i}" for i in range(50)}
    events = []
    for step in range(2000):
        if step % 3 == 0:
            events.append(_event(step, [1, 2, 3, 4], [-1, 0, 1, 2], [0, 1, 2, 3], 5, "bonus"))
        else:
            events.append(_event(step, [6, 7, 8], [-1, 0, 1], [0], 9, "correction"))
    html_text = render.step_view(events, texts)
    assert len(html_text) < 2000 * 1500
    dom = parse(html_text)
    assert len(dom.find("step")) == 2000
    assert len(dom.find("tok-added")) == 2000
    assert len(dom.find("tok-bonus")) == 667
    assert len(dom.find("tok-accepted")) == 667 * 4 + 1333
    assert len(dom.find("tok-rejected")) == 1333 * 2


# ----------------------------------------------------------------------------- step detail per mode


def _with_history(trace):
    history = []
    for step in trace["steps"]:
        yield step, list(history)
        history += step["tokens"]


@pytest.mark.parametrize("mode", MODES)
def test_every_step_of_every_modes_recording_gets_a_detail(mode):
    """What the browser's Inspect step shows, for each step of each mode's recorded run: a heading naming the step
    and the narration, never the empty placeholder (the browser tests drive a live run of only some modes)."""
    trace = load(mode)
    for step, history in _with_history(trace):
        dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
        assert not dom.find("sd-empty") and dom.find("sd-narration"), (mode, step["step"])
        assert dom.find(tag="h4")[0].text().startswith(f"Step {step['step']} "), (mode, step["step"])


def test_prompt_lookup_highlights_exactly_the_matched_ngram():
    trace = load("prompt_lookup")
    checked = 0
    for step, history in _with_history(trace):
        match = step["source"].get("match")
        dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
        if not match:
            assert not dom.find("ctx-ngram")
            continue
        context = trace["prompt_ids"] + history
        n, pos = len(match["ngram"]), match["position"]
        assert context[pos : pos + n] == match["ngram"]  # the fixture itself
        ngram = dom.find("ctx-ngram")
        assert [int(x.attrs["data-pos"]) for x in ngram] == list(range(pos, pos + n))
        assert [int(x.attrs["data-tok"]) for x in ngram] == match["ngram"]
        cont = dom.find("ctx-cont")
        draft = step["proposed"]["tokens"]
        assert [int(x.attrs["data-tok"]) for x in cont] == draft
        assert [int(x.attrs["data-pos"]) for x in cont] == list(range(match["continuation_position"],
                                                                      match["continuation_position"] + len(draft)))
        shown = dom.find("ctx")
        assert 0 < len(shown) <= 40 < len(context), "a window around the match, not the whole prompt"
        checked += 1
    assert checked >= 3


def test_prompt_lookup_highlight_follows_the_match_position():
    trace = load("prompt_lookup")
    step, history = [(s, h) for s, h in _with_history(trace) if s["source"].get("match")][0]
    moved = json.loads(json.dumps(step))
    context = trace["prompt_ids"] + history
    ngram = moved["source"]["match"]["ngram"]
    others = [i for i in range(len(context) - len(ngram)) if context[i : i + len(ngram)] == ngram]
    assert len(others) >= 2, "the fixture's n-gram occurs more than once"
    new_pos = others[-1]
    moved["source"]["match"].update(position=new_pos, continuation_position=new_pos + len(ngram))
    dom = parse(render.step_detail(moved, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
    assert [int(x.attrs["data-pos"]) for x in dom.find("ctx-ngram")] == list(range(new_pos, new_pos + len(ngram)))


def test_lookahead_detail_shows_window_and_accepted_candidate():
    trace = load("lookahead")
    seen_accept = False
    for step, history in _with_history(trace):
        dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
        source = step["source"]
        if step["kind"] == "prefill":
            continue
        if source.get("window"):
            grid = dom.find("sd-grid")[0]
            body_rows = [r for r in grid.find(tag="tr")][1:]
            assert len(body_rows) == len(source["window"])
            grid_tokens = [int(t.attrs["data-tok"]) for t in grid.find("tok") if "tok-root" not in t.classes]
            assert grid_tokens == [t for row in source["window"] for t in row]
        cands = dom.find("cand")
        assert len(cands) == len(source["candidates"])
        winners = dom.find("cand-accepted")
        if step["accepted_tokens"]:
            seen_accept = True
            assert len(winners) == 1
            toks = [int(t.attrs["data-tok"]) for t in winners[0].find("tok-accepted")]
            assert toks == step["accepted_tokens"]
    assert seen_accept


def test_draft_target_detail_shows_probabilities():
    trace = load("draft_target")
    step, history = [(s, h) for s, h in _with_history(trace) if s["kind"] == "decode"][0]
    dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
    table = dom.find("sd-probs")[0]
    assert len(table.find(tag="tr")) == 1 + len(step["proposed"]["tokens"])
    assert len(table.find("bar")) == len(step["source"]["draft_probs"])
    assert f"{step['source']['draft_probs'][0]:.3f}" in table.text()


def _viewed_event(distribution="softmax", source=None):
    """A tree step: nodes 0 and 1 hang off the root, 2 off 0, 3 off 2; node 0 accepted, 2 rejected,
    so the target decided at the root and at node 0, and never weighed node 3."""
    event = _event(1, [5, 6, 7, 8], [-1, -1, 0, 2], [0], 9, "correction", source=source)
    event["target"] = {"distribution": distribution,
                       "decided": [{"after": -1, "top": 5, "top_p": 0.6}, {"after": 0, "top": 9, "top_p": 0.5}],
                       "p": [0.6, 0.2, 0.00001, None], "added_p": 0.5}
    return event


def test_step_detail_shows_what_the_target_made_of_the_draft():
    dom = _assert_safe(render.step_detail(_viewed_event(), NASTY, [10, 10], []))
    table = dom.find("sd-target-table")[0]
    rows = table.find(tag="tr")[1:]
    assert len(rows) == 2  # the root and the accepted node
    first, second = rows
    assert [[t.attrs["data-tok"] for t in w.find("tok")] for w in first.find("weighed")] == [["5"], ["6"]]
    assert "tok-accepted" in first.find("weighed")[0].find("tok")[0].classes
    assert "tok-rejected" in first.find("weighed")[1].find("tok")[0].classes
    assert "0.600" in first.text() and "0.200" in first.text()
    assert [w.find("tok")[0].attrs["data-tok"] for w in second.find("weighed")] == ["7"]
    assert "<0.001" in second.text()  # tiny but not zero
    assert NASTY[9] in second.text()  # the target's top token there, which it added
    detail = dom.find("sd-target")[0].text()
    assert "Added" in detail and "0.500" in detail and "near miss" in detail
    titles = {n.attrs["data-node"]: n.find(tag="title")[0].text() for n in dom.find("node", tag="g")}
    assert "target p 0.600" in titles["0"] and "not weighed" in titles["3"]


def test_target_view_explains_the_sampling_rules():
    leviathan = _event(1, [5, 6], [-1, 0], [], 7, "correction", source={"draft_probs": [0.6, 0.5]})
    leviathan["target"] = {"distribution": "sampling", "decided": [{"after": -1, "top": 7, "top_p": 0.4}],
                           "p": [0.3, None], "added_p": 0.25}
    text = parse(render.step_detail(leviathan, NASTY, [10], [])).find("sd-target")[0].text()
    assert "q 0.600, min(1, p/q) = 0.500" in text and "max(0, p − q)" in text
    leviathan["target"]["p"] = [0.0, None]  # a token top-k cut from the target's distribution
    text = parse(render.step_detail(leviathan, NASTY, [10], [])).find("sd-target")[0].text()
    assert re.search(r"min\(1, p/q\) = 0(?![.\d])", text) and "0.000" not in text  # exactly 0, not a rounded 0.000
    tree = parse(render.step_detail(_viewed_event("sampling"), NASTY, [10], [])).find("sd-target")[0].text()
    assert "recursive rejection" in tree and "min(1, p/q)" not in tree
    typical = parse(render.step_detail(_viewed_event("sampling", {"acceptance": "typical", "heads": 3}), NASTY, [10], []))
    assert "not lossless" in typical.find("sd-target")[0].text()


def test_steps_without_a_target_view_render_as_before():
    event = _viewed_event()
    del event["target"]
    dom = parse(render.step_detail(event, NASTY, [10], []))
    assert not dom.find("sd-target")
    assert all("target p" not in t.text() for t in dom.find(tag="title"))


@pytest.mark.parametrize("mode", ["medusa", "eagle"])
def test_tree_modes_detail_draws_the_tree(mode):
    trace = load(mode)
    for step, history in _with_history(trace):
        dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
        if step["kind"] == "prefill":
            assert not dom.find("node")
            continue
        nodes = dom.find("node", tag="g")
        assert len(nodes) == len(step["proposed"]["tokens"])
        assert sorted(int(n.attrs["data-node"]) for n in nodes if "accepted" in n.classes) == step["accepted"]


# Medusa reports each head's probability; EAGLE the cumulative log q of each path: both trees show q, the draft's own
# probability per node (exp(-0.25) = 0.78, exp(-0.5 + 0.25) = 0.78, exp(-1.5 + 0.5) = 0.37).
@pytest.mark.parametrize("mode, scores", [("medusa", [0.78, 0.78, 0.37]), ("eagle", [-0.25, -0.5, -1.5])])
def test_a_tree_pruned_to_one_path_is_still_drawn_as_a_tree_with_its_scores(mode, scores):
    trace = load(mode)
    step, history = next((s, h) for s, h in _with_history(trace) if s["kind"] != "prefill")
    tokens = step["proposed"]["tokens"][:3]
    chain = {**step, "proposed": {"tokens": tokens, "parents": [-1, 0, 1]}, "accepted": [0], "rejected": [1, 2],
             "accepted_tokens": tokens[:1], "source": {**step["source"], "tree": {**step["source"]["tree"], "scores": scores}}}
    dom = parse(render.step_detail(chain, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
    nodes = dom.find("node", tag="g")
    assert [int(n.attrs["data-node"]) for n in nodes] == [0, 1, 2]
    assert [int(n.attrs["data-node"]) for n in nodes if "accepted" in n.classes] == [0]
    labels = [n.find(tag="tspan")[0].text().strip() for n in nodes]
    assert labels == ["q 0.78", "q 0.78", "q 0.37"], labels
    assert "its path's 0.22" in nodes[2].find(tag="title")[0].text()  # 0.78 × 0.78 × 0.37 (exp(-1.5)), in the tooltip
    # Other modes draw a chain as a row of tokens.
    pl = load("prompt_lookup")
    step, history = next((s, h) for s, h in _with_history(pl) if s["kind"] != "prefill" and s["proposed"]["tokens"])
    assert not parse(render.step_detail(step, pl["texts"], pl["prompt_ids"], history, "prompt_lookup")).find(tag="svg")


def test_draft_q_is_each_nodes_own_probability_whatever_the_drafter_reports():
    # Medusa: a head's probability per node, as it is (a number out of [0, 1] is no probability: unknown).
    assert render.draft_q([0.9, 0.5, None, 1.5], [-1, 0, 0, 1], "q") == [0.9, 0.5, None, None]
    # EAGLE: the cumulative log q of the path; q = exp(score - parent's score); a zero-probability path (-1e9) has q 0.
    q = render.draft_q([math.log(0.5), math.log(0.2), math.log(0.5 * 0.4), -1e9], [-1, -1, 0, 2], "path_log_q")
    assert q == pytest.approx([0.5, 0.2, 0.4, 0.0])
    # A merged tree's prompt lookup nodes come after the scored ones: no q; nor has a node under an unscored parent.
    assert render.draft_q([math.log(0.5)], [-1, 0, -1], "path_log_q") == [pytest.approx(0.5)]
    assert render.draft_q([None, math.log(0.3)], [-1, 0], "path_log_q") == [None, None]


@pytest.mark.parametrize("mode", ["medusa", "eagle"])
def test_medusa_and_eagle_trees_both_show_q_and_a_legend(mode):
    """Issue 59.7: EAGLE's tree showed log q and Medusa's probabilities, with no key to either or to the marks."""
    trace = load(mode)
    shown = 0
    for step, history in _with_history(trace):
        dom = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"]))
        nodes = dom.find("node", tag="g")
        if not nodes:
            continue
        tags = [t.text().strip() for n in nodes for t in n.find(tag="tspan")]
        assert tags and all(re.fullmatch(r"q (0\.\d\d|1\.00|<0\.01)", t) for t in tags), tags
        legend = dom.find("tree-legend")
        assert len(legend) == 1 and "accepted path" in legend[0].text() and "the draft's own probability" in legend[0].text()
        shown += 1
    assert shown


def test_tree_legend_keys_the_marks_the_tree_has():
    texts = {5: "a", 6: "b", 7: "c", 8: "d"}
    plain = parse(render.tree_svg([5, 6], [-1, 0], [0], texts))
    key = plain.find("tree-legend")[0].text()
    assert "accepted path" in key and "not accepted" in key
    assert "q 0.83" not in key and "PL" not in key and "not weighed" not in key
    # With the target's p (node 3 hangs below the rejected node 2: never weighed), q and prompt lookup's nodes.
    event = _viewed_event()
    dom = parse(render.tree_svg([5, 6, 7, 8], [-1, -1, 0, 2], [0], texts, q=[0.6, 0.3, 0.5, 0.9],
                                target_p=event["target"]["p"], copied=[1]))
    key = dom.find("tree-legend")[0].text()
    assert "rejected" in key and "not weighed" in key and "q 0.83" in key and "PL" in key
    looks = {int(n.attrs["data-node"]): n.classes for n in dom.find("node", tag="g")}
    assert "unweighed" in looks[3] and "unweighed" not in looks[2] and "accepted" in looks[0]
    assert [s.classes[-1] for s in dom.find("lg-node")] == ["lg-node-accepted", "lg-node-rejected", "lg-node-unweighed"]
    assert all(f"body .specdec .tree-legend .{c}" in render.CSS for c in ("lg-node-accepted", "lg-node-unweighed"))


@pytest.mark.parametrize("mode", ["medusa", "eagle"])
def test_tree_detail_says_when_and_how_the_tree_was_pruned(mode):
    trace = load(mode)
    step, history = next((s, h) for s, h in _with_history(trace) if s["kind"] != "prefill")
    plain = parse(render.step_detail(step, trace["texts"], trace["prompt_ids"], history, trace["mode"])).text()
    assert "Pruned" not in plain
    pruned = {**step, "source": {**step["source"], "min_path_prob": 0.05}}
    text = parse(render.step_detail(pruned, trace["texts"], trace["prompt_ids"], history, trace["mode"])).text()
    assert "min_path_prob = 0.05" in text and "not verified" in text
    assert ("heads" if mode == "medusa" else "cumulative draft probability") in text.split("Pruned", 1)[1]


# ----------------------------------------------------------------------------- tree SVG


def _rects(dom):
    out = {}
    for g in dom.find("node", tag="g"):
        rect = g.find(tag="rect")[0]
        out[int(g.attrs["data-node"])] = tuple(float(rect.attrs[k]) for k in ("x", "y", "width", "height"))
    return out


@pytest.mark.parametrize("mode", ["medusa", "eagle", "lookahead"])
def test_tree_svg_one_node_per_token_and_accepted_path(mode):
    trace = load(mode)
    for step in trace["steps"]:
        tokens, parents = step["proposed"]["tokens"], step["proposed"]["parents"]
        if not tokens:
            continue
        dom = parse(render.tree_svg(tokens, parents, step["accepted"], trace["texts"]))
        nodes = dom.find("node", tag="g")
        assert len(nodes) == len(tokens)
        assert [int(n.attrs["data-node"]) for n in nodes] == list(range(len(tokens)))
        marked = [int(n.attrs["data-node"]) for n in nodes if "accepted" in n.classes]
        assert marked == step["accepted"]
        assert all("✓" in n.text() for n in nodes if "accepted" in n.classes)
        assert len([e for e in dom.find("edge") if "accepted" in e.classes]) == len(step["accepted"])
        assert len(dom.find("edge")) == len(tokens)
        assert len(dom.find("root")) == 1


def test_tree_svg_nodes_do_not_overlap_at_64():
    # A Medusa-like tree: 8 children of the root, each with a chain and side branches.
    parents = []
    for i in range(64):
        parents.append(-1 if i < 8 else (i - 8 if i < 40 else i - 32))
    tokens = list(range(64))
    html_text = render.tree_svg(tokens, parents, [0, 8, 16], {i: f"tok{i}" for i in range(64)},
                                q=[0.5] * 64)
    dom = parse(html_text)
    rects = _rects(dom)
    assert len(rects) == 64 and not dom.find("tree-note")
    boxes = list(rects.values())
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap_x = a[0] < b[0] + b[2] and b[0] < a[0] + a[2]
            overlap_y = a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
            assert not (overlap_x and overlap_y)
    assert all(float(t.attrs.get("font-size", 13)) >= 12 for t in dom.find(tag="text")), "legible labels"


def test_tree_svg_truncates_large_trees_but_keeps_the_accepted_path():
    n = 150
    parents = [-1] + [i - 1 if i % 5 else -1 for i in range(1, n)]
    path = [145, 146, 147, 148, 149]  # a chain hanging off the root near the end
    assert parents[145] == -1 and all(parents[i] == i - 1 for i in path[1:])
    dom = parse(render.tree_svg(list(range(n)), parents, path, {}))
    nodes = dom.find("node", tag="g")
    assert len(nodes) == render.MAX_TREE_NODES
    assert [int(g.attrs["data-node"]) for g in nodes if "accepted" in g.classes] == path
    assert "150" in dom.find("tree-note")[0].text()


# ----------------------------------------------------------------------------- table, status line, learn


def test_summary_table_marks_identical_and_best():
    rows = [
        {"mode": "autoregressive", "tokens_per_s": 10.0, "speedup": 1.0, "tau": 1.0, "acceptance_rate": None,
         "identical": None, "new_tokens": 40, "elapsed_s": 4.0},
        {"mode": "prompt_lookup", "tokens_per_s": 18.0, "speedup": 1.8, "tau": 2.1, "acceptance_rate": 0.42,
         "identical": True, "new_tokens": 40, "elapsed_s": 2.2},
        {"mode": "medusa", "tokens_per_s": 8.0, "speedup": 0.8, "tau": 1.3, "acceptance_rate": 0.1,
         "identical": False, "new_tokens": 40, "elapsed_s": 5.0},
    ]
    dom = parse(render.summary_table(rows))
    body = dom.find(tag="tr")[1:]
    assert [r.attrs["data-mode"] for r in body] == ["autoregressive", "prompt_lookup", "medusa"]
    assert len(dom.find("identical-yes")) == 1 and len(dom.find("identical-no")) == 1
    assert dom.find("identical-yes")[0].text() == "✓" and dom.find("identical-no")[0].text() == "✗"
    best = [r for r in body if "best" in r.classes]
    assert [r.attrs["data-mode"] for r in best] == ["prompt_lookup"]
    assert "Prompt lookup" in best[0].text() and "1.80×" in best[0].text() and "42%" in best[0].text()
    assert "step time (× AR)" in dom.find(tag="tr")[0].text()
    with_cost = parse(render.summary_table([{**rows[1], "step_cost": 1.17}]))
    assert "1.17" in with_cost.find(tag="tr")[1].text()
    # Every mode slower than autoregressive: none is starred as the best.
    slower = parse(render.summary_table([rows[0], rows[2], {**rows[1], "speedup": 0.9}]))
    assert not [r for r in slower.find(tag="tr") if "best" in r.classes] and "★" not in slower.text()


def _timed(kind, tokens, elapsed, draft=0.0, verify=0.0):
    return {"kind": kind, "tokens": tokens, "draft_time_s": draft, "verify_time_s": verify,
            "totals": {"elapsed_s": elapsed, "new_tokens": None}}


def _run(prefill_s, steps):
    """A prefill then decode steps of (tokens, seconds, draft seconds, verify seconds), totals running."""
    events, elapsed, new = [_timed("prefill", [1], prefill_s, verify=prefill_s)], prefill_s, 1
    events[0]["totals"]["new_tokens"] = 1
    for n, seconds, draft, verify in steps:
        elapsed, new = elapsed + seconds, new + n
        events.append(_timed("decode", list(range(n)), elapsed, draft, verify))
        events[-1]["totals"]["new_tokens"] = new
    return events


def test_speedup_parts_split_the_decoding_speedup_into_tau_and_step_cost():
    base = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8)  # autoregressive: 0.1 s a token
    # 4 steps of 2 tokens at 0.125 s (a step costs 1.25 autoregressive steps: verify 1.0, draft 0.2, loop 0.05).
    run = _run(0.5, [(2, 0.125, 0.02, 0.1)] * 4)
    parts = traces.speedup_parts(run, base)
    assert parts["tau"] == 2.0 and parts["step_cost"] == pytest.approx(1.25)
    assert parts["verify"] == pytest.approx(1.0) and parts["draft"] == pytest.approx(0.2)
    assert parts["loop"] == pytest.approx(0.05)
    assert parts["decoding"] == pytest.approx(2.0 / 1.25)
    # Same 9 tokens; 1.0 s against 1.3 s in all, prefill included.
    assert parts["overall"] == pytest.approx(1.3 / 1.0)
    line = render.speedup_line(run, base)
    assert line == ("**1.30×** the autoregressive run's tokens/s · after the prefill 1.60× (95 % of the step times' spread: "
                    "1.60–1.60×) = τ 2.00 ÷ a step costing 1.25 autoregressive steps (verify 1.00 + draft 0.20 + loop 0.05)")


def test_speedup_parts_need_decoding_steps_and_usable_times():
    base = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 3)
    assert traces.speedup_parts(_run(0.5, []), base) is None  # one token from the prefill alone
    assert traces.speedup_parts(base, _run(0.5, [])) is None
    broken = _run(0.5, [(2, 0.1, 0.0, 0.1)])
    broken[1]["verify_time_s"] = "soon"  # an uploaded trace may carry anything
    # τ and the step's cost come from the clock alone; the split into verify and draft needs every step's times.
    parts = traces.speedup_parts(broken, base)
    assert parts["tau"] == 2 and parts["verify"] is parts["draft"] is parts["loop"] is None
    assert "no draft and verify times" in render.speedup_line(broken, base)
    broken[1]["totals"]["elapsed_s"] = float("nan")
    assert traces.speedup_parts(broken, base) is None and render.speedup_line(broken, base) == ""
    assert traces.speedup_parts(None, None) is None


def test_a_baseline_timed_under_other_load_gives_no_ratio_only_the_reason():
    """The walk's case: the baseline ran while the machine was busy (an injected slow clock: 0.5 s a token where the
    quiet machine takes 0.1), the run after it on a quiet machine. The ratio alone would read 8×, with each step
    costing a quarter of the autoregressive step it contains; it is flagged instead, in the status and in Compare."""
    busy = _run(0.5, [(1, 0.5, 0.0, 0.5)] * 8)
    run = _run(0.5, [(2, 0.125, 0.02, 0.1)] * 4)
    parts = traces.speedup_parts(run, busy)
    assert parts["decoding"] == pytest.approx(2.0), "taken at τ, never the 8× the old status line printed"
    assert parts["doubt"] and "load changed" in parts["doubt"] and "0.25" in parts["doubt"]
    line = render.speedup_line(run, busy)
    assert "No speedup shown" in line and "8.00" not in line and "τ 2.00" in line
    recorded = {name: Recording(name) for name in ("prompt_lookup", "autoregressive")}
    recorded["prompt_lookup"].events, recorded["autoregressive"].events = run, busy
    row = compare_tab.summary_row("prompt_lookup", recorded["prompt_lookup"], recorded["autoregressive"], REGISTRY)
    assert row["speedup"] is None and "load changed" in row["doubt"] and row["step_doubt"] == row["doubt"]
    assert "load changed" in render.summary_table([row]) and row["decoding_speedup"] is None
    # Under the same load the same run is a result, with its interval.
    quiet = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8)
    assert traces.speedup_parts(run, quiet)["doubt"] is None
    assert "1.60×" in render.speedup_line(run, quiet)


def test_a_step_below_one_autoregressive_step_within_its_own_spread_is_taken_at_the_bound():
    """The issue-58 first click under a busy loop: a burst of load lands on a few of the baseline's steps and the mean
    step reads 0.85 of an autoregressive one. The steps' spread reaches past 1, so the reading is possible: shown at
    the bound (speedup τ) with its interval, not withheld. The same mean with steady steps has no such reach."""
    bursty = _run(0.5, [(1, 0.08, 0.0, 0.08)] * 12 + [(1, 0.4, 0.0, 0.4)] * 2)  # mean 0.126 s a token
    run = _run(0.5, [(2, 0.107, 0.01, 0.09)] * 7)  # 0.85 of that
    parts = traces.speedup_parts(run, bursty)
    assert parts["doubt"] is None and parts["step_cost"] == 1.0 and parts["decoding"] == 2.0
    low, high = parts["interval"]
    assert low < 1.5 and high == 2.0, parts["interval"]
    assert "(95 % of the step times' spread: " in render.speedup_line(run, bursty)
    steady = _run(0.5, [(1, 0.126, 0.0, 0.126)] * 14)
    refused = traces.speedup_parts(run, steady)
    assert refused["doubt"].startswith("a step took 0.85 of an autoregressive step (its spread reaching 0.85)")


def test_a_baseline_on_the_eager_pass_and_a_run_on_the_fast_pass_give_no_ratio():
    """The fast pass builds in the background and takes over when ready: a race whose baseline ran eagerly and whose
    run ran on it compares two passes, not two decodings. It says so (status, Compare, CLI) instead of a ratio."""
    base = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8)
    run = _run(0.5, [(2, 0.125, 0.02, 0.1)] * 4)
    switched = ("compiled pass, built in 240 s and loaded in 0.8 s", "eager pass while the fast pass builds (once per machine, minutes)")
    assert traces.speedup_parts(run, base)["doubt"] is None
    parts = traces.speedup_parts(run, base, switched)
    assert "the baseline ran on the eager pass and this run on the compiled pass" in parts["doubt"]
    line = render.speedup_line(run, base, switched)
    assert line.startswith("⚠ No speedup shown") and "1.60×" not in line and "run again to race both on it" in line
    assert traces.speedup_parts(run, base, (switched[0], switched[0]))["doubt"] is None  # one pass: a result
    assert traces.speedup_parts(run, base, ("eager pass (--eager)", None))["doubt"] is None  # a pass unknown: as before
    recorded = {name: Recording(name) for name in ("prompt_lookup", "autoregressive")}
    recorded["prompt_lookup"].events, recorded["autoregressive"].events = run, base
    recorded["prompt_lookup"].pass_note, recorded["autoregressive"].pass_note = switched
    row = compare_tab.summary_row("prompt_lookup", recorded["prompt_lookup"], recorded["autoregressive"], REGISTRY)
    assert row["speedup"] is None and "became ready in between" in row["doubt"]


def test_a_whole_run_ratio_above_tau_is_not_shown():
    """Equal prefills keep the whole run's ratio at most τ; a baseline whose prefill was the first, cold one (2 s
    against 0.5) would make the run read 2.80× at τ 2. That ratio is declined with the reason; the one after the
    prefill, which the cold pass does not touch, stays."""
    cold = _run(2.0, [(1, 0.1, 0.0, 0.1)] * 8)
    run = _run(0.5, [(2, 0.125, 0.02, 0.1)] * 4)
    parts = traces.speedup_parts(run, cold)
    assert "overall" not in parts and parts["doubt"] is None and parts["decoding"] == pytest.approx(1.6)
    assert "2.80× the autoregressive run's tokens/s is more than τ 2.00 allows" in parts["overall_doubt"]
    line = render.speedup_line(run, cold)
    assert line.startswith("⚠ the whole run's 2.80×") and "after the prefill 1.60×" in line and "**" not in line
    assert traces.speedup_parts(run, _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8))["overall_doubt"] is None
    recorded = {name: Recording(name) for name in ("prompt_lookup", "autoregressive")}
    recorded["prompt_lookup"].events, recorded["autoregressive"].events = run, cold
    row = compare_tab.summary_row("prompt_lookup", recorded["prompt_lookup"], recorded["autoregressive"], REGISTRY)
    assert row["speedup"] is None and "more than τ 2.00 allows" in row["doubt"]  # Compare's ratio is the whole run's
    assert row["step_doubt"] is None and row["decoding_speedup"] == pytest.approx(1.6)  # the step's figures stand
    assert ">1.60× after the prefill*</span>" in render.summary_table([row])
    assert f"* Prompt lookup: {render.esc(figures.withheld(row['doubt']))}" in render.summary_table([row])  # the rule's sentence


def test_the_interval_comes_from_the_spread_of_step_times():
    base = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8)
    steady = traces.speedup_parts(_run(0.5, [(2, 0.125, 0.02, 0.1)] * 4), base)
    assert steady["interval"] == pytest.approx((1.6, 1.6)), "no spread, no width"
    # Two slow steps among fast ones: the figure rests on them, and the interval says so.
    bumpy = traces.speedup_parts(_run(0.5, [(2, 0.1, 0.0, 0.1)] * 6 + [(2, 0.4, 0.0, 0.4)] * 2), base)
    low, high = bumpy["interval"]
    assert low < bumpy["decoding"] < high and high - low > 0.5
    assert bumpy["interval"] == traces.speedup_parts(_run(0.5, [(2, 0.1, 0.0, 0.1)] * 6 + [(2, 0.4, 0.0, 0.4)] * 2),
                                                     base)["interval"], "the same trace shows the same interval"
    assert f"{low:.2f}–{high:.2f}×" in render.speedup_line(_run(0.5, [(2, 0.1, 0.0, 0.1)] * 6 + [(2, 0.4, 0.0, 0.4)] * 2), base)
    assert traces.speedup_parts(_run(0.5, [(2, 0.1, 0.0, 0.1)]), base)["interval"] is None, "one step has no spread"


def test_no_printed_ratio_step_or_interval_is_beyond_what_tau_allows():
    """The issue's figures: "4.13× (1.53–11.16×) = τ 3.78 ÷ a step costing 0.92" and "verify 0.97" for a 6-token pass.
    A step within the noise under one autoregressive step is read as one (the ratio at τ, not above); further under,
    or a verify pass cheaper than the baseline's one-token pass, withholds the ratio; the interval stops at τ."""
    base = _run(0.5, [(1, 0.1, 0.0, 0.1)] * 8)
    near = traces.speedup_parts(_run(0.5, [(2, 0.098, 0.0, 0.098)] * 4), base)  # 0.98 of a step: the timer's noise
    assert near["doubt"] is None and near["step_cost"] == 1.0 and near["decoding"] == 2.0
    assert near["interval"][1] <= near["tau"]
    run, bumpy_base = (_run(0.5, [(2, 0.11, 0.0, 0.11)] * 6 + [(2, 0.3, 0.0, 0.3)] * 2),
                       _run(0.5, [(1, 0.1, 0.0, 0.1)] * 6 + [(1, 0.2, 0.0, 0.2)] * 2))
    assert traces.spread(traces.step_times(run), traces.step_times(bumpy_base))[1] > 2.5, "the spread alone reaches past τ"
    bumpy = traces.speedup_parts(run, bumpy_base)
    assert bumpy["interval"][1] == bumpy["tau"] == 2.0 and bumpy["decoding"] <= bumpy["tau"]
    assert re.findall(r"–([0-9.]+)×", render.speedup_line(run, bumpy_base)) == ["2.00"]
    # Steps of a whole autoregressive step, but their 6-token verify pass at 0.8 of the baseline's one-token pass.
    cheap_verify = traces.speedup_parts(_run(0.5, [(3, 0.1, 0.02, 0.08)] * 4), base)
    assert "verify pass took 0.80 of the baseline's one-token pass" in cheap_verify["doubt"]
    assert render.speedup_line(_run(0.5, [(3, 0.1, 0.02, 0.08)] * 4), base).startswith("⚠ No speedup shown")


@pytest.mark.parametrize("mode", MODES[1:])
def test_speedup_parts_of_real_traces_add_up(mode):
    run, base = load(mode)["steps"], load("autoregressive")["steps"]
    parts = traces.speedup_parts(run, base)
    assert parts["step_cost"] == pytest.approx(parts["verify"] + parts["draft"] + parts["loop"], abs=1e-9)
    assert parts["interval"][0] <= parts["decoding"] <= parts["interval"][1]
    assert parts["decoding"] == pytest.approx(parts["tau"] / parts["step_cost"])
    assert parts["tau"] >= 1.0


@pytest.mark.parametrize("mode", MODES)
def test_totals_line(mode):
    last = load(mode)["steps"][-1]
    line = render.totals_line(last)
    t = last["totals"]
    assert f"{t['new_tokens']} tokens" in line and f"{t['target_steps']} target passes" in line
    tau = traces.speedup_parts(load(mode)["steps"], load("autoregressive")["steps"])["tau"]
    assert f"τ {(t['new_tokens'] - 1) / (t['target_steps'] - 1):.2f} tokens/pass after the prefill" in line
    assert f"τ {tau:.2f} tokens/pass" in line, "the τ the speedup line divides by"
    assert "eos" in line and "<" not in line


def test_learn_texts():
    texts = {mode: lessons.explain(mode) for mode in REGISTRY.names}
    assert set(texts) == set(MODES) and all(text.startswith("### ") for text in texts.values())
    assert lessons.label("eagle") == "EAGLE" and lessons.label("draft_target") == "Draft-target"
    for mode, text in texts.items():
        assert len(text.split()) < 280, mode
        assert "lossless" in text.lower(), mode
    assert "NOT" in texts["medusa"] and "typical" in texts["medusa"].lower()
    for name in ("max_window_size", "max_ngram_size", "max_verification_set_size"):
        assert name in texts["lookahead"]
    for (w, n, g) in [(4, 3, 4), (4, 4, 4), (7, 7, 7), (1, 1, 0)]:
        budget = (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)
        assert re.search(rf"\b{budget} for\s+\({w}, {n}, {g}\)", texts["lookahead"]), (w, n, g, budget)
    assert "max_matching_ngram_size" in texts["prompt_lookup"]
    assert "medusa_choices" in texts["medusa"] and "speculative_model" in texts["eagle"]
    assert lessons.OVERVIEW.strip()


def test_backends_that_hide_the_draft():
    # TensorRT-LLM: only the committed tokens per iteration; a remote text stream: only text deltas.
    trt = {"type": "step", "step": 1, "kind": "decode", "proposed": {"tokens": [11, 12], "parents": [-1, 0]},
           "accepted": [0, 1], "rejected": [], "accepted_tokens": [11, 12], "added_token": 13, "added_kind": "next",
           "tokens": [11, 12, 13], "source": {"observed": "token stream", "not_visible": ["draft tree"]},
           "draft_time_s": None, "verify_time_s": None,
           "totals": {"new_tokens": 4, "target_steps": 2, "drafted": None, "accepted": 2, "elapsed_s": 0.5},
           "finish_reason": None}
    remote = {"type": "step", "step": 0, "kind": "decode", "proposed": {"tokens": [], "parents": []}, "accepted": [],
              "rejected": [], "accepted_tokens": [], "added_token": None, "added_kind": "next", "tokens": [],
              "text": "Hello <b>", "source": {"not_visible": ["draft tree"]}, "draft_time_s": None,
              "verify_time_s": None, "totals": {"target_steps": 1, "elapsed_s": 0.1}, "finish_reason": None}
    texts = {11: "a", 12: "b", 13: "c"}
    dom = parse(render.step_view([remote, trt], texts))
    assert "Hello <b>" in dom.text() and len(dom.find("tok-accepted")) == 2 and len(dom.find("tok-added")) == 1
    detail = parse(render.step_detail(trt, texts, [1, 2], [3]))
    assert "draft tree" in detail.text()
    assert "tokens/s" in render.totals_line(trt)


def test_summary_table_accepts_labels():
    dom = parse(render.summary_table([{"mode": "Prompt lookup", "speedup": 1.5, "identical": True}]))
    row = dom.find(tag="tr")[1]
    assert row.attrs["data-mode"] == "prompt_lookup" and "Prompt lookup" in row.text()


def test_an_engine_step_says_its_draft_is_unknown_not_that_nothing_was_drafted():
    """vLLM streams what a step committed, not what it drafted: the summary, the narration and the Draft section agree
    (the walk found "6 of its draft accepted" above "Nothing drafted this step")."""
    event = {"kind": "decode", "tokens": [5, 6, 7], "accepted_tokens": [5, 6], "added_kind": "engine",
             "proposed": {"tokens": [], "parents": []},
             "source": {"engine": "vllm", "not_visible": ["draft tree", "rejected draft tokens"]},
             "totals": {"elapsed_s": 1.0, "new_tokens": 4}}
    texts = {5: "a", 6: "b", 7: "c"}
    detail = render.step_detail(event, texts, [1, 2], [3], "prompt_lookup")
    assert "Nothing drafted" not in detail and "nothing was drafted" not in detail
    assert "2 token(s) were accepted" in detail and "unknown" in detail and "does not expose" in detail
    assert "2 of its draft accepted" in render.narrate(event, texts, "prompt_lookup")


def test_a_race_whose_runs_got_different_shares_of_the_cpu_says_the_load_changed():
    """Each run records the share of the CPU it asked for that it got (totals.cpu_share). A baseline at 90 % and a
    run at 40 % did not run under the same load: the ratio stays (it may still be right), with the shares beside it,
    in the status, in Compare's table and on the command line's line."""
    def shared(events, share):
        events[-1]["totals"]["cpu_share"] = share
        return events

    base = shared(_run(0.5, [(1, 0.1, 0.0, 0.1)] * 8), 0.9)
    run = shared(_run(0.5, [(2, 0.125, 0.02, 0.1)] * 4), 0.4)
    parts = traces.speedup_parts(run, base)
    assert parts["load"] == {"run": 0.4, "baseline": 0.9} and parts["doubt"] is None
    line = render.speedup_line(run, base)
    assert "1.60×" in line and "load changed: this run got 40% of the CPU it asked for, its baseline 90%" in line
    for share in (0.7, None, "x", 0, 1e308):  # within the factor, not recorded (an engine's run, an old trace), or not a share
        run[-1]["totals"]["cpu_share"] = share
        assert traces.speedup_parts(run, base)["load"] is None
        assert "load changed" not in render.speedup_line(run, base)
    run[-1]["totals"]["cpu_share"] = 0.4
    recorded = {name: Recording(name) for name in ("prompt_lookup", "autoregressive")}
    recorded["prompt_lookup"].events, recorded["autoregressive"].events = run, base
    row = compare_tab.summary_row("prompt_lookup", recorded["prompt_lookup"], recorded["autoregressive"], REGISTRY)
    cell = parse(render.summary_table([row])).find(tag="tr")[1].find(tag="td")[2]
    assert "1.30×" in cell.text() and "40%" in cell.find(tag="span")[0].attrs["title"]
