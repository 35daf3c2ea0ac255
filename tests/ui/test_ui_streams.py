"""The Run and Compare tabs' stream of a job: what the status says while the service prepares a run (a vLLM engine
starting takes minutes), and that errors of that preparation reach the page in words."""

import time

import gradio as gr
import pytest

from app.modes import ConfigError
from app.traces import Recording
from app.ui import streams
from app.ui.sessions import Sessions
from helpers import Job


class SlowService:
    """Prepares each run for `seconds` (as a vLLM backend starting an engine does), then gives a job of one step."""

    def __init__(self, seconds, error=None):
        self.seconds, self.error = seconds, error

    def submit(self, data, prompt, visitor=None):
        time.sleep(self.seconds)
        if self.error:
            raise self.error
        return Job([{"type": "start", "prompt_ids": [1]},
                    {"type": "step", "kind": "prefill", "tokens": [7], "totals": {"elapsed_s": 0.1, "new_tokens": 1}},
                    {"type": "end", "finish_reason": "length", "error": None}])

    @staticmethod
    def relative(text):
        return text


def test_a_run_waiting_for_its_engine_says_so_each_second_then_runs():
    run = Recording("prompt_lookup")
    seen = [r.waiting for r in streams.stream(SlowService(2.4), Sessions(), "s", {"backend": "vllm"}, "Hi", run)]
    waiting = [w for w in seen if w]
    assert len(waiting) == 2 and all("starting the vLLM engine" in w for w in waiting), seen
    assert [w.split(": ")[1].split(" s ")[0] for w in waiting] == ["1", "2"]  # the seconds so far
    assert seen[-1] is None and run.token_ids == [7] and run.end["finish_reason"] == "length"
    other = [r.waiting for r in streams.stream(SlowService(1.2), Sessions(), "s", {"backend": "transformers"}, "Hi",
                                               Recording("autoregressive"))]
    assert any(w and w.startswith("loading the model") for w in other), other
    quick = [r.waiting for r in streams.stream(SlowService(0), Sessions(), "s", {"backend": "vllm"}, "Hi", Recording(None))]
    assert quick == [None]  # an engine already up: nothing to wait for, nothing said


def test_a_preparation_that_fails_is_one_sentence_on_the_page():
    refused = SlowService(1.2, ConfigError("this public server runs at most 1 vLLM engine(s) started by visitors"))
    with pytest.raises(gr.Error, match="at most 1 vLLM engine"):
        list(streams.stream(refused, Sessions(), "s", {"backend": "vllm"}, "Hi", Recording(None)))
    with pytest.raises(RuntimeError, match="boom"):  # not a user's mistake: raised as it is
        list(streams.stream(SlowService(0, RuntimeError("boom")), Sessions(), "s", {}, "Hi", Recording(None)))


def test_the_run_tabs_status_says_what_a_run_waits_for():
    from app.modes import MODES
    from app.ui.run_tab import status_line

    run = Recording("prompt_lookup")
    assert status_line(run, MODES).endswith(": loading and prefilling…")
    run.waiting = streams.preparing_note({"backend": "vllm"}, 12.3)
    assert status_line(run, MODES) == "**Prompt lookup**: " + run.waiting and "12 s" in run.waiting


def test_a_page_that_goes_away_while_its_engine_starts_gets_no_job_left_running():
    service = SlowService(1.5)
    jobs = []
    submit = service.submit
    service.submit = lambda *a, **k: jobs.append(submit(*a, **k)) or jobs[-1]
    parts = streams.stream(service, Sessions(), "s", {"backend": "vllm"}, "Hi", Recording(None))
    assert next(parts).waiting  # waiting for the engine
    parts.close()  # what Gradio does when the page disconnects
    deadline = time.monotonic() + 5
    while not (jobs and jobs[0].cancelled) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(jobs) == 1 and jobs[0].cancelled
