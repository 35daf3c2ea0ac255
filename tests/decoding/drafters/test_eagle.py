"""EAGLE: the draft module, its loss, artifacts and export, the tree builders and the drafter.

Greedy EAGLE must reproduce greedy autoregressive decoding token for token whatever the module
says; alignment (token shift, positions, draft cache, pending features) is checked against an
independent recomputation without caches or masks, and by a trained module getting drafts accepted.
"""

import copy
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.decoding import attention
from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.eagle import DraftTree, Eagle, best_nodes, dynamic_tree, static_tree
from app.decoding.sampling import SamplingParams
from app.decoding.tree import depths, from_paths
from app.heads import eagle as E
from app.heads import vocab
from app.heads.eagle import EagleConfig, EagleError, EagleModule
from helpers import DrafterSpy, check_target_probs, run
from helpers_decoding import MAX_NEW, PROMPTS, V, _random, ar_reference, greedy_data, make_module
from helpers_decoding import PROMPT as SAMPLING_PROMPT
from helpers_decoding import RUNS, T1, WARPED, cached, check_against_exact, exact_distribution, sample_runs

# EAGLE-1-like static tree: 25 nodes, depth 5.
EAGLE1_TREE = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]
STATIC = {"eagle1": EAGLE1_TREE, "chain": [[0], [0, 0], [0, 0, 0]], "wide": [[0], [1], [2], [0, 0], [1, 0]]}
DYNAMIC = [(24, 5, 4), (8, 3, 2), (2, 1, 1), (40, 6, 8), (12, 8, 1)]


def round_bf16(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.bfloat16().float())
    return module


@pytest.fixture(scope="module")
def random_module(tiny_model):
    return make_module(tiny_model, seed=0)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_proposals(calls, *, max_nodes=None, max_depth=None, top_k=None, module=None):
    allowed = set(module.target_ids.tolist()) if module is not None else None
    for context, room, prop in calls:
        assert len(prop.tokens) <= room
        if max_nodes is not None:
            assert len(prop.tokens) <= max_nodes
        level = depths(prop.parents)  # also checks parents precede children
        if max_depth is not None:
            assert max(level, default=0) <= max_depth
        kids: dict = {}
        for i, p in enumerate(prop.parents):
            kids.setdefault(p, []).append(prop.tokens[i])
        for siblings in kids.values():
            assert len(set(siblings)) == len(siblings), "siblings must be distinct tokens"
            if top_k is not None:
                assert len(siblings) <= top_k
        if allowed is not None:
            assert set(prop.tokens) <= allowed
        assert prop.q is None
        tree = prop.source["tree"]
        assert tree["tokens"] == prop.tokens and tree["parents"] == prop.parents
        assert len(tree["scores"]) == len(prop.tokens)
        json.dumps(prop.source)


# ----------------------------------------------------------------------------- tree builders (pure)


def _path(tree, n):
    out = []
    while n >= 0:
        out.append(tree.tokens[n])
        n = tree.parents[n]
    return tuple(reversed(out))


def table_expand(table, calls):
    def expand(tree, nodes):
        paths = [_path(tree, n) for n in nodes]
        calls.append(paths)
        return torch.tensor([table[p] for p in paths], dtype=torch.float64).log()

    return expand


ROOT_Q = [0.5, 0.3, 0.15, 0.05]
ROOT = torch.tensor(ROOT_Q, dtype=torch.float64).log()
TABLE = {
    (0,): [0.1, 0.55, 0.25, 0.1],
    (1,): [0.7, 0.05, 0.15, 0.1],
    (0, 1): [0.9, 0.05, 0.03, 0.02],
    (1, 0): [0.25, 0.15, 0.5, 0.1],
}


def test_dynamic_tree_hand_made_tables():
    calls = []
    tree = dynamic_tree(ROOT, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=6)
    # Candidates: (0) .5, (1) .3, (0,1) .275, (0,2) .125, (1,0) .21, (1,2) .045, then from the frontier
    # (0,1), (1,0): (0,1,0) .2475, (0,1,1) .01375, (1,0,2) .105, (1,0,0) .0525. The six best:
    assert calls == [[(0,), (1,)], [(0, 1), (1, 0)]]
    assert [_path(tree, i) for i in range(len(tree.tokens))] == [(0,), (1,), (0, 1), (0, 1, 0), (1, 0), (0, 2)]
    assert tree.tokens == [0, 1, 1, 0, 0, 2]
    assert tree.parents == [-1, -1, 0, 2, 1, 0]
    assert tree.scores == pytest.approx([math.log(p) for p in (0.5, 0.3, 0.275, 0.2475, 0.21, 0.125)], abs=1e-9)


def test_dynamic_tree_limits():
    calls = []
    root = ROOT
    tree = dynamic_tree(root, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=2)
    assert tree.tokens == [0, 1] and tree.parents == [-1, -1] and calls == [[(0,), (1,)]]
    calls.clear()
    assert dynamic_tree(root, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=1).tokens == [0]
    assert calls == []  # a one-node tree needs no expansion
    assert dynamic_tree(root, table_expand(TABLE, []), depth=1, top_k=3, max_nodes=9).tokens == [0, 1, 2]
    assert dynamic_tree(root, table_expand(TABLE, []), depth=3, top_k=2, max_nodes=0).tokens == []
    # top_k larger than the vocabulary: every token once.
    assert sorted(dynamic_tree(root, table_expand(TABLE, []), depth=1, top_k=10, max_nodes=10).tokens) == [0, 1, 2, 3]


