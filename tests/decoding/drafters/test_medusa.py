"""Medusa: heads, training loss, artifacts, TensorRT-LLM export, the drafter and typical acceptance.

Greedy Medusa must reproduce greedy autoregressive decoding token for token, whatever the heads
say; the references are independent (the Autoregressive drafter, hand-computed thresholds, a
per-position loop for the loss).
"""

import json
import math
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from app.decoding.acceptance import greedy, typical
from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.medusa import Medusa
from app.decoding.loop import accept
from app.decoding.sampling import SamplingParams
from app.decoding.target import ancestor_mask
from app.decoding.tree import depths, from_paths, leaf_paths
from app.decoding.types import Forward, Proposal
from app.modes import ConfigError
from app.modes.notation import medusa_choices
from app.heads import medusa as mh
from app.heads import vocab
from app.heads.medusa import MedusaConfig, MedusaError, MedusaHeads, medusa_loss
from helpers import DrafterSpy, run, tiny_llama
from helpers_decoding import PROMPTS, TREES, ar_reference, features, random_heads
from helpers_decoding import medusa_drafter as drafter

MAX_NEW = 40
V, H = 96, 32


def _random(seed, n=20, vocab=V):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


# ----------------------------------------------------------------------------- tree buffers


def test_from_paths_hand_built_tree():
    #            root
    #         /        \
    #     n0 [0]       n1 [1]
    #     /    \          \
    # n2 [0,0] n3 [0,1]   n4 [1,0]
    #    |
    # n5 [0,0,0]
    paths = [[0, 0, 0], [1, 0], [0], [0, 1], [1], [0, 0]]  # any order in, (depth, path) order out
    parents = from_paths(paths)
    assert parents == [-1, -1, 0, 0, 1, 2]
    assert depths(parents) == [1, 1, 2, 2, 2, 3]  # position ids = cache length + depth
    assert leaf_paths(parents) == [[0, 3], [1, 4], [0, 2, 5]]
    mask = ancestor_mask(parents)
    assert mask[6].tolist() == [True, True, False, True, False, False, True]  # n5 sees root, n0, n2, itself


def test_drafter_tree_matches_from_paths_and_head_topk(tiny_model):
    heads = random_heads()
    lm_head = tiny_model.get_output_embeddings()
    tree = TREES["wide"]
    d = Medusa(heads, lm_head, tree)
    hidden = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    d.start([1, 2, 3, 4, 5], SamplingParams(), torch.Generator(), Forward(torch.zeros(1, V), hidden))
    prop = d.propose([1, 2, 3, 4, 5, 6], room=100)
    ordered = sorted(tree, key=lambda p: (len(p), p))
    assert prop.source["tree"]["paths"] == ordered
    assert prop.parents == from_paths(tree)
    assert prop.source["heads"] == 3 and prop.acceptance is None
    with torch.no_grad():
        for node, path in enumerate(ordered):
            k = len(path) - 1
            h = hidden[-1]
            for block in heads.medusa_head[k]:  # independent: apply head k's ResBlocks by hand
                h = h + torch.nn.functional.silu(block.linear.weight @ h + block.linear.bias)
            probs = (lm_head.weight @ h).softmax(-1)
            order = torch.argsort(probs, descending=True)
            assert prop.tokens[node] == int(order[path[-1]]), (node, path)
            assert prop.source["tree"]["scores"][node] == pytest.approx(float(probs[order[path[-1]]]), abs=1e-4)
    json.dumps(prop.source)


@pytest.mark.parametrize("tree", list(TREES))
def test_propose_trims_to_room_keeping_an_ancestor_closed_prefix(tiny_model, tree):
    d = drafter(tiny_model, random_heads(), tree)
    hidden = torch.randn(3, H, generator=torch.Generator().manual_seed(1))
    d.start([1, 2, 3], SamplingParams(), torch.Generator(), Forward(torch.zeros(1, V), hidden))
    full = d.propose([1, 2, 3, 4], room=1000)
    for room in range(len(full.tokens) + 2):
        prop = d.propose([1, 2, 3, 4], room=room)
        n = min(room, len(full.tokens))
        assert prop.tokens == full.tokens[:n] and prop.parents == full.parents[:n]
        assert all(-1 <= p < i for i, p in enumerate(prop.parents))


