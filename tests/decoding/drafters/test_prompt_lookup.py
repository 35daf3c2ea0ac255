"""Prompt lookup's incremental n-gram index finds exactly what a search of the whole context finds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.decoding.drafters.prompt_lookup import NgramIndex, PromptLookup


def search(ids: list[int], max_ngram: int, oldest: bool) -> list[tuple[int, int]]:
    """Every earlier occurrence of each suffix n-gram, by brute force, in the index's order."""
    size = len(ids)
    found = []
    for n in range(min(max_ngram, size - 1), 0, -1):
        starts = [s for s in range(size - n) if ids[s : s + n] == ids[size - n :]]
        found += [(s, n) for s in (starts if oldest else starts[::-1])]
    return found


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 60), max_size=8),
    max_ngram=st.integers(1, 4),
    oldest=st.booleans(),
)
def test_index_grown_step_by_step_matches_a_full_search(tokens, cuts, max_ngram, oldest):
    index = NgramIndex(max_ngram)
    for end in sorted({min(c, len(tokens)) for c in cuts} | {len(tokens)}):
        ids = tokens[:end]
        assert list(index.matches(ids, max_ngram, oldest)) == search(ids, max_ngram, oldest)


def test_index_handed_another_sequence_starts_over():
    index = NgramIndex(2)
    list(index.matches([1, 2, 3, 1, 2], 2))
    other = [7, 8, 7, 8, 9, 7]
    assert list(index.matches(other, 2)) == search(other, 2, True)
    shorter = [7, 8, 7]
    assert list(index.matches(shorter, 2)) == search(shorter, 2, True)


def test_drafter_reused_without_start_still_drafts_from_its_context():
    drafter = PromptLookup(3, 2, ngram_draft_lens=())
    drafter.propose([5, 6, 7, 8, 5, 6], room=10)
    prop = drafter.propose([1, 2, 3, 4, 1, 2], room=10)
    assert prop.tokens == [3, 4, 1] and prop.source["match"]["position"] == 0
