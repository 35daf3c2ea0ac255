"""The TensorRT-LLM backend's defects of issue 61 (the parts in the backend and its build plan), each against the stand-in
package (tests/stand_ins/tensorrt_llm: TensorRT-LLM 1.2's rules, no GPU), and the stand-in's own contract: what it
refuses is what upstream refuses. Nothing here runs TensorRT-LLM."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
import transformers

from app import models
from app.modes import MODES, ConfigError
from app.service.api import Service
from app.backends.tensorrt_llm import backend as trt
from app.backends.base import Prompt
from app.backends.registry import EngineStore, spec_for
from app.backends.tensorrt_llm.builds import trtllm_plan, trtllm_serve_kwargs
from app.ui import render
from helpers import collect, tiny_llama, trtllm_stand_in

DRAFT = f"{models.BUNDLED}-draft"
PREPARED = models.DEFAULT_ENGINES / "models"
NGRAM = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}, "max_new_tokens": 7}
LOOKAHEAD = {"speculative_config": {"decoding_type": "Lookahead", "max_window_size": 2, "max_ngram_size": 2,
                                    "max_verification_set_size": 1}, "max_new_tokens": 7}


@pytest.fixture
def fake_trtllm(monkeypatch):
    """The stand-in `tensorrt_llm` and a 'visible' GPU; a test that stops half-way leaves no build or step held."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with trtllm_stand_in():
        yield
        stand_in = sys.modules.get("tensorrt_llm.llm")
        if stand_in is not None:
            stand_in.HOLD.set()
            stand_in.BUILD.set()


@pytest.fixture
def target(tmp_path) -> Path:
    """A model directory (config.json and weights): what TensorRT-LLM is given as `model`."""
    path = tmp_path / "target"
    tiny_llama(vocab=96, hidden=32, layers=1).save_pretrained(path)
    return path


def within(seconds: float, call):
    """call()'s result or the exception it raised, which must come within `seconds` (else the test fails: it blocked)."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except Exception as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"not answered within {seconds} s: it waited for the build"
    return out.get("error", out.get("value"))


def shared_models(engines: Path) -> Path:
    """An engines store whose registry models are the checkout's prepared ones (skip where they are not prepared)."""
    if not (PREPARED / models.BUNDLED / "config.json").is_file() or not (PREPARED / DRAFT / "config.json").is_file():
        pytest.skip("the bundled model and its draft are not prepared in engines/models")
    engines.mkdir()
    (engines / "models").symlink_to(PREPARED)
    return engines


# ----------------------------------------------------------------------------- the app's own models, by path


def test_draft_target_with_the_bundled_draft_reaches_the_engine_as_a_path(fake_trtllm, tmp_path):
    """The registry alias of the shipped draft is a directory of this app's: upstream takes any string that is not an
    existing directory for a hub id and downloads it (llm_args.py _ModelWrapper), so the alias must not reach it."""
    engines = shared_models(tmp_path / "engines")
    s = Service(engines=engines, backend="tensorrt_llm")
    data = {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 4, "speculative_model": DRAFT},
            "max_new_tokens": 7}
    start, steps, end = collect(s.stream(data, "hi", model=models.BUNDLED))
    from tensorrt_llm.llm import CREATED, DOWNLOADS

    llm = CREATED[-1]
    draft = Path(llm.kwargs["speculative_config"].speculative_model)
    assert draft.is_absolute() and draft == (engines / "models" / DRAFT).absolute() and (draft / "config.json").is_file()
    assert Path(llm.kwargs["model"]) == (engines / "models" / models.BUNDLED).absolute()
    assert DOWNLOADS == [], "nothing of the app's own is taken for a hub id"
    assert end["error"] is None and end["token_ids"] == [5, 6, 7, 8, 9, 10, 11]
    s.close()


