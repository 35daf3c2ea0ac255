"""The mode registry: a mode added as one drafter and one entry shows up everywhere the modes are read."""

from __future__ import annotations

from typing import ClassVar, Literal

import pytest

from app import cli
from app.config import ConfigError
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.types import Proposal
from app.modes import MODES, Mode
from app.service import configs
from app.service.configs import _Config
from app.ui import charts, learn


class RepeatLast:
    """The toy drafter: propose the last token again, `times` times (a chain)."""

    name = "repeat"
    needs_hidden = False

    def __init__(self, times: int) -> None:
        self.times = times

    def start(self, prompt, sampling, gen, prefill) -> None:
        pass

    def propose(self, context: list[int], room: int) -> Proposal:
        n = min(self.times, room)
        return Proposal(tokens=[context[-1]] * n, parents=list(range(-1, n - 1)))

    def observe(self, proposal, verdict, out) -> None:
        pass


class RepeatDecodingConfig(_Config):
    """Repeat: drafts the last token again."""

    decoding_type: Literal["Repeat"] = "Repeat"
    max_draft_len: int = 3
    mode: ClassVar[str] = "repeat"

    def check(self) -> None:
        if not 1 <= self.max_draft_len <= 8:
            raise ConfigError(f"repeat's max_draft_len must be in [1, 8], got {self.max_draft_len}")

    def drafter(self, target=None, companion=None):
        return RepeatLast(self.max_draft_len)


TOY = MODES.with_(Mode("repeat", "Repeat", RepeatDecodingConfig, "#117733", "lossless: greedy and exact sampling"))


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
        configs.parse({"speculative_config": {"decoding_type": "Repeat"}, "backend": "tensorrt_llm"}, TOY)
    with pytest.raises(ConfigError):  # the app's own registry does not know it
        configs.parse({"speculative_config": {"decoding_type": "Repeat"}})


def test_the_charts_and_learn_texts_name_and_colour_it():
    rows = [{"mode": "autoregressive", "speedup": 1.0}, {"mode": "Repeat", "speedup": 1.2}]
    bars = charts.compare(rows, modes=TOY).data[0]
    assert list(bars.x) == ["Autoregressive", "Repeat"] and list(bars.marker.color)[1] == "#117733"
    assert charts.mode_key("Repeat", TOY) == "repeat" and learn.label("repeat", TOY) == "Repeat"
    assert "drafts the last token again" in learn.explain("repeat", TOY)


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
    parents, block = [], control
    while block is not None:
        parents.append(block := block.parent)
    assert studio.run.groups["repeat"] in parents


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
        cfg = configs.to_runtime(configs.parse({**data, "max_new_tokens": 24}, TOY))
        events = list(generate(TransformersTarget(tiny_model), cfg.drafter(tiny_model), prompt,
                               sampling=cfg.sampling, max_new_tokens=cfg.max_new_tokens))
        runs[cfg.mode] = ([t for e in events for t in e.tokens], sum(len(e.proposed.get("tokens") or []) for e in events))
    assert runs["repeat"][0] == runs["autoregressive"][0] and len(runs["repeat"][0]) == 24
    assert runs["repeat"][1] > 0 == runs["autoregressive"][1]  # it drafted, and the target verified its drafts
