"""The client of a vLLM OpenAI server (one this app started, or a remote one): prompts by token ids, one streamed
chunk per engine step with that step's token ids (`return_token_ids`), and the engine's spec-decode counters
(/metrics, read before and after a request), which give acceptance per draft position; which draft tokens it
rejected, and where its drafts came from, it does not reveal."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from app.backends.openai import WIRE_ERRORS, RemoteError, error_message, reason, sse
from app.modes import ConfigError
from app.modes.configs import DecodeRequest
from app.service.jobs import Work

ENGINE_NOT_VISIBLE = ["the draft tokens of a step (which were rejected)", "where a draft came from",
                      "draft and verify time per step"]
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class Engine:
    """A vLLM OpenAI server: prompts by token ids, one streamed chunk per engine step, spec-decode counters."""

    def __init__(self, url: str, model: str, texts=None, timeout_s: float = 300.0,
                 pieces: dict[tuple[str, str, int], str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.texts = texts or self.detokenize
        self.timeout_s = timeout_s
        self._pieces = {} if pieces is None else pieces

    def tokenize(self, prompt) -> list[int]:
        """The server's own encoding of a prompt (its chat template for a user turn)."""
        body: dict[str, Any] = {"model": self.model}
        if prompt.messages or not prompt.raw:
            body.update(messages=prompt.messages or [{"role": "user", "content": prompt.text}], add_generation_prompt=True)
        else:
            body["prompt"] = prompt.text
        return list(self._json("/tokenize", body)["tokens"])

    def detokenize(self, ids) -> dict[int, str]:
        out = {}
        for i in set(ids):
            key = (self.url, self.model, i)
            if key not in self._pieces:
                self._pieces[key] = self._json("/detokenize", {"model": self.model, "tokens": [i]})["prompt"]
            out[i] = self._pieces[key]
        return out

    def counters(self) -> dict[str, Any]:
        """vLLM's spec-decode counters for this model (absent when the engine speculates nothing)."""
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=10.0) as r:
                text = r.read().decode()
        except WIRE_ERRORS as err:
            raise RemoteError(f"cannot read the engine's counters at {self.url}/metrics: {reason(err)}") from err
        return parse_counters(text, self.model)

    def work(self, request: DecodeRequest, prompt_ids: list[int], engine: dict[str, Any]) -> Work:
        s = request.sampling
        body: dict[str, Any] = {"model": self.model, "prompt": prompt_ids, "max_tokens": request.max_new_tokens,
                                "stream": True, "return_token_ids": True, "temperature": s.temperature, "top_p": s.top_p}
        if s.top_k:
            body["top_k"] = s.top_k
        if s.seed is not None:
            body["seed"] = s.seed
        k = (engine.get("speculative_config") or {}).get("num_speculative_tokens")

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            # Sent when the job runs, not when it is prepared: the engine computes a request as soon as it has it, so
            # a request sent while its job waited (in the queue, or behind its race's baseline) ran beside others and
            # its steps then streamed at once from a finished computation.
            before = self.counters()
            with self._open("/v1/completions", body) as response:
                yield from engine_steps(response, cancel, self, prompt_ids, {**engine, "mode": request.mode}, before, k)

        return work

    def _open(self, path: str, body: dict):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as err:
            message = error_message(err)
            if err.code == 400:
                raise ConfigError(f"the vLLM engine refused the request: {message}") from None
            raise RemoteError(f"the vLLM engine answered {err.code}: {message}") from None
        except (urllib.error.URLError, OSError) as err:
            raise RemoteError(f"cannot reach the vLLM engine at {self.url}: {reason(err)}") from err

    def _json(self, path: str, body: dict) -> dict:
        with self._open(path, body) as r:
            return json.load(r)


_COUNTER = re.compile(r'^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|num_accepted_tokens_per_pos)_total'
                      r'\{([^}]*)\}\s+([0-9.eE+-]+)$')