def test_the_bundled_model_is_prepared_before_the_engine_starts(fake_trtllm, tmp_path, monkeypatch):
    """A mode the PyTorch backend runs without a build (prompt lookup) on the bundled model, in a store where it is not
    prepared yet: the service prepares it first, so the engine gets a model directory, not a name it would download."""
    if not (PREPARED / models.BUNDLED / "config.json").is_file():
        pytest.skip("the bundled model is not prepared in engines/models")
    prepared = []

    def dequantize(name, out):  # the real one takes a while: the prepared files stand in for its output
        prepared.append(name)
        out.mkdir(parents=True, exist_ok=True)
        for f in (PREPARED / name).iterdir():
            (out / f.name).symlink_to(f)

    monkeypatch.setattr(models, "_dequantize", dequantize)
    engines = tmp_path / "engines"
    (engines / "models").mkdir(parents=True)
    s = Service(engines=engines, backend="tensorrt_llm")
    start, steps, end = collect(s.stream(NGRAM, "hi", model=models.BUNDLED))
    from tensorrt_llm.llm import CREATED, DOWNLOADS

    model = Path(CREATED[-1].kwargs["model"])
    assert prepared == [models.BUNDLED] and model == (engines / "models" / models.BUNDLED).absolute()
    assert (model / "config.json").is_file() and DOWNLOADS == [] and end["error"] is None
    s.close()


# ----------------------------------------------------------------------------- the build, off the lock, with the app's limits


def test_a_lookahead_build_does_not_block_a_second_submit(fake_trtllm, tmp_path, target):
    """The first lookahead request builds its TensorRT engine (the stand-in's build waits on an event: minutes, on a
    GPU). Meanwhile a submit is answered at once: another configuration is refused with the reason, the same one is
    queued and then runs on the engine that build made."""
    from tensorrt_llm import llm as stand_in

    s = Service(engines=tmp_path / "engines", backend="tensorrt_llm")
    stand_in.BUILD.clear()
    first: dict = {}
    submitting = threading.Thread(target=lambda: first.update(job=s.submit(LOOKAHEAD, "hi", model=str(target))), daemon=True)
    submitting.start()
    try:
        assert stand_in.BUILDING.wait(60), "the build did not start"
        refused = within(1.0, lambda: s.submit(NGRAM, "hi", model=str(target)))
        assert isinstance(refused, ConfigError), refused
        assert f"building or loading the engine for lookahead on {target}" in str(refused)
        second = within(1.0, lambda: s.submit(LOOKAHEAD, "hi", model=str(target)))
        assert not isinstance(second, Exception), second
        assert second.status in ("queued", "running")
    finally:
        stand_in.BUILD.set()
    submitting.join(60)
    ends = [collect(job.messages(timeout=60)) for job in (first["job"], second)]
    assert [end["finish_reason"] for _, _, end in ends] == ["length", "length"]
    assert ends[0][0]["pass"] == "TensorRT-LLM engine opened for this configuration" and ends[1][0]["pass"] == trt.REUSED
    assert len([llm for llm in stand_in.CREATED if llm.backend == "tensorrt"]) == 2, "one build, one engine loaded"
    s.close()


def test_a_2000_token_prompt_is_accepted_by_the_built_engines_limits(fake_trtllm, tmp_path, target):
    """The app takes 4096-token prompts; an engine built with BuildConfig's default max_input_len (1024) refuses a
    longer prompt (LlmRequest::validate). The plan builds it with the app's limits."""
    s = Service(engines=tmp_path / "engines", backend="tensorrt_llm")
    prompt = Prompt("a" * 1999, raw=True)  # the stand-in's tokenizer: a BOS and one token per character
    start, steps, end = collect(s.stream(LOOKAHEAD, prompt, model=str(target)))
    assert len(start["prompt_ids"]) == 2000 and end["error"] is None and end["finish_reason"] == "length"
    from tensorrt_llm.llm import CREATED

    engine = Path(CREATED[-1].kwargs["model"])
    built = json.loads((engine / "config.json").read_text())["build_config"]
    assert (built["max_input_len"], built["max_seq_len"]) == (4096, 4096 + 1024)
    plan = trtllm_plan(spec_for(MODES.parse({**LOOKAHEAD, "backend": "tensorrt_llm"}), str(target)), tmp_path)
    command = plan["trtllm_build"]["command"]
    assert command[command.index("--max_input_len") + 1] == "4096"
    s.close()


# ----------------------------------------------------------------------------- EAGLE on the PyTorch backend


