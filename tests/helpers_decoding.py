"""Helpers the decoding tests share: the sampling-exactness check (the exact distribution of a tiny model's first tokens
against many seeded runs), the tiny target's prompts and its autoregressive reference, EAGLE modules and Medusa heads with
random weights. The fixtures built from them (a trained EAGLE module, oracle Medusa heads) are in conftest.py."""

import math
import random
from collections import Counter

import torch

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.medusa import Medusa
from app.decoding.sampling import SamplingParams
from app.heads.eagle import EagleConfig, EagleModule
from app.heads.medusa import MedusaConfig, MedusaHeads
from app.modes.notation import medusa_choices
from helpers import chisquare_gof, empirical, marginal, reference_probs, run, total_variation

# ----------------------------------------------------------------------------- sampling exactness (test_sampling_exactness.py)

PROMPT = [1, 2, 3, 4] * 4
LENGTH = 3  # tokens per run
RUNS = 2000
P_MIN = 1e-3  # chi-square p-value threshold (seeds are fixed, so results are reproducible)
TV_FIRST = 0.05
TV_FIRST_TWO = 0.08

T1 = dict(temperature=1.0)
WARPED = dict(temperature=0.8, top_k=5, top_p=0.9)


@torch.inference_mode()
def exact_distribution(model, prompt, params: dict) -> dict:
    """P(t1, t2, t3 | prompt) by enumeration, with an independent temperature/top-k/top-p."""
    vocab = model.config.vocab_size
    seqs = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])
    logits = model(input_ids=seqs).logits.double().numpy()  # (V*V, L+2, V)
    n = len(prompt)
    kw = dict(temperature=params["temperature"], top_k=params.get("top_k", 0), top_p=params.get("top_p", 1.0))
    p1 = reference_probs(logits[0, n - 1], **kw)
    out = {}
    for a in range(vocab):
        p2 = reference_probs(logits[a * vocab, n], **kw)
        for b in range(vocab):
            p3 = reference_probs(logits[a * vocab + b, n + 1], **kw)
            for c in range(vocab):
                out[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return out


def sample_runs(model, make_drafter, params: dict, runs=RUNS, seed0=0):
    counts, accepted, drafted = Counter(), 0, 0
    for seed in range(seed0, seed0 + runs):
        out, events = run(model, make_drafter(), PROMPT, sampling=SamplingParams(**params, seed=seed), max_new_tokens=LENGTH)
        assert len(out) == LENGTH
        counts[tuple(out)] += 1
        accepted += sum(len(e.accepted) for e in events)
        drafted += sum(len(e.proposed["tokens"]) for e in events)
    return counts, accepted, drafted


def check_against_exact(counts: Counter, exact: dict, label: str):
    emp = empirical(counts.elements())
    tv1 = total_variation(marginal(emp, 1), marginal(exact, 1))
    tv2 = total_variation(marginal(emp, 2), marginal(exact, 2))
    _, _, p_joint = chisquare_gof(counts, exact)
    _, _, p_first = chisquare_gof(Counter(k[:1] for k in counts.elements()), marginal(exact, 1))
    msg = f"{label}: TV first {tv1:.3f}, TV first two {tv2:.3f}, chi-square p first {p_first:.1e}, joint {p_joint:.1e}"
    assert tv1 < TV_FIRST and tv2 < TV_FIRST_TWO and p_first > P_MIN and p_joint > P_MIN, msg


_CACHE: dict = {}


def cached(key, fn):
    if key not in _CACHE:
        _CACHE[key] = fn()
    return _CACHE[key]


# ----------------------------------------------------------------------------- the tiny target's prompts and reference

MAX_NEW = 40
V, H = 96, 32


def _random(seed, n=20, vocab=V):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


PROMPTS = {"repeat": [5, 6, 7, 8] * 6, "random_a": _random(1), "random_b": _random(2, n=9), "short": [3]}

_AR: dict = {}


def ar_reference(model, prompt, max_new_tokens=MAX_NEW, **kwargs):
    key = (id(model), tuple(prompt), max_new_tokens, tuple(sorted(kwargs.items())))
    if key not in _AR:
        out, events = run(model, Autoregressive(), prompt, max_new_tokens=max_new_tokens, **kwargs)
        assert len(events) == len(out)
        _AR[key] = (out, events[-1].finish_reason)
    return _AR[key][0]


# ----------------------------------------------------------------------------- EAGLE modules (test_eagle.py)


def make_module(target, seed=0, draft_vocab=None, scale=1.5, attn=None, layers=1, aux=None, eagle3=False) -> EagleModule:
    """A module with random, non-trivial weights (and a random reduced vocabulary, fused target
    layers `aux`, EAGLE-3's layer, when asked)."""
    config = EagleConfig.from_target(target.config, draft_vocab_size=draft_vocab, eagle_num_layers=layers, aux_layers=aux,
                                     eagle3=eagle3)
    gen = torch.Generator().manual_seed(seed)
    d2t = None
    if draft_vocab and draft_vocab < config.vocab_size:
        ids = torch.randperm(config.vocab_size, generator=gen)[:draft_vocab].sort().values
        d2t = ids - torch.arange(draft_vocab)
    module = EagleModule(config, d2t, attn)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:  # RMSNorm weights
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * scale / math.sqrt(p.shape[-1]))
    return module.eval()


@torch.no_grad()
def greedy_data(model, n, prompt_len, new, seed):
    """The target's own greedy continuations of random prompts, with its final hidden states."""
    x = torch.randint(0, model.config.vocab_size, (n, prompt_len), generator=torch.Generator().manual_seed(seed))
    for _ in range(new):
        x = torch.cat([x, model(input_ids=x).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return x, model(input_ids=x, output_hidden_states=True).hidden_states[-1]


# ----------------------------------------------------------------------------- Medusa heads (test_medusa.py)

TREES = {
    "chain": [[0], [0, 0], [0, 0, 0]],
    "default": medusa_choices("default"),
    "small": medusa_choices("small"),
    "wide": [[r] for r in range(10)] + [[0, r] for r in range(5)] + [[1, 0], [0, 0, 0], [0, 1, 0]],
}

def random_heads(num_heads=3, num_layers=1, seed=0, std=0.3, hidden=H, vocab=V):
    """Heads with random non-zero ResBlocks, values exactly representable in bfloat16."""
    heads = MedusaHeads(MedusaConfig(hidden, vocab, num_heads, num_layers))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_((torch.randn(p.shape, generator=gen) * std).to(torch.bfloat16).float())
    return heads.eval()


def features(model, sequences):
    """(hidden (b, s, H) float32, mask (b, s)) of right-padded sequences: the target's final normed states."""
    s = max(len(x) for x in sequences)
    hidden = torch.zeros(len(sequences), s, model.config.hidden_size)
    mask = torch.zeros(len(sequences), s, dtype=torch.bool)
    with torch.no_grad():
        for i, seq in enumerate(sequences):
            out = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
            hidden[i, : len(seq)] = out.hidden_states[-1][0]
            mask[i, : len(seq)] = True
    return hidden, mask


def medusa_drafter(model, heads, tree="default", **kwargs):
    return Medusa(heads, model.get_output_embeddings(), TREES[tree] if isinstance(tree, str) else tree, **kwargs)
