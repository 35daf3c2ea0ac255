"""The mode registry: a mode added as a drafter, a config class, an explainer and one entry (all in this file, nothing
else in app/ changed) shows up everywhere the modes are read: the command line, the service, the Run and Compare tabs,
links, replays (its provenance kept), charts and Learn."""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

import pytest
import torch
from pydantic import Field

from app import cli
from app.modes import ConfigError
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.types import Proposal
from app.modes import MODES, Mode
from app.modes import configs
from app.modes.configs import Bound, _Config
from app.modes.reference import markdown
from app.ui import charts, lessons, render
from helpers import checked
from app import runner


class RepeatLast:
    """The toy drafter: propose the last token again, `times` times (a chain)."""

    name = "repeat"
    needs_hidden = False

    def __init__(self, times: int) -> None:
        self.times = times

    @classmethod
    def from_config(cls, config, target=None, companion=None):
        return cls(config.max_draft_len)

    def start(self, prompt, sampling, gen, prefill) -> None:
        pass

    def propose(self, context: list[int], room: int) -> Proposal:
        n = min(self.times, room)
        return Proposal(tokens=[context[-1]] * n, parents=list(range(-1, n - 1)),
                        source={"repeat": {"token": context[-1], "times": n}})

    def observe(self, proposal, verdict, out) -> None:
        pass


class RepeatDecodingConfig(_Config):
    """Repeat: drafts the last token again. Its field's range and help are its metadata: the check, the flag's help,
    the Run tab's slider and the settings reference read them from there."""

    decoding_type: Literal["Repeat"] = "Repeat"
    max_draft_len: Annotated[int, Bound(1, 8)] = Field(3, description="repeat: times the last token is drafted again")
    mode: ClassVar[str] = "repeat"


class RepeatExplainer:
    """The toy's explainer (app/ui/explain/ holds the shipped ones as modules; an object with the same names does)."""

    LEARN = "### Repeat\nDrafts the last token again; the target keeps what it agrees with, so it is lossless."
    RECORDING = "a run whose answer repeats itself."

    @staticmethod
    def drafted(source, n, texts) -> str:
        return f"Repeat proposed the last token {n} more time(s)"

    @staticmethod
    def source_html(event, source, texts, context, prompt_len, tokens, parents, accepted) -> str:
        said = source.get("repeat") or {}
        return f'<p class="repeat-panel">Repeat: token {render.esc(said.get("token"))}, {render.esc(said.get("times"))} times.</p>'


TOY = MODES.with_(Mode("repeat", "Repeat", RepeatDecodingConfig, "#117733", "lossless: greedy and exact sampling",
                       drafter=RepeatLast, explainer=RepeatExplainer,
                       provenance={"repeat": ("dict", {"token": "id", "times": "int"})},
                       vllm_missing="vLLM has no method that repeats the last token",
                       trtllm_missing="TensorRT-LLM has no such method either"))


def test_the_app_registry_is_untouched():
    assert "repeat" not in MODES and "repeat" in TOY and TOY.names[:-1] == MODES.names


def test_each_entry_is_its_configs_mode():
    """An entry's config names the same mode, and every decoding_type and flag is one mode's only."""
    assert all(m.config.mode == m.name for m in MODES)
    assert len({m.decoding_type for m in MODES}) == len(MODES.names)
    assert MODES.merged == ("medusa+prompt_lookup", "eagle+prompt_lookup")
    flags = {}
    for m in MODES:
        for f in m.cli_flags():
            assert f.field is None or f.field in m.config.model_fields, (m.name, f)
            flags.setdefault(f.name, set()).add(m.name)
    assert {name: owners for name, owners in flags.items() if len(owners) > 1} == {"min_path_prob": {"medusa", "eagle"}}