def test_dynamic_tree_prunes_unlikely_paths_and_stops_drafting_early():
    # Same tables as above. At 0.2 the candidates kept are (0) .5, (1) .3, (0,1) .275, (0,1,0) .2475, (1,0) .21;
    # (0,2) .125 is dropped although it would fit, and so is the frontier's weaker child.
    calls = []
    tree = dynamic_tree(ROOT, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=6, min_score=math.log(0.2))
    assert [_path(tree, i) for i in range(len(tree.tokens))] == [(0,), (1,), (0, 1), (0, 1, 0), (1, 0)]
    assert calls == [[(0,), (1,)], [(0, 1), (1, 0)]]
    # At 0.26 only (0,1) reaches level 3's frontier; at 0.4 level 2 is never drafted; at 0.6 nothing is.
    calls.clear()
    tree = dynamic_tree(ROOT, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=6, min_score=math.log(0.26))
    assert [_path(tree, i) for i in range(len(tree.tokens))] == [(0,), (1,), (0, 1)] and calls == [[(0,), (1,)], [(0, 1)]]
    calls.clear()
    tree = dynamic_tree(ROOT, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=6, min_score=math.log(0.4))
    assert tree.tokens == [0] and calls == [[(0,)]]
    calls.clear()
    assert dynamic_tree(ROOT, table_expand(TABLE, calls), depth=3, top_k=2, max_nodes=6, min_score=math.log(0.6)).tokens == []
    assert calls == []


def test_dynamic_tree_is_ancestor_closed_and_best_first():
    gen = torch.Generator().manual_seed(0)

    def expand(tree, nodes):
        return torch.randn(len(nodes), 7, generator=gen).log_softmax(-1)

    for max_nodes in (1, 5, 13, 40):
        tree = dynamic_tree(torch.randn(7, generator=gen).log_softmax(-1), expand, depth=5, top_k=3, max_nodes=max_nodes)
        assert len(tree.tokens) == min(max_nodes, 3 + 4 * 9)
        assert all(p < i for i, p in enumerate(tree.parents))
        assert tree.scores == sorted(tree.scores, reverse=True)
        for i, p in enumerate(tree.parents):
            assert p < 0 or tree.scores[p] >= tree.scores[i]


def test_best_nodes_ties_and_broken_monotonicity():
    # Equal scores: the parent (lower index) ranks first. A child scoring above its parent
    # (impossible with real log-probabilities) is still never kept without its parent.
    cand = DraftTree([5, 6, 7, 8], [-1, 0, -1, 2], [-1.0, -1.0, -2.0, -0.5])
    out = best_nodes(cand, 2)
    assert out.tokens == [5, 6] and out.parents == [-1, 0]
    out = best_nodes(cand, 4)
    assert out.tokens == [5, 6, 7, 8] and out.parents == [-1, 0, -1, 2]


def test_static_tree_hand_made_tables():
    calls = []
    paths = [[1, 0], [0], [0, 1], [1], [0, 0]]
    tree = static_tree(ROOT, table_expand(TABLE, calls), paths, max_nodes=10)
    # (depth, path) order: [0], [1], [0,0], [0,1], [1,0]; rank r = r-th most likely child.
    assert calls == [[(0,), (1,)]]
    assert tree.parents == from_paths(paths) == [-1, -1, 0, 0, 1]
    assert tree.tokens == [0, 1, 1, 2, 0]
    assert tree.scores == pytest.approx([math.log(p) for p in (0.5, 0.3, 0.275, 0.125, 0.21)], abs=1e-9)
    trimmed = static_tree(ROOT, table_expand(TABLE, []), paths, max_nodes=3)
    assert trimmed.tokens == [0, 1, 1] and trimmed.parents == [-1, -1, 0]


# ----------------------------------------------------------------------------- greedy equivalence


@pytest.mark.parametrize("prompt", ["repeat", "random_a", "short"])
@pytest.mark.parametrize("shape", DYNAMIC, ids=lambda s: "t{}d{}k{}".format(*s))
def test_greedy_dynamic_tree_equals_autoregressive(tiny_model, random_module, shape, prompt):
    total, depth, top_k = shape
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    rec = DrafterSpy(Eagle(random_module, tiny_model.get_input_embeddings(), total - 1, depth, top_k))
    out, _ = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert out == ref, f"differs at {first_difference(out, ref)}"
    check_proposals(rec.calls, max_nodes=total - 1, max_depth=depth, top_k=top_k)
    candidates = top_k + (depth - 1) * top_k**2
    assert any(len(prop.tokens) == min(total - 1, room, candidates) for _, room, prop in rec.calls)


