"""The build store: content-addressed ids, reuse, one build at a time across threads and processes,
crash safety, failures, removal; the transformers builder on a tiny model; the TensorRT-LLM plan
(checked against TensorRT-LLM's own formulas and field meanings) and its builder, which fails clearly here and runs end to end against a
stand-in `tensorrt_llm` package; a real bundled-model build and a real GPU build when available."""

import functools
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import transformers

from app import models
from app.heads import medusa
from app.modes import MODES, configs
from app.backends.tensorrt_llm import backend as trt
from app.backends.registry import EngineStore, spec_for
from app.backends.store import ENGINE_KINDS, BuildSpec, tree_sha256
from app.backends.tensorrt_llm.builds import trtllm_serve_kwargs
from app.service.errors import BuildError, EngineError
from helpers import earlier_design, tiny_llama, trtllm_stand_in

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
SPEC = BuildSpec("tiny", "autoregressive", versions={"test": "1"})
FIELDS = {"id", "spec", "kind", "status", "created", "duration_s", "source", "files"}


def request(speculative=None, **top):
    data = {"speculative_config": speculative or {"decoding_type": "Autoregressive"}, **top}
    return MODES.parse(data)


def la(w, n, g, **top):
    return request({"decoding_type": "Lookahead", "max_window_size": w, "max_ngram_size": n, "max_verification_set_size": g}, **top)


def slow_builder(counter: Path, out: Path, progress) -> dict:
    """Counts its calls in a file shared by threads and processes, and takes its time."""
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    progress(0.1, "working")
    (out / "engine.bin").write_bytes(b"\1" * 100)
    (out / "sub").mkdir()
    (out / "sub" / "part.txt").write_text("hello")
    time.sleep(0.5)
    return {"kind": "test", "source": {"made_by": "slow_builder"}}


def calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def _build_in_child(root: str, counter: str, result: str) -> None:
    manifest = EngineStore(Path(root)).build(SPEC, builder=functools.partial(slow_builder, Path(counter)))
    Path(result).write_text(json.dumps(manifest))


def _die_half_way(root: str, how: str) -> None:
    def builder(out, progress):
        (out / "half.bin").write_bytes(b"\0" * 1000)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)

    EngineStore(Path(root)).build(SPEC, builder=builder)


# ----------------------------------------------------------------------------- ids


def test_same_spec_same_id_and_the_store_agrees(tmp_path):
    a, b = spec_for(la(4, 3, 4), "m"), spec_for(la(4, 3, 4), "m")
    assert a == b and a.key() == b.key() and re.fullmatch("[0-9a-f]{16}", a.key())
    assert EngineStore(tmp_path).spec_id(a) == a.key()
    versions = a.to_dict()["versions"]
    assert set(versions) == {"transformers", "torch"} and versions["transformers"] == transformers.__version__


def test_sampling_and_budget_never_change_the_id():
    for backend in ("transformers", "tensorrt_llm"):
        base = spec_for(la(4, 3, 4, backend=backend), "m").key()
        assert spec_for(la(4, 3, 4, backend=backend, max_new_tokens=7), "m").key() == base
        assert spec_for(la(4, 3, 4, backend=backend, sampling={"temperature": 0.8, "top_p": 0.9, "seed": 3}), "m").key() == base
    medusa_base = spec_for(request({"decoding_type": "Medusa"}, backend="tensorrt_llm"), models.BUNDLED).key()
    typical = request({"decoding_type": "Medusa", "typical_acceptance": True, "posterior_threshold": 0.2}, backend="tensorrt_llm")
    assert spec_for(typical, models.BUNDLED).key() == medusa_base


def test_build_relevant_config_changes_the_id():
    trt = lambda w, n, g, **kw: spec_for(la(w, n, g, backend="tensorrt_llm", **kw), "m").key()  # noqa: E731
    assert len({trt(4, 3, 4), trt(5, 3, 4), trt(4, 4, 4), trt(4, 3, 3)}) == 4
    # The per-request (w, n, g) and the prompt pool are runtime settings; None = the mode's own engine backend.
    assert trt(4, 3, 4) == trt(4, 3, 4, trtllm_backend="tensorrt")
    lookahead = {"decoding_type": "Lookahead", "request": [2, 2, 1], "pool_from_prompt": False}
    assert spec_for(request(lookahead, backend="tensorrt_llm"), "m").key() == trt(4, 3, 4)
    # Medusa trees are baked into a TensorRT engine, but only steer a run on transformers.
    for backend, differs in (("tensorrt_llm", True), ("transformers", False)):
        ids = {spec_for(request({"decoding_type": "Medusa", "medusa_choices": t}, backend=backend), models.BUNDLED).key()
               for t in ("default", "small")}
        assert (len(ids) == 2) is differs
    # transformers builds hold the model (and artifact), so (W, N, G) does not change them, the mode does.
    assert spec_for(la(4, 3, 4), "m") == spec_for(la(7, 7, 7), "m")
    assert spec_for(la(4, 3, 4), "m").key() != spec_for(request(), "m").key()
    # model, backend, build settings, versions
    assert spec_for(la(4, 3, 4), "m").key() != spec_for(la(4, 3, 4), "other").key()
    assert spec_for(la(4, 3, 4), "m").key() != trt(4, 3, 4)
    assert trt(4, 3, 4) != spec_for(la(4, 3, 4, backend="tensorrt_llm"), "m", build_config={"max_batch_size": 4}).key()
    assert trt(4, 3, 4) != spec_for(la(4, 3, 4, backend="tensorrt_llm"), "m", tensor_parallel_size=2).key()
    assert BuildSpec("m", "lookahead", versions={"torch": "1"}).key() != BuildSpec("m", "lookahead", versions={"torch": "2"}).key()


