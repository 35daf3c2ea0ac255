"""TensorRT-LLM through the service where it has its own environment (issue 61): a request becomes the store's build
(the bundled model and draft prepared, by absolute path), then this project's worker started, reused, refused beside
another configuration, listed on the Engines tab and stopped; its steps and totals read from what the worker streams.
TensorRT-LLM is the stand-in (tests/stand_ins/tensorrt_llm) in a real worker process, run by the app's own interpreter
as tests/backends/on_tensorrt_llm/test_trtllm_engines.py runs it: nothing here runs TensorRT-LLM itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app import models
from app.modes import ConfigError
from app.backends.tensorrt_llm import processes as trtllm_processes
from app.service.api import Service
from app.backends.tensorrt_llm import backend as trt
from app.backends.tensorrt_llm.worker_backend import STARTED, TRTLLMEngineBackend
from app.backends.tensorrt_llm.backend import TensorRTLLMBackend
from app.ui import render
from helpers import STAND_INS, collect
from helpers_trtllm import IGNORE_PINS, _group_gone, kill_left

PREPARED = models.DEFAULT_ENGINES / "models"
DRAFT = f"{models.BUNDLED}-draft"
SETTINGS = trtllm_processes.Settings(python=Path(sys.executable), env={"PYTHONPATH": str(STAND_INS), IGNORE_PINS: "1"},
                                   start_timeout_s=60, stop_timeout_s=10)
DRAFT_TARGET = {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": DRAFT},
                "max_new_tokens": 7, "backend": "tensorrt_llm"}
NGRAM = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}, "max_new_tokens": 7, "backend": "tensorrt_llm"}
NOT_SET_UP = "needs an NVIDIA GPU: see docs/tensorrt-llm.md"


@pytest.fixture
def service(tmp_path):
    """A service whose TensorRT-LLM environment is the stand-in's (its interpreter is there, as .venv-trtllm's would
    be), in a store of its own sharing the checkout's prepared models; whatever a failed test left running is killed."""
    for name in (models.BUNDLED, DRAFT):  # prepared once in the checkout's store (a fresh clone's first test does it)
        models.locate(name)
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(PREPARED)
    s = Service(engines=engines, trtllm_settings=SETTINGS)
    yield s
    s.close()
    kill_left(engines / "builds")


def _worker(service: Service, build_id: str) -> dict:
    return json.loads((service.store.builds / build_id / trtllm_processes.SERVER_JSON).read_text())


def test_the_worker_route_is_chosen_by_its_interpreter(service, tmp_path):
    assert isinstance(service.backends["tensorrt_llm"], TRTLLMEngineBackend)
    assert service.availability()["tensorrt_llm"].available
    missing = Service(engines=tmp_path / "other", trtllm_settings=trtllm_processes.Settings(python=tmp_path / "no" / "python"))
    assert isinstance(missing.backends["tensorrt_llm"], TensorRTLLMBackend)  # the in-process one, as before


def test_a_request_runs_through_the_worker_and_reuses_it(service):
    start, steps, end = collect(service.stream(DRAFT_TARGET, "hi"))
    assert end["error"] is None and end["finish_reason"] == "length"
    build_id = start["engine"]["build"]
    manifest = service.engine_get(build_id)
    assert manifest["kind"] == "tensorrt-worker" and manifest["spec"]["config"]["worker"] is True
    assert start["pass"] == STARTED and start["backend"] == "tensorrt_llm" and start["prompt_ids"]
    # The app's own directories, by absolute path: the prepared model and the registry's draft (not a hub id).
    llm = json.loads((service.store.builds / build_id / trtllm_processes.LLM_JSON).read_text())["llm"]
    assert Path(llm["model"]) == (service.engines / "models" / models.BUNDLED).absolute()
    assert Path(llm["speculative_config"]["speculative_model"]) == (service.engines / "models" / DRAFT).absolute()
    assert llm["max_input_len"] == 4096 and llm["disable_overlap_scheduler"] is True
    # Per step the tokens the engine committed in one iteration (the stand-in's script: 1, 2, 1, 3); they are the output.
    assert [len(s["tokens"]) for s in steps] == [1, 2, 1, 3]
    assert [t for s in steps for t in s["tokens"]] == end["token_ids"] == [5, 6, 7, 8, 9, 10, 11]
    assert isinstance(end["text"], str) and all(set(s["texts"]) == set(s["tokens"]) for s in steps)  # the app's tokenizer
    assert all("draft tree" in s["source"]["not_visible"] and s["proposed"]["tokens"] == s["accepted_tokens"] for s in steps)
    # The totals are the request's own perf metrics: 3 generation iterations of a 3-token draft, 1 + 0 + 2 accepted.
    totals = end["totals"]
    assert (totals["drafted"], totals["accepted"], totals["accepted_from"]) == (9, 3, "request_perf_metrics")
    assert "accepted 3/9 drafted (33%)" in render.totals_line(end)
    pid = _worker(service, build_id)["pid"]
    start, steps, again = collect(service.stream(DRAFT_TARGET, "hi again"))
    assert start["pass"] == trt.REUSED and start["engine"]["build"] == build_id and again["error"] is None
    assert _worker(service, build_id)["pid"] == pid
    assert (service.store.builds / build_id / trtllm_processes.SERVER_LOG).read_text().count("=== ") == 1