def test_the_command_line_offers_the_toy_mode_and_its_field():
    parser = cli.build_parser(TOY)
    text = parser._subparsers._group_actions[0].choices["generate"].format_help()
    assert "repeat" in text and "--repeat-max-draft-len" in text
    assert "repeat: times the last token is drafted again (in [1, 8])" in " ".join(text.split())
    args = parser.parse_args(["generate", "--prompt", "x", "--mode", "repeat", "--repeat-max-draft-len", "5"])
    data = cli.request_data(args, "repeat", TOY)
    assert data["speculative_config"] == {"decoding_type": "Repeat", "max_draft_len": 5}
    assert TOY.parse(data).speculative_config.max_draft_len == 5
    assert "--repeat-max-draft-len" not in cli.build_parser().format_help() + _generate_help(cli.build_parser())


def _generate_help(parser) -> str:
    return parser._subparsers._group_actions[0].choices["generate"].format_help()


def test_config_validation_accepts_and_rejects_its_fields():
    ok = configs.parse({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 2}}, TOY)
    assert ok.mode == "repeat" and ok.entry.label == "Repeat"
    with pytest.raises(ConfigError, match=r"max_draft_len must be in \[1, 8\]"):
        configs.parse({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 9}}, TOY)
    with pytest.raises(ConfigError, match="Extra inputs"):
        configs.parse({"speculative_config": {"decoding_type": "Repeat", "max_window_size": 2}}, TOY)
    with pytest.raises(ConfigError, match="TensorRT-LLM has no repeat decoding"):
        checked({"speculative_config": {"decoding_type": "Repeat"}, "backend": "tensorrt_llm"}, TOY)
    with pytest.raises(ConfigError):  # the app's own registry does not know it
        MODES.parse({"speculative_config": {"decoding_type": "Repeat"}})


def test_an_engine_mapping_in_its_entry_is_what_tensorrt_llm_is_sent():
    """TensorRT-LLM's field mapping, rules and engine mode are the entry's: the backend reads them from there."""
    import dataclasses

    from app.backends.tensorrt_llm import backend as trt

    def refuse_sampling(request):
        if request.sampling.temperature:
            raise ConfigError("repeat on TensorRT-LLM: greedy only")

    entry = dataclasses.replace(TOY["repeat"], trtllm=("pytorch",), trtllm_missing="", trtllm_engine_mode="DRAFT_TOKENS_EXTERNAL",
                                trtllm_fields=lambda c, backend: {"max_draft_len": c.max_draft_len},
                                trtllm_ignored=lambda c, backend: [f"repeats on {backend}"], trtllm_check=refuse_sampling)
    mapped = MODES.with_(entry)
    request = checked({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 5}, "backend": "tensorrt_llm"}, mapped)
    assert trt.trtllm_speculative_config(request) == {"decoding_type": "Repeat", "max_draft_len": 5}
    assert trt.trtllm_notes(request) == ["repeats on pytorch"] and trt.trtllm_engine_draft_len(request) == 5
    plan = trt.trtllm_build_plan(request, "a", "b")
    assert plan[plan.index("--speculative_decoding_mode") + 1] == "draft_tokens_external"
    with pytest.raises(ConfigError, match="greedy only"):
        checked({"speculative_config": {"decoding_type": "Repeat"}, "sampling": {"temperature": 0.7},
                 "backend": "tensorrt_llm"}, mapped)


def test_the_charts_and_learn_texts_name_and_colour_it():
    rows = [{"mode": "autoregressive", "speedup": 1.0}, {"mode": "Repeat", "speedup": 1.2}]
    bars = charts.compare(rows, modes=TOY).data[0]
    assert list(bars.y) == ["Autoregressive", "Repeat"] and list(bars.marker.color)[1] == "#117733"
    assert charts.mode_key("Repeat", TOY) == "repeat" and lessons.label("repeat", TOY) == "Repeat"
    assert "drafts the last token again" in lessons.explain("repeat", TOY).lower()


def test_the_run_tab_offers_it(tmp_path):
    from app.service.api import Service
    from app.ui.web import Studio

    studio = Studio(Service(engines=tmp_path, modes=TOY))
    assert studio.modes is TOY
    demo = studio.blocks()
    radio = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "mode")
    assert ("Repeat", "repeat") in [tuple(c) for c in radio.choices]
    assert [m["mode"] for m in studio.service.modes(backend="transformers")][-1] == "repeat"
    # Its config's field is a control of its own group (settings generated from the registry, no web.py edit).
    control = studio.run.controls["repeat_max_draft_len"]
    assert control.label == "max_draft_len" and control.value == 3
    assert (control.minimum, control.maximum, control.step) == (1, 8, 1)  # a slider over its field's Bound
    parents, block = [], control
    while block is not None:
        parents.append(block := block.parent)
    assert studio.run.groups["repeat"] in parents


