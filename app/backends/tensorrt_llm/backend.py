"""The optional GPU backend: TensorRT-LLM's LLM API, as its 1.2 source defines it (NVIDIA/TensorRT-LLM:
tensorrt_llm/llmapi/llm_args.py, tensorrt_llm/executor/result.py; docs/tensorrt-llm.md).

Nothing here imports tensorrt_llm at module import time: the probe uses importlib.util.find_spec
and a guarded import, and generation imports it lazily. The pure parts — which LLM class a mode
needs, its keyword arguments, the SamplingParams arguments, and how streamed token diffs become
trace steps — are plain functions, tested without TensorRT-LLM.

What this backend cannot show: TensorRT-LLM streams the tokens each iteration committed, not the
draft it verified, so a step's rejected draft tokens and the draft tree are unknown; a step's
accepted count is read as (tokens streamed in that iteration) - 1, the iterations counted by the
engine itself (RequestOutput.decoding_iter) where it gives them.

A run's figures are its own request's: decoding_iter and avg_decoded_tokens_per_iter of its result
(executor/result.py; the C++ request computes the latter as its generated tokens / its iterations), and the drafted
and accepted totals of its perf metrics (CompletionOutput.request_perf_metrics, with return_perf_metrics=True).
LLM.get_stats is engine-wide and is not read: IterationResult.get_results drains one executor-wide
queue of iterations, each counting every request it scheduled, and waits out its timeout before it
returns (executor/result.py, executor/executor.py).

One engine at a time: each LLM reserves KvCacheConfig.free_gpu_memory_fraction (default 0.9) of the
free GPU memory for its KV cache (llm_args.py), so a second one in this process would not fit. Another
configuration shuts the current engine down first, once no generation is using it, and the run says so. Building and
loading an engine (minutes, for a TensorRT engine) happen off the backend's lock: other submits are answered at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from app.modes import ConfigError, DecodeRequest, Mode, configs
from app.modes.errors import one_line
from app.backends.base import Availability, Backend, Prompt
from app.service.errors import EngineError
from app.service.jobs import Limits, Work

VERSION = "1.2.1"  # the release this backend is written against (NVIDIA's container tag in deploy/gpu)
NOT_VISIBLE = ["draft tree", "rejected draft tokens", "draft and verify time"]
REUSED = "TensorRT-LLM engine of this configuration, reused"
LLM_CLASSES = {"pytorch": "tensorrt_llm.LLM", "tensorrt": "tensorrt_llm._tensorrt_engine.LLM"}
# Where TensorRT-LLM is not set up: never a pip command, as its pins (numpy < 2, torch <= 2.9, transformers 4.57) would
# break the app's environment; it runs in its own (processes.py), made only where there is a GPU for it.
NOT_SET_UP = ("TensorRT-LLM needs an NVIDIA GPU: see docs/tensorrt-llm.md (on a Linux host with one, bash "
              "scripts/setup-trtllm.sh sets up its own environment, .venv-trtllm, where the app then starts it)")


def config_class(decoding_type: str) -> str:
    """Its class in tensorrt_llm.llmapi: "Draft_Target" is DraftTargetDecodingConfig."""
    return decoding_type.replace("_", "") + "DecodingConfig"


def probe() -> Availability:
    """find_spec first (importing tensorrt_llm needs libcuda), then a guarded import, then a GPU."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return Availability(False, NOT_SET_UP)
    try:
        importlib.import_module("tensorrt_llm")
    except (ImportError, OSError) as err:
        return Availability(False, f"TensorRT-LLM is installed but cannot load here: {str(err).splitlines()[0]}")
    import torch

    if not torch.cuda.is_available():
        return Availability(False, "TensorRT-LLM needs a CUDA GPU and none is visible")
    return Availability(True)




def sampling_kwargs(request: DecodeRequest) -> dict[str, Any]:
    s = request.sampling
    kwargs: dict[str, Any] = {"max_tokens": request.max_new_tokens, "return_perf_metrics": True}
    if s.temperature == 0:
        kwargs.update(temperature=0.0, top_k=1)
    else:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
    if s.seed is not None:
        kwargs["seed"] = s.seed
    if request.entry.trtllm_request:
        kwargs.update(request.entry.trtllm_request(request.speculative_config))
    return kwargs


