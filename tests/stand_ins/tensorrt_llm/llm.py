"""The LLM classes: upstream's argument checks (llm_args.py), its result object (executor/result.py), its
iteration statistics (executor/executor.py, executor/result.py IterationResult), its EAGLE-3 weight loading
(_torch/models/modeling_speculative.py at 1.2.0rc2), the GPU memory an engine holds (llm_args.py KvCacheConfig),
the engine's input limits (BuildConfig; cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate; llmapi/llm.py
_check_arguments) and a request's perf metrics (executor/result.py; the C++ request's speculative-decoding counters).

Generation replays a scripted stream of 1, 2, 1, 3 tokens per iteration, like a speculative engine; running out
of script stands for the model's end id.
"""

import asyncio
import dataclasses
import json
import queue
import threading
from pathlib import Path
from types import SimpleNamespace

from . import llmapi

CREATED = []  # every LLM made, for the tests to inspect
DOWNLOADS = []  # hub ids an LLM was given: upstream would download them (llmapi/llm_utils.py); the stand-in is offline
SCRIPT = [[5], [6, 7], [8], [9, 10, 11]]
BOS = 1
# Cleared by a test, the engine holds every response after the first until it is set again (no timing involved).
HOLD = threading.Event()
HOLD.set()
# Cleared by a test, building a TensorRT engine (the engine backend's LLM made from a checkpoint) waits until it is
# set again: a build that takes minutes, without a clock. BUILDING is set once a build has begun.
BUILD = threading.Event()
BUILD.set()
BUILDING = threading.Event()
# BaseLlmArgs / TorchLlmArgs / TrtLlmArgs fields this project may pass; like upstream (extra="forbid") nothing else.
COMMON = {"model", "tokenizer", "tensor_parallel_size", "speculative_config", "max_input_len"}
BACKEND_ONLY = {"pytorch": {"enable_iter_perf_stats", "disable_overlap_scheduler"}, "tensorrt": {"build_config"}}
# One GPU, in fractions of its memory. An engine loads its weights, then takes KvCacheConfig.free_gpu_memory_fraction
# (default 0.9) of what is still free for its KV cache, and gives both back on shutdown().
GPU = {"free": 1.0}
WEIGHTS = 0.1
FREE_GPU_MEMORY_FRACTION = 0.9


def _model(value, what: str):
    """llm_args.py _ModelWrapper: an existing directory is a local model; anything else is a hub id, which upstream
    downloads (llmapi/llm_utils.py, huggingface_hub.snapshot_download). The download's own validate_repo_id refuses
    what cannot be a repo id (a path that does not exist, a "{placeholder}"), with huggingface_hub's message."""
    if not isinstance(value, (str, Path)) or not str(value):
        raise ValueError(f"Invalid {what}: {value!r}")
    if Path(value).is_dir():
        return Path(value)
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(str(value))  # HFValidationError, a ValueError
    DOWNLOADS.append(str(value))
    return str(value)


def _perf(drafted, accepted):
    """executor/result.py CompletionOutput.request_perf_metrics: the request's RequestPerfMetrics binding, whose
    speculative_decoding counters the C++ request keeps (llmRequest.cpp createResult sets acceptance_rate)."""
    return SimpleNamespace(speculative_decoding=SimpleNamespace(
        total_draft_tokens=drafted, total_accepted_draft_tokens=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0))