@pytest.mark.parametrize("prompt", ["repeat", "random_a"])
def test_greedy_pruned_dynamic_tree_equals_autoregressive(tiny_model, trained, prompt):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    sizes = {}
    for p in (0.0, 1e-4, 0.003, 0.03):
        rec = DrafterSpy(Eagle(trained, tiny_model.get_input_embeddings(), 15, 4, 3, min_path_prob=p))
        out, _ = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
        assert out == ref, f"min_path_prob {p}: differs at {first_difference(out, ref)}"
        check_proposals(rec.calls, max_nodes=15, max_depth=4, top_k=3)
        for _, _, prop in rec.calls:
            assert prop.source.get("min_path_prob", 0.0) == pytest.approx(p)
            assert all(s >= math.log(p) for s in prop.source["tree"]["scores"]) if p else True
        sizes[p] = sum(len(prop.tokens) for _, _, prop in rec.calls) / len(rec.calls)
    assert sizes[0.03] < sizes[0.003] < sizes[1e-4] < sizes[0.0]
    with pytest.raises(ValueError, match="min_path_prob"):
        Eagle(trained, tiny_model.get_input_embeddings(), min_path_prob=-0.1)


@pytest.mark.parametrize("prompt", ["repeat", "random_b"])
@pytest.mark.parametrize("tree", list(STATIC))
def test_greedy_static_tree_equals_autoregressive(tiny_model, random_module, tree, prompt):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    rec = DrafterSpy(Eagle(random_module, tiny_model.get_input_embeddings(), static_choices=STATIC[tree]))
    out, _ = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert out == ref, f"differs at {first_difference(out, ref)}"
    check_proposals(rec.calls)
    assert all(p.parents == from_paths(STATIC[tree]) for _, _, p in rec.calls)


@pytest.mark.parametrize("prompt", ["repeat", "random_b"])
def test_greedy_with_reduced_draft_vocabulary(tiny_model, prompt):
    module = make_module(tiny_model, seed=7, draft_vocab=40)
    assert len(module.d2t) == 40 and int(module.d2t.max()) > 0
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    for kwargs in (dict(), dict(static_choices=EAGLE1_TREE)):
        rec = DrafterSpy(Eagle(module, tiny_model.get_input_embeddings(), **kwargs))
        out, _ = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
        assert out == ref
        check_proposals(rec.calls, module=module)


def test_trees_trimmed_near_the_context_end(short_model):
    module = make_module(short_model, seed=2)
    prompt = _random(5, n=36)
    ref = ar_reference(short_model, prompt, max_new_tokens=40)
    assert len(prompt) + len(ref) == short_model.config.max_position_embeddings
    for kwargs in (dict(max_total_draft_tokens=29, depth=8, top_k=4), dict(static_choices=EAGLE1_TREE)):
        rec = DrafterSpy(Eagle(module, short_model.get_input_embeddings(), **kwargs))
        out, events = run(short_model, rec, prompt, max_new_tokens=40)
        assert out == ref and events[-1].finish_reason == "length"
        check_proposals(rec.calls)
        assert min(room for _, room, _ in rec.calls) <= 2


def test_bfloat16_target_features(tiny_model):
    """A bfloat16 target hands bfloat16 features to a float32 module."""
    target = copy.deepcopy(tiny_model).to(torch.bfloat16)
    module = make_module(tiny_model, seed=3)
    prompt = PROMPTS["random_a"]
    ref = ar_reference(target, prompt)
    out, _ = run(target, Eagle(module, target.get_input_embeddings()), prompt, max_new_tokens=MAX_NEW)
    assert out == ref


def test_eos_and_max_new_tokens_inside_the_tree(tiny_model, trained):
    prompt = PROMPTS["random_a"]
    ref = ar_reference(tiny_model, prompt)
    embed = tiny_model.get_input_embeddings()
    for n in range(1, 9):
        out, events = run(tiny_model, Eagle(trained, embed), prompt, max_new_tokens=n)
        assert out == ref[:n] and events[-1].finish_reason == "length"
    inside = 0
    for k in range(3, 30, 3):
        eos = ref[k]
        expected = ref[: ref.index(eos) + 1]
        out, events = run(tiny_model, Eagle(trained, embed), prompt, max_new_tokens=MAX_NEW, eos_token_ids=[eos])
        assert out == expected and events[-1].finish_reason == "eos"
        inside += events[-1].added_token is None  # EOS was an accepted draft token, not the added one
    assert inside >= 1


# ----------------------------------------------------------------------------- alignment


