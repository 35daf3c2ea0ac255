"""Greedy speculative decoding must reproduce greedy autoregressive decoding token for token.

The reference is always an independent computation: the Autoregressive drafter (one token per
target step), or a plain full-sequence forward pass of the model.
"""

import random

import pytest
import torch

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.drafters.suffix import Suffix
from app.decoding.sampling import SamplingParams, probs
from app.decoding.target import TransformersTarget
from app.decoding.types import Proposal
from helpers import DrafterSpy, run

MAX_NEW = 40


def _random(seed, n=20, vocab=96):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _phrase(seed):
    rng = random.Random(seed)
    phrase = [rng.randrange(96) for _ in range(6)]
    return _random(seed + 1, 7) + phrase + _random(seed + 2, 5) + phrase + _random(seed + 3, 3) + phrase[:2]


PROMPTS = {
    "repeat": [5, 6, 7, 8] * 6,
    "phrase": _phrase(10),
    "random_a": _random(1),
    "random_b": _random(2, n=9),
}

_AR_CACHE: dict = {}


def ar_reference(model, prompt, max_new_tokens=MAX_NEW):
    key = (id(model), tuple(prompt), max_new_tokens)
    if key not in _AR_CACHE:
        out, events = run(model, Autoregressive(), prompt, max_new_tokens=max_new_tokens)
        assert len(events) == len(out), "autoregressive must add exactly one token per step"
        _AR_CACHE[key] = out
    return _AR_CACHE[key]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_same(out, ref, label):
    assert out == ref, f"{label}: differs from autoregressive at index {first_difference(out, ref)}\n{out}\n{ref}"


# ----------------------------------------------------------------------------- prompt lookup


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("ngram", [1, 2, 3])
@pytest.mark.parametrize("num_tokens", [1, 3, 10])
def test_prompt_lookup(tiny_model, prompt, num_tokens, ngram):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    out, events = run(tiny_model, PromptLookup(num_tokens, ngram), PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ref, f"prompt_lookup({num_tokens}, {ngram})")
    assert all(len(e.proposed["tokens"]) <= num_tokens for e in events)


def test_prompt_lookup_fires_on_repetitive_prompt(tiny_model):
    _, events = run(tiny_model, PromptLookup(10, 2), PROMPTS["repeat"], max_new_tokens=MAX_NEW)
    assert sum(len(e.accepted) for e in events) >= 10
    assert len(events) < MAX_NEW


# ----------------------------------------------------------------------------- lookahead

LOOKAHEAD = {
    "2,2,1": dict(args=(2, 2, 1)),
    "4,3,4": dict(args=(4, 3, 4)),
    "5,4,5": dict(args=(5, 4, 5)),
    "7,5,7": dict(args=(7, 5, 7)),
    "3,3,0": dict(args=(3, 3, 0)),
    "1,3,4": dict(args=(1, 3, 4)),  # legal in TensorRT-LLM: W = 1 with N > 1
    "1,1,0": dict(args=(1, 1, 0)),  # degenerates to autoregressive
    "7,5,7/req3,3,2": dict(args=(7, 5, 7), request=(3, 3, 2)),
    "5,4,5/req2,2,1": dict(args=(5, 4, 5), request=(2, 2, 1)),
    "4,3,4/req4,2,4": dict(args=(4, 3, 4), request=(4, 2, 4)),
    "4,3,4/req1,1,0": dict(args=(4, 3, 4), request=(1, 1, 0)),
}


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("pool_from_prompt", [True, False], ids=["pool", "nopool"])
@pytest.mark.parametrize("config", list(LOOKAHEAD))
def test_lookahead(tiny_model, prompt, config, pool_from_prompt):
    spec = LOOKAHEAD[config]
    drafter = Lookahead(*spec["args"], request=spec.get("request"), pool_from_prompt=pool_from_prompt)
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    out, _ = run(tiny_model, drafter, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ref, f"lookahead {config} pool_from_prompt={pool_from_prompt}")


def test_lookahead_accepts_drafts_on_repetitive_prompt(tiny_model):
    _, events = run(tiny_model, Lookahead(4, 3, 4), PROMPTS["repeat"], max_new_tokens=MAX_NEW)
    assert sum(len(e.accepted) for e in events) >= 10


