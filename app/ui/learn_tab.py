"""The Learn tab: how speculative decoding earns (lessons.py's texts), the verify-cost curve measured on this machine,
what drafting can earn on it, and every mode explained."""

from __future__ import annotations

import gradio as gr

from app.modes import ConfigError
from app.service.api import ModelError, Service
from app.service.jobs import QueueFull
from app.ui import charts, lessons, load_tab, render
from app.ui.controls import QUIET, Slider
from app.ui.sessions import visitor_of
from app.modes.notation import medusa_choices
from app.decoding.tree import from_paths


def example_tree() -> str:
    """Medusa's default tree, drawn as data: each node is (head depth, top-k rank)."""
    paths = medusa_choices("default")
    parents = from_paths(paths)
    texts = {i: f"h{len(p)}:top{p[-1] + 1}" for i, p in enumerate(paths)}
    path = [paths.index(p) for p in ([0], [0, 0], [0, 0, 0]) if p in paths]  # the top-1 chain, as if accepted
    return render.tree_svg(list(range(len(paths))), parents, path, texts)


class LearnTab:
    """The Learn tab of one Service: `layout()` builds it, the methods are its handlers."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def layout(self, prompt: gr.Textbox) -> None:
        """`prompt`: the Run tab's, the context the verify cost is measured with."""
        gr.Markdown(lessons.OVERVIEW)
        gr.HTML(example_tree(), elem_id="learn-tree")
        gr.Markdown(lessons.PASS_COST)
        cost_btn = gr.Button("Measure (float32 and bfloat16)", elem_id="cost-run")
        cost_note = gr.Markdown("", elem_id="cost-note")
        cost_plot = gr.Plot(charts.pass_cost([]), label="Verify cost", elem_id="cost-plot")
        costs = gr.State([])
        gr.Markdown(lessons.EARNINGS)
        draft_cost = Slider(0, 0.5, value=0, step=0.01, label="draft cost per drafted token (× a one-token pass)",
                            elem_id="draft-cost")
        earn_note = gr.Markdown("", elem_id="earn-note")
        earn_plot = gr.Plot(charts.earnings(None), label="Expected speedup", elem_id="earn-plot")
        gr.Markdown(lessons.LOAD + "\n" + load_tab.shipped_notes(), elem_id="learn-load")
        for m in self.service.registry:
            with gr.Accordion(m.label, open=False):
                gr.Markdown(lessons.explain(m.name, self.service.registry))
        cost_btn.click(self.pass_cost, prompt, [cost_plot, cost_note, costs], api_name="pass_cost",
                       concurrency_id="generate").then(self.earnings, [costs, draft_cost], [earn_plot, earn_note], **QUIET)
        draft_cost.change(self.earnings, [costs, draft_cost], [earn_plot, earn_note], **QUIET)

    def pass_cost(self, prompt: str, request: gr.Request):
        """The verify-cost curve of this machine in each dtype the server runs, with the Run tab's prompt as the context
        (counted against this visitor's bounds: each curve is a job)."""
        try:
            costs = [self.service.pass_cost(prompt, dtype, visitor=visitor_of(request)) for dtype in self.service.dtypes()]
        except (ConfigError, ModelError, QueueFull) as err:
            raise gr.Error(str(err)) from None
        return charts.pass_cost(costs), lessons.pass_cost_note(costs), costs

    def earnings(self, costs: list[dict], draft_cost: float):
        """What drafting can earn on the measured curve of the dtype that runs fastest here."""
        cost = next((c for c in costs or [] if c.get("dtype") == self.service.fast_dtype()), (costs or [None])[0])
        return charts.earnings(cost, draft_cost), lessons.earnings_note(cost, draft_cost)
