"""probs() (temperature, top-k, top-p) against an independent numpy reference; SamplingParams validation."""

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.decoding.sampling import SamplingParams, argmax, probs, sample, uniform
from helpers import reference_probs as reference


LOGITS = np.array([2.0, -1.0, 0.5, 3.0, 0.0, -2.5, 1.0, 0.25])


def run(logits, **kw):
    return probs(torch.tensor(logits, dtype=torch.float32), SamplingParams(**kw)).double().numpy()


# ----------------------------------------------------------------------------- probs()


def test_temperature_one_is_softmax():
    out = run(LOGITS, temperature=1.0)
    np.testing.assert_allclose(out, np.exp(LOGITS) / np.exp(LOGITS).sum(), atol=1e-6)


@pytest.mark.parametrize("temperature", [0.1, 0.5, 0.7, 1.0, 1.5, 4.0])
def test_temperature(temperature):
    np.testing.assert_allclose(run(LOGITS, temperature=temperature), reference(LOGITS, temperature), atol=1e-6)


def test_low_temperature_concentrates_and_high_flattens():
    cold, hot = run(LOGITS, temperature=0.05), run(LOGITS, temperature=100.0)
    assert cold[3] > 0.999
    assert hot.max() - hot.min() < 0.05


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 7, 8, 100])
def test_top_k(top_k):
    out = run(LOGITS, temperature=1.0, top_k=top_k)
    assert (out > 0).sum() == min(top_k, len(LOGITS))
    assert out.argmax() == LOGITS.argmax()
    np.testing.assert_allclose(out, reference(LOGITS, 1.0, top_k=top_k), atol=1e-6)


def test_top_k_one_is_one_hot_on_argmax():
    out = run(LOGITS, temperature=0.8, top_k=1)
    expected = np.zeros_like(LOGITS)
    expected[LOGITS.argmax()] = 1.0
    np.testing.assert_allclose(out, expected, atol=1e-7)


# softmax(LOGITS) sorted has cumulative masses 0.581, 0.795, 0.873, 0.921, 0.958, 0.987, 0.998, 1.
# top_p values are chosen away from them, where float rounding could go either way.
@pytest.mark.parametrize(
    "top_p, kept", [(1e-6, 1), (0.3, 1), (0.6, 2), (0.7, 2), (0.85, 3), (0.9, 4), (0.94, 5), (0.97, 6), (0.99, 7), (0.9999, 8)]
)
def test_top_p(top_p, kept):
    out = run(LOGITS, temperature=1.0, top_p=top_p)
    assert (out > 0).sum() == kept
    np.testing.assert_allclose(out, reference(LOGITS, 1.0, top_p=top_p), atol=1e-6)


def test_top_p_keeps_the_top_token_even_when_it_alone_exceeds_top_p():
    logits = np.array([10.0, 0.0, 0.0])
    out = run(logits, temperature=1.0, top_p=0.01)
    np.testing.assert_allclose(out, [1.0, 0.0, 0.0], atol=1e-7)


def test_top_k_then_top_p():
    # top_k=4 leaves 3.0, 2.0, 1.0, 0.5 whose renormalised masses are 0.63, 0.23, 0.09, 0.05.
    out = run(LOGITS, temperature=1.0, top_k=4, top_p=0.9)
    assert (out > 0).sum() == 3
    np.testing.assert_allclose(out, reference(LOGITS, 1.0, top_k=4, top_p=0.9), atol=1e-6)


def test_batched_rows_are_independent():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 32, generator=g) * 3
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.8)
    out = probs(logits, params)
    assert out.shape == logits.shape
    for row in range(6):
        torch.testing.assert_close(out[row], probs(logits[row], params))
        np.testing.assert_allclose(out[row].double().numpy(), reference(logits[row].numpy(), 0.7, 10, 0.8), atol=1e-6)


