"""Words for the errors Gradio answers without any: `{"error": null}`.

Gradio words an error only when it is a `gr.Error` (every refusal of this app is one) or when the app runs with
`show_error`, which would send any exception's text, paths of the server included. What fails inside Gradio's own
input handling, before a handler runs (a call with the wrong number of inputs, a file given by a path on the server
instead of uploaded), reaches a client as a bare `null`. This ASGI middleware puts one sentence in its place, in
each of the three shapes Gradio answers in: a JSON body, the `/call` API's event stream and the page's queue stream,
and takes the Python type names out of Gradio's own refusals. Nothing else of a response changes.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Gradio's own refusals name Python types ("Value: 'p' (type: <class 'str'>) is not in the list of choices"): the value
# and the choices say it.
_PYTHON_TYPE = re.compile(r" \(type: <class '[\w.]+'>\)")
MESSAGE = ("the server could not read this request's inputs: each endpoint takes the inputs GET /gradio_api/info "
           "lists, in that order, and a file only as one uploaded first (POST /gradio_api/upload)")


def _worded(error: dict) -> dict:
    """An error payload ({"error": message or None, ...}) with a message, and no Python type names in it."""
    if error.get("error") is None:
        return {**error, "error": MESSAGE, "visible": True}
    if isinstance(error["error"], str):
        return {**error, "error": _PYTHON_TYPE.sub("", error["error"])}
    return error


def _event_stream(chunk: bytes) -> bytes:
    """An event-stream chunk with its error payloads worded (the lines are JSON; others pass as they are)."""
    lines = chunk.split(b"\n")
    for i, line in enumerate(lines):
        if not line.startswith(b"data: ") or b'"error"' not in line:
            continue
        try:
            data = json.loads(line[6:])
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if i and lines[i - 1].rstrip(b"\r") == b"event: error" and "error" in data:  # the /call API
            worded = _worded(data)
        elif data.get("msg") == "process_completed" and data.get("success") is False and isinstance(data.get("output"), dict):
            worded = {**data, "output": _worded(data["output"])}  # the page's queue
        else:
            continue
        if worded != data:
            lines[i] = b"data: " + json.dumps(worded).encode()
    return b"\n".join(lines)


class WordUnworded:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = ""  # "stream", "json" (an error answer, buffered whole) or "" (passed through)
        start: dict = {}
        body = b""

        async def wrapped(message: dict) -> None:
            nonlocal kind, start, body
            if message["type"] == "http.response.start":
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                content_type = headers.get(b"content-type", b"")
                if content_type.startswith(b"text/event-stream"):
                    kind = "stream"
                elif content_type.startswith(b"application/json") and message["status"] >= 400:
                    kind, start = "json", message
                    return  # sent with the body, whose length may change
                await send(message)
                return
            if message["type"] != "http.response.body" or not kind:
                await send(message)
                return
            if kind == "stream":
                await send({**message, "body": _event_stream(message.get("body", b""))})
                return
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            try:
                data = json.loads(body)
            except ValueError:
                data = None
            if isinstance(data, dict) and "error" in data and _worded(data) != data:
                body = json.dumps(_worded(data)).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, wrapped)
