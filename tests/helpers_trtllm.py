"""Helpers the TensorRT-LLM tests share (test_trtllm_worker.py, test_trtllm_engines.py, test_trtllm_service.py): this
project's worker started on the stand-in (tests/stand_ins/tensorrt_llm) in a process of its own, spoken to over HTTP,
and whatever a failed test left running killed. Their fixtures (model_dirs, workers) are in conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from app.backends.tensorrt_llm import processes as trtllm_processes
from helpers import ROOT, STAND_INS, free_port, trtllm_stand_in

WORKER = ROOT / "app" / "backends" / "tensorrt_llm" / "worker.py"
HOLD = STAND_INS / "trtllm_hold.py"

with trtllm_stand_in():
    import tensorrt_llm as _stand_in

    IGNORE_PINS = _stand_in.IGNORE_PINS  # the stand-in's documented opt-out of its numpy<2 check


def _env() -> dict[str, str]:
    # The app's interpreter has numpy 2, which the stand-in refuses as upstream would; these tests check glue code.
    return {**os.environ, "PYTHONPATH": str(STAND_INS), IGNORE_PINS: "1"}


def _get(port: int, path: str = "/health") -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _until(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


class Worker(SimpleNamespace):
    proc: subprocess.Popen
    port: int
    log: Path


def _start(tmp_path: Path, plan: dict, held: bool = False) -> Worker:
    (tmp_path / "llm.json").write_text(json.dumps(plan))
    port = free_port()
    log = tmp_path / "worker.log"
    launcher = [str(HOLD), str(WORKER)] if held else [str(WORKER)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, *launcher, "--host", "127.0.0.1", "--port", str(port),
                                 "--llm", str(tmp_path / "llm.json")],
                                stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    worker = Worker(proc=proc, port=port, log=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the worker exited ({proc.returncode}): {log.read_text()}"
        try:
            status, health = _get(port)
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
            continue
        if status == 200 and health["ready"]:
            return worker
        time.sleep(0.1)
    raise AssertionError(f"the worker did not get ready: {log.read_text()}")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


GREEDY = {"max_tokens": 32, "temperature": 0.0, "top_k": 1}


def kill_left(builds: Path) -> None:
    """Whatever workers a failed test left running under `builds`: killed and reaped."""
    for server in builds.glob(f"*/{trtllm_processes.SERVER_JSON}"):
        pid = json.loads(server.read_text())["pid"]
        if not _group_gone(pid):
            os.killpg(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
