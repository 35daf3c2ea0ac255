"""Trace events -> Plotly figures for the web UI (pure: data in, a go.Figure out).

Every builder takes the step events a run streamed (dicts, see app.decoding.types.StepEvent) and
returns a figure 300 px high with large fonts (projectors), transparent backgrounds and mid-grey
text (light and dark pages), hex colours only (Gradio draws with plotly.js 3), plain Python lists
(plotly 6+ would base64-encode numpy arrays), and uirevision="keep" so zoom survives streaming.
With no steps, a builder returns an empty figure carrying an explanatory annotation.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from app.modes import MODES, Modes
from app import figures
from app.ui.lessons import earning_sizes, expected_speedup, left_out, unsteady
from app.traces import is_number, steps
from app.bench import load

HEIGHT = 300
LEGEND_ROOM, LEGEND_ROW = 140, 28  # px: a chart's title and axis, and one legend entry (a legend beside the plot)
_TEMPLATE = pio.templates["none"]  # the object: naming it makes plotly look it up and copy it per figure
FONT = "#777777"
GRID = "rgba(128,128,128,0.25)"
ACCEPTED, ADDED, DRAFT, VERIFY, TAU = "#56B4E9", "#E69F00", "#CC79A7", "#0072B2", "#D55E00"
EMPTY = "No steps yet: run a prompt."


def mode_key(name: str, modes: Modes = MODES) -> str:
    """A mode key from a key or its label ("Prompt lookup" -> "prompt_lookup"); unknown names pass through."""
    known = modes.names + modes.merged
    return name if name in known else {modes.label(k): k for k in known}.get(name, name)


def _name(mode: str, modes: Modes, fallback: str) -> str:
    return modes.label(mode) if mode in modes.names + modes.merged else fallback


def _colour(mode: str, modes: Modes) -> str:
    """The mode's colour (its entry's: Okabe-Ito, colour-blind safe); another run's the default blue."""
    return modes.colour(mode) or "#0072B2"


def _number(value: Any) -> float | None:
    return float(value) if is_number(value) else None


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str) -> go.Figure:
    """The shared look. Built as one layout dict in the constructor: plotly's update_layout with nested
    keys costs ~15 ms a figure, and the UI redraws while the model generates in the same process."""
    def axis(text: str) -> dict:
        # automargin: the margins grow to hold long tick labels and titles (11 modes' names) instead of clipping them
        return dict(title=dict(text=text, font=dict(size=15)), tickfont=dict(size=14), rangemode="tozero",
                    gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID, automargin=True)

    layout: dict[str, Any] = dict(
        template=_TEMPLATE,
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=18)),
        height=HEIGHT,
        margin=dict(l=64, r=16, t=48, b=52),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(size=15, color=FONT),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom", font=dict(size=14)),
        xaxis=axis(xtitle),
        yaxis=axis(ytitle),
        uirevision="keep",
        transition=dict(duration=0),
    )
    for key, value in fig.layout.to_plotly_json().items():  # what the caller set (barmode, dtick, ...) wins
        if key == "template":  # plotly's default template, filled in by go.Figure(): ours replaces it
            continue
        layout[key] = {**layout[key], **value} if isinstance(value, dict) and isinstance(layout.get(key), dict) else value
    return go.Figure(data=fig.data, layout=layout)


EMPTY_LINE = 32  # characters: an annotation does not wrap itself, and at 1280 px Compare's charts are ~400 px wide


def _wrap(message: str, width: int) -> list[str]:
    # Not at hyphens: "one-token" stays one word, and the lines joined by spaces read as the sentence they came from.
    return textwrap.wrap(message, width, break_on_hyphens=False)


def _empty(title: str, message: str = EMPTY) -> go.Figure:
    lines = _wrap(message, EMPTY_LINE)
    fig = go.Figure(layout=dict(
        xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text="<br>".join(lines), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font=dict(size=16))],
        height=max(HEIGHT, 100 + NOTE_ROW * len(lines)),  # each withheld mode's reason whole (_left_out)
    ))
    return _layout(fig, title, "", "")


NOTE_LINE, NOTE_ROW = 48, 20  # a note under a chart: characters a line at 13 px on ~400 px, px a line


