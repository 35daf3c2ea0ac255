"""Generation jobs: a bounded queue in front of a fixed number of workers, cancellation and a time limit.

A job runs a `work(cancel)` function that yields JSON-like messages in a worker thread; the
consumer reads them from `Job.messages()` as they come. Cancelling (the consumer's Stop button,
a closed HTTP stream, the time limit) sets the job's `cancel` event, which the verify loop checks
between steps, so a cancelled job still ends with a proper last message.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
Work = Callable[[threading.Event], Iterator[dict[str, Any]]]
_END = object()


# How long a race waits for its page to finish drawing before it steps anyway (a page that went away holds nothing).
GATE_WAIT_S = 2.0


def race(run: Work, baseline: Work, interleave: bool, gate: threading.Lock | None = None) -> Work:
    """One work of two generations' messages, each marked with its "side" ("run" or "baseline"). Interleaved, the one
    that has committed fewer tokens steps next (the baseline on a tie), so the two advance together and every change
    of the machine's load falls on both; the verify loop's clock leaves out the time a generation waits at its yield
    (loop._Clock), so each is timed by its own passes. Otherwise the baseline runs first, then the run.

    `gate`: held by the page while it draws (streams.stream). A step waits for it and holds it, so no step shares the
    interpreter with a redraw: a redraw holds Python's lock for tens of milliseconds, which landed on whichever side
    was stepping and made a 5-token step read 0.91 of a 1-token one."""

    def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
        live = {"baseline": baseline(cancel), "run": run(cancel)}
        tokens = dict.fromkeys(live, 0)
        try:
            while live:
                side = min(live, key=lambda s: (tokens[s], s != "baseline")) if interleave else next(iter(live))
                held = gate is not None and gate.acquire(timeout=GATE_WAIT_S)
                try:
                    message = next(live[side], None)
                finally:
                    if held:
                        gate.release()
                if message is None:
                    del live[side]
                    continue
                if message.get("type") == "step":
                    tokens[side] = (message.get("totals") or {}).get("new_tokens", tokens[side] + 1)
                yield {**message, "side": side}
        finally:
            for messages in live.values():
                messages.close()

    return work


class QueueFull(RuntimeError):
    """Too many jobs are waiting; the message says so in words a user understands."""


class TooMany(QueueFull):
    """One visitor or client has as many jobs running or waiting as it may; the message says so."""


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 1  # generations running at once (2 CPU cores: more only share them)
    max_queue: int = 8  # jobs waiting for a worker before new ones are refused
    time_limit_s: float = 300.0  # a running job is cancelled after this long
    max_new_tokens: int = 1024
    max_prompt_tokens: int = 4096


class Job:
    def __init__(self, job_id: str, work: Work, time_limit_s: float, owner: str | None = None,
                 group: str | None = None) -> None:
        self.id = job_id
        self.owner, self.group = owner, group
        self.cancel_event = threading.Event()
        self.status = "queued"  # queued | running | done | cancelled | timeout | failed
        self.error: str | None = None
        self._work = work
        self._time_limit_s = time_limit_s
        self._timed_out = False
        self._out: queue.Queue = queue.Queue()
        self.done = threading.Event()

    def cancel(self) -> None:
        self.cancel_event.set()

    def holds_place(self) -> bool:
        """Whether it counts against the bounds: unfinished, and running or waiting uncancelled (a cancelled running
        job still holds its worker until its next step)."""
        return not self.done.is_set() and (self.status == "running" or not self.cancel_event.is_set())

    @property
    def timed_out(self) -> bool:
        return self._timed_out

    def messages(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Every message of the job, in order, as it is produced; ends when the job does."""
        while True:
            item = self._out.get(timeout=timeout)
            if item is _END:
                self._out.put(_END)  # a second reader ends too
                return
            yield item

    def batches(self, every: float = 0.2) -> Iterator[list[dict[str, Any]]]:
        """The messages in batches: whatever arrived, at most every `every` seconds. A UI redraws once per
        batch, so drawing never slows generation, however fast the steps come."""
        while True:
            batch = [self._out.get()]
            deadline = time.monotonic() + every
            while batch[-1] is not _END:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(self._out.get(timeout=left))
                except queue.Empty:
                    break
            if batch[-1] is _END:
                self._out.put(_END)
                if batch[:-1]:
                    yield batch[:-1]
                return
            yield batch

    def _run(self) -> None:
        if self.cancel_event.is_set():  # cancelled while it waited in the queue
            self.status = "cancelled"
            self._out.put({"type": "end", "finish_reason": "cancelled", "error": None})
            self._finish()
            return
        self.status = "running"

        def expire() -> None:
            self._timed_out = True
            self.cancel_event.set()

        timer = threading.Timer(self._time_limit_s, expire) if math.isfinite(self._time_limit_s) else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            for message in self._work(self.cancel_event):
                if self._timed_out and message.get("finish_reason") == "cancelled":
                    message = {**message, "finish_reason": "timeout"}  # the time limit stopped it, not its consumer
                self._out.put(message)
            self.status = "timeout" if self._timed_out else "cancelled" if self.cancel_event.is_set() else "done"
        except Exception as err:  # the job's failure is reported to its consumer, not raised in a worker
            self.status, self.error = "failed", f"{type(err).__name__}: {err}"
            self._out.put({"type": "end", "finish_reason": "error", "error": self.error})
        finally:
            if timer is not None:
                timer.cancel()
            self._finish()

    def _finish(self) -> None:
        # Done before the consumer can see the end: its next job (a race's second run) must not count this one.
        self.done.set()
        self._out.put(_END)