def test_another_configuration_is_refused_while_one_runs_then_runs_once_it_is_stopped(service):
    first = service.engine_build(DRAFT_TARGET)
    assert first["server"]["state"] == "running" and first["server"]["started_here"]
    other = service.engine_id(service.request(NGRAM), models.BUNDLED)
    with pytest.raises(ConfigError) as refused:
        service.submit(NGRAM, "hi")
    message = str(refused.value)
    assert "one engine per GPU" in message and f"pid {first['server']['pid']}" in message and "Stop it" in message
    assert not (service.store.builds / other).exists(), "nothing was prepared for the refused configuration"
    assert service.engine_stop(first["id"])
    assert _group_gone(first["server"]["pid"]) and service.engine_get(first["id"])["server"]["state"] == "stopped"
    start, steps, end = collect(service.stream(NGRAM, "hi"))
    assert end["error"] is None and start["engine"]["build"] == other and start["pass"] == STARTED


def test_a_race_is_refused_in_words_before_any_engine_starts(service):
    """The Run tab races a run against autoregressive by default: on TensorRT-LLM that is a second engine on the GPU,
    which one engine per GPU refuses. Said before anything is prepared, with what to do instead."""
    base = {"speculative_config": {"decoding_type": "Autoregressive"}, "max_new_tokens": 7, "backend": "tensorrt_llm"}
    with pytest.raises(ConfigError, match="one engine per GPU, so an autoregressive baseline cannot run beside this "
                                          "mode's engine to race it: run it without the race"):
        service.race(NGRAM, base, "hi")
    assert not list(service.store.builds.glob("*")), "nothing was prepared or started"
    # The Run tab asks first and runs the mode alone, its status saying why (run_tab.run); a CPU backend races.
    assert "one engine per GPU" in service.race_refusal(service.request(NGRAM))
    assert service.race_refusal(service.request({**NGRAM, "backend": "transformers"})) is None


def test_a_build_says_its_progress_and_close_leaves_no_process(service):
    lines = []
    manifest = service.engine_build(NGRAM, progress=lambda fraction, line: lines.append(line))
    assert any(line.startswith("preparing the model") for line in lines)
    assert any(line.startswith("starting the TensorRT-LLM worker") for line in lines)
    assert lines[-1].startswith("TensorRT-LLM ") and "ready" in lines[-1]
    pid = manifest["server"]["pid"]
    service.close()
    assert _group_gone(pid) and service.engine_get(manifest["id"])["server"]["state"] == "stopped"


def test_the_engines_tab_lists_the_worker_and_stops_it(service):
    from app.ui.engines_tab import HEADERS, engines_text
    from app.ui.web import Studio

    studio = Studio(service)
    studio.blocks()
    tab = studio.engines
    manifest = service.engine_build(DRAFT_TARGET)
    rows, menu = tab.refresh(False, None)[tab.table], tab.refresh(False, None)[tab.ids]["choices"]
    row = next(r for r in rows if r[0] == manifest["id"])
    assert row[HEADERS.index("mode · backend")] == "draft_target · tensorrt_llm"
    assert row[HEADERS.index("server")] == f"running here :{manifest['server']['port']}" and manifest["id"] in menu
    assert "**TensorRT-LLM**: set up" in engines_text(service)
    answer = tab.stop(manifest["id"], False, None)
    assert answer[tab.status] == f"Stopped the server of `{manifest['id']}` (the next request on it starts it again)."
    row = next(r for r in answer[tab.table] if r[0] == manifest["id"])
    assert row[HEADERS.index("server")] == "stopped" and _group_gone(manifest["server"]["pid"])


def test_without_its_environment_the_run_and_engines_tabs_name_the_docs_and_no_pip(tmp_path):
    from app.ui.engines_tab import engines_text
    from app.ui.run_tab import modes_note

    s = Service(engines=tmp_path / "engines", trtllm_settings=trtllm_processes.Settings(python=tmp_path / "none" / "python"))
    state = s.availability()["tensorrt_llm"]
    assert not state.available and NOT_SET_UP in state.reason and "bash scripts/setup-trtllm.sh" in state.reason
    note, line = modes_note(s, "tensorrt_llm"), engines_text(s)
    assert note.count(NOT_SET_UP) >= 5 and f"**TensorRT-LLM**: TensorRT-LLM {NOT_SET_UP}" in line
    for text in (state.reason, note, line, trt.probe().reason):
        assert "pip" not in text
    with pytest.raises(ConfigError, match=NOT_SET_UP):
        s.submit(NGRAM, "hi")
