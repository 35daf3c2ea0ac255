"""TensorRT-LLM engines as the service keeps them (app/backends/tensorrt_llm/processes.py): this project's worker started in a
process of its own, reused, refused beside another configuration, stopped, and read the app's way. TensorRT-LLM is the
stand-in (tests/stand_ins/tensorrt_llm) run by the app's own interpreter, as tests/backends/on_tensorrt_llm/test_trtllm_worker.py runs it."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import STAND_INS
from helpers_trtllm import GREEDY, IGNORE_PINS, _get, _group_gone, _start, _until, kill_left

from app.backends.tensorrt_llm import processes as trtllm_processes
from app.backends.tensorrt_llm.processes import Processes, Settings, TRTLLMError

SETTINGS = Settings(python=Path(sys.executable), env={"PYTHONPATH": str(STAND_INS), IGNORE_PINS: "1"}, start_timeout_s=60)


def _plan(mode: str = "draft_target") -> dict:
    """A trtllm_plan's part the worker takes, its paths under "{build_dir}" as the store writes them."""
    llm = {"model": "{build_dir}/model", "max_input_len": 4096}
    if mode == "draft_target":
        llm["speculative_config"] = {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": "{build_dir}/draft"}
    return {"trtllm_backend": "pytorch", "llm": llm}


def _build(builds: Path, name: str, mode: str = "draft_target") -> tuple[Path, dict]:
    """A build directory with what the plan names (the stand-in, as upstream, wants existing model directories)."""
    directory = builds / name
    for sub in ("model", "draft"):
        (directory / sub).mkdir(parents=True)
    return directory, trtllm_processes.worker_file(_plan(mode), directory, f"{mode} on a test model")


@pytest.fixture
def processes(tmp_path):
    builds = tmp_path / "builds"
    builds.mkdir()
    procs = Processes(builds, SETTINGS)
    yield procs
    kill_left(builds)


def _server(directory: Path) -> dict:
    return json.loads((directory / trtllm_processes.SERVER_JSON).read_text())


def test_a_started_worker_runs_the_plan_with_its_build_directory_filled_in(processes):
    directory, file = _build(processes.builds, "a")
    assert file["llm"]["model"] == str(directory / "model") and "{build_dir}" not in json.dumps(file)
    lines = []
    port, started = processes.ensure(directory, file, lambda f, line: lines.append(line))
    assert started and lines[-1].startswith("TensorRT-LLM ") and "ready" in lines[-1]
    server = _server(directory)
    assert server["port"] == port and server["llm"] == file
    assert server["command"] == trtllm_processes.command(SETTINGS, port, directory / "llm.json")
    assert json.loads((directory / "llm.json").read_text()) == file
    state = processes.state(directory)
    assert state["state"] == "running" and state["pid"] == server["pid"] and state["serves"] == "draft_target on a test model"
    status, health = _get(port)
    assert status == 200 and health["llm"] == file["llm"] and health["trtllm_backend"] == "pytorch"
    assert "trtllm_worker: ready" in (directory / "server.log").read_text()


def test_the_same_configuration_reuses_the_running_worker(processes):
    directory, file = _build(processes.builds, "a")
    # Two callers at once: one starts it, the other waits for that start (the store's lock) and reuses it.
    results = []
    callers = [threading.Thread(target=lambda: results.append(processes.ensure(directory, file))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(60)
    (port, _), _ = results
    assert sorted(results) == [(port, False), (port, True)]
    pid = _server(directory)["pid"]
    # Another caller (a second Processes over the same store, as another process of the service would be).
    for caller in (processes, Processes(processes.builds, SETTINGS)):
        assert caller.ensure(directory, file) == (port, False)
    assert _server(directory)["pid"] == pid and processes.state(directory)["state"] == "running"
    assert (directory / "server.log").read_text().count("=== ") == 1  # started once


def test_another_configuration_is_refused_while_one_runs(processes):
    a, file_a = _build(processes.builds, "a")
    b, file_b = _build(processes.builds, "b", mode="autoregressive")
    processes.ensure(a, file_a)
    pid = _server(a)["pid"]
    with pytest.raises(TRTLLMError) as refused:
        processes.ensure(b, file_b)
    message = str(refused.value)
    assert "one engine per GPU" in message and "free_gpu_memory_fraction 0.9" in message
    assert "draft_target on a test model" in message and f"pid {pid}" in message and "Stop it" in message
    assert not (b / "server.json").exists() and not (b / "llm.json").exists()
    # The same build with other arguments is another configuration too: refused, not restarted under the first.
    with pytest.raises(TRTLLMError, match="one engine per GPU"):
        processes.ensure(a, {**file_a, "llm": {**file_a["llm"], "max_input_len": 2048}})
    assert _server(a)["pid"] == pid and processes.state(a)["state"] == "running"
    assert processes.stop(a)
    assert processes.ensure(b, file_b)[1]  # the GPU is free again


def test_generate_reads_the_stream_into_steps_and_totals_from_the_perf_metrics(processes):
    directory, file = _build(processes.builds, "a")
    port, _ = processes.ensure(directory, file)
    *steps, end = trtllm_processes.generate(port, [1, 2, 3, 4], GREEDY)
    assert end["type"] == "end" and end["error"] is None and end["aborted"] is None and end["token_ids"]
    assert len(steps) > 1 and all(s["type"] == "step" for s in steps)
    assert [t for s in steps for t in s["tokens"]] == end["token_ids"]
    totals = end["totals"]
    assert totals["new_tokens"] == len(end["token_ids"]) and totals["target_steps"] == steps[-1]["totals"]["target_steps"]
    # The stream alone cannot count drafted tokens (steps_from_diffs leaves them None): these are the request's own.
    assert steps[-1]["totals"]["drafted"] is None
    assert totals["accepted_from"] == "request_perf_metrics"
    assert totals["drafted"] == totals["perf_metrics"]["drafted"] > 0
    assert totals["accepted"] == totals["perf_metrics"]["accepted"] == sum(len(s["accepted_tokens"]) for s in steps)


def test_a_request_the_worker_refuses_is_said(processes):
    directory, file = _build(processes.builds, "a")
    port, _ = processes.ensure(directory, file)
    with pytest.raises(TRTLLMError, match="refused the request: .*no_such_field"):
        list(trtllm_processes.generate(port, [1, 2], {"no_such_field": 1}))


def test_a_cancel_aborts_the_request(tmp_path, model_dirs, workers):  # noqa: F811
    # A worker held after each request's first response (tests/stand_ins/trtllm_hold.py): the cancel comes mid-request.
    target, draft = model_dirs
    plan = {"trtllm_backend": "pytorch", "llm": {"model": str(target), "max_input_len": 4096, "speculative_config": {
        "decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": str(draft)}}}
    workers.append(w := _start(tmp_path, plan, held=True))
    cancel = threading.Event()
    stream = trtllm_processes.generate(w.port, [1, 2, 3], GREEDY, cancel, timeout_s=10)
    first = next(stream)
    assert first["type"] == "step" and first["tokens"]
    running = _get(w.port)[1]["running"]
    assert len(running) == 1 and running[0]["aborted"] is None
    cancel.set()
    _until(lambda: _get(w.port)[1]["running"][0]["aborted"] == "abort requested")  # POST /abort with the request's id
    os.kill(w.proc.pid, signal.SIGUSR1)  # the engine goes on: its next response is the cancelled end
    *rest, end = list(stream)
    assert end["finish_reason"] == "cancelled" and end["aborted"] == "abort requested"
    assert end["token_ids"] == [t for s in [first, *rest] for t in s["tokens"]]
    assert _until(lambda: _get(w.port)[1]["finished"])[-1]["id"] == end["id"]


def test_a_cancel_the_worker_does_not_answer_closes_the_connection(tmp_path, model_dirs, workers):  # noqa: F811
    target, _ = model_dirs
    workers.append(w := _start(tmp_path, {"trtllm_backend": "pytorch", "llm": {"model": str(target), "max_input_len": 4096}},
                               held=True))
    cancel = threading.Event()
    stream = trtllm_processes.generate(w.port, [1, 2, 3], GREEDY, cancel, abort_grace_s=0.5, timeout_s=8)
    first = next(stream)
    cancel.set()
    began = time.monotonic()
    *rest, end = list(stream)  # the engine stays held: only the closed connection ends the read
    assert time.monotonic() - began < 5 and rest == []
    assert end["finish_reason"] == "cancelled" and end["token_ids"] == first["tokens"] and end["error"] is None
    os.kill(w.proc.pid, signal.SIGUSR1)
    _until(lambda: _get(w.port)[1]["running"] == [])


def test_stop_leaves_no_process(processes):
    directory, file = _build(processes.builds, "a")
    port, _ = processes.ensure(directory, file)
    pid = _server(directory)["pid"]
    assert processes.stop(directory)
    assert _group_gone(pid)
    assert processes.state(directory)["state"] == "stopped" and trtllm_processes.health(port) is None
    assert "LLM.shutdown() done" in (directory / "server.log").read_text()  # SIGTERM let it shut the LLM down
    assert not processes.stop(directory)


def test_a_killed_worker_reads_as_stopped_with_its_log_and_starts_again(processes):
    directory, file = _build(processes.builds, "a")
    processes.ensure(directory, file)
    pid = _server(directory)["pid"]
    os.killpg(pid, signal.SIGKILL)
    state = _until(lambda: (s := processes.state(directory))["state"] == "stopped" and s)
    assert "trtllm_worker: ready" in state["log_tail"] and "pid" not in state
    b, file_b = _build(processes.builds, "b", mode="autoregressive")
    port, started = processes.ensure(b, file_b)  # a dead worker holds no GPU
    assert started and _server(b)["pid"] != pid


def test_a_worker_that_fails_to_load_is_said_with_its_log(processes):
    directory, file = _build(processes.builds, "a")
    file["llm"]["model"] = "{build_dir}/model"  # unfilled: neither a directory nor a hub id, refused by upstream's check
    with pytest.raises(TRTLLMError, match="exited while it loaded(.|\n)*Repo id must"):
        processes.ensure(directory, file)
    assert processes.state(directory)["state"] == "stopped"


def test_without_its_environment_it_says_how_to_set_it_up_and_never_pip(processes, tmp_path):
    directory, file = _build(processes.builds, "a")
    missing = Processes(processes.builds, Settings(python=tmp_path / ".venv-trtllm" / "bin" / "python"))
    with pytest.raises(TRTLLMError) as refused:
        missing.ensure(directory, file)
    message = str(refused.value)
    assert "bash scripts/setup-trtllm.sh" in message and "NVIDIA GPU" in message and "docs/tensorrt-llm.md" in message
    assert "pip" not in message
    assert trtllm_processes.unavailable(missing.settings) == message and trtllm_processes.unavailable(SETTINGS) is None
    assert not (directory / "server.json").exists()


# Loads until `gate` exists: the stand-in loads at once, and a TensorRT engine's build takes minutes. Run first, as the
# interpreter starts (sitecustomize on the worker's PYTHONPATH), so the worker itself is unchanged.
SLOW_LOAD = '''
import os, time
from tensorrt_llm import llm

_init = llm.LLM.__init__

def _slow(self, *args, **kwargs):
    while not os.path.exists({gate!r}):
        time.sleep(0.05)
    _init(self, *args, **kwargs)

llm.LLM.__init__ = _slow
'''


def _slow_settings(tmp_path: Path) -> tuple[Settings, Path]:
    gate, site = tmp_path / "loaded", tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_LOAD.format(gate=str(gate)))
    env = {"PYTHONPATH": f"{site}{os.pathsep}{STAND_INS}", IGNORE_PINS: "1"}
    # A worker told to stop while it loads exits once the load is over: the SIGKILL after stop_timeout_s ends it first.
    return Settings(python=SETTINGS.python, env=env, start_timeout_s=60, stop_timeout_s=2), gate


def test_a_loading_worker_reads_as_loading_and_holds_the_gpu(processes, tmp_path):
    settings, gate = _slow_settings(tmp_path)
    slow = Processes(processes.builds, settings)
    directory, file = _build(processes.builds, "a")
    results, lines = [], []
    starter = threading.Thread(target=lambda: results.append(slow.ensure(directory, file, lambda f, line: lines.append(line))))
    starter.start()
    state = _until(lambda: (s := slow.state(directory))["state"] == "loading" and s)  # /health answers 503
    assert state["serves"] == "draft_target on a test model" and not results
    b, file_b = _build(processes.builds, "b", mode="autoregressive")
    with pytest.raises(TRTLLMError, match="one engine per GPU"):  # refused at once, not after the load
        slow.ensure(b, file_b)
    gate.touch()
    starter.join(30)
    assert results == [(state["port"], True)] and slow.state(directory)["state"] == "running"
    assert lines[0].startswith("starting the TensorRT-LLM worker") and "ready" in lines[-1]


def test_a_start_cancelled_while_it_loads_stops_the_worker(processes, tmp_path):
    settings, _ = _slow_settings(tmp_path)
    slow = Processes(processes.builds, settings)
    directory, file = _build(processes.builds, "a")
    cancel, errors = threading.Event(), []

    def start():
        try:
            slow.ensure(directory, file, cancel=cancel)
        except TRTLLMError as err:
            errors.append(str(err))

    starter = threading.Thread(target=start)
    starter.start()
    _until(lambda: slow.state(directory)["state"] == "loading")
    pid = _server(directory)["pid"]
    cancel.set()
    starter.join(30)
    assert errors and "was cancelled" in errors[0] and "its log ends" in errors[0]
    assert _until(lambda: _group_gone(pid), timeout=15) and slow.state(directory)["state"] == "stopped"
