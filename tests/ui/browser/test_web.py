"""The web app end to end: `python -m app` started as a real server on the bundled model, driven through
its public API (gradio_client) and in a real browser (Playwright + Debian's chromium, headless).

Screenshots of every tab go to the test artifacts, and with `--update-screenshots` also to assets/screenshots/ (the
ones the README and docs/ui.md show): a plain test run leaves the working tree as it was."""

import contextlib
import json
import re
import urllib.request
import zipfile
from pathlib import Path

import pytest
from playwright.sync_api import expect

from app.ui import settings
from app.ui.lessons import label
from helpers import PROMPT, RECORDINGS, ROOT, inspect_step, set_number, wait_status

pytestmark = pytest.mark.bundled

RACED = ROOT / "assets" / "traces" / "eagle-roleplay-bfloat16.json"  # a recording with the baseline it raced


# ----------------------------------------------------------------------------- API level (gradio_client)


def test_the_server_binds_to_loopback_only(app_url):
    assert app_url.startswith("http://127.0.0.1:")
    info = json.load(urllib.request.urlopen(app_url + "/gradio_api/info", timeout=10))
    endpoints = set(info["named_endpoints"])
    assert {"/run", "/run_controls", "/stop", "/inspect", "/replay", "/replay_recording", "/compare", "/engine_build",
            "/engine_plan", "/engine_remove", "/train", "/train_stop"} <= endpoints


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False, download_files=False)


def run_args(mode, prompt=PROMPT, race=False, **overrides):
    from app.ui.settings import CONTROLS, DEFAULTS

    values = {**DEFAULTS, "max_new_tokens": 32, **overrides}
    return [prompt, mode, race] + [values[k] for k in CONTROLS]


def committed_text(html):
    """The output as the step view shows it: accepted draft tokens and added tokens, in order."""
    from html.parser import HTMLParser

    class P(HTMLParser):
        def __init__(self):
            super().__init__()
            self.depth, self.out = 0, []

        def handle_starttag(self, tag, attrs):
            cls = dict(attrs).get("class") or ""
            if self.depth:
                self.depth += 1
            elif "tok-accepted" in cls.split() or "tok-added" in cls.split():
                self.depth = 1

        def handle_endtag(self, tag):
            if self.depth:
                self.depth -= 1

        def handle_data(self, data):
            if self.depth:
                self.out.append(data)

    p = P()
    p.feed(html)
    return "".join(p.out)


@pytest.mark.parametrize("mode", ["autoregressive", "draft_target", "prompt_lookup", "lookahead", "medusa", "eagle"])
def test_api_run_streams_and_every_mode_commits_the_autoregressive_output(client, mode):
    job = client.submit(*run_args(mode), api_name="/run_controls")
    updates = list(job)
    view, status = job.result()[:2]
    assert len(updates) >= 1
    assert "finished" in status, status
    assert view.count("tok-added") >= 1 and 'data-step="0"' in view
    reference = client.predict(*run_args("autoregressive"), api_name="/run_controls")[0]
    assert committed_text(view) == committed_text(reference) != ""
    # The session's record (gr.State) is kept between calls: inspect a step of this run.
    detail, race, per_step = client.predict(1, api_name="/inspect")
    assert "Step 1" in detail and "sd-narration" in detail
    for figure in (race, per_step):  # the charts follow the inspected step: a cursor on it
        layout = json.loads(figure["plot"])["layout"]
        assert [a["text"] for a in layout["annotations"]] == ["step 1"] and layout["shapes"][0]["line"]["dash"] == "dot"
    # The target's side of the step, every token named by its text (the service sends the texts).
    assert 'class="sd-target-table"' in detail and "⟨" not in detail


def test_api_run_offers_its_trace_as_a_json_download(client, app_url):
    out = client.predict(*run_args("lookahead"), api_name="/run_controls")
    view, download = out[0], out[-1]
    assert download["interactive"] and download["value"]["orig_name"] == "specdec-lookahead-trace.json"
    with urllib.request.urlopen(download["value"]["url"], timeout=10) as f:
        trace = json.load(f)
    assert trace["mode"] == "lookahead" and trace["dtype"] == "float32" and trace["finish_reason"] in ("eos", "length")
    assert trace["request"]["speculative_config"]["decoding_type"] == "Lookahead"
    assert len(trace["steps"]) == view.count('data-step="') >= 1
    assert trace["token_ids"] == [t for s in trace["steps"] for t in s["tokens"]]
    assert trace["text"] == "".join(s["text"] for s in trace["steps"]) != ""
    # Every step carries what the app drew: the proposal, the verdict and the lookahead branch's source.
    assert all({"proposed", "accepted_tokens", "source", "totals"} <= set(s) for s in trace["steps"])


@pytest.mark.parametrize("mode,box", [("medusa", "md_pl"), ("eagle", "eg_pl")])
def test_api_merged_tree_commits_the_autoregressive_output_and_shows_copied_nodes(client, mode, box):
    view = client.predict(*run_args(mode, **{box: True}), api_name="/run_controls")[0]
    reference = client.predict(*run_args("autoregressive"), api_name="/run_controls")[0]
    assert committed_text(view) == committed_text(reference) != ""
    client.predict(*run_args(mode, **{box: True}), api_name="/run_controls")  # the session's record is this run again
    from gradio_client.exceptions import AppError

    details = []
    for step in range(1, 40):
        try:
            detail = client.predict(step, api_name="/inspect")[0]
        except AppError:  # past the last step
            break
        assert f"Step {step} " in detail
        details.append(detail)
    assert details and all("Merged with prompt lookup" in d for d in details)
    # The prompt asks for a repetition: some step verifies copied nodes, tagged in the tree.
    assert any('class="node copied' in d for d in details)


