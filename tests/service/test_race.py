"""A run and its baseline raced in one job, stepped in turn (jobs.race, Service.race), and the one rule for the ratio
printed from them (app/figures.py): on a machine whose load changes during the race, no ratio above τ, no step under
its pass, no interval past τ, and a quiet repeat inside the interval printed under load."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from app import figures
from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app import traces
from app.service.api import Service
from app.service.jobs import race
from app.traces import Recording
from helpers import busy_cores, serve_engines


def _steps(per_step: int, steps: int, log: list, side: str):
    def work(cancel):
        yield {"type": "start"}
        for i in range(1, steps + 1):
            log.append(side)
            yield {"type": "step", "totals": {"new_tokens": per_step * i}}
        yield {"type": "end"}
    return work


def test_race_steps_whichever_is_behind_in_tokens():
    log: list[str] = []
    work = race(_steps(3, 4, log, "run"), _steps(1, 12, log, "baseline"), interleave=True)
    messages = list(work(threading.Event()))
    assert {m["side"] for m in messages} == {"run", "baseline"}
    assert [m["type"] for m in messages if m["side"] == "run"] == ["start"] + ["step"] * 4 + ["end"]
    # Three baseline steps for every run step: neither gets ahead of the other by more than one step's tokens.
    assert "".join(s[0] for s in log) == "br" + "bbbr" * 3 + "bb"
    sequential: list[str] = []
    list(race(_steps(3, 4, sequential, "run"), _steps(1, 12, sequential, "baseline"), interleave=False)(threading.Event()))
    assert sequential == ["baseline"] * 12 + ["run"] * 4, "an engine's race: the baseline first, then the run"


def test_closing_a_race_closes_both_generations():
    closed = []

    def work(side):
        def gen(cancel):
            try:
                while True:
                    yield {"type": "step", "totals": {"new_tokens": 1}}
            finally:
                closed.append(side)
        return gen

    messages = race(work("run"), work("baseline"), interleave=True)(threading.Event())
    next(messages), next(messages)
    messages.close()
    assert sorted(closed) == ["baseline", "run"]


def test_the_loops_clock_leaves_out_the_time_it_waits_at_a_yield(tiny_model):
    """What a consumer does between two steps (here: sleeps, as a race does while the other side steps) is not the
    generation's time."""
    events, start = [], time.perf_counter()
    for event in generate(TransformersTarget(tiny_model, hidden_states=False), Autoregressive(), [1, 2, 3],
                          max_new_tokens=6):
        events.append(event)
        time.sleep(0.1)
    wall = time.perf_counter() - start
    assert wall > 0.6 and events[-1].totals["elapsed_s"] < wall - 0.5


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = Service(serve_engines(tmp_path_factory.mktemp("race")))
    yield s
    s.close()


PROMPT = "Repeat exactly three times: apples, pears, plums, cherries, grapes, melons, lemons."


def _race(service, mode="prompt_lookup", busy_during=None, tokens=96):
    """One raced run on the real bundled model (eager pass); `busy_during` "first half" or "second half": both cores
    busy for that part of it, a load that changes in the middle of the race."""
    data = {"speculative_config": {"decoding_type": service.registry[mode].decoding_type}, "max_new_tokens": tokens}
    base = {"speculative_config": {"decoding_type": "Autoregressive"}, "max_new_tokens": tokens}
    run, baseline = Recording(mode), Recording("autoregressive")
    load = contextlib.ExitStack()
    if busy_during == "first half":
        load.enter_context(busy_cores())
    with load:
        for message in service.race(data, base, PROMPT).messages():
            (baseline if message["side"] == "baseline" else run).add(message)
            done = len(run.token_ids) + len(baseline.token_ids)
            if busy_during and done >= tokens:  # halfway through the two runs' tokens: the load changes
                load.close()
                if busy_during == "second half":
                    load.enter_context(busy_cores())
                busy_during = None
    return run, baseline