@pytest.mark.parametrize("threshold", [0.02, 0.1, 0.3, 0.9])
def test_pruning_drops_nodes_whose_path_probability_is_low(tiny_model, oracle_heads, threshold):
    hidden = torch.randn(3, H, generator=torch.Generator().manual_seed(4))
    props = {}
    for heads_kind, heads in (("random", random_heads(std=1.0)), ("oracle", oracle_heads)):
        for p in (0.0, threshold):
            d = drafter(tiny_model, heads, "wide", min_path_prob=p)
            d.start([1, 2, 3], SamplingParams(), torch.Generator(), Forward(torch.zeros(1, V), hidden))
            props[heads_kind, p] = d.propose([1, 2, 3, 4], room=100)
        full, pruned = props[heads_kind, 0.0], props[heads_kind, threshold]
        product = {}
        for path, score in zip(full.source["tree"]["paths"], full.source["tree"]["scores"]):
            product[tuple(path)] = score * product.get(tuple(path[:-1]), 1.0)
        kept = [list(p) for p in product if product[p] >= threshold]
        assert pruned.source["tree"]["paths"] == kept and pruned.source["min_path_prob"] == threshold
        assert "min_path_prob" not in full.source
        assert pruned.parents == from_paths(kept) and len(pruned.tokens) == len(kept)
        assert pruned.tokens == [t for t, p in zip(full.tokens, full.source["tree"]["paths"]) if list(p) in kept]
    with pytest.raises(ValueError, match="min_path_prob"):
        drafter(tiny_model, random_heads(), min_path_prob=1.0)


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_pruned_trees_stay_lossless(tiny_model, oracle_heads, prompt):
    for p in (0.05, 0.5):
        out, events = run(tiny_model, drafter(tiny_model, oracle_heads, "wide", min_path_prob=p), PROMPTS[prompt],
                          max_new_tokens=MAX_NEW)
        assert out == ar_reference(tiny_model, PROMPTS[prompt])
        assert any(len(e.proposed["tokens"]) < len(TREES["wide"]) for e in events[1:])