def test_the_settings_reference_lists_it_from_its_fields_metadata():
    table = markdown(TOY).split("## Repeat (`Repeat`)")[1]
    assert "| `max_draft_len` | `3` | [1, 8] | `--repeat-max-draft-len` | `repeat_max_draft_len` | repeat: times the last " \
           "token is drafted again |" in table
    assert "## Repeat" not in markdown(MODES)


def test_every_number_a_shipped_mode_takes_has_its_range_in_its_fields_metadata():
    """One place for a bound: a numeric field without one would be checked nowhere or somewhere else."""
    for m in MODES:
        for name, info in m.config.model_fields.items():
            kinds = set(getattr(info.annotation, "__args__", None) or (info.annotation,)) - {type(None)}
            if kinds <= {int, float} and kinds:
                assert configs.bound(m.config, name) is not None, (m.name, name)
        for c in m.run_controls():  # and a slider never offers what its field refuses
            b = configs.bound(m.config, c.field) if c.field and c.kind == "slider" and c.to_field is None else None
            if b is not None:
                assert b.holds(c.minimum) and b.holds(c.maximum), (m.name, c.key)


def test_its_field_round_trips_through_the_run_tabs_settings():
    from app.ui import settings

    assert [c.key for c in settings.controls(TOY["repeat"])] == ["repeat_max_draft_len"]
    assert "repeat_max_draft_len" in settings.keys(TOY) and "repeat_max_draft_len" not in settings.keys()
    values = dict(settings.defaults(TOY), repeat_max_draft_len=5)
    assert values["repeat_max_draft_len"] == 5 and settings.defaults(TOY)["repeat_max_draft_len"] == 3
    request = settings.to_request("repeat", values, TOY)
    assert request["speculative_config"] == {"decoding_type": "Repeat", "max_draft_len": 5}
    assert TOY.parse(request).speculative_config.max_draft_len == 5
    mode, back = settings.from_request(request, TOY)
    assert mode == "repeat" and back["repeat_max_draft_len"] == 5
    assert settings.to_request(mode, {**settings.defaults(TOY), **back}, TOY) == request
    assert settings.visible("repeat", values, TOY)["repeat"] and not settings.visible("eagle", values, TOY)["repeat"]
    with pytest.raises(ConfigError, match="max_draft_len must be a finite number"):
        settings.to_request("repeat", dict(values, repeat_max_draft_len="many"), TOY)
    assert settings.from_request(request) is None  # the app's own registry does not know it