def test_output_is_float32_for_bfloat16_logits():
    out = probs(torch.tensor(LOGITS, dtype=torch.bfloat16), SamplingParams(temperature=1.0))
    assert out.dtype == torch.float32
    assert math.isclose(float(out.sum()), 1.0, abs_tol=1e-5)


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=12),
    temperature=st.floats(0.1, 3.0),
    top_k=st.integers(0, 14),
    top_p=st.floats(0.01, 1.0),
)
# Logits a denormal apart are equal once divided by the temperature: either may be the one kept.
@example(logits=[0.0, 1.0635553915134634e-45], temperature=2.0, top_k=1, top_p=1.0)
@example(logits=[0.0, 1.0635553915134634e-45], temperature=2.0, top_k=0, top_p=0.5)
@example(logits=[0.0, 0.0, -1.0635553915134634e-45, 0.0], temperature=2.0, top_k=0, top_p=0.75)
def test_probs_properties(logits, temperature, top_k, top_p):
    x = torch.tensor(logits, dtype=torch.float32)
    out = probs(x, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    z = x / temperature  # what the filters rank, in float32 (ties here are ties for them too)
    assert torch.isfinite(out).all() and (out >= 0).all()
    assert math.isclose(float(out.sum()), 1.0, abs_tol=1e-5)
    # A most likely token is always kept.
    assert float(out[z == z.max()].max()) > 0
    kept = out > 0
    if top_k:
        # Ties at the k-th value may keep more than k tokens, never anything below it.
        kth = torch.sort(z, descending=True).values[min(top_k, len(logits)) - 1]
        assert bool((z[kept] >= kth).all())
    # Masses match: kept tokens keep their relative probabilities (softmax(x / T) restricted).
    base = (x.double() / temperature).softmax(-1)
    expected = base * kept / (base * kept).sum()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)
    # The kept set is a head of the distribution: nothing dropped is more likely than something kept.
    if (~kept).any():
        assert float(z[kept].min()) >= float(z[~kept].max())


# ----------------------------------------------------------------------------- sample / uniform


def test_sample_and_uniform():
    g = torch.Generator().manual_seed(0)
    assert all(sample(torch.tensor([0.0, 0.0, 1.0, 0.0]), g) == 2 for _ in range(20))
    draws = [uniform(g) for _ in range(1000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert 0.45 < sum(draws) / len(draws) < 0.55


# ----------------------------------------------------------------------------- SamplingParams


def test_defaults_are_greedy():
    params = SamplingParams()
    assert params.greedy
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.0, 1.0, 0, None)
    assert not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": -1e-9}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_invalid_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature", [float("nan")])
def test_nan_temperature_is_rejected(temperature):
    try:
        SamplingParams(temperature=temperature)
    except ValueError as err:
        assert "temperature" in str(err)
    else:
        raise AssertionError(f"SamplingParams(temperature={temperature}) was accepted")


def test_valid_edge_params():
    SamplingParams(temperature=0.0, top_p=1.0, top_k=0)
    SamplingParams(temperature=2.0, top_p=1e-9, top_k=1, seed=0)


def test_generator_is_seeded():
    a, b = SamplingParams(temperature=1.0, seed=123).generator(), SamplingParams(temperature=1.0, seed=123).generator()
    assert torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))
    c = SamplingParams(temperature=1.0, seed=124).generator()
    d, e = SamplingParams(temperature=1.0).generator(), SamplingParams(temperature=1.0).generator()
    assert not torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=c))
    assert not torch.equal(torch.rand(8, generator=d), torch.rand(8, generator=e))


# ----------------------------------------------------------------------------- argmax


@pytest.mark.parametrize("vocab", [49152, 32000, 8192, 1000, 96, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_equals_torch_argmax(vocab, dtype):
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(13, vocab, generator=gen).to(dtype)
    assert torch.equal(argmax(x), x.float().argmax(-1))
    assert argmax(x[4]).shape == () and int(argmax(x[4])) == int(x[4].float().argmax())


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_argmax_takes_the_first_of_tied_maxima(data):
    """bfloat16 logits tie often; greedy decoding must pick exactly what torch.argmax picks."""
    vocab = data.draw(st.sampled_from([1024, 4096, 49152]))
    rows = data.draw(st.integers(1, 9))  # up to 4 rows take torch's argmax, more the blockwise search
    x = torch.zeros(rows, vocab)
    for r in range(rows):
        where = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4, unique=True))
        x[r, where] = data.draw(st.sampled_from([1.0, -0.5, float("inf")]))
    assert torch.equal(argmax(x), x.argmax(-1))
    assert torch.equal(argmax(-x), (-x).argmax(-1))