def make_heads(directory: Path, seed: int = 0, hidden: int = 32, vocab: int = 96) -> Path:
    torch.manual_seed(seed)
    heads = medusa.MedusaHeads(medusa.MedusaConfig(hidden, vocab, medusa_num_heads=2))
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return medusa.save(heads, directory, base_model="tiny")


def test_a_changed_artifact_gives_a_new_id(tmp_path):
    heads = make_heads(tmp_path / "heads")
    req = request({"decoding_type": "Medusa", "speculative_model": str(heads)})
    first = spec_for(req, "m")
    assert first.config["speculative_model_sha256"] == tree_sha256(heads) and first.config["speculative_model"] == str(heads.resolve())
    assert spec_for(req, "m").key() == first.key()
    make_heads(tmp_path / "heads", seed=1)
    assert spec_for(req, "m").key() != first.key()
    # the shipped default is pinned by content too
    shipped = spec_for(request({"decoding_type": "Eagle"}), models.BUNDLED).config
    assert shipped["speculative_model"] is None
    assert shipped["speculative_model_sha256"] == tree_sha256(models.default_artifact(models.BUNDLED, "eagle"))


def test_specs_that_cannot_be_built_are_clear_errors(tmp_path):
    with pytest.raises(EngineError, match="nothing to build"):
        spec_for(request(backend="remote"), "m")
    with pytest.raises(EngineError, match="no medusa artifact for model 'm'.*python -m app train --mode medusa"):
        spec_for(request({"decoding_type": "Medusa"}), "m")
    with pytest.raises(EngineError, match="not a directory"):
        spec_for(request({"decoding_type": "Eagle", "speculative_model": str(tmp_path / "nope")}), "m")
    with pytest.raises(EngineError, match="build settings are max_batch_size"):
        spec_for(la(4, 3, 4, backend="tensorrt_llm"), "m", build_config={"max_beams": 2})
    with pytest.raises(EngineError, match="draft_target needs a draft model"):
        spec_for(request({"decoding_type": "Draft_Target"}), "m")


# ----------------------------------------------------------------------------- the store


def test_build_once_then_reuse_with_a_complete_manifest(tmp_path):
    store, counter = EngineStore(tmp_path), tmp_path / "calls"
    seen = []
    first = store.build(SPEC, builder=functools.partial(slow_builder, counter), progress=lambda f, m: seen.append((f, m)))
    again = store.build(SPEC, builder=functools.partial(slow_builder, counter), progress=lambda f, m: seen.append((f, m)))
    assert calls(counter) == 1 and again == first
    assert ("working" in [m for _, m in seen]) and seen[-1][0] == 1.0 and "reusing" in seen[-1][1]
    assert FIELDS <= set(first) and "error" not in first
    assert first["id"] == SPEC.key() and first["spec"] == SPEC.to_dict() and first["kind"] == "test"
    assert first["status"] == "ready" and first["duration_s"] >= 0.5 and first["source"] == {"made_by": "slow_builder"}
    assert first["files"] == {"engine.bin": 100, "sub/part.txt": 5}
    assert first["created"].endswith("+00:00")  # ISO, UTC
    on_disk = json.loads((tmp_path / "builds" / SPEC.key() / "manifest.json").read_text())
    assert on_disk == first == store.get(SPEC.key())
    assert store.list() == [first]
    assert not list((tmp_path / "builds").glob(".tmp-*"))


def test_list_is_newest_first(tmp_path):
    store = EngineStore(tmp_path)
    made = []
    for i in range(3):
        made.append(store.build(BuildSpec("m", "autoregressive", versions={"i": i}), builder=lambda out, p: {"kind": "t"}))
        time.sleep(0.01)
    assert [m["id"] for m in store.list()] == [m["id"] for m in reversed(made)]


def test_two_threads_build_once_and_share_the_result(tmp_path):
    store, counter = EngineStore(tmp_path), tmp_path / "calls"
    results, errors = [None, None], []

    def run(i):
        try:
            results[i] = store.build(SPEC, builder=functools.partial(slow_builder, counter))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and calls(counter) == 1
    assert results[0] == results[1] and results[0]["status"] == "ready"


