"""The Run tab's settings presets and the trace download, without a server: pure functions of the web module
checked against the service's own validation and against the README's bench command."""

import re
import shlex
from pathlib import Path

import pytest

from app.cli import build_parser
from app.config import MODES, ConfigError
from app.service.api import Service
from app.ui import web

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def service():
    return Service()


@pytest.mark.parametrize("name", web.PRESETS)
@pytest.mark.parametrize("mode", MODES)
def test_every_preset_is_valid_for_every_mode(service, name, mode):
    values = dict(web.DEFAULTS, **web.preset(name, "bfloat16"))
    assert web.check_message(service, mode, values).startswith("✓ Valid"), web.check_message(service, mode, values)


def test_a_preset_leaves_sampling_length_draft_model_and_backend_to_the_user():
    assert set(web.PRESET_KEYS) == set(web.CONTROLS) - {"max_new_tokens", "temperature", "top_p", "top_k", "seed",
                                                         "dt_model", "backend"}
    for name in web.PRESETS:
        assert list(web.preset(name, "float32")) == list(web.PRESET_KEYS)  # the order the UI's outputs are in
    assert web.preset("defaults", "bfloat16")["dtype"] == "auto"  # the server's dtype
    assert web.preset("fastest here", "float32")["dtype"] == "float32"  # a CPU without native bfloat16
    with pytest.raises(ConfigError, match="unknown settings preset 'turbo'"):
        web.preset("turbo", "float32")


def test_fastest_here_is_what_the_readme_bench_ran():
    """The preset and the README's bench command must not drift apart: parse that command with the CLI's own
    parser and compare every mode's config (EAGLE's tree and Medusa's pruning are the bench's defaults)."""
    text = README.read_text()
    command = re.search(r"python -m app bench --limit 5 (.*?)```", text, re.S).group(0).removesuffix("```")
    args = build_parser().parse_args(shlex.split(command.replace("\\\n", " "))[3:])
    fast = dict(web.DEFAULTS, **web.preset("fastest here", "bfloat16"))
    assert fast["dtype"] == args.dtype == "bfloat16"
    pl = web.request_from("prompt_lookup", fast)["speculative_config"]
    assert (pl["max_draft_len"], pl["max_matching_ngram_size"], pl["max_candidates"], pl["is_use_oldest"]) == (
        args.prompt_lookup_num_tokens, args.max_matching_ngram_size, args.prompt_lookup_candidates, not args.use_newest_match)
    la = web.request_from("lookahead", fast)["speculative_config"]
    assert ",".join(map(str, (la["max_window_size"], la["max_ngram_size"], la["max_verification_set_size"]))) == args.lookahead_config
    assert web.request_from("draft_target", fast)["speculative_config"]["max_draft_len"] == args.max_draft_len
    eagle = web.request_from("eagle", fast)["speculative_config"]
    assert (eagle["max_draft_len"] + 1, eagle["num_eagle_layers"], eagle["dynamic_tree_max_topK"], eagle["min_path_prob"]) == (
        args.eagle_total_tokens, args.eagle_depth, args.eagle_top_k, args.min_path_prob)
    assert web.request_from("medusa", fast)["speculative_config"]["min_path_prob"] == args.min_path_prob


def test_the_trace_download_has_the_cli_json_fields_and_the_request():
    run = web.Run("prompt_lookup")
    run.add({"type": "start", "prompt_ids": [1, 2], "texts": {1: "a", 2: "b"}, "dtype": "float32"})
    run.add({"type": "step", "step": 0, "tokens": [5], "texts": {5: "x"}, "text": "x"})
    run.add({"type": "step", "step": 1, "tokens": [6, 7], "texts": {6: "y", 7: "z"}, "text": "yz"})
    run.add({"type": "end", "finish_reason": "length", "text": "xyz", "token_ids": [5, 6, 7], "totals": {"new_tokens": 3}})
    request = web.request_from("prompt_lookup", web.DEFAULTS)
    trace = run.trace(request)
    assert {"text", "token_ids", "prompt_ids", "steps"} <= set(trace)  # what `generate --json` prints
    assert trace["token_ids"] == [t for s in trace["steps"] for t in s["tokens"]] == [5, 6, 7]
    assert trace["text"] == "xyz" and trace["finish_reason"] == "length" and trace["request"] == request
    assert trace["texts"] == {1: "a", 2: "b", 5: "x", 6: "y", 7: "z"} and trace["dtype"] == "float32"
    assert all("type" not in s and "texts" not in s for s in trace["steps"])