def steps_from_diffs(diffs: Iterable[tuple[list[int], float, str | None, int | None]]) -> Iterator[dict[str, Any]]:
    """Trace steps from streamed (token_ids_diff, elapsed_s, finish_reason, decoding_iter) tuples.

    `decoding_iter` is the engine's own count of its iterations for the request so far
    (RequestOutput.decoding_iter, executor/result.py), or None where a version does not give it: then
    each streamed chunk is taken for one iteration. τ is the tokens per iteration. Every iteration adds
    one token of the target's own, so a one-iteration chunk of k tokens accepted k - 1 draft tokens (the
    first iteration is the prefill's token); a chunk spanning i > 1 iterations (a stream_interval above
    1) accepted k - i, and which of its tokens were drafts is not visible. The draft itself is never
    visible (NOT_VISIBLE)."""
    totals = {"new_tokens": 0, "target_steps": 0, "drafted": None, "accepted": 0, "draft_time_s": None,
              "verify_time_s": None, "elapsed_s": 0.0, "tokens_per_step": 0.0, "decoding_iter": None}
    step = 0
    for tokens, elapsed, finish_reason, decoding_iter in diffs:
        if not tokens:
            continue
        first = step == 0
        iterations = 1 if decoding_iter is None else max(decoding_iter - totals["target_steps"], 1)
        accepted = [] if first or iterations > 1 else list(tokens[:-1])
        totals["new_tokens"] += len(tokens)
        totals["target_steps"] += iterations
        totals["accepted"] += len(accepted) if iterations == 1 else len(tokens) - iterations
        totals["elapsed_s"] = elapsed
        totals["tokens_per_step"] = totals["new_tokens"] / totals["target_steps"]
        totals["decoding_iter"] = decoding_iter
        not_visible = NOT_VISIBLE + ([f"which of these {len(tokens)} tokens were drafts ({iterations} iterations streamed as one chunk)"]
                                     if iterations > 1 else [])
        yield {
            "type": "step", "step": step, "kind": "prefill" if first else "decode", "iterations": iterations,
            "proposed": {"tokens": accepted, "parents": list(range(-1, len(accepted) - 1))},
            "accepted": list(range(len(accepted))), "rejected": [], "accepted_tokens": accepted,
            "added_token": tokens[-1], "added_kind": "next", "tokens": list(tokens),
            "source": {"observed": "token stream", "not_visible": not_visible},
            "draft_time_s": None, "verify_time_s": None, "totals": dict(totals), "finish_reason": finish_reason,
        }
        step += 1


