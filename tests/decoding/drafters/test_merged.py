"""Merged trees: a Medusa or EAGLE tree plus prompt lookup's candidates, verified in one pass.

The merge is pure tree data (`graft`), checked against hand-built trees and random ones; the merged
drafter must stay lossless (greedy = autoregressive, sampling = the exact distribution) and its
prompt lookup nodes must actually be verified and accepted; configs, command line, web requests and
the step view carry it end to end.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import runner
from app.cli import request_data
from app.modes import ConfigError
from app.modes import MODES
from app.modes.configs import EagleDecodingConfig, NGramDecodingConfig
from app.runner import LoopConfig
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.eagle import Eagle
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.merged import Merged
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.sampling import SamplingParams
from app.decoding.tree import children, depths, graft, path_to
from app.ui import render
from app.ui import settings as run_settings
from helpers import DrafterSpy, run
from helpers_decoding import PROMPTS, ar_reference, make_module, medusa_drafter
from helpers_decoding import RUNS, T1, cached, check_against_exact, exact_distribution, sample_runs
from helpers_decoding import PROMPT as SAMPLING_PROMPT

MAX_NEW = 40


# ----------------------------------------------------------------------------- graft


def test_graft_hand_built():
    #  first: root -> 5 -> 6, root -> 7        second: root -> 5 -> 9 -> 4, root -> 8
    tokens, parents, where = graft([5, 7, 6], [-1, -1, 0], [5, 9, 4, 8], [-1, 0, 1, -1])
    assert tokens == [5, 7, 6, 9, 4, 8]
    assert parents == [-1, -1, 0, 0, 3, -1]
    assert where == [0, 3, 4, 5]


def test_graft_same_token_under_another_parent_is_a_new_node():
    tokens, parents, where = graft([5, 6], [-1, 0], [6], [-1])
    assert (tokens, parents, where) == ([5, 6, 6], [-1, 0, -1], [2])


def test_graft_empty_sides_and_bad_order():
    assert graft([], [], [], []) == ([], [], [])
    assert graft([3], [-1], [], []) == ([3], [-1], [])
    assert graft([], [], [3, 4], [-1, 0]) == ([3, 4], [-1, 0], [0, 1])
    with pytest.raises(ValueError, match="parents must come before"):
        graft([], [], [3, 4], [1, -1])


@st.composite
def token_trees(draw, max_nodes=8, vocab=3):
    """A tree whose siblings carry distinct tokens (what drafters propose)."""
    tokens, parents = [], []
    for _ in range(draw(st.integers(0, max_nodes))):
        p = draw(st.integers(-1, len(tokens) - 1))
        taken = {t for t, q in zip(tokens, parents) if q == p}
        free = [t for t in range(vocab) if t not in taken]
        if not free:
            continue
        tokens.append(draw(st.sampled_from(free)))
        parents.append(p)
    return tokens, parents


def _paths(tokens, parents):
    return {tuple(tokens[j] for j in path_to(i, parents)) for i in range(len(tokens))}


@settings(max_examples=300, deadline=None)
@given(token_trees(), token_trees())
def test_graft_properties(a, b):
    tokens, parents, where = graft(*a, *b)
    depths(parents)  # parents precede children
    assert tokens[: len(a[0])] == a[0] and parents[: len(a[1])] == a[1]  # the first tree keeps its indices
    # Every root path of either tree is a root path of the merged tree, and nothing else is.
    assert _paths(tokens, parents) == _paths(*a) | _paths(*b)
    for i, node in enumerate(where):
        assert [tokens[j] for j in path_to(node, parents)] == [b[0][j] for j in path_to(i, b[1])]
    for kids in children(parents):
        assert len({tokens[k] for k in kids}) == len(kids)  # siblings stay distinct


# ----------------------------------------------------------------------------- the drafter


def _own_nodes(branch: dict, size: int) -> list[int]:
    """Prompt lookup's nodes that the primary tree did not have (they come last in the merged tree)."""
    return [n for n in branch["nodes"] if n >= size - branch["new_nodes"]]


def _pl():
    return PromptLookup(5, 2, max_candidates=2)


