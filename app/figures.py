"""When a measured figure may be printed: the one rule the Run, Compare, Load and Learn tabs, the vLLM runs and the
CLI apply, so a lecturer can quote any of them.

A speculative step runs a target pass over at least the one token an autoregressive step runs, so it costs at least
one autoregressive step (its verify pass at least the baseline's pass), its speedup is at most τ (tokens per target
pass), and a pass over more tokens costs at least what a narrower one does. A reading that breaks one of these by more
than NOISE was timed under other load than what it is divided by: it is withheld with its reason. One within NOISE is
taken at the bound (a step of 0.98 autoregressive steps is read as 1.00), so nothing printed is beyond what physics
allows. The rule needs its figures measured under the same conditions: the Run and Compare tabs race a run and its
baseline step by step in one job (jobs.race).
"""

from __future__ import annotations

# The timer's own noise between two runs stepped in turn on one machine: about 1 % between interleaved runs here
# (AMD EPYC, 2 cores), 3 % leaves room for a cache-cold pass.
NOISE = 0.03


def withheld(reason: str) -> str:
    """The sentence every surface prints in place of a figure this rule withholds (the Run tab's status, a Compare row,
    a Load sweep, Learn's measured curve, the CLI, the bench, a vLLM run): one wording with the rule's reason, so a
    reader who met it in one place knows it in all."""
    return f"No speedup shown: {reason.strip().rstrip('.')}."


def at_least_one(cost: float, reach: float = 1.0) -> tuple[float, bool]:
    """A cost in units of what it contains (a step in autoregressive steps, a pass in one-token passes): the cost to
    print (at least 1) and whether the reading was possible (not below 1 by more than NOISE). `reach`: how far above
    the reading its own 95 % interval goes (its upper end ÷ the reading); a reading whose interval reaches 1 is
    possible, taken at the bound: under bursty load a few slow steps on one side move the mean, not the physics."""
    return max(cost, 1.0), cost * max(reach, 1.0) >= 1.0 - NOISE


def bounded_interval(interval: tuple[float, float] | None, bound: float) -> tuple[float, float] | None:
    """A ratio's interval with neither end above what physics allows (a speedup's τ, a throughput's N)."""
    if interval is None:
        return None
    return min(interval[0], bound), min(interval[1], bound)


def within(ratio: float, bound: float) -> bool:
    """Whether a measured ratio is possible: at most `bound` (τ for a speedup, N for N requests' throughput over one's),
    allowing NOISE."""
    return ratio <= bound * (1.0 + NOISE)


def monotone(relative: list[float]) -> tuple[list[float], int | None]:
    """A cost curve over growing pass widths as it may be printed: each point at least the one before (a reading below
    within NOISE is raised to it), and the index of the first point that fell by more than NOISE, or None."""
    out: list[float] = []
    fell = None
    for i, x in enumerate(relative):
        if out and x < out[-1]:
            if x < out[-1] * (1.0 - NOISE) and fell is None:
                fell = i
            x = out[-1]
        out.append(x)
    return out, fell
