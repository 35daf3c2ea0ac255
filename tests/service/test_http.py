"""The HTTP layer both servers run on (app/service/http.py): who a client is (X-Forwarded-For only from a proxy the
operator trusts, uvicorn's rightmost-untrusted rule), read deadlines for headers and bodies, and what a request in
flight gets when the server stops (a 503 or a last error event in OpenAI's shape, not a text/plain 500 or a cut
stream). First against a small FastAPI app served by it in a process of its own, then against the real
`python -m app serve --public`."""

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest

from app.service.http import HttpSettings
from helpers import ROOT, command_line, free_port, running_server, serve_engines

APP = r"""
import asyncio, json, sys
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from app.service.http import HttpSettings, serve

port, settings, marks = int(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
app = FastAPI()


@app.get("/client")
def client(request: Request):
    return {"host": request.client.host}


@app.post("/echo")
async def echo(request: Request):
    return {"bytes": len(await request.body())}


@app.get("/slow")
async def slow():
    try:
        await asyncio.sleep(60)
        return {"done": True}
    finally:
        (marks / "slow").write_text("unwound")


@app.get("/stream")
async def stream():
    async def events():
        try:
            for i in range(600):
                yield f"data: {json.dumps({'i': i})}\n\n"
                await asyncio.sleep(0.1)
        finally:
            (marks / "stream").write_text("unwound")
    return StreamingResponse(events(), media_type="text/event-stream")


settings["forwarded_allow_ips"] = tuple(settings.get("forwarded_allow_ips", ()))
serve(app, "127.0.0.1", port, HttpSettings(**settings))
"""


@contextlib.contextmanager
def small_server(tmp_path, **settings):
    port, marks = free_port(), tmp_path / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", APP, str(port), json.dumps(settings), str(marks)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/client", timeout=2).read()
                break
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
        yield proc, port, marks
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def raw(port: int, request: bytes, timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(request)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        plain, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            plain, rest = plain + rest[:n], rest[n + 2:]
            if n == 0:
                break
        body = plain
    return int(lines[0].split()[1]), headers, body


def seen_client(port: int, *forwarded: str) -> str:
    headers = b"".join(f"X-Forwarded-For: {f}\r\n".encode() for f in forwarded)
    sock = raw(port, b"GET /client HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n")
    status, _, body = response(read_all(sock))
    assert status == 200, body
    return json.loads(body)["host"]


def closed_after(sock: socket.socket, drip: bytes, every: float, limit: float) -> float:
    """Seconds until the server closes `sock` while `drip` is sent a byte every `every` s (or `limit` passes)."""
    start, sock_timeout = time.monotonic(), sock.gettimeout()
    sock.settimeout(every)
    try:
        for byte in drip:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1024) == b"":
                    break
            except socket.timeout:
                pass
            except OSError:  # reset: closed
                break
            if time.monotonic() - start > limit:
                break
    finally:
        sock.settimeout(sock_timeout)
    return time.monotonic() - start


def assert_openai_error(body: bytes, kind: str, code: str) -> None:
    error = json.loads(body)
    assert set(error) == {"error"} and set(error["error"]) == {"message", "type", "param", "code"}, error
    assert error["error"]["type"] == kind and error["error"]["code"] == code and error["error"]["param"] is None
    message = error["error"]["message"]
    assert isinstance(message, str) and len(message.split()) >= 5 and "\n" not in message, message


def assert_shutting_down(sock: socket.socket) -> None:
    """The answer on `sock` is the 503 a request still running when the server stops gets."""
    status, headers, body = response(read_all(sock))
    assert status == 503 and headers["content-type"] == "application/json", body
    assert_openai_error(body, "server_error", "shutting_down")


def test_settings_default_to_no_trusted_proxy_and_refuse_what_is_no_address():
    settings = HttpSettings()
    assert settings.forwarded_allow_ips == () and (settings.header_timeout_s, settings.body_timeout_s) == (10, 30)
    HttpSettings(forwarded_allow_ips=("10.0.0.0/8", "::1", "*"))
    with pytest.raises(ValueError, match="'10.0.0.0/33' is not an IP address or network"):
        HttpSettings(forwarded_allow_ips=("10.0.0.0/33",))


def test_forwarded_for_counts_only_from_a_trusted_proxy(tmp_path):
    with small_server(tmp_path / "default") as (_, port, _):
        # uvicorn's own default would have trusted loopback: five forged headers were five clients.
        assert seen_client(port) == "127.0.0.1"
        assert seen_client(port, "203.0.113.7") == "127.0.0.1"
        assert seen_client(port, "203.0.113.7", "198.51.100.1, 192.0.2.9") == "127.0.0.1"
    with small_server(tmp_path / "proxy", forwarded_allow_ips=["127.0.0.0/8", "10.0.0.0/8"]) as (_, port, _):
        # The proxy appends the address it saw; a fake the client wrote before it is not taken, nor is a trusted hop.
        assert seen_client(port, "203.0.113.7") == "203.0.113.7"
        assert seen_client(port, "6.6.6.6, 203.0.113.7") == "203.0.113.7"
        assert seen_client(port, "6.6.6.6", "203.0.113.7, 10.1.2.3") == "203.0.113.7"
        assert seen_client(port) == "127.0.0.1"  # no header: the connection's address


