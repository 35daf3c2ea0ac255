"""Acceptance rules as pure functions over a proposal and the target's outputs.

Naming follows the papers: p is the target distribution, q the draft distribution.
Slot 0 is the root; slot i+1 holds the target's output after draft node i.
"""

from __future__ import annotations

import math

import torch

from app.decoding.sampling import sample, uniform
from app.decoding.tree import children, path_to
from app.decoding.types import Verdict


def _verdict(path: list[int], added: int, kids: list[list[int]], drafted: bool) -> Verdict:
    last_slot = path[-1] + 1 if path else 0
    kind = "correction" if kids[last_slot] else ("bonus" if path else "next")
    if not drafted:
        kind = "next"
    return Verdict(accepted=path, added=added, added_kind=kind)


def greedy(tokens: list[int], parents: list[int], argmax: list[int]) -> Verdict:
    """Longest draft path whose every token equals the target's argmax after its parent (first on ties)."""
    ok = [False] * len(tokens)
    depth = [0] * len(tokens)
    best, best_depth = -1, 0
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        if (par < 0 or ok[par]) and tok == argmax[par + 1]:
            ok[i] = True
            depth[i] = 1 if par < 0 else depth[par] + 1
            if depth[i] > best_depth:
                best, best_depth = i, depth[i]
    path = path_to(best, parents)
    return _verdict(path, argmax[best + 1], children(parents), bool(tokens))


def recursive_rejection(tokens: list[int], parents: list[int], p: torch.Tensor, gen: torch.Generator) -> Verdict:
    """Lossless sampling for deterministic drafts (q = 1 on each drafted token; SpecInfer/EAGLE style).

    Walk down from the root; at each node try its children in order: accept child x with
    probability p(x) under the current residual, else zero p(x), renormalise and try the next.
    If every child is rejected, the added token is sampled from the residual.
    p: (1 + len(tokens), vocab) target probabilities per slot.
    """
    kids = children(parents)
    path: list[int] = []
    slot = 0
    while True:
        residual = p[slot].clone()
        for c in kids[slot]:
            x = tokens[c]
            mass = float(residual.sum())
            if uniform(gen) * mass < float(residual[x]):
                path.append(c)
                slot = c + 1
                break
            residual[x] = 0.0
        else:
            return _verdict(path, sample(residual / residual.sum(), gen), kids, bool(tokens))


def leviathan(tokens: list[int], q: torch.Tensor, p: torch.Tensor, gen: torch.Generator) -> Verdict:
    """Speculative sampling of a chain draft (Leviathan et al. 2023, Chen et al. 2023).

    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
    norm(max(0, p_i - q_i)); if all pass, sample the bonus token from p_{k+1}.
    q: (k, vocab) draft probabilities; p: (k + 1, vocab) target probabilities.
    """
    kids = children(list(range(-1, len(tokens) - 1)))
    for i, x in enumerate(tokens):
        px, qx = float(p[i, x]), float(q[i, x])
        if uniform(gen) * qx < px:
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        added = sample(residual / total, gen) if total > 0 else sample(p[i], gen)
        return _verdict(list(range(i)), added, kids, True)
    return _verdict(list(range(len(tokens))), sample(p[len(tokens)], gen), kids, bool(tokens))


def typical(
    tokens: list[int], parents: list[int], p: torch.Tensor, posterior_threshold: float, posterior_alpha: float
) -> Verdict:
    """Medusa's typical acceptance (arXiv 2401.10774). NOT lossless: the output does not
    follow the target distribution; it trades exactness for longer accepted runs under sampling.

    A draft token x hanging off slot j is accepted when its parent was and
    p_j(x) > min(posterior_threshold, posterior_alpha * exp(-H(p_j))), H the entropy of p_j: a
    confident (low entropy) target accepts only likely tokens, an uncertain one accepts more.
    The longest accepted path wins; ties go to the largest sum of log p along the path (then the
    first node). As in Medusa's default (`fast=True`) the added token is the argmax of p at the
    slot after the path, so no randomness is used here and a step that accepts nothing is greedy.
    p: (1 + len(tokens), vocab) target probabilities per slot (after temperature / top-k / top-p).
    """
    p = p.double()
    entropy = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy))
    ok = [False] * len(tokens)
    depth = [0] * len(tokens)
    loglik = [0.0] * len(tokens)
    best, best_key = -1, (0, 0.0)
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        px = float(p[par + 1, tok])
        if (par < 0 or ok[par]) and px > float(threshold[par + 1]):
            ok[i] = True
            depth[i] = 1 if par < 0 else depth[par] + 1
            loglik[i] = (0.0 if par < 0 else loglik[par]) + math.log(px)
            if best < 0 or (depth[i], loglik[i]) > best_key:
                best, best_key = i, (depth[i], loglik[i])
    path = path_to(best, parents)
    return _verdict(path, int(p[best + 1].argmax()), children(parents), bool(tokens))