def test_two_processes_build_once_and_share_the_result(tmp_path):
    ctx = multiprocessing.get_context("fork")
    counter = tmp_path / "calls"
    outs = [tmp_path / f"result-{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path), str(counter), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert calls(counter) == 1
    a, b = (json.loads(o.read_text()) for o in outs)
    assert a == b == EngineStore(tmp_path).get(SPEC.key())


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_a_build_killed_half_way_leaves_nothing_usable(tmp_path, how):
    store = EngineStore(tmp_path)
    proc = multiprocessing.get_context("fork").Process(target=_die_half_way, args=(str(tmp_path), how))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == (-signal.SIGKILL if how == "sigkill" else 3)
    builds = tmp_path / "builds"
    assert not (builds / SPEC.key()).exists()
    leftovers = list(builds.glob(f".tmp-{SPEC.key()}-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "half.bin").exists()
    assert store.list() == [] and store.get(SPEC.key()) is None
    manifest = store.build(SPEC, builder=lambda out, p: {"kind": "t"})
    assert manifest["status"] == "ready" and store.list() == [manifest]
    assert not list(builds.glob(".tmp-*")), "the stale temporary directory is cleaned up"


def test_a_builder_exception_is_a_build_error_and_nothing_is_listed(tmp_path):
    store = EngineStore(tmp_path)

    def broken(out, progress):
        (out / "partial").write_text("x")
        raise RuntimeError("the compiler fell over")

    with pytest.raises(BuildError, match=r"building autoregressive for tiny \(transformers\) failed: RuntimeError: the compiler fell over"):
        store.build(SPEC, builder=broken)
    assert store.list() == [] and not (tmp_path / "builds" / SPEC.key()).exists()
    failed = store.get(SPEC.key())
    assert failed["status"] == "failed" and "compiler fell over" in failed["error"] and failed["files"] == {"partial": 1}
    assert FIELDS <= set(failed)
    with pytest.raises(BuildError, match="not a dict with a 'kind'"):
        store.build(SPEC, builder=lambda out, p: None)
    ok = store.build(SPEC, builder=lambda out, p: {"kind": "t"})
    assert ok["status"] == "ready" and store.get(SPEC.key()) == ok
    assert not list((tmp_path / "builds").glob(".failed-*")) and not list((tmp_path / "builds").glob(".tmp-*"))


def test_remove(tmp_path):
    store = EngineStore(tmp_path)
    built = store.build(SPEC, builder=lambda out, p: {"kind": "t"})
    other = store.build(BuildSpec("m", "autoregressive", versions={}), builder=lambda out, p: {"kind": "t"})
    store.remove(built["id"])
    assert store.get(built["id"]) is None and store.list() == [other]
    assert not (tmp_path / "builds" / built["id"]).exists() and not list((tmp_path / "builds").glob(".tmp-*"))
    with pytest.raises(EngineError, match=f"no build '{built['id']}'.*{other['id']}"):
        store.remove(built["id"])
    with pytest.raises(EngineError, match="not a build id"):
        store.remove("../../etc")
    with pytest.raises(EngineError, match="not a build id"):
        store.get("ABC")
    # a failed attempt can be removed too
    with pytest.raises(BuildError):
        store.build(SPEC, builder=lambda out, p: 1 / 0)
    store.remove(SPEC.key())
    assert store.get(SPEC.key()) is None


def test_every_kind_is_documented():
    assert {"transformers-model", "transformers-heads", "transformers-draft", "tensorrt-engine", "tensorrt-pytorch",
            "tensorrt-worker", "trained-medusa", "trained-eagle", "vllm-server"} == set(ENGINE_KINDS)


# ----------------------------------------------------------------------------- transformers builder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    tiny_llama(vocab=96, hidden=32, layers=1).save_pretrained(path)
    return path


def test_transformers_medusa_build_copies_verified_heads(tmp_path, tiny_dir):
    store = EngineStore(tmp_path / "engines")
    heads = make_heads(tmp_path / "heads")
    req = request({"decoding_type": "Medusa", "speculative_model": str(heads)})
    seen = []
    manifest = store.build(spec_for(req, str(tiny_dir)), progress=lambda f, m: seen.append(f))
    assert manifest["kind"] == "transformers-heads" and manifest["status"] == "ready"
    assert {"medusa/config.json", "medusa/model.safetensors"} <= set(manifest["files"])
    src = manifest["source"]
    assert src["model_path"] == str(tiny_dir) and src["model_bytes"] == sum(f.stat().st_size for f in tiny_dir.iterdir())
    assert src["speculative_model"] == str(heads.resolve()) and src["speculative_model_sha256"] == tree_sha256(heads)
    assert seen == sorted(seen) and seen[0] == 0.0 and seen[-1] == 1.0 and len(seen) >= 3
    copied = medusa.load(tmp_path / "engines" / "builds" / manifest["id"] / "medusa")
    original = medusa.load(heads)
    assert all(torch.equal(a, b) for a, b in zip(copied.state_dict().values(), original.state_dict().values()))
    # retrained heads: a second build next to the first
    make_heads(tmp_path / "heads", seed=5)
    second = store.build(spec_for(req, str(tiny_dir)))
    assert second["id"] != manifest["id"] and len(store.list()) == 2


def test_transformers_builds_reject_heads_of_another_model_and_record_drafts(tmp_path, tiny_dir):
    store = EngineStore(tmp_path / "engines")
    wrong = make_heads(tmp_path / "wrong", hidden=16)
    with pytest.raises(BuildError, match="hidden_size 16 but the model has 32"):
        store.build(spec_for(request({"decoding_type": "Medusa", "speculative_model": str(wrong)}), str(tiny_dir)))
    assert store.list() == []
    draft = store.build(spec_for(request({"decoding_type": "Draft_Target", "speculative_model": str(tiny_dir)}), str(tiny_dir)))
    assert draft["kind"] == "transformers-draft" and draft["source"]["speculative_model_path"] == str(tiny_dir)
    plain = store.build(spec_for(la(4, 3, 4), str(tiny_dir)))
    assert plain["kind"] == "transformers-model" and plain["files"] == {}


# ----------------------------------------------------------------------------- TensorRT-LLM plans


def trt_plan(req, model=models.BUNDLED, **kw):
    return EngineStore(Path("/nonexistent-engines")).plan(spec_for(req, model, **kw))


def mode_and_len(plan):
    build = plan["llm"]["build_config"]
    cmd = plan["trtllm_build"]["command"]
    flag = cmd[cmd.index("--speculative_decoding_mode") + 1] if "--speculative_decoding_mode" in cmd else None
    if flag is not None:
        assert flag == build["speculative_decoding_mode"].lower(), "trtllm-build and BuildConfig agree"
        assert cmd[cmd.index("--max_draft_len") + 1] == str(build["max_draft_len"])
    return build["speculative_decoding_mode"], build["max_draft_len"]


# decodingConfig.cpp calculateSpeculativeResourceTuple: max_draft_len = (0 if N==1 else N-2) + (W-1+G)(N-1).
@pytest.mark.parametrize("wng, expected", [((7, 7, 7), 83), ((4, 4, 4), 23), ((4, 3, 4), 15), ((2, 2, 1), 2)])
def test_lookahead_plan_matches_trtllm_md(wng, expected):
    plan = trt_plan(la(*wng, backend="tensorrt_llm"))
    assert plan["llm_class"] == "tensorrt_llm._tensorrt_engine.LLM" and plan["trtllm_backend"] == "tensorrt"
    assert mode_and_len(plan) == ("LOOKAHEAD_DECODING", expected)
    w, n, g = wng
    assert plan["llm"]["speculative_config"] == {"decoding_type": "Lookahead", "max_window_size": w, "max_ngram_size": n,
                                                 "max_verification_set_size": g}
    assert plan["llm"]["model"] == "/nonexistent-engines/models/" + models.BUNDLED and plan["llm"]["tensor_parallel_size"] == 1
    assert plan["save"] == "{build_dir}/engine" and plan["prepare"] == []
    cmd = plan["trtllm_build"]["command"]
    assert cmd[:2] == ["trtllm-build", "--checkpoint_dir"] and cmd[cmd.index("--max_beam_width") + 1] == "1"
    build = plan["llm"]["build_config"]
    assert {"max_batch_size", "max_num_tokens", "max_seq_len"} <= set(build)
    assert cmd[cmd.index("--max_seq_len") + 1] == str(build["max_seq_len"])


def test_medusa_plan_exports_the_shipped_heads_and_sizes_by_the_tree():
    default_tree = json.loads((Path(configs.__file__).parents[2] / "assets" / "medusa_choices" / "default.json").read_text())
    plan = trt_plan(request({"decoding_type": "Medusa"}, backend="tensorrt_llm"))
    assert mode_and_len(plan) == ("MEDUSA", len(default_tree))
    spec = plan["llm"]["speculative_config"]
    assert spec["decoding_type"] == "Medusa" and sorted(spec["medusa_choices"]) == sorted(default_tree)
    assert spec["max_draft_len"] == len(default_tree) and spec["speculative_model"] == "{build_dir}/medusa"
    assert plan["prepare"] == [{"step": "export_medusa", "from": str(models.default_artifact(models.BUNDLED, "medusa")),
                                "to": "{build_dir}/medusa"}]
    small = trt_plan(request({"decoding_type": "Medusa", "medusa_choices": [[0], [0, 0], [1]]}, backend="tensorrt_llm"))
    assert mode_and_len(small) == ("MEDUSA", 3)


def test_medusa_plan_takes_heads_already_in_medusa_layout(tmp_path):
    heads = medusa.load(make_heads(tmp_path / "ours"))
    exported = medusa.export_trtllm(heads, torch.zeros(96, 32), tmp_path / "theirs", "tiny")
    plan = trt_plan(request({"decoding_type": "Medusa", "speculative_model": str(exported)}, backend="tensorrt_llm"))
    assert plan["prepare"] == [] and plan["llm"]["speculative_config"]["speculative_model"] == str(exported.resolve())


def test_eagle_and_pytorch_backend_plans():
    eagle = trt_plan(request({"decoding_type": "Eagle", "speculative_model": "org/eagle"}, backend="tensorrt_llm", trtllm_backend="tensorrt"))
    # llm_args.py BaseLlmArgs.validate_speculative_config: build_config.max_draft_len = the speculative config's
    # max_draft_len, which for EAGLE is the depth sent (5), not this app's 23 tree nodes.
    assert mode_and_len(eagle) == ("EAGLE", 5) and eagle["llm"]["speculative_config"]["speculative_model"] == "org/eagle"
    assert eagle["llm"]["speculative_config"]["max_draft_len"] == eagle["llm"]["build_config"]["max_draft_len"]
    ngram = trt_plan(request({"decoding_type": "NGram", "max_draft_len": 7}, backend="tensorrt_llm"))
    assert ngram["llm_class"] == "tensorrt_llm.LLM" and ngram["trtllm_backend"] == "pytorch"
    assert "build_config" not in ngram["llm"] and ngram["save"] is None and ngram["trtllm_build"] is None
    assert ngram["llm"]["speculative_config"]["max_draft_len"] == 7 and "PyTorch backend builds no engine" in ngram["note"]
    ar = trt_plan(request(backend="tensorrt_llm", trtllm_backend="tensorrt"))
    assert mode_and_len(ar) == ("NONE", 0) and "speculative_config" not in ar["llm"]
    assert "--speculative_decoding_mode" not in ar["trtllm_build"]["command"]
    custom = trt_plan(la(4, 3, 4, backend="tensorrt_llm"), build_config={"max_batch_size": 4})
    assert custom["llm"]["build_config"]["max_batch_size"] == 4
    assert custom["trtllm_build"]["command"][custom["trtllm_build"]["command"].index("--max_batch_size") + 1] == "4"


def test_eagle_plans_pass_what_tensorrt_llm_1_2_means(tmp_path):
    """llm_args.py EagleDecodingConfig: max_draft_len is the drafting steps (validate_eagle_config derives
    num_eagle_layers and max_total_draft_tokens from it); EAGLE-3 reads the target layers eagle3_layers_to_capture."""
    shipped = str(models.default_artifact(models.BUNDLED, "eagle"))
    plan = trt_plan(request({"decoding_type": "Eagle", "max_draft_len": 23, "num_eagle_layers": 5}, backend="tensorrt_llm"))
    sc = plan["llm"]["speculative_config"]
    assert plan["trtllm_backend"] == "pytorch" and sc["max_draft_len"] == 5 and "num_eagle_layers" not in sc
    assert "use_dynamic_tree" not in sc, "1.2's PyTorch backend fixes max_total_draft_tokens to max_draft_len"
    # The shipped module fuses hidden states 2, 15, 27 = decoder layers 1, 14, 26: upstream's default {1, L//2-1, L-4}.
    assert sc["eagle3_layers_to_capture"] == [1, 14, 26] and sc["allow_advanced_sampling"] is True
    assert plan["prepare"] == [{"step": "export_eagle", "from": shipped, "to": "{build_dir}/eagle"}]
    assert sc["speculative_model"] == "{build_dir}/eagle"
    assert plan["cannot_run"] == []  # the shipped module is EAGLE-3: exported on the way, it is what 1.2 loads
    # A module of the earlier design is not an EAGLE-3 checkpoint, and the plan says so instead of pretending.
    older = trt_plan(request({"decoding_type": "Eagle", "speculative_model": str(earlier_design(tmp_path / "old"))},
                             backend="tensorrt_llm"))
    (why,) = older["cannot_run"]
    assert "not an EAGLE-3 checkpoint" in why and "[1152 → 576]" in why and "--eagle3" in why
    engine = trt_plan(request({"decoding_type": "Eagle", "num_eagle_layers": 4}, backend="tensorrt_llm", trtllm_backend="tensorrt"))
    esc = engine["llm"]["speculative_config"]
    assert (esc["max_draft_len"], esc["use_dynamic_tree"], esc["dynamic_tree_max_topK"]) == (4, True, 4)
    assert engine["prepare"] == [] and "EAGLE-1/2" in engine["cannot_run"][0] and "allow_advanced_sampling" not in esc
    hub = trt_plan(request({"decoding_type": "Eagle", "speculative_model": "org/eagle3"}, backend="tensorrt_llm"))
    assert hub["cannot_run"] == [] and hub["prepare"] == [] and "eagle3_layers_to_capture" not in hub["llm"]["speculative_config"]
    assert "{1, L//2-1, L-4}" in hub["notes"][0]
    static = trt_plan(request({"decoding_type": "Eagle", "speculative_model": "org/eagle3", "use_dynamic_tree": False,
                               "eagle_choices": [[0], [0, 0], [1], [0, 0, 0]]}, backend="tensorrt_llm"))
    assert static["llm"]["speculative_config"]["max_draft_len"] == 3, "upstream resets it to the tree's depth"
    assert "eagle_choices" not in static["llm"]["speculative_config"], "1.2's PyTorch backend: a chain of that depth"


def test_medusa_plan_takes_the_head_count_from_the_artifact():
    assert trt_plan(request({"decoding_type": "Medusa"}, backend="tensorrt_llm"))["llm"]["speculative_config"]["num_medusa_heads"] == 4
    given = request({"decoding_type": "Medusa", "speculative_model": "org/medusa", "num_medusa_heads": 3}, backend="tensorrt_llm")
    assert trt_plan(given)["llm"]["speculative_config"]["num_medusa_heads"] == 3
    with pytest.raises(EngineError, match="set num_medusa_heads: TensorRT-LLM needs the Medusa head count and org/medusa"):
        trt_plan(request({"decoding_type": "Medusa", "speculative_model": "org/medusa"}, backend="tensorrt_llm"))


def test_a_build_tensorrt_llm_would_refuse_stops_first_and_says_why(tmp_path):
    store = EngineStore(tmp_path)
    old = earlier_design(tmp_path / "old")
    spec = spec_for(request({"decoding_type": "Eagle", "speculative_model": str(old)}, backend="tensorrt_llm"), models.BUNDLED)
    with pytest.raises(BuildError, match="TensorRT-LLM would refuse this build: the EAGLE module at .* not an EAGLE-3 checkpoint"):
        store.build(spec)
    assert store.list() == [] and "plan.json" in store.get(spec.key())["files"]
    assert not (tmp_path / "models").exists(), "nothing is prepared for a build that cannot run"


@pytest.mark.skipif(HAS_TRTLLM, reason="TensorRT-LLM is installed here")
def test_the_tensorrt_llm_build_fails_clearly_and_keeps_its_plan(tmp_path):
    store = EngineStore(tmp_path)
    spec = spec_for(la(4, 3, 4, backend="tensorrt_llm"), models.BUNDLED)
    with pytest.raises(BuildError, match="TensorRT-LLM cannot build here: .*the build plan is in ") as info:
        store.build(spec)
    plan_path = Path(str(info.value).rsplit("the build plan is in ", 1)[1])
    assert plan_path.exists() and json.loads(plan_path.read_text()) == store.plan(spec)
    assert store.list() == [] and not (tmp_path / "builds" / spec.key()).exists()
    failed = store.get(spec.key())
    assert failed["status"] == "failed" and failed["error"] == str(info.value) and "plan.json" in failed["files"]
    assert not (tmp_path / "models").exists(), "nothing is prepared for a build that cannot run"


# ----------------------------------------------------------------------------- TensorRT-LLM builder, stand-in package

@pytest.fixture
def fake_trtllm(monkeypatch):
    """The stand-in `tensorrt_llm` (tests/stand_ins: TensorRT-LLM 1.2's rules) and a 'visible' GPU, to run the
    builder's glue code."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with trtllm_stand_in():
        yield


def test_the_tensorrt_llm_builder_runs_its_plan(tmp_path, tiny_dir, fake_trtllm):
    store = EngineStore(tmp_path / "engines")
    heads = make_heads(tmp_path / "heads")
    req = request({"decoding_type": "Medusa", "speculative_model": str(heads), "medusa_choices": [[0], [0, 0], [1]]}, backend="tensorrt_llm")
    manifest = store.build(spec_for(req, str(tiny_dir)))
    build = tmp_path / "engines" / "builds" / manifest["id"]
    assert manifest["kind"] == "tensorrt-engine" and manifest["plan"] == "plan.json"
    assert {"plan.json", "engine/rank0.engine", "medusa/config.json", "medusa/medusa_lm_head.safetensors"} <= set(manifest["files"])
    kwargs = json.loads((build / "engine" / "kwargs.json").read_text())
    assert kwargs["model"] == str(tiny_dir) and kwargs["tensor_parallel_size"] == 1
    # max_input_len / max_seq_len are the app's (a 4096-token prompt, 1024 new tokens), not BuildConfig's default 1024
    assert kwargs["build_config"] == {"max_batch_size": 8, "max_num_tokens": 8192, "max_input_len": 4096, "max_seq_len": 5120,
                                      "max_draft_len": 3}
    spec = kwargs["speculative_config"]
    assert spec["max_draft_len"] == 3 and sorted(spec["medusa_choices"]) == [[0], [0, 0], [1]]
    # the temporary directory the engine was built in is now the build directory
    assert Path(spec["speculative_model"]).name == "medusa" and ".tmp-" in spec["speculative_model"]
    assert spec["num_medusa_heads"] == 2, "the head count is the artifact's (TensorRT-LLM takes it as given)"
    # the exported heads carry the target's own LM head (read_export checks it) and our ResBlocks
    lm = tiny_llama(vocab=96, hidden=32, layers=1).get_output_embeddings().weight
    exported = medusa.read_export(build / "medusa", lm_head_weight=lm)
    for a, b in zip(exported.state_dict().values(), medusa.load(heads).state_dict().values()):
        assert torch.allclose(a, b, atol=1e-2)
    lookahead = store.build(spec_for(la(2, 2, 1, backend="tensorrt_llm"), str(tiny_dir)))
    kwargs = json.loads((tmp_path / "engines" / "builds" / lookahead["id"] / "engine" / "kwargs.json").read_text())
    assert {k: kwargs["speculative_config"][k] for k in ("max_window_size", "max_ngram_size", "max_verification_set_size")} == {
        "max_window_size": 2, "max_ngram_size": 2, "max_verification_set_size": 1}
    assert kwargs["build_config"]["max_draft_len"] == 2


@pytest.fixture(scope="module")
def tiny3_dir(tmp_path_factory):
    """A three-layer target: an EAGLE-3 module fuses two of its decoder-layer outputs (TensorRT-LLM makes EAGLE-3's fc
    only for more than one captured layer)."""
    path = tmp_path_factory.mktemp("tiny3") / "tiny-llama-3"
    tiny_llama(vocab=96, hidden=32, layers=3).save_pretrained(path)
    return path


def eagle3_module(target_dir):
    from app.heads import eagle

    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir)
    config = eagle.EagleConfig.from_target(target.config, draft_vocab_size=50, aux_layers=[2, 3], eagle3=True)
    return eagle.EagleModule(config, None)  # d2t zeros: draft id d is target id d


def test_an_eagle3_module_is_exported_and_served_with_its_capture_layers(tmp_path, tiny3_dir, fake_trtllm):
    """The PyTorch backend's EAGLE from this app's EAGLE-3 module: exported into the build, then LLM(...) gets the depth as
    max_draft_len and the module's layers as eagle3_layers_to_capture; the stand-in applies upstream's validators and
    loads the export by TensorRT-LLM 1.2's parameter names (`midlayer.*`)."""
    from app.heads import eagle

    eagle.save(eagle3_module(tiny3_dir), tmp_path / "eagle3", base_model="tiny")
    store = EngineStore(tmp_path / "engines")
    req = request({"decoding_type": "Eagle", "speculative_model": str(tmp_path / "eagle3"), "num_eagle_layers": 3},
                  backend="tensorrt_llm", sampling={"temperature": 0.7})
    spec = spec_for(req, str(tiny3_dir))
    assert trt_plan(req, str(tiny3_dir))["cannot_run"] == []
    kwargs = trtllm_serve_kwargs(store, spec)
    build = tmp_path / "engines" / "builds" / spec.key()
    assert kwargs["speculative_config"]["speculative_model"] == str(build / "eagle")
    assert eagle.read_export(build / "eagle").config.eagle3, "the build holds an EAGLE-3 checkpoint"
    from tensorrt_llm import llm, llmapi  # the stand-in

    manifest = store.get(spec.key())
    assert manifest["kind"] == "tensorrt-pytorch" and "eagle/model.safetensors" in manifest["files"]
    assert llm.CREATED == [], "the PyTorch backend compiles nothing: no LLM is made to build it"

    made = trt.llm_objects(kwargs)
    sc = made["speculative_config"]
    # Hidden states 2 and 3 are the outputs of decoder layers 1 and 2.
    assert isinstance(sc, llmapi.EagleDecodingConfig) and sc.eagle3_layers_to_capture == {1, 2}
    assert (sc.max_draft_len, sc.num_eagle_layers, sc.max_total_draft_tokens) == (3, 3, 3) and sc.allow_advanced_sampling
    trt.import_object(trt.LLM_CLASSES["pytorch"])(**made).shutdown()  # loaded as upstream's PyTorch LLM would


def test_eagle3_checkpoints_as_tensorrt_llm_1_2_loads_them(tmp_path, tiny3_dir, fake_trtllm):
    """Plans for exported EAGLE-3 checkpoints, each loaded by the stand-in with the plan's own arguments: ours
    (`export --format eagle3`, layers in vLLM's numbering, the real ones stated in its specdec block) and ModelOpt
    0.37's layout (`midlayer.*`, ModelOpt's numbering, no specdec) capture the same decoder layers. TensorRT-LLM
    1.2.0rc2 loads weights by name (modeling_speculative.py): `layers.0.*` (later ModelOpt) is a KeyError, and an fc
    that does not take the capture list's width a size mismatch; the plan says both before anything loads."""
    from safetensors.torch import load_file, save_file

    from app.heads import eagle

    module = eagle3_module(tiny3_dir)
    ours, theirs = tmp_path / "ours", tmp_path / "modelopt"
    eagle.export_checkpoint(module, ours, "tiny", layout="eagle3")
    eagle.export_checkpoint(module, theirs, "tiny", layout="modelopt")
    config = json.loads((theirs / "config.json").read_text())
    del config["specdec"]  # exactly what ModelOpt 0.37's hf_spec_export writes
    (theirs / "config.json").write_text(json.dumps(config))
    assert json.loads((ours / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2]

    def plan_of(checkpoint):
        return trt_plan(request({"decoding_type": "Eagle", "speculative_model": str(checkpoint), "num_eagle_layers": 3},
                                backend="tensorrt_llm"), str(tiny3_dir))

    def load(plan):
        from tensorrt_llm import LLM

        LLM(**trt.llm_objects(plan["llm"])).shutdown()

    for checkpoint in (ours, theirs):
        plan = plan_of(checkpoint)
        sc = plan["llm"]["speculative_config"]
        assert sc["eagle3_layers_to_capture"] == [1, 2] and sc["speculative_model"] == str(checkpoint.resolve())
        assert plan["cannot_run"] == [] and plan["prepare"] == [] and plan["trtllm_backend"] == "pytorch"
        load(plan)
        assert eagle.read_export(checkpoint).config.aux_layers == [2, 3], "the project's own drafter reads it alike"

    later = tmp_path / "later-modelopt"
    later.mkdir()
    (later / "config.json").write_text(json.dumps(config))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(theirs / "model.safetensors")).items()},
              str(later / "model.safetensors"))
    plan = plan_of(later)
    (why,) = plan["cannot_run"]
    assert "`layers.0.*`" in why and "1.2.0rc2" in why
    with pytest.raises(KeyError, match="midlayer.self_attn.q_proj.weight"):
        load(plan)
    assert eagle.read_export(later).config.aux_layers == [2, 3]

    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]  # names three layers; its fc takes two
    (theirs / "config.json").write_text(json.dumps(config))
    plan = plan_of(theirs)
    assert plan["llm"]["speculative_config"]["eagle3_layers_to_capture"] == [0, 1, 2]
    (why,) = plan["cannot_run"]
    assert "has an fc over 64 inputs" in why and "3 captured layers = 96 inputs" in why
    with pytest.raises(RuntimeError, match="size of tensor a \\(96\\) must match the size of tensor b \\(64\\)"):
        load(plan)


