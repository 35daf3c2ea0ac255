"""The vllm backend against real vLLM servers (vLLM for CPU in .venv-vllm, started by the tests on loopback).

The engines (autoregressive, ngram, draft_model; float32, --enforce-eager so each starts in about a
minute) are started once for this module in a store of its own and shared by its tests, which run
in one pytest-xdist worker (scripts/test.sh distributes by file). Nothing here is mocked: every step comes from vLLM's stream,
every counter from its /metrics.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from app import models
from app.service import vllm
from app.service.api import Service
from app.service.backends import remote
from app.service.backends.base import Prompt
from app.service.jobs import Limits
from app.service.traces import Recording
from helpers import free_port, running_server, eager
from test_web import ARTIFACTS, browser, set_number, wait_status  # noqa: F401  (browser is a fixture)

pytestmark = [pytest.mark.bundled, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent
COPY = ("Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes, kiwis, grapes, lemons, "
        "melons, peaches, cherries.")
PROMPTS = [COPY, "Write a short poem about the sea.", "Explain what a hash table is in two sentences."]
NGRAM = {"decoding_type": "NGram", "max_draft_len": 10, "max_matching_ngram_size": 2}
DRAFT = {"decoding_type": "Draft_Target", "max_draft_len": 4}
MEDUSA = {"decoding_type": "Medusa"}
SUFFIX = {"decoding_type": "Suffix", "max_draft_len": 16}
AR = {"decoding_type": "Autoregressive"}
SETTINGS = vllm.Settings(enforce_eager=True)


def request(spec: dict, max_new_tokens: int = 48, **sampling) -> dict:
    return {"speculative_config": spec, "backend": "vllm", "max_new_tokens": max_new_tokens,
            "sampling": {"temperature": 0.0, **sampling}}


def generate(service: Service, spec: dict, prompt: str, **kw) -> Recording:
    run = Recording(None)
    for message in service.stream(request(spec, **kw), prompt):
        run.add(message)
    assert run.end and not run.end.get("error"), run.end
    return run


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if vllm.unavailable(SETTINGS):
        pytest.fail(f"{vllm.unavailable(SETTINGS)}: scripts/test.sh installs it")
    engines = tmp_path_factory.mktemp("vllm") / "engines"
    engines.mkdir()
    models.locate(models.BUNDLED)  # the dequantized model, shared with the working tree's store
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    return engines


@pytest.fixture(scope="module")
def service(store):
    service = Service(store, vllm_settings=SETTINGS)
    yield service
    service.close()  # stops every engine it started
    assert not any(m.get("server", {}).get("state") == "running" for m in service.engine_list())


def cli(store: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *eager(args), "--engines-dir", str(store)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- engines in the store


def test_engine_starts_is_reused_and_listed(service, store):
    first = service.engine_build(request(NGRAM))
    assert first["kind"] == "vllm-server" and first["server"]["state"] == "running"
    assert first["spec"]["config"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10,
                                                            "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    url = first["server"]["url"]
    assert url.startswith("http://127.0.0.1:")
    again = service.engine_build(request(NGRAM))
    assert again["id"] == first["id"] and again["server"]["pid"] == first["server"]["pid"]
    listed = {m["id"]: m for m in service.engine_list()}
    assert listed[first["id"]]["server"]["state"] == "running"
    # Another process sees the same engine running (the store, not this process, knows it).
    out = cli(store, "engines", "list")
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith(first["id"]))
    assert "vllm" in line and "running" in line and url in line


def test_greedy_speculative_outputs_equal_vllm_autoregressive(service):
    """float32, greedy: every vLLM method gives vLLM's own autoregressive output token for token."""
    bases = {prompt: generate(service, AR, prompt, max_new_tokens=32) for prompt in PROMPTS}
    for spec, prompts in ((NGRAM, PROMPTS), (DRAFT, PROMPTS[1:]), (MEDUSA, PROMPTS[1:]), (SUFFIX, PROMPTS[:2])):
        for prompt in prompts:
            run = generate(service, spec, prompt, max_new_tokens=32)
            assert run.token_ids == bases[prompt].token_ids, (spec["decoding_type"], prompt)
            assert run.end["token_ids"] == run.token_ids
    # Memory for the suite's other worker; the draft_model engine stays up for the tests that kill and remove it,
    # the suffix engine for the next test.
    service.engine_stop(service.engine_spec(request(MEDUSA)).key())