@pytest.mark.parametrize("prompt", ["repeat", "random_a", "short"])
@pytest.mark.parametrize("kind", ["eagle", "eagle_pruned", "medusa"])
def test_greedy_merged_tree_equals_autoregressive(tiny_model, trained, oracle_heads, kind, prompt):
    embed = tiny_model.get_input_embeddings()
    primary = {"eagle": lambda: Eagle(trained, embed, 11, 4, 3),
               "eagle_pruned": lambda: Eagle(trained, embed, 11, 4, 3, min_path_prob=0.05),
               "medusa": lambda: medusa_drafter(tiny_model, oracle_heads, "small")}[kind]
    rec = DrafterSpy(Merged(primary(), _pl()))
    out, events = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert out == ar_reference(tiny_model, PROMPTS[prompt])
    for (_, room, prop), event in zip(rec.calls, events[1:]):
        assert len(prop.tokens) <= room
        branch = prop.source["prompt_lookup"]
        assert event.proposed["tokens"] == prop.tokens
        assert all(0 <= n < len(prop.tokens) for n in branch["nodes"])
        json.dumps(event.to_dict())
    if prompt == "repeat":
        # The repeating prompt gives prompt lookup matches every step, and some of its own nodes (not
        # shared with the primary tree) are on accepted paths: the branch is verified, not dropped.
        grafted = [set(_own_nodes(p.source["prompt_lookup"], len(p.tokens))) for _, _, p in rec.calls]
        assert any(grafted)
        assert any(set(e.accepted) & g for e, g in zip(events[1:], grafted)), "no prompt lookup node was ever accepted"


def test_merged_tree_accepts_more_than_either_part_on_a_copy_task(tiny_model, trained):
    """Where the output repeats its prompt, the merged tree commits at least what the better part does."""
    embed = tiny_model.get_input_embeddings()
    prompt = PROMPTS["repeat"]
    steps = {}
    for name, make in {"eagle": lambda: Eagle(trained, embed, 11, 4, 3), "pl": _pl,
                       "merged": lambda: Merged(Eagle(trained, embed, 11, 4, 3), _pl())}.items():
        out, events = run(tiny_model, make(), prompt, max_new_tokens=MAX_NEW)
        assert out == ar_reference(tiny_model, prompt)
        steps[name] = len(events)
    assert steps["merged"] <= min(steps["eagle"], steps["pl"]), steps


def test_sampling_with_a_merged_tree_matches_the_exact_distribution(small_vocab_model):
    module = make_module(small_vocab_model, seed=3, draft_vocab=6)
    embed = small_vocab_model.get_input_embeddings()
    exact = cached("t1", lambda: exact_distribution(small_vocab_model, SAMPLING_PROMPT, T1))
    counts, accepted, drafted = sample_runs(
        small_vocab_model, lambda: Merged(Eagle(module, embed, 6, 3, 2), PromptLookup(3, 2, max_candidates=2)), T1)
    assert drafted > RUNS and accepted > RUNS // 10, (accepted, drafted)
    check_against_exact(counts, exact, "eagle + prompt lookup, merged")


def test_only_deterministic_trees_merge(tiny_model, tiny_draft):
    sampled = Merged(DraftModel(tiny_draft, 3), _pl())
    with pytest.raises(ValueError, match="deterministic draft trees only"):
        run(tiny_model, sampled, PROMPTS["repeat"], sampling=SamplingParams(temperature=1.0, seed=0), max_new_tokens=8)
    with pytest.raises(ValueError, match="deterministic draft trees only"):
        run(tiny_model, Merged(Lookahead(3, 3, 2), _pl()), PROMPTS["repeat"], max_new_tokens=8)


# ----------------------------------------------------------------------------- configs, CLI, web


def test_runtime_config_merges_only_tree_modes(tiny_model, trained):
    pl = NGramDecodingConfig(max_draft_len=7, max_matching_ngram_size=3)
    d = runner.drafter(LoopConfig(EagleDecodingConfig(prompt_lookup=pl)), tiny_model, trained)
    assert isinstance(d, Merged) and isinstance(d.primary, Eagle) and d.name == "eagle" and d.needs_hidden
    assert (d.extra.num_tokens, d.extra.max_ngram) == (7, 3)
    assert not isinstance(runner.drafter(LoopConfig(EagleDecodingConfig()), tiny_model, trained), Merged)
    with pytest.raises(ConfigError, match="prompt_lookup: Extra inputs"):  # only a tree mode's config has the field
        MODES.parse({"speculative_config": {"decoding_type": "Lookahead", "prompt_lookup": {}}})


