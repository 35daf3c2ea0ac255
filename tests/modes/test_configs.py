"""Typed configs with TensorRT-LLM's names: every rule, its message, translations, and fuzzing."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import runner
from app.modes import MODES, ConfigError
from app.modes import configs as c
from app.backends.tensorrt_llm import backend as trt
from helpers import checked




def la(w, n, g, **kw):
    return {"speculative_config": {"decoding_type": "Lookahead", "max_window_size": w, "max_ngram_size": n,
                                   "max_verification_set_size": g, **kw}}


INVALID = {
    "lookahead W 0": (la(0, 3, 4), "max_window_size (W) must be in [1, 256], got 0"),
    "lookahead N 0": (la(4, 0, 4), "max_ngram_size (N) must be in [1, 256], got 0"),
    "lookahead G negative": (la(4, 3, -1), "max_verification_set_size (G) must be in [0, 256], got -1"),
    "lookahead N 1 with window": (la(4, 1, 0), "requires a window size of 1"),
    "lookahead N 1 with G": (la(1, 1, 2), "requires a verification set size of 0"),
    "lookahead too big": (la(60, 8, 60), "limit of 256"),
    "lookahead request above engine": (la(4, 3, 4, request=(5, 3, 4)), "exceeds the engine's"),
    "lookahead request illegal": (la(4, 3, 4, request=(2, 1, 0)), "per-request"),
    "ngram draft 0": ({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 0}}, "max_draft_len (prompt_lookup_num_tokens) must be in [1, 256]"),
    "ngram ngram 0": ({"speculative_config": {"decoding_type": "NGram", "max_matching_ngram_size": 0}}, "max_matching_ngram_size"),
    "ngram caps negative": ({"speculative_config": {"decoding_type": "NGram", "ngram_draft_lens": [2, -1]}}, "non-negative"),
    "draft_target 0": ({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 0}}, "max_draft_len must be in [1, 256], got 0"),
    "medusa deeper than heads": ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "greedy_63", "num_medusa_heads": 3}}, "only 3 heads"),
    "medusa orphan path": ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": [[0], [1, 0]]}}, "no parent path"),
    "medusa unknown tree": ({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "nope"}}, "unknown tree"),
    "medusa threshold": ({"speculative_config": {"decoding_type": "Medusa", "posterior_threshold": 0}}, "posterior_threshold"),
    "eagle draft 0": ({"speculative_config": {"decoding_type": "Eagle", "max_total_draft_tokens": 0}}, "max_total_draft_tokens (eagle_total_tokens - 1) must be in [1, 256]"),
    "eagle too long": ({"speculative_config": {"decoding_type": "Eagle", "max_total_draft_tokens": 300}}, "256"),
    "eagle both trees": ({"speculative_config": {"decoding_type": "Eagle", "eagle_choices": "small"}}, "not both"),
    "eagle static too big": ({"speculative_config": {"decoding_type": "Eagle", "use_dynamic_tree": False, "eagle_choices": "greedy_63", "max_total_draft_tokens": 10}}, "63 nodes"),
    "eagle top k 0": ({"speculative_config": {"decoding_type": "Eagle", "dynamic_tree_max_topK": 0}}, "dynamic_tree_max_topK"),
    "medusa prune 1": ({"speculative_config": {"decoding_type": "Medusa", "min_path_prob": 1.0}}, "min_path_prob must be in [0, 1)"),
    "eagle prune negative": ({"speculative_config": {"decoding_type": "Eagle", "min_path_prob": -0.1}}, "min_path_prob"),
    "eagle prune static": ({"speculative_config": {"decoding_type": "Eagle", "use_dynamic_tree": False, "eagle_choices": "small", "max_total_draft_tokens": 20, "min_path_prob": 0.1}}, "keeps its shape"),
    "trtllm prune": ({"backend": "tensorrt_llm", "speculative_config": {"decoding_type": "Eagle", "speculative_model": "x", "min_path_prob": 0.1}}, "TensorRT-LLM has no such setting"),
    "unknown decoding type": ({"speculative_config": {"decoding_type": "Nope"}}, "does not match"),
    "unknown field": ({"speculative_config": {"decoding_type": "NGram", "max_window_size": 3}}, "Extra inputs"),
    "temperature negative": ({"sampling": {"temperature": -1}}, "temperature"),
    "temperature nan": ({"sampling": {"temperature": float("nan")}}, "temperature"),
    "top_p 0": ({"sampling": {"top_p": 0}}, "top_p"),
    "top_k negative": ({"sampling": {"top_k": -1}}, "top_k"),
    "beam width 2": ({"sampling": {"beam_width": 2}}, "beam width 1"),
    "max_new_tokens 0": ({"max_new_tokens": 0}, "max_new_tokens"),
    "temperature too small to sample": ({"sampling": {"temperature": 1.1e-308}}, "temperature must be 0 (greedy) or at least 0.001"),
    "trtllm lookahead G=0": ({**la(1, 1, 0), "backend": "tensorrt_llm"}, "lookahead (W, N, G) = (1, 1, 0): TensorRT-LLM's LookaheadDecodingConfig takes positive integers only"),
    "trtllm lookahead request g=0": ({**la(4, 3, 4, request=(2, 2, 0)), "backend": "tensorrt_llm"}, "per-request (w, n, g) = (2, 2, 0): TensorRT-LLM's LookaheadDecodingConfig takes positive integers only"),
    "trtllm lookahead on pytorch": ({**la(4, 3, 4), "backend": "tensorrt_llm", "trtllm_backend": "pytorch"}, "only on its tensorrt backend"),
    "trtllm ngram on engine": ({"speculative_config": {"decoding_type": "NGram"}, "backend": "tensorrt_llm", "trtllm_backend": "tensorrt"}, "only on its pytorch backend"),
    "trtllm draft_target on engine": ({"speculative_config": {"decoding_type": "Draft_Target"}, "backend": "tensorrt_llm", "trtllm_backend": "tensorrt"}, "pytorch backend"),
    "trtllm medusa sampling": ({"speculative_config": {"decoding_type": "Medusa"}, "backend": "tensorrt_llm", "sampling": {"temperature": 0.7}}, "token match only"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_configs_get_one_clear_sentence(case):
    data, fragment = INVALID[case]
    with pytest.raises(ConfigError) as err:
        checked(data)
    message = str(err.value)
    assert fragment in message and "\n" not in message, message


@pytest.mark.parametrize(
    "wng, draft_len",
    [((4, 3, 4), 15), ((7, 7, 7), 83), ((4, 4, 4), 23), ((1, 1, 0), 0), ((2, 2, 1), 2), ((5, 3, 5), 19)],
)
def test_lookahead_max_draft_len_formula(wng, draft_len):
    r = MODES.parse(la(*wng))
    cfg = r.speculative_config
    assert cfg.max_total_draft_tokens == draft_len
    assert cfg.calculate_speculative_resource() == (draft_len + 1, wng[1], draft_len, wng[1] - 1)
    drafter = runner.drafter(runner.to_runtime(r))
    assert (drafter.w, drafter.n, drafter.g) == wng


VALID = [
    {},
    la(4, 3, 4, request=(2, 2, 1)),
    la(1, 1, 0),
    {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 10, "max_matching_ngram_size": 3}},
    {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": "x"}},
    {"speculative_config": {"decoding_type": "Medusa", "medusa_choices": [[0], [0, 0], [1]], "num_medusa_heads": 2}},
    {"speculative_config": {"decoding_type": "Eagle", "use_dynamic_tree": False, "eagle_choices": "small", "max_total_draft_tokens": 8}},
    {"speculative_config": {"decoding_type": "Eagle", "speculative_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
     "backend": "tensorrt_llm", "trtllm_backend": "pytorch"},
    {"sampling": {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 3}, "max_new_tokens": 7},
]


@pytest.mark.parametrize("data", VALID)
def test_valid_configs_translate_to_the_runtime_and_to_tensorrt_llm(data):
    r = MODES.parse(data)
    runtime = runner.to_runtime(r)
    assert runtime.mode == r.mode and runtime.max_new_tokens == r.max_new_tokens
    spec = trt.trtllm_speculative_config(r)
    if r.mode == "autoregressive":
        assert spec is None
    else:
        assert spec["decoding_type"] == MODES[r.mode].decoding_type
        if r.mode == "eagle":  # max_draft_len is the drafting steps (the depth), there and here; the nodes stay ours
            sc = r.speculative_config
            depth = sc.num_eagle_layers if sc.eagle_choices is None else max(map(len, spec["eagle_choices"]))
            assert spec["max_draft_len"] == sc.max_draft_len == depth > 0 and "num_eagle_layers" not in spec
        elif r.mode == "medusa":  # its engine's max_draft_len holds every draft token of a step: the tree's nodes
            assert spec["max_draft_len"] == r.speculative_config.max_total_draft_tokens > 0
        elif "max_draft_len" in spec:
            assert spec["max_draft_len"] == r.speculative_config.max_draft_len > 0
    plan = trt.trtllm_build_plan(r, "ckpt", "out")
    assert plan[:5] == ["trtllm-build", "--checkpoint_dir", "ckpt", "--output_dir", "out"] and "--max_beam_width" in plan


def test_translations_carry_every_field():
    r = MODES.parse({"speculative_config": {"decoding_type": "Medusa", "medusa_choices": "small", "typical_acceptance": True}})
    spec = trt.trtllm_speculative_config(r)
    assert spec["max_draft_len"] == len(spec["medusa_choices"]) == 8
    assert runner.to_runtime(r).speculative_config.typical_acceptance
    r = MODES.parse({"speculative_config": {"decoding_type": "Eagle", "max_total_draft_tokens": 11, "num_eagle_layers": 3, "dynamic_tree_max_topK": 2}})
    plan = trt.trtllm_build_plan(r, "a", "b")
    # The engine TensorRT-LLM's LLM API would build: build_config.max_draft_len = the max_draft_len sent, the depth 3
    # (llm_args.py validate_speculative_config), not this app's 11 tree nodes.
    assert plan[plan.index("--speculative_decoding_mode") + 1] == "eagle" and plan[plan.index("--max_draft_len") + 1] == "3"
    assert trt.trtllm_engine_draft_len(r) == trt.trtllm_speculative_config(r)["max_draft_len"] == 3
    r = MODES.parse({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 7}})
    assert runner.drafter(runner.to_runtime(r)).num_tokens == 7
    assert "--use_paged_context_fmha" in trt.trtllm_build_plan(r, "a", "b")


def test_tree_pruning_unset_is_the_transformers_default_and_none_on_tensorrt_llm():
    def runtime(**spec):
        return runner.to_runtime(MODES.parse({"speculative_config": spec})).speculative_config

    assert runtime(decoding_type="Medusa").pruning == c.MIN_PATH_PROB > 0
    assert runtime(decoding_type="Eagle").pruning == c.MIN_PATH_PROB
    assert runtime(decoding_type="Eagle", min_path_prob=0).pruning == 0
    assert runtime(decoding_type="Medusa", min_path_prob=0.2).pruning == 0.2
    static = runtime(decoding_type="Eagle", use_dynamic_tree=False, eagle_choices="small", max_draft_len=20)
    assert static.pruning == 0  # a static tree keeps its shape
    on_trt = {"backend": "tensorrt_llm", "speculative_config": {"decoding_type": "Eagle", "speculative_model": "x"}}
    assert "min_path_prob" not in trt.trtllm_speculative_config(MODES.parse(on_trt))
    with pytest.raises(ConfigError, match="TensorRT-LLM has no such setting"):
        checked({**on_trt, "speculative_config": {**on_trt["speculative_config"], "min_path_prob": c.MIN_PATH_PROB}})


def test_context_rules():
    c.check_context(10, 5, 2048)
    with pytest.raises(ConfigError, match="empty"):
        c.check_context(0, 5, 2048)
    with pytest.raises(ConfigError, match="shorten"):
        c.check_context(4096, 5, 2048)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(
    ["max_window_size", "max_ngram_size", "max_verification_set_size", "max_draft_len", "max_matching_ngram_size",
     "medusa_choices", "num_medusa_heads", "eagle_choices", "use_dynamic_tree", "dynamic_tree_max_topK", "request",
     "num_eagle_layers", "posterior_threshold", "ngram_draft_lens", "speculative_model"]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    decoding_type=st.sampled_from([m.decoding_type for m in MODES] + ["x"]),
    spec=st.dictionaries(fields, json_values | st.integers(-3, 300), max_size=5),
    top=st.dictionaries(st.sampled_from(["max_new_tokens", "backend", "trtllm_backend", "sampling"]), json_values, max_size=3),
)
def test_the_validator_never_crashes(decoding_type, spec, top):
    """Whatever arrives, the answer is a checked request or a ConfigError on one line — never another exception."""
    data = {"speculative_config": {"decoding_type": decoding_type, **spec}, **top}
    try:
        r = checked(data)
    except ConfigError as err:
        assert str(err) and "\n" not in str(err)
        return
    runner.to_runtime(r)
    if MODES[r.mode].trtllm:
        trt.trtllm_speculative_config(r)
    else:  # a mode TensorRT-LLM lacks says so
        with pytest.raises(ConfigError, match="TensorRT-LLM has no"):
            trt.trtllm_speculative_config(r)


def test_what_tensorrt_llm_does_not_take_is_said():
    """trtllm_notes: this app's own settings upstream has no field for, and EAGLE's other meaning of max_draft_len."""
    def notes(spec, **top):
        return trt.trtllm_notes(MODES.parse({"speculative_config": spec, "backend": "tensorrt_llm", **top}))

    assert notes({"decoding_type": "NGram", "ngram_draft_lens": [], "max_candidates": 1}) == []  # TensorRT-LLM's behaviour
    assert "max_candidates (2) and ngram_draft_lens (2, 5)" in notes({"decoding_type": "NGram", "max_candidates": 2})[0]
    assert notes({"decoding_type": "Lookahead"}) == [], "TensorRT-LLM seeds its pool from the prompt too"
    assert "always seeds its n-gram pool from the prompt" in notes({"decoding_type": "Lookahead", "pool_from_prompt": False})[0]
    eagle = notes({"decoding_type": "Eagle", "speculative_model": "x", "num_eagle_layers": 4})
    assert "sent as 4" in eagle[0] and "total tokens (24) and top-K (4) are not sent" in eagle[1]
    engine = notes({"decoding_type": "Eagle", "speculative_model": "x", "num_eagle_layers": 4}, trtllm_backend="tensorrt")
    assert "the engine holds 4 draft tokens per step, not the tree's 23" in engine[1]


def test_what_the_user_typed_is_quoted_on_one_line():
    """A newline or other control character the user gave reads escaped in the message, which stays one line, and a
    long value is cut (an API client may send anything; a status line and a log line take one line)."""
    from app.modes.errors import one_line
    from app.modes.notation import int_list, medusa_choices, parse_triple
    assert one_line("a\nb\tc\x00") == "a\\nb\\tc\\x00" and one_line("ü ✓ 漢") == "ü ✓ 漢"
    assert one_line("x" * 50) == "x" * 40 + "…" and one_line("x" * 50, None) == "x" * 50
    for call in (lambda: int_list("2,\nx", "ngram_draft_lens"), lambda: parse_triple("4\nx,3,4", "lookahead"),
                 lambda: medusa_choices("[[0],\n[x]]"), lambda: medusa_choices("mc_sim\n7b")):
        with pytest.raises(ConfigError) as err:
            call()
        assert "\n" not in str(err.value) and "\\n" in str(err.value)
    with pytest.raises(ConfigError) as err:
        checked({"speculative_config": {"decoding_type": "Autoregressive"}, "sampling": {"top\nk": 1}})
    assert str(err.value).startswith("sampling.top\\nk:")