def test_suffix_drafts_as_vllm_does(service):
    """The same algorithm on both sides (this app's drafter, vLLM's `suffix` with Arctic Inference's tree): on a
    copy-heavy prompt the outputs are the same and so, within 10 %, are the tokens each target pass commits."""
    theirs = generate(service, SUFFIX, COPY, max_new_tokens=64)
    ours = Recording(None)
    for message in service.stream({**request(SUFFIX, max_new_tokens=64), "backend": "transformers", "dtype": "float32"}, COPY):
        ours.add(message)
    assert ours.token_ids == theirs.token_ids
    tau = {name: len(run.token_ids) / len(run.events) for name, run in (("ours", ours), ("vllm", theirs))}
    assert tau["vllm"] > 1.5 and abs(tau["ours"] / tau["vllm"] - 1) <= 0.10, tau
    assert theirs.engine["speculative_config"]["method"] == "suffix"
    assert theirs.spec_decode["num_accepted_tokens"] >= sum(len(e["tokens"]) - 1 for e in theirs.events[1:])
    service.engine_stop(service.engine_spec(request(SUFFIX)).key())


def overfit_eagle3(directory: Path, sequence: list[int], steps: int = 120) -> Path:
    """An EAGLE-3 module (the captured layers 2, 15, 27 of the bundled model) trained in seconds on one float32
    sequence until it drafts that text well: a module whose drafts only land when an engine feeds it exactly the
    hidden states it learned from (the right layers, numbered as vLLM numbers them)."""
    from app.heads import eagle, vocab

    bundled = models.load(models.BUNDLED, dtype="float32")
    model = bundled.model
    ids = torch.tensor([sequence])
    with torch.no_grad():
        out = model.get_decoder()(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in (2, 15, 27)], -1)
    lm_head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    d2t = vocab.from_counts(torch.bincount(ids[0], minlength=lm_head.weight.shape[0]), 4096, include=bundled.eos_token_ids)
    config = eagle.EagleConfig.from_target(model.config, draft_vocab_size=4096, aux_layers=[2, 15, 27],
                                           lm_head_from_target=True, eagle3=True)
    torch.manual_seed(0)
    module = eagle.EagleModule(config, d2t)
    eagle.init_lm_head(module, lm_head)
    module.lm_head.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=2e-3)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for _ in range(steps):
        loss = eagle.eagle_loss(module, embed, lm_head, ids, out.last_hidden_state, mask, steps=3, aux=aux)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return eagle.save(module, directory, models.BUNDLED)


def test_an_eagle3_module_of_ours_drafts_in_vllm_as_in_our_loop(service, tmp_path):
    """vLLM's own eagle3 loader takes the module (exported on the way: app/heads/eagle.export_checkpoint), runs it
    as a chain of depth 3, and accepts what our loop accepts with the same chain: the same output, and the tokens
    per target pass within 10 %. A module fed other layers than it learned from would draft nothing useful."""
    ar = generate(service, AR, COPY, max_new_tokens=48)
    module = overfit_eagle3(tmp_path / "eagle3", ar.prompt_ids + ar.token_ids)
    spec = {"decoding_type": "Eagle", "use_dynamic_tree": False, "eagle_choices": [[0], [0, 0], [0, 0, 0]],
            "speculative_model": str(module)}
    theirs = generate(service, spec, COPY, max_new_tokens=48)
    ours = Recording(None)
    for message in service.stream({**request(spec, max_new_tokens=48), "backend": "transformers", "dtype": "float32"}, COPY):
        ours.add(message)
    assert theirs.token_ids == ar.token_ids == ours.token_ids
    assert theirs.engine["speculative_config"]["method"] == "eagle3"
    assert theirs.engine["speculative_config"]["num_speculative_tokens"] == 3
    tau = {name: len(run.token_ids) / len(run.events) for name, run in (("ours", ours), ("vllm", theirs))}
    assert tau["ours"] > 2.0 and abs(tau["ours"] / tau["vllm"] - 1) <= 0.10, tau
    service.engine_stop(service.engine_spec(request(spec)).key())