def _left_out(rows: list[Mapping], key: str, modes: Modes) -> list[str]:
    """Each compared mode whose figure the rule withheld (its row's reason under `key`) in the sentence every surface
    prints (figures.withheld): a chart leaving a mode out says why itself, as the table does."""
    return [f"{_name(mode_key(str(r.get('mode', '')), modes), modes, str(r.get('mode', '')))}: "
            f"{figures.withheld(r[key])}" for r in rows if isinstance(r.get(key), str) and r[key]]


def _note_under(fig: go.Figure, said: list[str]) -> None:
    """`said` under the plot, the chart grown to hold it: over the plot it would hide the points it explains."""
    lines = [line for s in said for line in _wrap(s, NOTE_LINE)]
    if not lines:
        return
    room = NOTE_ROW * len(lines)
    fig.add_annotation(text="<br>".join(lines), x=0, y=0, xref="paper", yref="paper", xanchor="left", yanchor="top",
                       yshift=-56, align="left", showarrow=False, font=dict(color=FONT, size=13), name="left out")
    fig.update_layout(height=(fig.layout.height or HEIGHT) + room, margin=dict(b=52 + room + 8))


def _label(mode: str | None, label: str | None, modes: Modes) -> tuple[str, str]:
    """(trace name, colour) for a run of `mode`: the given label, else the mode's name."""
    return label or _name(mode or "", modes, "This run"), _colour(mode or "", modes)


def _cumulative(events: list[dict]) -> list[tuple[float | None, float]]:
    """(elapsed_s, new_tokens so far) after each step; totals when present, else counted."""
    points, count = [], 0.0
    for e in events:
        count += len(e.get("tokens") or [])
        totals = e.get("totals") or {}
        new = _number(totals.get("new_tokens"))
        points.append((_number(totals.get("elapsed_s")), new if new is not None else count))
    return points


# Line dashes and marker symbols for curves that must be told apart without colour (the baseline's dash is "dash").
_DASHES = ("solid", "dot", "dashdot", "longdash", "longdashdot", "5px,2px,1px,2px")
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star", "hexagon", "triangle-down", "pentagon",
            "hourglass", "star-square")


def _markers(n: int) -> str:
    return "lines+markers" if n <= 120 else "lines"


# ----------------------------------------------------------------------------- figures


def _cursor(fig: go.Figure, x: float | None, text: str) -> None:
    """A dotted vertical line at x: where the step inspected (or narrated) sits on this chart."""
    if x is not None:
        fig.add_vline(x=x, line=dict(color=FONT, width=2, dash="dot"), annotation_text=text,
                      annotation_position="top left", annotation_font=dict(color=FONT, size=13))


def race(events: list[dict], baseline: list | None = None, *, mode: str | None = None, label: str | None = None,
         baseline_label: str | None = None, cursor: int | None = None, modes: Modes = MODES) -> go.Figure:
    """Cumulative tokens against wall time for this run (of `mode`) and, when given, the autoregressive
    baseline on the same axes. `baseline`: a list of (elapsed_s, new_tokens) points or of step events.
    `cursor`: a step number to mark (the one inspected)."""
    title = "Race: tokens over time"
    events = steps(events)
    base: list[tuple[float | None, float]] = []
    base_name, base_color = baseline_label or "Autoregressive", _colour("autoregressive", modes)
    if baseline:
        if isinstance(baseline[0], Mapping):
            base_events = steps(baseline)
            base = _cumulative(base_events)
        else:
            base = [(_number(p[0]), _number(p[1]) or 0.0) for p in baseline if isinstance(p, (list, tuple)) and len(p) >= 2]
    if not events and not base:
        return _empty(title)
    fig = go.Figure()
    if base:
        fig.add_trace(go.Scatter(x=[p[0] for p in base], y=[p[1] for p in base], name=base_name,
                                 mode=_markers(len(base)), line=dict(color=base_color, width=3, dash="dash", shape="hv")))
    if events:
        name, color = _label(mode, label, modes)
        points = _cumulative(events)
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], name=name,
                                 mode=_markers(len(points)), line=dict(color=color, width=4, shape="hv")))
        at = [p[0] for e, p in zip(events, points) if e.get("step") == cursor]
        _cursor(fig, at[0] if at else None, f"step {cursor}")
    return _layout(fig, title, "wall time (s)", "tokens generated")


