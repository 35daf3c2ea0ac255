"""Acceptance rules: greedy on hand-built trees; exactness of the sampling rules by statistics.

The statistical tests use a toy "target" whose next-token distribution depends on the position and
the previous token, so the joint distribution of the first output tokens is a real check (each token's distribution
depends on the one before). When a rule emits fewer than three tokens, the rest are drawn from the
exact conditionals, as later verify steps would if the rule is exact.
"""

from collections import Counter

import pytest
import torch

from app.decoding.acceptance import greedy, leviathan, recursive_rejection
from app.decoding.tree import path_to
from helpers import chisquare_gof, empirical, marginal, total_variation

V = 5
ROOT = 0
N_SAMPLES = 20000  # leviathan
N_SAMPLES_TREE = 12000  # recursive rejection (cheaper per draw, many trees)
P_MIN = 1e-3  # chi-square p-value below which a distribution is declared different (seeds are fixed)
TV_FIRST = 0.02
TV_JOINT = 0.03


# ----------------------------------------------------------------------------- greedy


def test_greedy_empty_draft_is_next():
    v = greedy([], [], [7])
    assert (v.accepted, v.added, v.added_kind) == ([], 7, "next")


def test_greedy_chain_fully_accepted_gives_bonus():
    v = greedy([3, 4, 5], [-1, 0, 1], [3, 4, 5, 9])
    assert (v.accepted, v.added, v.added_kind) == ([0, 1, 2], 9, "bonus")


def test_greedy_chain_partial_gives_correction():
    v = greedy([3, 4, 5], [-1, 0, 1], [3, 4, 6, 9])
    assert (v.accepted, v.added, v.added_kind) == ([0, 1], 6, "correction")


def test_greedy_chain_first_rejected():
    v = greedy([3, 4, 5], [-1, 0, 1], [2, 4, 5, 9])
    assert (v.accepted, v.added, v.added_kind) == ([], 2, "correction")


def test_greedy_later_match_after_mismatch_does_not_count():
    # Node 1 matches the argmax after node 0, but node 0 itself was rejected.
    v = greedy([3, 4], [-1, 0], [1, 4, 8])
    assert (v.accepted, v.added, v.added_kind) == ([], 1, "correction")


def test_greedy_branching_takes_the_matching_branch():
    #        root
    #       /    \
    #   n0:3     n1:4
    #     |      /   \
    #   n2:7  n3:8  n4:9
    tokens, parents = [3, 4, 7, 8, 9], [-1, -1, 0, 1, 1]
    #        slot: root n0 n1 n2 n3 n4
    argmax = [4, 7, 9, 0, 0, 11]
    v = greedy(tokens, parents, argmax)
    assert (v.accepted, v.added, v.added_kind) == ([1, 4], 11, "bonus")


def test_greedy_accepted_node_with_rejected_children_is_correction():
    tokens, parents = [3, 4, 7, 8, 9], [-1, -1, 0, 1, 1]
    argmax = [4, 7, 5, 0, 0, 11]  # after n1 the target wants 5: neither n3 nor n4
    v = greedy(tokens, parents, argmax)
    assert (v.accepted, v.added, v.added_kind) == ([1], 5, "correction")


def test_greedy_ties_keep_the_first_path():
    #   root -> n0:3 -> n2:5   and   root -> n1:3 -> n3:5  (both fully match)
    tokens, parents = [3, 3, 5, 5], [-1, -1, 0, 1]
    argmax = [3, 5, 5, 20, 30]
    v = greedy(tokens, parents, argmax)
    assert (v.accepted, v.added, v.added_kind) == ([0, 2], 20, "bonus")


def test_greedy_prefers_the_longest_path_even_if_later():
    tokens, parents = [3, 3, 6], [-1, -1, 1]
    argmax = [3, 9, 6, 42]
    v = greedy(tokens, parents, argmax)
    assert (v.accepted, v.added, v.added_kind) == ([1, 2], 42, "bonus")


def test_greedy_accepted_leaf_among_other_branches_is_bonus():
    # The accepted leaf n1 has no children even though n0 does: bonus.
    tokens, parents = [3, 4, 7], [-1, -1, 0]
    argmax = [4, 1, 13, 2]
    v = greedy(tokens, parents, argmax)
    assert (v.accepted, v.added, v.added_kind) == ([1], 13, "bonus")


# ----------------------------------------------------------------------------- toy target / draft


