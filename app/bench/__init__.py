"""Benchmarks on Spec-Bench prompts: our modes and transformers' own generate() side by side, interleaved."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import defaultdict
from typing import TextIO

import torch

from app.modes import MODES
from app.modes.configs import AutoregressiveConfig, NGramDecodingConfig
from app.runner import LoopConfig
from app.decoding.linear import fast_bf16
from app.models import LoadedModel
from app.runner import output_ids, run as run_mode, verify_cost
from app import figures, traces

PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted")
# Our mode -> the vLLM engine row doing its job: every mode vLLM has a method for (vllm_<method>).
VLLM_PEERS = {m.name: m.vllm_row for m in MODES if m.vllm is not None}


class _ForwardCounter:
    """Counts the target's forward passes during a peer's generate() call (a hook, not a patch)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.calls = model, 0

    def __enter__(self):
        self.handle = self.model.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _peer(name: str, target: LoadedModel, cfg: LoopConfig, ids: list[int], draft: LoadedModel | None,
          ours: LoopConfig | None) -> tuple[list[int], int]:
    """A transformers peer's run; `ours`: our mode doing the same job, when it runs too (its settings are the peer's)."""
    s = cfg.sampling
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, eos_token_id=target.eos_token_ids, pad_token_id=target.eos_token_ids[0])
    if s.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        if s.seed is not None:
            torch.manual_seed(s.seed)  # generate() samples from torch's global generator
    if name == "hf_prompt_lookup":  # prompt lookup's settings when it runs too, else its defaults
        pl = ours.speculative_config if ours else NGramDecodingConfig()
        kwargs.update(prompt_lookup_num_tokens=pl.max_draft_len, max_matching_ngram_size=pl.max_matching_ngram_size)
    if name == "hf_assisted":
        kwargs.update(assistant_model=draft.model)
    x = torch.tensor([ids], device=target.model.device)
    with torch.inference_mode(), _ForwardCounter(target.model) as counter:
        out = target.model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
    return out[0, len(ids) :].tolist(), counter.calls


def _engine_run(engine, ids: list[int]) -> tuple[list[int], int, float, dict | None]:
    """A vLLM peer: its output, engine steps (one streamed chunk each), when its last step arrived, and the engine's
    spec-decode counters for the request (read after that step: not the peer's time)."""
    client, request, info = engine
    out, steps, done, counters = [], 0, None, None
    for message in client.work(request, ids, info)(threading.Event()):
        if message["type"] == "step":
            out += message["tokens"]
            steps += 1
            if message["finish_reason"]:
                done = time.perf_counter()
        elif message["type"] == "end":
            counters = message.get("spec_decode")
    return out, steps, done or time.perf_counter(), counters


def _one(name, target, configs, ids, draft, companions, engines=None):
    """(output ids, target passes, seconds, and for our modes where the decoding steps' time went; for a vLLM peer
    its spec-decode counters)."""
    t0 = time.perf_counter()
    split = None
    if name in (engines or {}):
        out, steps, done, counters = _engine_run(engines[name], ids)
        return out, steps, done - t0, {"spec_decode": counters} if counters else None
    if name in PEERS:
        base = next(iter(configs.values()))  # its sampling and length: every mode's are the command's
        out, steps = _peer(name, target, base, ids, draft, configs.get(OURS[name]))
        return out, steps, time.perf_counter() - t0, None
    events = list(run_mode(target, configs[name], ids, companions.get(name)))
    out, steps = output_ids(events), events[-1].totals["target_steps"]
    elapsed = time.perf_counter() - t0
    decoding = traces.decoding([e.to_dict() for e in events])  # the Run tab's split of a step, by the loop's clock
    if decoding:
        split = {"prefill_s": events[0].verify_time_s, "decode_steps": decoding["steps"], "decode_s": decoding["seconds"],
                 "draft_s": decoding["draft_s"], "verify_s": decoding["verify_s"]}
    return out, steps, elapsed, split