def race_runs(runs: Mapping[str, list[dict]], until: float | None = None, modes: Modes = MODES) -> go.Figure:
    """The Compare tab's race: cumulative tokens against wall time for several runs of one prompt
    on shared axes. `runs` maps a mode (key or label) to its step events; the baseline is dashed.
    `until`: the race as it stood that many seconds in (each run's steps done by then), on the axes
    of the whole race, so a replay's curves grow while its frame stays still."""
    title = "Race: tokens over time"
    curves = [(name, steps(events)) for name, events in (runs or {}).items()]
    curves = [(name, events) for name, events in curves if events]
    if not curves:
        return _empty(title, "No runs yet: compare runs one prompt through each mode in turn.")
    fig = go.Figure()
    ends = [0.0, 0.0]
    others = 0  # the curves drawn so far other than the baseline
    for i, (name, events) in enumerate(curves):
        mode = mode_key(str(name), modes)
        points = _cumulative(events)
        timed = [p for p in points if p[0] is not None]
        ends = [max([ends[0]] + [p[0] for p in timed]), max([ends[1]] + [p[1] for p in timed])]
        if until is not None:
            points = [p for p in timed if p[0] <= until]
        baseline = mode == "autoregressive"
        # Told apart without colour too: each line its own dash and marker (at most 24 markers drawn on a line).
        fig.add_trace(go.Scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], name=_name(mode, modes, str(name)),
            mode="lines+markers",
            line=dict(color=_colour(mode, modes), width=3, dash="dash" if baseline else _DASHES[others % len(_DASHES)],
                      shape="hv"),
            marker=dict(symbol=_SYMBOLS[i % len(_SYMBOLS)], size=7, maxdisplayed=24),
        ))
        others += not baseline
    fig = _layout(fig, title, "wall time (s)", "tokens generated")
    if len(curves) > 3:  # a legend of many runs above the plot squeezed it, or covered it: a column beside it instead
        fig.update_layout(legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
                          height=max(HEIGHT, LEGEND_ROOM + LEGEND_ROW * len(curves)))  # every name shown, unscrolled
    if until is not None:
        fig.update_xaxes(range=[0, ends[0] * 1.03 or 1])
        fig.update_yaxes(range=[0, ends[1] * 1.05 or 1])
    return fig


def tokens_per_step(events: list[dict], cursor: int | None = None) -> go.Figure:
    """Tokens committed by each target pass (accepted drafts + the target's own token, stacked)
    and the running mean τ after the prefill (the status's and the speedup's τ); `cursor`: a step number to mark."""
    title = "Tokens per target pass"
    events = steps(events)
    if not events:
        return _empty(title)
    x = [e.get("step", i) for i, e in enumerate(events)]
    committed = [len(e.get("tokens") or []) for e in events]
    accepted = [min(len(e.get("accepted_tokens") or []), c) for e, c in zip(events, committed)]
    added = [c - a for c, a in zip(committed, accepted)]
    # The prefill's pass commits one token whatever the mode: the mean starts after it, as the status's τ does.
    decode = [(step, c) for step, c, e in zip(x, committed, events) if e.get("kind") != "prefill"]
    tau, total = [], 0
    for i, (_, c) in enumerate(decode):
        total += c
        tau.append(total / (i + 1))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=accepted, name="accepted draft", marker=dict(color=ACCEPTED)))
    fig.add_trace(go.Bar(x=x, y=added, name="target's token", marker=dict(color=ADDED, pattern=dict(shape="/"))))
    if tau:
        fig.add_trace(go.Scatter(x=[step for step, _ in decode], y=tau, name=f"τ after the prefill = {tau[-1]:.2f}",
                                 mode="lines", line=dict(color=TAU, width=3)))
    fig.update_layout(barmode="stack", bargap=0.15)
    _cursor(fig, cursor if cursor in x else None, f"step {cursor}")
    return _layout(fig, title, "step", "tokens")


