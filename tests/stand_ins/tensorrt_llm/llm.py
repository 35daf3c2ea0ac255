"""The LLM classes: upstream's argument checks (llm_args.py) and its result object (executor/result.py).

Generation replays a scripted stream of 1, 2, 1, 3 tokens per iteration, like a speculative engine.
"""

import asyncio
import json
import threading
from pathlib import Path
from types import SimpleNamespace

from . import llmapi

CREATED = []  # every LLM made, for the tests to inspect
SCRIPT = [[5], [6, 7], [8], [9, 10, 11]]
# Cleared by a test, the engine holds every response after the first until it is set again (no timing involved).
HOLD = threading.Event()
HOLD.set()
# BaseLlmArgs / TorchLlmArgs / TrtLlmArgs fields this project may pass; like upstream (extra="forbid") nothing else.
COMMON = {"model", "tokenizer", "tensor_parallel_size", "speculative_config"}
BACKEND_ONLY = {"pytorch": {"enable_iter_perf_stats", "disable_overlap_scheduler"}, "tensorrt": {"build_config"}}


class Tokenizer:
    def apply_chat_template(self, turns, add_generation_prompt, tokenize):
        return "<user>" + turns[-1]["content"] + "<assistant>"

    def encode(self, text, add_special_tokens):
        return [ord(c) % 50 for c in text]

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
    response) or, only when an event loop was running at its creation, asynchronously; abort(); decoding_iter."""

    def __init__(self, sampling_params, streaming):
        self.sampling_params, self._streaming = sampling_params, streaming
        self.decoding_iter = 0  # GenerationResultBase.decoding_iter: the engine's iterations so far
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
            finish = "cancelled" if self._aborted else "length"
            self.outputs[0] = SimpleNamespace(token_ids=list(self._ids), token_ids_diff=[], finish_reason=finish)
            return
        self.decoding_iter += 1
        self._ids += diff
        last = len(self._ids) >= self.sampling_params.max_tokens or self.decoding_iter == len(SCRIPT)
        self._done = last
        self.outputs[0] = SimpleNamespace(token_ids=list(self._ids), token_ids_diff=list(diff),
                                          finish_reason="length" if last else None)

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
        CREATED.append(self)

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
        self.generations.append(GenerationResult(sampling_params, streaming))
        return self.generations[-1]

    def get_stats(self, timeout):
        return [json.dumps({"iter": 1, "specDecodingStats": {"numDraftTokens": 4, "numAcceptedTokens": 1,
                                                             "numRequestsWithDraftTokens": 1, "acceptanceLength": 2.0}})]

    def save(self, engine_dir):
        Path(engine_dir).mkdir(parents=True)
        (Path(engine_dir) / "rank0.engine").write_bytes(b"engine")
        record = {k: (v.model_dump() if hasattr(v, "model_dump") else vars(v) if hasattr(v, "__dict__") else v)
                  for k, v in self.kwargs.items()}
        (Path(engine_dir) / "kwargs.json").write_text(json.dumps(record, default=str))

    def shutdown(self):
        pass


class LLM(BaseLLM):
    """tensorrt_llm.LLM: the PyTorch backend's (TorchLlmArgs)."""

    backend = "pytorch"