class Tokenizer:
    def apply_chat_template(self, turns, add_generation_prompt, tokenize):
        return "<user>" + turns[-1]["content"] + "<assistant>"

    def encode(self, text, add_special_tokens):
        # Like a Llama tokenizer: the special tokens added are a BOS.
        return ([BOS] if add_special_tokens else []) + [ord(c) % 50 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def _has_event_loop() -> bool:
    # executor/utils.py has_event_loop: is an asyncio loop running in this thread?
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class GenerationResult:
    """executor/result.py GenerationResult: iterated synchronously (__iter__/__next__, which wait for the next
    response) or, only when an event loop was running at its creation, asynchronously; abort(); decoding_iter and
    avg_decoded_tokens_per_iter, the request's own (the C++ request: generated tokens / decoding iterations)."""

    def __init__(self, sampling_params, streaming, llm):
        self.sampling_params, self._streaming, self._llm = sampling_params, streaming, llm
        self.decoding_iter = 0  # GenerationResultBase.decoding_iter: the engine's iterations so far
        self.avg_decoded_tokens_per_iter = None  # None until the first response
        self._done = self._aborted = False
        self._ids = []
        self._drafted = self._accepted = 0
        self.outputs = [SimpleNamespace(token_ids=[], token_ids_diff=[], finish_reason=None)]
        # GenerationResultBase.__init__: the async queue exists only when an event loop is running.
        self.aqueue = object() if _has_event_loop() else None
        self._script = iter(SCRIPT[: sampling_params.max_tokens])

    def abort(self):
        self._aborted = True

    def aborted(self):
        return self._aborted

    @property
    def finished(self):
        return self._done

    def _result_step(self):
        if self.decoding_iter:
            HOLD.wait()
        diff = [] if self._aborted else next(self._script, None)
        if self._aborted or diff is None:
            self._done = True
            finish = "cancelled" if self._aborted else "stop"
            self.outputs[0] = self._output([], finish)
            return
        if self.decoding_iter and self._llm.draft_path_len:
            # A generation iteration of a speculative engine (the first one is the prefill's, which drafts nothing):
            # LlmRequest::updateNumTokensPerIteration adds the tokens it committed - 1 to the accepted count and the
            # draft tokens it verified (at most the longest draft path) to the drafted one.
            self._drafted += self._llm.draft_path_len
            self._accepted += min(len(diff) - 1, self._llm.draft_path_len)
        self.decoding_iter += 1
        self._ids += diff
        self.avg_decoded_tokens_per_iter = len(self._ids) / self.decoding_iter
        self._llm._iteration(diff)
        # _handle_sequence: FinishReason.LENGTH -> 'length'; END_ID and STOP_WORDS -> 'stop' alike.
        length = len(self._ids) >= self.sampling_params.max_tokens
        self._done = length or self.decoding_iter == len(SCRIPT)
        finish = ("length" if length else "stop") if self._done else None
        self.outputs[0] = self._output(diff, finish)

    def _output(self, diff, finish):
        out = SimpleNamespace(token_ids=list(self._ids), token_ids_diff=list(diff), finish_reason=finish)
        if self.sampling_params.return_perf_metrics:  # _handle_sequence copies them onto each response's output
            out.request_perf_metrics = _perf(self._drafted, self._accepted)
        return out

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        self._result_step()
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        # GenerationResult._aresult_step
        assert self.aqueue is not None, ("The asyncio event loop was not present during initialization, "
                                         "so async operations are not available.")
        self._result_step()
        return self


class BaseLLM:
    backend = "pytorch"

    def __init__(self, **kwargs):
        unknown = set(kwargs) - COMMON - BACKEND_ONLY[self.backend]
        if unknown:
            raise ValueError(f"{type(self).__module__}.LLM ({self.backend}) has no argument {sorted(unknown)}")
        self.kwargs, self.tokenizer, self.generations = dict(kwargs), Tokenizer(), []
        self.model = _model(kwargs.get("model"), "model")
        spec = kwargs.get("speculative_config")
        if spec is not None:
            if not isinstance(spec, llmapi.DecodingBaseConfig):
                raise TypeError("speculative_config must be a tensorrt_llm.llmapi decoding config")
            # llm_args.py validate_speculative_config: the support matrix.
            if not spec.supports_backend(self.backend):
                raise ValueError(f"Speculation type {spec.decoding_type} does not support backend {self.backend}")
            if spec.speculative_model is not None:
                _model(spec.speculative_model, "speculative_model")
            if self.backend == "tensorrt":
                self._engine_settings(spec)
            elif isinstance(spec, llmapi.EagleDecodingConfig):
                if type(spec) is llmapi.EagleDecodingConfig:
                    # TorchLlmArgs.validate_speculative_config (1.2): 'Eagle' is taken for 'Eagle3', with a warning.
                    llmapi.logger.warning(llmapi.EAGLE_ON_PYTORCH)
                    spec = llmapi.Eagle3DecodingConfig(**spec.model_dump(exclude={"decoding_type"}))
                    self.kwargs["speculative_config"] = spec
                _load_eagle3(spec)
        self.draft_path_len = _draft_path_len(spec)
        self.limits = self._limits()
        if self.backend == "tensorrt" and not self._is_engine():
            BUILDING.set()  # TrtLlmArgs with a checkpoint: LLM(...) builds the engine first
            BUILD.wait()
        self._memory = self._reserve()
        # executor.py get_stats / result.py IterationResult: one queue of iteration stats for the whole executor,
        # on the PyTorch backend only with enable_iter_perf_stats (TorchLlmArgs).
        self._stats, self._stats_done = queue.Queue(), True
        self._stats_on = self.backend == "tensorrt" or bool(kwargs.get("enable_iter_perf_stats"))
        self._iter = 0
        CREATED.append(self)

    @staticmethod
    def _reserve():
        if GPU["free"] < WEIGHTS:
            raise RuntimeError(f"CUDA out of memory: the model's weights need {WEIGHTS:.0%} of the GPU and "
                               f"{GPU['free']:.0%} is free (another engine holds the rest)")
        kv = (GPU["free"] - WEIGHTS) * FREE_GPU_MEMORY_FRACTION
        GPU["free"] -= WEIGHTS + kv
        return WEIGHTS + kv

    def _is_engine(self):
        # llm_args.py get_model_format: a directory LLM.save wrote is a built engine (TLLM_ENGINE), loaded as it is.
        return isinstance(self.model, Path) and (self.model / "rank0.engine").is_file()

    def _limits(self):
        """The prompt and sequence limits a request meets. Engine backend: the engine's build_config, read back from
        a saved engine (TrtLlmArgs._load_config_from_engine: a build_config passed is ignored) or the one it is built
        with (BuildConfig: max_input_len 1024 unless set). PyTorch: BaseLlmArgs.max_input_len (default 1024)."""
        if self.backend == "pytorch":
            return {"max_input_len": self.kwargs.get("max_input_len") or 1024, "max_seq_len": None}
        if self._is_engine():
            build = json.loads((self.model / "config.json").read_text())["build_config"]
        else:
            build = dataclasses.asdict(self.kwargs.get("build_config") or llmapi.BuildConfig())
        return {"max_input_len": build["max_input_len"], "max_seq_len": build["max_seq_len"]}

    def _engine_settings(self, spec):
        # llm_args.py BaseLlmArgs.validate_speculative_config (TensorRT backend): what the engine is built with.
        build = self.kwargs.get("build_config") or llmapi.BuildConfig()
        if isinstance(spec, llmapi.Eagle3DecodingConfig):
            raise ValueError(llmapi.EAGLE3_ON_ENGINE)
        if isinstance(spec, llmapi.LookaheadDecodingConfig):
            draft = spec.calculate_speculative_resource()[2]
            assert draft > 0
            build.max_draft_len = max(build.max_draft_len, draft)
        elif isinstance(spec, llmapi.MedusaDecodingConfig):
            assert spec.max_draft_len > 0
            build.max_draft_len = spec.max_draft_len
            # models/medusa/config.py MedusaConfig.from_hugging_face: num_medusa_heads is taken from the
            # speculative config as it is (None when unset), and the heads are made with range() of it.
            list(range(spec.num_medusa_heads))
        elif isinstance(spec, llmapi.EagleDecodingConfig):
            assert spec.max_draft_len > 0
            build.max_draft_len = spec.max_draft_len
        else:
            raise ValueError(f"Unrecognized speculative config type {type(spec)}")
        self.kwargs["build_config"] = build

    def generate_async(self, prompt_ids, sampling_params, streaming=False):
        if self.backend == "tensorrt":
            # llmRequest.cpp LlmRequest::validate, as the engine's executor enqueues the request, and llmapi/llm.py
            # _check_arguments before it (the engine backend's; the PyTorch backend's limits are not mirrored here).
            if len(prompt_ids) > self.limits["max_input_len"]:
                raise RuntimeError(f"Prompt length ({len(prompt_ids)}) exceeds maximum input length "
                                   f"({self.limits['max_input_len']}). Set log level to info and check TRTGptModel logs "
                                   "for how maximum input length is set")
            max_seq_len = self.limits["max_seq_len"]
            if max_seq_len is not None and len(prompt_ids) + sampling_params.max_tokens > max_seq_len:
                raise ValueError(f"The sum of prompt length ({float(len(prompt_ids))}) and query length (0) max_tokens "
                                 f"({sampling_params.max_tokens}) should not exceed max_seq_len ({max_seq_len})")
        self._stats_done = False  # IterationResult.mark_undone: new prompts were submitted
        self.generations.append(GenerationResult(sampling_params, streaming, self))
        return self.generations[-1]

    def _iteration(self, diff):
        # An executor iteration, as its stats entry (JSON, as the executor queues it) counts it: every request
        # in flight, not the one that asked.
        if not self._stats_on:
            return
        self._iter += 1
        active = sum(not g.finished for g in self.generations)
        self._stats.put(json.dumps({"iter": self._iter, "numActiveRequests": active,
                                    "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": len(diff) - 1,
                                                          "numRequestsWithDraftTokens": 1}}))

    def get_stats(self, timeout):
        # result.py IterationResult.get_results: drain the executor's queue until a get() times out, so every
        # call that finds stats waits `timeout` at its end; once drained, [] until new prompts are submitted.
        results = []
        while not self._stats_done:
            try:
                results.append(json.loads(self._stats.get(timeout=timeout)))
            except queue.Empty:
                self._stats_done = True
        return results

    def save(self, engine_dir):
        Path(engine_dir).mkdir(parents=True)
        (Path(engine_dir) / "rank0.engine").write_bytes(b"engine")
        # builder.py EngineConfig: the engine's config.json holds the build_config it was built with.
        build = dataclasses.asdict(self.kwargs.get("build_config") or llmapi.BuildConfig())
        (Path(engine_dir) / "config.json").write_text(json.dumps({"build_config": build}))
        record = {k: (v.model_dump() if hasattr(v, "model_dump") else vars(v) if hasattr(v, "__dict__") else v)
                  for k, v in self.kwargs.items()}
        (Path(engine_dir) / "kwargs.json").write_text(json.dumps(record, default=str))

    def shutdown(self):
        GPU["free"] += self._memory
        self._memory = 0.0


