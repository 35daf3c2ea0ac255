"""The type of every input of every Gradio endpoint, checked before Gradio reads it.

Gradio converts what an API client sends into what the component holds: a Textbox turns the list ["a"] into the text
"['a']", a Checkbox takes any truthy value. A handler cannot tell such a value from one typed in the page. This ASGI
middleware reads the body of a call (POST /gradio_api/call/<name>, /gradio_api/run/<name>, /gradio_api/queue/join),
finds the endpoint by its name or its index, and refuses in one JSON sentence (400) an input whose JSON type is not
the one its component declares (Gradio's own api_info: string, number, integer, boolean); null and the types it does
not declare (files, states) go on to Gradio and the handlers, which word them. A call (/call/<name>) of an endpoint
that does not exist answers 404 in words instead of Gradio's 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.modes.errors import one_line
from app.service.http import answer

MAX_BODY = 1_000_000  # a call's JSON (files come by upload): far above any form of this app
_CALL = re.compile(r"/gradio_api/(call|run)/([^/]+)/?$")
_JOIN = re.compile(r"/gradio_api/queue/join/?$")
_KINDS = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,)}
_WORDS = {"string": "text", "number": "a number", "integer": "a whole number", "boolean": "true or false"}


Params = list[tuple[str, "str | None", bool]]


def endpoints_of(blocks: Any) -> dict[str | int, Params]:
    """Each endpoint's inputs as (label, JSON type or None, whether the API leaves it out: a state), by api name and by
    function index."""
    out: dict[str | int, Params] = {}
    for index, fn in blocks.fns.items():
        params = []
        for component in fn.inputs:
            info = getattr(component, "api_info_as_input", None)
            schema = info() if callable(info) else {}
            kind = schema.get("type") if isinstance(schema, dict) else None
            label = getattr(component, "label", None) or type(component).__name__.lower()
            params.append((str(label), kind if isinstance(kind, str) and kind in _KINDS else None,
                           bool(getattr(component, "skip_api", False))))
        out[index] = params
        if fn.api_name:
            out[str(fn.api_name)] = params
    return out


def refusal(params: Params, data: Any) -> str | None:
    """Why `data` cannot be the inputs `params` declare, in one sentence; None when each typed input has its type. Like
    Gradio, `data` holds either every input or only those the API lists (states left out)."""
    if not isinstance(data, list):
        return "a call's data must be a JSON list of the endpoint's inputs, in the order GET /gradio_api/info lists them"
    if len(data) != len(params):
        params = [p for p in params if not p[2]]
    for i, ((label, kind, _), value) in enumerate(zip(params, data)):
        if kind is None or value is None:
            continue
        ok = isinstance(value, _KINDS[kind]) and not (kind != "boolean" and isinstance(value, bool))
        if not ok:
            shown = json.dumps(value, allow_nan=True)[:40]
            return f"input {i + 1} ({label[:40]}) must be {_WORDS[kind]}, got {shown}"
    return None


def error_json(message: str) -> bytes:
    return json.dumps({"error": message}).encode()  # Gradio's own error shape


class InputTypes:
    """ASGI middleware: see the module's docstring. `endpoints`: endpoints_of(the Blocks)."""

    def __init__(self, app: Any, endpoints: dict[str | int, Params]) -> None:
        self.app, self.endpoints = app, endpoints

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        call = _CALL.search(path) if scope["type"] == "http" and scope["method"] == "POST" else None
        join = _JOIN.search(path) if scope["type"] == "http" and scope["method"] == "POST" else None
        if call is None and join is None:
            await self.app(scope, receive, send)
            return
        if call is not None and call.group(1) == "call" and call.group(2) not in self.endpoints:
            await answer(send, 404, error_json(f"there is no endpoint '{one_line(call.group(2))}' here: GET /gradio_api/info "
                                            "lists the endpoints and their inputs"))
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                await answer(send, 413, error_json(f"a call's inputs are at most {MAX_BODY:,} bytes of JSON (files come by upload)"))
                return
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            payload = None  # Gradio answers what it cannot parse
        if isinstance(payload, dict):
            # The page posts /run/predict with the function's index in the body; an API client names the endpoint.
            named = call is not None and call.group(2) in self.endpoints
            key = call.group(2) if named else payload.get("fn_index")
            params = self.endpoints.get(key) if isinstance(key, (str, int)) and not isinstance(key, bool) else None
            reason = refusal(params, payload.get("data")) if params is not None else None
            if reason is not None:
                await answer(send, 400, error_json(reason))
                return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:
                return await receive()  # after the body: a disconnect, when it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