def test_eagle_plans_on_modules_tensorrt_llm_cannot_capture_for(tmp_path, tiny_dir):
    """TensorRT-LLM captures decoder-layer outputs, and makes EAGLE-3's fc only for more than one of them."""
    from app.heads import eagle

    target = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir)
    for aux, why in (([1], "reads one target layer"), ([0, 1], "fuses the target's embeddings")):
        config = eagle.EagleConfig.from_target(target.config, aux_layers=aux, eagle3=True)
        eagle.save(eagle.EagleModule(config), tmp_path / str(aux), base_model="tiny")
        plan = trt_plan(request({"decoding_type": "Eagle", "speculative_model": str(tmp_path / str(aux))},
                                backend="tensorrt_llm"), str(tiny_dir))
        assert any(why in reason for reason in plan["cannot_run"]), plan["cannot_run"]


def test_serving_on_tensorrt_llm_uses_the_stores_build(tmp_path, tiny_dir, fake_trtllm):
    """The backend's LLM(...) arguments: an engine mode loads the saved engine (built once, then reused), with the
    model's tokenizer; the PyTorch backend loads the checkpoint and builds nothing."""
    store = EngineStore(tmp_path / "engines")
    heads = make_heads(tmp_path / "heads")
    spec = spec_for(request({"decoding_type": "Medusa", "speculative_model": str(heads)}, backend="tensorrt_llm"), str(tiny_dir))
    kwargs = trtllm_serve_kwargs(store, spec)
    build = tmp_path / "engines" / "builds" / spec.key()
    assert kwargs["model"] == str(build / "engine") and (build / "engine" / "rank0.engine").is_file()
    assert kwargs["tokenizer"] == str(tiny_dir) and "build_config" not in kwargs
    assert kwargs["speculative_config"]["speculative_model"] == str(build / "medusa")
    assert (build / "medusa" / "medusa_lm_head.safetensors").is_file()
    created = store.get(spec.key())["created"]
    assert trtllm_serve_kwargs(store, spec) == kwargs and store.get(spec.key())["created"] == created
    ngram = spec_for(request({"decoding_type": "NGram", "max_draft_len": 5}, backend="tensorrt_llm"), str(tiny_dir))
    kwargs = trtllm_serve_kwargs(store, ngram)
    assert kwargs["model"] == str(tiny_dir) and kwargs["disable_overlap_scheduler"] and "enable_iter_perf_stats" not in kwargs
    assert [m["id"] for m in store.list()] == [spec.key()]