class Toy:
    """Next-token distribution given a context: softmax(logits[position][last token])."""

    def __init__(self, seed: int, scale: float = 2.0, depth: int = 5, zero: tuple[int, int, int] | None = None):
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(depth, V, V, generator=g, dtype=torch.float64) * scale
        if zero is not None:  # force p = 0 for one token in one context
            self.logits[zero] = float("-inf")
        self.table = self.logits.softmax(-1).to(torch.float32)

    def __call__(self, ctx: list[int]) -> torch.Tensor:
        return self.table[len(ctx) - 1, ctx[-1]]

    def exact_first_three(self) -> dict:
        p1 = self([ROOT])
        return {
            (a, b, c): float(p1[a] * self([ROOT, a])[b] * self([ROOT, a, b])[c])
            for a in range(V)
            for b in range(V)
            for c in range(V)
        }


def draw(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def check_distribution(samples: Counter, exact: dict, label: str):
    """samples and exact are over 3-token outcomes: TV + chi-square on the first token and the first
    two; chi-square (sparse bins pooled) on all three."""
    emp = empirical(samples.elements())
    for length, tol in ((1, TV_FIRST), (2, TV_JOINT)):
        tv = total_variation(marginal(emp, length), marginal(exact, length))
        _, _, pval = chisquare_gof(Counter(k[:length] for k in samples.elements()), marginal(exact, length))
        assert tv < tol and pval > P_MIN, f"{label}: first {length} token(s) TV {tv:.4f}, chi-square p {pval:.2e}"
    _, _, pval = chisquare_gof(samples, exact)
    assert pval > P_MIN, f"{label}: first three tokens chi-square p {pval:.2e}"


# ----------------------------------------------------------------------------- leviathan


def leviathan_samples(target: Toy, draft: Toy, k: int, seed: int) -> tuple[Counter, Counter]:
    gen = torch.Generator().manual_seed(seed)
    gen_draft = torch.Generator().manual_seed(seed + 1)
    out_counts, kinds = Counter(), Counter()
    for _ in range(N_SAMPLES):
        ctx, tokens, qs = [ROOT], [], []
        for _ in range(k):
            q = draft(ctx)
            x = draw(q, gen_draft)
            tokens.append(x)
            qs.append(q)
            ctx = ctx + [x]
        p = torch.stack([target([ROOT] + tokens[:i]) for i in range(k + 1)])
        v = leviathan(tokens, torch.stack(qs), p, gen)
        # Structural checks on every verdict.
        assert v.accepted == list(range(len(v.accepted)))
        assert v.added_kind == ("bonus" if len(v.accepted) == k else "correction")
        assert float(p[len(v.accepted), v.added]) > 0
        out = [tokens[i] for i in v.accepted] + [v.added]
        while len(out) < 3:
            out.append(draw(target([ROOT] + out), gen_draft))
        out_counts[tuple(out[:3])] += 1
        kinds[len(v.accepted)] += 1
    return out_counts, kinds


@pytest.mark.parametrize(
    "k, target_seed, draft_seed, zero",
    [
        (2, 0, 1, None),
        (3, 2, 3, None),
        (3, 4, 5, (0, ROOT, 1)),  # the target gives token 1 probability 0 at the root
    ],
)
def test_leviathan_output_distribution_equals_target(k, target_seed, draft_seed, zero):
    target = Toy(target_seed, zero=zero)
    draft = Toy(draft_seed)
    samples, kinds = leviathan_samples(target, draft, k, seed=100 + k)
    check_distribution(samples, target.exact_first_three(), f"leviathan k={k}")
    # The test exercises rejections, partial and full acceptance.
    assert kinds[0] > 500 and kinds[k] > 500 and sum(kinds[i] for i in range(1, k)) > 500, kinds


def test_leviathan_identical_draft_accepts_everything():
    target = Toy(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens = [draw(target([ROOT]), gen)]
        tokens.append(draw(target([ROOT, tokens[0]]), gen))
        q = torch.stack([target([ROOT]), target([ROOT, tokens[0]])])
        p = torch.cat([q, target([ROOT] + tokens)[None]])
        v = leviathan(tokens, q, p, gen)
        assert v.accepted == [0, 1] and v.added_kind == "bonus"


def test_leviathan_token_with_zero_target_probability_is_rejected():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])
    p = torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    for _ in range(50):
        v = leviathan([1], q, p, gen)
        assert v.accepted == [] and v.added in (2, 3) and v.added_kind == "correction"


def test_leviathan_empty_draft_samples_from_p():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    v = leviathan([], torch.zeros(0, V), p, gen)
    assert (v.accepted, v.added, v.added_kind) == ([], 3, "next")


# ----------------------------------------------------------------------------- recursive rejection