@torch.no_grad()
def independent_scores(module, target, context, proposal) -> tuple[list[float], torch.Tensor]:
    """Each node's cumulative draft log-probability, recomputed with full causal passes and no cache:
    entries (embed(context[i+1]), f_i) for the committed context, then the node's ancestors one by
    one, each with the previous entry's draft output as its feature."""
    embed = target.get_input_embeddings()
    states = target(input_ids=torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states
    aux = torch.cat([states[i][0] for i in module.config.aux_layers], -1) if module.config.aux_layers else None
    eagle3 = module.config.eagle3
    features = module.fc(aux) if eagle3 else states[-1][0]  # EAGLE-3: a committed entry's feature is fc(fused layers)
    t2d = {int(t): d for d, t in enumerate(module.target_ids)}
    memo: dict = {}

    def after(path):  # (draft output, log q) at the entry of the last token of `path`
        if path not in memo:
            fused = None if aux is None or eagle3 else torch.cat([aux, torch.zeros(len(path), aux.shape[-1])])
            if not path:
                tokens, feats = context[1:], features
            else:
                tokens = context[1:] + list(path)
                chain = [after(path[:i])[0] for i in range(len(path))]
                feats = torch.cat([features, torch.stack(chain)])
            if fused is not None:  # drafted entries have no target layers: fuse zeros (fc_aux has no bias)
                feats = feats + module.fc_aux(fused)
            hidden, logits = module(embed(torch.tensor([tokens])), feats[None])
            memo[path] = (hidden[0, -1], logits[0, -1].float().log_softmax(-1))
        return memo[path]

    scores = []
    for i in range(len(proposal.tokens)):
        path = _path(DraftTree(proposal.tokens, proposal.parents), i)
        scores.append(sum(float(after(path[:j])[1][t2d[path[j]]]) for j in range(len(path))))
    return scores, after(())[1]


@pytest.mark.parametrize("which", ["random", "trained", "reduced_vocab", "fused_layers", "eagle3"])
@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_drafts_match_an_independent_recomputation(tiny_model, random_module, trained, which, tree):
    """Token shift, positions, tree masks, the draft cache and the pending features (with their fused
    target layers) all agree with a cache-free recomputation, at the first step and after several
    accepted paths."""
    module = {"random": random_module, "trained": trained, "reduced_vocab": make_module(tiny_model, 9, 50),
              "fused_layers": make_module(tiny_model, 11, aux=[0, 1, 2]),
              "eagle3": make_module(tiny_model, 13, 50, aux=[0, 1, 2], eagle3=True)}[which]
    kwargs = dict(max_total_draft_tokens=15, depth=4, top_k=3) if tree == "dynamic" else dict(static_choices=EAGLE1_TREE)
    rec = DrafterSpy(Eagle(module, tiny_model.get_input_embeddings(), **kwargs))
    run(tiny_model, rec, PROMPTS["random_b"], max_new_tokens=24)
    assert len(rec.calls) >= 3
    for context, _, prop in rec.calls[:2] + rec.calls[-2:]:
        expected, root_logq = independent_scores(module, tiny_model, context, prop)
        assert prop.source["tree"]["scores"] == pytest.approx(expected, abs=2e-3)
        level1 = {int(module.target_ids[root_logq.topk(r + 1).indices[r]]) for r in range(3)}
        if tree == "dynamic":  # level 1 = the top_k of the root's distribution, all kept here
            assert {t for t, p in zip(prop.tokens, prop.parents) if p < 0} == level1


def test_a_trained_module_gets_drafts_accepted(tiny_model, trained):
    """Well over one accepted draft token per step on fresh prompts. This module gets ~1.9 (dynamic)
    and ~2.4 (static); the same module with the token shift off by one gets ~0.2, with features
    shifted by one in observe() ~1.4 / 1.5. (Position and mask errors barely move this tiny
    module's acceptance: the independent recomputation above is the exact check for those.)"""
    embed = tiny_model.get_input_embeddings()
    for kwargs, threshold in ((dict(), 1.6), (dict(static_choices=EAGLE1_TREE), 2.0)):
        accepted = steps = 0
        for seed in range(100, 105):
            prompt = _random(seed, n=10)
            out, events = run(tiny_model, Eagle(trained, embed, **kwargs), prompt, max_new_tokens=MAX_NEW)
            assert out == ar_reference(tiny_model, prompt)
            accepted += sum(len(e.accepted) for e in events[1:])
            steps += len(events) - 1
        assert accepted / steps > threshold, (kwargs, accepted / steps)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=2)])
def test_the_trace_gives_the_targets_probabilities_over_the_tree(tiny_model, trained, sampling):
    """At the root and each accepted node the trace reports what the target gave every sibling it
    weighed there (the accepted one and the rejected ones), checked against fresh forward passes."""
    embed = tiny_model.get_input_embeddings()
    prompt = _random(101, n=10)
    _, events = run(tiny_model, Eagle(trained, embed), prompt, sampling=sampling, max_new_tokens=MAX_NEW)
    assert check_target_probs(tiny_model, prompt, events, sampling) > 2 * len(events)
    # Siblings were weighed at a decided slot: rejected nodes carry a probability too.
    assert any(e.target["p"][r] is not None for e in events for r in e.rejected)


# ----------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("min_path_prob", [0.0, 0.2])
def test_sampling_matches_the_exact_distribution(small_vocab_model, min_path_prob):
    """Also pruned (the service's default): the tree stays a deterministic function of the context."""
    module = make_module(small_vocab_model, seed=3, draft_vocab=6)
    embed = small_vocab_model.get_input_embeddings()
    exact = cached("t1", lambda: exact_distribution(small_vocab_model, SAMPLING_PROMPT, T1))
    counts, accepted, drafted = sample_runs(small_vocab_model, lambda: Eagle(module, embed, 7, 3, 3, min_path_prob=min_path_prob), T1)
    assert drafted > RUNS // 3 and accepted > RUNS // 20, (accepted, drafted)  # pruned at 0.2: about half the nodes
    check_against_exact(counts, exact, f"eagle dynamic, min_path_prob {min_path_prob}")


