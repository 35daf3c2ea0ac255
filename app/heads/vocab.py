"""Reduced draft vocabularies: a drafter ranks only the target's most frequent tokens.

Every candidate a drafter proposes costs one row of an LM head to score, and a full head is
the target's biggest matrix (49k x 576 for the bundled model, a few ms per call on a CPU), while
the tokens a model actually writes are far fewer. A draft vocabulary is stored as ModelOpt's and
TensorRT-LLM's `d2t`: draft id d stands for target id d + d2t[d]. Restricting what is proposed
never changes what is accepted, so verification stays exact.
"""

from __future__ import annotations

import torch


def from_counts(counts: torch.Tensor, size: int, include: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """d2t for a draft vocabulary of the `size` most frequent target tokens (ties: lower id first),
    plus `include` (e.g. EOS ids, which must stay draftable). Draft ids follow target id order, so
    d2t is non-decreasing; size >= len(counts) gives the full vocabulary (d2t all zeros)."""
    vocab = len(counts)
    if size < 1:
        raise ValueError(f"the draft vocabulary needs at least one token, got size {size}")
    if size >= vocab:
        return torch.zeros(vocab, dtype=torch.long)
    score = counts.double().clone()
    score[list(include)] = float("inf")
    chosen = torch.argsort(-score, stable=True)[:size].sort().values
    return chosen - torch.arange(size)


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """(len(d2t),) the target id of every draft id."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


def problem(d2t: torch.Tensor, size: int, vocab_size: int) -> str | None:
    """Why `d2t` is not a draft vocabulary of `size` tokens of a `vocab_size` vocabulary, or None."""
    if d2t.shape != (size,):
        return f"d2t has shape {tuple(d2t.shape)}, expected ({size},)"
    ids = target_ids(d2t.cpu())
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        return f"d2t maps draft ids outside the target vocabulary [0, {vocab_size})"
    if len(torch.unique(ids)) != len(ids):
        return "d2t maps two draft ids to the same target id"
    return None
