"""How fast could prompt lookup be? Replays a bench run's autoregressive outputs under drafting policies.

Greedy verification accepts the longest prefix of the draft that matches what the target generates anyway,
so given the autoregressive output of each prompt, a policy's steps and drafted tokens follow exactly (up to
bfloat16 batch rounding, which makes real runs part from autoregressive now and then). A step's cost is modelled
as `c0 + c1 * drafted` (one target pass plus the extra positions it verifies); `--c1` is that per-token cost as
a fraction of c0 (about 1.7 / 52 ms on the reference CPU for chains of up to ~12 tokens). Or `--costs` gives the
measured cost curve of a pass of k tokens (`scripts/profile_pass.py`), e.g. `1:1,2:1.01,4:1.37,8:2.37,16:3.76`,
interpolated linearly; then prompt lookup is also replayed at shorter draft lengths (`--num-tokens`).

Policies: our PromptLookup at the bench's settings and at transformers' (no caps); and two oracles that know
the output: the first match's continuation cut to exactly what will be accepted, and the best of all matches so
cut. No drafter that copies one match's continuation (as a chain or a tree of several) can beat the second.

    python scripts/pld_bound.py bench-results/session5.json [--c1 0.033]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.prompts import load_prompts  # noqa: E402
from app.decoding.drafters.prompt_lookup import NgramIndex, PromptLookup  # noqa: E402


def accepted(draft: list[int], truth: list[int]) -> int:
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def replay(propose, prompt: list[int], output: list[int], step) -> float:
    """The cost, in one-token passes, of regenerating `output` after the prefill's first token (`step(k)`: the cost of
    a pass of k tokens)."""
    context, pos, spent = list(prompt) + output[:1], 1, 0.0
    while pos < len(output):
        truth = output[pos:]
        draft = propose(context, truth)
        take = min(accepted(draft, truth) + 1, len(truth))
        context += truth[:take]
        pos, spent = pos + take, spent + step(1 + len(draft))
    return spent


def ours(**settings):
    def make(prompt):
        drafter = PromptLookup(**settings)
        drafter.start(prompt, None, None, None)
        return lambda context, truth: drafter.propose(context, 10**6).draft_tokens

    return make


def oracle(max_ngram: int, num_tokens: int, first_only: bool):
    def make(prompt):
        index = NgramIndex(max_ngram)

        def propose(context, truth):
            best = []
            for start, n in index.matches(context, max_ngram):
                cont = context[start + n : start + n + num_tokens]
                cont = cont[: accepted(cont, truth)]
                best = max(best, cont, key=len)
                if first_only:
                    break
            return best

        return propose

    return make


def curve(spec: str):
    """A pass's cost relative to a one-token pass, by its width k, from measured points "k:cost,...". """
    points = sorted((int(k), float(c)) for k, c in (p.split(":") for p in spec.split(",")))

    def cost(k: int) -> float:
        for (k0, c0), (k1, c1) in zip(points, points[1:]):
            if k <= k1:
                return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
        (k0, c0), (k1, c1) = points[-2:]
        return c1 + (c1 - c0) * (k - k1) / (k1 - k0)

    return cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--c1", type=float, default=1.7 / 52, help="cost of a drafted token as a fraction of a one-token step")
    ap.add_argument("--costs", help="a measured cost curve k:cost,... (replaces --c1)")
    ap.add_argument("--num-tokens", default="1,2,3,5", help="with --costs: the shorter draft lengths to replay too")
    ap.add_argument("--prompts", default=str(ROOT / "assets" / "spec_bench" / "question.jsonl"))
    args = ap.parse_args()
    result = json.loads(Path(args.bench_json).read_text())
    settings = result["settings"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "engines" / "models" / settings["model"])
    texts = {p["id"]: p["text"] for p in load_prompts(args.prompts, None, None)}
    pl = (settings["configs"].get("prompt_lookup") or {}).get("speculative_config") or {}  # NGramDecodingConfig's fields
    m, k = pl.get("max_matching_ngram_size", 3), pl.get("max_draft_len", 10)
    policies = {
        "ours (bench settings, one candidate)": ours(
            prompt_lookup_num_tokens=k, max_matching_ngram_size=m, is_use_oldest=pl.get("is_use_oldest", True),
            max_candidates=1, ngram_draft_lens=tuple(pl.get("ngram_draft_lens", (2, 5)))),
        "transformers-like (earliest match, no caps)": ours(prompt_lookup_num_tokens=k, max_matching_ngram_size=m, ngram_draft_lens=()),
        "oracle: first match, cut to what is accepted": oracle(m, k, first_only=True),
        "oracle: best match, cut to what is accepted": oracle(m, k, first_only=False),
    }
    if args.costs:
        for n in (int(x) for x in args.num_tokens.split(",")):
            policies[f"ours, {n} token{'s' * (n > 1)} (one candidate)"] = ours(
                prompt_lookup_num_tokens=n, max_matching_ngram_size=m, is_use_oldest=pl.get("is_use_oldest", True),
                max_candidates=1, ngram_draft_lens=())
    step = curve(args.costs) if args.costs else (lambda k: 1 + args.c1 * (k - 1))
    cost: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for run in result["runs"]:
        if run["mode"] != "autoregressive":
            continue
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": texts[run["prompt_id"]]}],
                                               add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        out = run["token_ids"]
        for name, make in policies.items():
            spent = replay(make(prompt), prompt, out, step)
            for cat in (run["category"], "overall"):
                cost[name][cat][0] += len(out) - 1  # autoregressive: one step per token after the prefill's
                cost[name][cat][1] += spent
    cats = sorted({c for per in cost.values() for c in per} - {"overall"}) + ["overall"]
    print(f"modelled speedup over autoregressive ({'costs ' + args.costs if args.costs else f'c1 = {args.c1:.3f} of a step'})")
    print(f"{'policy':<48}" + "".join(f"{c[:9]:>10}" for c in cats))
    for name, per in cost.items():
        print(f"{name:<48}" + "".join(f"{per[c][0] / per[c][1]:>10.2f}" for c in cats))


if __name__ == "__main__":
    main()
