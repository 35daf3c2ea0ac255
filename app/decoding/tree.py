"""Token trees as data: a tree is a list of parent indices (-1 = the root). Plain Python (the web app reads trees too).

The root is the last committed token, which is fed to the target together with the tree.
A chain is the tree whose parents are -1, 0, 1, ...
"""

from __future__ import annotations


def depths(parents: list[int]) -> list[int]:
    """Depth of every node; children of the root have depth 1. Parents must precede children."""
    out: list[int] = []
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"node {i} has parent {p}: parents must come before their children")
        out.append(1 if p < 0 else out[p] + 1)
    return out


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def children(parents: list[int]) -> list[list[int]]:
    """Children of every slot: index 0 is the root, slot i+1 is node i; children listed as node indices."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out


def path_to(node: int, parents: list[int]) -> list[int]:
    """Node indices from the root's child down to `node` (empty for the root, node = -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def leaf_paths(parents: list[int]) -> list[list[int]]:
    """Every root-to-leaf path as node indices (Medusa/EAGLE's retrieve indices, unpadded)."""
    has_child = {p for p in parents if p >= 0}
    return [path_to(i, parents) for i in range(len(parents)) if i not in has_child]


def trie(sequences: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token sequences that hang off the root into one tree, sharing common prefixes.

    Returns (tokens, parents); the first sequence's nodes come first, so ties keep the given order.
    """
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for seq in sequences:
        parent = -1
        for tok in seq:
            key = (parent, tok)
            node = index.get(key)
            if node is None:
                node = len(tokens)
                index[key] = node
                tokens.append(tok)
                parents.append(parent)
            parent = node
    return tokens, parents


def graft(tokens: list[int], parents: list[int], more_tokens: list[int], more_parents: list[int]):
    """Merge a second tree into the first (SpecInfer's merged token tree): a node of the second whose
    parent maps to a node with the same token there becomes that node, the others are appended.

    Returns (tokens, parents, where) with where[i] = the merged index of the second tree's node i.
    The first tree's nodes keep their indices, so its per-node data (scores) stays aligned.
    """
    tokens, parents = list(tokens), list(parents)
    index = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents))}
    where: list[int] = []
    for tok, par in zip(more_tokens, more_parents):
        if par >= len(where):
            raise ValueError(f"node {len(where)} has parent {par}: parents must come before their children")
        key = (where[par] if par >= 0 else -1, tok)
        node = index.get(key)
        if node is None:
            node = index[key] = len(tokens)
            tokens.append(tok)
            parents.append(key[0])
        where.append(node)
    return tokens, parents, where


def trie_within(sequences: list[list[int]], max_nodes: int) -> tuple[list[int], list[int], int]:
    """The trie of the longest leading run of `sequences` that fits in `max_nodes` nodes.

    Returns (tokens, parents, how many sequences it holds).
    """
    kept = 0
    tokens: list[int] = []
    parents: list[int] = []
    for k in range(1, len(sequences) + 1):
        t, p = trie(sequences[:k])
        if len(t) > max_nodes:
            break
        tokens, parents, kept = t, p, k
    return tokens, parents, kept


def from_paths(paths: list[list[int]]) -> list[int]:
    """Parents of a static tree given Medusa-style paths of per-depth ranks, e.g. [[0], [0, 0], [1]].

    Nodes are ordered by (depth, path); every prefix of a path must itself be a path.
    """
    ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    pos = {p: i for i, p in enumerate(ordered)}
    parents = []
    for p in ordered:
        if len(p) == 1:
            parents.append(-1)
        elif p[:-1] in pos:
            parents.append(pos[p[:-1]])
        else:
            raise ValueError(f"path {list(p)} has no parent path {list(p[:-1])}")
    return parents