def _draft_path_len(spec):
    """The longest draft path a step verifies (what the C++ request counts as drafted per iteration, at most)."""
    if spec is None:
        return 0
    if isinstance(spec, llmapi.LookaheadDecodingConfig):
        return spec.calculate_speculative_resource()[3]  # maxDraftPathLen = N - 1
    if isinstance(spec, llmapi.MedusaDecodingConfig) and spec.medusa_choices:
        return max(map(len, spec.medusa_choices))
    return spec.max_draft_len or 0


class LLM(BaseLLM):
    """tensorrt_llm.LLM: the PyTorch backend's (TorchLlmArgs)."""

    backend = "pytorch"


def _load_eagle3(spec):
    """_torch/models/modeling_speculative.py at 1.2.0rc2: Eagle3DraftModel makes `fc` (target_hidden_size x
    num_capture_layers -> hidden_size, only when more than one layer is captured), `midlayer` (one
    Eagle3DecoderLayer, or a list of them), `norm` and, with a smaller draft vocabulary, `d2t`; Eagle3ForCausalLM's
    load_weights prefixes "model." and renames nothing else, and modeling_utils' loader copies each parameter by
    name: a missing one is a KeyError, a wrong shape torch's size mismatch. Other tensors (t2d, layers.0.*) are
    never asked for. A hub id is not read here."""
    from safetensors import safe_open

    directory = Path(str(spec.speculative_model))
    if not (directory / "config.json").is_file():
        return
    config = json.loads((directory / "config.json").read_text())
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        shapes = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    h = config["hidden_size"]
    captured = spec.num_capture_layers
    layers = config.get("num_hidden_layers", 1)
    prefixes = ["midlayer."] if layers == 1 else [f"midlayer.{i}." for i in range(layers)]
    names = [p + n for p in prefixes for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight")] + ["norm.weight"]
    if captured > 1:
        names.append("fc.weight")
    if config.get("draft_vocab_size") is not None and config["draft_vocab_size"] != config["vocab_size"]:
        names.append("d2t")
    for name in names:
        if name not in shapes:
            raise KeyError(name)
    if captured > 1:
        width = (config.get("target_hidden_size") or h) * captured
        if shapes["fc.weight"] != [h, width]:
            raise RuntimeError(f"The size of tensor a ({width}) must match the size of tensor b "
                               f"({shapes['fc.weight'][-1]}) at non-singleton dimension 1 (model.fc.weight)")