# (tokens, parents) of deterministic drafts; "a"/"b" are replaced by the target's two most likely
# root tokens and "c" by its least likely one, so both acceptance and rejection happen often.
TREES = {
    "siblings": (["a", "b", 1, 2, 3], [-1, -1, 0, 0, 1]),
    "duplicates": (["a", "a", "b", 3, 3], [-1, -1, -1, 0, 0]),
    "chain": (["a", 2, 4], [-1, 0, 1]),
    "every_root_token": ([0, 1, 2, 3, 4, 1], [-1, -1, -1, -1, -1, 1]),
    "unlikely_first": (["c", "b", "a", 0], [-1, -1, -1, 2]),
}


def rr_samples(target: Toy, tokens: list[int], parents: list[int], seed: int) -> tuple[Counter, Counter]:
    gen = torch.Generator().manual_seed(seed)
    gen_next = torch.Generator().manual_seed(seed + 1)
    p = torch.stack([target([ROOT])] + [target([ROOT] + [tokens[j] for j in path_to(i, parents)]) for i in range(len(tokens))])
    out_counts, depth = Counter(), Counter()
    for _ in range(N_SAMPLES_TREE):
        v = recursive_rejection(tokens, parents, p, gen)
        assert v.accepted == path_to(v.accepted[-1], parents) if v.accepted else True
        slot = v.accepted[-1] + 1 if v.accepted else 0
        assert float(p[slot, v.added]) > 0
        out = [tokens[i] for i in v.accepted] + [v.added]
        while len(out) < 3:
            out.append(draw(target([ROOT] + out), gen_next))
        out_counts[tuple(out[:3])] += 1
        depth[len(v.accepted)] += 1
    return out_counts, depth


@pytest.mark.parametrize("name, seed", [(name, i) for i, name in enumerate(TREES)])
def test_recursive_rejection_output_distribution_equals_target(name, seed):
    target = Toy(seed, zero=(1, 3, 2))  # after token 3 at depth 1, token 2 has probability 0
    order = target([ROOT]).argsort(descending=True).tolist()
    names = {"a": order[0], "b": order[1], "c": order[-1]}
    raw_tokens, parents = TREES[name]
    tokens = [names.get(t, t) if isinstance(t, str) else t for t in raw_tokens]
    samples, depth = rr_samples(target, tokens, parents, seed=1000 + seed)
    check_distribution(samples, target.exact_first_three(), f"recursive_rejection {name}")
    assert depth[0] < N_SAMPLES_TREE and depth[1] + depth[2] + depth[3] > 0, depth


def test_recursive_rejection_kinds():
    tokens, parents = [1, 2, 3], [-1, -1, 0]
    gen = torch.Generator().manual_seed(0)
    one_hot = torch.eye(V)
    # p after the root is all on token 1 (n0), after n0 all on token 3 (n2), after n2 on token 4.
    p = torch.stack([one_hot[1], one_hot[3], one_hot[0], one_hot[4]])
    v = recursive_rejection(tokens, parents, p, gen)
    assert (v.accepted, v.added, v.added_kind) == ([0, 2], 4, "bonus")
    # After n0 the target wants 4: n2 (token 3) is rejected -> correction.
    p = torch.stack([one_hot[1], one_hot[4], one_hot[0], one_hot[4]])
    v = recursive_rejection(tokens, parents, p, gen)
    assert (v.accepted, v.added, v.added_kind) == ([0], 4, "correction")
    # At the root the target wants 0: both children rejected.
    p = torch.stack([one_hot[0], one_hot[4], one_hot[0], one_hot[4]])
    v = recursive_rejection(tokens, parents, p, gen)
    assert (v.accepted, v.added, v.added_kind) == ([], 0, "correction")
    v = recursive_rejection([], [], one_hot[2][None], gen)
    assert (v.accepted, v.added, v.added_kind) == ([], 2, "next")


def test_recursive_rejection_duplicate_sibling_is_never_accepted():
    target = Toy(3)
    p_root = target([ROOT])
    x = int(p_root.argmax())
    tokens, parents = [x, x], [-1, -1]
    p = torch.stack([p_root, target([ROOT, x]), target([ROOT, x])])
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        v = recursive_rejection(tokens, parents, p, gen)
        assert v.accepted in ([], [0])
        if not v.accepted:
            assert v.added != x


# ----------------------------------------------------------------------------- the harness can fail


def test_statistical_check_detects_a_wrong_rule():
    """Accepting every draft token (output ~ q, not p) must be flagged by check_distribution."""
    target, draft = Toy(0), Toy(1)
    gen = torch.Generator().manual_seed(0)
    wrong = Counter()
    for _ in range(N_SAMPLES):
        a = draw(draft([ROOT]), gen)
        b = draw(draft([ROOT, a]), gen)
        c = draw(draft([ROOT, a, b]), gen)
        wrong[(a, b, c)] += 1
    with pytest.raises(AssertionError):
        check_distribution(wrong, target.exact_first_three(), "wrong rule")