@pytest.fixture
def eagle3(tmp_path) -> tuple[Path, Path]:
    """(a three-layer target, an EAGLE-3 module of this app's trained on its decoder layers 1 and 2)."""
    from app.heads import eagle

    target = tmp_path / "tiny3"
    tiny_llama(vocab=96, hidden=32, layers=3).save_pretrained(target)
    config = eagle.EagleConfig.from_target(transformers.AutoConfig.from_pretrained(target), draft_vocab_size=50,
                                           aux_layers=[2, 3], eagle3=True)
    eagle.save(eagle.EagleModule(config, None), tmp_path / "eagle3", base_model="tiny")
    return target, tmp_path / "eagle3"


def test_an_eagle3_module_is_sent_as_eagle3(fake_trtllm, tmp_path, eagle3, caplog):
    """TensorRT-LLM 1.2's PyTorch backend runs EAGLE-3 only and converts `Eagle` to Eagle3DecodingConfig with a warning
    (TorchLlmArgs.validate_speculative_config): the app sends `Eagle3`, and no warning is logged."""
    from tensorrt_llm import llmapi

    target, module = eagle3
    request = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "speculative_model": str(module),
                                                    "num_eagle_layers": 3}, "backend": "tensorrt_llm"})
    spec = spec_for(request, str(target))
    assert trtllm_plan(spec, tmp_path)["llm"]["speculative_config"]["decoding_type"] == "Eagle3"
    kwargs = trt.llm_objects(trtllm_serve_kwargs(EngineStore(tmp_path / "engines"), spec))
    with caplog.at_level("WARNING", logger="tensorrt_llm"):
        llm = trt.import_object(trt.LLM_CLASSES["pytorch"])(**kwargs)
    assert type(llm.kwargs["speculative_config"]) is llmapi.Eagle3DecodingConfig
    assert llmapi.EAGLE_ON_PYTORCH not in caplog.text
    llm.shutdown()


def test_eagle_on_pytorch_is_a_chain_of_the_trees_depth():
    """A static tree on the PyTorch backend logs that the draft token tree is "still under development, PLEASE DO NOT
    USE IT" (EagleDecodingConfig.validate_eagle_choices): the plan sends a chain of its depth and says so."""
    request = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "speculative_model": "org/eagle3",
                                                    "use_dynamic_tree": False, "eagle_choices": [[0], [0, 0], [1], [0, 0, 0]]},
                             "backend": "tensorrt_llm"})
    plan = trtllm_plan(spec_for(request, "m"))
    sc = plan["llm"]["speculative_config"]
    assert sc["decoding_type"] == "Eagle3" and sc["max_draft_len"] == 3 and "eagle_choices" not in sc
    assert any("static tree (4 nodes) is not sent" in n and "chain" in n for n in plan["notes"])
    engine = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "speculative_model": "org/eagle",
                                                   "num_eagle_layers": 4}, "backend": "tensorrt_llm", "trtllm_backend": "tensorrt"})
    assert trtllm_plan(spec_for(engine, "m"))["llm"]["speculative_config"]["decoding_type"] == "Eagle", \
        "the engine backend refuses Eagle3 (TrtLlmArgs.validate_speculative_config)"


# ----------------------------------------------------------------------------- what the engine says, step by step


def test_steps_sum_to_the_output_and_the_totals_come_from_the_perf_metrics(fake_trtllm, tmp_path, target):
    """Per step, the tokens the engine committed in that iteration; at the end, the drafted and accepted totals of the
    request's own perf metrics (CompletionOutput.request_perf_metrics, return_perf_metrics=True), shown in the status."""
    s = Service(engines=tmp_path / "engines", backend="tensorrt_llm")
    start, steps, end = collect(s.stream(NGRAM, "hi", model=str(target)))
    from tensorrt_llm.llm import CREATED

    generation = CREATED[-1].generations[-1]
    committed = [t for step in steps for t in step["tokens"]]
    assert committed == end["token_ids"] == generation.outputs[0].token_ids
    assert [step["totals"]["new_tokens"] for step in steps] == [1, 3, 4, 7]
    perf = generation.outputs[0].request_perf_metrics.speculative_decoding
    # 3 generation iterations of a 4-token draft; 1 + 0 + 2 of them accepted (the stand-in's script)
    assert (perf.total_draft_tokens, perf.total_accepted_draft_tokens) == (12, 3)
    totals = end["totals"]
    assert (totals["drafted"], totals["accepted"], totals["accepted_from"]) == (12, 3, "request_perf_metrics")
    assert totals["perf_metrics"]["acceptance_rate"] == pytest.approx(0.25)
    assert "accepted 3/12 drafted (25%)" in render.totals_line(end)
    s.close()


