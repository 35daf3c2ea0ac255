"""The service: the one API the web UI, the CLI and the HTTP server use.

It validates every decoding config before anything runs (configs.parse), knows which backend
can run which mode and why not, runs generations as jobs (queue, concurrency limit, cancel,
time limit) that stream JSON-like messages (its generation face, here), and manages engine builds and
training runs (its engines and training faces, faces.py).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from app import models, runner
from app.models import DTYPES, ModelError  # noqa: F401  (ModelError: what the service raises, for its clients)
from app.prompts import load_prompts
from app.decoding.linear import fast_bf16
from app.modes import MODES, ConfigError, DecodeRequest, Mode, Modes, configs
from app.backends import registry
from app.backends.base import Availability, Prompt
from app.backends.registry import AUTO, LOCAL, EngineStore, TRTLLMSettings, VLLMSettings
from app.backends.store import Progress
from app.bench import load
from app.service import training
from app.service.faces import TRAINING_OFF, Engines, Training, TrainingTimeout  # noqa: F401  (for its clients)
from app.service.jobs import Job, JobManager, Limits, Work, race
from app.service.policy import Policy, address_of, relative


@dataclass(frozen=True)
class Checked:
    """A request one service checked for one visitor (Service.check): submit and stream take it as it is."""

    request: DecodeRequest
    visitor: str | None
    by: Any = field(repr=False, compare=False)  # the service whose limits and policy it met


class Service(Engines, Training):
    """Its generation face is here, its engines and training faces in faces.py."""

    def __init__(
        self,
        engines: Path = models.DEFAULT_ENGINES,
        model: str = models.BUNDLED,
        dtype: str = "float32",
        backend: str = "auto",
        remote_url: str | None = None,
        tensor_parallel_size: int = 1,
        limits: Limits = Limits(),
        vllm_settings: VLLMSettings = VLLMSettings(),
        trtllm_settings: TRTLLMSettings = TRTLLMSettings(),
        policy: Policy = Policy(),
        modes: Modes = MODES,
        fast: str = "eager",
    ) -> None:
        if backend not in ("auto", *registry.BACKENDS):
            raise ConfigError(f"unknown backend '{backend}': choose auto or one of {', '.join(registry.BACKENDS)}")
        if tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
        self.engines = Path(engines)
        self.registry = modes  # the modes it runs (app/modes/)
        self.model = model
        self.dtype = dtype
        self.limits = limits
        self.policy = policy
        self.backend = backend
        self.store = EngineStore(self.engines)
        self.tensor_parallel_size = tensor_parallel_size
        self.jobs = JobManager(limits)
        self._training = threading.Lock()  # one training run at a time: each takes both cores for minutes
        # Public mode: who made which build (build id -> the visitors who made or re-made it). Visitors are page loads of
        # this process, so this is in memory; the store marks the build as a visitor's (visitor-builds/), and every
        # public process, this one restarted included, keeps such a build from everyone else.
        self._owners: dict[str, set[str]] = {}
        self._owners_lock = threading.Lock()
        self._visitor_made = self.engines / "visitor-builds"  # one empty file per build a public visitor made
        # Where this server keeps files, as a response may show it (relative; see policy.relative).
        self._roots = {str(self.engines.resolve()): "engines", str(models.ROOT): "", str(Path.home()): "~"}
        # Each engine's backend by name, and the ones that keep engine processes on the store (registry.make).
        self.backends, self.keepers = registry.make(
            self.store, dtype, compute=self.jobs.call, fast=fast, remote_url=remote_url,
            tensor_parallel_size=tensor_parallel_size, vllm_settings=vllm_settings, trtllm_settings=trtllm_settings,
            public=policy.public, max_started=policy.visitor_engines if policy.public else None,
            idle_s=policy.engine_idle_s if policy.public else None)
        self.local = self.backends[LOCAL]  # this app's own loop, in this process

    # ------------------------------------------------------------------ what can run
    def availability(self) -> dict[str, Availability]:
        return {name: b.availability() for name, b in self.backends.items()}

    def available(self, backend: str) -> Availability:
        """Whether one backend (a registry name) runs here, and why not."""
        return self.backends[backend].availability()

    def default_backend(self, mode: str = "autoregressive") -> str:
        """`auto`: a configured remote server, else TensorRT-LLM where it runs the mode, else transformers (the
        registry's AUTO, each backend's `auto`)."""
        if self.backend != "auto":
            return self.backend
        return next(name for name in AUTO if self.backends[name].auto(mode))

    def runs_here(self, backend: str) -> bool:
        """Whether `backend` (a registry name) is this app's own loop in this process: its steps run here, one at a time."""
        return self.backends[backend] is self.local

    def supports(self, backend: str, mode: Mode, model: str | None = None) -> str | None:
        """None when `backend` can run `mode` (an entry of the registry) for `model`, else the reason it cannot."""
        return self.backends[backend].supports(mode, model or self.model)

    def modes(self, backend: str | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Every mode, whether `backend` can run it for `model`, why not, and whether it is lossless."""
        model = model or self.model
        out = []
        for entry in self.registry:
            name = backend or self.default_backend(entry.name)
            reason = self.backends[name].supports(entry, model)
            out.append({"mode": entry.name, "backend": name, "available": reason is None, "reason": reason or "",
                        "lossless": entry.lossless})
        return out

    def fast_dtype(self) -> str:
        """The dtype the Run tab's "fastest here" preset picks: bfloat16 where the CPU has it natively. Without, a
        one-token pass is faster in bfloat16 (models.fast_dtype, `--dtype auto`) but speculation earns more in float32,
        and public mode runs its operator's dtype only (_check_dtype)."""
        if self.policy.public:
            return self.dtype
        return "bfloat16" if fast_bf16() else "float32"

    def dtypes(self) -> tuple[str, ...]:
        """The dtypes a request may run the transformers backend in: every one, or in public mode the server's."""
        return (self.dtype,) if self.policy.public else tuple(DTYPES)

    def dtype_note(self, dtype: str) -> str:
        """What a user should know about running this server's transformers backend in `dtype` ("auto" = the server's)."""
        dtype = self.dtype if dtype == "auto" else dtype
        if dtype != "bfloat16":
            return ""
        note = "bfloat16: greedy outputs can part from autoregressive after a while (a pass over several tokens rounds differently)"
        if not fast_bf16():
            note += ("; this CPU has no native bfloat16: a one-token pass reads half the bytes, but passes over several "
                     "tokens multiply in float32, so speculation earns less than in float32")
        return note

    def pass_note(self, dtype: str = "auto") -> str:
        """Which pass the transformers backend runs this server's model in (empty until it is loaded)."""
        return self.local.pass_note(self.model, dtype) or ""

    def fast_passes(self) -> list[dict[str, Any]]:
        """The fast pass of this server's model in each dtype it is loaded in (TransformersBackend.fast_status): its
        state and note; while one builds, its stage, seconds so far and estimate."""
        return [s for dtype in DTYPES if (s := self.local.fast_status(self.model, dtype)) is not None]

    def engine_note(self, request: DecodeRequest) -> str | None:
        """What a user should know before running `request` on its engine, said in place of this app's own notes (vLLM:
        its method, what it ignores, whether its engine is up: a first Run starts it, a minute or more); None: nothing."""
        return self.backends[request.backend].note(request, self.model)

    def notes(self, request: DecodeRequest) -> list[str]:
        """What of a valid request its engine does not take, in words (said, not dropped silently)."""
        return self.backends[request.backend].notes(request)

    def preload(self, model: str | None = None) -> None:
        """Load `model` (the server's) for this app's own loop now: a server fails at its start, not at a first request."""
        self.local.model(model or self.model)

    # ------------------------------------------------------------------ configs
    def request(self, data: dict[str, Any] | DecodeRequest, visitor: str | None = None) -> DecodeRequest:
        """A checked request: every rule, plus this service's limits and policy. Raises ConfigError (one sentence).
        `visitor` (public mode): whose training runs it may name."""
        if isinstance(data, DecodeRequest):
            data = data.model_dump(mode="json")
        data = dict(data)
        if "backend" not in data or data["backend"] in (None, "auto"):
            spec = data.get("speculative_config")
            mode = spec.get("decoding_type", "Autoregressive") if isinstance(spec, dict) else "Autoregressive"
            known = {m.decoding_type: m.name for m in self.registry}
            data["backend"] = self.default_backend(known.get(str(mode), "autoregressive"))
        if data.get("max_new_tokens") is None:
            data["max_new_tokens"] = min(configs.DecodeRequest.model_fields["max_new_tokens"].default, self.limits.max_new_tokens)
        if not isinstance(data["backend"], str) or data["backend"] not in self.backends:
            raise ConfigError(f"unknown backend '{str(data['backend'])[:40]}': choose auto or one of {', '.join(self.backends)}")
        request = self._trained(configs.parse(data, self.registry, self.limits.max_new_tokens), visitor)
        backend = self.backends[request.backend]
        if request.dtype != "auto" and not backend.dtype_per_request:
            able = " and ".join(name for name, b in self.backends.items() if b.dtype_per_request)
            raise ConfigError(f"dtype {request.dtype} can be chosen per request on the {able} backends only; "
                              f"{request.backend} runs the model in the dtype it was built or served with: use auto")
        backend.check(request)
        self._check_dtype(request.dtype)
        return request

    def _check_dtype(self, dtype: str) -> None:
        """Public mode runs the dtype its operator started it with: another would load a second copy of the model
        (gigabytes, the transformers backend) or start an engine, and build a fast pass (a CPU's half hour) that no
        visitor should start on a shared machine."""
        if self.policy.public and dtype not in ("auto", self.dtype):
            raise ConfigError(f"this public server runs {self.dtype} only (its operator's --dtype): another dtype would "
                              "load a second copy of the model and build its fast pass; choose auto")

    def _trained(self, request: DecodeRequest, visitor: str | None = None) -> DecodeRequest:
        """The request with a trained artifact named `trained:<id>` replaced by its directory in the store; any
        other speculative_model checked against the policy (registry names; paths and hub ids if allowed)."""
        c = request.speculative_config
        name = getattr(c, "speculative_model", None)
        if not name:
            return request
        if not name.startswith(training.PREFIX):
            if name not in models.DRAFT_ALIASES and name not in models.ALIASES:
                self.policy.check_model_name(name, tuple(models.DRAFT_ALIASES))
            return request
        if c.mode not in training.KINDS:
            raise ConfigError(f"'{name}' names trained Medusa heads or an EAGLE module; {c.mode} cannot use it")
        build_id = name.removeprefix(training.PREFIX)
        if self.policy.public and training.is_name(name) and not (self._ready(build_id) and self.visible(build_id, visitor)):
            # One answer whether the run is missing or someone else's: a refusal must not tell them apart.
            raise ConfigError(f"there is no finished training run '{build_id[:40]}' of yours (see the Train tab)")
        path = training.artifact_dir(self.store, name, c.mode, self.model)
        return request.model_copy(update={"speculative_config": c.model_copy(update={"speculative_model": str(path)})})

    # ------------------------------------------------------------------ generation
    def check(self, data: dict[str, Any] | DecodeRequest, visitor: str | None = None) -> Checked:
        """request(), as the value submit() and stream() take without checking it again."""
        return Checked(self.request(data, visitor), visitor, self)

    def submit(self, data: dict[str, Any] | DecodeRequest | Checked, prompt: str | Prompt, model: str | None = None,
               visitor: str | None = None, client: str | None = None) -> Job:
        """Validate (unless `data` is this service's check for this visitor), prepare (load the model and what the mode
        drafts with, encode, check the prompt, build the drafter), then queue the generation. Raises ConfigError /
        ModelError / QueueFull before anything is queued. `client` (an HTTP client's address): whose jobs count against
        the policy's per-visitor bound."""
        return self.queue(self._prepare(data, prompt, model, visitor)[1], visitor or client)

    def race(self, data: dict[str, Any] | DecodeRequest | Checked, baseline: dict[str, Any] | DecodeRequest,
             prompt: str | Prompt, model: str | None = None, visitor: str | None = None,
             gate: threading.Lock | None = None) -> Job:
        """A run and the autoregressive `baseline` it races, prepared as submit() prepares each, in one job whose
        messages say their "side" ("run" or "baseline"). On the transformers backend the two step in turn, the one
        behind in tokens next (jobs.race): both are timed under the same load, pass by pass, so a ratio of their speeds
        holds on a busy machine. An engine's two runs (vLLM, TensorRT-LLM) go back to back, the baseline first.
        `gate`: a lock the caller holds while it draws, which no step overlaps (jobs.race)."""
        refused = self.race_refusal(data.request if isinstance(data, Checked) else self.request(data, visitor))
        if refused:  # before anything is prepared or started
            raise ConfigError(refused)
        base_request, base = self._prepare(baseline, prompt, model, visitor)
        request, run = self._prepare(data, prompt, model, visitor)
        both_here = self.runs_here(request.backend) and self.runs_here(base_request.backend)
        return self.queue(race(run, base, interleave=both_here, gate=gate), visitor)

    def race_refusal(self, request: DecodeRequest) -> str | None:
        """Why `request` cannot race an autoregressive baseline on this service, or None."""
        return self.backends[request.backend].race_refusal(request)

    def _prepare(self, data: dict[str, Any] | DecodeRequest | Checked, prompt: str | Prompt, model: str | None,
                 visitor: str | None) -> tuple[DecodeRequest, Work]:
        if isinstance(data, Checked):
            if data.by is not self or data.visitor != visitor:  # a caller's slip, not a user's: its limits were others'
                raise ValueError("a request checked by another service or for another visitor: check it here")
            request = data.request
        else:
            request = self.request(data, visitor)
        prompt = prompt if isinstance(prompt, Prompt) else Prompt(prompt)
        self._require_text([m["content"] for m in prompt.messages] or [prompt.text])
        backend = self.backends[request.backend]
        state = backend.availability()
        if not state.available:
            raise ConfigError(f"the {request.backend} backend is not available: {state.reason}")
        if self.policy.public and visitor is None:
            self._check_operators_engine(request, model or self.model)
        # A visitor's run on vLLM may start its engine (prepare): the engine is then theirs, as one built in Engines is.
        claims = self.policy.public and visitor is not None and backend.managed
        engine = self.engine_id(request, model or self.model) if claims else None
        existed = engine is not None and self._ready(engine)
        work = backend.prepare(model or self.model, request, prompt, self.limits)
        if engine is not None and not existed:  # a run on another's engine uses it; it does not make it theirs
            self._claim(engine, visitor, existed)
        return request, work

    def prepare(self, data: dict[str, Any] | DecodeRequest | Checked, prompt: str | Prompt, model: str | None = None,
                visitor: str | None = None) -> Work:
        """submit() without the queue: the work a caller runs on a job of its own (the load sweep's race, jobs.race)."""
        return self._prepare(data, prompt, model, visitor)[1]

    def queue(self, work: Any, who: str | None) -> Job:
        """Queue a job of `who` (a visitor key or an HTTP client's address; policy.visitor) against the policy's bounds
        per visitor and per address. Raises QueueFull / TooMany in words."""
        return self.jobs.submit(work, who, self.policy.visitor_jobs, address_of(who), self.policy.address_jobs)

    def stream(self, data: dict[str, Any] | DecodeRequest | Checked, prompt: str | Prompt, model: str | None = None,
               visitor: str | None = None) -> Iterator[dict[str, Any]]:
        """submit() and its messages; closing the iterator early (a Stop button, a dropped client) cancels the job."""
        job = self.submit(data, prompt, model, visitor)
        try:
            yield from job.messages()
        finally:
            job.cancel()

    # ------------------------------------------------------------------ what a client offers
    def examples(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The shipped Spec-Bench prompts (first turns: id, category, text), at most `limit` per category."""
        return load_prompts(None, None, limit)

    def drafts(self) -> list[str]:
        """The registry's draft models for this service's model (what draft_target's speculative_model may name)."""
        return [name for name, (base, _) in models.DRAFT_ALIASES.items() if base == self.model]

    # ------------------------------------------------------------------ the machine
    def pass_cost(self, prompt: str, dtype: str = "auto", repeats: int = 3, visitor: str | None = None) -> dict[str, Any]:
        """What one target pass over k tokens costs after `prompt` on this machine, in milliseconds and relative
        to a one-token pass (runner.verify_cost), on the transformers backend in `dtype`. A speculative step that
        verifies k tokens pays only when it commits more than that relative cost. Queued like a generation,
        so it never times a CPU another job is using, and counted against `visitor`'s bounds as one."""
        if dtype not in ("auto", *DTYPES):
            raise ConfigError(f"dtype must be auto or one of {', '.join(DTYPES)}, got '{dtype}'")
        self._check_dtype(dtype)
        self._require_text([prompt])
        target = self.local.model(self.model, dtype)
        ids = target.encode(prompt)
        configs.check_prompt_limit(len(ids), min(self.limits.max_prompt_tokens, self.policy.measure_prompt_tokens or math.inf))

        def work(cancel):
            note = target.fast["note"]  # which pass is timed: the one runs use
            cost = runner.verify_cost(target, ids, repeats=repeats)  # measured on while a burst of load breaks it
            yield {"type": "cost", "dtype": target.dtype, "pass": note, **cost}
            yield {"type": "end", "finish_reason": "length", "error": None}

        messages = list(self.queue(work, visitor).messages())
        if messages[-1].get("error"):
            raise RuntimeError(messages[-1]["error"])
        return next({k: v for k, v in m.items() if k != "type"} for m in messages if m["type"] == "cost")

    def load_sweep(self, data: dict[str, Any], ns: str | list[int] | None = None, max_new_tokens: int = 32,
                   ours: bool = False, progress: Progress | None = None, visitor: str | None = None,
                   starting: Callable[[str], None] | None = None) -> Job:
        """N concurrent requests (1, 2, 4, 8, 16 by default; at most load.PUBLIC_MAX_N in public mode) to the vLLM
        engine of a speculative request and to the plain engine of the same model, queued as a job whose messages
        are its points and, at the end, the recorded sweep (app/bench/load.py). Raises ConfigError before anything is
        queued. `starting(mode)`: which engine it starts (or finds running) next, the speculative mode's or
        autoregressive."""
        return load.submit(self, data, ns, max_new_tokens, ours, progress, visitor, starting=starting)

    def relative(self, value: Any) -> Any:
        """`value` (text or JSON-like data) without the server's absolute paths (policy.relative)."""
        return relative(value, self._roots)

    def _require_text(self, texts: list[str]) -> None:
        # A token is rarely more than a dozen characters: 16 per allowed prompt token leaves room for any real prompt.
        _check_text(texts, 16 * min(self.limits.max_prompt_tokens, 2**20))

    def close(self, stop_engines: bool = True) -> None:
        """Stop the jobs, let go of what the backends hold in this process (the TensorRT-LLM engine) and, unless told
        not to, stop the engines this service started (vLLM's servers, TensorRT-LLM's workers; engines started
        elsewhere keep running)."""
        self.jobs.shutdown()
        for backend in self.backends.values():
            backend.close()
        if stop_engines:
            for keeper in self.keepers:
                keeper.stop_started()


def _check_text(texts: list[str], max_chars: int) -> None:
    """A prompt a tokenizer can take: some text, valid Unicode, and not far longer than the prompt limit allows."""
    if not all(isinstance(text, str) for text in texts):
        raise ConfigError("the prompt must be text: type something to continue")
    if not any(text.strip() for text in texts):
        raise ConfigError("the prompt is empty: type something to continue")
    size = sum(len(t) for t in texts)
    if size > max_chars:
        raise ConfigError(f"the prompt has {size:,} characters; this server takes at most {max_chars:,}: shorten it")
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError("the prompt holds a character that is not valid Unicode text (a lone surrogate such as "
                              "\\ud800): remove it") from None
