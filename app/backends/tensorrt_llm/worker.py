"""TensorRT-LLM's worker: one LLM of TensorRT-LLM's LLM API, served over HTTP to this app's service.

It runs inside TensorRT-LLM's own environment (`.venv-trtllm`, scripts/setup-trtllm.sh), whose pins (numpy < 2,
torch <= 2.9, transformers 4.57) clash with the app's; so it imports the standard library and tensorrt_llm only,
nothing of `app`, and is run by path:

    .venv-trtllm/bin/python app/backends/tensorrt_llm/worker.py --host 127.0.0.1 --port N --llm FILE.json

FILE.json is a build plan's part the engine needs, as plain data (builds.py trtllm_plan, its paths filled in):
{"trtllm_backend": "pytorch" | "tensorrt", "llm": {LLM(...) keyword arguments}, "serves": "in words"?}. Its
`speculative_config` is {"decoding_type": ..., fields...} and becomes the tensorrt_llm.llmapi class of that name
("Draft_Target" -> DraftTargetDecodingConfig); its `build_config` a tensorrt_llm.llmapi.BuildConfig.

The app sends token ids and gets token ids back: it tokenizes and decodes with its own tokenizer. Endpoints:

  GET  /health    200 {"ready": true, ...} once the LLM is up (503 {"ready": false, "state": "loading"} while it is
                  built and loaded): TensorRT-LLM's version, what it serves, the requests running and the last ones.
  POST /generate  {"prompt_token_ids": [...], "sampling_params": {SamplingParams keyword arguments}, "id"?: str}
                  -> NDJSON (header X-Request-Id): one line per streamed response, {"token_ids_diff", "decoding_iter",
                  "finish_reason", "elapsed_s"}, then {"done": true, "token_ids", "finish_reason", "decoding_iter",
                  "avg_decoded_tokens_per_iter", "perf_metrics": {"speculative_decoding": {"total_draft_tokens",
                  "total_accepted_draft_tokens", "acceptance_rate"}} | null, "aborted", "error", "elapsed_s"}.
                  A refused request (bad body, SamplingParams or prompt TensorRT-LLM refuses) is a 400 {"error"}.
                  A client that goes away aborts its request.
  POST /abort     {"id": ...} aborts that request; {} every running one.
  POST /shutdown  aborts what runs, shuts the LLM down (LLM.shutdown frees the GPU and its MPI workers), exits.

Requests run concurrently, as TensorRT-LLM batches them in flight. Each handler thread iterates its own result
synchronously: a GenerationResult made where no asyncio loop runs gets a plain queue.Queue, filled by the
executor's response thread, and its __next__ blocks on that queue (executor/result.py GenerationResultBase.__init__,
GenerationResult._result_step); its async iteration would assert a loop was running at its creation. Only the
submission (LLM.generate_async) is serialised: upstream's own server calls it from one event-loop thread, and
nothing says it may be called from several threads at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import select
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Run by path, Python puts this file's directory first on sys.path, and the app's own modules there (backend.py,
# builds.py, processes.py) would shadow any package of those names. Python 3.10 (upstream's wheels) has no -P.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

LLM_CLASSES = {"pytorch": "tensorrt_llm.LLM", "tensorrt": "tensorrt_llm._tensorrt_engine.LLM"}
KEEP_FINISHED = 8  # requests /health remembers after they end


def config_class(decoding_type: str) -> str:
    """Its class in tensorrt_llm.llmapi: "Draft_Target" is DraftTargetDecodingConfig."""
    return decoding_type.replace("_", "") + "DecodingConfig"


def import_object(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def llm_objects(llm: dict) -> dict:
    """LLM(...) keyword arguments from plain data: the llmapi speculative config class and a BuildConfig (as the
    in-process backend makes them, backend.py llm_objects; upstream's classes check the fields)."""
    from tensorrt_llm import llmapi

    kwargs = dict(llm)
    if kwargs.get("speculative_config") is not None:
        data = {k: v for k, v in kwargs["speculative_config"].items() if v is not None}
        cls = getattr(llmapi, config_class(data.pop("decoding_type")))
        names = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        if "speculative_model" in data and "speculative_model" not in names and "speculative_model_dir" in names:
            data["speculative_model_dir"] = data.pop("speculative_model")  # the 1.0-era name
        kwargs["speculative_config"] = cls(**data)
    if kwargs.get("build_config") is not None:
        build = dict(kwargs["build_config"])
        build.pop("speculative_decoding_mode", None)  # the LLM API sets it from speculative_config (llm_args.py)
        kwargs["build_config"] = llmapi.BuildConfig(**build)
    return kwargs


def sampling_params(data: dict):
    """SamplingParams from plain data; a per-request lookahead (w, n, g) as the llmapi class, as upstream's example
    passes it (examples/llm-api/_tensorrt_engine/llm_lookahead_decoding.py). The perf metrics are always asked for:
    the final line reports them."""
    from tensorrt_llm import SamplingParams

    kwargs = {**data, "return_perf_metrics": True}
    if isinstance(kwargs.get("lookahead_config"), dict):
        from tensorrt_llm.llmapi import LookaheadDecodingConfig

        kwargs["lookahead_config"] = LookaheadDecodingConfig(**kwargs["lookahead_config"])
    return SamplingParams(**kwargs)


def perf_metrics(completion) -> dict | None:
    """The request's own counters (CompletionOutput.request_perf_metrics, a RequestPerfMetrics binding) as data."""
    perf = getattr(completion, "request_perf_metrics", None)
    spec = getattr(perf, "speculative_decoding", None)
    if spec is None:
        return None
    out = {"speculative_decoding": {name: getattr(spec, name, None) for name in
                                    ("total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate")}}
    for name in ("first_iter", "last_iter", "iter"):
        value = getattr(perf, name, None)
        if isinstance(value, int):
            out[name] = value
    return out


class Worker:
    def __init__(self, plan: dict) -> None:
        self.plan = plan
        self.backend = plan.get("trtllm_backend", "pytorch")
        self.llm = None
        self.version = None
        self.state, self.since = "loading", time.time()
        self.lock = threading.Lock()
        self.submit_lock = threading.Lock()
        self.running: dict[str, dict] = {}  # id -> {"generation", "tokens", "aborted"}
        self.finished: list[dict] = []
        self.count = 0
        self.stopping = threading.Event()

    def load(self) -> None:
        import tensorrt_llm

        self.version = getattr(tensorrt_llm, "__version__", None)
        cls = import_object(LLM_CLASSES[self.backend])
        # A TensorRT engine is built here from a checkpoint (minutes) unless `model` is a saved engine.
        self.llm = cls(**llm_objects(self.plan["llm"]))
        self.state = "ready"

    def health(self) -> dict:
        with self.lock:
            running = [{"id": i, "tokens": r["tokens"], "aborted": r["aborted"]} for i, r in self.running.items()]
            finished = list(self.finished)
        spec = self.plan["llm"].get("speculative_config") or {}
        return {"ready": self.state == "ready", "state": self.state, "since": self.since,
                "tensorrt_llm": self.version, "trtllm_backend": self.backend, "llm_class": LLM_CLASSES[self.backend],
                "serves": self.plan.get("serves") or f"{spec.get('decoding_type', 'autoregressive')} on {self.plan['llm'].get('model')}",
                "llm": self.plan["llm"], "requests": self.count, "running": running, "finished": finished}

    def submit(self, body: dict) -> tuple[str, object, float]:
        """(id, the streaming result, when it was submitted); ValueError/TypeError/RuntimeError when refused."""
        ids = body.get("prompt_token_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        params = sampling_params(body.get("sampling_params") or {})
        with self.submit_lock:
            if self.stopping.is_set():
                raise RuntimeError("the worker is shutting down")
            start = time.perf_counter()
            generation = self.llm.generate_async(ids, sampling_params=params, streaming=True)
            with self.lock:
                self.count += 1
                rid = str(body.get("id") or self.count)
                if rid in self.running:
                    generation.abort()
                    raise ValueError(f"request {rid} is running already")
                self.running[rid] = {"generation": generation, "tokens": 0, "aborted": None}
        return rid, generation, start

    def abort(self, rid: str | None, why: str) -> list[str]:
        with self.lock:
            chosen = [i for i in self.running if rid is None or i == rid]
            for i in chosen:
                entry = self.running[i]
                if entry["aborted"] is None:
                    entry["aborted"] = why
                    entry["generation"].abort()
        return chosen

    def end(self, rid: str, finish_reason, tokens: int) -> str | None:
        """The request is over: kept among the last ones /health lists. Returns why it was aborted, if it was."""
        with self.lock:
            entry = self.running.pop(rid)
            self.finished = (self.finished + [{"id": rid, "finish_reason": finish_reason, "tokens": tokens,
                                               "aborted": entry["aborted"]}])[-KEEP_FINISHED:]
        return entry["aborted"]

    def stream(self, rid: str, generation, start: float, write) -> None:
        """Iterate the result in this thread, writing a line per streamed response and a final one. `write` returns
        False once the client is gone: the request is then aborted and read to its end (the engine's last response)."""
        last, error, connected = None, None, True
        try:
            for out in generation:
                last = out.outputs[0]
                with self.lock:
                    self.running[rid]["tokens"] = len(last.token_ids)
                if connected:
                    connected = write({"token_ids_diff": list(last.token_ids_diff), "decoding_iter": getattr(out, "decoding_iter", None),
                                       "finish_reason": last.finish_reason, "elapsed_s": time.perf_counter() - start})
                    if not connected:
                        self.abort(rid, "the client went away")
        except Exception as err:  # upstream's RequestError and the like: said in the final line
            error = f"{type(err).__name__}: {err}"
            if not generation.finished:
                self.abort(rid, "it failed")
        finish = last.finish_reason if last is not None else None
        tokens = list(last.token_ids) if last is not None else []
        aborted = self.end(rid, finish, len(tokens))
        if connected:
            write({"done": True, "id": rid, "token_ids": tokens, "finish_reason": finish,
                   "decoding_iter": getattr(generation, "decoding_iter", None),
                   "avg_decoded_tokens_per_iter": getattr(generation, "avg_decoded_tokens_per_iter", None),
                   "perf_metrics": perf_metrics(last), "aborted": aborted, "error": error,
                   "elapsed_s": time.perf_counter() - start})

    def shutdown(self) -> None:
        with self.submit_lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
        self.abort(None, "the worker is shutting down")
        if self.llm is not None:
            self.llm.shutdown()
            print("trtllm_worker: LLM.shutdown() done", file=sys.stderr, flush=True)


def handler(worker: Worker, server_stop):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # one line per request on stderr is noise for a streaming worker
            pass

        def _json(self, status: int, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            data = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            return data

        def do_GET(self):
            if self.path != "/health":
                return self._json(404, {"error": f"no {self.path}"})
            health = worker.health()
            self._json(200 if health["ready"] else 503, health)

        def do_POST(self):
            try:
                body = self._body()
            except ValueError as err:
                return self._json(400, {"error": f"bad JSON body: {err}"})
            if self.path == "/abort":
                return self._json(200, {"aborted": worker.abort(None if body.get("id") is None else str(body["id"]),
                                                                "abort requested")})
            if self.path == "/shutdown":
                self._json(200, {"shutting_down": True})
                threading.Thread(target=server_stop, daemon=True).start()
                return
            if self.path != "/generate":
                return self._json(404, {"error": f"no {self.path}"})
            if worker.state != "ready":
                return self._json(503, {"error": f"the LLM is not ready: {worker.state}"})
            try:
                rid, generation, start = worker.submit(body)
            except (ValueError, TypeError, RuntimeError) as err:  # SamplingParams' and generate_async's refusals
                return self._json(400, {"error": f"{type(err).__name__}: {err}"})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("X-Request-Id", rid)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            gone = threading.Event()
            watcher = threading.Thread(target=self._watch, args=(rid, gone), daemon=True)
            watcher.start()

            def write(line: dict) -> bool:
                if gone.is_set():
                    return False
                try:
                    self.wfile.write(json.dumps(line).encode() + b"\n")
                    self.wfile.flush()
                    return True
                except OSError:  # BrokenPipe, ConnectionReset
                    gone.set()
                    return False

            try:
                worker.stream(rid, generation, start, write)
            finally:
                gone.set()  # stops the watcher

        def _watch(self, rid: str, gone: threading.Event) -> None:
            """Abort the request once its client closes the connection, even while the engine has nothing to
            stream (a write would only notice at the next response)."""
            sock = self.connection
            while not gone.is_set():
                try:
                    readable, _, _ = select.select([sock], [], [], 0.2)
                    if readable and not sock.recv(1, socket.MSG_PEEK):
                        gone.set()
                        worker.abort(rid, "the client went away")
                        return
                except (OSError, ValueError):
                    return

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve one TensorRT-LLM LLM over HTTP to SpecDec Studio's service.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--llm", required=True, help="JSON: {trtllm_backend, llm: LLM(...) keyword arguments, serves?}")
    args = parser.parse_args(argv)
    worker = Worker(json.loads(Path(args.llm).read_text()))
    done = threading.Event()

    def stop() -> None:
        worker.shutdown()
        done.set()

    server = ThreadingHTTPServer((args.host, args.port), handler(worker, stop))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    # The service stops a worker with SIGTERM too: shut the LLM down first (its MPI workers would outlive us).
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop, daemon=True).start())
    print(f"trtllm_worker: listening on http://{args.host}:{args.port}, loading the LLM", file=sys.stderr, flush=True)
    try:
        worker.load()
    except BaseException:  # said in the log, whose tail the service shows (as a vLLM engine's)
        traceback.print_exc()
        server.shutdown()
        return 1
    if worker.stopping.is_set():  # told to stop while it loaded: shutdown() found no LLM to shut down then
        worker.llm.shutdown()
        server.shutdown()
        return 0
    print(f"trtllm_worker: ready (TensorRT-LLM {worker.version})", file=sys.stderr, flush=True)
    while not done.wait(0.5):  # a timed wait: the main thread stays free for signal handlers
        pass
    server.shutdown()
    print("trtllm_worker: shut down", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
