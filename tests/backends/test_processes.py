"""The engines' server processes (app/backends/processes.py): a server is this app's only where its socket is.

`free_port` finds a port free when asked; on a shared machine (two test workers, a web app beside `serve` and the CLI)
another process can bind it before the engine does, and would then answer the engine's /health."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from app.backends import processes
from app.backends.openai import RemoteError
from app.modes import ConfigError
from app.backends.tensorrt_llm import processes as trtllm_processes
from app.backends.vllm import client, processes as vllm_processes
from app.bench import load

SERVE = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
         "        self.wfile.write(b'{}')\n"
         "    def log_message(self, *a): pass\n"
         "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _serve(port: int) -> subprocess.Popen:
    """A server answering 200 on `port`, in a session (and process group) of its own, as processes.spawn starts one."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("the test server did not answer")


@pytest.fixture
def foreign():
    """Another process's server on a port this app might have picked."""
    port = processes.free_port()
    proc = _serve(port)
    yield port, proc
    proc.kill()
    proc.wait()


def test_a_port_is_ours_only_where_our_process_group_listens_on_it(foreign):
    port, proc = foreign
    assert processes.listening(proc.pid, port)
    assert not processes.listening(os.getpgid(0), port)  # this process answers nothing there
    assert not processes.listening(proc.pid, processes.free_port())  # nothing listens on a free port
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert not processes.listening(sleeper.pid, port)  # alive, but the socket is another's
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_vllm_server_whose_port_another_process_answers_reads_stopped(foreign, tmp_path):
    """server.json records a live process of ours and a URL where another server answers /health: before, the state
    read "running" (and a request would have gone to the other server); now it reads stopped, with the log's tail."""
    port, _ = foreign
    directory = tmp_path / "builds" / "0123456789abcdef"
    directory.mkdir(parents=True)
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = processes.spawn(cmd, directory, dict(os.environ))
    try:
        (directory / processes.SERVER_JSON).write_text(json.dumps(
            {"pid": ours.pid, "url": f"http://127.0.0.1:{port}", "port": port, "command": cmd, "started": time.time()}))
        recorded = processes.read_server(directory / processes.SERVER_JSON)
        deadline = time.monotonic() + 30
        while not processes.alive(recorded) and time.monotonic() < deadline:  # until the child has exec'd its command
            time.sleep(0.1)
        assert processes.alive(recorded)
        state = vllm_processes.Processes(tmp_path / "builds", vllm_processes.Settings()).state(directory.name)
        assert state["state"] == "stopped" and "starting:" in state["log_tail"], state
    finally:
        ours.kill()
        ours.wait()


@pytest.fixture
def cut_short():
    """A server on loopback that promises 15 bytes of body and closes after 2: a 503 to /health (a worker still
    loading), a 400 to /refuse, a 200 to anything else; a stream to /v1/completions, cut inside its first chunk."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                path = conn.recv(65536).split(b" ")[1]
                status = {b"/health": b"503 Service Unavailable", b"/refuse": b"400 Bad Request"}.get(path, b"200 OK")
                if path == b"/v1/completions":  # a stream, cut inside its first chunk
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20\r\ndata: {")
                else:
                    conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 15\r\n\r\n{}")
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def test_a_server_that_cuts_its_answer_short_is_said_to_be_down_not_raised(cut_short):
    """An engine killed mid-answer cuts its body short (http.client.IncompleteRead, which is no OSError): the worker's
    health check reads the status it got, vLLM's warm-up reads failed, the counters the engine's error, a refusal its
    status's reason, a stream that breaks off a RemoteError in words (here a load sweep's request records it), and a
    cancel's abort ends without raising in its thread (the suite saw the abort raise while a TensorRT-LLM worker
    stopped, and the health check while one died loading)."""
    url = f"http://127.0.0.1:{cut_short}"
    assert trtllm_processes.health(cut_short) == (503, {})  # still loading, as far as it said
    assert vllm_processes._warm(url, "m") is False
    with pytest.raises(RemoteError, match="cannot read the engine's counters"):
        client.Engine(url, "m").counters()
    with pytest.raises(ConfigError, match="refused the request: Bad Request"):  # the refusal's status, its body cut
        client.Engine(url, "m")._json("/refuse", {})
    out = load._request(load.Target("vllm_generate", url, "m"), [1, 2], 4, threading.Event(), 0.0, 10.0)
    assert out["error"].startswith("the server's stream broke off: IncompleteRead") and out["token_ids"] == []
    cancel, done = threading.Event(), threading.Event()
    cancel.set()
    with socket.socket() as unused:
        trtllm_processes._abort_on(cancel, done, cut_short, "r1", unused, 0.0)
