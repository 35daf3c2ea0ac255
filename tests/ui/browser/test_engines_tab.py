"""The Engines tab (issue 59 item 6; issue 58's build progress): its Stop/Remove menu drawn from the list it shows,
a settings column that tells two builds of one mode and backend apart, a table that fits a 1440 px window, Stop
offering only this app's vLLM servers unless the operator asks, and the fast pass's build progress.

vLLM servers here are a stand-in interpreter (a venv over this Python whose `vllm.entrypoints.openai.api_server`
answers /health and completions, stdlib only), started and stopped by the service's own process code
(vllm_processes.Processes), so "running", "stopped" and who started a server are real."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import models
from app.decoding import fast_build
from app.models import LoadedModel
from app.modes import MODES
from app.backends.vllm import processes as vllm_processes
from app.service.api import Service
from app.backends.registry import spec_for
from app.service.policy import Policy
from app.ui.engines_tab import HEADERS, elsewhere, fast_pass_text, settings_text
from app.ui.sessions import visitor_of
from app.ui.web import Studio
from helpers import free_port, running_server, serve_engines

API_SERVER = textwrap.dedent('''
    """A stand-in for vLLM's OpenAI server (tests/ui/browser/test_engines_tab.py): /health, and completions that say nothing."""
    import argparse
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"choices": [{"text": "", "finish_reason": "length"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass


    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
''')


def stand_in_vllm(root: Path) -> Path:
    """The stand-in's interpreter: `root/bin/python`, a link to this Python's base interpreter in a venv of its own (the
    link's path is what the service records and later finds in /proc as the server's command)."""
    base = Path(sys._base_executable)
    v = sys.version_info
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(base)
    (root / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n"
                                     f"version = {v.major}.{v.minor}.{v.micro}\n")
    site = root / "lib" / f"python{v.major}.{v.minor}" / "site-packages"
    package = site / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (site / "vllm", site / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(API_SERVER)
    (site / "vllm-0.0.0.dist-info").mkdir()
    (site / "vllm-0.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.0\n")
    return root / "bin" / "python"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory) -> vllm_processes.Settings:
    return vllm_processes.Settings(python=stand_in_vllm(tmp_path_factory.mktemp("vllm")))


@pytest.fixture
def store(tmp_path) -> Path:
    return serve_engines(tmp_path)


def services(store, vllm, **kwargs):
    made = []

    def make(**more) -> Service:
        made.append(Service(engines=store, vllm_settings=vllm, **{**kwargs, **more}))
        return made[-1]

    return made, make


@pytest.fixture
def make_service(store, vllm):
    made, make = services(store, vllm)
    yield make
    for service in made:
        service.close()  # stops the servers each started


def ngram(service, k: int = 10, n: int = 2, backend: str = "vllm"):
    return service.request({"speculative_config": {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": n},
                            "backend": backend})


def page_of(tab, drawn: dict) -> tuple[list[list], list[str]]:
    """(table rows, menu choices) of a handler's answer."""
    return drawn[tab.table], list(drawn[tab.ids]["choices"])


def visitor(address: str, session: str = "s"):
    return SimpleNamespace(client=SimpleNamespace(host=address), session_hash=session, query_params={}, headers={})


def column(name: str) -> int:
    return HEADERS.index(name)


# ----------------------------------------------------------------------------- the list, its menu, its columns


def test_the_menu_offers_what_the_list_shows_and_follows_it(make_service):
    """The menu was filled once, when the server started: empty while the table listed builds made since. Now the
    list and the menu are drawn together on every page load, tab opening and action."""
    service = make_service()
    studio = Studio(service)
    demo = studio.blocks()
    tab = studio.engines
    drawn = [fn for fn in demo.fns.values() if fn.fn == tab.refresh]
    triggers = {t[1] for fn in drawn for t in fn.targets}
    assert {"load", "select", "change"} <= triggers  # page load, the tab opened, the operator's box
    assert all(tab.ids in fn.outputs and tab.table in fn.outputs for fn in drawn)

    assert page_of(tab, tab.refresh(False, None)) == ([], [])
    # Builds made after the page loaded, as the CLI or another page makes them: the next drawing lists them in both.
    made = [service.engine_build(ngram(service, backend="transformers"))["id"],
            service.engine_build(service.request({"speculative_config": {"decoding_type": "Eagle"}}))["id"],
            service.store.build(spec_for(ngram(service), service.model, dtype=service.dtype))["id"]]
    rows, menu = page_of(tab, tab.refresh(False, None))
    assert [r[column("build")] for r in rows] == menu and set(menu) == set(made)
    # This page's own build, and removal: the answer carries the list and the menu together.
    data = {tab.run.mode: "lookahead", **{tab.run.controls[k]: v for k, v in tab.run.page_defaults().items()},
            tab.others: False}
    answer = tab.build(data, None, progress=lambda *a, **k: None)
    built = answer[tab.status].split("`")[1]
    rows, menu = page_of(tab, answer)
    assert "ready" in answer[tab.status] and [r[0] for r in rows] == menu and set(menu) == {*made, built}
    answer = tab.remove(made[0], False, None)
    rows, menu = page_of(tab, answer)
    assert answer[tab.status] == f"Removed `{made[0]}`." and made[0] not in menu and [r[0] for r in rows] == menu
    assert answer[tab.ids]["value"] is None


def test_the_settings_column_tells_two_prompt_lookup_servers_apart(make_service):
    service = make_service()
    studio = Studio(service)
    studio.blocks()
    for k, n in ((10, 2), (6, 3)):
        service.store.build(spec_for(ngram(service, k, n), service.model, dtype=service.dtype))
    rows = page_of(studio.engines, studio.engines.refresh(False, None))[0]
    assert len(rows) == 2 and rows[0][column("mode · backend")] == rows[1][column("mode · backend")] == "prompt_lookup · vllm"
    said = sorted(r[column("settings")] for r in rows)
    assert said == ["float32, num_speculative_tokens 10, prompt_lookup_max 2, prompt_lookup_min 1",
                    "float32, num_speculative_tokens 6, prompt_lookup_max 3, prompt_lookup_min 1"]
    assert all(r[column("server")] == "stopped" for r in rows)
    assert all(len(r) == len(HEADERS) for r in rows)


def test_settings_are_said_by_each_backends_own_names():
    def spec(data, dtype="float32"):
        return spec_for(MODES.parse(data), models.BUNDLED, dtype=dtype).to_dict()

    lookahead = spec({"speculative_config": {"decoding_type": "Lookahead", "max_window_size": 5}, "backend": "tensorrt_llm"})
    assert settings_text(lookahead) == ("max_window_size 5, max_ngram_size 3, max_verification_set_size 4, "
                                        "max_draft_len 17, trtllm_backend tensorrt")
    medusa = settings_text(spec({"speculative_config": {"decoding_type": "Medusa"}, "backend": "tensorrt_llm"}))
    assert medusa.startswith("medusa_choices 16 paths, max_draft_len 16, speculative_model shipped (")
    assert settings_text(spec({"speculative_config": {"decoding_type": "NGram"}})) == "any dtype"
    suffix = settings_text(spec({"speculative_config": {"decoding_type": "Suffix"}, "backend": "vllm", "dtype": "bfloat16"}))
    assert suffix.startswith("bfloat16, num_speculative_tokens 24, suffix_decoding_max_tree_depth 24")


# ----------------------------------------------------------------------------- whose servers Stop offers


def test_stop_offers_this_apps_servers_and_others_only_when_the_operator_asks(make_service):
    service = make_service()
    studio = Studio(service)
    studio.blocks()
    tab = studio.engines
    here, _ = service.engine(ngram(service, 10, 2), service.model)  # a Run on vLLM in this app started it
    # Another process on the same store (the CLI's `generate --backend vllm`, a test, another app) starts its own.
    there, _ = make_service().engine(ngram(service, 6, 3), service.model)
    here, there = here["id"], there["id"]

    rows, menu = page_of(tab, tab.refresh(False, None))
    server = {r[0]: r[column("server")] for r in rows}
    assert server[here].startswith("running here :") and server[there].startswith("running elsewhere :")
    assert menu == [here] and elsewhere(service.engine_get(there))

    for act in (tab.stop, tab.remove):  # refused from the menu's custom value too, and nothing happens to it
        answer = act(there, False, None)
        assert "was started by another process" in answer[tab.status] and "tick" in answer[tab.status]
        assert service.engine_get(there)["server"]["state"] == "running"
    # The operator asks: the other process's server is offered, and stops.
    assert set(page_of(tab, tab.refresh(True, None))[1]) == {here, there}
    answer = tab.stop(there, True, None)
    assert answer[tab.status] == f"Stopped the server of `{there}` (the next request on it starts it again)."
    assert service.engine_get(there)["server"]["state"] == "stopped"
    answer = tab.stop(here, False, None)
    assert answer[tab.status].startswith("Stopped the server") and service.engine_get(here)["server"]["state"] == "stopped"
    assert set(page_of(tab, answer)[1]) == {here, there}  # stopped servers are nobody's to keep: both removable


def test_a_public_visitor_is_offered_their_own_engines_only(store, vllm):
    made, make = services(store, vllm)
    try:
        operator = make()  # the operator's own process (`serve`, the CLI) on the store
        theirs, _ = operator.engine(ngram(operator, 6, 3), operator.model)
        public = make(policy=Policy.for_public())
        studio = Studio(public)
        studio.blocks()
        tab = studio.engines
        assert tab.others.visible is False
        a, b = visitor("10.0.0.1", "a"), visitor("10.0.0.2", "b")
        mine = public.engine_build(ngram(public, 10, 2), visitor=visitor_of(a))["id"]
        rows, menu = page_of(tab, tab.refresh(True, a))  # the box is the operator's: a visitor's True changes nothing
        assert menu == [mine] and {theirs["id"], mine} <= {r[0] for r in rows}
        assert "is not a build you may stop here" in tab.stop(theirs["id"], True, a)[tab.status]
        assert public.engine_get(theirs["id"])["server"]["state"] == "running"
        assert page_of(tab, tab.refresh(True, b))[1] == []  # B sees the operator's, and nothing of A's to stop
        assert tab.stop(mine, False, a)[tab.status].startswith("Stopped the server")
    finally:
        for service in made:
            service.close()


# ----------------------------------------------------------------------------- the fast pass's build progress


def building(service, tmp_path, stage: str, elapsed: float, earlier_s: float | None = None) -> LoadedModel:
    """The transformers backend holding this server's model while its fast pass builds, as models.attach_fast_pass
    leaves it: the build's log (what `python -m app compile` prints) under engines/compiled/, and before it, when
    `earlier_s`, another dtype's finished build with what it took (its target's pass and its companions'), and after
    that a trained EAGLE module's pass built on its own (a minute: not what a build takes)."""
    compiled = service.engines / "compiled"
    compiled.mkdir(exist_ok=True)
    if earlier_s is not None:
        (compiled / "earlier").mkdir()
        (compiled / "earlier" / "info.json").write_text(json.dumps(
            {"seconds": earlier_s - 70, fast_build.WHOLE: earlier_s, "built": {"one": [1, 1]}}))
        (compiled / "module").mkdir()
        (compiled / "module" / "info.json").write_text(json.dumps({"seconds": 70, "built": {"draft": [1, 128]}}))
        os.utime(compiled / "earlier" / "info.json", (time.time() - 60, time.time() - 60))
    log = compiled / "abc.log"
    log.write_text("loading smollm2-135m-instruct ...\n[compile] exporting the graph of 1..1-token passes\n"
                   f"[compile] {stage}\n")
    loaded = LoadedModel(service.model, model=None, tokenizer=None, dtype=service.dtype)
    loaded.fast = {"state": "building", "started": time.monotonic() - elapsed, "log": str(log),
                   "note": "eager pass while the fast pass builds (once per machine, minutes)"}
    # The backend's one place for what it loaded (its model() loads through it).
    service.backends["transformers"]._once(("model", service.model, service.dtype), lambda: loaded)
    return loaded


def test_the_fast_pass_build_shows_its_stage_time_and_estimate_while_it_runs(make_service, tmp_path):
    service = make_service()
    studio = Studio(service)
    demo = studio.blocks()
    tab = studio.engines
    assert any(fn.fn == tab.progress and tab.timer in fn.outputs and t[1] == "tick" for fn in demo.fns.values() for t in fn.targets)
    assert tab.progress()[tab.fast] == "" and tab.progress()[tab.timer].active is False  # nothing loaded yet

    loaded = building(service, tmp_path, "compiling the graph of 2..16-token passes: packed products (inductor, C++ kernels)",
                      elapsed=200, earlier_s=480)
    answer = tab.refresh(False, None)
    line = answer[tab.fast]
    assert "Building the fast pass** of smollm2-135m-instruct (float32)" in line
    assert "3 min 20 s so far of about 8 min (as long as the last build here)" in line
    assert line.endswith("now compiling the graph of 2..16-token passes: packed products (inductor, C++ kernels)")
    assert answer[tab.timer].active is True  # redrawn every PROGRESS_S while it runs

    # The build ends: the line says which pass runs now, and the timer stops.
    loaded.fast = {"state": "ready", "note": "compiled pass, built in 530 s and loaded in 7.8 s"}
    answer = tab.progress()
    assert answer[tab.fast] == "Fast pass of smollm2-135m-instruct (float32): compiled pass, built in 530 s and loaded in 7.8 s"
    assert answer[tab.timer].active is False


def test_the_estimate_without_an_earlier_build_and_a_build_running_late(make_service, tmp_path):
    service = make_service()
    building(service, tmp_path, "timing each graph's builds <against> each other", elapsed=700)
    [status] = service.fast_passes()
    assert status["estimated_from"] == "typical" and status["estimate_s"] == 600
    line = fast_pass_text([status])
    assert "11 min so far, longer than the 10 min expected (typical on 2 cores)" in line
    assert "&lt;against&gt;" in line and "<against>" not in line  # the log's text is escaped


# ----------------------------------------------------------------------------- in a browser, at 1440 x 900


@pytest.fixture(scope="module")
def app(tmp_path_factory, vllm):
    """The app as `python -m app` runs it, on a store with a vLLM server another process started (this test's
    Service) and builds whose settings make long cells."""
    tmp = tmp_path_factory.mktemp("app")
    store = serve_engines(tmp)
    other = Service(engines=store, vllm_settings=vllm)
    there, _ = other.engine(ngram(other, 6, 3), other.model)
    for data in ({"speculative_config": {"decoding_type": "Suffix"}, "backend": "vllm", "dtype": "bfloat16"},
                 {"speculative_config": {"decoding_type": "NGram"}, "backend": "vllm"},
                 {"speculative_config": {"decoding_type": "Eagle"}}, {"speculative_config": {"decoding_type": "Medusa"}}):
        request = other.request(data)
        other.store.build(spec_for(request, other.model, dtype=other.dtype))
    env = {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp)}
    port = free_port()
    try:
        with running_server(["--port", str(port), "--engines-dir", str(store), "--vllm-python", str(vllm.python)],
                            "/gradio_api/info", port, tmp / "app.log", env) as url:
            yield url, there["id"]
    finally:
        other.close()


@pytest.fixture
def page(browser, app):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app[0])
    page.wait_for_selector("#run")
    yield page
    assert not errors, f"JavaScript errors: {errors}"
    context.close()


def menu_options(page) -> list[str]:
    page.locator("#eng-id input").click()
    options = page.get_by_role("option").all_inner_texts()
    page.keyboard.press("Escape")
    page.locator("#eng-id input").blur()  # the menu opens on focus: the next click opens it again
    return options


def eventually(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


ROWS = "#eng-table div[role=row]"  # Gradio 6 draws a table's body as rows of divs (its header stays a <table>)


def table_ids(page) -> list[str]:
    return page.eval_on_selector_all(ROWS, "rows => rows.map(r => r.querySelector('[role=gridcell]').innerText.trim())")


# The table's scrolling viewport, its headers and its cells, measured where the page draws them.
FITS = """() => {
  const box = document.querySelector('#eng-table'), b = box.getBoundingClientRect();
  const view = box.querySelector('.virtual-table-viewport') || box.querySelector('table');
  const heads = [...box.querySelectorAll('thead th')].map(h => {
    const r = h.getBoundingClientRect();
    return {text: h.innerText.trim(), inside: r.left >= b.left - 1 && r.right <= b.right + 1 && r.width > 0,
            clipped: h.scrollWidth > h.clientWidth + 1};
  });
  const clipped = [...box.querySelectorAll('div[role=row] [role=gridcell]')].filter(c => c.scrollWidth > c.clientWidth + 1)
    .map(c => c.innerText.trim());
  return {scroll: view.scrollWidth, width: view.clientWidth, box: box.clientWidth, heads, clipped};
}"""


@pytest.mark.bundled
def test_browser_the_engines_table_fits_1440_px_and_stop_offers_what_it_should(page, app):
    url, there = app
    page.get_by_role("tab", name="Engines").click()
    page.wait_for_function("([rows, n]) => document.querySelectorAll(rows).length >= n", arg=[ROWS, 5])
    fits = page.evaluate(FITS)
    assert fits["scroll"] <= fits["width"] <= fits["box"], fits
    assert not fits["clipped"], fits["clipped"]
    assert [h["text"] for h in fits["heads"]] == HEADERS
    assert all(h["inside"] and not h["clipped"] for h in fits["heads"]), fits["heads"]
    # The menu is the list, less the server another process runs; the operator's box offers that one too.
    ids = table_ids(page)
    assert there in ids and "running elsewhere" in page.inner_text("#eng-table")
    assert menu_options(page) == [i for i in ids if i != there]
    page.get_by_label("Offer servers other processes started too", exact=False).check()
    assert eventually(lambda: menu_options(page) == ids)

    # The Run tab's settings on vLLM, built here: this app starts the server, lists it as its own, and stops it.
    page.get_by_role("tab", name="Run").click()
    page.locator("#backend input").click()
    page.get_by_role("option", name="vllm", exact=True).click()
    page.get_by_role("tab", name="Engines").click()
    page.click("#eng-build")
    # The build's own line (its progress says "ready at <url>" while the table is still being drawn).
    page.wait_for_function("/✓ Build .* ready/.test(document.querySelector('#eng-status').innerText)", timeout=60_000)
    built = re.search(r"[0-9a-f]{16}", page.inner_text("#eng-status")).group(0)
    row = page.locator(ROWS, has_text=built)
    assert "running here" in row.inner_text() and built in menu_options(page)
    page.locator("#eng-id input").click()
    page.get_by_role("option", name=built).click()
    page.click("#eng-stop")
    page.wait_for_function("/Stopped the server/.test(document.querySelector('#eng-status').innerText)")
    assert "stopped" in page.locator(ROWS, has_text=built).inner_text()


@pytest.mark.bundled
def test_browser_lookaheads_n_moves_the_requests_n(page):
    page.get_by_label("Lookahead", exact=True).check()
    box = page.get_by_label("number input for max_ngram_size N", exact=True)
    box.fill("4")
    box.press("Enter")
    page.wait_for_function("/= 23/.test(document.querySelector('#check').innerText)")
    assert page.get_by_label("number input for n", exact=True).input_value() == "4"