def run(
    target: LoadedModel,
    configs: dict[str, LoopConfig],
    prompts: list[dict],
    companions: dict | None = None,
    draft: LoadedModel | None = None,
    peers: bool = False,
    progress: TextIO | None = None,
    engines: dict | None = None,
) -> dict:
    """`engines`: vLLM peers by row name (vllm_generate, vllm_ngram, ...), each (remote.Engine, its DecodeRequest, its
    engine description),
    run interleaved with our modes prompt by prompt, timed as their client sees them (request to last step)."""
    if "autoregressive" not in configs:
        configs = {"autoregressive": dataclasses.replace(next(iter(configs.values())), speculative_config=AutoregressiveConfig()),
                   **configs}
    companions = companions or {}
    names = list(configs)
    if peers:
        names += ["hf_generate", "hf_prompt_lookup"] + (["hf_assisted"] if draft is not None else [])
    names += list(engines or {})
    # Warm-up: the first calls of each path pay one-off costs (allocations, kernel selection).
    warm = target.encode("Say hello.")
    short = {k: dataclasses.replace(c, max_new_tokens=8) for k, c in configs.items()}
    for name in names:
        _one(name, target, short, warm, draft, companions, engines)
    runs = []
    for i, prompt in enumerate(prompts):
        ids = target.encode(prompt["text"])
        reference = None
        for name in names:  # interleaved: every mode sees the same machine state, prompt by prompt
            out, steps, elapsed, split = _one(name, target, configs, ids, draft, companions, engines)
            if name == "autoregressive":
                reference = out
            runs.append(
                {
                    "prompt_id": prompt["id"],
                    "category": prompt["category"],
                    "mode": name,
                    "prompt_tokens": len(ids),
                    "new_tokens": len(out),
                    "elapsed_s": elapsed,
                    "tokens_per_s": len(out) / elapsed,
                    "target_steps": steps,
                    "mean_accepted_tokens": len(out) / steps if steps else None,
                    "identical": out == reference,
                    "identical_prefix": _common_prefix(out, reference),
                    "token_ids": out,
                    **(split or {}),
                }
            )
            if progress:
                r = runs[-1]
                print(
                    f"[{i + 1}/{len(prompts)}] {prompt['category']:>14} #{prompt['id']:<4} {name:>16}: "
                    f"{r['new_tokens']:4d} tok {r['tokens_per_s']:6.1f} tok/s  tau {r['mean_accepted_tokens'] or 0:.2f}"
                    f"{'' if r['identical'] else '  (differs from autoregressive)'}",
                    file=progress,
                    flush=True,
                )
    cost = verify_cost(target, target.encode(prompts[0]["text"]) if prompts else warm)
    return {"settings": _settings(target, configs, draft), "summary": summarize(runs), "versus": versus(runs),
            "verify_cost": cost, "runs": runs}


def _common_prefix(a: list[int], b: list[int] | None) -> int:
    n = 0
    for x, y in zip(a, b or []):
        if x != y:
            break
        n += 1
    return n


def _settings(target, configs, draft) -> dict:
    # Each mode's config as the service's request names it (TensorRT-LLM's fields).
    cfgs = {k: {"mode": c.mode, "speculative_config": c.speculative_config.model_dump(mode="json"),
                "max_new_tokens": c.max_new_tokens, "sampling": vars(c.sampling)} for k, c in configs.items()}
    return {
        "model": target.name,
        "dtype": target.dtype,
        "draft_model": draft.name if draft else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fast_bf16": fast_bf16(),
        "configs": cfgs,
    }


def summarize(runs: list[dict]) -> dict:
    """Per mode, overall and per category: mean tokens/s, speedup over autoregressive (ratio of means,
    as Spec-Bench), tokens per target step, and the share of outputs identical to autoregressive."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["mode"], r["category"])].append(r)
        groups[(r["mode"], "overall")].append(r)

    def stats(rs):
        return {
            "tokens_per_s": sum(r["tokens_per_s"] for r in rs) / len(rs),
            "mean_accepted_tokens": _tau(rs),
            "identical_share": sum(r["identical"] for r in rs) / len(rs),
            # how far outputs agree with autoregressive before they part (bfloat16 rounding differs by batch shape)
            "identical_prefix_share": sum(r["identical_prefix"] for r in rs) / max(1, sum(r["new_tokens"] for r in rs)),
            "prompts": len(rs),
            # a vLLM peer's own count: 1 + accepted / drafts over its requests (vLLM's mean acceptance length)
            "engine_tau": _engine_tau(rs),
        }

    table = {key: stats(rs) for key, rs in groups.items()}
    step_times = {key: _step_time(rs) for key, rs in groups.items()}
    summary: dict[str, dict] = defaultdict(dict)
    for (mode, cat), s in table.items():
        base = table.get(("autoregressive", cat))
        s["speedup"] = s["tokens_per_s"] / base["tokens_per_s"] if base else None
        s.update(_step_cost(step_times[(mode, cat)], step_times.get(("autoregressive", cat))))
        ratio = ratio_ci(runs, mode, "autoregressive", None if cat == "overall" else cat) if base else None
        s["speedup_ci"] = list(ratio[1:]) if ratio and ratio[1] is not None else None
        s["doubt"] = None
        if base and mode != "autoregressive" and mode not in PEERS and s["mean_accepted_tokens"]:
            s.update(_possible(s))
        if cat == "overall":
            summary[mode].update(s)
        else:
            summary[mode].setdefault("categories", {})[cat] = s
    return dict(summary)


def _possible(s: dict) -> dict:
    """A mode's figures by the one rule (app/figures.py), against the autoregressive runs of this app's loop it was
    interleaved with prompt by prompt: a speedup at most τ, its interval bounded by τ, a step at least one
    autoregressive step (within the noise: at the bound). What breaks them is withheld (None) and `doubt` says why.
    Peers (transformers' and vLLM's own runs) divide by another engine's baseline: no bound holds, none is applied."""
    tau, out = s["mean_accepted_tokens"], {}
    reasons = []
    if s["speedup"] is not None and not figures.within(s["speedup"], tau):
        reasons.append(f"its {s['speedup']:.2f}× is more than τ {tau:.2f} allows")
        out["speedup"] = out["speedup_ci"] = None
    elif s["speedup"] is not None:
        out["speedup"] = min(s["speedup"], tau)
        out["speedup_ci"] = list(figures.bounded_interval(s["speedup_ci"], tau)) if s["speedup_ci"] else None
    if s.get("step_cost") is not None:
        cost, possible = figures.at_least_one(s["step_cost"])
        if not possible:
            reasons.append(f"a step took {s['step_cost']:.2f} autoregressive steps, less than the pass it contains")
        out["step_cost"] = cost if possible else None
    out["doubt"] = ("; ".join(reasons) + ": the runs were timed under other load than their autoregressive runs"
                    if reasons else None)
    return out