def test_sampling_with_top_k_top_p_static_tree(small_vocab_model):
    module = make_module(small_vocab_model, seed=4)
    embed = small_vocab_model.get_input_embeddings()
    exact = cached("warped", lambda: exact_distribution(small_vocab_model, SAMPLING_PROMPT, WARPED))
    counts, accepted, _ = sample_runs(
        small_vocab_model, lambda: Eagle(module, embed, static_choices=STATIC["wide"]), WARPED, runs=1500
    )
    assert accepted > 100
    check_against_exact(counts, exact, f"eagle static {WARPED}")
    assert all(exact[k] > 0 for k in counts)


# ----------------------------------------------------------------------------- module, loss, artifacts


def test_config_from_target_and_errors(tiny_model):
    cfg = EagleConfig.from_target(tiny_model.config, draft_vocab_size=32)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 4, 2, 8)
    assert (cfg.vocab_size, cfg.draft_vocab_size, cfg.eagle_num_layers) == (96, 32, 1)
    assert EagleConfig.from_target(tiny_model.config).draft_vocab_size == 96
    with pytest.raises(EagleError, match="exceeds"):
        EagleConfig.from_target(tiny_model.config, draft_vocab_size=97)
    with pytest.raises(EagleError, match="shape"):
        EagleModule(cfg, torch.zeros(31, dtype=torch.long))
    with pytest.raises(EagleError, match="same target id"):
        EagleModule(cfg, torch.tensor([1] + [0] * 31))
    with pytest.raises(EagleError, match="outside"):
        EagleModule(cfg, torch.full((32,), 70))
    with pytest.raises(ValueError):
        Eagle(make_module(tiny_model), tiny_model.get_input_embeddings(), static_choices=[[0, 1]])
    module = EagleModule(cfg, attn_implementation=attention.register())
    assert module.model.config._attn_implementation == attention.NAME
    assert module.model.embed_tokens.weight.numel() == 32  # the decoder stack's unused embedding: one row


def test_forward_shapes_and_feature_space(tiny_model):
    module = make_module(tiny_model, draft_vocab=40)
    embeds, feats = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    hidden, logits = module(embeds, feats)
    assert hidden.shape == (2, 5, 32) and logits.shape == (2, 5, 40)
    # The output is after the final RMSNorm, like the target's features.
    rms = (hidden / module.model.norm.weight).pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    assert torch.allclose(module.lm_head(hidden), logits)
    # Causal: an entry does not see later ones.
    h2, _ = module(embeds[:, :3], feats[:, :3])
    assert torch.allclose(h2, hidden[:, :3], atol=1e-6)


def test_draft_vocab_from_counts():
    counts = torch.tensor([5, 0, 9, 9, 1, 3])
    assert vocab.from_counts(counts, 3).tolist() == [0, 1, 1]  # ids 0, 2, 3
    assert vocab.from_counts(counts, 3, include=[4]).tolist() == [2, 2, 2]  # ids 2, 3, 4
    assert vocab.from_counts(counts, 6).tolist() == [0] * 6
    assert vocab.from_counts(counts, 99).tolist() == [0] * 6
    with pytest.raises(ValueError, match="at least one token"):
        vocab.from_counts(counts, 0)
    d2t = vocab.from_counts(counts, 4)
    cfg = EagleConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                      vocab_size=6, draft_vocab_size=4)
    assert EagleModule(cfg, d2t).target_ids.tolist() == [0, 2, 3, 5]


def test_init_lm_head_copies_the_target_rows(tiny_model):
    module = make_module(tiny_model, draft_vocab=30)
    E.init_lm_head(module, tiny_model.get_output_embeddings())
    assert torch.equal(module.lm_head.weight, tiny_model.get_output_embeddings().weight[module.target_ids])


