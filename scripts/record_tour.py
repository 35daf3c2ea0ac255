"""Record the tour's runs: for each mode without a shipped recording, its best Spec-Bench first turn among a few
categories (by τ), raced against the autoregressive run, saved as assets/traces/<mode>-<category>-<dtype>.json.

    python scripts/record_tour.py [--dtype float32] [--max-new-tokens 128] [--modes suffix,medusa] [--categories roleplay]

Runs through the service as the web app does (the Run tab's "fastest here" settings), on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.prompts import load_prompts  # noqa: E402
from app.modes import MODES  # noqa: E402
from app.service.api import Service  # noqa: E402
from app.traces import Recording  # noqa: E402
from app.ui import run_tab, settings  # noqa: E402

CANDIDATES = ("extraction", "summarization", "rag", "coding", "math_reasoning", "roleplay", "qa")


def run(service: Service, mode: str, prompt: str, values: dict) -> Recording:
    name, merged = MODES.split(mode)
    if merged:  # the mode's box that merges prompt lookup's candidates into its tree
        values = dict(values, **{next(c.key for c in MODES[name].controls if c.kind == "merge"): True})
    request = settings.to_request(name, values)
    recording = Recording(mode, request, prompt)
    for message in service.stream(request, prompt):
        recording.add(message)
    if not recording.end or recording.end.get("error"):
        raise SystemExit(f"{mode}: {recording.end}")
    return recording


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", default=",".join(run_tab.tour_modes()))
    parser.add_argument("--categories", default=",".join(CANDIDATES), help="where to look for each mode's best run")
    args = parser.parse_args()
    service = Service()
    values = {**settings.defaults(), **settings.preset("fastest here", args.dtype), "max_new_tokens": args.max_new_tokens,
              "backend": "transformers"}
    prompts = {r["category"]: r["text"] for r in load_prompts(None, args.categories.split(","), 1)}
    have = {n.split("-")[0] for n in run_tab.RECORDINGS}
    baselines = {}
    for mode in args.modes.split(","):
        if mode in have:
            print(f"{mode}: recorded already", file=sys.stderr)
            continue
        run(service, mode, "Hello", dict(values, max_new_tokens=8))  # warm: load what the mode needs
        best = None
        for category, prompt in prompts.items():
            if category not in baselines:
                baselines[category] = run(service, "autoregressive", prompt, values)
            rec = run(service, mode, prompt, values)
            tau = len(rec.token_ids) / max(len(rec.events) - 1, 1)
            print(f"{mode} {category}: τ {tau:.2f}", file=sys.stderr)
            if best is None or tau > best[0]:
                best = (tau, category, rec)
            if mode == "autoregressive":
                break
        tau, category, rec = best
        out = ROOT / "assets" / "traces" / f"{mode}-{category}-{args.dtype}.json"
        out.write_text(json.dumps(rec.trace(None if mode == "autoregressive" else baselines[category])))
        print(f"wrote {out.relative_to(ROOT)} (τ {tau:.2f}, {out.stat().st_size // 1024} KB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
