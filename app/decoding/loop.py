"""The one verify loop: propose -> target forward -> accept -> commit KV -> observe -> emit a StepEvent."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

import torch

from app.decoding import acceptance
from app.decoding.drafters.base import Drafter
from app.decoding.sampling import SamplingParams, argmax, probs, sample
from app.decoding.target import Target
from app.decoding.tree import children
from app.decoding.types import Proposal, StepEvent, Totals, Verdict


class ContextError(ValueError):
    """The prompt does not fit the model's context window."""


def accept(proposal: Proposal, logits: torch.Tensor, sampling: SamplingParams, gen: torch.Generator) -> Verdict:
    return _judge(proposal, logits, sampling, gen)[0]


def _judge(
    proposal: Proposal, logits: torch.Tensor, sampling: SamplingParams, gen: torch.Generator
) -> tuple[Verdict, torch.Tensor | list[int]]:
    """The verdict, and what it was reached with: the sampling distribution per slot, or when greedy
    the target's top token per slot (target_view reuses either)."""
    tokens, parents = proposal.draft_tokens, proposal.draft_parents
    slots = logits[: len(tokens) + 1]
    if sampling.greedy:
        top = argmax(slots).tolist()
        return acceptance.greedy(tokens, parents, top), top
    p = probs(slots, sampling)
    if proposal.acceptance is not None:
        rule = proposal.acceptance
        if rule.get("rule") != "typical":
            raise ValueError(f"unknown acceptance rule {rule!r}")
        return acceptance.typical(tokens, parents, p, rule["posterior_threshold"], rule["posterior_alpha"]), p
    if proposal.q is not None:
        return acceptance.leviathan(tokens, proposal.q, p, gen), p
    return acceptance.recursive_rejection(tokens, parents, p, gen), p


def target_view(
    tokens: list[int], parents: list[int], verdict: Verdict, logits: torch.Tensor, basis: torch.Tensor | list[int]
) -> dict:
    """What the target made of a draft, at the positions where it decided something: the root and
    each accepted node. There it gives its top token, the probability of every draft token tried
    there, and of the token it added. Nodes below a rejected one were never weighed (p None).

    `basis` is what the acceptance rule used (_judge): the sampling distribution per slot (p), or, when
    greedy, the top token per slot, and then the probabilities are the model's own softmax
    (temperature 1). Only the decided slots are normalised, so this costs a few rows, not the whole
    tree: every torch call right after a forward pass runs on cold caches (~15 us each here), which
    is also why the greedy argmax is not computed twice.
    """
    decided = [-1, *verdict.accepted]
    rows_at = [node + 1 for node in decided]
    sampled = isinstance(basis, torch.Tensor)
    rows = basis[rows_at] if sampled else logits[rows_at].float().softmax(-1)
    top = argmax(rows).tolist() if sampled else [basis[slot] for slot in rows_at]
    kids = children(parents)
    node_p: list[float | None] = [None] * len(tokens)
    for r, slot in enumerate(rows_at):
        for c in kids[slot]:
            node_p[c] = _prob(rows[r, tokens[c]])
    return {
        "distribution": "sampling" if sampled else "softmax",
        "decided": [{"after": node, "top": t, "top_p": _prob(rows[r, t])} for r, (node, t) in enumerate(zip(decided, top))],
        "p": node_p,
        "added_p": _prob(rows[-1, verdict.added]),
    }


def _prob(x: torch.Tensor) -> float:
    return float(f"{float(x):.6g}")  # six significant digits: a tiny p stays > 0, an excluded one stays 0