def _features(model, n=6, s=16, seed=0):
    ids = torch.randint(0, model.config.vocab_size, (n, s), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    return ids, hidden


def test_eagle_loss_matches_a_per_position_reference(tiny_model):
    module = make_module(tiny_model, seed=5, draft_vocab=50)
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    ids, hidden = _features(tiny_model, n=2, s=7)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 4:] = False
    loss = E.eagle_loss(module, embed, lm_head, ids, hidden, mask, ce_weight=0.3, noise=0.0)
    terms = []
    rows = module.target_ids
    for b in range(2):
        n = int(mask[b].sum())
        h, logits = module(embed(ids[b : b + 1, 1:n]), hidden[b : b + 1, : n - 1])
        for i in range(n - 1):
            teacher = (hidden[b, i + 1] @ lm_head.weight[rows].T).softmax(-1)
            l1 = torch.nn.functional.smooth_l1_loss(h[0, i], hidden[b, i + 1])
            terms.append(l1 - 0.3 * (teacher * logits[0, i].log_softmax(-1)).sum())
    assert float(loss.detach()) == pytest.approx(float(torch.stack(terms).detach().mean()), rel=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_eagle_loss_decreases_with_training(tiny_model, steps):
    module = make_module(tiny_model, seed=6)
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    ids, hidden = _features(tiny_model, n=8, s=24, seed=1)
    mask = torch.ones_like(ids, dtype=torch.bool)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    torch.manual_seed(0)
    losses = []
    for _ in range(40):
        loss = E.eagle_loss(module, embed, lm_head, ids, hidden, mask, steps=steps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


@torch.no_grad()
@pytest.mark.parametrize("eagle3", [False, True])
def test_training_unroll_computes_what_tree_nodes_compute(tiny_model, eagle3):
    """Unroll step j at position i = a cache-free chain: real features up to position i-j+1, then
    the draft's own outputs fed forward (what a tree node at that depth sees at inference)."""
    module = make_module(tiny_model, seed=8, aux=[1, 2] if eagle3 else None, eagle3=eagle3)
    embed = tiny_model.get_input_embeddings()
    ids, hidden = _features(tiny_model, n=1, s=10, seed=2)
    embeds, feats = embed(ids[:, 1:]), hidden[:, :-1]
    aux = None
    if eagle3:  # a committed entry's feature is fc(the fused layers)
        states = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states
        aux = torch.cat([states[1], states[2]], -1)[:, :-1]
    outs = E.unroll(module, embeds, feats, steps=3, aux=aux)
    if eagle3:
        feats = module.fc(aux)
    for j in (2, 3):
        for i in range(j - 1, embeds.shape[1]):
            real = i - j + 2  # entries with the target's features: positions 0 .. i-j+1
            f = feats[0, :real]
            for pos in range(real, i + 1):
                h, _ = module(embeds[:, : pos], f[None])
                f = torch.cat([f, h[0, -1:]])
            h, logits = module(embeds[:, : i + 1], f[None])
            assert torch.allclose(outs[j - 1][0][0, i], h[0, -1], atol=1e-5), (j, i)
            assert torch.allclose(outs[j - 1][1][0, i], logits[0, -1], atol=1e-4), (j, i)


@pytest.mark.parametrize("prompt", ["repeat", "random_a"])
@pytest.mark.parametrize("eagle3", [False, True])
def test_greedy_with_fused_target_layers_equals_autoregressive(tiny_model, prompt, eagle3):
    module = make_module(tiny_model, seed=12, aux=[1, 2], eagle3=eagle3)
    rec = DrafterSpy(Eagle(module, tiny_model.get_input_embeddings(), 11, 4, 3))
    out, _ = run(tiny_model, rec, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert out == ar_reference(tiny_model, PROMPTS[prompt])
    check_proposals(rec.calls, max_nodes=11, max_depth=4, top_k=3)
    if eagle3:
        static, _ = run(tiny_model, Eagle(module, tiny_model.get_input_embeddings(), static_choices=EAGLE1_TREE),
                        PROMPTS[prompt], max_new_tokens=MAX_NEW)
        assert static == out


def test_eagle3_layer_and_its_training(tiny_model):
    """EAGLE-3's layer: fc over the fused layers alone, q/k/v over 2H, the feature as the residual, the
    output fed back before the final norm; trained on the token loss alone, which falls."""
    module = EagleModule(EagleConfig.from_target(tiny_model.config, aux_layers=[1, 2], eagle3=True))
    h = tiny_model.config.hidden_size
    assert module.fc.weight.shape == (h, 2 * h) and not hasattr(module, "fc_aux") and not hasattr(module, "model")
    assert module.midlayer.self_attn.q_proj.in_features == 2 * h and module.midlayer.self_attn.o_proj.out_features == h
    with pytest.raises(EagleError, match="EAGLE-3"):
        EagleConfig.from_target(tiny_model.config, eagle3=True)  # without fused layers
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    ids, _ = greedy_data(tiny_model, 64, 8, 24, seed=5)
    states = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states
    hidden, aux, mask = states[-1].detach(), torch.cat([states[1], states[2]], -1).detach(), torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():  # the output is the residual stream before the final norm; `head` normalises it
        out, logits = module(embed(ids[:, 1:]), hidden[:, :-1], aux=aux[:, :-1])
        assert torch.allclose(logits, module.lm_head(module.norm(out)))
        assert torch.allclose(module.head(out), logits)
    E.init_lm_head(module, lm_head)
    # The loss is the soft cross-entropy alone (ce_weight, the feature term's partner, plays no part):
    # above the teacher's own entropy by the KL that training removes.
    with torch.no_grad():
        p = lm_head(hidden[:, 1:]).softmax(-1)
        entropy = float(-(p * p.log()).sum(-1).mean())
        first = E.eagle_loss(module, embed, lm_head, ids, hidden, mask, steps=1, aux=aux, noise=0.0)
        assert float(E.eagle_loss(module, embed, lm_head, ids, hidden, mask, steps=1, aux=aux, noise=0.0, ce_weight=5.0)) == float(first)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    for _ in range(40):
        loss = E.eagle_loss(module, embed, lm_head, ids, hidden, mask, steps=2, aux=aux)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = E.eagle_loss(module, embed, lm_head, ids, hidden, mask, steps=1, aux=aux, noise=0.0)
    assert float(last) - entropy < 0.5 * (float(first) - entropy), (float(first), float(last), entropy)


def test_fused_layers_start_as_eagle1_and_train(tiny_model):
    """A fresh fc_aux is zero, so the module computes what EAGLE-1 does; trained, it uses the layers."""
    plain = make_module(tiny_model, seed=13)
    fused = EagleModule(EagleConfig.from_target(tiny_model.config, aux_layers=[1, 2]), None)
    fused.load_state_dict({**plain.state_dict(), "fc_aux.weight": fused.fc_aux.weight}, strict=True)
    ids = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states
    hidden, aux = states[-1], torch.cat([states[1], states[2]], -1)
    embeds = tiny_model.get_input_embeddings()(ids)
    with torch.no_grad():
        assert torch.equal(fused(embeds, hidden, aux=aux)[0], plain(embeds, hidden)[0])
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    mask = torch.ones_like(ids, dtype=torch.bool)
    with pytest.raises(EagleError, match="aux must be given"):
        E.eagle_loss(fused, embed, lm_head, ids, hidden, mask)
    opt = torch.optim.AdamW(fused.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = E.eagle_loss(fused, embed, lm_head, ids, hidden, mask, steps=2, aux=aux)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] and fused.fc_aux.weight.abs().sum() > 0


def test_fused_layers_save_load_export_and_fit_the_target(tmp_path, tiny_model):
    module = round_bf16(make_module(tiny_model, seed=14, aux=[0, 2]))
    E.save(module, tmp_path / "m", "tiny")
    loaded = E.load(tmp_path / "m")
    assert loaded.config.aux_layers == [0, 2] and torch.equal(loaded.fc_aux.weight, module.fc_aux.weight)
    with pytest.raises(E.OldFormatError, match="earlier design.*--eagle3"):  # no engine loads the hybrid
        E.export_checkpoint(module, tmp_path / "x", "tiny")
    E.check_compatible(loaded, tiny_model)
    too_deep = make_module(tiny_model, seed=14, aux=[0, 3])  # the tiny target has 2 layers
    with pytest.raises(EagleError, match="fuses layers"):
        E.check_compatible(too_deep, tiny_model)
    with pytest.raises(EagleError, match="aux_layers"):
        EagleConfig.from_target(tiny_model.config, aux_layers=[-1])


def test_a_module_on_the_targets_lm_head_ships_without_it(tmp_path, tiny_model):
    lm_head = tiny_model.get_output_embeddings()
    config = EagleConfig.from_target(tiny_model.config, draft_vocab_size=50, lm_head_from_target=True)
    source = make_module(tiny_model, seed=15, draft_vocab=50)
    module = EagleModule(config, source.d2t)
    module.load_state_dict(source.state_dict())
    round_bf16(module)  # what is saved is bfloat16; the head is not saved, so it stays the target's float32 rows
    E.init_lm_head(module, lm_head)
    E.save(module, tmp_path / "m", "tiny")
    assert "lm_head.weight" not in load_file(str(tmp_path / "m" / E.WEIGHTS))
    with pytest.raises(EagleError, match="load it with the target"):
        E.load(tmp_path / "m")
    loaded = E.load(tmp_path / "m", target_lm_head=lm_head)
    assert torch.equal(loaded.lm_head.weight, lm_head.weight[loaded.target_ids])
    embeds, feats = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    for a, b in zip(module(embeds, feats), loaded(embeds, feats)):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(EagleError, match="another model"):
        E.load(tmp_path / "m", target_lm_head=torch.nn.Linear(32, 40, bias=False))


def test_save_load_round_trip(tmp_path, tiny_model):
    module = round_bf16(make_module(tiny_model, seed=10, draft_vocab=50))
    E.save(module, tmp_path / "m", "tiny-target")
    loaded = E.load(tmp_path / "m")
    assert loaded.base_model == "tiny-target" and loaded.config == module.config
    assert torch.equal(loaded.d2t, module.d2t)
    embeds, feats = torch.randn(1, 6, 32), torch.randn(1, 6, 32)
    for a, b in zip(module(embeds, feats), loaded(embeds, feats)):
        assert torch.equal(a, b)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    stored = load_file(str(tmp_path / "m" / E.WEIGHTS))
    assert stored["fc.weight"].dtype == torch.bfloat16 and stored["d2t"].dtype == torch.int64
    E.check_compatible(loaded, tiny_model)
    embed = tiny_model.get_input_embeddings()
    out_a, _ = run(tiny_model, Eagle(module, embed), PROMPTS["random_a"], max_new_tokens=12)
    rec = DrafterSpy(Eagle(loaded, embed))
    out_b, _ = run(tiny_model, rec, PROMPTS["random_a"], max_new_tokens=12)
    assert out_a == out_b


def test_load_and_compatibility_errors(tmp_path, tiny_model, small_vocab_model):
    with pytest.raises(EagleError, match="config.json"):
        E.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "medusa"}))
    with pytest.raises(EagleError, match="not an EAGLE"):
        E.load(tmp_path)
    module = make_module(tiny_model)
    with pytest.raises(EagleError, match="hidden size"):
        E.check_compatible(module, small_vocab_model)
    wide = EagleModule(EagleConfig.from_target(tiny_model.config))
    wide.config = EagleConfig(**{**wide.config.__dict__, "vocab_size": 100})
    with pytest.raises(EagleError, match="vocabulary"):
        E.check_compatible(wide, tiny_model)