@pytest.mark.parametrize(
    "choices, match",
    [
        ([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "depth 4"),
        ([[0], [1, 0]], "no parent path"),
        ([[0], [-1]], "ranks >= 0"),
    ],
)
def test_invalid_trees_are_rejected(tiny_model, choices, match):
    with pytest.raises(ValueError, match=match):
        Medusa(random_heads(), tiny_model.get_output_embeddings(), choices)


def test_lm_head_must_fit_the_heads(tiny_model):
    with pytest.raises(ValueError, match="LM head"):
        Medusa(random_heads(hidden=16), tiny_model.get_output_embeddings(), TREES["chain"])


def test_invalid_typical_parameters(tiny_model):
    with pytest.raises(ValueError, match="posterior_threshold"):
        drafter(tiny_model, random_heads(), posterior_threshold=0.0)
    with pytest.raises(ValueError, match="posterior_alpha"):
        drafter(tiny_model, random_heads(), posterior_alpha=-1.0)


def test_bfloat16_target_features(tiny_model):
    """A bfloat16 target hands bfloat16 hidden states and LM head to float32 heads."""
    import copy

    lm16 = copy.deepcopy(tiny_model.get_output_embeddings()).to(torch.bfloat16)
    d = Medusa(random_heads(), lm16, TREES["default"])
    hidden = torch.randn(3, H).to(torch.bfloat16)
    d.start([1, 2, 3], SamplingParams(), torch.Generator(), Forward(torch.zeros(1, V), hidden))
    prop = d.propose([1, 2, 3, 4], room=100)
    assert len(prop.tokens) == len(TREES["default"]) and all(0 <= t < V for t in prop.tokens)


# ----------------------------------------------------------------------------- greedy = autoregressive


@pytest.mark.parametrize("heads_kind", ["random", "oracle", "identity"])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_equals_autoregressive(tiny_model, oracle_heads, prompt, tree, heads_kind):
    heads = {"random": random_heads(), "oracle": oracle_heads, "identity": MedusaHeads(MedusaConfig(H, V))}[heads_kind]
    out, events = run(tiny_model, drafter(tiny_model, heads, tree), PROMPTS[prompt], max_new_tokens=MAX_NEW)
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    assert out == ref, f"{heads_kind}/{tree}/{prompt}: differs\n{out}\n{ref}"
    for e in events[1:]:
        assert len(e.proposed["tokens"]) == len(TREES[tree])
        json.dumps(e.to_dict())


def reduced_heads(heads, size, seed=0):
    """`heads` ranking `size` random tokens of the vocabulary."""
    ids = sorted(random.Random(seed).sample(range(V), size))
    d2t = torch.tensor(ids) - torch.arange(size)
    reduced = MedusaHeads(MedusaConfig(H, V, heads.config.medusa_num_heads, heads.config.medusa_num_layers,
                                       draft_vocab_size=size), d2t)
    reduced.load_state_dict({**heads.state_dict(), "d2t": d2t})
    return reduced.eval()


@pytest.mark.parametrize("size", [12, 40])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_with_a_draft_vocabulary_equals_autoregressive(tiny_model, oracle_heads, prompt, size):
    heads = reduced_heads(oracle_heads, size)
    allowed = set(heads.target_ids.tolist())
    out, events = run(tiny_model, drafter(tiny_model, heads, "wide"), PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert out == ar_reference(tiny_model, PROMPTS[prompt])
    assert all(set(e.proposed["tokens"]) <= allowed for e in events[1:])
    assert len(events) - 1 < len(out) or size == 12  # the oracle's drafts still land with 40 of 96 tokens


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=2)], ids=["greedy", "t1"])
def test_every_proposal_reads_the_hidden_state_under_the_root(tiny_model, oracle_heads, sampling):
    """The heads must read the hidden state that produced the root (at the token before it): checked
    against a plain full forward over the context, after accepted and rejected steps alike."""
    rec = DrafterSpy(drafter(tiny_model, oracle_heads, "wide"))
    _, events = run(tiny_model, rec, PROMPTS["random_b"], sampling=sampling, max_new_tokens=MAX_NEW)
    assert sum(len(e.accepted) for e in events) >= (5 if sampling.greedy else 1), "the check needs accepted drafts"
    lm_head = tiny_model.get_output_embeddings()
    with torch.no_grad():
        for context, _, prop in rec.calls:
            h = tiny_model(input_ids=torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
            probs = oracle_heads.logits(h, lm_head).softmax(-1)
            ranked = probs.sort(-1, descending=True).values
            for tok, path in zip(prop.tokens, prop.source["tree"]["paths"]):
                d, r = len(path) - 1, path[-1]
                assert float(probs[d, tok]) == pytest.approx(float(ranked[d, r]), abs=1e-5), (len(context), path)


def test_oracle_heads_get_drafts_accepted(tiny_model, oracle_heads):
    for prompt in PROMPTS.values():
        _, events = run(tiny_model, drafter(tiny_model, oracle_heads), prompt, max_new_tokens=MAX_NEW)
        accepted = sum(len(e.accepted) for e in events)
        assert accepted >= MAX_NEW // 4, f"oracle heads accepted only {accepted} drafts"
        assert any(len(e.accepted) >= 2 for e in events), "deeper heads never accepted"


def test_random_heads_sometimes_accepted_beyond_rank_zero(tiny_model, oracle_heads):
    """A correct guess at rank > 0 or off the first branch is accepted: exercises the KV gather."""
    found = False
    for prompt in PROMPTS.values():
        _, events = run(tiny_model, drafter(tiny_model, oracle_heads, "wide"), prompt, max_new_tokens=MAX_NEW)
        found |= any(e.accepted and e.accepted[0] != 0 for e in events)
    assert found


def test_trees_trimmed_near_the_context_end(short_model):
    """A 48-token context: the last steps have less room than the tree; output still equals autoregressive."""
    heads = random_heads(seed=4)
    for prompt in ([5, 6, 7, 8] * 9, _random(7, n=30)):
        rec = DrafterSpy(drafter(short_model, heads, "wide"))
        out, events = run(short_model, rec, prompt, max_new_tokens=100)
        assert out == ar_reference(short_model, prompt, 100)
        assert len(prompt) + len(out) == 48 and events[-1].finish_reason == "length"
        rooms = [room for _, room, _ in rec.calls]
        assert min(rooms) < len(TREES["wide"]), "the test must reach the context end"
        for _, room, prop in rec.calls:
            assert len(prop.tokens) == min(room, len(TREES["wide"]))


def test_eos_and_max_new_tokens_inside_the_tree(tiny_model, oracle_heads):
    prompt = PROMPTS["random_a"]
    ref = ar_reference(tiny_model, prompt)
    cut_inside = 0
    for max_new in range(1, 15):
        out, events = run(tiny_model, drafter(tiny_model, oracle_heads), prompt, max_new_tokens=max_new)
        assert out == ref[:max_new]
        cut_inside += events[-1].added_token is None
    for j in range(1, 20):
        eos = ref[j]
        d = drafter(tiny_model, oracle_heads)
        out, events = run(tiny_model, d, prompt, max_new_tokens=MAX_NEW, eos_token_ids=[eos])
        assert out == ref[: ref.index(eos) + 1] and events[-1].finish_reason == "eos"
        cut_inside += events[-1].added_token is None
    assert cut_inside > 0, "no case had EOS / max_new_tokens inside the accepted drafts"


# ----------------------------------------------------------------------------- sampling


def test_proposal_asks_for_typical_only_when_sampling(tiny_model):
    hidden = torch.randn(2, H)
    t07 = SamplingParams(temperature=0.7)
    cases = [(False, t07), (True, SamplingParams()), (True, t07)]
    for typ, sampling in cases:
        d = drafter(tiny_model, random_heads(), typical_acceptance=typ, posterior_threshold=0.2, posterior_alpha=0.5)
        d.start([1, 2], sampling, torch.Generator(), Forward(torch.zeros(1, V), hidden))
        prop = d.propose([1, 2, 3], room=50)
        if typ and not sampling.greedy:
            assert prop.acceptance == {"rule": "typical", "posterior_threshold": 0.2, "posterior_alpha": 0.5}
            assert prop.source["acceptance"] == "typical"
        else:
            assert prop.acceptance is None and "acceptance" not in prop.source


def test_loop_accept_honours_typical_only_under_sampling():
    # Slot 0: argmax is token 0 (p 0.5); the draft is token 1 (p 0.4): greedy rejects, typical accepts.
    logits = torch.log(torch.tensor([[0.5, 0.4, 0.1, 1e-9], [0.1, 0.1, 0.7, 0.1]]))
    rule = {"rule": "typical", "posterior_threshold": 0.09, "posterior_alpha": 0.3}
    prop = Proposal([1], [-1], acceptance=rule)
    gen = torch.Generator().manual_seed(0)
    v = accept(prop, logits, SamplingParams(), gen)
    assert (v.accepted, v.added, v.added_kind) == ([], 0, "correction")
    v = accept(prop, logits, SamplingParams(temperature=1.0), gen)
    assert (v.accepted, v.added, v.added_kind) == ([0], 2, "bonus")
    with pytest.raises(ValueError, match="unknown acceptance rule"):
        accept(Proposal([1], [-1], acceptance={"rule": "nope"}), logits, SamplingParams(temperature=1.0), gen)


def test_typical_with_a_strict_threshold_equals_greedy(tiny_model, oracle_heads):
    """p(x) > 0.5 only holds for the argmax, and the added token is the argmax: after the first token
    (sampled by the loop from the prefill) the output is the greedy one even at temperature 1."""
    for prompt in PROMPTS.values():
        d = drafter(tiny_model, oracle_heads, typical_acceptance=True, posterior_threshold=0.5, posterior_alpha=1e9)
        sampling = SamplingParams(temperature=1.0, seed=0)
        out, events = run(tiny_model, d, prompt, sampling=sampling, max_new_tokens=MAX_NEW)
        assert out[1:] == ar_reference(tiny_model, prompt + out[:1], MAX_NEW - 1)


def test_typical_strict_threshold_accepts_drafts_on_a_peaked_model():
    model = tiny_llama(vocab=V, hidden=H, layers=2, seed=3, init=0.3)
    sampling = SamplingParams(temperature=1.0, seed=0)
    # The loop samples the first token from the prefill (the heads play no part in it); fit the
    # heads on the greedy continuation after it.
    first, _ = run(model, Autoregressive(), PROMPTS["repeat"], sampling=sampling, max_new_tokens=1)
    prompt = PROMPTS["repeat"] + first
    seqs = [prompt + ar_reference(model, prompt, 60)]
    hidden, mask = features(model, seqs)
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(H, V, 3, 1))
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-2)
    for _ in range(100):
        loss = medusa_loss(heads, model.get_output_embeddings(), None, hidden, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    d = drafter(model, heads.eval(), typical_acceptance=True, posterior_threshold=0.5, posterior_alpha=1e9)
    out, events = run(model, d, PROMPTS["repeat"], sampling=sampling, max_new_tokens=MAX_NEW)
    assert out[:1] == first and out[1:] == ar_reference(model, prompt, MAX_NEW - 1)
    assert sum(len(e.accepted) for e in events) >= 5


def test_sampling_with_typical_acceptance_runs(tiny_model, oracle_heads):
    sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=1)
    out, events = run(tiny_model, drafter(tiny_model, oracle_heads, typical_acceptance=True), PROMPTS["repeat"], sampling=sampling,
                      max_new_tokens=MAX_NEW)
    assert len(out) == MAX_NEW and all(0 <= t < V for t in out)
    json.dumps([e.to_dict() for e in events])