def test_api_runs_in_the_chosen_dtype_and_says_so(client):
    out = client.predict(*run_args("prompt_lookup", race=True, dtype="bfloat16"), api_name="/run_controls")
    assert "**Prompt lookup** (bfloat16) finished" in out[1], out[1]
    # It raced the baseline: the status says why it is as fast as it is, or, when the other test worker's load changed
    # between the two runs of 20 tokens (a quarter of a second each), declines the ratio in words.
    said = re.search(r"after the prefill \d+\.\d\d× \(95 % of the step times' spread: "
                     r"\d+\.\d\d–\d+\.\d\d×\) = τ \d+\.\d\d ÷ a step costing "
                     r"\d+\.\d\d autoregressive steps \(verify", out[1])
    declined = re.search(r"⚠ No speedup shown: .* the machine's load changed between this run and its baseline", out[1])
    assert said or declined, out[1]
    plain = client.predict(*run_args("autoregressive"), api_name="/run_controls")
    assert "**Autoregressive** (float32) finished" in plain[1]


def test_api_reports_invalid_settings_and_unavailable_modes(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="exceeds the engine"):
        client.predict(*run_args("lookahead", la_w=8), api_name="/run_controls")
    with pytest.raises(AppError, match="prompt is empty"):
        client.predict(*run_args("autoregressive", prompt="  "), api_name="/run_controls")
    assert client.predict(api_name="/stop") == "Nothing is running."
    assert client.predict(api_name="/compare_stop") == "Nothing is running."


