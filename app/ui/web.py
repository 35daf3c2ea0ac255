"""The web app (Gradio 6): the Run, Compare, Train, Learn and Engines tabs assembled on one page, all through the
service, and its launch.

Each tab is a module with a class whose `layout()` builds it and whose methods are its handlers (run_tab.py,
compare_tab.py, train.py, learn_tab.py, engines_tab.py). Here: the page, the state the tabs share (one Stop registry
for every session, the Spec-Bench prompts), the events that join tabs, and the CSS given once at launch. Nothing
here touches tensors or tokenizers: the service streams JSON-like messages with token texts, `render` turns them
into escaped HTML and `charts` into Plotly figures.
"""

from __future__ import annotations

import gradio as gr

from app.service.api import Service
from app.ui import presenter, render
from app.ui.compare_tab import CompareTab
from app.ui.controls import examples
from app.ui.engines_tab import EnginesTab
from app.ui.learn_tab import LearnTab
from app.ui.run_tab import RunTab
from app.ui.sessions import Sessions
from app.ui.train import TrainTab

# The page's own styles, given once at launch: the token view's and presenter mode's.
CSS = render.CSS + presenter.CSS


class Studio:
    """The app around one Service: its tabs, the sessions' running jobs (for Stop), and the Blocks."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.modes = service.registry  # the modes it offers (app/modes.py)
        self.sessions = Sessions()  # what each page runs, for its Stop
        # Read once: links and the counter-example look prompts up by question id (a link's `example=`).
        example_ids = {int(r["id"]): r["text"] for r in service.examples()}
        self.run = RunTab(service, self.sessions, example_ids)
        self.compare = CompareTab(service, self.sessions)
        self.trainer = TrainTab(service)
        self.learn = LearnTab(service)
        self.engines = EnginesTab(service, self.run)

    def visitor_left(self, request: gr.Request) -> None:
        """The page closed (Gradio's unload): what it runs stops, so nobody's work outlives their visit."""
        self.sessions.cancel(request.session_hash)
        self.trainer.visitor_left(request)

    def blocks(self) -> gr.Blocks:
        service = self.service
        shown = examples(service)
        # delete_cache: Gradio keeps a copy of every trace it served; an hour is enough to download one.
        with gr.Blocks(title="SpecDec Studio", delete_cache=(3600, 3600)) as demo:
            gr.Markdown(
                f"# SpecDec Studio\nWatch speculative decoding step by step on **{service.model}** ({service.dtype}) — "
                "what was drafted, what the target accepted, what it added, and whether it is faster than plain decoding."
            )
            link_note = gr.Markdown("", elem_id="link-note")
            with gr.Tabs(selected="run") as tabs:
                with gr.Tab("Run", id="run"):
                    self.run.layout(shown)
                with gr.Tab("Compare", id="compare"):
                    self.compare.layout(shown)
                with gr.Tab("Train", id="train"):
                    self.trainer.layout(self.run.artifact_pickers())
                with gr.Tab("Learn", id="learn"):
                    self.learn.layout(self.run.prompt)
                with gr.Tab("Engines", id="engines"):
                    self.engines.layout()
            self.run.open_on_load(demo, tabs, link_note)
            demo.unload(self.visitor_left)
        return demo


def launch(service: Service, host: str | None = None, port: int | None = None, **kwargs):
    """Serve the app; host/port None = Gradio's own defaults (GRADIO_SERVER_NAME/PORT, else 127.0.0.1:7860)."""
    studio = Studio(service)
    demo = studio.blocks()
    demo.queue(max_size=service.limits.max_queue, default_concurrency_limit=service.limits.max_concurrency)
    return demo.launch(server_name=host, server_port=port, footer_links=["api", "gradio"], css=CSS,
                       head=presenter.HEAD, **kwargs)
