"""Token trees as parent lists: checked against hand-built trees and random ones."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.decoding.target import ancestor_mask
from app.decoding.tree import children, depths, from_paths, is_chain, leaf_paths, path_to, trie

#            root
#          /      \
#        n0        n1
#       /  \        |
#     n2    n3      n4
#     |
#     n5
TREE = [-1, -1, 0, 0, 1, 2]


@st.composite
def random_trees(draw, max_nodes=12):
    n = draw(st.integers(0, max_nodes))
    return [draw(st.integers(-1, i - 1)) for i in range(n)]


# ----------------------------------------------------------------------------- depths / is_chain


def test_depths_hand_built():
    assert depths(TREE) == [1, 1, 2, 2, 2, 3]
    assert depths([]) == []
    assert depths([-1, 0, 1, 2]) == [1, 2, 3, 4]
    assert depths([-1, -1, -1]) == [1, 1, 1]


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-1, 0, 5]])
def test_depths_rejects_parent_after_child(parents):
    with pytest.raises(ValueError, match="parent"):
        depths(parents)


def test_is_chain():
    assert is_chain([])
    assert is_chain([-1])
    assert is_chain([-1, 0, 1, 2])
    assert not is_chain([-1, -1])
    assert not is_chain([-1, 0, 0])
    assert not is_chain(TREE)


# ----------------------------------------------------------------------------- ancestor_mask


def test_ancestor_mask_hand_built():
    T, F = True, False
    expected = torch.tensor(
        [
            # root n0 n1 n2 n3 n4 n5
            [T, F, F, F, F, F, F],  # root
            [T, T, F, F, F, F, F],  # n0
            [T, F, T, F, F, F, F],  # n1
            [T, T, F, T, F, F, F],  # n2
            [T, T, F, F, T, F, F],  # n3
            [T, F, T, F, F, T, F],  # n4
            [T, T, F, T, F, F, T],  # n5
        ]
    )
    mask = ancestor_mask(TREE)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_ancestor_mask_of_chain_is_causal():
    n = 5
    assert torch.equal(ancestor_mask(list(range(-1, n - 1))), torch.ones(n + 1, n + 1, dtype=torch.bool).tril())


def test_ancestor_mask_empty_tree_is_root_only():
    assert torch.equal(ancestor_mask([]), torch.ones(1, 1, dtype=torch.bool))


# ----------------------------------------------------------------------------- children / path_to / leaf_paths


def test_children_hand_built():
    assert children(TREE) == [[0, 1], [2, 3], [4], [5], [], [], []]
    assert children([]) == [[]]
    assert children([-1, 0]) == [[0], [1], []]


def test_path_to_hand_built():
    assert path_to(-1, TREE) == []
    assert path_to(0, TREE) == [0]
    assert path_to(4, TREE) == [1, 4]
    assert path_to(5, TREE) == [0, 2, 5]


def test_leaf_paths_hand_built():
    paths = leaf_paths(TREE)
    assert sorted(paths) == sorted([[0, 3], [1, 4], [0, 2, 5]])
    assert len(paths) == 3
    assert leaf_paths([]) == []
    assert leaf_paths([-1, 0, 1]) == [[0, 1, 2]]
    assert sorted(leaf_paths([-1, -1, -1])) == [[0], [1], [2]]


@settings(max_examples=200, deadline=None)
@given(random_trees())
def test_tree_functions_agree(parents):
    """depths, ancestor_mask, children, path_to and leaf_paths describe the same tree."""
    n = len(parents)
    d = depths(parents)
    mask = ancestor_mask(parents)
    kids = children(parents)
    assert mask.shape == (n + 1, n + 1)
    assert mask[:, 0].all()
    for i in range(n):
        path = path_to(i, parents)
        assert path[-1] == i
        assert len(path) == d[i]
        assert all(parents[b] == a for a, b in zip(path, path[1:]))
        assert parents[path[0]] == -1
        # Row i+1 of the mask: the root, the ancestors and i itself, nothing else.
        assert mask[i + 1].nonzero().flatten().tolist() == [0] + [j + 1 for j in path]
        assert i in kids[parents[i] + 1]
    assert sorted(c for slot in kids for c in slot) == list(range(n))
    leaves = [i for i in range(n) if not kids[i + 1]]
    assert sorted(p[-1] for p in leaf_paths(parents)) == leaves
    for p in leaf_paths(parents):
        assert p == path_to(p[-1], parents)


# ----------------------------------------------------------------------------- trie


def test_trie_shares_prefixes_in_order():
    tokens, parents = trie([[1, 2, 3], [1, 2, 4], [5], [1, 6]])
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert parents == [-1, 0, 1, 1, -1, 0]


def test_trie_first_sequence_first():
    tokens, parents = trie([[7, 8], [1, 2]])
    assert tokens == [7, 8, 1, 2]
    assert parents == [-1, 0, -1, 2]


def test_trie_duplicates_and_prefixes_add_nothing():
    assert trie([[1, 2], [1, 2], [1]]) == ([1, 2], [-1, 0])
    assert trie([[1, 2], [1, 2, 3]]) == ([1, 2, 3], [-1, 0, 1])


def test_trie_same_token_under_different_parents_is_not_merged():
    assert trie([[1, 1], [1]]) == ([1, 1], [-1, 0])
    assert trie([[1, 2], [3, 2]]) == ([1, 2, 3, 2], [-1, 0, -1, 2])


def test_trie_empty():
    assert trie([]) == ([], [])
    assert trie([[], []]) == ([], [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=4), max_size=6))
def test_trie_properties(seqs):
    tokens, parents = trie(seqs)
    assert len(tokens) == len(parents)
    depths(parents)  # parents precede children
    # One node per distinct non-empty prefix.
    prefixes = {tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)}
    assert len(tokens) == len(prefixes)
    node_seqs = [tuple(tokens[j] for j in path_to(i, parents)) for i in range(len(tokens))]
    assert set(node_seqs) == prefixes
    # Siblings never repeat a token.
    for slot in children(parents):
        sib = [tokens[c] for c in slot]
        assert len(sib) == len(set(sib))
    # Nodes appear in order of first appearance across the sequences.
    first_seen = []
    for s in seqs:
        for k in range(1, len(s) + 1):
            if tuple(s[:k]) not in first_seen:
                first_seen.append(tuple(s[:k]))
    assert node_seqs == first_seen


# ----------------------------------------------------------------------------- from_paths


def test_from_paths_medusa_style():
    # Ordered by (depth, path): (0) (1) (0,0) (0,1) (0,0,0)
    assert from_paths([[0], [0, 0], [1], [0, 1], [0, 0, 0]]) == [-1, -1, 0, 0, 2]


def test_from_paths_order_does_not_matter_and_duplicates_collapse():
    paths = [[0], [1], [2], [0, 0], [1, 0], [0, 1], [0, 0, 0]]
    expected = [-1, -1, -1, 0, 0, 1, 3]  # (0)(1)(2)(0,0)(0,1)(1,0)(0,0,0)
    assert from_paths(paths) == expected
    assert from_paths(list(reversed(paths)) + [[0], [0, 0]]) == expected


def test_from_paths_chain():
    assert from_paths([[0], [0, 0], [0, 0, 0]]) == [-1, 0, 1]
    assert from_paths([]) == []


@pytest.mark.parametrize("paths", [[[0], [1, 0]], [[0, 0]], [[0], [0, 0], [0, 1, 0]]])
def test_from_paths_missing_parent(paths):
    with pytest.raises(ValueError, match="no parent path"):
        from_paths(paths)


def test_trie_within_keeps_the_longest_fitting_leading_run():
    from app.decoding.tree import trie_within

    seqs = [[1, 2, 3], [1, 2, 4], [5, 6]]
    assert trie_within(seqs, 3) == ([1, 2, 3], [-1, 0, 1], 1)
    assert trie_within(seqs, 4) == ([1, 2, 3, 4], [-1, 0, 1, 1], 2)
    assert trie_within(seqs, 5)[2] == 2
    assert trie_within(seqs, 6)[2] == 3
    assert trie_within(seqs, 0) == ([], [], 0)