def test_sampling_without_typical_is_reproducible(tiny_model, oracle_heads):
    sampling = SamplingParams(temperature=1.0, seed=5)
    a, _ = run(tiny_model, drafter(tiny_model, oracle_heads), PROMPTS["random_a"], sampling=sampling, max_new_tokens=20)
    b, _ = run(tiny_model, drafter(tiny_model, oracle_heads), PROMPTS["random_a"], sampling=sampling, max_new_tokens=20)
    assert a == b


# ----------------------------------------------------------------------------- typical acceptance rule


def ref_threshold(p, eps, alpha):
    p = np.asarray(p, dtype=np.float64)
    nz = p[p > 0]
    entropy = -(nz * np.log(nz)).sum()
    return min(eps, alpha * math.exp(-entropy))


P0 = [0.55, 0.25, 0.12, 0.06, 0.02]


@pytest.mark.parametrize("eps, alpha", [(0.09, 0.3), (0.2, 0.3), (0.3, 10.0), (0.01, 0.01)])
@pytest.mark.parametrize("x", range(5))
def test_typical_accepts_iff_above_threshold(x, eps, alpha):
    p = torch.tensor([P0, [0.2, 0.2, 0.2, 0.2, 0.2]])
    v = typical([x], [-1], p, eps, alpha)
    thr = ref_threshold(P0, eps, alpha)
    if P0[x] > thr:
        assert (v.accepted, v.added, v.added_kind) == ([0], 0, "bonus")
    else:
        assert (v.accepted, v.added, v.added_kind) == ([], 0, "correction")