def _tau(runs: list[dict]) -> float | None:
    """Tokens per target pass over the runs that counted their passes."""
    counted = [r for r in runs if r["target_steps"]]
    return sum(r["new_tokens"] for r in counted) / sum(r["target_steps"] for r in counted) if counted else None


def _engine_tau(runs: list[dict]) -> float | None:
    counted = [r["spec_decode"] for r in runs if r.get("spec_decode")]
    drafts = sum(c["num_drafts"] for c in counted)
    return 1 + sum(c["num_accepted_tokens"] for c in counted) / drafts if drafts else None


def _step_time(runs: list[dict]) -> dict | None:
    """Seconds per decoding step (after the prefill), in all and drafting and verifying, over runs that
    recorded them (our modes; transformers' generate() does not say)."""
    timed = [r for r in runs if r.get("decode_steps")]
    if not timed:
        return None
    steps = sum(r["decode_steps"] for r in timed)
    return {k: sum(r[f"{k}_s"] for r in timed) / steps for k in ("decode", "draft", "verify")}


def _step_cost(mode: dict | None, autoregressive: dict | None) -> dict:
    """A mode's decoding step in autoregressive steps: `step_cost` in all, `draft_cost` and `verify_cost` of
    it. τ ÷ step_cost is the speedup after the prefill over the pooled tokens of the runs (the speedup column
    averages each run's tokens/s, prefill included, so the two differ where prompts differ)."""
    if not mode or not autoregressive or autoregressive["decode"] <= 0:
        return {"step_cost": None, "draft_cost": None, "verify_cost": None}
    unit = autoregressive["decode"]
    return {"step_cost": mode["decode"] / unit, "draft_cost": mode["draft"] / unit, "verify_cost": mode["verify"] / unit}


MIN_PAIRS = 3


def ratio_ci(runs: list[dict], a: str, b: str, category: str | None = None, level: float = 0.95,
             resamples: int = 2000, seed: int = 0) -> tuple[float, float, float] | None:
    """Mode a's mean tokens/s over mode b's on the prompts both ran (one category, or all), with a
    percentile-bootstrap interval over prompts. The bench runs the modes interleaved prompt by prompt,
    so the two runs of a prompt saw the same machine state: resampling keeps them paired. None when the
    runs carry no prompt ids or share no prompt; the interval is (None, None) under MIN_PAIRS prompts, where
    resampling one or two prompts would only pretend to know the spread."""
    by_prompt: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in runs:
        if r.get("prompt_id") is None or (category is not None and r["category"] != category):
            continue
        by_prompt[(r["category"], r["prompt_id"])][r["mode"]] = r["tokens_per_s"]
    pairs = [(m[a], m[b]) for m in by_prompt.values() if a in m and b in m]
    if not pairs or not sum(y for _, y in pairs):
        return None
    point = sum(x for x, _ in pairs) / sum(y for _, y in pairs)
    if a == b:
        return 1.0, 1.0, 1.0
    if len(pairs) < MIN_PAIRS:
        return point, None, None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        draw = rng.choices(pairs, k=len(pairs))
        ratios.append(sum(x for x, _ in draw) / sum(y for _, y in draw))
    ratios.sort()
    tail = (1 - level) / 2
    return point, ratios[int(tail * (resamples - 1))], ratios[int((1 - tail) * (resamples - 1))]


