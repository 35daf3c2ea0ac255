"""What each page session is running, so its Stop button (or closing the page) can end it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app.service.policy import address_of, visitor


MAX_REPLAYS = 4  # replays playing at once on a server (each redraws every 0.75 s for up to two minutes)


def visitor_of(request: gr.Request | None) -> str | None:
    """Who is asking (policy.visitor): the connection's address, as the server resolved it (a proxy's report only
    from the proxies the operator trusts: --forwarded-allow-ips), then the page's session hash, which the client
    chooses and so only splits its address's share. None without a request (a call from Python)."""
    if request is None:
        return None
    client = getattr(request, "client", None)
    return visitor(getattr(client, "host", None), getattr(request, "session_hash", None))


def session_of(request: gr.Request | None) -> str:
    """The key of what a page runs (for its Stop): its visitor, or "local" for a call from Python."""
    return visitor_of(request) or "local"


class Sessions:
    """Session -> the one thing it runs (anything with `cancel()`: a job, a replay's skip, a training run's stop)."""

    def __init__(self, max_replays: int = MAX_REPLAYS, per_address: int | None = None) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, Any] = {}
        self._replays: dict[str, threading.Event] = {}  # session -> the skip flag of the replay it plays
        self.max_replays = max_replays
        self.per_address = per_address  # replays one address may play at once (Policy.address_replays)

    @contextlib.contextmanager
    def replaying(self, session: str) -> Iterator[threading.Event]:
        """A replay's skip flag, the session's running job while it plays (Stop sets it). Replays have their own
        bound, apart from generations: one per session (a newer one ends the older) and `max_replays` in all."""
        skip = threading.Event()
        handle = SimpleNamespace(cancel=skip.set)
        with self._lock:
            older = self._replays.get(session)
            ours = sum(address_of(k) == address_of(session) for k in self._replays)
            if older is not None:
                older.set()
            elif self.per_address is not None and ours >= self.per_address:
                raise gr.Error(f"your address already plays {ours} replay(s) at the recorded pace, the most one address "
                               "may: stop it, or untick the recorded pace to draw this one at once", duration=None)
            elif len(self._replays) >= self.max_replays:
                raise gr.Error(f"{len(self._replays)} replays are playing on this server, the most it plays at once: "
                               "try again in a minute, or untick the recorded pace to draw it at once", duration=None)
            self._replays[session] = skip
        try:
            with self.running(session, handle):
                yield skip
        finally:
            with self._lock:
                if self._replays.get(session) is skip:
                    del self._replays[session]

    @contextlib.contextmanager
    def running(self, session: str, handle: Any) -> Iterator[Any]:
        """`handle` is the session's while the block runs (a newer one replaces it; it is not removed by the older)."""
        with self._lock:
            self._running[session] = handle
        try:
            yield handle
        finally:
            with self._lock:
                if self._running.get(session) is handle:
                    del self._running[session]

    def get(self, session: str | None) -> Any | None:
        with self._lock:
            return self._running.get(session)

    def cancel(self, session: str | None) -> Any | None:
        """Cancel what the session runs; returns it (None: nothing was running)."""
        handle = self.get(session)
        if handle is not None:
            handle.cancel()
        return handle
