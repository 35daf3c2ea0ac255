"""`python -m app serve`: the service as an OpenAI-compatible HTTP server.

/v1/models, /v1/completions and /v1/chat/completions, streamed as server-sent events ending in
`data: [DONE]`. Two extensions: a request may carry `specdec` (a DecodeRequest: the decoding
mode's config, sampling, budget) over the server-wide default, and every streamed chunk carries
the service message it came from in `specdec` (the per-step trace). Invalid configs get 400 with
the one-sentence reason; a full queue 429.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from app.config import ConfigError
from app.models import ModelError
from app.service.api import Service
from app.service.backends.base import Prompt
from app.service.backends.remote import OWNER
from app.service.jobs import QueueFull

FINISH = {"eos": "stop"}  # OpenAI's names; "length", "cancelled", "timeout" pass through


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

    @app.get("/v1/models")
    def list_models() -> dict:
        return {"object": "list", "data": [{"id": service.model, "object": "model", "created": 0, "owned_by": OWNER}]}

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
            prompt = _prompt(body, chat)
            data = merge(default, body)
            job = await run_in_threadpool(service.submit, data, prompt, model)
        except (ConfigError, ModelError) as err:
            return _error(400, service.relative(str(err)))
        except QueueFull as err:
            return _error(429, str(err), "queue_full")
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{job.id}"
        if body.get("stream"):
            return StreamingResponse(_sse(job, ident, model, chat), media_type="text/event-stream")
        return await run_in_threadpool(_complete, job, ident, model, chat)

    return app


def _prompt(body: dict[str, Any], chat: bool) -> Prompt:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ConfigError("messages must be a non-empty list of {role, content} objects")
        turns = []
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise ConfigError("each message needs a role (system, user or assistant) and text content")
            turns.append({"role": m["role"], "content": m["content"]})
        return Prompt(text=turns[-1]["content"], messages=turns)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ConfigError("prompt must be one string")
    return Prompt(text=prompt, raw=True)


def _chunk(ident: str, model: str, chat: bool, text: str | None, finish: str | None, message: dict | None, first: bool = False) -> str:
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    data = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice]}
    if message is not None:
        data["specdec"] = message
    return f"data: {json.dumps(data)}\n\n"


async def _sse(job, ident: str, model: str, chat: bool) -> AsyncIterator[str]:
    messages = job.messages()
    try:
        while True:
            message = await run_in_threadpool(next, messages, None)
            if message is None:
                break
            kind = message["type"]
            if kind == "end" and message.get("error"):
                error = {"message": f"the generation failed: {message['error'].split(':')[0]}", "type": "server_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
                break
            if kind == "start":
                yield _chunk(ident, model, chat, None, None, message, first=True)
            elif kind == "step":
                yield _chunk(ident, model, chat, message.get("text"), None, message)
            else:
                finish = FINISH.get(message["finish_reason"], message["finish_reason"])
                yield _chunk(ident, model, chat, message.get("text_tail"), finish, message)
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # a client that went away stops its generation at the next step


def _complete(job, ident: str, model: str, chat: bool) -> JSONResponse:
    steps, start, end = [], {}, {}
    for message in job.messages():
        if message["type"] == "start":
            start = message
        elif message["type"] == "step":
            steps.append(message)
        else:
            end = message
    if end.get("error"):
        return _error(500, f"the generation failed: {end['error'].split(':')[0]}", "server_error")
    text = end.get("text", "")
    finish = FINISH.get(end.get("finish_reason"), end.get("finish_reason"))
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "finish_reason": finish})
    prompt_tokens, completion_tokens = len(start.get("prompt_ids", [])), len(end.get("token_ids", []))
    return JSONResponse({
        "id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": model, "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "specdec": {"start": start, "steps": steps, "end": end},
    })


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def serve(service: Service, host: str = "127.0.0.1", port: int = 8000, default: dict[str, Any] | None = None) -> None:
    import uvicorn

    uvicorn.run(create_app(service, default), host=host, port=port, log_level="warning")