def tokens_per_step_hist(events: list[dict]) -> go.Figure:
    """How often a decoding pass (after the prefill, whose pass commits one token whatever the mode) committed 1, 2,
    3… tokens; τ as the status gives it."""
    title = "Passes by tokens"  # short: this chart shares a row with two others
    events = [e for e in steps(events) if e.get("kind") != "prefill"]
    if not events:
        return _empty(title, "No decoding pass yet: the prefill's pass commits one token in every mode.")
    counts = [len(e.get("tokens") or []) for e in events]
    tau = sum(counts) / len(counts)
    fig = go.Figure(go.Histogram(x=counts, xbins=dict(start=-0.5, end=max(counts) + 0.5, size=1),
                                 marker=dict(color=ACCEPTED, line=dict(color=VERIFY, width=1)), name="passes"))
    fig.update_layout(showlegend=False, bargap=0.1)
    fig.update_xaxes(dtick=1)
    return _layout(fig, title, f"tokens per pass (τ = {tau:.2f})", "target passes")


def acceptance_counts(events: list[dict]) -> tuple[list[int], list[int]]:
    """(offered, accepted) per draft depth d = 1, 2, …: how many steps had a draft token at depth d
    hanging off their accepted path (the root for d = 1), and in how many of them the path went on
    through depth d. accepted[d]/offered[d] is α_d, the chance a draft survives its d-th token once it
    survived d − 1 (the per-position acceptance rate of the Medusa and EAGLE papers). Steps cut short
    by EOS or the token budget are left out: their acceptance was not decided by the target."""
    offered: list[int] = []
    accepted: list[int] = []
    for e in steps(events):
        if e.get("kind") == "prefill" or e.get("added_token") is None:
            continue
        parents = list((e.get("proposed") or {}).get("parents") or [])
        path = [a for a in (e.get("accepted") or []) if isinstance(a, int)]
        has_children = {p for p in parents if isinstance(p, int)}
        for d, node in enumerate([-1, *path], start=1):
            if node not in has_children:
                break
            while len(offered) < d:
                offered.append(0)
                accepted.append(0)
            offered[d - 1] += 1
            accepted[d - 1] += d <= len(path)
    return offered, accepted


def acceptance_by_depth(events: list[dict], spec_decode: Mapping | None = None) -> go.Figure:
    """α_d per draft depth: where along a draft the target stops agreeing (acceptance_counts), or, for an engine
    that does not show its drafts (vLLM), from its own counters: drafts reaching depth d = those accepted at d − 1."""
    title = "Acceptance by draft depth"
    events = steps(events)
    if not events:
        return _empty(title)
    offered, accepted = acceptance_counts(events)
    if not offered and isinstance(spec_decode, Mapping) and spec_decode.get("num_drafts"):
        title = "Acceptance by position (engine's counters)"  # short: the full phrase was cut at the chart's width
        accepted = [int(x) for x in spec_decode.get("accepted_per_pos") or []]
        offered = [int(spec_decode["num_drafts"])] + accepted[:-1]
        # A draft shorter than d never reaches d: this reads a little low where drafts vary in length (ngram).
        accepted, offered = zip(*[(a, n) for a, n in zip(accepted, offered) if n]) if any(offered) else ((), ())
    if not offered:
        return _empty(title, "Nothing drafted: one target pass per token.")
    depth = list(range(1, len(offered) + 1))
    rate = [a / n for a, n in zip(accepted, offered)]
    fig = go.Figure(go.Bar(
        x=depth, y=rate, text=[f"{a}/{n}" for a, n in zip(accepted, offered)], textposition="outside",
        marker=dict(color=ACCEPTED, line=dict(color=VERIFY, width=1)), name="accepted",
        hovertemplate="depth %{x}: %{text} accepted (%{y:.0%})<extra></extra>",
    ))
    fig.update_layout(showlegend=False, bargap=0.2)
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%")
    return _layout(fig, title, "draft depth (1 = first token)", "accepted, if reached")


