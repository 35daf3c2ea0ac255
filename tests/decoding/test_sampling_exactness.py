"""End to end: speculative sampling through generate() samples exactly the target's distribution.

A tiny model with an 8-token vocabulary makes the exact distribution of the first three generated
tokens computable by enumeration (one batched forward over every two-token continuation); the
empirical distribution over many seeds must match it, and match plain autoregressive sampling.
"""

import numpy as np
import pytest
import torch

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.drafters.suffix import Suffix
from app.decoding.sampling import SamplingParams
from helpers import chisquare_two_sample, marginal, run
from helpers_decoding import PROMPT, P_MIN, RUNS, T1, WARPED, cached, check_against_exact, exact_distribution, sample_runs

MODES = {
    "prompt_lookup": lambda m, d: PromptLookup(3, 2),
    "lookahead": lambda m, d: Lookahead(3, 3, 3),
    "suffix": lambda m, d: Suffix(3, 8, 1.0, 0.1),
    "suffix_tree": lambda m, d: Suffix(3, 8, 2.0, 0.0, use_tree_spec=True),  # deterministic trees: recursive rejection
    "draft_target": lambda m, d: DraftModel(d, 3),
    # q is zero outside a 5-token draft vocabulary (ids 0, 2, 3, 5, 6 of 8): Leviathan stays exact
    "draft_target_reduced_vocab": lambda m, d: DraftModel(d, 3, d2t=torch.tensor([0, 1, 1, 2, 2])),
}


@pytest.fixture(scope="module")
def exact_t1(small_vocab_model):
    return exact_distribution(small_vocab_model, PROMPT, T1)


@pytest.fixture(scope="module")
def ar_t1(small_vocab_model):
    counts, _, _ = sample_runs(small_vocab_model, Autoregressive, T1, seed0=10**6)
    return counts


def test_exact_distribution_is_not_degenerate(exact_t1):
    """The test model's distributions are neither one-hot nor uniform, so the tests below have power."""
    first = marginal(exact_t1, 1)
    assert abs(sum(exact_t1.values()) - 1) < 1e-9
    assert 0.3 < max(first.values()) < 0.95
    assert sum(1 for v in exact_t1.values() if v > 0.005) > 20


def test_autoregressive_sampling_matches_exact(exact_t1, ar_t1):
    check_against_exact(ar_t1, exact_t1, "autoregressive")


@pytest.mark.parametrize("mode", list(MODES))
def test_speculative_sampling_matches_exact_and_autoregressive(small_vocab_model, small_vocab_draft, exact_t1, ar_t1, mode):
    make = MODES[mode]
    counts, accepted, drafted = sample_runs(small_vocab_model, lambda: make(small_vocab_model, small_vocab_draft), T1)
    # The runs really speculate: drafts are proposed and some of them are accepted.
    assert drafted > RUNS and accepted > RUNS // 20, (accepted, drafted)
    check_against_exact(counts, exact_t1, mode)
    _, _, p_two = chisquare_two_sample(counts, ar_t1)
    assert p_two > P_MIN, f"{mode} vs autoregressive samples: chi-square p {p_two:.1e}"


@pytest.mark.parametrize("mode", ["draft_target", "draft_target_reduced_vocab", "prompt_lookup"])
def test_speculative_sampling_with_top_k_top_p(small_vocab_model, small_vocab_draft, mode):
    """temperature 0.8, top_k 5, top_p 0.9: target and draft distributions are both warped alike."""
    exact = cached("warped", lambda: exact_distribution(small_vocab_model, PROMPT, WARPED))
    make = MODES[mode]
    counts, accepted, _ = sample_runs(small_vocab_model, lambda: make(small_vocab_model, small_vocab_draft), WARPED, runs=1500)
    assert accepted > 100
    check_against_exact(counts, exact, f"{mode} {WARPED}")
    # Tokens outside top-k / top-p never appear.
    assert all(exact[k] > 0 for k in counts), [k for k in counts if exact[k] == 0]


def test_statistical_check_detects_a_biased_sampler(small_vocab_model, exact_t1):
    """Sampling at temperature 0.8 instead of 1 must be flagged against the temperature-1 target."""
    counts, _, _ = sample_runs(small_vocab_model, Autoregressive, dict(temperature=0.8), runs=1000)
    with pytest.raises(AssertionError):
        check_against_exact(counts, exact_t1, "biased")


# ----------------------------------------------------------------------------- determinism

ALL_MODES = {"autoregressive": lambda m, d: Autoregressive(), **MODES}


@pytest.mark.parametrize("mode", list(ALL_MODES))
def test_same_seed_same_output(tiny_model, tiny_draft, mode):
    make = ALL_MODES[mode]
    prompt = [5, 6, 7, 8] * 5 + [9, 10]

    def go(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        out, events = run(tiny_model, make(tiny_model, tiny_draft), prompt, sampling=params, max_new_tokens=24)
        trace = [(e.proposed, e.accepted, e.tokens, e.added_kind) for e in events]
        return out, trace

    a, b = go(1234), go(1234)
    assert a == b
    outputs = {tuple(go(seed)[0]) for seed in range(4)}
    assert len(outputs) > 1, "different seeds should give different samples"


def test_sampled_output_is_a_valid_sequence(small_vocab_model):
    """Sanity for the enumeration: tokens with zero probability under top-k never show up."""
    params = dict(temperature=1.0, top_k=2)
    exact = exact_distribution(small_vocab_model, PROMPT, params)
    counts, _, _ = sample_runs(small_vocab_model, lambda: PromptLookup(3, 2), params, runs=200)
    assert all(exact[k] > 0 for k in counts)
    assert np.isclose(sum(exact.values()), 1.0)