def test_perf_metrics_that_counted_no_draft_leave_the_streams_count():
    """1.2.1's PyTorch backend with its default sampler returns zero speculative counters while it drafts: the stream's
    count of accepted tokens stands, and the totals say where it came from."""
    from types import SimpleNamespace

    zero = SimpleNamespace(speculative_decoding=SimpleNamespace(total_draft_tokens=0, total_accepted_draft_tokens=0,
                                                                acceptance_rate=0.0))
    totals = trt.with_perf_metrics({"accepted": 3, "drafted": None}, zero)
    assert totals["accepted"] == 3 and totals["drafted"] is None and totals["accepted_from"].startswith("token stream")
    assert trt.with_perf_metrics({"accepted": 3}, None)["perf_metrics"] is None


# ----------------------------------------------------------------------------- the stand-in refuses what upstream refuses


def test_the_stand_in_refuses_what_upstream_refuses(fake_trtllm, tmp_path, target):
    from tensorrt_llm import LLM, SamplingParams, llmapi
    from tensorrt_llm._tensorrt_engine import LLM as EngineLLM
    from tensorrt_llm.llm import DOWNLOADS

    # A model is an existing directory, else a hub id to download: a missing path or a placeholder is neither.
    for bad in (str(tmp_path / "missing" / "model"), "{build_dir}/engine"):
        with pytest.raises(ValueError, match="Repo id must"):
            LLM(model=bad)
    with pytest.raises(ValueError, match="Repo id must"):
        LLM(model=str(target), speculative_config=llmapi.DraftTargetDecodingConfig(
            max_draft_len=2, speculative_model=str(tmp_path / "no-draft")))
    LLM(model="org/model").shutdown()
    assert DOWNLOADS == ["org/model"], "a hub id is what upstream downloads"
    # An engine built without max_input_len takes BuildConfig's 1024 and refuses a longer prompt.
    engine = EngineLLM(model=str(target), build_config=llmapi.BuildConfig(max_seq_len=4096))
    with pytest.raises(RuntimeError, match=r"Prompt length \(1025\) exceeds maximum input length \(1024\)"):
        engine.generate_async(list(range(1025)), SamplingParams(max_tokens=8))
    engine.generate_async(list(range(1024)), SamplingParams(max_tokens=8))
    engine.shutdown()
    # `Eagle` on the PyTorch backend: taken for Eagle3 with upstream's warning; `Eagle3` on the engine backend: refused.
    with pytest.raises(ValueError, match="only supported on the PyTorch backend"):
        EngineLLM(model=str(target), speculative_config=llmapi.Eagle3DecodingConfig(max_draft_len=2, speculative_model="org/e3"))


def test_the_stand_in_warns_as_upstream_when_eagle_is_sent_to_pytorch(fake_trtllm, caplog):
    from tensorrt_llm import LLM, llmapi

    with caplog.at_level("WARNING", logger="tensorrt_llm"):
        llm = LLM(model="org/model", speculative_config=llmapi.EagleDecodingConfig(max_draft_len=2, speculative_model="org/e3"))
    assert llmapi.EAGLE_ON_PYTORCH in caplog.text and "'Eagle' is treated as 'Eagle3'" in caplog.text
    assert type(llm.kwargs["speculative_config"]) is llmapi.Eagle3DecodingConfig
    llm.shutdown()


def test_the_stand_in_does_not_import_beside_numpy_2(monkeypatch):
    """Upstream pins numpy<2: in this app's environment (numpy 2) it does not run, and the stand-in does not import
    either unless a test opts out (helpers.trtllm_stand_in does, knowingly). probe() then says it cannot load here."""
    import numpy

    if int(numpy.__version__.split(".")[0]) < 2:
        pytest.skip("numpy < 2 here")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRTLLM_STAND_IN_IGNORE_PINS", raising=False)
    with trtllm_stand_in(pins=True):
        assert "TRTLLM_STAND_IN_IGNORE_PINS" not in os.environ
        with pytest.raises(ImportError, match=r"requires numpy<2 .* numpy 2\."):
            import tensorrt_llm  # noqa: F401
        state = trt.probe()
        assert not state.available and "cannot load here: TensorRT-LLM 1.2 requires numpy<2" in state.reason
        assert "pip install" not in state.reason