class TensorRTLLMBackend(Backend):
    name = "tensorrt_llm"
    engine_builds = True

    def __init__(self, llm_kwargs: Callable[[str, DecodeRequest], dict[str, Any]]) -> None:
        # (model, request) -> LLM(...) arguments as plain data; the service's engine store builds what they need.
        self.llm_kwargs = llm_kwargs
        self._lock = threading.Condition()
        self._engine: tuple[tuple, str, Any] | None = None  # (key, what it serves, LLM): one per GPU
        self._opening: tuple[tuple, str, float] | None = None  # (key, what, since when) while built or loaded, off the lock
        self._running = 0  # generations streaming from it now
        self._availability: Availability | None = None

    def availability(self) -> Availability:
        if self._availability is None:
            self._availability = probe()
        return self._availability

    @staticmethod
    def waiting(seconds: float) -> str:
        return (f"preparing and starting TensorRT-LLM for these settings: {seconds:.0f} s (a first start loads the "
                "model, and for lookahead and Medusa builds a TensorRT engine: minutes; later runs reuse it)")

    def auto(self, mode: str) -> bool:
        return self.availability().available and mode != "autoregressive"

    def notes(self, request: DecodeRequest) -> list[str]:
        return trtllm_notes(request)

    def supports(self, mode: Mode, model: str | None = None) -> str | None:
        # Which of its own backends runs which mode is the mode's entry's (app/modes/ `trtllm`).
        if not mode.trtllm:
            return f"TensorRT-LLM has no {mode.name} decoding: {mode.trtllm_missing or 'the mode is this app’s own'}"
        return None if self.availability().available else self.availability().reason

    def check(self, request: DecodeRequest) -> None:
        check(request)

    def prepare(self, model: str, request: DecodeRequest, prompt: Prompt, limits: Limits) -> Work:
        state = self.availability()
        if not state.available:
            raise ConfigError(state.reason)
        # Opened here, as a vLLM engine is started in its prepare(), so that a configuration TensorRT-LLM refuses fails
        # before the job is queued; but off the backend's lock (_acquire), so that one first request's build (a
        # TensorRT engine: minutes) holds up no other submit. None while another submit opens this same configuration:
        # the job then waits for it in its worker.
        llm, opened = self._acquire(model, request)
        prompt_ids = None if llm is None else _prompt_ids(llm, prompt, limits)

        def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
            from tensorrt_llm import SamplingParams

            # Again in the worker: another configuration may have had the GPU since prepare().
            llm, reopened = self._acquire(model, request, cancel, running=True)
            if llm is None:
                yield {"type": "end", "finish_reason": "cancelled", "text": "", "token_ids": [], "totals": {}, "error": None}
                return
            try:
                ids_in = prompt_ids if prompt_ids is not None else _prompt_ids(llm, prompt, limits)
                yield {"type": "start", "backend": self.name, "model": model, "mode": request.mode,
                       "prompt_ids": ids_in, "texts": _texts(llm, ids_in), "not_visible": NOT_VISIBLE,
                       "pass": reopened or opened or REUSED}
                kwargs = sampling_kwargs(request)
                if "lookahead_config" in kwargs:
                    from tensorrt_llm.llmapi import LookaheadDecodingConfig

                    kwargs["lookahead_config"] = LookaheadDecodingConfig(**kwargs["lookahead_config"])
                generation = llm.generate_async(ids_in, sampling_params=SamplingParams(**kwargs), streaming=True)
                ids: list[int] = []
                finish, totals, last = None, {}, {}
                for step in steps_from_diffs(_stream(generation, cancel, last)):
                    ids += step["tokens"]
                    finish, totals = step["finish_reason"], step["totals"]
                    yield {**step, "texts": _texts(llm, step["tokens"])}
                totals = {**totals, "avg_decoded_tokens_per_iter": getattr(generation, "avg_decoded_tokens_per_iter", None)}
                yield {"type": "end", "finish_reason": finish or ("cancelled" if cancel.is_set() else None),
                       "text": llm.tokenizer.decode(ids, skip_special_tokens=True), "token_ids": ids,
                       "totals": with_perf_metrics(totals, last.get("perf")), "error": None}
            finally:
                with self._lock:
                    self._running -= 1
                    self._lock.notify_all()

        return work

    def _acquire(self, model: str, request: DecodeRequest, cancel: threading.Event | None = None,
                 running: bool = False) -> tuple[Any, str | None]:
        """(the LLM for (model, mode config), how it was opened in words; None for that when it was open already).

        One engine at a time (see the module's docstring): another configuration's engine is shut down first. The lock
        guards only the bookkeeping: the slot is reserved (`_opening`) and the engine built and loaded without it. While
        the GPU is another configuration's (a generation streams from it, or it is being opened), prepare() refuses at
        once and a worker waits (None, None when it is cancelled meanwhile); while this configuration is being opened,
        prepare() gets (None, None) at once and its worker waits. `running` counts the caller among the engine's users."""
        key = (model, request.speculative_config.model_dump_json(), request.trtllm_backend)
        with self._lock:
            while True:
                if self._engine is not None and self._engine[0] == key:
                    self._running += running
                    return self._engine[2], None
                busy = self._busy()
                if busy is None:
                    break
                if cancel is None:
                    if self._opening is not None and self._opening[0] == key:
                        return None, None
                    raise ConfigError(busy)
                if cancel.is_set():
                    return None, None
                self._lock.wait(timeout=0.5)
            what = f"{request.mode} on {model}"
            self._opening, (old, self._engine) = (key, what, time.monotonic()), (self._engine, None)
        try:
            opened = "TensorRT-LLM engine opened for this configuration"
            if old is not None:
                opened += (f"; the one for {old[1]} was shut down first (one engine per GPU: each reserves most of the free "
                           "GPU memory for its KV cache)")
                old[2].shutdown()
            # The store's build of this configuration (a TensorRT engine for lookahead and Medusa: minutes), then its LLM.
            try:
                kwargs = llm_objects(self.llm_kwargs(model, request))
            except EngineError as err:  # a build the store refuses or that failed: said to the user, as vLLM's are
                raise ConfigError(str(err)) from None
            llm = import_object(LLM_CLASSES[trtllm_backend(request)])(**kwargs)
        except BaseException:
            with self._lock:
                self._opening = None
                self._lock.notify_all()
            raise
        with self._lock:
            self._engine, self._opening = (key, what, llm), None
            self._running += running
            self._lock.notify_all()
        return llm, opened

    def _busy(self) -> str | None:
        """Why the GPU cannot take another configuration now, in words; None when it can. Called under the lock."""
        if self._opening is not None:
            _, what, since = self._opening
            return (f"the GPU is busy: TensorRT-LLM is building or loading the engine for {what} (for {time.monotonic() - since:.0f} s "
                    "so far; a TensorRT engine's build takes minutes) and it holds one engine at a time (each reserves most "
                    "of the free GPU memory); try again when it is ready")
        if self._engine is not None and self._running:
            return (f"the GPU is busy with TensorRT-LLM for {self._engine[1]}: it holds one engine at a time (each reserves "
                    "most of the free GPU memory), so another configuration starts only when that generation ends; try "
                    "again then")
        return None

    def close(self) -> None:
        """Shut the engine down (TensorRT-LLM frees its GPU memory and workers on LLM.shutdown)."""
        with self._lock:
            engine, self._engine = self._engine, None
            if engine is not None:
                engine[2].shutdown()