def test_typical_threshold_follows_entropy():
    # Same token probability 0.3: accepted under a flat (uncertain) target, rejected under a peaked one
    # when alpha * exp(-H) is the binding term.
    flat = [0.3, 0.25, 0.25, 0.2]
    peaked = [0.3, 0.7, 0.0, 0.0]
    assert ref_threshold(flat, 1.0, 1.0) < 0.3 < ref_threshold(peaked, 1.0, 1.0)
    assert typical([0], [-1], torch.tensor([flat, flat]), 1.0, 1.0).accepted == [0]
    assert typical([0], [-1], torch.tensor([peaked, flat]), 1.0, 1.0).accepted == []


def test_typical_longest_path_wins():
    #        root
    #      /      \
    #  n0: 0       n1: 1
    #               |
    #             n2: 2
    p = torch.tensor([[0.5, 0.4, 0.1, 0.0], [0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.6, 0.2], [0.0, 0.0, 0.1, 0.9]])
    v = typical([0, 1, 2], [-1, -1, 1], p, 0.09, 0.3)
    assert (v.accepted, v.added, v.added_kind) == ([1, 2], 3, "bonus")


def test_typical_ties_go_to_the_largest_log_likelihood():
    #         root
    #       /      \
    #  n0: 0        n1: 1
    #    |            |
    #  n2: 2        n3: 3
    # Both depth-2 paths are accepted; log-likelihoods .3 * .9 = .27 against .6 * .4 = .24.
    p = torch.tensor(
        [
            [0.3, 0.6, 0.1, 0.0],  # root: n0 p .3, n1 p .6
            [0.05, 0.05, 0.9, 0.0],  # after n0: n2 p .9
            [0.3, 0.2, 0.1, 0.4],  # after n1: n3 p .4
            [0.1, 0.1, 0.1, 0.7],  # after n2
            [0.1, 0.8, 0.1, 0.0],  # after n3
        ]
    )
    v = typical([0, 1, 2, 3], [-1, -1, 0, 1], p, 0.09, 0.3)
    assert (v.accepted, v.added, v.added_kind) == ([0, 2], 3, "bonus")
    p[2] = torch.tensor([0.1, 0.1, 0.0, 0.8])  # now .6 * .8 = .48 beats .27
    v = typical([0, 1, 2, 3], [-1, -1, 0, 1], p, 0.09, 0.3)
    assert (v.accepted, v.added, v.added_kind) == ([1, 3], 1, "bonus")


def test_typical_depth_one_tie_prefers_the_likelier_sibling_even_if_later():
    p = torch.tensor([[0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.9, 0.05, 0.05]])
    v = typical([0, 1], [-1, -1], p, 0.09, 0.3)
    assert (v.accepted, v.added) == ([1], 0)


