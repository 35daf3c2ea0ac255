"""The Run tab's settings presets and the trace download, without a server: pure functions of app/ui/settings.py
checked against the service's own validation and against the README's bench command."""

import re
import shlex

import pytest

from app.cli import build_parser
from app.modes import ConfigError
from app.modes import MODES as REGISTRY
from app.modes.shipped import DYNAMIC
from helpers import ROOT

MODES, MERGED_MODES = REGISTRY.names, REGISTRY.merged
from app.service.api import Service
from app.ui import settings
from app.ui.run_tab import check_message

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def service():
    return Service()


@pytest.mark.parametrize("name", settings.PRESETS)
@pytest.mark.parametrize("mode", MODES)
def test_every_preset_is_valid_for_every_mode(service, name, mode):
    values = dict(settings.DEFAULTS, **settings.preset(name, "bfloat16"))
    assert check_message(service, mode, values).startswith("✓ Valid"), check_message(service, mode, values)


def test_a_preset_leaves_sampling_length_draft_model_heads_and_backend_to_the_user():
    assert set(settings.preset_keys()) == set(settings.CONTROLS) - {"max_new_tokens", "temperature", "top_p", "top_k", "seed",
                                                         "dt_model", "md_model", "eg_model", "backend"}
    for name in settings.PRESETS:
        assert list(settings.preset(name, "float32")) == list(settings.preset_keys())  # the order the UI's outputs are in
    assert settings.preset("defaults", "bfloat16")["dtype"] == "auto"  # the server's dtype
    assert settings.preset("fastest here", "float32")["dtype"] == "float32"  # a CPU without native bfloat16
    with pytest.raises(ConfigError, match="unknown settings preset 'turbo'"):
        settings.preset("turbo", "float32")


def test_fastest_here_is_what_the_readme_bench_ran():
    """The preset and the README's bench command must not drift apart: parse that command with the CLI's own
    parser and compare every mode's config (EAGLE's tree and Medusa's pruning are the bench's defaults)."""
    text = README.read_text()
    command = re.search(r"python -m app bench --limit 5 (.*?)```", text, re.S).group(0).removesuffix("```")
    args = build_parser().parse_args(shlex.split(command.replace("\\\n", " "))[3:])
    fast = dict(settings.DEFAULTS, **settings.preset("fastest here", "bfloat16"))
    assert fast["dtype"] == args.dtype == "bfloat16"
    pl = settings.to_request("prompt_lookup", fast)["speculative_config"]
    assert (pl["max_draft_len"], pl["max_matching_ngram_size"], pl["max_candidates"], pl["is_use_oldest"]) == (
        args.prompt_lookup_num_tokens, args.max_matching_ngram_size, args.prompt_lookup_candidates, not args.use_newest_match)
    la = settings.to_request("lookahead", fast)["speculative_config"]
    assert ",".join(map(str, (la["max_window_size"], la["max_ngram_size"], la["max_verification_set_size"]))) == args.lookahead_config
    assert settings.to_request("draft_target", fast)["speculative_config"]["max_draft_len"] == args.max_draft_len
    eagle = settings.to_request("eagle", fast)["speculative_config"]
    assert (eagle["max_total_draft_tokens"] + 1, eagle["num_eagle_layers"], eagle["dynamic_tree_max_topK"], eagle["min_path_prob"]) == (
        args.eagle_total_tokens, args.eagle_depth, args.eagle_top_k, args.min_path_prob)
    assert settings.to_request("medusa", fast)["speculative_config"]["min_path_prob"] == args.min_path_prob


CHANGED = {  # every control away from its default, within what the service accepts
    "max_new_tokens": 40, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 7,
    "pl_num_tokens": 6, "pl_ngram": 3, "pl_draft_lens": "1,4", "pl_candidates": 2, "pl_oldest": False,
    "la_W": 5, "la_N": 4, "la_G": 3, "la_w": 3, "la_n": 2, "la_g": 2, "dt_len": 3, "dt_model": "smollm2-135m-instruct-draft",
    "md_tree": "chain", "md_typical": True, "md_threshold": 0.2, "md_alpha": 0.4, "md_prune": 0.1,
    "eg_total": 20, "eg_depth": 6, "eg_topk": 5, "eg_tree": DYNAMIC, "eg_prune": 0.02, "dtype": "bfloat16",
}