def throughput(events: list[dict], *, mode: str | None = None, label: str | None = None, modes: Modes = MODES) -> go.Figure:
    """Running tokens per second: tokens so far / wall time so far, after each step."""
    title = "Throughput"
    events = steps(events)
    if not events:
        return _empty(title)
    points = _cumulative(events)
    rate = [n / t if t else None for t, n in points]
    name, color = _label(mode, label, modes)
    fig = go.Figure(go.Scatter(x=[p[0] for p in points], y=rate, name=name, mode=_markers(len(points)),
                               line=dict(color=color, width=3)))
    fig.update_layout(showlegend=False)
    return _layout(fig, title, "wall time (s)", "tokens/s (running)")


def timing(events: list[dict]) -> go.Figure:
    """Draft time and verify (target pass) time per step, stacked, in milliseconds. The prefill is
    named in a note instead of drawn: over a long prompt it costs tens of decoding steps, and its
    bar would flatten every other one."""
    title = "Time per step: draft vs verify"
    events = steps(events)
    prefill = [e for e in events if e.get("kind") == "prefill"]
    events = [e for e in events if e.get("kind") != "prefill"]
    if not events and not prefill:
        return _empty(title)
    if events and not any(_number(e.get(k)) is not None for e in events for k in ("draft_time_s", "verify_time_s")):
        return _empty(title, "Not reported: this engine does not say how long its steps' drafting and verifying took.")
    x = [e.get("step", i) for i, e in enumerate(events)]

    def ms(key: str) -> list[float | None]:
        return [None if _number(e.get(key)) is None else _number(e.get(key)) * 1000 for e in events]

    fig = go.Figure()
    fig.add_trace(go.Bar(x=x, y=ms("draft_time_s"), name="draft", marker=dict(color=DRAFT, pattern=dict(shape="x"))))
    fig.add_trace(go.Bar(x=x, y=ms("verify_time_s"), name="verify", marker=dict(color=VERIFY)))
    fig.update_layout(barmode="stack", bargap=0.15)
    seconds = _number(prefill[0].get("verify_time_s")) if prefill else None
    if seconds is not None:
        fig.add_annotation(text=f"prefill {seconds * 1000:.0f} ms (not drawn)", xref="paper", yref="paper", x=0, y=1.0,
                           xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=13, color=FONT))
    return _layout(fig, title, "step", "ms")


def compare(rows: list[dict], modes: Modes = MODES) -> go.Figure:
    """Speedup over autoregressive per mode (the Compare tab), with the 1× line."""
    title = "Speedup vs autoregressive"
    rows = [r for r in (rows or []) if isinstance(r, Mapping)]
    if not rows:
        return _empty(title, "No comparison yet: run one prompt through several modes.")
    keys = [mode_key(str(r.get("mode", "")), modes) for r in rows]
    speedup = [_number(r.get("speedup")) for r in rows]
    left_out = _left_out([r for r, s in zip(rows, speedup) if s is None], "doubt", modes)
    if all(s is None for s in speedup):
        return _empty(title, " ".join(left_out) or figures.withheld("the table says why for each mode"))
    # Bars along x, names down the side: eleven modes' names fit there whole, where under vertical bars they were cut.
    fig = go.Figure(go.Bar(
        y=[_name(m, modes, m) for m in keys], x=speedup, orientation="h",
        marker=dict(color=[_colour(m, modes) for m in keys]),
        text=["" if s is None else f"{s:.2f}×" for s in speedup], textposition="outside", cliponaxis=False,
        name="speedup",
    ))
    fig.add_vline(x=1, line=dict(color=FONT, dash="dot", width=2))
    widest = max([s for s in speedup if s is not None] + [1.0])
    fig.update_layout(showlegend=False, height=max(HEIGHT, 90 + 26 * len(rows)),
                      yaxis=dict(autorange="reversed"), xaxis=dict(range=[0, widest * 1.3]))
    _note_under(fig, left_out)  # a mode without its bar says why, as its table row does
    return _layout(fig, title, "× autoregressive tokens/s", "")


