"""The OpenAI surface of `python -m app serve` and what a public server owes its anonymous clients (issue 48): every
OpenAI field honoured or refused with a 400 naming it, a dropped client cancels its generation, no engine started
for an anonymous client, a per-client bound, a prompt exit on SIGTERM, and memory that levels off over a soak of
200 mixed requests. The app in-process (FastAPI's TestClient, a real uvicorn on loopback) and as a real process;
the bundled model throughout. vLLM's answers to the same requests: tests/backends/on_vllm/test_vllm.py."""

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from app import models
from app.service.api import Service
from app.service.jobs import Limits
from app.service.server import create_app
from helpers import ROOT, app_command, command_line, eager, free_port

pytestmark = pytest.mark.bundled

COUNT = "Count: 1, 2, 3, 4,"


def store(tmp_path_factory):
    engines = tmp_path_factory.mktemp("engines")
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    models.locate(models.BUNDLED)
    return engines


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = Service(store(tmp_path_factory), limits=Limits(max_new_tokens=256))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(service):
    from fastapi.testclient import TestClient

    with TestClient(create_app(service)) as c:
        yield c


def completion(**fields):
    return {"prompt": COUNT, "max_tokens": 8, "temperature": 0, **fields}


def chat(*messages, **fields):
    return {"messages": list(messages) or [{"role": "user", "content": "Count from 1 to 9."}], "max_tokens": 4,
            "temperature": 0, **fields}


