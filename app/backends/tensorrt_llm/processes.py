"""TensorRT-LLM engines: this project's worker (worker.py) in TensorRT-LLM's own environment,
started and kept by the service the way vLLM's servers are (app/backends/processes.py keeps both).

TensorRT-LLM pins numpy < 2, torch <= 2.9 and transformers 4.57, which clash with the app's, so it runs in its own
interpreter (`.venv-trtllm`, scripts/setup-trtllm.sh, set up only on a Linux host with an NVIDIA GPU); the app never
imports it here, it starts the worker and talks HTTP to it (the protocol is the worker's docstring).

A worker serves one build of the store (builds.py trtllm_plan): its directory gets `llm.json` (the plan's LLM(...)
arguments with `{build_dir}` filled in, and the TensorRT-LLM backend), `server.json` (pid, port, command, and the
llm.json it serves) and `server.log`. It is *running* while that pid still runs that command and /health says ready,
*loading* while /health answers 503 (the LLM is being built or loaded). One worker at a time per store: each LLM
reserves most of the free GPU memory for its KV cache, so a second configuration is refused while one runs.

The stream is read the in-process backend's way (backend.py steps_from_diffs, with_perf_metrics):
per engine iteration the committed tokens, and at the end the request's own drafted/accepted counters.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app import models
from app.backends.openai import WIRE_ERRORS
from app.backends.processes import (SERVER_JSON, SERVER_LOG, alive, free_port, listening, locked, log_tail, read_server,
                                    spawn, stop_server)
from app.backends.store import fill_build_dir
from app.backends.tensorrt_llm import backend as trt
from app.service.errors import EngineError

VENV = models.ROOT / ".venv-trtllm"
SETUP = "bash scripts/setup-trtllm.sh"
WORKER = models.ROOT / "app" / "backends" / "tensorrt_llm" / "worker.py"
LLM_JSON = "llm.json"
LOCK = "trtllm.server.lock"  # one for the store, not per build: the GPU is the one thing they share
ONE_PER_GPU = ("one engine per GPU: each reserves most of the free GPU memory for its KV cache "
               "(KvCacheConfig.free_gpu_memory_fraction 0.9)")
NOT_SET_UP = trt.NOT_SET_UP


class TRTLLMError(EngineError):
    """A worker that cannot be set up, started or reached, or a request it refused; the message is for the user."""


@dataclass(frozen=True)
class Settings:
    """How this machine runs TensorRT-LLM workers (the operator's choices, not a request's)."""

    python: Path = VENV / "bin" / "python"
    env: dict[str, str] = field(default_factory=dict)  # added to the worker's environment (CUDA_VISIBLE_DEVICES, ...)
    start_timeout_s: float = 1800.0  # a TensorRT engine is built from the checkpoint while the worker loads
    stop_timeout_s: float = 20.0  # LLM.shutdown frees the GPU and its MPI workers; SIGKILL after this


def unavailable(settings: Settings) -> str | None:
    """Why the worker cannot run here, or None. Never a pip command: upstream's pins would break the app's environment."""
    if not settings.python.exists():
        return NOT_SET_UP
    return None


def version(python: Path) -> str | None:
    """TensorRT-LLM's version in `python`'s environment, from package metadata (importing it needs CUDA); None where
    the environment does not hold its metadata (a venv over a container's own packages: its /health says it)."""
    for info in sorted((python.parent.parent / "lib").glob("python3*/site-packages/tensorrt_llm-*.dist-info/METADATA")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def worker_file(plan: dict, build_dir: Path, serves: str | None = None) -> dict:
    """The worker's --llm file from a trtllm_plan: its LLM(...) arguments with the build's directory filled in."""
    return {"trtllm_backend": plan["trtllm_backend"], "llm": fill_build_dir(plan["llm"], build_dir), "serves": serves}


def command(settings: Settings, port: int, llm_file: Path) -> list[str]:
    return [str(settings.python), str(WORKER), "--host", "127.0.0.1", "--port", str(port), "--llm", str(llm_file)]


def health(port: int) -> tuple[int, dict] | None:
    """(status, body) of the worker's /health: 200 once ready, 503 while it loads; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10.0) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"{}")
        except WIRE_ERRORS:  # a body cut short by a worker that died while it answered, or not JSON
            return err.code, {}
    except WIRE_ERRORS:
        return None


class Processes:
    """The store's TensorRT-LLM worker (at most one): start (under the store's lock), state, reuse, stop."""

    def __init__(self, builds: Path, settings: Settings = Settings()) -> None:
        self.builds = builds
        self.settings = settings

    def _servers(self) -> Iterator[tuple[Path, dict]]:
        """(build directory, server.json) of every live worker: a vLLM server's server.json runs another command."""
        for path in sorted(self.builds.glob(f"*/{SERVER_JSON}")):
            server = read_server(path)
            if server and server["command"][1:2] == [str(WORKER)] and alive(server):
                yield path.parent, server

    def state(self, directory: Path) -> dict[str, Any]:
        """{"state": "running" | "loading" | "starting" | "stopped", "port"?, "pid"?, "serves"?, "log_tail"?}."""
        server = read_server(directory / SERVER_JSON)
        if not server:
            return {"state": "stopped"}
        if not alive(server):
            return {"state": "stopped", "log_tail": log_tail(directory / SERVER_LOG)}
        # What answers on the port is this worker only where its socket is (another process may have taken the port).
        answer = health(server["port"]) if listening(server["pid"], server["port"]) else None
        # A live worker that does not answer yet has not bound its port (Python still starting): it holds the GPU soon.
        state = "starting" if answer is None else "running" if answer[0] == 200 and answer[1].get("ready") else "loading"
        return {"state": state, "port": server["port"], "pid": server["pid"], "serves": server.get("llm", {}).get("serves"),
                "started": server.get("started")}

    def busy(self, directory: Path, file: dict) -> str | None:
        """Why this configuration cannot start now (another one's worker is alive), in words; None when it can."""
        for other, server in self._servers():
            if other != directory or server["llm"] != file:
                what = server["llm"].get("serves") or f"the engine {other.name}"
                return (f"TensorRT-LLM is running {what} (engine {other.name}, pid {server['pid']}); {ONE_PER_GPU}. "
                        "Stop it before starting another configuration")
        return None

    def ensure(self, directory: Path, file: dict, progress: Callable[[float, str], None] = lambda *_: None,
               cancel: threading.Event | None = None) -> tuple[int, bool]:
        """The port of the worker serving `file` from the build `directory`, and whether this call started it (else it
        was running: started by another caller, thread or process)."""
        if reason := unavailable(self.settings):
            raise TRTLLMError(reason)
        server = read_server(directory / SERVER_JSON)
        if server and server.get("llm") == file and self.state(directory)["state"] == "running":
            return server["port"], False
        if reason := self.busy(directory, file):  # said at once, not after another caller's start (minutes)
            raise TRTLLMError(reason)
        with locked(self.builds / LOCK):
            if reason := self.busy(directory, file):
                raise TRTLLMError(reason)
            server = read_server(directory / SERVER_JSON)
            if server and alive(server):  # this configuration's: started by another caller
                return self._wait(directory, server, None, progress, cancel), False
            (directory / LLM_JSON).write_text(json.dumps(file, indent=1))
            port = free_port()
            cmd = command(self.settings, port, directory / LLM_JSON)
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | self.settings.env
            proc = spawn(cmd, directory, env)
            server = {"pid": proc.pid, "port": port, "command": cmd, "llm": file, "started": time.time()}
            (directory / SERVER_JSON).write_text(json.dumps(server, indent=1))
            progress(0.0, f"starting the TensorRT-LLM worker for {file.get('serves') or directory.name}")
            return self._wait(directory, server, proc, progress, cancel), True

    def _wait(self, directory: Path, server: dict, proc: subprocess.Popen | None, progress, cancel) -> int:
        """Until the worker says ready; stopped (and said why) when it exits, times out or is cancelled."""
        start, reported = time.monotonic(), 0.0
        while True:
            exited = proc.poll() is not None if proc is not None else not alive(server)
            if exited:
                raise TRTLLMError(f"the TensorRT-LLM worker exited while it loaded; its log ends:\n"
                                  f"{log_tail(directory / SERVER_LOG)}")
            answer = health(server["port"]) if listening(server["pid"], server["port"]) else None
            if answer is not None and answer[0] == 200 and answer[1].get("ready"):
                progress(1.0, f"TensorRT-LLM {answer[1].get('tensorrt_llm')} ready ({answer[1].get('llm_class')}) "
                              f"after {time.monotonic() - start:.0f} s")
                return server["port"]
            waited = time.monotonic() - start
            cancelled = cancel is not None and cancel.is_set()
            if waited > self.settings.start_timeout_s or cancelled:
                if proc is not None or not cancelled:  # a caller that only waited for it leaves it to its starter
                    self.stop(directory)
                why = "was cancelled" if cancelled else f"was not ready within {self.settings.start_timeout_s:.0f} s"
                raise TRTLLMError(f"starting the TensorRT-LLM worker {why}; its log ends:\n"
                                  f"{log_tail(directory / SERVER_LOG)}")
            if waited >= reported + 10:  # a line every 10 s, not every poll
                reported = waited
                progress(min(waited / 600, 0.95), f"TensorRT-LLM is loading (a TensorRT engine builds for minutes): "
                                                   f"{waited:.0f} s")
            time.sleep(0.2)

    def stop(self, directory: Path) -> bool:
        """Stop the build's worker (SIGTERM: it shuts the LLM down; SIGKILL to its process group after that); True
        when one was running."""
        return stop_server(read_server(directory / SERVER_JSON), self.settings.stop_timeout_s)


# ----------------------------------------------------------------------------- the client


def generate(port: int, prompt_ids: list[int], sampling_params: dict, cancel: threading.Event | None = None,
             abort_grace_s: float = 10.0, timeout_s: float = 600.0) -> Iterator[dict[str, Any]]:
    """One request to a worker: its trace steps (steps_from_diffs) as they stream, then {"type": "end", "token_ids",
    "finish_reason", "totals" (with the request's perf metrics), "aborted", "error", "id", "elapsed_s"}. A set
    `cancel` aborts the request (POST /abort with its id); a worker that does not end it within `abort_grace_s` has
    its connection closed, which aborts it too (the worker watches its clients). Sent at the first next()."""
    rid = uuid.uuid4().hex
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        body = {"prompt_token_ids": prompt_ids, "sampling_params": sampling_params, "id": rid}
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        sock = conn.sock  # the response keeps reading it after getresponse() hands it over (Connection: close)
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as err:
        conn.close()
        raise TRTLLMError(f"the TensorRT-LLM worker on port {port} did not answer: {err}") from None
    if response.status != 200:
        body = response.read().decode(errors="replace")
        conn.close()
        try:
            body = json.loads(body).get("error", body)
        except (ValueError, AttributeError):
            pass
        raise TRTLLMError(f"TensorRT-LLM refused the request: {body}")
    done = threading.Event()
    if cancel is not None:
        threading.Thread(target=_abort_on, args=(cancel, done, port, rid, sock, abort_grace_s), daemon=True).start()
    final: dict = {}
    diffs = _diffs(response, final)
    try:
        steps, totals = [], {}
        for step in trt.steps_from_diffs(diffs):
            totals = step["totals"]
            steps.append(step)
            yield step
    finally:  # also when the caller stops reading: the closed connection aborts the request in the worker
        done.set()
        response.close()
        conn.close()
    if not final:  # the stream ended without its final line: the connection was closed (a cancel) or the worker died
        cancelled = cancel is not None and cancel.is_set()
        final = {"token_ids": [t for s in steps for t in s["tokens"]], "finish_reason": "cancelled" if cancelled else None,
                 "aborted": "the connection was closed" if cancelled else None,
                 "error": None if cancelled else "the worker's stream ended without its final line"}
    spec = (final.get("perf_metrics") or {}).get("speculative_decoding")
    # with_perf_metrics reads upstream's RequestPerfMetrics by attribute; the worker sent its fields as data.
    perf = None if spec is None else SimpleNamespace(speculative_decoding=SimpleNamespace(**spec))
    totals = {**totals, "avg_decoded_tokens_per_iter": final.get("avg_decoded_tokens_per_iter")}
    yield {"type": "end", "id": rid, "token_ids": final["token_ids"], "finish_reason": final["finish_reason"],
           "totals": trt.with_perf_metrics(totals, perf),
           "aborted": final.get("aborted"), "error": final.get("error"),
           "elapsed_s": final.get("elapsed_s", totals.get("elapsed_s", 0.0))}


def _diffs(response, final: dict) -> Iterator[tuple[list[int], float, str | None, int | None]]:
    """The stream's lines as steps_from_diffs takes them; the final line goes into `final`."""
    try:
        for raw in response:
            if not raw.strip():
                continue
            line = json.loads(raw)
            if line.get("done"):
                final.update(line)
                return
            yield line["token_ids_diff"], line["elapsed_s"], line["finish_reason"], line["decoding_iter"]
    except (OSError, http.client.HTTPException, ValueError):  # closed under us by a cancel, or the worker died
        return


def _abort_on(cancel: threading.Event, done: threading.Event, port: int, rid: str, sock: socket.socket, grace_s: float) -> None:
    while not done.is_set():
        if cancel.wait(0.1):
            break
    else:
        return
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/abort", json.dumps({"id": rid}).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10.0).read()
    except WIRE_ERRORS:
        pass
    if not done.wait(grace_s):
        try:  # unblocks the reader; the worker sees its client go and aborts the request
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