def test_slow_headers_are_closed_at_the_deadline_and_again_after_each_response(tmp_path):
    with small_server(tmp_path, header_timeout_s=2) as (_, port, _):
        request = b"GET /client HTTP/1.1\r\nHost: x\r\n\r\n"
        # One byte every 2 s: the headers are never complete in time.
        waited = closed_after(raw(port, b""), request, every=2, limit=15)
        assert waited < 2 + 2, waited
        # A kept-alive connection: its first request is answered, then the next one's headers trickle in.
        sock = raw(port, request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        waited = closed_after(sock, request, every=0.5, limit=15)  # each byte would restart uvicorn's keep-alive timer
        assert waited < 2 + 2, waited
        # Headers in time are served, however slowly they came.
        sock = raw(port, b"")
        for byte in request[:-2]:
            sock.sendall(bytes([byte]))
            time.sleep(0.03)
        sock.sendall(b"Connection: close\r\n\r\n")
        assert response(read_all(sock))[0] == 200


def test_a_slow_body_gets_408_in_openai_shape_at_the_body_deadline(tmp_path):
    with small_server(tmp_path, body_timeout_s=2) as (_, port, _):
        sock = raw(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")  # 1 byte in 0.5 s follows
        start, data = time.monotonic(), b""
        sock.settimeout(0.5)
        while time.monotonic() - start < 15:
            try:
                if not data:  # once answered, nothing more: a byte to a closed socket would reset it
                    sock.sendall(b"x")
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        waited = time.monotonic() - start
        status, headers, body = response(data)
        assert status == 408 and headers["content-type"] == "application/json", data
        assert_openai_error(body, "invalid_request_error", "request_timeout")
        assert 1.5 <= waited < 2 + 3, waited
        # A body sent in time is read.
        sock = raw(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        assert response(read_all(sock))[2] == b'{"bytes":3}'


def test_sigterm_answers_requests_in_flight_in_openai_shape_and_the_process_exits(tmp_path):
    with small_server(tmp_path) as (proc, port, marks):
        slow = raw(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        stream = raw(port, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        begun = stream.recv(65536)
        assert begun.startswith(b"HTTP/1.1 200")  # the stream has begun
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert_shutting_down(slow)
        status, headers, body = response(begun + read_all(stream))
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        events = [e for e in body.decode().split("\n\n") if e.strip()]
        assert events[0] == 'data: {"i": 0}', events[:2]
        last = events[-1].strip()
        assert last.startswith('data: {"error"'), events[-3:]
        assert_openai_error(last[len("data: "):].encode(), "server_error", "shutting_down")
        proc.wait(10)
        assert time.monotonic() - start < 10
        # The handlers were cancelled: their finally blocks ran.
        assert (marks / "slow").read_text() == "unwound" and (marks / "stream").read_text() == "unwound"


# ----------------------------------------------------------------------------- the real `serve --public`


@pytest.fixture(scope="module")
def public_serve(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("public-serve")
    engines = serve_engines(tmp)
    port = free_port()
    with running_server(["serve", "--port", str(port), "--public", "--engines-dir", str(engines)], "/v1/models", port,
                        tmp / "serve.log") as url:
        proc = next(p for p in psutil.Process().children(recursive=True) if str(port) in command_line(p).split())
        yield url, port, proc


LONG = {"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 512, "temperature": 0}  # counts on to the last token


def post(port: int, body: dict, forwarded: str | None = None) -> socket.socket:
    data = json.dumps(body).encode()
    header = f"X-Forwarded-For: {forwarded}\r\n".encode() if forwarded else b""
    return raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Content-Type: application/json\r\n" + header + f"Content-Length: {len(data)}\r\n\r\n".encode() + data,
               timeout=120)


@pytest.mark.bundled
def test_serve_public_counts_forged_forwarded_for_as_one_client(public_serve):
    _, port, _ = public_serve
    socks = [post(port, {**LONG, "stream": True}, forwarded=f"198.51.100.{i}") for i in range(5)]
    try:
        statuses = []
        for sock in socks:
            head = sock.recv(65536)
            statuses.append(int(head.split()[1]))
        # One client (the connection's address), whose bound is 2 generations running or waiting.
        assert set(statuses) <= {200, 429} and statuses.count(200) <= 2 and statuses.count(429) >= 3, statuses
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.bundled
def test_serve_public_answers_sigterm_mid_completion_with_json_503(public_serve):
    _, port, proc = public_serve  # the module's last test: it stops the server
    # The streams just dropped are cancelled at their next step: wait until this client may start one again.
    for _ in range(120):
        sock = post(port, {**LONG, "max_tokens": 1})
        status = response(read_all(sock))[0]
        if status != 429:
            break
        time.sleep(0.25)
    assert status == 200
    sock = post(port, LONG)
    sock.settimeout(1.5)
    with pytest.raises(socket.timeout):
        sock.recv(1)  # still generating
    sock.settimeout(30)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert_shutting_down(sock)
    proc.wait(10)
    assert time.monotonic() - start < 10
