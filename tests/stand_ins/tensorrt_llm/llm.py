"""The LLM classes: upstream's argument checks (llm_args.py), its result object (executor/result.py), its
iteration statistics (executor/executor.py, executor/result.py IterationResult), its EAGLE-3 weight loading
(_torch/models/modeling_speculative.py at 1.2.0rc2) and the GPU memory an engine holds (llm_args.py KvCacheConfig).

Generation replays a scripted stream of 1, 2, 1, 3 tokens per iteration, like a speculative engine; running out
of script stands for the model's end id.
"""

import asyncio
import json
import queue
import threading
from pathlib import Path
from types import SimpleNamespace

from . import llmapi

CREATED = []  # every LLM made, for the tests to inspect
SCRIPT = [[5], [6, 7], [8], [9, 10, 11]]
BOS = 1
# Cleared by a test, the engine holds every response after the first until it is set again (no timing involved).
HOLD = threading.Event()
HOLD.set()
# BaseLlmArgs / TorchLlmArgs / TrtLlmArgs fields this project may pass; like upstream (extra="forbid") nothing else.
COMMON = {"model", "tokenizer", "tensor_parallel_size", "speculative_config"}
BACKEND_ONLY = {"pytorch": {"enable_iter_perf_stats", "disable_overlap_scheduler"}, "tensorrt": {"build_config"}}
# One GPU, in fractions of its memory. An engine loads its weights, then takes KvCacheConfig.free_gpu_memory_fraction
# (default 0.9) of what is still free for its KV cache, and gives both back on shutdown().
GPU = {"free": 1.0}
WEIGHTS = 0.1
FREE_GPU_MEMORY_FRACTION = 0.9


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
            self.outputs[0] = SimpleNamespace(token_ids=list(self._ids), token_ids_diff=[], finish_reason=finish)
            return
        self.decoding_iter += 1
        self._ids += diff
        self.avg_decoded_tokens_per_iter = len(self._ids) / self.decoding_iter
        self._llm._iteration(diff)
        # _handle_sequence: FinishReason.LENGTH -> 'length'; END_ID and STOP_WORDS -> 'stop' alike.
        length = len(self._ids) >= self.sampling_params.max_tokens
        self._done = length or self.decoding_iter == len(SCRIPT)
        finish = ("length" if length else "stop") if self._done else None
        self.outputs[0] = SimpleNamespace(token_ids=list(self._ids), token_ids_diff=list(diff), finish_reason=finish)

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
        spec = kwargs.get("speculative_config")
        if spec is not None:
            if not isinstance(spec, llmapi.DecodingBaseConfig):
                raise TypeError("speculative_config must be a tensorrt_llm.llmapi decoding config")
            # llm_args.py validate_speculative_config: the support matrix.
            if not spec.supports_backend(self.backend):
                raise ValueError(f"Speculation type {spec.decoding_type} does not support backend {self.backend}")
            if self.backend == "tensorrt":
                self._engine_settings(spec)
            elif isinstance(spec, llmapi.EagleDecodingConfig):
                _load_eagle3(spec)
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

    def _engine_settings(self, spec):
        # llm_args.py BaseLlmArgs.validate_speculative_config (TensorRT backend): what the engine is built with.
        build = self.kwargs.get("build_config") or llmapi.BuildConfig()
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
        record = {k: (v.model_dump() if hasattr(v, "model_dump") else vars(v) if hasattr(v, "__dict__") else v)
                  for k, v in self.kwargs.items()}
        (Path(engine_dir) / "kwargs.json").write_text(json.dumps(record, default=str))

    def shutdown(self):
        GPU["free"] += self._memory
        self._memory = 0.0


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