def test_typical_rejected_parent_blocks_children_and_empty_draft():
    p = torch.tensor([[0.9, 0.05, 0.05], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    v = typical([2, 2], [-1, 0], p, 0.09, 0.3)  # n0 (p .05) rejected, so n1 is too
    assert (v.accepted, v.added, v.added_kind) == ([], 0, "correction")
    v = typical([], [], p[:1], 0.09, 0.3)
    assert (v.accepted, v.added, v.added_kind) == ([], 0, "next")


@pytest.mark.parametrize("seed", range(20))
def test_typical_strict_threshold_accepts_only_argmax_tokens(seed):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    n = rng.randrange(1, 10)
    parents = [rng.randrange(-1, i) for i in range(n)]
    p = torch.softmax(torch.randn(n + 1, 6, generator=gen) * 3, -1)
    # Tokens: mostly the argmax of the parent's slot, sometimes another token.
    tokens = [int(p[par + 1].argmax()) if rng.random() < 0.7 else rng.randrange(6) for par in parents]
    v = typical(tokens, parents, p, 0.5, 1e9)
    slots = [0] + [i + 1 for i in v.accepted]
    for node, slot in zip(v.accepted, slots):
        assert tokens[node] == int(p[slot].argmax()) and float(p[slot].max()) > 0.5
    assert v.added == int(p[slots[-1]].argmax())
    # With eps = 1 nothing can pass: greedy's added token, no drafts.
    none = typical(tokens, parents, p, 1.0, 1e9)
    g = greedy(tokens, parents, p.argmax(-1).tolist())
    assert none.accepted == [] and none.added == int(p[0].argmax())
    assert len(v.accepted) <= len(g.accepted)


# ----------------------------------------------------------------------------- heads and loss


def test_fresh_heads_are_the_identity():
    heads = MedusaHeads(MedusaConfig(H, V, 4, 2))
    x = torch.randn(2, 5, H)
    out = heads(x)
    assert out.shape == (4, 2, 5, H)
    assert torch.equal(out, x.expand(4, -1, -1, -1))
    assert all(not p.detach().any() for p in heads.parameters())


def test_logits_of_every_head_through_the_shared_lm_head(tiny_model):
    heads = random_heads()
    lm_head = tiny_model.get_output_embeddings()
    x = torch.randn(7, H)
    logits = heads.logits(x, lm_head)
    assert logits.shape == (3, 7, V) and logits.dtype == torch.float32 and heads.target_ids is None
    with torch.no_grad():
        for k in range(3):
            assert torch.allclose(logits[k], lm_head(heads.medusa_head[k](x)), atol=1e-6)


def test_a_draft_vocabulary_ranks_only_its_tokens(tiny_model):
    """Column j of a reduced head's logits is target token target_ids[j], the same value as the full head's."""
    lm_head = tiny_model.get_output_embeddings()
    full = random_heads()
    d2t = vocab.from_counts(torch.arange(V).flip(0), 10)  # the 10 lowest ids "most frequent"
    reduced = MedusaHeads(MedusaConfig(H, V, 3, 1, draft_vocab_size=10), d2t)
    reduced.load_state_dict({**full.state_dict(), "d2t": d2t})
    assert reduced.target_ids.tolist() == list(range(10))
    x = torch.randn(5, H)
    assert torch.allclose(reduced.logits(x, lm_head), full.logits(x, lm_head)[..., :10], atol=1e-6)
    with pytest.raises(MedusaError, match="outside the target vocabulary"):
        MedusaHeads(MedusaConfig(H, V, draft_vocab_size=2), torch.tensor([0, V]))
    with pytest.raises(MedusaError, match="draft_vocab_size must be"):
        MedusaConfig(H, V, draft_vocab_size=V + 1)


def reference_loss(heads, lm_head, hidden, mask, weights, ids=None):
    """Per position and head, by hand; `ids`: the ranked tokens (teacher renormalised over them)."""
    total, norm = 0.0, sum(weights)
    ids = list(range(lm_head.weight.shape[0])) if ids is None else ids
    with torch.no_grad():
        for k in range(heads.config.medusa_num_heads):
            terms = []
            for b in range(hidden.shape[0]):
                for i in range(hidden.shape[1] - k - 1):
                    if not (mask[b, i] and mask[b, i + k + 1]):
                        continue
                    teacher = lm_head(hidden[b, i + k + 1])[ids].softmax(-1)
                    student = lm_head(heads.medusa_head[k](hidden[b, i]))[ids].log_softmax(-1)
                    terms.append(float(-(teacher * student).sum()))
            if terms:
                total += weights[k] / norm * sum(terms) / len(terms)
    return total


def test_medusa_loss_matches_a_per_position_reference():
    model = tiny_llama(vocab=V, hidden=H, layers=1, seed=2, init=0.3)
    lm_head = model.get_output_embeddings()
    hidden, mask = features(model, [_random(3, 12), _random(4, 7), _random(5, 3)])
    heads = random_heads(std=0.2)
    loss = medusa_loss(heads, lm_head, None, hidden, mask)
    expected = reference_loss(heads, lm_head, hidden, mask, [1.0, 0.8, 0.64])
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    custom = medusa_loss(heads, lm_head, None, hidden, mask, head_weights=[0.0, 1.0, 0.0])
    expected = reference_loss(heads, lm_head, hidden, mask, [0.0, 1.0, 0.0])
    assert float(custom.detach()) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="head_weights"):
        medusa_loss(heads, lm_head, None, hidden, mask, head_weights=[1.0])
    ids = [2, 5, 7, 11, 30, 64, 90]
    d2t = torch.tensor(ids) - torch.arange(len(ids))
    reduced = MedusaHeads(MedusaConfig(H, V, 3, 1, draft_vocab_size=len(ids)), d2t)
    reduced.load_state_dict({**heads.state_dict(), "d2t": d2t})
    loss = medusa_loss(reduced, lm_head, None, hidden, mask)
    assert float(loss.detach()) == pytest.approx(reference_loss(heads, lm_head, hidden, mask, [1.0, 0.8, 0.64], ids), rel=1e-5)


def test_medusa_loss_ignores_padding():
    model = tiny_llama(vocab=V, hidden=H, layers=1, seed=2, init=0.3)
    lm_head = model.get_output_embeddings()
    hidden, mask = features(model, [_random(3, 12), _random(4, 5)])
    heads = random_heads(std=0.2)
    noisy = hidden.clone()
    noisy[~mask] = torch.randn(int((~mask).sum()), H) * 5
    with torch.no_grad():
        assert float(medusa_loss(heads, lm_head, None, hidden, mask)) == pytest.approx(
            float(medusa_loss(heads, lm_head, None, noisy, mask)), rel=1e-6
        )
    # Too short for every head: still a differentiable zero.
    loss = medusa_loss(heads, lm_head, None, hidden[:, :1], mask[:, :1])
    loss.backward()
    assert float(loss.detach()) == 0.0


def test_medusa_loss_decreases_with_training():
    model = tiny_llama(vocab=V, hidden=H, layers=2, seed=2, init=0.3)
    lm_head = model.get_output_embeddings()
    hidden, mask = features(model, [_random(s, 40) for s in range(8)])
    heads = MedusaHeads(MedusaConfig(H, V, 3, 1))
    opt = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = medusa_loss(heads, lm_head, None, hidden, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.2, losses[::8]
    assert all(p.grad is None for p in lm_head.parameters()), "the target's LM head must stay frozen"


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16_autocast"])
def test_medusa_loss_with_the_training_loop(bf16):
    """The loss as the closure `fit` takes, on features from `compute_features` (bfloat16 storage)."""
    from app.training.data import compute_features
    from app.training.trainer import fit

    model = tiny_llama(vocab=V, hidden=H, layers=2, seed=2, init=0.3)
    lm_head = model.get_output_embeddings()
    feats = compute_features(model, [_random(s, 10 + 3 * s) for s in range(8)], batch_size=4)
    heads = MedusaHeads(MedusaConfig(H, V, 2, 1))
    losses = fit(heads, lambda b: medusa_loss(heads, lm_head, b.ids, b.hidden, b.mask), feats,
                 epochs=15, lr=1e-2, batch_size=4, seq_len=32, warmup=2, bf16=bf16)
    assert len(losses) == 30 and losses[-1] < losses[0] - 0.1, losses[::6]


def test_head_accuracy_and_greedy_tree(tiny_model, oracle_heads):
    seqs = [p + ar_reference(tiny_model, p, 60) for p in PROMPTS.values()]
    hidden, mask = features(tiny_model, seqs)
    acc = mh.head_accuracy(oracle_heads, tiny_model.get_output_embeddings(), hidden, mask, max_rank=4)
    assert len(acc) == 3 and all(len(a) == 4 for a in acc)
    assert all(0 <= x <= 1 for a in acc for x in a) and all(sum(a) <= 1 + 1e-6 for a in acc)
    lm_head = tiny_model.get_output_embeddings()
    fresh = mh.head_accuracy(MedusaHeads(MedusaConfig(H, V)), lm_head, hidden, mask, max_rank=4)
    assert acc[0][0] > max(0.2, fresh[0][0]), (acc, fresh)
    tree = mh.greedy_tree(acc, 10)
    assert len(tree) == 10 and tree == sorted(tree, key=lambda p: (len(p), p))
    from_paths(tree)  # ancestor-closed
    assert mh.greedy_tree([[0.6, 0.2], [0.5, 0.1]], 3) == [[0], [1], [0, 0]]  # .6, .3, .2 beat .12, .1


def test_asset_trees():
    for name in ("default", "small", "chain", "greedy_63"):
        paths = medusa_choices(name)
        from_paths(paths)
        assert len({tuple(p) for p in paths}) == len(paths)
    assert 16 <= len(medusa_choices("default")) <= 24 and max(map(len, medusa_choices("default"))) <= 3
    big = medusa_choices("greedy_63")
    assert len(big) == 63 and max(map(len, big)) == 4 and max(max(p) for p in big) < 10
    with pytest.raises(ConfigError, match="unknown tree 'nope'"):
        medusa_choices("nope")


# ----------------------------------------------------------------------------- artifacts


def test_save_load_round_trip(tmp_path, tiny_model):
    heads = random_heads(num_heads=2, num_layers=2)
    mh.save(heads, tmp_path / "m", base_model="tiny")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config == {"architecture": "medusa", "hidden_size": H, "vocab_size": V, "medusa_num_heads": 2,
                      "medusa_num_layers": 2, "base_model": "tiny", "shared_lm_head": True}
    assert mh.load_config(tmp_path / "m")["base_model"] == "tiny"
    loaded = mh.load(tmp_path / "m")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    x = torch.randn(4, H)
    lm = tiny_model.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded.logits(x, lm), heads.logits(x, lm))
    mh.check_compatible(loaded, tiny_model)


def test_save_load_round_trip_with_a_draft_vocabulary(tmp_path, tiny_model):
    heads = reduced_heads(random_heads(), 20, seed=3)
    mh.save(heads, tmp_path / "r", base_model="tiny")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["draft_vocab_size"] == 20
    loaded = mh.load(tmp_path / "r")
    assert torch.equal(loaded.target_ids, heads.target_ids)
    x = torch.randn(4, H)
    lm = tiny_model.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded.logits(x, lm), heads.logits(x, lm))
    mh.check_compatible(loaded, tiny_model)
    out = mh.export_trtllm(loaded, lm.weight, tmp_path / "x", base_model="tiny")
    tensors = load_file(str(out / mh.TRTLLM_WEIGHTS))
    assert "d2t" not in tensors and "token_map" not in tensors  # the engines rank the whole vocabulary (export_trtllm)


