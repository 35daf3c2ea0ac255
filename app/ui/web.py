"""The web app (Gradio 6): the Run, Compare, Load, Train, Learn and Engines tabs assembled on one page, all through the
service, and its launch.

Each tab is a module with a class whose `layout()` builds it and whose methods are its handlers (run_tab.py,
compare_tab.py, load_tab.py, train_tab.py, learn_tab.py, engines_tab.py). Here: the page, the state the tabs share (one Stop registry
for every session, the Spec-Bench prompts), the events that join tabs, and the CSS given once at launch. Nothing
here touches tensors or tokenizers: the service streams JSON-like messages with token texts, `render` turns them
into escaped HTML and `charts` into Plotly figures.
"""

from __future__ import annotations

import threading
import time

import fastapi
import gradio as gr
from starlette.middleware import Middleware

from app.service.api import Service
from app.service.http import HttpSettings, serve as serve_http
from app.service.policy import UPLOAD_WINDOW_S
from app import traces
from app.ui import presenter, render
from app.ui.compare_tab import CompareTab
from app.ui.controls import examples
from app.ui.engines_tab import EnginesTab
from app.ui.inputs import InputTypes, endpoints_of
from app.ui.learn_tab import LearnTab
from app.ui.load_tab import LoadTab
from app.ui.run_tab import RunTab
from app.ui.sessions import Sessions, session_of
from app.ui.train_tab import TrainTab
from app.ui.unworded import WordUnworded
from app.ui.uploads import Ledger, UploadQuota

# Pages whose state (recordings, settings) the server keeps, the least recently used forgotten first. Each is ~0.4 MB,
# and every API call without a page is a page of its own: Gradio's default of 10,000 let a flood of calls grow the
# server by gigabytes.
EVENTS_PENDING = 64  # events Gradio holds before they start (each starts at once; see launch)
PAGES_KEPT = 128


def css(service: Service) -> str:
    """The page's own styles, given once at launch: the token view's, its modes' panels' and presenter mode's."""
    return render.css(service.registry) + presenter.CSS


# Gradio draws an empty file or code box as a div labelled "Empty value" with no role, which assistive technology
# may not announce (axe-core: aria-prohibited-attr); the icon is an image of emptiness, so it gets role="img".
EMPTY_ROLE = """<script>
new MutationObserver(() => document.querySelectorAll(".empty[aria-label]:not([role])")
  .forEach(e => e.setAttribute("role", "img"))).observe(document.documentElement, {childList: true, subtree: true});
</script>"""


def theme() -> gr.themes.Base:
    """Gradio's default theme with text that reads (axe-core's contrast rule, WCAG AA): its white on orange-500 and
    red-500 buttons (2.8:1, 3.8:1) and its zinc-400 secondary text (1.9:1) are below 4.5:1."""
    return gr.themes.Default().set(
        button_primary_background_fill="*primary_700", button_primary_background_fill_hover="*primary_800",
        button_primary_border_color="*primary_700",
        button_cancel_background_fill="#b91c1c", button_cancel_background_fill_hover="#991b1b",
        button_cancel_border_color="#b91c1c", body_text_color_subdued="*neutral_600")


class Studio:
    """The app around one Service: its tabs, the sessions' running jobs (for Stop), and the Blocks."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.modes = service.registry  # the modes it offers (app/modes/)
        self.sessions = Sessions(per_address=service.policy.address_replays)  # what each page runs, for its Stop
        # Read once: links and the counter-example look prompts up by question id (a link's `example=`).
        example_ids = {int(r["id"]): r["text"] for r in service.examples()}
        self.run = RunTab(service, self.sessions, example_ids)
        self.compare = CompareTab(service, self.sessions)
        self.load = LoadTab(service, self.sessions)
        self.trainer = TrainTab(service)
        self.learn = LearnTab(service)
        self.engines = EnginesTab(service, self.run)
        # Public mode: uploads bounded per address and in all, and removed after their window (uploads.py).
        policy = service.policy
        self.uploads = (Ledger(policy.address_upload_bytes, policy.upload_bytes, UPLOAD_WINDOW_S)
                        if policy.address_upload_bytes is not None or policy.upload_bytes is not None else None)
        if self.uploads is not None:
            threading.Thread(target=self._sweep_uploads, name="uploads", daemon=True).start()

    def _sweep_uploads(self) -> None:
        while True:
            time.sleep(UPLOAD_WINDOW_S / 10)
            self.uploads.sweep()

    def middleware(self, demo: gr.Blocks) -> list[Middleware]:
        """The ASGI middleware around the Gradio app, outermost first: worded errors, the upload quota, the inputs' types."""
        return [Middleware(WordUnworded), Middleware(UploadQuota, ledger=self.uploads),
                Middleware(InputTypes, endpoints=endpoints_of(demo))]

    def visitor_left(self, request: gr.Request) -> None:
        """The page closed (Gradio's unload): what it runs stops, so nobody's work outlives their visit."""
        self.sessions.cancel(session_of(request))
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
                with gr.Tab("Load", id="load"):
                    self.load.layout()
                with gr.Tab("Train", id="train"):
                    self.trainer.layout(self.run.artifact_pickers())
                with gr.Tab("Learn", id="learn"):
                    self.learn.layout(self.run.prompt)
                with gr.Tab("Engines", id="engines"):
                    self.engines.layout()
            self.run.open_on_load(demo, tabs, link_note)
            demo.unload(self.visitor_left)
        return demo


def launch(service: Service, host: str = "127.0.0.1", port: int = 7860, http: HttpSettings = HttpSettings()) -> None:
    """Serve the app on host:port until SIGINT or SIGTERM, on the HTTP layer `serve` runs on too (app/service/http.py:
    client addresses, read deadlines, answers at shutdown) instead of Gradio's own server thread."""
    studio = Studio(service)
    demo = studio.blocks()
    # Every handler starts at once: generations wait in the service's job queue (bounded, and per visitor, each
    # refusal worded), replays in their own (Sessions). Gradio's queue holding them instead would let one visitor's
    # burst, or a few slow replays, fill it for everybody ("Queue is full").
    # Gradio's own bound is only a backstop against a flood of events: at the service's, a burst of replays on a
    # loaded machine (events not yet started) was refused with Gradio's unworded "Queue is full".
    demo.queue(max_size=EVENTS_PENDING, default_concurrency_limit=None)
    # Read by Gradio's state holder when the app is made (Blocks.launch sets it the same way).
    demo.state_session_capacity = PAGES_KEPT
    # Uploads are trace files: refused while they arrive once over what a replay reads (traces.MAX_BYTES).
    # show_error=False is launch's default (mounting's is True): an unexpected exception's text stays on the server.
    app = gr.mount_gradio_app(
        fastapi.FastAPI(docs_url=None, redoc_url=None, openapi_url=None), demo, path="/", server_name=host,
        server_port=port, footer_links=["api", "gradio"], css=css(service), theme=theme(), head=presenter.HEAD + EMPTY_ROLE,
        max_file_size=traces.MAX_BYTES, show_error=False, app_kwargs={"middleware": studio.middleware(demo)})
    # Blocks.launch sets it once its server runs; mounting does not, and without it Gradio skips its check that a file
    # named in a request was uploaded (a visitor could have a replay read any file of the server's).
    demo.has_launched = True
    print(f"* Running on local URL:  http://{host}:{port}", flush=True)
    serve_http(app, host, port, http)