def tau_vs_cost(rows: list[dict], modes: Modes = MODES) -> go.Figure:
    """Each compared mode as a point: τ after the prefill (`decoding_tau`) against what one of its steps cost in
    autoregressive steps (`step_cost`, traces.speedup_parts). The speedup is τ ÷ step time, the same all along
    each dotted ray from the origin: up is better drafting, left is cheaper steps. Autoregressive is (1, 1)."""
    title = "τ vs step time"
    rows = [r for r in (rows or []) if isinstance(r, Mapping)]
    points, withheld = [], [r for r in rows if mode_key(str(r.get("mode", "")), modes) != "autoregressive"
                            and r.get("step_doubt")]
    left_out = _left_out(withheld, "step_doubt", modes)  # a step time withheld (figures) is not drawn as one either
    for r in rows:
        mode = mode_key(str(r.get("mode", "")), modes)
        if any(r is w for w in withheld):
            continue
        tau, cost = (1.0, 1.0) if mode == "autoregressive" else (_number(r.get("decoding_tau")), _number(r.get("step_cost")))
        if tau is not None and cost is not None and cost > 0:
            points.append((mode, tau, cost))
    if len(points) < 2:
        return _empty(title, " ".join(left_out) if left_out else "No comparison yet: run one prompt through several modes.")
    # Steps read at least one autoregressive step (figures); the margin keeps the (1, 1) point off the edge.
    x_low = min(0.9, min(c for _, _, c in points) * 0.85)
    y_low = 0.9
    x_high = max(1.2, max(c for _, _, c in points) * 1.15)
    y_high = max(1.5, max(t for _, t, _ in points) * 1.15)
    fig = go.Figure()
    for speed in (1, 1.5, 2, 3, 4, 6):
        if speed * x_high <= y_low or speed * x_low >= y_high:
            continue  # this ray does not cross the plotted area
        fig.add_trace(go.Scatter(x=[0, x_high], y=[0, speed * x_high], mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color=FONT, dash="dot", width=1 if speed != 1 else 2)))
        end = (x_high, speed * x_high) if speed * x_high <= y_high else (y_high / speed, y_high)
        fig.add_annotation(x=end[0], y=end[1], text=f"{speed:g}×", showarrow=False, xanchor="right", yanchor="bottom",
                           font=dict(color=FONT, size=14))
    # A few points carry their names; more would write over each other: then a marker each, named in a legend beside.
    labelled = len(points) <= 4
    for i, (mode, tau, cost) in enumerate(points):
        name = _name(mode, modes, mode)
        fig.add_trace(go.Scatter(
            x=[round(cost, 4)], y=[round(tau, 4)], mode="markers+text" if labelled else "markers", name=name,
            text=[name] if labelled else None, textposition="top center",
            cliponaxis=False,  # a label near the edge stays whole
            marker=dict(color=_colour(mode, modes), size=16, symbol=_SYMBOLS[i % len(_SYMBOLS)],
                        line=dict(color="#ffffff", width=1)),
            hovertemplate=f"{name}: τ %{{y:.2f}} ÷ step %{{x:.2f}} = {tau / cost:.2f}× after the prefill<extra></extra>",
        ))
    legend = {} if labelled else {"legend": dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
                                  "height": max(HEIGHT, LEGEND_ROOM + LEGEND_ROW * len(points))}
    fig.update_layout(showlegend=not labelled, xaxis=dict(range=[x_low, x_high]), yaxis=dict(range=[y_low, y_high]), **legend)
    _note_under(fig, left_out)  # named with its reason, so a missing point reads as withheld rather than lost
    return _layout(fig, title, "step time (× autoregressive)", "τ after the prefill")


DTYPE_COLORS = {"float32": "#0072B2", "bfloat16": "#D55E00"}


def pass_cost(costs: list[dict]) -> go.Figure:
    """The verify-cost curve per dtype (Service.pass_cost): a pass over k tokens in one-token passes, on a log2 k axis."""
    title = "Cost of a pass over k tokens"
    costs = [c for c in (costs or []) if isinstance(c, Mapping) and c.get("tokens")]
    if not costs:
        return _empty(title, "Not measured yet: press Measure.")
    fig = go.Figure()
    for c in costs:
        fig.add_trace(go.Scatter(
            x=list(c["tokens"]), y=list(c["relative"]), mode="lines+markers", name=str(c["dtype"]),
            line=dict(color=DTYPE_COLORS.get(c["dtype"], "#009E73"), width=3), customdata=list(c["ms"]),
            hovertemplate="%{x} tokens: %{customdata:.1f} ms = %{y:.2f}× a one-token pass<extra>" + str(c["dtype"]) + "</extra>",
        ))
    ticks = sorted({k for c in costs for k in c["tokens"]})
    fig.add_hline(y=1, line=dict(color=FONT, dash="dot", width=2))
    fig.update_layout(xaxis=dict(type="log", tickvals=ticks, ticktext=[str(k) for k in ticks]))
    _note_under(fig, [f"{c['dtype']}: {said}" for c in costs for said in left_out(c)])  # a width timed under other load
    return _layout(fig, title, "tokens per pass (k)", "× a one-token pass")


