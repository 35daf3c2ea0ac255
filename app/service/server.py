"""`python -m app serve`: the service as an OpenAI-compatible HTTP server.

/v1/models, /v1/completions and /v1/chat/completions, streamed as server-sent events ending in
`data: [DONE]`. Two extensions: a request may carry `specdec` (a DecodeRequest: the decoding
mode's config, sampling, budget) over the server-wide default, and every streamed chunk carries
the service message it came from in `specdec` (the per-step trace). Invalid configs get 400 with
the one-sentence reason; a full queue 429. Every OpenAI field is honoured or refused with a 400 naming it: a
client is never left believing a field it sent took effect.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from app.modes import ConfigError
from app.models import ModelError
from app.service.api import Service
from app.backends.base import Prompt
from app.backends.remote.backend import OWNER
from app.service.http import HttpSettings, serve as serve_http
from app.service.jobs import QueueFull

# OpenAI's finish reasons. The time limit and a cancel end the output early as max_tokens does, so they read "length";
# the service's own reason stays in the chunk's (or the answer's) specdec.end.finish_reason.
FINISH = {"eos": "stop", "length": "length", "timeout": "length", "cancelled": "length"}
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 4  # OpenAI's limit on stop strings

# The fields each endpoint takes. Those it cannot honour are listed with the values that mean "not used" (their
# defaults): any other value is refused naming the field, never silently ignored.
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed", "n", "stop", "user",
          "frequency_penalty", "presence_penalty", "logit_bias", "specdec"}
FIELDS = {False: COMMON | {"prompt", "best_of", "echo", "logprobs", "suffix"},
          True: COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                          "parallel_tool_calls", "functions", "function_call", "response_format"}}
INTEGERS = ("max_tokens", "max_completion_tokens", "top_k", "seed", "n", "best_of", "top_logprobs")
NUMBERS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")
UNUSED = {"frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,), "top_logprobs": (), "echo": (False,),
          "suffix": ("",), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",), "functions": ([],),
          "function_call": ("none",), "response_format": ({"type": "text"},), "parallel_tool_calls": (True, False)}


class Options:
    """What a request asks of its answer besides the generation: stop strings and a final usage chunk."""

    def __init__(self, stops: list[str], include_usage: bool) -> None:
        self.stops, self.include_usage = stops, include_usage


def options(body: dict[str, Any], chat: bool) -> Options:
    """The request's OpenAI fields checked: each of the right type, and each one this server does not honour
    at its "not used" value. Raises ConfigError naming the field."""
    unknown = sorted(set(body) - FIELDS[chat])
    if unknown:
        names = ", ".join(str(k)[:40] for k in unknown[:3])
        raise ConfigError(f"this server does not support the field(s) {names} on /v1/{'chat/' if chat else ''}completions")
    for key in INTEGERS:  # a float goes on to the config's checks, which say which whole numbers it takes
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
    for key in NUMBERS:
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{key} must be a number, got {_shown(value)}")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ConfigError(f"user must be a string (an end user's id), got {_shown(body['user'])}")
    if not chat and body.get("logprobs") is not None and (isinstance(body["logprobs"], bool) or not isinstance(body["logprobs"], int)):
        raise ConfigError(f"logprobs must be an integer, got {_shown(body['logprobs'])}")
    for key in ("echo",) + (("logprobs",) if chat else ()):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise ConfigError(f"{key} must be true or false, got {_shown(body[key])}")
    for key, unused in UNUSED.items():
        unused = () if key == "logprobs" and not chat else unused  # a completion's logprobs: 0 still asks for one
        if body.get(key) is not None and body[key] not in unused:
            raise ConfigError(f"{key} is not supported by this server" + (f" (only {_shown(unused[0])})" if unused else "")
                              + ": it answers text with greedy or plain sampling, nothing else")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops) or len(stops) > MAX_STOPS:
        raise ConfigError(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them, got {_shown(stop)}")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not body.get("stream"):
            raise ConfigError("stream_options is allowed only with stream: true")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"} \
                or not isinstance(stream_options.get("include_usage", False), bool):
            raise ConfigError(f"stream_options takes include_usage (true or false) only, got {_shown(stream_options)}")
    return Options(stops, bool((stream_options or {}).get("include_usage")))


def _shown(value: Any) -> str:
    return json.dumps(value)[:40]


class Stopper:
    """The output cut before the first stop string. Streamed text holds back what could be the start of one, so a
    client never receives a stop string's first characters."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(x) for x in stops), default=1) - 1
        self.text, self.sent = "", 0
        self.hit: str | None = None

    def feed(self, piece: str | None) -> str:
        """What may be sent after `piece` arrived ("" once a stop string was found)."""
        if self.hit is not None:
            return ""
        self.text += piece or ""
        start = max(0, self.sent - self.hold)
        found = [(i, x) for x in self.stops if (i := self.text.find(x, start)) >= 0]
        if found:
            end, self.hit = min(found)
            self.text = self.text[:end]
            return self.flush()
        upto = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:upto], upto
        return out

    def flush(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out


def merge(default: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The DecodeRequest data of one HTTP request: server default < body["specdec"] < OpenAI fields."""
    data = copy.deepcopy(default)
    extra = body.get("specdec") or {}
    if not isinstance(extra, dict):
        raise ConfigError("specdec must be an object with DecodeRequest fields (speculative_config, sampling, ...)")
    for key, value in extra.items():
        if key == "sampling" and isinstance(value, dict):
            data["sampling"] = {**data.get("sampling", {}), **value}
        else:
            data[key] = value
    if not isinstance(data.get("sampling", {}), dict):
        raise ConfigError("specdec.sampling must be an object (temperature, top_p, top_k, seed)")
    sampling = dict(data.get("sampling", {}))
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed")):
        if body.get(theirs) is not None:
            sampling[ours] = body[theirs]
    if body.get("n", 1) not in (1, None) or body.get("best_of", 1) not in (1, None):
        raise ConfigError("this server returns one choice per request (n = 1, best_of = 1)")
    data["sampling"] = sampling
    for key in ("max_tokens", "max_completion_tokens"):
        if body.get(key) is not None:
            data["max_new_tokens"] = body[key]
    return data


def create_app(service: Service, default: dict[str, Any] | None = None) -> FastAPI:
    default = default or {}
    service.request(default)  # a bad server-wide default fails at start, not on the first request
    app = FastAPI(title="SpecDec Studio", docs_url=None, redoc_url=None, openapi_url=None)

    # Every refusal in OpenAI's error shape, unknown paths and methods included; an unexpected failure too (500,
    # without its details: they are the server's, not the client's).
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        if err.status_code == 404:
            return _error(404, f"there is no {request.url.path[:80]} here: this server answers /v1/models, "
                               "/v1/completions and /v1/chat/completions", "not_found")
        if err.status_code == 405:
            return _error(405, f"{request.method} is not allowed on {request.url.path[:80]}", "method_not_allowed")
        return _error(err.status_code, str(err.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        return _error(400, "the request is malformed")

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception):
        return _error(500, f"the server failed on this request ({type(err).__name__})", "server_error")

    card = {"id": service.model, "object": "model", "created": 0, "owned_by": OWNER}

    @app.get("/v1/models")
    def list_models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    def get_model(name: str):
        if name != service.model:
            return _error(404, f"this server serves '{service.model}', not '{name[:80]}'", "model_not_found")
        return card

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate(request, chat=True)

    async def _generate(http: Request, chat: bool):
        try:
            body = await http.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a number of thousands of digits, nested too deep
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        model = body.get("model") or service.model
        if model != service.model:
            return _error(404, f"this server serves '{service.model}', not '{str(model)[:80]}'", "model_not_found")
        if not isinstance(body.get("stream", False), bool):
            return _error(400, "stream must be true or false")
        try:
            asked = options(body, chat)
            prompt = _prompt(body, chat)
            data = merge(default, body)
            client = http.client.host if http.client else None
            job = await run_in_threadpool(service.submit, data, prompt, model, None, client)
        except (ConfigError, ModelError) as err:
            return _error(400, service.relative(str(err)))
        except QueueFull as err:
            return _error(429, str(err), "queue_full")
        # Unique across restarts and processes: a client may log and compare them.
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.get("stream"):
            return StreamingResponse(_sse(job, ident, model, chat, asked), media_type="text/event-stream")
        return await _complete(http, job, ident, model, chat, asked)

    return app


def _prompt(body: dict[str, Any], chat: bool) -> Prompt:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages must be a non-empty list of {role, content} objects")
        turns = [_message(m, i) for i, m in enumerate(messages)]
        return Prompt(text=turns[-1]["content"], messages=turns)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ConfigError("prompt must be one string")
    return Prompt(text=prompt, raw=True)


def _message(m: Any, i: int) -> dict[str, str]:
    """One chat message as the chat template takes it: its role as given (vLLM passes developer and tool through
    too) and its text; text parts joined as vLLM joins them (by newlines)."""
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ConfigError(f"messages[{i}] needs a role ({', '.join(ROLES)}) and content")
    extra = sorted(set(m) - {"role", "content", "name", "tool_call_id", "tool_calls"})
    if extra or m.get("tool_calls"):
        raise ConfigError(f"messages[{i}].{(extra or ['tool_calls'])[0][:40]} is not supported by this server")
    content = m.get("content")
    if content is None and m["role"] == "assistant":
        content = ""
    if isinstance(content, list):
        kinds = [p.get("type") if isinstance(p, dict) else None for p in content]
        other = [str(k)[:20] for k in kinds if k != "text"]
        if other:
            raise ConfigError(f"messages[{i}].content has {', '.join(sorted(set(other)))} parts: this server takes text parts only")
        if not all(isinstance(p.get("text"), str) for p in content):
            raise ConfigError(f"messages[{i}].content: each text part needs its text as a string")
        content = "\n".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ConfigError(f"messages[{i}].content must be text or a list of text parts")
    return {"role": m["role"], "content": content}


def _chunk(ident: str, model: str, chat: bool, text: str | None, finish: str | None, message: dict | None,
           first: bool = False, stop_reason: str | None = None, **extra: Any) -> str:
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = stop_reason  # vLLM's field: the stop string that ended the output
    data = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice]}
    if message is not None:
        data["specdec"] = message
    return _sse_data({**data, **extra})


def _sse_data(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _follow(job, stopper: Stopper) -> AsyncIterator[tuple[dict, str | None, str | None]]:
    """The job's messages as (message, text to send, OpenAI finish reason or None; "error" for a failure), the stop
    strings applied: one found ends the output there and cancels the job (the rest would be thrown away)."""
    messages = job.messages()
    while (message := await run_in_threadpool(next, messages, None)) is not None:
        if message["type"] == "start":
            yield message, None, None
        elif message["type"] == "step":
            text = stopper.feed(message.get("text"))
            if stopper.hit is not None:
                job.cancel()
                yield message, text, "stop"
                return
            yield message, text, None
        elif message.get("error"):
            yield message, None, "error"
            return
        else:
            text = stopper.feed(message.get("text_tail"))
            text += "" if stopper.hit is not None else stopper.flush()
            yield message, text, "stop" if stopper.hit is not None else FINISH.get(message["finish_reason"], "length")
            return


class Usage:
    def __init__(self) -> None:
        self.prompt, self.completion = 0, 0

    def add(self, message: dict) -> None:
        if message["type"] == "start":
            self.prompt = len(message.get("prompt_ids") or [])
        elif message["type"] == "step":
            self.completion += len(message.get("tokens") or [])
        elif message.get("token_ids") is not None:
            self.completion = len(message["token_ids"])

    def json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion, "total_tokens": self.prompt + self.completion}


async def _sse(job, ident: str, model: str, chat: bool, asked: Options) -> AsyncIterator[str]:
    usage, stopper = Usage(), Stopper(asked.stops)
    extra = {"usage": None} if asked.include_usage else {}  # OpenAI: every chunk has usage null but the last
    try:
        async for message, text, finish in _follow(job, stopper):
            usage.add(message)
            if finish == "error":
                error = {"message": f"the generation failed: {message['error'].split(':')[0]}", "type": "server_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
                break
            yield _chunk(ident, model, chat, text, finish, message, first=message["type"] == "start",
                         stop_reason=stopper.hit, **extra)
        else:
            if asked.include_usage:
                yield _sse_data({"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                 "created": int(time.time()), "model": model, "choices": [], "usage": usage.json()})
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # a client that went away stops its generation at the next step


async def _complete(http: Request, job, ident: str, model: str, chat: bool, asked: Options) -> JSONResponse | None:
    """The whole answer; a client that disconnects meanwhile cancels the job (checked twice a second)."""

    async def watch() -> None:
        while not job.done.is_set():
            if await http.is_disconnected():
                job.cancel()
                return
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch())
    usage, stopper, steps, start, end, text, finish = Usage(), Stopper(asked.stops), [], {}, {}, "", None
    try:
        async for message, piece, finish in _follow(job, stopper):
            usage.add(message)
            if message["type"] == "start":
                start = message
            elif message["type"] == "step":
                steps.append(message)
            else:
                end = message
            text += piece or ""
    finally:
        watcher.cancel()
        job.cancel()
    if finish == "error":
        return _error(500, f"the generation failed: {end['error'].split(':')[0]}", "server_error")
    if not stopper.stops and end.get("text") is not None:
        text = end["text"]  # the detokenized whole, exactly as `generate` gives it
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "finish_reason": finish})
    choice["stop_reason"] = stopper.hit  # vLLM's field: the stop string that ended the output
    return JSONResponse({
        "id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": model, "choices": [choice], "usage": usage.json(), "specdec": {"start": start, "steps": steps, "end": end},
    })


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def serve(service: Service, host: str = "127.0.0.1", port: int = 8000, default: dict[str, Any] | None = None,
          http_settings: HttpSettings = HttpSettings()) -> None:
    # On SIGTERM, requests still open after `shutdown_grace_s` are cancelled, and with them their jobs (at their
    # next step), and answered in OpenAI's error shape: the process exits within seconds instead of finishing every
    # generation first. Client addresses, read deadlines: app/service/http.py.
    serve_http(create_app(service, default), host, port, http_settings)
