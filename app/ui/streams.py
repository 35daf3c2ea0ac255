"""Running something as a page session's job (Stop and closing the page end it) and pacing its redraws: shared by
the Run and Compare tabs. Drawing happens once per batch of messages (Job.batches), and only when due (Pace), so a
fast generation is never slowed by its own display."""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from app.backends import registry
from app.modes import ConfigError
from app.service.api import ModelError, Service
from app.service.jobs import QueueFull
from app.traces import Recording
from app.ui.sessions import Sessions, session_of

REDRAW_S = 0.75
WAITING_S = 1.0  # how often the status counts the seconds a run waits for its engine
REPLAY_MAX_S = 120  # a replay at the recorded pace lasts at most this long


def preparing_note(data: Any, seconds: float) -> str:
    """What a run waits for before its first step, in words (registry.waiting): on an engine its start, else the
    model's load."""
    request = getattr(data, "request", None)
    backend = getattr(request, "backend", None) or (data.get("backend") if isinstance(data, dict) else None)
    return registry.waiting(backend, seconds)


def with_waiting(status: str, run: Recording, joint: str = " ") -> str:
    """A status line, and what its run waits for before its first step (stream sets `run.waiting`)."""
    return f"{status}{joint}{run.waiting}" if run.waiting else status


def prepared(prepare: Callable[[], Any], waiting: Callable[[float], Any]):
    """`prepare()` (what comes before a job's first step: a vLLM engine's start takes minutes) on a thread of its own;
    yields waiting(seconds so far) every WAITING_S while it runs and returns its job (`job = yield from ...`), or raises
    its error here. Closed while it runs (the page went away), the job it gives later is cancelled."""
    done: dict[str, Any] = {}
    abandoned = threading.Event()

    def work() -> None:
        try:
            done["job"] = prepare()
        except Exception as err:  # raised again on the caller's thread, below
            done["error"] = err
            return
        if abandoned.is_set():
            done["job"].cancel()

    preparing = threading.Thread(target=work, daemon=True, name="prepare")
    started = time.monotonic()
    preparing.start()
    try:
        while True:
            preparing.join(WAITING_S)
            if not preparing.is_alive():
                break
            yield waiting(time.monotonic() - started)
    finally:
        if preparing.is_alive():  # closed while waiting (a disconnect): whichever side comes second cancels the job
            abandoned.set()
            if "job" in done:
                done["job"].cancel()
    if "error" in done:
        raise done["error"]
    return done["job"]


def stream(service: Service, sessions: Sessions, session: str, data: dict[str, Any], prompt: str, run: Recording,
           baseline: Recording | None = None):
    """DecodeRequest `data` run as the session's job (Stop cancels it); each batch of messages added to `run`. While
    the service prepares it (a vLLM engine starting takes minutes), `run.waiting` says so, with the time so far.
    With `baseline` (its request in `baseline.request`) the two race in one job (Service.race), and its messages go
    to `baseline`."""
    text = prompt if isinstance(prompt, str) else ""
    # Held from handing a batch to the caller until it asks for the next (it has drawn it and Gradio has sent it): a
    # race steps only outside it, so its clocks never count a redraw (jobs.race).
    drawing = threading.Lock()

    def submit():
        return (service.submit(data, text, visitor=session) if baseline is None
                else service.race(data, baseline.request, text, visitor=session, gate=drawing))

    def waiting(seconds: float) -> Recording:
        run.waiting = preparing_note(data, seconds)
        return run

    try:
        job = yield from prepared(submit, waiting)
    except (ConfigError, ModelError, QueueFull) as err:
        raise gr.Error(service.relative(str(err)), duration=None) from None
    finally:
        run.waiting = None
    with sessions.running(session, job):
        try:
            for batch in job.batches(REDRAW_S):
                for message in batch:
                    (baseline if message.get("side") == "baseline" else run).add(message)
                with drawing:
                    yield run
        finally:
            job.cancel()
    for r in (baseline, run):
        if r is not None and r.end and r.end.get("error"):
            raise gr.Error(f"generation failed: {r.end['error']}")


@contextlib.contextmanager
def skippable(sessions: Sessions, request: gr.Request | None):
    """A replay's skip flag, registered as the session's running job so Stop sets it."""
    with sessions.replaying(session_of(request)) as skip:
        yield skip


def stop(sessions: Sessions, request: gr.Request) -> str:
    job = sessions.cancel(session_of(request))
    if job is None:
        return "Nothing is running."
    # The run ends after its current step and says "stopped" itself; an answer here could land after that line.
    return gr.skip()


class Pace:
    """Redraw only when due: at most every REDRAW_S, and rarely enough that drawing takes at most
    about 5% of the wall time (the generation thread shares the interpreter and the cores with it)."""

    def __init__(self) -> None:
        self.last_at = -1e9
        self.cost = 0.0

    def due(self) -> bool:
        return time.perf_counter() - self.last_at >= max(REDRAW_S, 19 * self.cost)

    def __enter__(self) -> None:
        self.last_at = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.cost = time.perf_counter() - self.last_at


def paced(parts, draw):
    """draw(part) for the parts that come when a redraw is due (see Pace)."""
    pace = Pace()
    for part in parts:
        if pace.due():
            with pace:
                outputs = draw(part)
            yield outputs


def ticks(total: float, skip: threading.Event):
    """When to redraw a replay of a recording `total` seconds long at its recorded pace: seconds into
    the recording, one per REDRAW_S, the last one `total`; a recording over REPLAY_MAX_S is sped up to
    fit. Stops early once `skip` is set."""
    speed = max(1.0, total / REPLAY_MAX_S)
    start = time.perf_counter()
    while not skip.is_set():
        now = min(total, (time.perf_counter() - start) * speed)
        yield now
        if now >= total:
            return
        skip.wait(REDRAW_S)


def replayed(runs: list[Recording], skip: threading.Event):
    """The runs as they stood at each redraw, replayed at the recorded pace from one start, so they race
    as they would have side by side."""
    clocks = [clock(r.events) for r in runs]
    for now in ticks(max(c[-1] for c in clocks), skip):
        yield [r.prefix(bisect.bisect_right(c, now)) for r, c in zip(runs, clocks)]


def clock(events: list[dict]) -> list[float]:
    """When each step ended, in seconds from the run's start (never earlier than the step before)."""
    out, last = [], 0.0
    for e in events:
        last = max(last, e["totals"].get("elapsed_s", last))
        out.append(last)
    return out
