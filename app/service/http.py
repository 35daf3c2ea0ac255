"""The one HTTP layer of both servers (the web app and `serve`): who a client is, how long a client may take to send a
request, and what a request in flight is answered when the server stops.

uvicorn's defaults are not fit for a public server. They take X-Forwarded-For from 127.0.0.1 as the client's address,
so one loopback client that forged five headers was counted as five clients, and behind a Space's proxy every client
would have been the proxy. They set no read deadline, so 12 clients sending a body byte every 2 s (and 6 sending
headers that slowly) held connections for as long as they liked. And on SIGTERM a request whose answer had not begun
got uvicorn's text/plain 500, a stream was cut with no error event. Here: the connection's own address is the client
unless its peer is a proxy the operator named (`forwarded_allow_ips`, uvicorn's own rule: the rightmost address in
X-Forwarded-For that is not a trusted proxy), headers must be complete within `header_timeout_s` of a connection's
start (and of each response on a kept-alive connection), a body within `body_timeout_s` (408), and when the server
stops, a request still running after `shutdown_grace_s` is cancelled and answered in OpenAI's error shape: a 503, or
a last `data: {"error": ...}` event on a stream.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class HttpSettings:
    forwarded_allow_ips: tuple[str, ...] = ()  # proxies (addresses or networks; "*" = any) whose X-Forwarded-For counts
    header_timeout_s: float = 10.0  # from a connection's start, or its last response, to a request's complete headers
    body_timeout_s: float = 30.0  # from complete headers to the body's last byte
    shutdown_grace_s: float = 2.0  # how long a request in flight may still finish once the server stops

    def __post_init__(self) -> None:
        # uvicorn would keep a mistyped address as a literal that never matches: fail at start-up instead.
        for entry in self.forwarded_allow_ips:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"'{entry}' is not an IP address or network") from None


def error_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


TOO_SLOW = error_body("the request body did not arrive in time: send it whole within the server's body deadline",
                      "invalid_request_error", "request_timeout")
SHUTTING_DOWN = error_body("the server is shutting down: retry the request in a moment", "server_error",
                           "shutting_down")


async def answer(send, status: int, body: bytes, close: bool = True) -> None:
    """A whole JSON response. `close`: the connection closes after it, for a client that may still be sending a request
    nobody will read (a refusal that reads the body first, or lets the server drain it, keeps the connection)."""
    headers = [(b"content-type", b"application/json")] + ([(b"connection", b"close")] if close else [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request headers are not complete `header_timeout_s` after
    the connection opened or its last response ended (uvicorn's own keep-alive timer restarts at every byte)."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are complete: its body has a deadline of its own
            self._disarm()

    def handle_websocket_upgrade(self, event: Any) -> None:
        self._disarm()  # the connection is the websocket protocol's from here
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        # Armed first: the parent starts a pipelined request at once, which disarms it again.
        self._arm()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class BodyDeadline:
    """ASGI middleware: a request body not complete `timeout_s` after its headers reads as `http.disconnect` to the
    app, and the client gets a 408 unless its response has begun (the app's own answer to that "disconnect", such as
    FastAPI's 400, is dropped)."""

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_read = late = started = answered = False

        async def receive_in_time():
            nonlocal body_read, late, answered
            if body_read:
                return await receive()  # waiting for a disconnect has no deadline
            if late:
                return {"type": "http.disconnect"}
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                late = True
                if not started:
                    answered = True
                    await answer(send, 408, TOO_SLOW)
                return {"type": "http.disconnect"}
            body_read = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def send_unless_answered(message) -> None:
            nonlocal started
            if answered:
                return
            started = True
            await send(message)

        await self.app(scope, receive_in_time, send_unless_answered)


class ShutdownAnswers:
    """ASGI middleware: once `close()` is called (the server begins to stop), a request still running after `grace_s`
    is cancelled (its handlers' `finally` blocks run) and answered: a 503 if its response has not begun, a last
    `data: {"error": ...}` event if it is an event stream. Any other begun response can only be cut."""

    def __init__(self, app: Any, grace_s: float) -> None:
        self.app, self.grace_s = app, grace_s
        self.closing = asyncio.Event()

    def close(self) -> None:
        self.closing.set()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.closing.is_set():
            return await answer(send, 503, SHUTTING_DOWN)
        started = stream = complete = answered = False

        async def send_tracked(message) -> None:
            nonlocal started, stream, complete
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
                stream = any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                             for name, value in message.get("headers", []))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        # The app runs as a task of its own so that it can be cancelled while this one still answers.
        app = asyncio.ensure_future(self.app(scope, receive, send_tracked))
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({app, closing}, return_when=asyncio.FIRST_COMPLETED)
            if not app.done():
                await asyncio.wait({app}, timeout=self.grace_s)
            if app.done():
                return await app
            answered = True
            app.cancel()
            if not started:
                await answer(send, 503, SHUTTING_DOWN)
            elif stream and not complete:
                await send({"type": "http.response.body", "body": b"data: " + SHUTTING_DOWN + b"\n\n"})
            # A moment for the handlers' finally blocks (a job's cancel); a thread they wait on may not stop sooner.
            await asyncio.wait({app}, timeout=1.0)
        finally:
            closing.cancel()
            if not app.done():
                app.cancel()


class _Server(uvicorn.Server):
    """uvicorn's server, telling `on_exit` when it begins to stop (a signal, or should_exit)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    async def shutdown(self, sockets=None) -> None:
        self.on_exit()
        await super().shutdown(sockets=sockets)


def serve(app: Any, host: str, port: int, settings: HttpSettings = HttpSettings()) -> None:
    """Serve the ASGI `app` on host:port in this (the main) thread until SIGINT or SIGTERM."""
    answers = ShutdownAnswers(BodyDeadline(app, settings.body_timeout_s), settings.shutdown_grace_s)
    trusted = settings.forwarded_allow_ips
    config = uvicorn.Config(
        answers, host=host, port=port, log_level="warning",
        # An empty list trusts no proxy; uvicorn's own default (None) would trust 127.0.0.1 or $FORWARDED_ALLOW_IPS.
        proxy_headers=True, forwarded_allow_ips="*" if "*" in trusted else list(trusted),
        http=functools.partial(HeaderDeadline, header_timeout_s=settings.header_timeout_s),
        # A backstop only: ShutdownAnswers has ended every request by grace + 1 s, unless one ignores its cancel.
        timeout_graceful_shutdown=settings.shutdown_grace_s + 2)
    _Server(config, answers.close).run()
