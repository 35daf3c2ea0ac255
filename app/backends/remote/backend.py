"""A remote OpenAI-compatible server: `python -m app serve` on a bigger machine, or `trtllm-serve`.

Our own server (it says `owned_by: specdec-studio` in /v1/models) takes the decoding config per
request and streams the full trace in each chunk's `specdec` field, so the UI shows everything it
shows locally. A vLLM server (`owned_by: vllm`) runs the speculative config it was launched with and
streams one chunk per engine step with that step's token ids (`return_token_ids`): each chunk becomes
one step with its committed tokens, and the engine's spec-decode counters (/metrics, read before and
after the request) give acceptance per draft position (read by vLLM's client, app/backends/vllm/client.py, which
the registry hands this backend); which draft tokens it rejected, and where its drafts came from, it does not
reveal. Any other server's chunks carry text only, so each chunk becomes a step whose draft is not visible.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from app.backends.base import Availability, Backend, Prompt
from app.backends.openai import WIRE_ERRORS, RemoteError, error_message, reason, sse  # noqa: F401  (RemoteError: what it raises)
from app.modes import ConfigError
from app.modes import Mode
from app.modes.configs import DecodeRequest
from app.service.jobs import Limits, Work

OWNER = "specdec-studio"
NOT_VISIBLE = ["token ids", "draft tree", "accepted and rejected draft tokens", "draft and verify time"]


class RemoteBackend(Backend):
    name = "remote"

    def __init__(self, url: str | None, timeout_s: float = 300.0, recheck_s: float = 10.0,
                 clients: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.url = url.rstrip("/") if url else None
        # A server an engine of this app owns (/v1/models owned_by) is read by that engine's client (registry.py):
        # its stream carries token ids and its spec-decode counters.
        self.clients = clients or {}
        self.timeout_s = timeout_s
        self.recheck_s = recheck_s
        self._checked: tuple[float, Availability] | None = None
        self._pieces: dict[tuple[str, str, int], str] = {}  # a vLLM server's text of each token id, asked once

    def availability(self) -> Availability:
        """Whether the server answers; remembered for `recheck_s`, since a UI asks on every settings change."""
        if not self.url:
            return Availability(False, "no remote server configured (start with --remote-url http://HOST:PORT)")
        if self._checked is not None and time.monotonic() - self._checked[0] < self.recheck_s:
            return self._checked[1]
        try:
            self.served()
            state = Availability(True)
        except RemoteError as err:
            state = Availability(False, str(err))
        self._checked = (time.monotonic(), state)
        return state

    def auto(self, mode: str) -> bool:
        return bool(self.url) and self.availability().available

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        state = self.availability()
        return None if state.available else state.reason

    def served(self) -> dict[str, dict]:
        """The models the server lists, by id."""
        data = self._get("/v1/models", timeout=5.0)
        return {m["id"]: m for m in data.get("data", [])}

    def check(self, request: DecodeRequest) -> None:
        """The remote server checks what it runs (its answer says why it refuses)."""

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        if not self.url:
            raise ConfigError("the remote backend needs a server URL (--remote-url http://HOST:PORT)")
        served = self.served()
        if model not in served:
            raise RemoteError(f"the server at {self.url} does not serve '{model}'; it serves: {', '.join(served) or 'nothing'}")
        owner = served[model].get("owned_by")
        if owner in self.clients:
            engine = self.clients[owner](self.url, model, timeout_s=self.timeout_s, pieces=self._pieces)
            return engine.work(request, engine.tokenize(prompt), {"engine": owner, "url": self.url})
        ours = owner == OWNER
        body = body_for(model, request, prompt, traced=ours)
        path = "/v1/completions" if prompt.raw and not prompt.messages else "/v1/chat/completions"

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            with self._post(path, body) as response:  # sent when the job runs (Engine.work says why)
                if ours:
                    yield from _traced(response, cancel)
                else:
                    yield from _untraced(response, cancel, model, request.mode)

        return work

    def _get(self, path: str, timeout: float) -> dict:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return json.load(r)
        except WIRE_ERRORS as err:
            raise RemoteError(f"cannot reach the remote server at {self.url}: {reason(err)}") from err

    def _post(self, path: str, body: dict):
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as err:
            message = error_message(err)
            if err.code == 400:
                raise ConfigError(message) from None
            raise RemoteError(f"the remote server answered {err.code}: {message}") from None
        except (urllib.error.URLError, OSError) as err:
            raise RemoteError(f"cannot reach the remote server at {self.url}: {reason(err)}") from err


def body_for(model: str, request: DecodeRequest, prompt: Prompt, traced: bool) -> dict[str, Any]:
    """The OpenAI request body; our own server also gets the decoding config (`specdec`)."""
    s = request.sampling
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": request.max_new_tokens,
                            "temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        body["seed"] = s.seed
    if prompt.messages or not prompt.raw:
        body["messages"] = prompt.messages or [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if traced:
        body["specdec"] = request.model_dump(mode="json", exclude={"backend"})
    elif s.top_k:
        body["top_k"] = s.top_k  # trtllm-serve's extension
    return body


def _traced(response, cancel: threading.Event) -> Iterator[dict[str, Any]]:
    for chunk in sse(response):
        if "error" in chunk:
            raise RemoteError(chunk["error"].get("message", "the remote generation failed"))
        message = chunk.get("specdec")
        if message is not None:
            # JSON object keys are strings; ids are ints everywhere else.
            if "texts" in message:
                message["texts"] = {int(k): v for k, v in message["texts"].items()}
            yield message
        if cancel.is_set():
            return  # closing the stream makes the server cancel its job


def _untraced(response, cancel: threading.Event, model: str, mode: str) -> Iterator[dict[str, Any]]:
    start = time.perf_counter()
    yield {"type": "start", "backend": "remote", "model": model, "mode": mode, "prompt_ids": [], "texts": {},
           "not_visible": NOT_VISIBLE}
    text, steps, finish, tau = "", 0, None, None
    for chunk in sse(response):
        choice = (chunk.get("choices") or [{}])[0]
        delta = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        finish = choice.get("finish_reason") or finish
        # trtllm-serve's own τ (tokens per engine iteration), where its version reports it: text chunks say nothing of it.
        tau = choice.get("avg_decoded_tokens_per_iter") or tau
        if delta:
            text += delta
            yield {"type": "step", "step": steps, "kind": "decode", "proposed": {"tokens": [], "parents": []},
                   "accepted": [], "rejected": [], "accepted_tokens": [], "added_token": None, "added_kind": "next",
                   "tokens": [], "text": delta, "source": {"observed": "text stream", "not_visible": NOT_VISIBLE},
                   "draft_time_s": None, "verify_time_s": None,
                   "totals": {"target_steps": steps + 1, "elapsed_s": time.perf_counter() - start}, "finish_reason": None,
                   "texts": {}}
            steps += 1
        if cancel.is_set():
            finish = "cancelled"
            break
    yield {"type": "end", "finish_reason": {"stop": "eos"}.get(finish, finish), "text": text, "token_ids": [],
           "totals": {} if tau is None else {"tokens_per_step": tau, "tokens_per_step_from": "avg_decoded_tokens_per_iter"},
           "error": None}