def test_a_greedy_run_with_it_equals_autoregressive(tiny_model):
    prompt = [5, 9, 9, 9, 3, 17, 9, 9]
    runs = {}
    for data in ({}, {"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 4}}):
        cfg = runner.to_runtime(configs.parse({**data, "max_new_tokens": 24}, TOY))
        events = list(generate(TransformersTarget(tiny_model), runner.drafter(cfg, tiny_model, modes=TOY), prompt,
                               sampling=cfg.sampling, max_new_tokens=cfg.max_new_tokens))
        runs[cfg.mode] = ([t for e in events for t in e.tokens], sum(len(e.proposed.get("tokens") or []) for e in events))
    assert runs["repeat"][0] == runs["autoregressive"][0] and len(runs["repeat"][0]) == 24
    assert runs["repeat"][1] > 0 == runs["autoregressive"][1]  # it drafted, and the target verified its drafts


def _toy_run(tiny_model, max_new_tokens: int = 12):
    """A greedy run of the toy mode as the service records it (a start message, then every step)."""
    from app.traces import Recording

    request = TOY.parse({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 3}, "max_new_tokens": max_new_tokens})
    cfg = runner.to_runtime(request)
    run = Recording("repeat", request.model_dump(mode="json"), "x")
    run.add({"type": "start", "prompt_ids": [5, 9, 9, 9], "texts": {str(i): f"t{i}" for i in range(64)}, "dtype": "float32"})
    events = list(generate(TransformersTarget(tiny_model), runner.drafter(cfg, tiny_model, modes=TOY), [5, 9, 9, 9],
                           sampling=cfg.sampling, max_new_tokens=cfg.max_new_tokens))
    for e in events:
        run.add({"type": "step", **e.to_dict(), "texts": {}})
    return run


def test_a_replay_keeps_its_provenance_and_draws_its_panel(tiny_model):
    import json

    from app import traces

    run = _toy_run(tiny_model)
    data = json.loads(json.dumps(run.trace()))
    with pytest.raises(traces.TraceError, match="names no mode"):  # the app's registry does not know it
        traces.parse(data)
    replayed, _ = traces.parse(data, TOY)
    drafted = [e for e in replayed.events if e["proposed"]["tokens"]]
    assert replayed.mode == "repeat" and drafted
    assert all(e["source"]["repeat"]["times"] == len(e["proposed"]["tokens"]) for e in drafted)
    html = render.step_detail(drafted[0], replayed.texts, replayed.prompt_ids, [], replayed.mode, TOY)
    assert 'class="repeat-panel"' in html and "Repeat proposed the last token" in html
    assert "repeat-panel" not in render.step_detail(drafted[0], replayed.texts, replayed.prompt_ids, [], "eagle", TOY)


def test_compare_links_and_learn_offer_it(tmp_path):
    from app.service.api import Service
    from app.ui import links
    from app.ui.web import Studio

    studio = Studio(Service(engines=tmp_path, modes=TOY))
    demo = studio.blocks()
    boxes = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "cmp-modes")
    assert ("Repeat", "repeat") in [tuple(c) for c in boxes.choices]
    link = links.parse({"mode": "repeat", "repeat_max_draft_len": "5"}, studio.run.page_defaults(), TOY.names, {}, (),
                       lambda mode, values: None)
    assert link.mode == "repeat" and link.values["repeat_max_draft_len"] == 5
    assert lessons.explain("repeat", TOY) == RepeatExplainer.LEARN
    assert lessons.explain("repeat", MODES.with_(Mode("repeat", "Repeat", RepeatDecodingConfig, "#117733", "x"))).startswith(
        "### Repeat\nRepeat: drafts the last token again.")  # no explainer: its config's own description


class BiasHead(torch.nn.Module):
    """The toy artifact: one learnt bias over the vocabulary (the unigram a draft could propose)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(vocab))


def _bias_build(target, settings, d2t):
    head = BiasHead(target.model.get_output_embeddings().weight.shape[0])

    def loss(batch):
        logits = head.bias.expand(*batch.ids[:, 1:].shape, -1)
        return torch.nn.functional.cross_entropy(logits[batch.mask[:, 1:]], batch.ids[:, 1:][batch.mask[:, 1:]])

    def save(directory):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps({"architecture": "repeat_bias", "vocab": head.bias.numel(),
                                                           "base_model": target.name}))
        torch.save(head.state_dict(), directory / "bias.pt")

    return head, loss, save


def _bias_export(source, out, base_model, fmt):
    """The toy's one format: its bias as the logits of a unigram draft, in numbers a person can read."""
    out.mkdir(parents=True)
    bias = torch.load(source / "bias.pt")["bias"]
    (out / "unigram.json").write_text(json.dumps({"base_model": base_model, "format": fmt, "logits": bias.tolist()}))