def test_an_earlier_design_module_does_not_export(tmp_path, tiny_model):
    for module in (make_module(tiny_model, seed=11, draft_vocab=50), make_module(tiny_model, layers=2)):
        with pytest.raises(E.OldFormatError, match="no engine loads"):
            E.export_checkpoint(module, tmp_path / "x", "tiny-target")
    assert not (tmp_path / "x").exists()


MIDLAYER = ([f"self_attn.{p}_proj.weight" for p in "qkvo"] + [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
            + ["input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight"])


@pytest.mark.parametrize("layout, ids", [("eagle3", [1, 2]), ("modelopt", [0, 1])])
def test_export_of_an_eagle3_module_is_an_eagle3_checkpoint(tmp_path, tiny_model, layout, ids):
    """Both layouts name the layer `midlayer.*`: ModelOpt 0.37 exports that name, TensorRT-LLM 1.2.0rc2 loads no other
    and vLLM maps it itself; they differ in the numbering of the captured layers and in t2d."""
    prefix = "midlayer."
    module = round_bf16(make_module(tiny_model, seed=15, draft_vocab=50, aux=[1, 2], eagle3=True))
    E.export_checkpoint(module, tmp_path / "x", "tiny-target", layout=layout)
    tensors = load_file(str(tmp_path / "x" / "model.safetensors"))
    extra = {"t2d"} if layout == "eagle3" else set()  # ModelOpt writes no t2d
    assert set(tensors) == {prefix + k for k in MIDLAYER} | {"norm.weight", "fc.weight", "lm_head.weight", "d2t"} | extra
    # EAGLE-3's shapes: fc over the two fused layers, q/k/v over cat(norm(embed), norm(h)), a draft-vocabulary head.
    assert tensors["fc.weight"].shape == (32, 64) and tensors[prefix + "self_attn.q_proj.weight"].shape[-1] == 64
    assert tensors[prefix + "self_attn.o_proj.weight"].shape[0] == 32 and tensors["lm_head.weight"].shape == (50, 32)
    assert tensors["d2t"].dtype == torch.int64 and torch.equal(tensors["d2t"], module.d2t)
    if layout == "eagle3":
        assert tensors["t2d"].dtype == torch.bool and torch.equal(tensors["t2d"].nonzero().flatten(), module.target_ids)
    config = json.loads((tmp_path / "x" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert (config["draft_vocab_size"], config["vocab_size"], config["num_hidden_layers"]) == (50, 96, 1)
    assert config["target_hidden_size"] == 32 and config["eagle_config"]["use_aux_hidden_state"] is True
    # vLLM numbers a captured layer by the layers before it (our hidden-state index); ModelOpt and TensorRT-LLM by
    # the decoder layer whose output it is.
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert config["specdec"]["eagle3_layers_to_capture"] == [0, 1] and config["specdec"]["base_model"] == "tiny-target"
    back = E.read_export(tmp_path / "x")
    assert back.config == module.config and back.config.eagle3 and back.base_model == "tiny-target"
    embeds, feats, aux = torch.randn(1, 5, 32), torch.randn(1, 5, 32), torch.randn(1, 5, 64)
    assert torch.equal(back(embeds, feats, aux=aux)[1], module(embeds, feats, aux=aux)[1])
    assert E.load(tmp_path / "x").config == module.config  # the drafter runs an exported checkpoint as it is
    # Another trainer's checkpoint has no specdec block: its ids are read as ModelOpt, which defines the field,
    # numbers them (decoder-layer outputs), whatever its key names: ModelOpt 0.37's `midlayer.*`, later `layers.0.*`.
    del config["specdec"]
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    assert E.read_export(tmp_path / "x").config.aux_layers == [i + 1 for i in ids]
    if layout == "modelopt":
        save_file({k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}, str(tmp_path / "x" / "model.safetensors"))
        assert E.read_export(tmp_path / "x").config.aux_layers == [1, 2]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in range(3)]  # three named, fc takes two
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    with pytest.raises(EagleError, match="fc takes 64 inputs, expected 3 layers x 32"):
        E.read_export(tmp_path / "x")
    with pytest.raises(EagleError, match="unknown EAGLE-3 layout"):
        E.export_checkpoint(module, tmp_path / "y", "tiny-target", layout="sglang")


def test_two_layer_module_greedy(tiny_model):
    module = make_module(tiny_model, seed=12, layers=2)
    assert len(module.model.layers) == 2
    out, _ = run(tiny_model, Eagle(module, tiny_model.get_input_embeddings()), PROMPTS["repeat"], max_new_tokens=MAX_NEW)
    assert out == ar_reference(tiny_model, PROMPTS["repeat"])


# ----------------------------------------------------------------------------- bundled model


@pytest.mark.bundled
@pytest.mark.parametrize("eagle3", [False, True])
def test_bundled_random_module_equals_autoregressive(bundled, spec_bench_prompts, eagle3):
    model = bundled.model
    module = make_module(model, seed=0, draft_vocab=4096, attn=attention.register(), aux=[2, 15, 27] if eagle3 else None,
                         eagle3=eagle3)
    E.check_compatible(module, model)
    ids = bundled.encode(spec_bench_prompts["writing"])
    kwargs = dict(max_new_tokens=24, eos_token_ids=bundled.eos_token_ids)
    ref, _ = run(model, Autoregressive(), ids, **kwargs)
    rec = DrafterSpy(Eagle(module, model.get_input_embeddings()))
    out, _ = run(model, rec, ids, **kwargs)
    assert out == ref, f"first difference at {first_difference(out, ref)}: {bundled.decode(out)!r} vs {bundled.decode(ref)!r}"
    check_proposals(rec.calls, max_nodes=23, max_depth=5, top_k=4, module=module)