class _Clock:
    """Seconds of the generation's own work: the time it spends suspended at a yield is not counted. Whatever the
    consumer does with a step (detokenize, stream, or step another generation: a race interleaves a run with its
    baseline) is then not charged to it, so two generations stepped in turn are each timed by their own work."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._start - self._paused

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        at = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - at


def generate(
    target: Target,
    drafter: Drafter,
    prompt: Sequence[int],
    *,
    sampling: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    eos_token_ids: Sequence[int] = (),
    cancel: threading.Event | None = None,
) -> Iterator[StepEvent]:
    """Generate after `prompt`, yielding one StepEvent per target forward pass.

    Stops at an EOS token (kept in the output), after exactly `max_new_tokens` tokens, at the end
    of the context window, or when `cancel` is set (checked once per step).
    """
    prompt = list(prompt)
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt) >= target.max_length:
        raise ContextError(
            f"the prompt has {len(prompt)} tokens but the model's context holds {target.max_length}: shorten it"
        )
    eos = set(eos_token_ids)
    gen = sampling.generator()
    totals = Totals()
    clock = _Clock()

    def pick(logits: torch.Tensor) -> tuple[int, torch.Tensor | list[int]]:
        if sampling.greedy:
            top = argmax(logits).tolist()
            return top[-1], top
        p = probs(logits, sampling)
        return sample(p[-1], gen), p

    def finish(new: list[int], output: list[int]) -> tuple[list[int], str | None]:
        """Cut `new` at EOS or the token budget; say why generation ends, if it does."""
        for i, tok in enumerate(new):
            if len(output) + i + 1 >= max_new_tokens:
                return new[: i + 1], "eos" if tok in eos else "length"
            if tok in eos:
                return new[: i + 1], "eos"
        if len(prompt) + len(output) + len(new) >= target.max_length:
            return new, "length"
        if cancel is not None and cancel.is_set():
            return new, "cancelled"
        return new, None

    def event(step, kind, prop, verdict, new, reason, t_draft, t_verify, view) -> StepEvent:
        totals.new_tokens += len(new)
        totals.target_steps += 1
        totals.drafted += prop.num_draft
        totals.draft_time_s += t_draft
        totals.verify_time_s += t_verify
        totals.elapsed_s = clock.now()
        acc_tokens = [prop.tokens[i] for i in verdict.accepted][: len(new)]
        totals.accepted += len(acc_tokens)
        on_path = set(verdict.accepted[: len(acc_tokens)])
        return StepEvent(
            step=step,
            kind=kind,
            proposed={"tokens": prop.draft_tokens, "parents": prop.draft_parents},
            accepted=verdict.accepted[: len(acc_tokens)],
            rejected=[i for i in range(prop.num_draft) if i not in on_path],
            accepted_tokens=acc_tokens,
            added_token=verdict.added if len(new) > len(acc_tokens) else None,
            added_kind=verdict.added_kind,
            tokens=new,
            source=prop.source,
            draft_time_s=t_draft,
            verify_time_s=t_verify,
            totals={**vars(totals), "tokens_per_step": totals.tokens_per_step},
            finish_reason=reason,
            target=view,
        )

    # Prefill: the prompt's forward pass gives the first token, the root of the first draft.
    t0 = time.perf_counter()
    first_pass = target.prefill(prompt)
    first, basis = pick(first_pass.logits[-1:])
    new, reason = finish([first], [])
    t1 = time.perf_counter()
    verdict = Verdict([], first, "next")
    view = target_view([], [], verdict, first_pass.logits[-1:], basis)
    first_event = event(0, "prefill", Proposal(), verdict, new, reason, 0.0, t1 - t0, view)
    with clock.paused():  # made before the pause: its clock reading must not be taken back at the next step
        yield first_event
    output = list(new)
    if reason:
        return
    drafter.start(prompt, sampling, gen, first_pass)
    step = 0
    while True:
        step += 1
        context = prompt + output
        t0 = time.perf_counter()
        prop = drafter.propose(context, room=target.max_length - len(context) - 1)
        t1 = time.perf_counter()
        out = target.forward(context[-1], prop.tokens, prop.parents)
        verdict, basis = _judge(prop, out.logits, sampling, gen)
        target.commit(verdict.accepted)
        t2 = time.perf_counter()
        drafter.observe(prop, verdict, out)
        t3 = time.perf_counter()
        view = target_view(prop.draft_tokens, prop.draft_parents, verdict, out.logits, basis)
        new, reason = finish([prop.tokens[i] for i in verdict.accepted] + [verdict.added], output)
        step_event = event(step, "decode", prop, verdict, new, reason, (t1 - t0) + (t3 - t2), t2 - t1, view)
        with clock.paused():
            yield step_event
        output += new
        if reason:
            return