# Light to dark blue (Okabe-Ito's sky blue and blue, then darker): more drafted tokens, darker line.
DRAFTED_COLORS = ["#56B4E9", "#0072B2", "#004C7A", "#00263D"]


def earnings(cost: Mapping | None, draft_cost: float = 0.0) -> go.Figure:
    """Leviathan's expected speedup against the acceptance rate α, one curve per number of drafted tokens
    γ, for one measured verify-cost curve (Service.pass_cost) and a draft cost per token in one-token passes."""
    title = "Speedup vs α"
    if not isinstance(cost, Mapping) or not cost.get("tokens"):
        return _empty(title, "Not measured yet: press Measure.")
    title = f"{title}, {cost['dtype']}" if cost.get("dtype") else title
    if doubt := unsteady(cost):  # speedups read off a curve that fell would contradict each other: withheld, as the note says
        return _empty(title, figures.withheld(doubt))
    if not earning_sizes(cost):  # every pass that drafts timed under other load than the one-token pass
        return _empty(title, " ".join(left_out(cost)))
    alphas = [i / 100 for i in range(100)]
    fig = go.Figure()
    for i, (drafted, rel) in enumerate(earning_sizes(cost)):
        fig.add_trace(go.Scatter(
            x=alphas, y=[round(expected_speedup(a, drafted, rel, draft_cost), 4) for a in alphas], mode="lines",
            name=f"γ = {drafted}", line=dict(color=DRAFTED_COLORS[i % len(DRAFTED_COLORS)], width=3),
            hovertemplate=f"drafting {drafted}, α %{{x:.2f}}: %{{y:.2f}}× autoregressive<extra></extra>",
        ))
    fig.add_hline(y=1, line=dict(color=FONT, dash="dot", width=2))
    # Near α = 1 long drafts reach 10× and more; up to 5× keeps the break-even region readable (zoom out for the rest).
    top = max((y for t in fig.data for y in t.y), default=1.0)
    fig.update_layout(xaxis=dict(range=[0, 1]), yaxis=dict(range=[0, min(5.0, top * 1.05)]))
    return _layout(fig, title, "acceptance rate α", "× autoregressive")


def training_loss(losses: list[float] | None, label: str = "Training") -> go.Figure:
    """A training run's loss per optimiser step (Service.train's progress events), with its running mean
    over 10 steps: one batch's loss is noisy, the mean says whether the heads are still learning."""
    title = "Training loss"
    values = [v for v in (_number(x) for x in (losses or [])) if v is not None]
    if not values:
        return _empty(title, "No run yet: press Train.")
    steps = list(range(1, len(values) + 1))
    window = [values[max(0, i - 9): i + 1] for i in range(len(values))]
    fig = go.Figure([
        go.Scatter(x=steps, y=values, mode=_markers(len(values)), name=f"{label}: per step", line=dict(color=DRAFT, width=1),
                   marker=dict(size=4), hovertemplate="step %{x}: loss %{y:.4f}<extra></extra>"),
        go.Scatter(x=steps, y=[sum(w) / len(w) for w in window], mode="lines", name="mean of the last 10",
                   line=dict(color=VERIFY, width=3), hovertemplate="step %{x}: mean %{y:.4f}<extra></extra>"),
    ])
    return _layout(fig, title, "optimiser step", "loss")


LATENCY, THROUGHPUT = "#0072B2", "#009E73"


def n_range(ns: list[int], with_one: bool = False) -> list[float]:
    """A log axis's range (log10 units) over the N measured, and N = 1 `with_one` (this app's batch-1 star), with a
    margin of 6% of the span (a marker's room) on each side."""
    lo, hi = math.log10(min([*ns, *([1] if with_one else [])])), math.log10(max(ns))
    pad = (hi - lo) * 0.06 if hi > lo else 0.3
    return [round(lo - pad, 4), round(hi + pad, 4)]


