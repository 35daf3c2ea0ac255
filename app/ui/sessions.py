"""What each page session is running, so its Stop button (or closing the page) can end it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class Sessions:
    """Session -> the one thing it runs (anything with `cancel()`: a job, a replay's skip, a training run's stop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, Any] = {}

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
