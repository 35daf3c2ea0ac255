"""The OpenAI-compatible wire every server this app talks to speaks: its event stream and its errors."""

from __future__ import annotations

import http.client
import json
import urllib.error
from collections.abc import Iterator

from app.models import ModelError


# What a request to a server that goes away can raise: a refused or reset connection (OSError, urllib's URLError
# among them), a body cut short (http.client.IncompleteRead) or a garbled status line, a body that is not JSON.
WIRE_ERRORS = (OSError, http.client.HTTPException, ValueError)


class RemoteError(ModelError):
    """The remote server cannot be reached or refused the request."""


def sse(response) -> Iterator[dict]:
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`; a stream that breaks off (the server
    went away or stopped answering) raises RemoteError, in words."""
    try:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)
    except (OSError, http.client.HTTPException) as err:
        raise RemoteError(f"the server's stream broke off: {reason(err) or type(err).__name__}") from err


def error_message(err: urllib.error.HTTPError) -> str:
    """The message of an OpenAI-shaped (or FastAPI-shaped) error body; the status's reason when there is none."""
    try:
        data = json.loads(err.read())
    except WIRE_ERRORS:  # no body, a cut one (the server went away mid-answer), or not JSON
        return err.reason
    if not isinstance(data, dict):
        return err.reason
    if isinstance(data.get("error"), dict):
        return str(data["error"].get("message", err.reason))
    return str(data.get("detail", data))


def reason(err: Exception) -> str:
    return str(getattr(err, "reason", err))