class JobManager:
    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self._worker = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=limits.max_concurrency, thread_name_prefix="specdec-job",
                                        initializer=self._mark_worker)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._jobs: dict[str, Job] = {}
        # Jobs not yet handed to a worker, and when each group (address) was last served: a free worker takes the
        # first job of the group served longest ago, so one address's burst waits behind everyone else's next job
        # instead of in front of it.
        self._waiting: list[Job] = []
        self._served: dict[str | None, int] = {}
        self._turns = itertools.count()

    def submit(self, work: Work, owner: str | None = None, per_owner: int | None = None,
               group: str | None = None, per_group: int | None = None) -> Job:
        """Queue `work`. `owner` (a visitor, a client address) may have at most `per_owner` jobs running or waiting, and
        the owners of one `group` (an address) at most `per_group` together, so no one fills the queue for everybody else."""
        with self._lock:
            # Counted from jobs that still hold a place: unfinished, and not cancelled while they wait (such a job ends
            # as soon as a worker reaches it, so it leaves the queue at once). Not from status == "queued": a job just
            # handed to a free worker is still "queued" until that thread starts it, and a burst must not be refused.
            held = [j for j in self._jobs.values() if j.holds_place()]
            if owner is not None and per_owner is not None:
                mine = sum(j.owner == owner for j in held)
                if mine >= per_owner:
                    raise TooMany(f"you already have {mine} generation(s) running or waiting on this server, the most one "
                                  "visitor may: wait for one to finish (or stop it)")
            if group is not None and per_group is not None:
                ours = sum(j.group == group for j in held)
                if ours >= per_group:
                    raise TooMany(f"your address already has {ours} generation(s) running or waiting on this server, the "
                                  "most one address may (however many pages or sessions it opens): wait for one to finish")
            waiting = max(0, len(held) - self.limits.max_concurrency)
            if waiting >= self.limits.max_queue:
                raise QueueFull(
                    f"the server is busy: {waiting} generations are already waiting (limit {self.limits.max_queue}); "
                    "try again in a moment"
                )
            job = Job(f"job-{next(self._ids)}", work, self.limits.time_limit_s, owner, group)
            self._jobs[job.id] = job
            self._waiting.append(job)
            # Finished jobs are forgotten: only queued and running ones count or can be cancelled by id.
            for old in [k for k, j in self._jobs.items() if j.done.is_set()]:
                del self._jobs[old]
        self._pool.submit(self._run_next)  # one worker turn per job: each runs once, in the order _next picks
        return job

    def _run_next(self) -> None:
        with self._lock:
            job = self._next()
        job._run()

    def _next(self) -> Job:
        """The waiting job to run now: one cancelled while it waited (it ends at once), else the first of the group
        served longest ago (a group never served first), in submission order within a group."""
        best = min(range(len(self._waiting)), key=lambda i: (not self._waiting[i].cancel_event.is_set(),
                                                             self._served.get(self._waiting[i].group, -1), i))
        job = self._waiting.pop(best)
        self._served[job.group] = next(self._turns)
        if len(self._served) > 1024:  # forget the groups with nothing waiting: the map stays small
            self._served = {j.group: self._served.get(j.group, -1) for j in self._waiting}
        return job

    def _mark_worker(self) -> None:
        self._worker.on = True

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on a job worker (directly when already on one), after the jobs queued before it; its result or
        its exception. Whatever computes with a model, loading it included, runs here and not on the caller's
        thread: PyTorch's OpenMP runtime keeps a team of threads for every thread that has run a parallel
        op, and with more such threads than cores each op pays for waking its team (a bundled-model pass
        took ~1.7x as long on 2 cores once a second thread had run one)."""
        if getattr(self._worker, "on", False):
            return fn()
        return self._pool.submit(fn).result()

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def active(self) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if not j.done.is_set()]

    def shutdown(self) -> None:
        for job in self.active():
            job.cancel()
        self._pool.shutdown(wait=True, cancel_futures=False)