def test_ngram_steps_are_engine_steps_with_counters(service):
    run = generate(service, NGRAM, COPY, max_new_tokens=64)
    sizes = [len(e["tokens"]) for e in run.events]
    assert sum(sizes) == len(run.end["token_ids"]) >= 16
    assert max(sizes) > 1  # a copy-heavy prompt: at least one step accepted drafted tokens
    assert run.events[0]["kind"] == "prefill" and all(e["kind"] == "decode" for e in run.events[1:])
    assert all(e["accepted_tokens"] == e["tokens"][:-1] for e in run.events[1:])
    assert all(e["proposed"]["tokens"] == [] and e["source"]["engine"] == "vllm" for e in run.events)
    assert run.engine["speculative_config"]["method"] == "ngram" and run.engine["not_visible"]
    counters = run.spec_decode
    streamed = sum(len(e["tokens"]) - 1 for e in run.events[1:])
    assert counters["num_drafts"] >= 1 and counters["num_draft_tokens"] >= counters["num_accepted_tokens"]
    # vLLM counts what it accepted; the stream commits that (a last step may be cut by max_tokens).
    assert counters["num_accepted_tokens"] >= streamed
    assert sum(counters["accepted_per_pos"]) == counters["num_accepted_tokens"]
    assert len(counters["accepted_per_pos"]) == 10
    assert run.events[-1]["totals"]["accepted"] == counters["num_accepted_tokens"]
    # The counters are this request's alone: a second run adds its own, not the first one's again.
    again = generate(service, NGRAM, COPY, max_new_tokens=64)
    assert again.spec_decode == counters and again.token_ids == run.token_ids


def test_autoregressive_engine_has_no_counters(service):
    run = generate(service, AR, PROMPTS[1], max_new_tokens=16)
    assert [len(e["tokens"]) for e in run.events] == [1] * 16
    assert run.spec_decode is None and run.engine["not_visible"] == []
    assert all(e["added_kind"] == "next" for e in run.events)


def test_two_concurrent_requests_on_one_engine(store):
    service = Service(store, vllm_settings=SETTINGS, limits=Limits(max_concurrency=2))
    try:
        alone = [generate(service, NGRAM, p, max_new_tokens=32).token_ids for p in PROMPTS[:2]]
        results: dict[int, list[int]] = {}

        def one(i: int) -> None:
            results[i] = generate(service, NGRAM, PROMPTS[i], max_new_tokens=32).token_ids

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [results[0], results[1]] == alone
    finally:
        service.close(stop_engines=False)


def test_remote_backend_against_vllm(service):
    """The generic remote path, pointed at a vLLM server: the same tokens as the managed engine."""
    manifest = service.engine_build(request(NGRAM))
    other = Service(service.engines, backend="remote", remote_url=manifest["server"]["url"])
    try:
        run = Recording(None)
        for message in other.stream({"speculative_config": {"decoding_type": "Autoregressive"}, "max_new_tokens": 40},
                                     Prompt(COPY)):
            run.add(message)
        ours = generate(service, NGRAM, COPY, max_new_tokens=40)
        assert run.token_ids == ours.token_ids and run.prompt_ids == ours.prompt_ids
        assert run.texts[run.token_ids[0]] == ours.texts[ours.token_ids[0]]
        assert run.spec_decode and run.spec_decode["num_accepted_tokens"] == ours.spec_decode["num_accepted_tokens"]
    finally:
        other.close()


def test_generate_cli_json_contract(store):
    out = cli(store, "generate", "--backend", "vllm", "--vllm-eager", "--mode", "prompt_lookup",
              "--prompt-lookup-num-tokens", "10", "--max-matching-ngram-size", "2", "--max-new-tokens", "32",
              "--prompt", COPY, "--json")
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert 0 < sum(len(s["tokens"]) for s in trace["steps"]) == len(trace["token_ids"]) <= 32
    assert trace["engine"]["engine"] == "vllm" and trace["spec_decode"]["num_drafts"] >= 1
    # The engine it ran on keeps running for the next command (another process found it up and used it).
    assert any(m.get("server", {}).get("state") == "running" and m["spec"]["mode"] == "prompt_lookup"
               for m in Service(store, vllm_settings=SETTINGS).engine_list())