def test_load_errors(tmp_path, tiny_model):
    with pytest.raises(MedusaError, match="config.json is missing"):
        mh.load(tmp_path / "absent")
    mh.save(random_heads(), tmp_path / "m", base_model="tiny")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(MedusaError, match="model.safetensors is missing"):
        mh.load(tmp_path / "m")
    mh.save(random_heads(), tmp_path / "e", base_model="tiny")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    (tmp_path / "e" / "config.json").write_text(json.dumps({**cfg, "architecture": "eagle"}))
    with pytest.raises(MedusaError, match="not Medusa"):
        mh.load(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text(json.dumps({**cfg, "medusa_num_heads": 5}))
    with pytest.raises(MedusaError, match="do not match"):
        mh.load(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 16}))
    with pytest.raises(MedusaError, match="shape"):
        mh.load(tmp_path / "e")
    with pytest.raises(MedusaError, match="hidden size 16 but the target has 32"):
        mh.check_compatible(MedusaHeads(MedusaConfig(16, V)), tiny_model)
    with pytest.raises(MedusaError, match="vocabulary"):
        mh.check_compatible(MedusaHeads(MedusaConfig(H, 50)), tiny_model)


def test_export_trtllm_layout_and_round_trip(tmp_path, tiny_model):
    from safetensors.torch import load_file

    heads = random_heads(num_heads=3, num_layers=2)
    lm_weight = tiny_model.get_output_embeddings().weight
    mh.export_trtllm(heads, lm_weight, tmp_path / "x", base_model="org/tiny", dtype=torch.float32)
    config = json.loads((tmp_path / "x" / "config.json").read_text())
    assert config == {"medusa_num_heads": 3, "medusa_num_layers": 2, "hidden_size": H, "vocab_size": V,
                      "base_model_name_or_path": "org/tiny", "medusa_fc_bias": True}
    tensors = load_file(str(tmp_path / "x" / "medusa_lm_head.safetensors"))
    # The keys TensorRT-LLM's load_medusa_hf reads (state dict of Medusa's `medusa_head` ModuleList).
    expected = {f"{k}.{l}.linear.{w}" for k in range(3) for l in range(2) for w in ("weight", "bias")}
    expected |= {f"{k}.2.weight" for k in range(3)}
    assert set(tensors) == expected
    for k in range(3):
        assert torch.equal(tensors[f"{k}.2.weight"], lm_weight)
        assert torch.equal(tensors[f"{k}.1.linear.bias"], heads.medusa_head[k][1].linear.bias)
    back = mh.read_export(tmp_path / "x", lm_head_weight=lm_weight)
    x = torch.randn(3, H)
    with torch.no_grad():
        assert torch.equal(back(x), heads(x))
    # Default float16 export: reads back with fp16-rounded weights.
    mh.export_trtllm(heads, lm_weight, tmp_path / "h", base_model="org/tiny")
    assert load_file(str(tmp_path / "h" / "medusa_lm_head.safetensors"))["0.0.linear.weight"].dtype == torch.float16
    with torch.no_grad():
        assert torch.allclose(mh.read_export(tmp_path / "h")(x), heads(x), atol=1e-2)