def readme_example():
    """The README's "Use it from Python" code, exactly as printed (docs/ui.md shows the same)."""
    section = (ROOT / "README.md").read_text().split("## Use it from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_api_run_takes_one_request_object_as_the_readme_shows(app_url, capsys):
    code = readme_example()
    assert code in (ROOT / "docs" / "ui.md").read_text()
    assert code.count('"http://127.0.0.1:7860"') == 1
    scope = {}
    exec(code.replace('"http://127.0.0.1:7860"', repr(app_url)), scope)
    trace = scope["trace"]
    assert trace["text"].strip() and trace["text"] in capsys.readouterr().out
    assert trace["mode"] == "prompt_lookup" and trace["finish_reason"] in ("eos", "length")
    assert len(trace["token_ids"]) == sum(len(s["tokens"]) for s in trace["steps"]) == trace["totals"]["new_tokens"]
    assert trace["request"] == {k: v for k, v in scope["request"].items() if k != "prompt"}
    assert trace["prompt"] == scope["request"]["prompt"] and trace["dtype"] == "float32"


def test_api_run_with_prompt_lookup_settings_streams_and_commits_the_autoregressive_output(client):
    ngram = {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 1, "ngram_draft_lens": [],
             "max_candidates": 1}
    job = client.submit(request={"prompt": PROMPT, "speculative_config": ngram, "max_new_tokens": 48}, api_name="/run")
    updates = list(job)
    trace = job.result()
    assert updates[-1] == trace and trace["finish_reason"] in ("eos", "length")
    assert trace["request"]["speculative_config"] == ngram
    # Its settings held: drafts of at most 3 tokens after a 1-token match; the repeated list made some accepted.
    drafts = [s for s in trace["steps"] if s["proposed"]["tokens"]]
    assert drafts and all(len(s["proposed"]["tokens"]) <= 3 and len(s["source"]["match"]["ngram"]) == 1 for s in drafts)
    assert trace["totals"]["accepted"] >= 1 and trace["totals"]["tokens_per_step"] > 1
    # Greedy in float32: the tokens of plain decoding (a request without a config is autoregressive).
    plain = client.predict(request={"prompt": PROMPT, "max_new_tokens": 48}, api_name="/run")
    assert plain["mode"] == "autoregressive" and plain["totals"]["drafted"] == 0
    assert trace["token_ids"] == plain["token_ids"] and trace["text"] == plain["text"]


def test_api_run_refuses_a_bad_request_in_words(client):
    from gradio_client.exceptions import AppError

    for request, words in (
        ({"prompt": "Hi", "speculative_config": {"decoding_type": "Warp"}}, "expected tags: 'Autoregressive', 'Draft_Target', 'NGram'"),
        ({"prompt": "Hi", "mode": "eagle"}, "speculative_config.decoding_type (Autoregressive = autoregressive"),
        ({"prompt": "Hi", "max_tokens": 8}, "max_tokens: Extra inputs are not permitted"),
        ({"prompt": "Hi", "sampling": {"temperature": -1}}, "temperature must be a number in [0, 100]"),
        ({"prompt": "Hi", "max_new_tokens": 4096}, "max_new_tokens is limited to 1024 here"),
        ({"prompt": "  "}, "the prompt is empty"),
        ({"prompt": "word " * 14_000}, "this server takes at most"),
        ({"max_new_tokens": 8}, "request.prompt must be text"),
        (["Hi"], "request must be an object"),
    ):
        with pytest.raises(AppError, match=re.escape(words)):
            client.predict(request=request, api_name="/run")


def test_api_run_is_the_sessions_run_and_stop_cancels_it(client):
    request = {"prompt": "Write a very long story about a dragon.", "max_new_tokens": 400}
    job = client.submit(request=request, api_name="/run")
    for update in job:
        if len(update["steps"]) >= 3:
            break
    client.predict(api_name="/stop")  # it answers nothing: the run's own last line says it stopped
    trace = job.result()
    assert trace["finish_reason"] == "cancelled" and 3 <= len(trace["steps"]) < 400


def test_api_replays_a_trace_file_at_once_and_refuses_other_files(client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    recording = RACED
    trace = json.loads(recording.read_text())
    view, status, *_ = client.predict(handle_file(str(recording)), False, api_name="/replay")
    assert "Replayed a recording" in status and label(trace["mode"]) in status
    assert "a step costing" in status  # the recording carries the baseline it raced
    committed = re.findall(r'<span class="tok [^"]*\btok-(?:accepted|added)\b[^"]*" data-tok="(\d+)"', view)
    assert view.count('data-step="') == len(trace["steps"]) and list(map(int, committed)) == trace["token_ids"]
    detail = client.predict(3, api_name="/inspect")[0]  # the replayed run is the session's run: its steps inspect
    assert "Step 3" in detail
    for content, words in (('{"hello": 1}', "not a SpecDec trace"), ("[1, 2", "not JSON"),
                           (json.dumps({**trace, "steps": trace["steps"][1:]}), "does not start with its prefill")):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(AppError, match=words):
            client.predict(handle_file(str(bad)), False, api_name="/replay")


def test_api_replay_reads_uploaded_files_only(app_url):
    """A payload naming a file on the server (a valid trace, not uploaded) is refused before the app sees it;
    gradio_client would upload a local path, so this speaks the HTTP API directly."""
    url = app_url + "/gradio_api/call/replay"
    body = json.dumps({"data": [{"path": str(RECORDINGS[0]), "meta": {"_type": "gradio.FileData"}}, False]}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    event = json.load(urllib.request.urlopen(request, timeout=10))["event_id"]
    with urllib.request.urlopen(f"{url}/{event}", timeout=30) as f:
        stream = f.read().decode()
    assert stream.startswith("event: error") and "Replayed" not in stream and "data-step" not in stream


def test_api_compare_runs_every_chosen_mode_against_autoregressive(client):
    table, race, bars, tau, status = client.predict(PROMPT, ["prompt_lookup", "medusa", "eagle+prompt_lookup"], 24, "auto",
                                                    "defaults", api_name="/compare")
    assert "Done" in status and "in float32" in status
    for name in ("Autoregressive", "Prompt lookup", "Medusa", "EAGLE + prompt lookup"):
        assert name in table
    assert table.count("identical-yes") == 3  # every speculative mode reproduces the greedy output
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr")[2:]]
    costs = [cells[4] for cells in rows]  # step time in autoregressive steps (speedup ≈ τ ÷ it)
    assert len(costs) == 4 and costs[0] == "–" and all(float(c) > 0 for c in costs[1:]), costs
    # Each mode a point at (its step time, its τ), autoregressive at (1, 1); the rays are the iso-speedup lines.
    points = {t["name"]: (t["x"][0], t["y"][0]) for t in json.loads(tau["plot"])["data"] if t.get("name")}
    assert set(points) == {"Autoregressive", "Prompt lookup", "Medusa", "EAGLE + prompt lookup"}
    assert points["Autoregressive"] == (1.0, 1.0)
    assert points["Medusa"][0] == pytest.approx(float(costs[2]), abs=0.006)
    # The race again, side by side on one clock: the session kept the runs; the final frame has every curve.
    replay = client.submit(api_name="/compare_replay")
    frames = list(replay)
    race, status = replay.result()
    assert "Replayed the race" in status and len(frames) >= 2
    final = json.loads(race["plot"])
    assert sorted(t["name"] for t in final["data"]) == sorted(
        ["Autoregressive", "Prompt lookup", "Medusa", "EAGLE + prompt lookup"])
    assert all(len(t["x"]) >= 2 for t in final["data"])
    assert race["type"] == "plotly" and bars["type"] == "plotly"
    assert "EAGLE + prompt lookup" in json.dumps(race)  # a curve of its own in the race


def test_api_pass_cost_measures_both_dtypes_with_the_prompt_as_context(client):
    figure, note = client.predict(PROMPT, api_name="/pass_cost")
    assert figure["type"] == "plotly"
    names = [t["name"] for t in json.loads(figure["plot"])["data"]]
    assert names == ["float32", "bfloat16"]
    # Timed on the pass runs use: the server runs eagerly (--eager in tests).
    assert "**float32** (eager pass (--eager)): one-token pass" in note and "**bfloat16** (eager pass (--eager)): one-token pass" in note
    assert "32 tokens" in note


def test_api_train_keeps_a_run_that_the_run_tab_then_decodes_with(client):
    from app.ui.train_tab import FIELDS

    values = {"kind": "eagle", "init_from": "shipped", "data_source": "sharegpt", "data_offset": 40, "data_limit": 8,
              "epochs": 1, "lr": 0, "eval_prompts": 1, "medusa_num_heads": 4, "medusa_num_layers": 1, "eagle_steps": 1, "eagle3": False,
              "max_len": 64, "answer_tokens": 256, "dtype": "float32"}
    assert client.predict(api_name="/train_stop") == "No training run of yours is under way."
    job = client.submit(*[values[k] for k in FIELDS], api_name="/train")
    updates = list(job)
    status, loss, table, check, start, medusa, eagle = job.result()
    assert status.startswith("✓ **EAGLE module** `trained:") and "on 1 Spec-Bench prompts" in status, status
    assert len(updates) >= 2 and any("▶ Step" in u[0] for u in updates[:-1])  # it said where it was while it ran
    name = status.split("`")[1]
    assert name in json.dumps(table) and "this exact run is done" in check
    assert [t["name"] for t in json.loads(loss["plot"])["data"]] == ["Training: per step", "mean of the last 10"]
    assert name in json.dumps(eagle) and name not in json.dumps(medusa)  # offered where it fits
    assert name in json.dumps(start)  # and as a start for the next run of its kind
    view, run_status, *_ = client.predict(*run_args("eagle", eg_model=name), api_name="/run_controls")
    assert "EAGLE** (float32) finished" in run_status and "tok-accepted" in view
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="data_limit must be in"):
        client.predict(*[{**values, "data_limit": 2}[k] for k in FIELDS], api_name="/train")
    # It went on from the shipped module, EAGLE-3 (the checkbox is for a start from scratch): the export is the
    # checkpoint vLLM loads as eagle3, zipped for download.
    with zipfile.ZipFile(client.predict(name, api_name="/train_export")["path"]) as z:  # a File's data
        (config,) = [n for n in z.namelist() if n.endswith("/config.json")]
        assert json.loads(z.read(config))["architectures"] == ["LlamaForCausalLMEagle3"]
        assert any(n.endswith("/model.safetensors") for n in z.namelist())
    with pytest.raises(AppError, match="no finished training run"):
        client.predict("trained:0123456789abcdef", api_name="/train_export")


def test_api_engines_plan_build_and_remove(client):
    args = run_args("lookahead")[1:2] + run_args("lookahead")[3:]
    plan = json.loads(client.predict(*args, api_name="/engine_plan"))
    assert plan["backend"] == "transformers" and plan["model"] == "smollm2-135m-instruct"
    status, table, ids = client.predict(*args, api_name="/engine_build")
    assert "ready" in status, status
    build_id = status.split("`")[1]
    assert build_id in json.dumps(table)  # the table lists it
    status, _, _ = client.predict(build_id, api_name="/engine_stop")
    assert "only a vLLM engine or a TensorRT-LLM worker has a server to stop" in status, status
    status, table, _ = client.predict(build_id, api_name="/engine_remove")
    assert "Removed" in status and build_id not in json.dumps(table)
    for name in ("../../etc", build_id):  # only what the menu would list can be named: a path, a removed build
        status, _, _ = client.predict(name, api_name="/engine_remove")
        assert "is not a build you may remove here" in status, status


# ----------------------------------------------------------------------------- in a real browser


def test_page_names_every_mode_and_says_why_a_backend_is_unavailable(page):
    # Drawn after the Run button (the page fixture's sign), later still on a loaded machine.
    for name in ("Autoregressive", "Draft-target", "Prompt lookup", "Lookahead", "Medusa", "EAGLE", "Suffix"):
        expect(page.get_by_label(name, exact=True)).to_have_count(1, timeout=60_000)
    page.wait_for_function("/✓ Suffix/.test(document.querySelector('#modes-note').innerText)", timeout=60_000)
    assert page.inner_text("#modes-note").count("✓") == 7  # all seven run on the bundled model here
    assert "TensorRT-LLM needs an NVIDIA GPU: see docs/tensorrt-llm.md" in page.inner_text("body")
    assert "smollm2-135m-instruct (float32)" in page.inner_text("body")  # the model and the dtype it runs in
    # Every chart of the Run tab is on the page, empty, before anything runs (Plotly loads before the first run).
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 6")
    assert page.locator("#race .scatterlayer .trace").count() == 0
    page.locator("#dtype").get_by_label("bfloat16", exact=True).check()
    page.wait_for_function("/greedy outputs can part/.test(document.querySelector('#check').innerText)")
    # Switching the backend to one that cannot run here says why, mode by mode.
    page.locator("#backend input").click()
    page.get_by_role("option", name="tensorrt_llm (unavailable)").click()
    page.wait_for_function("/✗ Draft-target/.test(document.querySelector('#modes-note').innerText)")
    assert "needs an NVIDIA GPU: see docs/tensorrt-llm.md" in page.inner_text("#modes-note")


def test_browser_examples_fill_the_prompt_of_each_tab(page):
    from app.prompts import load_prompts

    summarization = next(r["text"] for r in load_prompts(None, ["summarization"], 1))
    for tab, menu, box in (("Run", "#examples", "#prompt"), ("Compare", "#cmp-examples", "#cmp-prompt")):
        page.get_by_role("tab", name=tab).click()
        assert page.input_value(f"{box} textarea") != summarization
        page.locator(f"{menu} input").click()
        page.get_by_role("option", name=re.compile(r"^summarization: ")).click()
        page.wait_for_function("([box, text]) => document.querySelector(box + ' textarea').value === text",
                               arg=[box, summarization])


def test_browser_compare_button_is_in_the_first_screenful_and_the_menus_name_their_example(page):
    """Issue 59.7: at 1440 × 900 Compare's button was below the fold (under every mode's box), and an examples menu
    stayed blank while its box held one of its examples (Compare's on a fresh page; the Run tab's counter-example)."""
    page.set_viewport_size({"width": 1440, "height": 900})
    page.click("#counter-example")
    page.wait_for_function("/^writing: Compose an engaging travel blog/.test(document.querySelector('#examples input').value)")
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#compare-run", state="visible")
    assert 0 < page.eval_on_selector("#compare-run", "e => e.getBoundingClientRect().bottom") <= 900
    assert page.input_value("#cmp-examples input").startswith("writing: Compose an engaging travel blog")


def test_browser_the_first_screen_asks_to_press_run_for_the_mode_already_picked(page):
    """Issue 59: the first screen said "Pick a mode and press Run." while a mode was already picked. On a fresh page at
    1280 × 720 a mode is ticked and the status, in the first screenful, asks only to press Run."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.reload()
    page.wait_for_selector("#status", state="visible")
    picked = page.eval_on_selector_all("#mode input[type=radio]:checked", "es => es.map(e => e.value)")
    assert len(picked) == 1, picked
    # The page's load event draws into the status with Gradio's tracker (its timer, "0.1s", in an element whose class
    # changed between releases) before its words settle: wait for the words, then read whatever is there.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # On a loaded machine the page's opening steps wait for the CPU, and Gradio's tracker shows its timer the while.
    words = ("() => { const s = document.querySelector('#status'); "
             "return s.innerText.trim().startsWith('Press Run') && !s.querySelector('.progress-text'); }")
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(words, timeout=120_000)
    status = re.sub(r"^\d+(\.\d+)?s\s*", "", page.inner_text("#status").strip())  # a timer still there is Gradio's
    assert status.startswith("Press Run to race the chosen mode against autoregressive decoding"), status
    assert "pick a mode" not in status.lower(), status
    assert 0 < page.eval_on_selector("#status", "e => e.getBoundingClientRect().bottom") <= 720


# The modes with a panel of their own, and the one without drafts. Every mode's run goes through the API test above
# and every mode's step view through the tour (test_lecture.py); lookahead's and suffix's panels through its recordings.
@pytest.mark.parametrize("mode", ["prompt_lookup", "medusa", "eagle", "draft_target", "autoregressive"])
def test_browser_runs_a_mode_and_shows_steps_and_charts(page, mode, screenshot):

    page.get_by_label(label(mode), exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(mode == "prompt_lookup")
    page.click("#run")
    status = wait_status(page, "finished")
    assert label(mode) in status
    view = page.locator("#step-view")
    assert view.locator(".tok-added").count() >= 1
    assert view.locator(".step").count() == view.locator(".tok-added").count() + view.locator(".step:not(:has(.tok-added))").count()
    if mode != "autoregressive":
        assert view.locator(".tok-accepted").count() + view.locator(".tok-rejected").count() >= 1
    assert view.locator(".legend").count() == 1
    # The charts were drawn empty at load; now they hold the run: a bar per step, a curve in the race.
    page.wait_for_function("document.querySelectorAll('#tokens-per-step .bars .point').length >= 1")
    assert page.locator("#race .scatterlayer .trace").count() >= 1
    assert page.locator("#step-detail").inner_text().strip() != ""
    if mode != "autoregressive":  # a bar per draft depth reached, labelled accepted/offered (Plotly draws it after the status)
        page.wait_for_function("document.querySelectorAll('#acceptance-depth .bars .point').length >= 1")
        assert re.fullmatch(r"\d+/\d+", page.locator("#acceptance-depth .bartext").first.text_content())
    if mode == "prompt_lookup":
        assert sorted(page.locator("#race .legendtext").all_text_contents()) == ["Autoregressive", "Prompt lookup"]
        # The look comes from the page's stylesheet (given once at launch), not from a <style> in each fragment.
        assert view.locator("style").count() == 0
        assert page.eval_on_selector("#step-view .tok-added", "e => getComputedStyle(e).borderRadius") == "3px"
        if view.locator(".tok-accepted").count():
            assert page.eval_on_selector("#step-view .tok-accepted", "e => getComputedStyle(e).borderBottomWidth") == "3px"
        screenshot("run")
    if mode in ("medusa", "eagle"):
        # Inspect the step that drafted the most: its tree is drawn node by node.
        drafted = page.eval_on_selector_all("#step-view .step", """steps => steps.map(s => [+s.dataset.step,
            s.querySelectorAll('.tok-accepted, .tok-rejected').length
            + (+(s.querySelector('.more-rejected')?.textContent || '0').replace('✗', ''))])""")
        step, most = max(drafted, key=lambda d: d[1])
        assert most >= 2, drafted
        inspect_step(page, step)
        assert page.locator("#step-detail .sd-tree svg").count() == 1
        assert page.locator("#step-detail .sd-tree svg g.node").count() == most
        target = page.locator("#step-detail .sd-target-table")
        assert target.locator("tr").count() >= 2 and target.locator(".weighed").count() >= 1
        assert "target p " in page.locator("#step-detail .sd-tree svg g.node title").first.text_content()
        screenshot(f"run-{mode}")
    if mode == "draft_target":
        assert page.locator("#step-detail .sd-probs").count() == 1  # the draft's tokens with their probabilities
    if mode == "suffix":  # a step that drafted: the recurring suffix, where it occurred and what followed it
        drafted = page.eval_on_selector_all("#step-view .step", "steps => steps.filter(s => s.querySelector("
                                            "'.tok-accepted, .tok-rejected')).map(s => +s.dataset.step)")
        inspect_step(page, drafted[0])
        page.wait_for_function("/Suffix decoding: the last/.test(document.querySelector('#step-detail').innerText)")
        assert "what followed it" in page.inner_text("#step-detail")


def test_browser_merge_box_shows_the_prompt_lookup_settings_and_runs(page):
    ngram = page.get_by_label("max_matching_ngram_size").first  # a setting of the Prompt lookup group
    page.get_by_label("EAGLE", exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    ngram.wait_for(state="hidden")
    page.locator("#eg-pl input").check()
    page.wait_for_function("/more from prompt lookup/.test(document.querySelector('#check').innerText)")
    ngram.wait_for(state="visible")  # the branch's settings
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(False)
    page.click("#run")
    wait_status(page, "finished")
    inspect_step(page, 1)
    assert "Merged with prompt lookup" in page.inner_text("#step-detail")
    page.get_by_label("Medusa", exact=True).check()  # the EAGLE box does not apply to Medusa
    page.wait_for_function("!/more from prompt lookup/.test(document.querySelector('#check').innerText)")
    ngram.wait_for(state="hidden")


def test_browser_settings_presets_and_the_trace_download(page):
    from app.service.api import Service

    fast_dtype = Service().fast_dtype()
    total = page.get_by_label("number input for total tokens (max_total_draft_tokens + 1)", exact=True)
    page.get_by_label("EAGLE", exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(False)
    assert total.input_value() == "12" and not page.locator("#download-trace").is_enabled()
    fastest = settings.preset("fastest here", fast_dtype)["eg_total"]
    assert fastest != 12, "the test needs a preset that moves the tree"
    page.click("#preset-fastest")
    page.wait_for_function(f"() => /verifies up to {fastest - 1} /.test(document.querySelector('#check').innerText)")
    assert total.input_value() == str(fastest)
    assert page.locator("#dtype").get_by_label(fast_dtype, exact=True).is_checked()
    page.click("#run")
    wait_status(page, "finished")
    assert f"({fast_dtype})" in page.inner_text("#status")
    with page.expect_download() as info:
        page.click("#download-trace")
    trace = json.loads(Path(info.value.path()).read_text())
    assert trace["mode"] == "eagle" and trace["dtype"] == fast_dtype
    assert trace["request"]["speculative_config"]["max_total_draft_tokens"] == fastest - 1
    assert len(trace["steps"]) == page.locator("#step-view .step").count()
    page.click("#preset-defaults")  # back: the small tree and the server's dtype
    page.wait_for_function("() => /verifies up to 11 /.test(document.querySelector('#check').innerText)")
    assert total.input_value() == "12" and page.locator("#dtype").get_by_label("auto", exact=True).is_checked()
    # The Compare tab's preset picks that dtype too.
    page.get_by_role("tab", name="Compare").click()
    page.locator("#cmp-preset").get_by_label("fastest here", exact=True).check()
    page.wait_for_function("dt => document.querySelector(`#cmp-dtype input[value='${dt}']`)?.checked", arg=fast_dtype)


def test_browser_a_preset_is_checked_once_with_all_its_values(page):
    """A preset sets many controls at once. The settings are checked once after, with every value set: a check
    per changed control went out with the values half set (the dtype not yet), and one answered last left a
    verdict on settings no longer shown (the presets test below failed that way under load)."""
    checks = []
    page.get_by_label("EAGLE", exact=True).check()
    page.wait_for_function("() => /verifies up to 11 /.test(document.querySelector('#check').innerText)")
    page.on("request", lambda r: checks.append(r.post_data) if '"transformers","' in (r.post_data or "") else None)
    verifies = f"verifies up to {settings.preset('fastest here', 'bfloat16')['eg_total'] - 1} "
    page.click("#preset-fastest")
    page.wait_for_function(f"() => /{verifies}/.test(document.querySelector('#check').innerText)")
    page.wait_for_timeout(1000)
    assert len(checks) == 1 and '"transformers","auto"]' not in checks[0]
    assert verifies in page.inner_text("#check")


def test_browser_shows_a_validation_error_before_anything_runs(page):
    page.get_by_label("Lookahead", exact=True).check()
    set_number(page, "w", 8)
    page.wait_for_function("/Invalid/.test(document.querySelector('#check').innerText)")
    assert "exceeds" in page.inner_text("#check")
    set_number(page, "w", 2)
    page.wait_for_function("/Valid/.test(document.querySelector('#check').innerText)")


def test_browser_stop_cancels_a_run(page):
    page.get_by_label("Autoregressive", exact=True).check()
    page.click("text=Sampling and length")
    set_number(page, "max_new_tokens", 400)
    page.fill("#prompt textarea", "Write a very long story about a dragon who learns to read.")
    page.click("#run")
    page.wait_for_function("document.querySelectorAll('#step-view .step').length >= 3", timeout=120_000)
    page.click("#stop")
    wait_status(page, "stopped")
    steps = page.locator("#step-view .step").count()
    assert 3 <= steps < 400


def test_browser_replays_a_recording_at_its_pace_with_its_settings(page, screenshot):
    recording = RACED
    trace = json.loads(recording.read_text())
    page.click("text=Replay a recorded run")
    page.locator("#recordings input").click()
    page.get_by_role("option", name=re.compile("^" + re.escape(label(trace["mode"])) + " · ")).first.click()
    # The step view's sizes as the page drew them: a loaded machine may read the page only after the replay ended.
    page.evaluate("""() => { window.stepCounts = [];
        new MutationObserver(() => window.stepCounts.push(document.querySelectorAll('#step-view .step').length))
            .observe(document.querySelector('#step-view'), {childList: true, subtree: true}); }""")
    page.click("#replay-recording")
    wait_status(page, "Replaying a recording", timeout=30_000)
    # The run and its baseline race on one clock.
    page.wait_for_function("document.querySelectorAll('#race .scatterlayer .trace').length == 2")
    screenshot("replay")
    status = wait_status(page, "Replayed a recording", timeout=60_000)
    # At its pace: the steps arrived over time, not all at once.
    assert any(0 < n < len(trace["steps"]) for n in page.evaluate("window.stepCounts"))
    assert label(trace["mode"]) in status and f"({trace['dtype']})" in status
    assert page.locator("#step-view .step").count() == len(trace["steps"])
    # The controls are the recording's now: pressing Run would run the same request here.
    assert page.input_value("#prompt textarea") == trace["prompt"]
    assert page.locator("#mode").get_by_label(label(trace["mode"]), exact=True).is_checked()
    assert page.locator("#dtype").get_by_label(trace["dtype"], exact=True).is_checked()
    expected = trace["request"]["speculative_config"].get("max_draft_len")
    if expected:
        assert re.search(rf"verifies up to {expected} ", page.inner_text("#check"))
    # And what the settings decide is shown with them: the mode's group of controls.
    setting = {"eagle": "depth (num_eagle_layers)", "prompt_lookup": "max_matching_ngram_size", "lookahead": "max_window_size W"}
    assert page.get_by_label(setting[trace["mode"]]).first.is_visible()


def test_browser_replays_an_uploaded_trace_stop_skips_to_its_end_and_bad_files_say_why(page, tmp_path):
    recording = RECORDINGS[-1]
    steps = len(json.loads(recording.read_text())["steps"])
    page.click("text=Replay a recorded run")
    with page.expect_file_chooser() as chooser:
        page.click("#replay-upload")
    chooser.value.set_files(str(recording))
    wait_status(page, "Replaying a recording", timeout=30_000)
    # Stop's own answer, held back until the replay has said it skipped, must not overwrite that.
    held = []

    def hold(route):
        if '"data":[]' in (route.request.post_data or ""):
            held.append((route, route.fetch()))
        else:
            route.continue_()

    page.route("**/gradio_api/**", hold)
    page.click("#stop")
    wait_status(page, "Skipped to the end of the recording", timeout=30_000)
    assert len(held) == 1
    route, response = held[0]
    route.fulfill(response=response)
    page.wait_for_timeout(1000)
    assert "Skipped to the end of the recording" in page.inner_text("#status")
    page.unroute("**/gradio_api/**")
    assert page.locator("#step-view .step").count() == steps
    bad = tmp_path / "notes.json"
    bad.write_text('{"steps": "none"}')
    with page.expect_file_chooser() as chooser:
        page.click("#replay-upload")
    chooser.value.set_files(str(bad))
    page.wait_for_selector("text=cannot replay this file", timeout=30_000)
    assert page.locator("#step-view .step").count() == steps  # what was shown stays


def test_browser_load_tab_replays_a_downloaded_sweep_and_refuses_other_files(page, tmp_path):
    """A sweep downloaded from the Load tab (here: a shipped one) uploaded again replays like a shipped recording,
    with no engine; a file that is not a sweep gets a worded refusal and leaves the chart as it was."""
    from app.ui import load_tab

    shipped = load_tab.RECORDINGS_DIR / f"{load_tab.RECORDINGS[0]}.json"
    page.get_by_role("tab", name="Load").click()
    with page.expect_file_chooser() as chooser:
        page.click("#load-upload")
    chooser.value.set_files(str(shipped))
    page.wait_for_function("/Replayed the uploaded sweep/.test(document.querySelector('#load-status').innerText)",
                           timeout=60_000)
    assert "per request" in page.inner_text("#load-note") and page.locator("#load-table tr").count() >= 3
    legend = page.locator("#load-plot .legendtext").all_text_contents()
    assert {"per request", "total throughput", "τ"} <= set(legend), legend
    bad = tmp_path / "trace.json"
    bad.write_text(json.dumps({"steps": []}))
    with page.expect_file_chooser() as chooser:
        page.click("#load-upload")
    chooser.value.set_files(str(bad))
    page.wait_for_selector("text=not a recorded load sweep", timeout=30_000)
    assert page.locator("#load-plot .legendtext").all_text_contents() == legend  # what was shown stays


def test_browser_compare_tab_and_screenshots_of_every_tab(page, screenshot):
    page.get_by_role("tab", name="Compare").click()
    page.fill("#cmp-prompt textarea", PROMPT)
    page.click("#compare-run")
    page.wait_for_function("/Done/.test(document.querySelector('#cmp-status').innerText)", timeout=240_000)
    table = page.inner_text("#cmp-table")
    assert "Prompt lookup" in table and "Lookahead" in table and "✓" in table
    page.wait_for_function("document.querySelectorAll('#cmp-speedup .bars .point').length >= 3")
    # A row whose step time the machine's load made doubtful is not drawn but named on the chart with its reason (the
    # rule's sentence, one per mode); with fewer than two points to draw, the chart is those sentences alone.
    page.wait_for_function("""() => {
        const drawn = document.querySelectorAll('#cmp-tau-cost .scatterlayer .trace .point').length;
        const note = [...document.querySelectorAll('#cmp-tau-cost .annotation-text')].map(a => a.textContent).join(' ');
        const named = (note.match(/No speedup shown:/g) || []).length;
        return drawn + named >= 3 || (drawn === 0 && named >= 2);
    }""")
    screenshot("compare")
    page.get_by_role("tab", name="Learn").click()
    page.wait_for_selector("#learn-tree svg")
    # One line per drafted length the curve kept: a width timed under other load than the one-token pass is left out
    # of it, saying so in the curve's note (runner.verify_cost). A curve whose every width was left out says "measure
    # again", and a user would: once.
    before = ""
    for _ in range(2):
        page.click("#cost-run")
        page.wait_for_function("b => { const t = document.querySelector('#cost-note').innerText; "
                               "return /bfloat16.*one-token pass/.test(t) && t !== b; }", arg=before, timeout=120_000)
        assert page.locator("#cost-plot .scatterlayer .trace").count() == 2
        # What speculation can earn on that curve: one line per drafted length, and the break-even rates (or, when the
        # test machine's load bent the curve, why there are none: tests/ui/test_ui_charts.py checks both texts).
        page.wait_for_function("/needs α ≥|No speedup shown/.test(document.querySelector('#earn-note').innerText)")
        before, free = page.inner_text("#cost-note"), page.inner_text("#earn-note")
        lengths = len(re.findall(r"\d+ tokens? (?:needs α|never pays)", free))
        assert page.locator("#earn-plot .scatterlayer .trace").count() == lengths
        assert lengths in (0, 4) or "of the CPU it asked for" in before, (free, before)  # 0: withheld, measure again
        if lengths:
            break
    if lengths:
        assert free.startswith("bfloat16, a draft costing 0.00") or free.startswith("float32, a draft costing 0.00"), free
        number = page.locator("#draft-cost input[type=number]")
        number.fill("0.3")
        number.press("Enter")
        page.wait_for_function("/costing 0.30/.test(document.querySelector('#earn-note').innerText)")
        assert page.inner_text("#earn-note") != free
    else:  # twice under other load than its one-token pass: the rule's sentence (for the curve, or each width), no line
        assert free.startswith(("bfloat16: No speedup shown:", "float32: No speedup shown:")) and free.endswith(
            "measure again."), free
    screenshot("learn")
    page.get_by_role("tab", name="Engines").click()
    page.wait_for_selector("#eng-table")
    screenshot("engines")


def test_browser_trains_heads_then_runs_with_them(page, screenshot):
    """The seed workflow in the browser: train Medusa heads (a tiny slice of ShareGPT's answers), watch the loss,
    pick the run in the Run tab, decode with it; Stop ends a run that is under way."""
    page.get_by_role("tab", name="Train").click()
    page.get_by_label("Medusa heads", exact=True).check()
    page.locator("#tr-start input").click()
    page.get_by_role("option", name="from scratch", exact=True).click()  # new heads: the loss falls steeply
    page.get_by_label("ShareGPT's answers", exact=True).check()
    for name, value in (("first ShareGPT conversation (data_offset)", "60"), ("conversations (data_limit)", "32"),
                        ("epochs", "2")):
        page.get_by_label(name).fill(value)
    page.click("text=Architecture (from scratch) and data details")
    page.get_by_label("tokens kept per conversation (max_len)").fill("64")
    set_number(page, "Spec-Bench prompts for the τ check (eval_prompts)", 1)
    page.wait_for_function("/Valid · the answers for this slice are at hand/.test(document.querySelector('#tr-check').innerText)")
    page.click("#tr-run")
    page.wait_for_function("/^✓ Medusa heads/.test(document.querySelector('#tr-status').innerText)", timeout=180_000)
    status = page.inner_text("#tr-status")
    assert "on 1 Spec-Bench prompts" in status and "heads it started from" not in status, status
    name = re.search(r"trained:[0-9a-f]{16}", status).group(0)
    page.wait_for_function("document.querySelectorAll('#tr-loss .scatterlayer .trace').length == 2")
    assert name in page.inner_text("#tr-table")
    screenshot("train")
    # A row of the table shows that run again; the next Medusa run may go on from it.
    page.locator("#tr-table [data-testid^='cell-'][data-testid$='-0']", has_text=name).click()
    page.wait_for_function(f"document.querySelector('#tr-status').innerText.includes('{name}')")
    page.locator("#tr-start input").click()
    assert page.get_by_role("option", name=re.compile("^go on from trained " + name[8:16])).count() == 1
    page.keyboard.press("Escape")
    # The Run tab offers it under Medusa's heads (and only there), and decodes with it.
    page.get_by_role("tab", name="Run").click()
    page.get_by_label("Medusa", exact=True).check()
    page.locator("#md-model input").click()
    page.get_by_role("option", name=re.compile("^trained " + name[8:16])).click()
    page.wait_for_function("/✓ Valid/.test(document.querySelector('#check').innerText)")
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(False)
    page.click("#run")
    assert "Medusa" in wait_status(page, "finished")
    page.get_by_label("EAGLE", exact=True).check()
    page.locator("#eg-model input").click()
    assert not page.get_by_role("option", name=re.compile("^trained " + name[8:16])).count()
    page.keyboard.press("Escape")
    # A run under way stops on Stop, and says so.
    page.get_by_role("tab", name="Train").click()
    page.get_by_label("epochs").fill("8")
    page.click("#tr-run")
    page.wait_for_function("/▶ Step/.test(document.querySelector('#tr-status').innerText)", timeout=60_000)
    page.click("#tr-stop")
    page.wait_for_function("/■ Stopped/.test(document.querySelector('#tr-status').innerText)", timeout=60_000)


def test_browser_run_updates_do_not_call_inspect(page):
    """The step slider moves with every redraw of a run; only the user's moves may ask the server
    for a step (a late answer computed from the run before would overwrite the run's own step view)."""
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.post_data or "") if r.method == "POST" else None)
    page.get_by_label("Prompt lookup", exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    page.get_by_label("Race against autoregressive (its baseline measured beside it, under the same load)").set_checked(False)
    page.click("#run")
    wait_status(page, "finished")
    fn = page.evaluate("() => window.gradio_config.dependencies.find(d => d.api_name === 'inspect').id")
    calls = lambda: sum(f'"fn_index":{fn}' in p.replace(" ", "") for p in posts)
    assert calls() == 0
    assert page.locator("#step-detail").inner_text().strip() != ""
    inspect_step(page, 1)
    assert calls() >= 1


AXE = ROOT / ".node" / "node_modules" / "axe-core" / "axe.min.js"
# axe-core's WCAG checks on the whole page; what a test fails on: serious and critical violations, each with a few nodes.
AXE_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => `${v.id} (${v.impact}): ${v.help}: ` + v.nodes.slice(0, 3).map(n => n.html.slice(0, 160)).join(" | "));
}"""


def test_browser_every_tab_has_no_serious_accessibility_violation(page):
    """axe-core on every tab: the Run tab with a replayed run on it (tokens, legend, step view, charts), then each other
    tab as it opens. Gradio's default contrast (white on orange buttons, pale secondary text) failed it."""
    if not AXE.exists():
        pytest.fail("axe-core is missing: scripts/test.sh installs it (npm) into .node/")
    page.locator("#replay").click()
    page.locator("#replay-paced input").uncheck()
    page.click("#tour")
    wait_status(page, "Replayed a recording")

    def violations() -> list[str]:
        if not page.evaluate("() => !!window.axe"):
            page.add_script_tag(path=str(AXE))
        return page.evaluate(AXE_RUN)

    found = {"Run": violations()}
    for tab, shown in (("Compare", "#cmp-prompt"), ("Load", "#load-run"), ("Train", "#tr-run"), ("Learn", "#draft-cost"),
                       ("Engines", "#eng-build")):
        page.get_by_role("tab", name=tab).click()
        page.wait_for_selector(shown, state="visible")
        found[tab] = violations()
    assert found == {tab: [] for tab in found}


# Every drawn chart's texts (titles, ticks, labels, legend, notes) inside its SVG, and no legend over its plot area.
CLIPPED = """() => {
  const found = [];
  const inside = (r, box) => r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
  for (const plot of document.querySelectorAll(".js-plotly-plot")) {
    if (!plot.offsetParent) continue;  // on a tab not shown
    const id = plot.closest("[id]")?.id, box = plot.querySelector("svg.main-svg").getBoundingClientRect();
    for (const text of plot.querySelectorAll("svg text")) {
      const r = text.getBoundingClientRect();
      if (text.textContent.trim() && r.width && !inside(r, box)) found.push(`${id}: "${text.textContent}" cut`);
    }
    const legend = plot.querySelector("g.legend")?.getBoundingClientRect();
    for (const area of plot.querySelectorAll("rect.nsewdrag")) {
      const a = area.getBoundingClientRect();
      if (legend && legend.width && legend.left < a.right - 1 && legend.right > a.left + 1 && legend.top < a.bottom - 1
          && legend.bottom > a.top + 1) found.push(`${id}: legend over the plot`);
    }
  }
  return found;
}"""


def test_browser_no_chart_clips_its_text_at_1280_px_even_comparing_every_mode(page):
    """At 1280 × 720: the Run tab's charts with a replayed run, Compare's before anything ran (their notes were cut at
    both ends) and after comparing every mode the transformers backend runs (vertical bars cut their names, a legend
    of every mode covered the race)."""
    page.set_viewport_size({"width": 1280, "height": 720})
    page.locator("#replay").click()
    page.locator("#replay-paced input").uncheck()
    page.click("#tour")
    wait_status(page, "Replayed a recording")
    page.wait_for_function("document.querySelectorAll('#race .scatterlayer .trace').length >= 1")
    assert page.evaluate(CLIPPED) == []
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#cmp-race .main-svg", state="visible")
    assert page.evaluate(CLIPPED) == []
    for box in page.locator("#cmp-modes label").all():
        if "vLLM" not in box.inner_text():
            box.locator("input").check()
    checked = page.locator("#cmp-modes input:checked").count()
    assert checked >= 8
    tokens = page.locator("#cmp-tokens input[type=number]")
    tokens.fill("8")
    tokens.press("Enter")
    page.click("#compare-run")
    page.wait_for_function("/^Done/.test(document.querySelector('#cmp-status')?.innerText || '')", timeout=600_000)
    page.wait_for_function("n => document.querySelectorAll('#cmp-race .scatterlayer .trace').length === n", arg=checked + 1)
    assert page.evaluate(CLIPPED) == []