@pytest.fixture(scope="module")
def app_url(store, tmp_path_factory):
    """The web app on the same store: it finds this module's engines running and uses them."""
    tmp = tmp_path_factory.mktemp("gradio-vllm")
    env = {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp)}
    port = free_port()
    with running_server(["--port", str(port), "--engines-dir", str(store), "--vllm-eager"], "/gradio_api/info",
                        port, tmp / "app.log", env) as url:
        yield url


def test_browser_runs_prompt_lookup_on_vllm_racing_vllm_autoregressive(service, browser, app_url):
    service.engine_build(request(NGRAM))  # both engines up before the page asks (the race needs the autoregressive one)
    service.engine_build(request(AR))
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.locator("#backend input").click()
    page.get_by_role("option", name="vllm", exact=True).click()
    page.wait_for_function("/vLLM ngram/.test(document.querySelector('#check').innerText)")
    assert "its engine is running" in page.inner_text("#check")
    assert "no lookahead" in page.inner_text("#modes-note")
    page.get_by_label("Prompt lookup", exact=True).check()
    page.fill("#prompt textarea", COPY)
    page.get_by_label("Race against autoregressive (its baseline runs just before, under the same load)").set_checked(True)
    page.click("#run")
    # The race's last redraw ends the status with the speedup against the baseline (earlier ones already say finished).
    # Or, when the suite's other worker loaded the machine during one of the two runs only, why there is no ratio.
    status = wait_status(page, "autoregressive run's tokens/s|No speedup shown", timeout=300_000)
    assert "on vLLM 0.32" in status and "engine counters:" in status and "accepted by draft position" in status
    assert "finished" in status
    assert "no draft and verify times" in status or ("load changed" in status and "τ" in status), status
    view = page.locator("#step-view")
    assert view.locator(".tok-accepted").count() >= 1  # engine steps that committed accepted draft tokens
    assert view.locator(".tok-engine").count() + view.locator(".tok-bonus").count() >= 1
    assert view.locator(".tok-rejected").count() == 0  # vLLM does not show what it rejected: nothing is invented
    assert "does not say" in view.locator(".legend").inner_text()
    assert sorted(page.locator("#race .legendtext").all_text_contents()) == ["Autoregressive", "Prompt lookup"]
    page.wait_for_function("document.querySelectorAll('#acceptance-depth .bars .point').length >= 1")
    assert "engine's counters" in page.locator("#acceptance-depth .gtitle").text_content()
    set_number(page, "Inspect step", 2)
    page.wait_for_function("document.querySelector('#step-detail h4')?.innerText.startsWith('Step 2 ')")
    assert "does not expose" in page.inner_text("#step-detail")
    shots = ARTIFACTS / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "run-vllm.png"), full_page=True)
    assert not errors, errors
    context.close()


def test_compare_includes_vllm_rows(service, app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False, download_files=False)
    table, race, bars, tau, status = client.predict(
        COPY, ["prompt_lookup", "vllm:autoregressive", "vllm:prompt_lookup"], 32, "auto", "defaults", api_name="/compare")
    assert status.startswith("Done"), status
    for label in ("Autoregressive", "Prompt lookup", "Autoregressive on vLLM", "Prompt lookup on vLLM"):
        assert re.search(rf"<td>{re.escape(label)}( ★)?</td>", table), label
    names = {t.get("name") for t in json.loads(race["plot"])["data"]}
    assert {"Prompt lookup on vLLM", "Autoregressive on vLLM"} <= names