def test_a_new_artifact_kind_trains_and_exports_through_its_entrys_recipe(tmp_path):
    """A trained artifact kind is a recipe named by one entry: `train` and its --mode choices find it there, and
    `export` its formats, its default and its writer."""
    import dataclasses

    from app import models
    from app.training import export, recipes
    from helpers import tiny_llama, tiny_tokenizer

    recipe = recipes.Recipe(_bias_build, lambda s: 0.1, lambda p: json.loads((p / "config.json").read_text()),
                            lambda s, c, target, p: s, saved_as="repeat_bias", formats=("unigram",), export=_bias_export)
    registry = MODES.with_(dataclasses.replace(TOY["repeat"], artifact="repeat_bias", artifact_label="repeat bias",
                                               artifact_recipe=recipe))
    assert recipes.kinds(registry)[-1] == "repeat_bias" and "repeat_bias" not in recipes.kinds()
    choices = next(a for a in cli.build_parser(registry)._subparsers._group_actions[0].choices["train"]._actions
                   if a.dest == "mode").choices
    assert "repeat_bias" in choices
    tiny_llama().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    target = models.load(str(tmp_path / "model"), engines=tmp_path / "engines")
    settings = recipes.TrainSettings(data_source="sharegpt", data_limit=12, max_len=32, epochs=3, holdout=2)
    summary = recipes.train("repeat_bias", target, tmp_path / "out", settings, tmp_path / "engines",
                            report=lambda *a, **k: None, modes=registry)
    assert summary["kind"] == "repeat_bias" and summary["lr"] == 0.1 and summary["state"] == "done"
    assert summary["last_loss"] < summary["first_loss"]
    assert recipes.artifact_config("repeat_bias", tmp_path / "out", registry)["vocab"] == 96
    assert export.formats(registry)["repeat_bias"] == ("unigram",) and "repeat_bias" not in export.formats()
    with pytest.raises(export.ExportError, match="a repeat bias exports as unigram, not 'hf'"):
        export.export(tmp_path / "out", tmp_path / "hf", format="hf", modes=registry)
    written = export.export(tmp_path / "out", tmp_path / "exported", modes=registry)  # the base model from its config
    unigram = json.loads((written / "unigram.json").read_text())
    assert unigram["format"] == "unigram" and unigram["base_model"] == target.name and len(unigram["logits"]) == 96
    with pytest.raises(export.ExportError, match="holds no artifact of `python -m app train`"):
        export.export(tmp_path / "out", tmp_path / "again")  # the app's own registry knows no such architecture
    with pytest.raises(ValueError, match="unknown training mode 'repeat_bias'"):
        recipes.recipe("repeat_bias")  # the app's own registry has no such kind


# ----------------------------------------------------------------------------- what an entry owns of its mode


def test_an_eagle_trees_depth_and_nodes_survive_every_mapping_unchanged():
    """Depth (max_draft_len, TensorRT-LLM's drafting steps) and nodes (max_total_draft_tokens) are two fields: the Run
    tab's controls, the command line, each engine's mapping and the drafter carry them as they are, no ±1 between."""
    from app.backends.tensorrt_llm import backend as trt
    from app.backends.vllm import processes as vllm
    from app.ui import settings

    data = {"speculative_config": {"decoding_type": "Eagle", "max_total_draft_tokens": 11, "num_eagle_layers": 4,
                                   "dynamic_tree_max_topK": 3}}
    c = MODES.parse(data).speculative_config
    assert (c.max_draft_len, c.max_total_draft_tokens) == (4, 11)
    mode, values = settings.from_request(data)
    assert (mode, values["eg_total"], values["eg_depth"]) == ("eagle", 12, 4)  # the Run tab's total counts the root
    back = MODES.parse(settings.to_request(mode, {**settings.defaults(), **values})).speculative_config
    assert (back.max_draft_len, back.max_total_draft_tokens) == (4, 11)
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--mode", "eagle", "--eagle-total-tokens", "12",
                                          "--eagle-depth", "4", "--eagle-top-k", "3"])
    flagged = MODES.parse(cli.request_data(args, "eagle")).speculative_config
    assert (flagged.max_draft_len, flagged.max_total_draft_tokens) == (4, 11)
    for backend in ("pytorch", "tensorrt"):
        request = MODES.parse({**data, "backend": "tensorrt_llm", "trtllm_backend": backend})
        assert trt.trtllm_speculative_config(request)["max_draft_len"] == c.max_draft_len
        assert trt.trtllm_engine_draft_len(request) == 4
    vllm_request = MODES.parse({**data, "backend": "vllm"})
    assert vllm.speculative_config(vllm_request, "m")["num_speculative_tokens"] == c.max_draft_len
    from app.decoding.drafters.eagle import Eagle

    class Module:  # what from_config reads of the module and the target: nothing of the tree's size
        config = type("C", (), {"draft_vocab_size": 8})

    target = torch.nn.Module()
    target.get_input_embeddings = lambda: torch.nn.Embedding(8, 4)
    drafter = Eagle.from_config(c, target, Module())
    assert (drafter.max_total_draft_tokens, drafter.depth, drafter.top_k) == (11, 4, 3)
    static = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "use_dynamic_tree": False,
                                                 "eagle_choices": [[0], [0, 0], [0, 0, 0], [1]]}}).speculative_config
    assert static.max_draft_len == 3, "a static tree's depth is its deepest path"