def _prompt_ids(llm, prompt: Prompt, limits: Limits) -> list[int]:
    """The prompt in the engine's tokens: a chat prompt rendered with the model's template; a raw prompt with the
    special tokens TensorRT-LLM would add to it (SamplingParams.add_special_tokens defaults to True), a chat template
    writing its own. Refused above the server's limit (the engine itself is built for that many: builds.py)."""
    text = prompt.text
    templated = bool(prompt.messages or not prompt.raw)
    if templated:
        turns = prompt.messages or [{"role": "user", "content": prompt.text}]
        text = llm.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    ids = llm.tokenizer.encode(text, add_special_tokens=not templated)
    if len(ids) > limits.max_prompt_tokens:
        raise ConfigError(f"the prompt has {len(ids)} tokens; this server takes at most {limits.max_prompt_tokens}")
    return ids


def with_perf_metrics(totals: dict[str, Any], perf: Any) -> dict[str, Any]:
    """The run's end totals with the request's own speculative-decoding counters: CompletionOutput.request_perf_metrics
    (executor/result.py, asked for with SamplingParams.return_perf_metrics), whose speculative_decoding part the C++
    request fills. Drafted and accepted come from there when it counted drafting; the stream's own count of accepted
    tokens stays beside it. 1.2.1's PyTorch backend with its default TorchSampler leaves these counters at zero
    while it drafts (fixed upstream later): then the stream's count stands and the totals say so."""
    spec = getattr(perf, "speculative_decoding", None)
    if spec is None:
        return {**totals, "perf_metrics": None}
    counters = {"drafted": spec.total_draft_tokens, "accepted": spec.total_accepted_draft_tokens,
                "acceptance_rate": spec.acceptance_rate}
    out = {**totals, "perf_metrics": counters, "accepted_in_stream": totals.get("accepted")}
    if counters["drafted"]:
        out.update(drafted=counters["drafted"], accepted=counters["accepted"], accepted_from="request_perf_metrics")
    else:
        out["accepted_from"] = "token stream (request_perf_metrics counted no draft tokens)"
    return out