def test_read_export_rejects_separate_lm_heads(tmp_path, tiny_model):
    from safetensors.torch import load_file, save_file

    lm_weight = tiny_model.get_output_embeddings().weight
    mh.export_trtllm(random_heads(), lm_weight, tmp_path / "x", base_model="t", dtype=torch.float32)
    path = tmp_path / "x" / "medusa_lm_head.safetensors"
    tensors = load_file(str(path))
    tensors["1.1.weight"] = tensors["1.1.weight"] + 1
    save_file(tensors, str(path))
    with pytest.raises(MedusaError, match="LM heads differ"):
        mh.read_export(tmp_path / "x")
    with pytest.raises(MedusaError, match="needs config.json"):
        mh.read_export(tmp_path / "nothing")
    with pytest.raises(MedusaError, match="lm_head_weight has shape"):
        mh.export_trtllm(random_heads(), lm_weight[:10], tmp_path / "y", base_model="t")


# ----------------------------------------------------------------------------- the bundled model


@pytest.mark.bundled
def test_bundled_identity_heads_equal_autoregressive(bundled, spec_bench_prompts):
    """Fresh (identity) heads on the real model: every head guesses the target's own next-token
    ranking, so drafts are plausible and sometimes right; the output must still be exact."""
    ids = bundled.encode(spec_bench_prompts["writing"])
    lm_head = bundled.model.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    heads = MedusaHeads(MedusaConfig(hidden, vocab))
    mh.check_compatible(heads, bundled.model)
    kwargs = dict(max_new_tokens=24, eos_token_ids=bundled.eos_token_ids)
    ref, _ = run(bundled.model, Autoregressive(), ids, **kwargs)
    out, events = run(bundled.model, Medusa(heads, lm_head, medusa_choices("default")), ids, **kwargs)
    assert out == ref, f"{bundled.decode(out)!r}\n{bundled.decode(ref)!r}"
    assert all(len(e.proposed["tokens"]) == 16 for e in events[1:])