def events(response) -> list:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", completion(stop=5), "stop"),
    ("/v1/completions", completion(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("/v1/completions", completion(max_tokens="5"), "max_tokens"),
    ("/v1/completions", completion(max_tokens=True), "max_tokens"),
    ("/v1/completions", completion(frequency_penalty="x"), "frequency_penalty"),
    ("/v1/completions", completion(logprobs=2), "logprobs"),
    ("/v1/completions", completion(echo=True), "echo"),
    ("/v1/completions", completion(presence_penalty=0.5), "presence_penalty"),
    ("/v1/completions", completion(logit_bias={"1": 5}), "logit_bias"),
    ("/v1/completions", completion(stream_options={"include_usage": True}), "stream_options"),
    ("/v1/completions", completion(frobnicate=1), "frobnicate"),
    ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="auto"), "tools"),
    ("/v1/chat/completions", chat(response_format={"type": "json_object"}), "response_format"),
    ("/v1/chat/completions", chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
     "image_url"),
])
def test_a_field_this_server_does_not_honour_is_refused_naming_it(client, path, body, field):
    r = client.post(path, json=body)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_stop_strings_usage_content_parts_roles_and_model_cards_as_openai(client):
    whole = client.post("/v1/completions", json=completion(max_tokens=12)).json()["choices"][0]["text"]
    assert " 6" in whole  # the greedy continuation counts on: a stop string has something to cut
    cut = whole[: whole.index(" 6")]
    for stop in (" 6", [" 6", "never"]):
        r = client.post("/v1/completions", json=completion(max_tokens=12, stop=stop)).json()
        assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["choices"][0]["stop_reason"]) == (cut, "stop", " 6")
        assert r["usage"]["completion_tokens"] < 12
    streamed = events(client.post("/v1/completions", json=completion(max_tokens=12, stop=" 6", stream=True,
                                                                       stream_options={"include_usage": True})))
    assert "".join(c["choices"][0]["text"] for c in streamed[:-1]) == cut  # nothing of the stop string was sent
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop" and streamed[-1]["choices"] == []
    assert streamed[-1]["usage"]["completion_tokens"] >= 1 and all(c["usage"] is None for c in streamed[:-1])
    plain = client.post("/v1/chat/completions", json=chat({"role": "user", "content": "Count from 1\nto 9."})).json()
    parts = client.post("/v1/chat/completions", json=chat({"role": "user", "content": [
        {"type": "text", "text": "Count from 1"}, {"type": "text", "text": "to 9."}]})).json()
    assert parts["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]  # parts joined by newlines
    for messages in ([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
                      {"role": "tool", "content": "42", "tool_call_id": "call-1"}]):
        r = client.post("/v1/chat/completions", json=chat(*messages))
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
    assert client.get(f"/v1/models/{models.BUNDLED}").json()["id"] == models.BUNDLED
    assert client.get("/v1/models/other").status_code == 404
    ids = {client.post("/v1/completions", json=completion(max_tokens=1)).json()["id"] for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith("cmpl-") and len(i) == 5 + 32 for i in ids)  # uuid-based: unique across restarts


def test_the_time_limit_finishes_as_length_and_says_why_in_specdec(tmp_path_factory):
    from fastapi.testclient import TestClient

    limited = Service(store(tmp_path_factory), limits=Limits(time_limit_s=0.001))
    try:
        with TestClient(create_app(limited)) as c:
            r = c.post("/v1/completions", json=completion(max_tokens=64)).json()
    finally:
        limited.close()
    assert r["choices"][0]["finish_reason"] == "length" and r["specdec"]["end"]["finish_reason"] == "timeout"


# ----------------------------------------------------------------------------- a real uvicorn: a dropped client


def test_a_dropped_client_cancels_its_non_streamed_generation(service):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        body = json.dumps(completion(max_tokens=256)).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            while not service.jobs.active():
                time.sleep(0.05)
            job = service.jobs.active()[0]
        assert job.done.wait(120)  # the client is gone: the job ends at its next step, not after 256 tokens
        assert job.status == "cancelled"
    finally:
        server.should_exit = True
        thread.join(30)


# ----------------------------------------------------------------------------- serve --public as a real process


def call(url, path, body=None, timeout=120):
    request = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def served(url, body) -> int:
    """The status of `body`, asked again while this client's dropped requests are still being cancelled (429)."""
    for _ in range(120):
        status, _ = call(url, "/v1/completions", body)
        if status != 429:
            return status
        time.sleep(0.25)
    return status


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def hold(url, body) -> socket.socket:
    """A streamed request left open (its generation runs until the socket closes)."""
    data = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    sock.recv(64)  # the response has begun: its job is queued or running
    return sock


def test_serve_public_soak_bounds_per_client_refuses_engine_starts_and_exits_on_sigterm(tmp_path_factory):
    """One `serve --public` process: anonymous clients start no vLLM engine (refused before anything is built), one
    client holds at most 2 generations, 200 mixed requests leave its memory level, and SIGTERM with generations
    running ends it within seconds with nothing left behind."""
    engines = store(tmp_path_factory)
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(app_command(*eager(["serve", "--public", "--port", str(port), "--max-concurrency", "1",
                                                    "--engines-dir", str(engines)])), cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if call(url, "/v1/models", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None, log.read_text()[-2000:]
                time.sleep(0.5)
        builds = sorted((engines / "builds").glob("*")) if (engines / "builds").exists() else []
        status, text = call(url, "/v1/completions", completion(specdec={"backend": "vllm", "speculative_config": {
            "decoding_type": "NGram", "max_draft_len": 3}}))
        assert status == 400 and "only on engines its operator started" in text, text
        assert (sorted((engines / "builds").glob("*")) if (engines / "builds").exists() else []) == builds  # nothing built
        assert not [p for p in psutil.Process(proc.pid).children(recursive=True) if "vllm" in command_line(p)]

        long = completion(max_tokens=512, prompt="Write a long story about the sea.")
        held = [hold(url, long), hold(url, long)]
        status, text = call(url, "/v1/completions", long)
        assert status == 429 and "you already have 2 generation(s) running or waiting" in text, text
        for sock in held:
            sock.close()

        hostile = [completion(stop=5), completion(max_tokens="5"), completion(logprobs=1), completion(frobnicate=1),
                   completion(prompt="x" * 200_000), completion(specdec={"speculative_config": {
                       "decoding_type": "Medusa", "speculative_model": "trained:0123456789abcdef"}}),
                   {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, completion(prompt=["a", "b"])]
        samples = []
        for i in range(200):
            if i % 10 == 0:
                samples.append(rss_mb(proc.pid))
            if i % 10 == 0:  # a normal request, streamed or not
                assert served(url, completion(max_tokens=2, stream=i % 20 == 0)) == 200
            elif i % 25 == 1:  # a client that goes away mid-generation
                hold(url, long).close()
            else:
                status, text = call(url, "/v1/chat/completions" if "messages" in hostile[i % 8] else "/v1/completions",
                                    hostile[i % 8])
                assert 400 <= status < 500 and "/tmp/" not in text and "/work/" not in text, text
        samples.append(rss_mb(proc.pid))
        print(f"serve --public RSS over 200 requests (MB, every 10): {[round(s) for s in samples]}")
        # Levelled off: the second half of the soak adds at most 64 MB to the most the first half reached.
        assert max(samples[10:]) <= max(samples[:10]) + 64, samples

        held = [hold(url, long)]  # a generation running when SIGTERM comes
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) is not None  # ends within seconds, not after 512 tokens
        held[0].close()
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