def _stream(generation, cancel: threading.Event, last: dict | None = None) -> Iterator[tuple[list[int], float, str | None, int | None]]:
    """A streaming generate_async result read from this worker thread: one (token_ids_diff, elapsed, finish,
    decoding_iter) per streamed response, as it arrives; a set `cancel` aborts the request. The finish reason is
    upstream's own ('stop' for the end id and for stop words alike, 'length', 'timeout', 'cancelled'). `last` gets the
    latest response's request_perf_metrics ("perf"), which each response carries when they were asked for.

    Iterated synchronously: upstream's result makes its asyncio queue only when an event loop is running
    where it is created, and its async iteration asserts that one was (executor/result.py
    GenerationResultBase.__init__, GenerationResult._aresult_step); a worker thread has none."""
    start = time.perf_counter()
    try:
        for out in generation:
            completion = out.outputs[0]
            if last is not None:
                last["perf"] = getattr(completion, "request_perf_metrics", None)
            yield (list(completion.token_ids_diff), time.perf_counter() - start, completion.finish_reason,
                   getattr(out, "decoding_iter", None))
            if cancel.is_set():
                return
    finally:  # cancelled, or the reader went away: the engine stops working on it
        if not generation.finished:
            generation.abort()


def import_object(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def llm_objects(llm: dict) -> dict:
    """LLM(...) keyword arguments from plain data: the llmapi speculative config class and a BuildConfig.
    Field names are checked against the installed version (they moved between releases)."""
    from tensorrt_llm import llmapi

    kwargs = dict(llm)
    if "speculative_config" in kwargs:
        data = {k: v for k, v in kwargs["speculative_config"].items() if v is not None}
        cls = getattr(llmapi, config_class(data.pop("decoding_type")))
        fields = {name: (f.alias or name) for name, f in cls.model_fields.items()}
        names = set(fields) | set(fields.values())
        if "speculative_model" in data and "speculative_model" not in names and "speculative_model_dir" in names:
            data["speculative_model_dir"] = data.pop("speculative_model")  # the 1.0-era name
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"this TensorRT-LLM's {cls.__name__} has no field {', '.join(unknown)}")
        try:
            kwargs["speculative_config"] = cls(**data)
        except ValueError as err:  # pydantic's ValidationError: upstream's own field types and validators
            first = err.errors()[0] if hasattr(err, "errors") else {"loc": (), "msg": str(err)}
            where = ".".join(map(one_line, first["loc"]))
            raise ConfigError(f"TensorRT-LLM's {cls.__name__} refuses {where or 'the config'}: {first['msg']}") from None
    if "build_config" in kwargs:
        build = dict(kwargs["build_config"])
        build.pop("speculative_decoding_mode", None)  # the LLM API sets it from speculative_config (llm_args.py validate_speculative_config)
        kwargs["build_config"] = llmapi.BuildConfig(**build)
    return kwargs


def _texts(llm, ids) -> dict[int, str]:
    return {i: llm.tokenizer.decode([i]) for i in set(ids)}


def check(request: DecodeRequest) -> None:
    """TensorRT-LLM's rules for a request of a valid mode: its support matrix (the entry's `trtllm`), what none of its
    configs take, and what the mode's own config cannot take there (the entry's `trtllm_check`)."""
    c, entry = request.speculative_config, request.entry
    if not entry.trtllm:
        raise ConfigError(f"TensorRT-LLM has no {request.mode} decoding: {entry.trtllm_missing}")
    flavour = request.trtllm_backend or entry.trtllm[0]
    if flavour not in entry.trtllm:
        raise ConfigError(f"TensorRT-LLM runs {request.mode} only on its {' or '.join(entry.trtllm)} backend, not on {flavour}")
    if entry.draft_model and c.speculative_model is None:
        raise ConfigError(f"TensorRT-LLM needs a draft model for {request.mode}: set speculative_model")
    if getattr(c, "min_path_prob", 0):
        raise ConfigError("min_path_prob (tree pruning) is this app's own: TensorRT-LLM has no such setting, use 0")
    if configs.merged(c) is not None:
        raise ConfigError(f"merging prompt lookup into the {request.mode} tree is this app's own: TensorRT-LLM cannot, "
                          "leave prompt_lookup unset")
    if entry.trtllm_check is not None:
        entry.trtllm_check(request)


# ---------------------------------------------------------------- a request in TensorRT-LLM's terms (pure data)
def trtllm_backend(request: DecodeRequest) -> str:
    """'pytorch' or 'tensorrt': the one asked for, or the first that runs the mode (its entry's `trtllm`)."""
    return request.trtllm_backend or request.entry.trtllm[0]