@pytest.mark.parametrize("name", [*MODES, *MERGED_MODES, "eagle/static"])
def test_a_trace_request_sets_back_the_controls_that_made_it(service, name):
    """from_request is to_request's inverse: a replayed trace's settings, so Run runs it again here."""
    mode, values = settings.mode_values(name.split("/")[0], **CHANGED)
    if name.endswith("static"):
        values["eg_tree"] = "default"
    assert "chain" in settings.TREES and values["md_tree"] in settings.TREES
    request = settings.to_request(mode, values)
    service.request(request)  # a request the service accepts
    back_mode, back = settings.from_request(request)
    assert back_mode == mode and back == {k: values[k] for k in back}
    assert settings.to_request(mode, {**settings.DEFAULTS, **back}) == request
    group = {"prompt_lookup": "pl_", "lookahead": "la_", "draft_target": "dt_", "medusa": "md_", "eagle": "eg_"}.get(mode)
    if group:  # every control of the mode's own group comes back (a static tree's pruning has no say)
        ignored = {"eg_prune"} if name.endswith("static") else set()
        assert {k for k in settings.CONTROLS if k.startswith(group)} - ignored <= set(back)
    if name in MERGED_MODES:
        assert {k for k in settings.CONTROLS if k.startswith("pl_")} <= set(back)


def test_a_request_the_run_tab_cannot_express_sets_no_controls():
    eagle = settings.to_request("eagle", settings.DEFAULTS)
    assert settings.from_request({**eagle, "speculative_config": {**eagle["speculative_config"], "speculative_model": "/x"}}) is None
    assert settings.from_request({**eagle, "speculative_config": {**eagle["speculative_config"], "use_dynamic_tree": False,
                                                             "eagle_choices": [[0], [0, 0]]}}) is None
    assert settings.from_request({"speculative_config": {"decoding_type": "Nope"}}) is None
    assert settings.from_request("<script>") is None
    # A request of the command line, with its unset fields None: the defaults fill them.
    mode, values = settings.from_request({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 2,
                                                           "speculative_model": None}, "max_new_tokens": 30})
    assert mode == "draft_target" and values["dt_len"] == 2 and "dt_model" not in values and values["seed"] == -1


@pytest.mark.parametrize("mode, key", [("medusa", "md_model"), ("eagle", "eg_model")])
def test_heads_are_picked_shipped_or_by_a_training_runs_name_never_by_path(mode, key):
    name = "trained:" + "ab" * 8
    assert settings.to_request(mode, settings.DEFAULTS)["speculative_config"]["speculative_model"] is None  # the shipped heads
    request = settings.to_request(mode, {**settings.DEFAULTS, key: name})
    assert request["speculative_config"]["speculative_model"] == name
    assert settings.from_request(request)[1][key] == name  # a replayed trace picks the same run
    assert settings.from_request(settings.to_request(mode, settings.DEFAULTS))[1][key] == settings.SHIPPED
    path = {**request, "speculative_config": {**request["speculative_config"], "speculative_model": "/tmp/heads"}}
    assert settings.from_request(path) is None


def test_the_verdict_on_tensorrt_llm_says_what_it_does_not_take(tmp_path, monkeypatch):
    """Settings of this app's own that TensorRT-LLM has no field for are said in the verdict, not dropped silently
    (the stand-in tensorrt_llm makes that backend available here); the transformers backend takes them all."""
    import torch

    from helpers import trtllm_stand_in

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with trtllm_stand_in():
        s = Service(engines=tmp_path, backend="tensorrt_llm")
        values = dict(settings.DEFAULTS, backend="tensorrt_llm")
        pl = check_message(s, "prompt_lookup", values)
        assert pl.startswith("✓ Valid") and "⚠ max_candidates" in pl and "TensorRT-LLM's NGramDecodingConfig has neither" in pl
        assert "⚠" not in check_message(s, "prompt_lookup", dict(values, backend="transformers"))
        s.close()


def test_a_move_made_while_a_verdict_is_on_its_way_is_answered_not_dropped(tmp_path):
    """The verdict, the groups shown and the explanation follow every move: Gradio's default for .input ("once")
    drops a move made while the answer to the one before is pending, leaving a verdict on settings no longer shown."""
    from app.service.api import Service
    from app.ui.web import Studio

    demo = Studio(Service(engines=tmp_path)).blocks()
    fns = [d for d in demo.config["dependencies"] if d.get("api_visibility", "private") == "private"
           and any(t[1] == "input" for t in d["targets"]) and d.get("backend_fn")]
    assert fns and all(d["trigger_mode"] == "always_last" for d in fns), [(d["targets"][:2], d["trigger_mode"]) for d in fns]