# Our mode and the transformers peer doing the same job, compared side by side in a bench run.
VERSUS = (("autoregressive", "hf_generate"), ("prompt_lookup", "hf_prompt_lookup"), ("draft_target", "hf_assisted"),
          *VLLM_PEERS.items())
PEERS = frozenset(peer for _, peer in VERSUS)
OURS = {peer: ours for ours, peer in VERSUS}


def versus(runs: list[dict]) -> list[dict]:
    """Our modes against their peers where both ran: ratio of mean tokens/s and its 95% interval; against a
    speculating vLLM peer also both τ, ours (tokens per target pass) beside vLLM's from its counters."""
    rows = []
    for ours, peer in VERSUS:
        ratio = ratio_ci(runs, ours, peer)
        if ratio:
            row = {"mode": ours, "peer": peer, "ratio": ratio[0], "ci": [ratio[1], ratio[2]] if ratio[1] is not None else None}
            peer_tau = _engine_tau([r for r in runs if r["mode"] == peer])
            if peer_tau is not None:
                row.update(tau=_tau([r for r in runs if r["mode"] == ours]), peer_tau=peer_tau)
            rows.append(row)
    return rows


def format_verify_cost(cost: dict) -> str:
    pairs = "  ".join(f"{k}: {r:.1f}x" for k, r in zip(cost["tokens"], cost["relative"]))
    # a width timed under other load than the one-token pass (runner.verify_cost), in the rule's sentence
    left = "".join(f"\n  * {w['tokens']}: {figures.withheld(w['reason'])}" for w in cost.get("withheld") or [])
    return f"verify pass of k tokens vs one ({cost['ms'][0]:.1f} ms): {pairs}{left}"


def format_table(summary: dict) -> str:
    cats = sorted({c for s in summary.values() for c in s.get("categories", {})})
    width = max([18, *(len(m) + 2 for m in summary)])
    lines = [f"{'category':<16}{'mode':<{width}}{'tok/s':>8}{'speedup':>9}{'95% CI':>13}{'tau':>7}{'step (draft)':>14}"
             f"{'identical':>11}"]
    withheld = []
    for cat in [*cats, "overall"]:
        for mode, s in summary.items():
            row = s if cat == "overall" else s.get("categories", {}).get(cat)
            if row is None:
                continue
            tau = f"{row['mean_accepted_tokens']:.2f}" if row["mean_accepted_tokens"] else "-"
            ci = row.get("speedup_ci")
            ci = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci and mode != "autoregressive" else ""
            step = (f"{row['step_cost']:.2f} ({row['draft_cost']:.2f})" if row.get("step_cost") is not None
                    and mode != "autoregressive" else "")
            speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
            if row.get("doubt"):
                speedup, step = (speedup if row["speedup"] is not None else "withheld*"), step or "withheld*"
                withheld.append(f"* {cat} / {mode}: {figures.withheld(row['doubt'])}")
            lines.append(f"{cat:<16}{mode:<{width}}{row['tokens_per_s']:>8.1f}{speedup:>9}{ci:>13}{tau:>7}"
                         f"{step:>14}{row['identical_share']:>10.0%}")
        lines.append("")
    lines += withheld + ([""] if withheld else [])
    lines.append("step (draft): a decoding step's time in autoregressive steps (of it, drafting). tau / step is the "
                 "speedup after the prefill with all prompts' tokens pooled; the speedup column averages each prompt's "
                 "tokens/s, prefill included, as Spec-Bench does")
    return "\n".join(lines)


def format_versus(rows: list[dict]) -> str:
    """Our modes against transformers' peers, one line each (empty without peers)."""
    def interval(ci):
        return (f"95% CI {ci[0]:.2f}-{ci[1]:.2f}, bootstrap over prompts" if ci
                else f"no interval under {MIN_PAIRS} prompts")

    def taus(r):
        return f"; tau {r['tau']:.3f} ours, {r['peer_tau']:.3f} by the engine's counters" if "peer_tau" in r else ""

    return "\n".join(f"{r['mode']} / {r['peer']}: {r['ratio']:.2f}x tokens/s ({interval(r['ci'])}){taus(r)}" for r in rows)