def trtllm_notes(request: DecodeRequest) -> list[str]:
    """What of a valid request TensorRT-LLM does not take, in words (the entry's `trtllm_ignored`): settings of this
    app's own that its configs have no field for (so they are not sent), and meanings that differ."""
    ignored = request.entry.trtllm_ignored
    return [] if ignored is None else ignored(request.speculative_config, trtllm_backend(request))


def trtllm_speculative_config(request: DecodeRequest) -> dict[str, Any] | None:
    """The `speculative_config` for TensorRT-LLM's LLM(...) / trtllm-serve YAML, as plain data; None = none.
    Fields as TensorRT-LLM 1.2 names and means them (the entry's `trtllm_fields`, app/modes/mappings.py); what it has
    no field for is left out and said by trtllm_notes. What comes from a trained artifact (Medusa's head count,
    EAGLE-3's capture layers) and what the backend that runs it makes of it (EAGLE on PyTorch: eagle3_on_pytorch) is
    the build plan's to add (builds.trtllm_plan): the plan's `llm.speculative_config` is what reaches the engine."""
    entry, c = request.entry, request.speculative_config
    if not entry.trtllm:
        raise ConfigError(f"TensorRT-LLM has no {c.mode} decoding: {entry.trtllm_missing}")
    if entry.trtllm_fields is None:
        return None
    return {"decoding_type": c.decoding_type, **entry.trtllm_fields(c, trtllm_backend(request))}


def eagle3_on_pytorch(speculative: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """EAGLE's speculative config as TensorRT-LLM 1.2's PyTorch backend takes it, and what that leaves out, in words.

    That backend runs EAGLE-3 only: TorchLlmArgs.validate_speculative_config turns a `decoding_type: Eagle` config into
    an Eagle3DecodingConfig with a warning ("'Eagle' is not supported on the PyTorch backend; only 'Eagle3' is
    supported"), so an EAGLE-3 module is sent as `Eagle3` (the engine backend refuses `Eagle3`, and keeps `Eagle`). A
    static tree makes EagleDecodingConfig.validate_eagle_choices log "The Draft token tree is still under development,
    PLEASE DO NOT USE IT": a chain of the tree's depth is sent instead (max_draft_len is that depth already); its
    dynamic tree is not available there either (this module's mapping leaves use_dynamic_tree out and says why)."""
    out = {**speculative, "decoding_type": "Eagle3"}
    choices = out.pop("eagle_choices", None)
    notes = [] if choices is None else [
        f"the static tree ({len(choices)} nodes) is not sent: TensorRT-LLM 1.2's PyTorch backend marks its draft token "
        f"tree as still under development (\"PLEASE DO NOT USE IT\"), so it drafts a chain of the tree's depth, "
        f"{out['max_draft_len']} tokens"]
    return out, notes


def trtllm_engine_draft_len(request: DecodeRequest) -> int:
    """The engine's build_config.max_draft_len as TensorRT-LLM's LLM API sets it (llm_args.py
    BaseLlmArgs.validate_speculative_config): the speculative config's max_draft_len (for EAGLE the depth
    trtllm_speculative_config sends, not the tree's nodes); lookahead's, which sends none, its formula (its draft
    tokens per step)."""
    spec = trtllm_speculative_config(request) or {}
    return spec.get("max_draft_len", configs.draft_tokens(request.speculative_config))


def trtllm_build_plan(request: DecodeRequest, checkpoint_dir: str, output_dir: str, max_batch_size: int = 8) -> list[str]:
    """The `trtllm-build` command for users who build TensorRT engines by hand (≤ 1.2, engine backend), with the
    max_draft_len the LLM API would build the same engine with (trtllm_engine_draft_len)."""
    mode = request.entry.trtllm_engine_mode  # trtllm-build's flag takes the member's name in lower case
    cmd = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir,
           "--max_batch_size", str(max_batch_size), "--max_beam_width", "1"]
    if mode:
        cmd += ["--speculative_decoding_mode", mode.lower(), "--max_draft_len", str(trtllm_engine_draft_len(request))]
    if mode == "DRAFT_TOKENS_EXTERNAL":  # its draft tokens come from outside the engine, into a paged context
        cmd += ["--use_paged_context_fmha", "enable"]
    return cmd