# ----------------------------------------------------------------------------- real builds


@pytest.mark.bundled
def test_bundled_medusa_build(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    store = EngineStore(engines)
    spec = spec_for(request({"decoding_type": "Medusa"}), models.BUNDLED)
    manifest = store.build(spec)
    assert manifest["kind"] == "transformers-heads" and manifest["source"]["model_bytes"] > 100e6
    shipped = models.default_artifact(models.BUNDLED, "medusa")
    assert manifest["source"]["speculative_model"] == str(shipped)
    heads = medusa.load(engines / "builds" / manifest["id"] / "medusa")
    config = json.loads((Path(manifest["source"]["model_path"]) / "config.json").read_text())
    assert (heads.config.hidden_size, heads.config.vocab_size) == (config["hidden_size"], config["vocab_size"])
    reference = medusa.load(shipped)
    assert all(torch.equal(a, b) for a, b in zip(heads.state_dict().values(), reference.state_dict().values()))
    assert store.build(spec) == manifest


def _gpu_skip_reason() -> str | None:
    if not HAS_TRTLLM:
        return "TensorRT-LLM is not installed"
    try:
        import tensorrt_llm  # noqa: F401
    except (ImportError, OSError) as err:
        return f"TensorRT-LLM cannot load here: {str(err).splitlines()[0]}"
    return None if torch.cuda.is_available() else "no CUDA GPU"


@pytest.mark.gpu
@pytest.mark.bundled
def test_gpu_builds_a_real_lookahead_engine(tmp_path):
    reason = _gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    store = EngineStore(engines)
    spec = spec_for(la(4, 3, 4, backend="tensorrt_llm"), models.BUNDLED, build_config={"max_batch_size": 1, "max_seq_len": 1024})
    manifest = store.build(spec)
    assert manifest["kind"] == "tensorrt-engine" and manifest["status"] == "ready"
    assert any(name.startswith("engine/") and name.endswith(".engine") for name in manifest["files"])
    from tensorrt_llm._tensorrt_engine import LLM
    from tensorrt_llm.llmapi import LookaheadDecodingConfig, SamplingParams

    engine = engines / "builds" / manifest["id"] / "engine"
    llm = LLM(model=str(engine), tokenizer=manifest["source"]["model_path"],
              speculative_config=LookaheadDecodingConfig(max_window_size=4, max_ngram_size=3, max_verification_set_size=4))
    try:
        out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0.0))
        assert len(out[0].outputs[0].token_ids) > 0
    finally:
        llm.shutdown()
    assert store.build(spec) == manifest