def test_service_config_nests_an_ngram_config():
    from helpers import checked

    data = {"speculative_config": {"decoding_type": "Eagle", "prompt_lookup": {"max_draft_len": 6, "max_matching_ngram_size": 3,
                                                                               "is_use_oldest": False, "max_candidates": 2}}}
    cfg = runner.to_runtime(MODES.parse(data))
    pl = cfg.speculative_config.prompt_lookup
    assert cfg.mode == "eagle" and (pl.max_draft_len, pl.max_matching_ngram_size, pl.is_use_oldest, pl.max_candidates) == (6, 3, False, 2)
    medusa = runner.to_runtime(MODES.parse({"speculative_config": {"decoding_type": "Medusa", "prompt_lookup": {}}}))
    assert medusa.mode == "medusa" and medusa.speculative_config.prompt_lookup.max_draft_len == 10
    assert runner.to_runtime(MODES.parse({"speculative_config": {"decoding_type": "Eagle"}})).speculative_config.prompt_lookup is None
    with pytest.raises(ConfigError, match="max_draft_len"):
        MODES.parse({"speculative_config": {"decoding_type": "Eagle", "prompt_lookup": {"max_draft_len": 0}}})
    with pytest.raises(ConfigError, match="prompt_lookup"):
        MODES.parse({"speculative_config": {"decoding_type": "Lookahead", "prompt_lookup": {}}})
    with pytest.raises(ConfigError, match="TensorRT-LLM cannot"):
        checked({"backend": "tensorrt_llm", "speculative_config": {"decoding_type": "Eagle", "speculative_model": "x",
                                                                          "prompt_lookup": {}}})


def test_cli_mode_names(monkeypatch):
    from app.cli import build_parser

    args = build_parser().parse_args(["generate", "--prompt", "x", "--prompt-lookup-num-tokens", "4", "--use-newest-match"])
    data = request_data(args, "medusa+prompt_lookup")
    spec = data["speculative_config"]
    assert spec["decoding_type"] == "Medusa" and spec["prompt_lookup"]["max_draft_len"] == 4
    assert spec["prompt_lookup"]["is_use_oldest"] is False
    assert "prompt_lookup" not in request_data(args, "medusa")["speculative_config"]
    with pytest.raises(ConfigError, match="eagle\\+prompt_lookup"):
        request_data(args, "lookahead+prompt_lookup")