def parse_counters(text: str, model: str) -> dict[str, Any]:
    """{num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos: [...]} from Prometheus text, summed
    over the engine's data-parallel ranks; {} when the engine has no spec-decode counters."""
    out: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _COUNTER.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model_name", model) != model:
            continue
        value = float(m.group(3))
        if m.group(1) == "num_accepted_tokens_per_pos":
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            out[m.group(1)] = out.get(m.group(1), 0.0) + value
    if out:
        out["accepted_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What one request added to the engine's counters (ints; per position as a list)."""
    if not after:
        return {}
    out = {key: int(round(after.get(key, 0) - before.get(key, 0))) for key in COUNTERS}
    b, a = before.get("accepted_per_pos") or [], after.get("accepted_per_pos") or []
    out["accepted_per_pos"] = [int(round(a[i] - (b[i] if i < len(b) else 0))) for i in range(len(a))]
    return out


def engine_steps(response, cancel: threading.Event, engine: Engine, prompt_ids: list[int], info: dict[str, Any],
                 before: dict[str, Any], k: int | None) -> Iterator[dict[str, Any]]:
    """The trace of a vLLM stream: one step per chunk (an engine step: its accepted draft tokens and the target's
    own token), then the request's spec-decode counters. Nothing the engine does not reveal is filled in."""
    start = time.perf_counter()
    speculates = bool(before)  # an engine without a speculative config exports no spec-decode counters
    not_visible = ENGINE_NOT_VISIBLE if speculates else []
    yield {"type": "start", "backend": "vllm", "model": engine.model, "mode": info.get("mode"), "dtype": info.get("dtype"),
           "prompt_ids": prompt_ids, "texts": engine.texts(prompt_ids), "engine": info, "not_visible": not_visible}
    ids: list[int] = []
    text = ""
    finish = None
    pending: dict[str, Any] | None = None  # a step is sent once the next chunk (or the end) says whether it was the last
    steps = 0
    for chunk in sse(response):
        if "error" in chunk:
            raise RemoteError(chunk["error"].get("message", "the vLLM engine failed"))
        choice = (chunk.get("choices") or [{}])[0]
        finish = choice.get("finish_reason") or finish
        step_ids = [int(t) for t in choice.get("token_ids") or []]
        if step_ids:
            if pending is not None:
                yield pending
            ids += step_ids
            text += choice.get("text") or ""
            first = steps == 0
            # A step that committed k + 1 tokens accepted its whole draft; otherwise vLLM does not say whether its
            # last token corrected a rejected draft token or followed a step that drafted nothing.
            kind = "next" if first or not speculates else "bonus" if k and len(step_ids) == k + 1 else "engine"
            elapsed = time.perf_counter() - start
            pending = {"type": "step", "step": steps, "kind": "prefill" if first else "decode",
                       "proposed": {"tokens": [], "parents": []}, "accepted": [], "rejected": [],
                       "accepted_tokens": [] if first else step_ids[:-1], "added_token": step_ids[-1], "added_kind": kind,
                       "tokens": step_ids, "text": choice.get("text") or "",
                       "source": {"engine": "vllm", "not_visible": not_visible},
                       "draft_time_s": None, "verify_time_s": None,
                       "totals": {"new_tokens": len(ids), "target_steps": steps + 1,
                                  "tokens_per_step": len(ids) / (steps + 1), "elapsed_s": elapsed},
                       "finish_reason": None, "texts": engine.texts(step_ids)}
            steps += 1
        if cancel.is_set():
            finish = "cancelled"
            break
    reason = {"stop": "eos", "abort": "cancelled"}.get(finish, finish) or "length"
    # Every decode step after the first committed its accepted draft tokens plus one: the counters hold at least that.
    counters = settled(engine, before, len(ids) - steps) if speculates else {}
    totals: dict[str, Any] = dict(pending["totals"]) if pending else {"new_tokens": 0, "target_steps": 0}
    if counters:
        totals.update(drafted=counters["num_draft_tokens"], accepted=counters["num_accepted_tokens"])
    if pending is not None:
        pending.update(finish_reason=reason, totals=totals)
        yield pending
    yield {"type": "end", "finish_reason": reason, "text": text, "token_ids": ids, "totals": totals,
           "spec_decode": counters or None, "error": None}


def settled(engine: Engine, before: dict[str, Any], streamed: int) -> dict[str, Any]:
    """The counters' growth since `before`, once the engine has counted the `streamed` accepted tokens it streamed
    (its stats lag the stream a little)."""
    deadline = time.monotonic() + 2.0
    while True:
        delta = counter_delta(before, engine.counters())
        if not delta or delta["num_accepted_tokens"] >= streamed or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)