def test_killed_engine_reads_stopped_and_restarts(service):
    manifest = service.engine_build(request(DRAFT))
    pid = manifest["server"]["pid"]
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while service.engine_get(manifest["id"])["server"]["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    state = service.engine_get(manifest["id"])["server"]
    assert state["state"] == "stopped" and state["log_tail"].strip()  # the log's last lines, to say why
    run = generate(service, DRAFT, PROMPTS[2], max_new_tokens=16)  # the next request starts it again
    assert len(run.token_ids) == 16
    assert service.engine_get(manifest["id"])["server"]["pid"] != pid


def test_engines_rm_stops_and_removes(service, store):
    manifest = service.engine_build(request(DRAFT))
    out = cli(store, "engines", "rm", manifest["id"])
    assert out.returncode == 0, out.stderr
    assert service.engine_get(manifest["id"]) is None
    assert not vllm._group_alive(manifest["server"]["pid"])
    assert manifest["id"] not in cli(store, "engines", "list").stdout


# ----------------------------------------------------------------------------- no engine needed


def test_modes_without_a_vllm_counterpart_are_refused_in_words(service):
    for spec, words in (({"decoding_type": "Lookahead"}, "no lookahead"),
                        ({"decoding_type": "Eagle"}, "EAGLE-3"),
                        ({"decoding_type": "Medusa", "num_medusa_heads": 9}, "heads"),
                        ({"decoding_type": "Eagle", "prompt_lookup": {}}, "merging prompt lookup")):
        with pytest.raises(ValueError, match=words):
            service.engine_build(request(spec))
    modes = {m["mode"]: m for m in service.modes(backend="vllm")}
    assert modes["prompt_lookup"]["available"] and modes["draft_target"]["available"] and modes["medusa"]["available"]
    assert not modes["lookahead"]["available"] and "lookahead" in modes["lookahead"]["reason"]


def test_counter_parsing():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total x",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 104.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 11.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 5.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 99.0',
    ])
    after = remote.parse_counters(text, "m")
    assert after == {"num_drafts": 12.0, "num_draft_tokens": 104.0, "num_accepted_tokens": 11.0, "accepted_per_pos": [5.0, 3.0]}
    before = {"num_drafts": 2.0, "num_draft_tokens": 4.0, "num_accepted_tokens": 1.0, "accepted_per_pos": [1.0]}
    assert remote.counter_delta(before, after) == {"num_drafts": 10, "num_draft_tokens": 100, "num_accepted_tokens": 10,
                                                   "accepted_per_pos": [4, 3]}
    assert remote.parse_counters("vllm:num_requests_running 0", "m") == {}


class _Processes:
    """The process layer's interface, recording what the backend asks of it (the real one is tested above)."""

    def __init__(self):
        self.running, self.stopped, self.port = set(), [], 9000

    def state(self, build_id):
        return {"state": "running", "url": "u"} if build_id in self.running else {"state": "stopped"}

    def ensure(self, manifest, progress, cancel=None):
        fresh = manifest["id"] not in self.running
        self.running.add(manifest["id"])
        return "u", fresh

    def stop(self, build_id):
        self.stopped.append(build_id)
        self.running.discard(build_id)
        return True


def test_public_mode_bounds_the_engines_requests_start_and_stops_idle_ones(store):
    from app.service.backends.vllm import VLLMBackend
    from app.service.engines import EngineStore

    backend = VLLMBackend(EngineStore(store), settings=SETTINGS, max_started=1, idle_s=600)
    backend.processes = _Processes()
    parsed = Service(store, vllm_settings=SETTINGS)
    try:
        ngram, draft = parsed.request(request(NGRAM)), parsed.request(request(DRAFT))
    finally:
        parsed.close()
    backend.processes.running.add("operator's")  # an engine the operator started counts for nobody
    manifest, _ = backend.engine(models.BUNDLED, ngram)
    assert backend.started == {manifest["id"]}
    backend.engine(models.BUNDLED, ngram)  # the running one is reused, whoever asks
    with pytest.raises(ValueError, match="at most 1 vLLM engine"):
        backend.engine(models.BUNDLED, draft)
    now = time.monotonic()
    assert backend.reap(now + 599) == [] and backend.reap(now + 601) == [manifest["id"]]
    assert backend.processes.stopped == [manifest["id"]] and "operator's" in backend.processes.running
    backend.engine(models.BUNDLED, draft)  # a place is free again
    backend.stop_started()