def test_cli_rejects_an_unmergeable_mode_with_status_2(capsys):
    from app.cli import main

    assert main(["generate", "--mode", "draft_target+prompt_lookup", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "unknown mode 'draft_target+prompt_lookup'" in err and len(err.strip().splitlines()) == 1


def test_run_tab_request_and_mode_values():
    mode, values = run_settings.mode_values("eagle+prompt_lookup", max_new_tokens=16)
    assert mode == "eagle" and values["eg_pl"] and not values["md_pl"]
    spec = run_settings.to_request(mode, values)["speculative_config"]
    assert spec["prompt_lookup"] == {"max_draft_len": 10, "max_matching_ngram_size": 2, "ngram_draft_lens": [2, 5],
                                     "max_candidates": 1, "is_use_oldest": True}
    newest = run_settings.to_request("prompt_lookup", dict(run_settings.DEFAULTS, pl_oldest=False))["speculative_config"]
    assert newest["is_use_oldest"] is False
    assert "prompt_lookup" not in run_settings.to_request("eagle", dict(run_settings.DEFAULTS))["speculative_config"]
    assert "prompt_lookup" in run_settings.to_request("medusa", dict(run_settings.DEFAULTS, md_pl=True))["speculative_config"]
    with pytest.raises(ConfigError):
        run_settings.mode_values("lookahead+prompt_lookup")
    shown = run_settings.visible("eagle", {"md_pl": False, "eg_pl": True})
    assert [m for m, on in shown.items() if on] == ["prompt_lookup", "eagle"]  # its group and the merged branch's
    assert [m for m, on in run_settings.visible("eagle", {"md_pl": True, "eg_pl": False}).items() if on] == ["eagle"]


def test_labels_and_chart_colours_of_merged_trees():
    from app.ui import charts, lessons

    assert lessons.label("eagle+prompt_lookup") == "EAGLE + prompt lookup" and lessons.label("medusa") == "Medusa"
    assert charts.mode_key("Medusa + prompt lookup") == "medusa+prompt_lookup"
    colours = [MODES.colour(m) for m in MODES.names + MODES.merged]
    assert len(set(colours)) == len(colours)  # every mode and merged tree has its own colour
    fig = charts.compare([{"mode": "EAGLE + prompt lookup", "speedup": 1.7}, {"mode": "EAGLE", "speedup": 1.4}])
    assert list(fig.data[0].y) == ["EAGLE + prompt lookup", "EAGLE"]
    assert fig.data[0].marker.color[0] != fig.data[0].marker.color[1]
    assert run_settings.run_name("eagle", dict(run_settings.DEFAULTS, eg_pl=True)) == "eagle+prompt_lookup"
    assert run_settings.run_name("medusa", dict(run_settings.DEFAULTS, eg_pl=True)) == "medusa"  # the EAGLE box is EAGLE's only


# ----------------------------------------------------------------------------- the step view


def _merged_event():
    # EAGLE drafted 5 -> 6 and 7; prompt lookup copied 5 -> 9 (5 shared, 9 new); 5 and 9 were accepted.
    return {"step": 3, "kind": "decode", "proposed": {"tokens": [5, 7, 6, 9], "parents": [-1, -1, 0, 0]},
            "accepted": [0, 3], "rejected": [1, 2], "accepted_tokens": [5, 9], "added_token": 4, "added_kind": "correction",
            "tokens": [5, 9, 4], "draft_time_s": 0.001, "verify_time_s": 0.03, "totals": {},
            "source": {"tree": {"tokens": [5, 7, 6], "parents": [-1, -1, 0], "scores": [-0.1, -1.2, -0.9]},
                       "depth": 4, "top_k": 3, "total_tokens": 12,
                       "prompt_lookup": {"match": {"ngram": [8], "position": 1, "in_prompt": True, "continuation_position": 2},
                                         "matches": [], "nodes": [0, 3], "new_nodes": 1}}}


def test_step_detail_marks_the_prompt_lookup_branch():
    texts = {4: "<b>", 5: "a", 6: "b", 7: "c", 8: "<script>", 9: "d"}
    html = render.step_detail(_merged_event(), texts, [1, 8, 5, 9], [], "eagle+prompt_lookup")
    assert html.count('class="node copied') == 2  # the shared node and the new one
    assert "PL" in html and "from prompt lookup" in html
    assert "Merged with prompt lookup" in html and "1 new node(s), 1 shared" in html and "2 of them were accepted" in html
    assert "EAGLE-2 dynamic tree" in html  # the primary's own explanation stays
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_tree_svg_without_copied_nodes_is_unchanged():
    plain = render.tree_svg([5, 6], [-1, 0], [0], {5: "a", 6: "b"}, q=[0.9, 0.6])
    assert "copied" not in plain and "PL" not in plain


# ----------------------------------------------------------------------------- the bundled model


@pytest.mark.bundled
@pytest.mark.parametrize("mode", ["medusa", "eagle"])
def test_bundled_merged_trees_are_lossless_and_copy(bundled, spec_bench_prompts, mode):
    """float32, greedy, the shipped heads / module: identical to autoregressive, and on prompts whose answer
    copies from the context some prompt lookup nodes of their own are accepted."""
    cfg = LoopConfig(MODES[mode].config(prompt_lookup=NGramDecodingConfig()), max_new_tokens=MAX_NEW)
    companion = runner.load_companion(cfg, bundled)
    ar_cfg = LoopConfig(max_new_tokens=MAX_NEW)
    copied = 0
    for category in ("writing", "summarization", "extraction"):
        ids = bundled.encode(spec_bench_prompts[category])
        ref = runner.output_ids(list(runner.run(bundled, ar_cfg, ids)))
        events = list(runner.run(bundled, cfg, ids, companion))
        assert runner.output_ids(events) == ref, f"{mode} + prompt lookup differs from autoregressive on {category}"
        for e in events[1:]:
            copied += len(set(e.accepted) & set(_own_nodes(e.source["prompt_lookup"], len(e.proposed["tokens"]))))
    assert copied > 0