# ----------------------------------------------------------------------------- draft-target


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("max_draft_len", [1, 3, 8])
def test_draft_target_small_draft(tiny_model, tiny_draft, prompt, max_draft_len):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    out, events = run(tiny_model, DraftModel(tiny_draft, max_draft_len), PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ref, f"draft_target(small, {max_draft_len})")
    assert all(len(e.proposed["tokens"]) == max_draft_len for e in events[1:])


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("max_draft_len", [1, 3, 8])
def test_draft_target_self_draft(tiny_model, prompt, max_draft_len):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    out, events = run(tiny_model, DraftModel(tiny_model, max_draft_len), PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ref, f"draft_target(self, {max_draft_len})")
    # The target drafting for itself: every drafted token is accepted (the last event may be cut).
    for e in events[1:-1]:
        assert len(e.accepted) == len(e.proposed["tokens"]) == max_draft_len, e
        assert e.added_kind == "bonus"


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("size", [10, 60])
def test_draft_target_with_a_draft_vocabulary(tiny_model, tiny_draft, prompt, size):
    """The draft scores only `size` of the 96 tokens: its chain is its argmax among them, and the
    output is still the target's own."""
    ids = sorted(range(0, 96, 96 // size))[:size]
    d2t = torch.tensor(ids) - torch.arange(size)
    drafter = DrafterSpy(DraftModel(tiny_draft, 4, d2t=d2t))
    out, events = run(tiny_model, drafter, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ar_reference(tiny_model, PROMPTS[prompt]), f"draft_target(vocab {size})")
    with torch.inference_mode():
        for context, _, prop in drafter.calls[:3]:
            for i, tok in enumerate(prop.tokens):
                logits = tiny_draft(input_ids=torch.tensor([context + prop.tokens[:i]])).logits[0, -1]
                assert tok == ids[int(logits[ids].argmax())]
            assert prop.source["draft_vocab"] == size
    with pytest.raises(ValueError, match="draft vocabulary"):
        DraftModel(tiny_draft, 4, d2t=torch.tensor([0, 96]))


def test_draft_target_rejections_rewind_the_draft_cache(tiny_model, tiny_draft):
    """A small draft gets rejected often; after each rejection its cache must be rewound."""
    prompt = PROMPTS["random_a"]
    out, events = run(tiny_model, DraftModel(tiny_draft, 4), prompt, max_new_tokens=MAX_NEW)
    assert_same(out, ar_reference(tiny_model, prompt), "draft_target(small, 4)")
    assert any(e.added_kind == "correction" for e in events)


@torch.inference_mode()
@pytest.mark.parametrize("sampling", ["greedy", "t1"])
def test_draft_model_proposes_from_the_current_context(tiny_model, tiny_draft, sampling):
    """After rejections the draft's cache is rewound: every proposal is the draft model's own
    continuation of the current context (greedy: its argmax chain; sampling: q rows are its
    distributions after the drafted prefix), checked against a plain full forward."""
    params = SamplingParams() if sampling == "greedy" else SamplingParams(temperature=1.0, seed=0)
    drafter = DrafterSpy(DraftModel(tiny_draft, 4))
    _, events = run(tiny_model, drafter, PROMPTS["random_a"], sampling=params, max_new_tokens=MAX_NEW)
    assert sum(e.added_kind == "correction" for e in events) >= 3, "the test needs rejections"
    for context, _, prop in drafter.calls:
        for i, tok in enumerate(prop.tokens):
            logits = tiny_draft(input_ids=torch.tensor([context + prop.tokens[:i]])).logits[0, -1]
            if params.greedy:
                assert tok == int(logits.argmax()), (len(context), i, prop.tokens)
            else:
                torch.testing.assert_close(prop.q[i], probs(logits, params), atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- hand-made trees


class OracleTree:
    """Knows the reference output and proposes trees whose correct branch is never the first:
    decoy branches come first, the true continuation hangs off the root later, with decoy siblings
    along it and sometimes a wrong token at its end. Exercises tree attention and the KV move in
    commit() for non-prefix accepted paths."""

    name = "oracle_tree"
    needs_hidden = False

    def __init__(self, prompt, reference, vocab, seed=0):
        self.prompt, self.ref, self.vocab = list(prompt), list(reference), vocab
        self.rng = random.Random(seed)

    def start(self, prompt, sampling, gen, prefill):
        pass

    def _wrong(self, right):
        return (right + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab

    def propose(self, context, room):
        j = len(context) - len(self.prompt)
        truth = self.ref[j : j + min(room, 1 + self.rng.randrange(5))]
        if not truth:
            return Proposal()
        tokens, parents = [], []
        # Decoys first: a chain starting with a wrong token.
        for _ in range(self.rng.randrange(1, 3)):
            parent = -1
            for depth in range(1 + self.rng.randrange(min(3, len(truth)))):
                tokens.append(self._wrong(truth[0]) if depth == 0 else self.rng.randrange(self.vocab))
                parents.append(parent)
                parent = len(tokens) - 1
        # The truth, with a decoy sibling before each true node.
        parent = -1
        for tok in truth:
            tokens.append(self._wrong(tok))
            parents.append(parent)
            tokens.append(tok)
            parents.append(parent)
            parent = len(tokens) - 1
        if self.rng.random() < 0.5:  # a wrong last token below the true path
            tokens.append(self.rng.randrange(self.vocab))
            parents.append(parent)
        return Proposal(tokens, parents, source={"truth": truth})

    def observe(self, proposal, verdict, out):
        pass


class RandomTree:
    """Random junk trees: nothing should be accepted unless it happens to be right."""

    name = "random_tree"
    needs_hidden = False

    def __init__(self, vocab, seed=0):
        self.vocab, self.rng = vocab, random.Random(seed)

    def start(self, prompt, sampling, gen, prefill):
        pass

    def propose(self, context, room):
        n = min(room, self.rng.randrange(0, 9))
        parents = [self.rng.randrange(-1, i) for i in range(n)]
        tokens = [self.rng.randrange(self.vocab) for _ in range(n)]
        return Proposal(tokens, parents)

    def observe(self, proposal, verdict, out):
        pass


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("seed", [0, 1])
def test_oracle_trees_with_non_prefix_accepted_paths(tiny_model, prompt, seed):
    ref = ar_reference(tiny_model, PROMPTS[prompt])
    drafter = OracleTree(PROMPTS[prompt], ref, vocab=96, seed=seed)
    out, events = run(tiny_model, drafter, PROMPTS[prompt], max_new_tokens=MAX_NEW)
    assert_same(out, ref, "oracle tree")
    decodes = events[1:]
    # Every true token proposed was accepted; the accepted path is never the first nodes.
    for e in decodes[:-1]:
        assert e.accepted_tokens == e.source["truth"], e
        assert e.accepted and e.accepted != list(range(len(e.accepted)))
    assert len(events) < MAX_NEW / 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_trees_do_not_change_the_output(tiny_model, seed):
    prompt = PROMPTS["random_b"]
    out, _ = run(tiny_model, RandomTree(96, seed), prompt, max_new_tokens=MAX_NEW)
    assert_same(out, ar_reference(tiny_model, prompt), "random trees")


@torch.inference_mode()
def test_tree_forward_matches_sequential_forward(tiny_model):
    """Each slot's logits of a tree forward equal a plain forward of prompt + root + path; after
    committing a non-prefix path, the next forward matches the committed sequence."""
    model = tiny_model
    prompt = PROMPTS["random_a"]

    def last_logits(ids):
        return model(input_ids=torch.tensor([ids])).logits[0, -1]

    target = TransformersTarget(model)
    root = int(target.prefill(prompt).logits[-1].argmax())
    #   root -> a -> b -> c        root -> d -> e        root -> a' (dup token of a) ; e -> f, e -> g
    tokens = [11, 12, 13, 20, 21, 11, 22, 23]
    parents = [-1, 0, 1, -1, 3, -1, 4, 4]
    logits = target.forward(root, tokens, parents).logits
    assert logits.shape == (1 + len(tokens), model.config.vocab_size)
    torch.testing.assert_close(logits[0], last_logits(prompt + [root]), atol=1e-4, rtol=1e-4)
    paths = {0: [11], 1: [11, 12], 2: [11, 12, 13], 3: [20], 4: [20, 21], 5: [11], 6: [20, 21, 22], 7: [20, 21, 23]}
    for node, path in paths.items():
        torch.testing.assert_close(logits[node + 1], last_logits(prompt + [root] + path), atol=1e-4, rtol=1e-4)
    # Commit root -> d -> e -> g (nodes 3, 4, 7): not the first nodes of the tree.
    target.commit([3, 4, 7])
    committed = prompt + [root, 20, 21, 23]
    assert target.length == len(committed)
    chain = target.forward(30, [31, 32], [-1, 0]).logits
    for i in range(3):
        torch.testing.assert_close(chain[i], last_logits(committed + [30, 31, 32][: i + 1]), atol=1e-4, rtol=1e-4)
    target.commit([0])
    committed += [30, 31]
    tree = target.forward(40, [41, 42], [-1, -1]).logits
    torch.testing.assert_close(tree[2], last_logits(committed + [40, 42]), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- the bundled model

BUNDLED_MAX_NEW = 48
BUNDLED_CATEGORIES = ["writing", "rag"]  # a creative and a copy-heavy prompt; the tiny models cover the rest
BUNDLED_MODES = {
    "prompt_lookup": lambda b: PromptLookup(10, 2),
    "lookahead_4_3_4": lambda b: Lookahead(4, 3, 4),
    "lookahead_5_4_5": lambda b: Lookahead(5, 4, 5),
    "draft_target_self_3": lambda b: DraftModel(b.model, 3),
    "suffix": lambda b: Suffix(),
    "suffix_tree": lambda b: Suffix(suffix_decoding_max_spec_factor=2.0, use_tree_spec=True),
}


@pytest.mark.bundled
@pytest.mark.parametrize("category", BUNDLED_CATEGORIES)
def test_bundled_model_spec_bench(bundled, spec_bench_prompts, category):
    """One Spec-Bench prompt (first turn, chat template) per category: every mode equals autoregressive."""
    ids = bundled.encode(spec_bench_prompts[category])
    kwargs = dict(max_new_tokens=BUNDLED_MAX_NEW, eos_token_ids=bundled.eos_token_ids)
    ref, ar_events = run(bundled.model, Autoregressive(), ids, **kwargs)
    assert len(ref) >= 8 and len(ar_events) == len(ref)
    failures = []
    for name, make in BUNDLED_MODES.items():
        out, events = run(bundled.model, make(bundled), ids, **kwargs)
        if out != ref:
            failures.append(f"{name}: first difference at {first_difference(out, ref)}: {bundled.decode(out)!r}")
        assert events[-1].finish_reason == ar_events[-1].finish_reason, name
    assert not failures, f"{category}: reference {bundled.decode(ref)!r}\n" + "\n".join(failures)