def load_sweep(sweep: Mapping | None, row: str | None = None) -> go.Figure:
    """A load sweep (app/bench/load.py): the speculative engine's speedup over the plain engine against the number
    of concurrent requests N (log2 axis), per request (time per output token) and in total throughput, τ beside it
    on its own axis, the 1× line, the crossover where speculation stops paying per request, and this project's own
    loop at batch 1 (the only batch it runs)."""
    title = "Speedup under concurrent load"
    points = list((sweep or {}).get("points") or []) if isinstance(sweep, Mapping) else []
    row = row or next((p["row"] for p in points if p.get("row") != load.PLAIN), None)
    rows = load.speedups(points, row) if row else []
    if not rows:
        return _empty(title, "No sweep yet: run one, or replay a recorded one.")
    method = row.removeprefix("vllm_")
    ns = [r["n"] for r in rows]
    fig = go.Figure()
    for key, name, colour in (("latency", "per request", LATENCY), ("throughput", "total throughput", THROUGHPUT)):
        fig.add_trace(go.Scatter(
            x=ns, y=[None if r[key] is None else round(r[key], 4) for r in rows], mode="lines+markers", name=name,
            line=dict(color=colour, width=3), marker=dict(size=9),
            hovertemplate=f"N = %{{x}}: %{{y:.2f}}× the plain engine ({name})<extra>{method}</extra>"))
    fig.add_trace(go.Scatter(
        x=ns, y=[None if r["tau"] is None else round(r["tau"], 4) for r in rows], mode="lines+markers", name="τ",
        yaxis="y2", line=dict(color=TAU, width=2, dash="dot"), marker=dict(size=7, symbol="diamond"),
        hovertemplate="N = %{x}: τ %{y:.2f} tokens per engine step<extra></extra>"))
    ours = sweep.get("ours") if isinstance(sweep, Mapping) else None
    starred = isinstance(ours, Mapping) and _number(ours.get("speedup")) is not None
    if starred:
        fig.add_trace(go.Scatter(
            x=[1], y=[round(float(ours["speedup"]), 4)], mode="markers", name="this app's loop (batch 1 only)",
            marker=dict(color=ADDED, size=14, symbol="star", line=dict(color="#ffffff", width=1)),
            hovertemplate="this app's own loop, one request: %{y:.2f}× its autoregressive run<extra></extra>"))
    fig.add_hline(y=1, line=dict(color=FONT, dash="dot", width=2))
    cross = load.crossover(rows, "latency")
    if cross["state"] == "crosses":
        fig.add_vline(x=cross["at"], line=dict(color=TAU, width=2, dash="dash"))
        # On a log axis an annotation's x is log10 N (a shape's is N): add_vline's own label landed at N = 10^N and
        # stretched the axis to it.
        fig.add_annotation(x=math.log10(cross["at"]), xref="x", xanchor="right", y=1, yref="y domain", yanchor="top",
                           text=f"stops paying at N = {cross['at']}", showarrow=False, font=dict(color=TAU, size=13))
    top = max([1.5] + [v for r in rows for v in (r["latency"], r["throughput"]) if v is not None]) * 1.1
    tau_top = max([2.0] + [r["tau"] for r in rows if r["tau"] is not None]) * 1.1
    fig.update_layout(
        xaxis=dict(type="log", tickvals=ns, ticktext=[str(n) for n in ns], range=n_range(ns, with_one=starred),
                   rangemode="normal"),
        yaxis=dict(range=[0, top]),
        yaxis2=dict(title=dict(text="τ", font=dict(size=15, color=TAU)), overlaying="y", side="right", range=[0, tau_top],
                    tickfont=dict(size=14, color=TAU), showgrid=False, rangemode="tozero"),
        margin=dict(r=56))
    out = _layout(fig, f"{title}: vLLM {method} vs plain", "concurrent requests N", "× the plain engine")
    # plotly.js's transition path fails on a redraw that adds the τ axis ("reading 'range'" of undefined): none here.
    out.layout.transition = None
    return out
