"""A quota on Gradio's uploads (POST /gradio_api/upload): bytes per address and in total over a time window.

Gradio stores every upload in its cache for an hour (delete_cache) and counts nothing per client: 25 uploads of 8 MB
from one client, five at a time, filled 193 MB in four seconds. The only files this app reads are trace files for a
replay, so a visitor needs a few at most. This ASGI middleware reserves an upload's declared size against its address
(the connection's, as the server resolved it) and the server's total before Gradio reads a byte, refuses what would go
over in one JSON sentence (429), counts what a client sends past its declared size, and removes the stored files once
their window has passed (a page may replay its file again meanwhile), well before Gradio's hour.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.service.http import answer
from app.ui.inputs import error_json

UPLOAD_PATH = "/gradio_api/upload"


class Ledger:
    """Who uploaded how many bytes when, and which files those uploads stored. Thread-safe; times are monotonic."""

    def __init__(self, per_address: int | None, total: int | None, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_address, self.total, self.window_s, self.clock = per_address, total, window_s, clock
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []  # {"address", "bytes", "at", "files"}

    def _expire(self) -> list[str]:
        now = self.clock()
        old = [e for e in self._entries if now - e["at"] >= self.window_s]
        self._entries = [e for e in self._entries if now - e["at"] < self.window_s]
        return [f for e in old for f in e["files"]]

    def _held(self, address: str) -> tuple[int, int]:
        """Bytes counted now for `address` and for everyone (under the lock)."""
        return (sum(e["bytes"] for e in self._entries if e["address"] == address), sum(e["bytes"] for e in self._entries))

    def reserve(self, address: str, size: int) -> dict[str, Any] | str:
        """An entry holding `size` bytes for `address`, or the sentence refusing it."""
        with self._lock:
            stale = self._expire()
            ours, everyone = self._held(address)
            refusal = None
            if self.per_address is not None and ours + size > self.per_address:
                refusal = (f"your address has uploaded {ours / 1e6:.1f} MB in the last {self.window_s / 60:.0f} minutes; "
                           f"this server takes at most {self.per_address / 1e6:.0f} MB per address in that time: "
                           "replay a file you uploaded, or try later")
            elif self.total is not None and everyone + size > self.total:
                refusal = (f"this server holds {everyone / 1e6:.0f} MB of recent uploads, the most it keeps: "
                           "try again in a few minutes")
            entry = {"address": address, "bytes": size, "at": self.clock(), "files": []}
            if refusal is None:
                self._entries.append(entry)
        _remove(stale)
        return refusal if refusal is not None else entry

    def grow(self, entry: dict[str, Any], size: int) -> bool:
        """Count `size` bytes more on a reserved entry (a body longer than declared, or chunked); False when that
        goes over a bound (the entry keeps what it had)."""
        with self._lock:
            ours, everyone = self._held(entry["address"])
            if (self.per_address is not None and ours + size > self.per_address) or \
                    (self.total is not None and everyone + size > self.total):
                return False
            entry["bytes"] += size
            return True

    def release(self, entry: dict[str, Any]) -> None:
        """A refused or failed upload stored nothing: its bytes no longer count."""
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)

    def stored(self, entry: dict[str, Any], files: list[str]) -> None:
        with self._lock:
            entry["files"] = list(files)

    def sweep(self) -> None:
        with self._lock:
            stale = self._expire()
        _remove(stale)


def _remove(files: list[str]) -> None:
    for f in files:
        Path(f).unlink(missing_ok=True)


class UploadQuota:
    """ASGI middleware: see the module's docstring. `ledger` None: uploads pass as Gradio takes them."""

    def __init__(self, app: Any, ledger: Ledger | None = None) -> None:
        self.app, self.ledger = app, ledger

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        ledger = self.ledger
        if ledger is None or scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith(UPLOAD_PATH):
            await self.app(scope, receive, send)
            return
        address = (scope.get("client") or ("unknown",))[0]
        headers = dict(scope.get("headers") or [])
        try:
            declared = max(0, int(headers.get(b"content-length", b"0")))
        except ValueError:
            declared = 0
        entry = ledger.reserve(address, declared)
        if isinstance(entry, str):
            await answer(send, 429, error_json(entry), close=False)
            return
        received, over = 0, False

        async def counted() -> dict:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > entry["bytes"] and not ledger.grow(entry, received - entry["bytes"]):
                    over = True
                    return {"type": "http.disconnect"}  # Gradio stops reading and stores nothing more
            return message

        status, body = 0, b""

        async def watched(message: dict) -> None:
            nonlocal status, body
            if over:
                return  # the refusal below answers instead
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status < 300:
                body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not over:
                raise
        finally:
            if over or not 200 <= status < 300:
                ledger.release(entry)
        if over:
            await answer(send, 429, error_json("this upload goes over what this server takes from one address or in all: "
                                           "replay a file you uploaded, or try later"), close=False)
            return
        try:
            files = json.loads(body) if body else []
        except ValueError:
            files = []
        ledger.stored(entry, [f for f in files if isinstance(f, str)] if isinstance(files, list) else [])
