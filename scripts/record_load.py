"""Record the Load tab's shipped sweeps: vLLM `ngram` and `suffix` (the web app's default settings for prompt lookup
and suffix) against vLLM's plain engine, N = 1, 2, 4, 8, 16, with this project's own loop at batch 1, saved as
assets/load/vllm-<method>-<dtype>.json.

    python scripts/record_load.py [--ns 1,2,4,8,16] [--max-new-tokens 32] [--modes prompt_lookup,suffix] [--eager]

Runs through the service as the Load tab does, on a quiet machine (nothing else running: an idle vLLM engine polls
for work and takes CPU from a measured one, so only the two engines a sweep compares are up at a time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.backends.vllm import processes as vllm_processes  # noqa: E402
from app.service.api import Service  # noqa: E402
from app.service.jobs import Limits  # noqa: E402
from app.ui import settings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", default="1,2,4,8,16")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--modes", default="prompt_lookup,suffix")
    p.add_argument("--eager", action="store_true", help="start the engines with --enforce-eager (as the tests do)")
    p.add_argument("--out", default=str(ROOT / "assets" / "load"))
    args = p.parse_args()
    service = Service(vllm_settings=vllm_processes.Settings(enforce_eager=args.eager), limits=Limits(time_limit_s=1800))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for mode in args.modes.split(","):
            name, values = settings.mode_values(mode, service.registry, max_new_tokens=args.max_new_tokens,
                                                backend="vllm", dtype="auto")
            data = settings.to_request(name, values, service.registry)
            job = service.load_sweep(data, args.ns, args.max_new_tokens, ours=True,
                                     progress=lambda f, m: print(m, file=sys.stderr, flush=True))
            end = {}
            for message in job.messages():
                if message["type"] == "point":
                    q = message["point"]
                    print(f"N={q['n']:<3} {q['row']:>14}: {q['tokens_per_s']:6.1f} tok/s, "
                          f"{(q['seconds_per_token'] or 0) * 1000:6.1f} ms/token, tau {q['tau'] or 0:.2f}, "
                          f"identical {q['identical_share']:.0%}", file=sys.stderr, flush=True)
                else:
                    end = message
            if end.get("error") or not end.get("sweep"):
                raise SystemExit(f"{mode}: {end}")
            sweep = end["sweep"]
            path = out / f"vllm-{sweep['method']}-{sweep['dtype']}.json"
            path.write_text(json.dumps(service.relative(sweep), indent=1) + "\n")
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)
            # Only the two engines a sweep compares stay up (an idle engine polls and takes CPU from the measured one).
            service.engine_stop(service.engine_spec({**data, "backend": "vllm"}).key())
    finally:
        service.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