def test_a_request_from_before_the_split_keeps_its_tree():
    """Requests and recordings from before max_total_draft_tokens gave EAGLE's nodes as max_draft_len."""
    old = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 7, "num_eagle_layers": 4}})
    assert (old.speculative_config.max_total_draft_tokens, old.speculative_config.max_draft_len) == (7, 4)


def test_a_modes_step_limits_on_the_transformers_backend_are_its_entrys():
    import dataclasses

    def at_most_two(c):
        if c.max_draft_len > 2:
            raise ConfigError("repeat: at most 2 on this loop")

    limited = MODES.with_(dataclasses.replace(TOY["repeat"], loop_check=at_most_two))
    assert checked({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 2}}, limited)
    with pytest.raises(ConfigError, match="at most 2 on this loop"):
        checked({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 3}}, limited)
    checked({"speculative_config": {"decoding_type": "Repeat", "max_draft_len": 3}, "backend": "tensorrt_llm"},
            MODES.with_(dataclasses.replace(limited["repeat"], trtllm=("pytorch",))))  # the loop's limit only
    with pytest.raises(ConfigError, match="verifies at most 96"):  # the bound every mode is held to: its draft tokens
        checked({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 64, "max_candidates": 2}})


def test_what_tensorrt_llm_takes_per_request_is_the_entrys():
    from app.backends.tensorrt_llm import backend as trt

    request = MODES.parse({"speculative_config": {"decoding_type": "Lookahead", "request": [2, 2, 1]}})
    assert trt.sampling_kwargs(request)["lookahead_config"] == {"max_window_size": 2, "max_ngram_size": 2,
                                                                "max_verification_set_size": 1}
    assert "lookahead_config" not in trt.sampling_kwargs(MODES.parse({"speculative_config": {"decoding_type": "Lookahead"}}))


def test_tour_compare_bench_and_link_short_forms_are_the_entries():
    from app.ui import links

    assert MODES.tour() == ["autoregressive", "prompt_lookup", "suffix", "lookahead", "draft_target", "medusa", "eagle",
                            "medusa+prompt_lookup", "eagle+prompt_lookup"]
    assert TOY.tour()[-1] == "repeat", "a mode without a place in the tour comes after"
    assert [m.name for m in MODES if m.compared] == ["prompt_lookup", "lookahead"]
    assert cli.build_parser().parse_args(["bench"]).modes == "autoregressive,prompt_lookup,lookahead"
    assert {s.name: s.keys for s in links.SHORT.values()} == {
        "la": ("la_W", "la_N", "la_G"), "la_req": ("la_w", "la_n", "la_g"), "pl": ("pl_ngram", "pl_num_tokens")}
    assert links.SHORT["la_req"].follows == "la"


def test_a_modes_panel_styles_are_its_explainers_and_reach_the_page():
    class Styled(RepeatExplainer):
        CSS = "body .specdec .repeat-panel{font-weight:700}\n"

    import dataclasses

    styled = MODES.with_(dataclasses.replace(TOY["repeat"], explainer=Styled))
    assert Styled.CSS in render.css(styled) and Styled.CSS not in render.css()
    page = render.css()
    assert "body .specdec .sd-grid th" in page and "body .specdec .bar" in page  # lookahead's and draft-target's panels
    assert ".sd-grid" not in render.CSS and ".cand" not in render.CSS, "a mode's panel styles are its explainer's"
