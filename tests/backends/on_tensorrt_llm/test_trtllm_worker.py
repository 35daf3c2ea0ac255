"""The TensorRT-LLM worker (app/backends/tensorrt_llm/worker.py) as the service runs it: a process of its own,
here on the stand-in (tests/stand_ins/tensorrt_llm: upstream's rules, a scripted token stream), spoken to over HTTP.
What only a GPU host shows (the real engine's numbers, its builds) is scripts/gpu-check.sh's."""

from __future__ import annotations

import ast
import http.client
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import ROOT
from helpers_trtllm import GREEDY, WORKER, _env, _get, _group_gone, _start, _until, free_port


def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _stream(port: int, body: dict):
    """(connection, response) of a POST /generate, its lines read as they come."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _draft_target(target, draft) -> dict:
    return {"trtllm_backend": "pytorch", "serves": "draft_target on a test model",
            "llm": {"model": str(target), "max_input_len": 4096,
                    "speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": str(draft)}}}


def test_the_worker_imports_nothing_of_the_app():
    """It runs in TensorRT-LLM's environment, where the app's pins do not hold: the standard library and
    tensorrt_llm only."""
    tree = ast.parse(WORKER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"tensorrt_llm"}


def test_health_says_what_it_serves(tmp_path, model_dirs, workers):
    plan = _draft_target(*model_dirs)
    workers.append(w := _start(tmp_path, plan))
    status, health = _get(w.port)
    assert status == 200 and health["ready"] and health["state"] == "ready"
    assert health["trtllm_backend"] == "pytorch" and health["llm_class"] == "tensorrt_llm.LLM"
    assert health["llm"] == plan["llm"] and health["serves"] == plan["serves"]
    assert "tensorrt_llm" in health and health["running"] == [] and health["requests"] == 0


def test_a_stream_adds_up_and_ends_with_the_perf_metrics(tmp_path, model_dirs, workers):
    from app.backends.tensorrt_llm import backend as trt

    workers.append(w := _start(tmp_path, _draft_target(*model_dirs)))
    conn, response = _stream(w.port, {"prompt_token_ids": [1, 2, 3, 4], "sampling_params": GREEDY})
    assert response.status == 200 and response.getheader("Content-Type") == "application/x-ndjson"
    lines = [json.loads(line) for line in response]
    conn.close()
    *steps, final = lines
    assert final["done"] and final["error"] is None and final["aborted"] is None and final["id"] == response.getheader("X-Request-Id")
    assert len(steps) > 1 and all(not s.get("done") for s in steps)
    assert [t for s in steps for t in s["token_ids_diff"]] == final["token_ids"] and final["token_ids"]
    iters = [s["decoding_iter"] for s in steps]
    assert iters == sorted(set(iters)) and iters[-1] == final["decoding_iter"]
    assert steps[-1]["finish_reason"] == final["finish_reason"] and all(s["finish_reason"] is None for s in steps[:-1])
    assert [s["elapsed_s"] for s in steps] == sorted(s["elapsed_s"] for s in steps)
    spec = final["perf_metrics"]["speculative_decoding"]
    assert spec["total_draft_tokens"] > 0 and 0 <= spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]
    # Each line is one iteration here: what it committed beyond the target's own token is what it accepted.
    assert spec["total_accepted_draft_tokens"] == sum(len(s["token_ids_diff"]) - 1 for s in steps[1:])
    # Read as the app reads it: its trace steps and end totals come out of these lines as they are.
    diffs = [(s["token_ids_diff"], s["elapsed_s"], s["finish_reason"], s["decoding_iter"]) for s in steps]
    trace = list(trt.steps_from_diffs(diffs))
    perf = SimpleNamespace(speculative_decoding=SimpleNamespace(**spec))
    totals = trt.with_perf_metrics(trace[-1]["totals"], perf)
    assert [t for step in trace for t in step["tokens"]] == final["token_ids"]
    assert totals["new_tokens"] == len(final["token_ids"]) and totals["target_steps"] == final["decoding_iter"]
    assert totals["drafted"] == spec["total_draft_tokens"] and totals["accepted"] == spec["total_accepted_draft_tokens"]
    status, health = _get(w.port)
    assert health["running"] == [] and health["finished"][-1]["tokens"] == len(final["token_ids"])


def test_a_request_upstream_refuses_is_a_400(tmp_path, model_dirs, workers):
    workers.append(w := _start(tmp_path, _draft_target(*model_dirs)))
    assert _post(w.port, "/generate", {"prompt_token_ids": [], "sampling_params": GREEDY})[0] == 400
    status, body = _post(w.port, "/generate", {"prompt_token_ids": [1, 2], "sampling_params": {"no_such_field": 1}})
    assert status == 400 and "no_such_field" in body["error"]  # SamplingParams' own TypeError
    assert _get(w.port)[1]["running"] == []


def test_an_engine_built_for_the_apps_limits_takes_a_long_prompt_and_a_per_request_lookahead(tmp_path, model_dirs, workers):
    target, _ = model_dirs
    plan = {"trtllm_backend": "tensorrt",
            "llm": {"model": str(target),
                    "speculative_config": {"decoding_type": "Lookahead", "max_window_size": 4, "max_ngram_size": 3,
                                           "max_verification_set_size": 4},
                    "build_config": {"max_batch_size": 8, "max_num_tokens": 8192, "max_input_len": 4096,
                                     "max_seq_len": 5120, "speculative_decoding_mode": "LOOKAHEAD_DECODING",
                                     "max_draft_len": 15}}}
    workers.append(w := _start(tmp_path, plan))
    assert _get(w.port)[1]["llm_class"] == "tensorrt_llm._tensorrt_engine.LLM"
    per_request = {**GREEDY, "lookahead_config": {"max_window_size": 2, "max_ngram_size": 2, "max_verification_set_size": 1}}
    conn, response = _stream(w.port, {"prompt_token_ids": [7] * 2000, "sampling_params": per_request})
    lines = [json.loads(line) for line in response]
    conn.close()
    assert response.status == 200 and lines[-1]["done"] and lines[-1]["token_ids"]
    # Past the engine's max_input_len, and a G of 0 (llmapi's PositiveInt): TensorRT-LLM's own refusals, said.
    status, body = _post(w.port, "/generate", {"prompt_token_ids": [7] * 5000, "sampling_params": GREEDY})
    assert status == 400 and "maximum input length (4096)" in body["error"]
    zero = {**GREEDY, "lookahead_config": {"max_window_size": 1, "max_ngram_size": 1, "max_verification_set_size": 0}}
    status, body = _post(w.port, "/generate", {"prompt_token_ids": [7], "sampling_params": zero})
    assert status == 400 and "max_verification_set_size" in body["error"]


def test_abort_ends_the_running_request(tmp_path, model_dirs, workers):
    workers.append(w := _start(tmp_path, _draft_target(*model_dirs), held=True))
    conn, response = _stream(w.port, {"prompt_token_ids": [1, 2, 3], "sampling_params": GREEDY, "id": "run-1"})
    first = json.loads(response.readline())
    assert first["token_ids_diff"] and response.getheader("X-Request-Id") == "run-1"
    assert _get(w.port)[1]["running"] == [{"id": "run-1", "tokens": len(first["token_ids_diff"]), "aborted": None}]
    assert _post(w.port, "/abort", {"id": "run-1"}) == (200, {"aborted": ["run-1"]})
    os.kill(w.proc.pid, signal.SIGUSR1)  # the engine goes on: its next response is the cancelled end
    rest = [json.loads(line) for line in response]
    conn.close()
    final = rest[-1]
    assert final["done"] and final["finish_reason"] == "cancelled" and final["aborted"] == "abort requested"
    assert final["token_ids"] == [t for line in [first, *rest[:-1]] for t in line["token_ids_diff"]]
    health = _get(w.port)[1]
    assert health["running"] == [] and health["finished"][-1]["finish_reason"] == "cancelled"


def test_a_client_that_goes_away_aborts_its_request(tmp_path, model_dirs, workers):
    workers.append(w := _start(tmp_path, _draft_target(*model_dirs), held=True))
    conn, response = _stream(w.port, {"prompt_token_ids": [1, 2, 3], "sampling_params": GREEDY})
    assert json.loads(response.readline())["token_ids_diff"]
    response.close()
    conn.close()
    # Noticed while the engine has nothing to stream (it is held), not only at the next write.
    _until(lambda: [r for r in _get(w.port)[1]["running"] if r["aborted"] == "the client went away"])
    os.kill(w.proc.pid, signal.SIGUSR1)
    finished = _until(lambda: _get(w.port)[1]["running"] == [] and _get(w.port)[1]["finished"])
    assert finished[-1]["finish_reason"] == "cancelled" and finished[-1]["aborted"] == "the client went away"


def test_shutdown_leaves_no_process(tmp_path, model_dirs, workers):
    workers.append(w := _start(tmp_path, _draft_target(*model_dirs)))
    assert _post(w.port, "/shutdown", {}) == (200, {"shutting_down": True})
    assert w.proc.wait(timeout=20) == 0
    assert _group_gone(w.proc.pid)
    assert "LLM.shutdown() done" in w.log.read_text()
    with pytest.raises((urllib.error.URLError, OSError)):
        _get(w.port)


def test_sigterm_shuts_it_down_too(tmp_path, model_dirs, workers):
    workers.append(w := _start(tmp_path, _draft_target(*model_dirs)))
    os.killpg(w.proc.pid, signal.SIGTERM)
    assert w.proc.wait(timeout=20) == 0 and _group_gone(w.proc.pid)
    assert "LLM.shutdown() done" in w.log.read_text()


def test_an_llm_upstream_refuses_ends_the_worker_with_its_reason(tmp_path, workers):
    # An unfilled "{build_dir}" is neither a directory nor a hub id: upstream's hub check refuses it before any download.
    plan = {"trtllm_backend": "pytorch", "llm": {"model": "{build_dir}/model", "max_input_len": 4096}}
    (tmp_path / "llm.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, str(WORKER), "--port", str(free_port()), "--llm", str(tmp_path / "llm.json")],
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Repo id must" in proc.stderr


def test_gpu_check_dry_run_names_every_mode_tensorrt_llm_runs():
    from app.modes import MODES

    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    blocks = {block.splitlines()[0]: block for block in proc.stdout.split("== ")[1:]}
    expected = [f"{m.name} on TensorRT-LLM's {flavour} backend" for m in MODES for flavour in m.trtllm]
    assert expected and all(any(title.startswith(e) for title in blocks) for e in expected)
    for title, block in blocks.items():
        assert "refused: " in block or ("would start: " in block and str(WORKER) in block), block
        if "would start" in block:
            llm = json.loads(block.split("llm.json: ", 1)[1].splitlines()[0])
            assert "{build_dir}" not in json.dumps(llm) and Path(llm["llm"]["model"]).is_absolute()
            assert '"return_perf_metrics": true' in block
    assert "nothing was started" in proc.stdout


@pytest.mark.bundled
def test_gpu_check_runs_every_mode_on_the_stand_in(tmp_path):
    """The check's real path with the stand-in as TensorRT-LLM: the app's artifacts exported and loaded by upstream's
    rules (EAGLE-3 weights by name), each worker started, read the app's way, and stopped."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--python", sys.executable,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "did not run" in proc.stdout and "0 did not run" in proc.stdout
    ran = [line for line in proc.stdout.splitlines() if line.strip().startswith("ran; τ")]
    assert len(ran) == len(list(json.loads(p.read_text()) for p in tmp_path.glob("*/llm.json")))
    assert all("identical to autoregressive" in line for line in ran)
    assert not list(tmp_path.glob("*/worker.log")) or all("LLM.shutdown() done" in p.read_text() for p in tmp_path.glob("*/worker.log"))