def test_a_ratio_measured_while_the_load_changes_is_possible_and_a_quiet_repeat_lies_in_its_interval(service):
    _race(service, tokens=8)  # one-off costs (allocations, first calls) paid before anything is timed
    for busy in ("first half", "second half"):
        run, baseline = _race(service, busy_during=busy)
        assert run.token_ids == baseline.token_ids, "greedy, float32: the race is lossless"
        parts = traces.speedup_parts(run.events, baseline.events)
        assert parts["doubt"] is None, f"{busy}: {parts['doubt']}"
        assert parts["step_cost"] >= 1.0 and parts["decoding"] <= parts["tau"]
        low, high = parts["interval"]
        assert high <= parts["tau"] and low <= parts["decoding"] <= high
        assert figures.within(parts.get("overall", 1.0), parts["tau"])
        quiet = traces.speedup_parts(*(r.events for r in _race(service)))
        assert low <= quiet["decoding"] <= high, f"busy during the {busy}: {low:.2f}–{high:.2f}, quiet {quiet['decoding']:.2f}"


def test_figures_take_a_reading_within_the_noise_at_its_bound_and_flag_one_beyond():
    assert figures.at_least_one(0.98) == (1.0, True) and figures.at_least_one(0.9) == (1.0, False)
    assert figures.at_least_one(1.3) == (1.3, True)
    assert figures.at_least_one(0.8, reach=1.3) == (1.0, True) and not figures.at_least_one(0.8, reach=1.1)[1]
    assert figures.bounded_interval((1.5, 11.16), 3.78) == (1.5, 3.78) and figures.bounded_interval(None, 2) is None
    assert figures.within(3.8, 3.78) and not figures.within(4.13, 3.78)
    assert figures.monotone([1.0, 1.5, 2.20, 2.17, 3.0]) == ([1.0, 1.5, 2.20, 2.20, 3.0], None)
    assert figures.monotone([1.0, 2.0, 1.5]) == ([1.0, 2.0, 2.0], 2)


def test_the_load_tabs_batch_one_point_is_raced_and_read_by_the_same_rule(service):
    """The Load tab's star (this app's loop at batch 1) was an autoregressive run, then the mode's, their whole-run
    tokens/s divided: unraced, with no check. Now it races them step by step and reads them as the Run tab does,
    under a busy loop too: a ratio after the prefill at most τ with its interval, or no ratio and the reason."""
    from app.bench import load
    from app.ui import load_tab

    data = {"speculative_config": {"decoding_type": "NGram"}, "max_new_tokens": 32, "backend": "transformers",
            "dtype": "float32"}
    with busy_cores():
        ours = load.our_point(service, data, PROMPT, threading.Event())
    assert ours["raced"] and ours["tau"] > 1.5, ours
    if ours["speedup"] is None:  # withheld: said, as the Run tab says it
        assert ours["doubt"] and "at batch 1: No speedup shown: " in load_tab.ours_said(ours)
    else:
        low, high = ours["interval"]
        assert ours["doubt"] is None and low <= ours["speedup"] <= high <= ours["tau"] * (1 + figures.NOISE)
        assert "after the prefill at batch 1 (95 % of the step times' spread" in load_tab.ours_said(ours)
    recorded = load.parse({"kind": "load-sweep", "points": [], "ours": ours})["ours"]
    assert load_tab.ours_said(recorded) == load_tab.ours_said(ours)  # a recording says the same
    stopped = threading.Event()
    stopped.set()
    assert load.our_point(service, data, PROMPT, stopped) is None


def test_an_engines_share_of_the_cpu_is_its_process_groups():
    """The load a vLLM race samples (app/backends/processes.py GroupShare): the CPU seconds of the engine's process group, its
    workers' included, over wall time times cores. A group that spins on one core of this machine's cores gets
    about 1 ÷ cores of them; one that sleeps, none."""
    import os
    import subprocess
    import sys

    from app.backends import processes

    spin = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                             "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\nimport time; time.sleep(60)"],
                            start_new_session=True)
    sleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(0.5)
        busy, idle = processes.GroupShare(spin.pid), processes.GroupShare(sleep.pid)
        time.sleep(1.5)
        cores = os.cpu_count() or 1
        assert 0.1 / cores < busy.share() <= 1.0 / cores + 0.05, busy.share()  # its spinning child counted (a loaded machine gives it less than a core)
        assert idle.share() < 0.05
    finally:
        for p in (spin, sleep):
            os.killpg(p.pid, 9)
            p.wait()
