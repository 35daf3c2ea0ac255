"""Command line: `python -m app generate|bench ...` (see README for the contract)."""

from __future__ import annotations

import argparse
import json
import sys

from app.config import MODES, ConfigError, DecodingConfig, parse_triple
from app.decoding.loop import ContextError
from app.decoding.sampling import SamplingParams
from app.models import BUNDLED, DTYPES, ModelError


def _add_decoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=BUNDLED, help=f"registry name, local directory or hub id (default {BUNDLED})")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--lookahead-config", default="4,3,4", help="W,N,G: window, n-gram size, verification set")
    p.add_argument("--lookahead-request", default=None, help="per-request w,n,g <= W,N,G (default W,N,G)")
    p.add_argument("--no-pool-from-prompt", action="store_true", help="lookahead: do not seed the n-gram pool from the context")
    p.add_argument("--prompt-lookup-num-tokens", type=int, default=10)
    p.add_argument("--max-matching-ngram-size", type=int, default=2)
    p.add_argument("--prompt-lookup-candidates", type=int, default=1, help="prompt lookup: verify this many matches' continuations as one tree")
    p.add_argument(
        "--ngram-draft-lens", default="2,5",
        help="prompt lookup: draft at most this many tokens after a 1-gram, 2-gram, ... match ('' = always the full length)",
    )
    p.add_argument("--use-newest-match", action="store_true", help="prompt lookup: copy after the latest match, not the earliest")
    p.add_argument("--draft-model", default=None, help="draft model for draft_target (same tokenizer as --model)")
    p.add_argument("--max-draft-len", type=int, default=4)
    p.add_argument("--engines-dir", default=None, help="artifact store (default: engines/ in the repository)")


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers such as 2,5; got '{text}'") from None


def _config(args: argparse.Namespace, mode: str) -> DecodingConfig:
    try:
        sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    cfg = DecodingConfig(
        mode=mode,
        lookahead_config=parse_triple(args.lookahead_config, "--lookahead-config"),
        lookahead_request=parse_triple(args.lookahead_request, "--lookahead-request") if args.lookahead_request else None,
        pool_from_prompt=not args.no_pool_from_prompt,
        prompt_lookup_num_tokens=args.prompt_lookup_num_tokens,
        max_matching_ngram_size=args.max_matching_ngram_size,
        is_use_oldest=not args.use_newest_match,
        max_candidates=args.prompt_lookup_candidates,
        ngram_draft_lens=_int_list(args.ngram_draft_lens, "--ngram-draft-lens"),
        draft_model=args.draft_model,
        max_draft_len=args.max_draft_len,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
    )
    cfg.validate()
    return cfg


def _load(args, name):
    from pathlib import Path

    from app import models

    engines = Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES
    return models.load(name, dtype=args.dtype, engines=engines)


def _models(args, needs_draft: bool):
    from app import models

    target = _load(args, args.model)
    draft = None
    if needs_draft and args.draft_model:
        draft = _load(args, args.draft_model)
        models.check_compatible(target, draft)
    return target, draft


def cmd_generate(args: argparse.Namespace) -> int:
    from app.runner import output_ids, run

    cfg = _config(args, args.mode)
    target, draft = _models(args, cfg.mode == "draft_target")
    prompt_ids = target.encode(args.prompt)
    events = []
    for ev in run(target, cfg, prompt_ids, draft):
        events.append(ev)
        if not args.json:
            shown = target.tokenizer.decode(ev.tokens)
            print(
                f"step {ev.step:4d}  proposed {len(ev.proposed['tokens']):3d}  accepted {len(ev.accepted_tokens):3d}"
                f"  +{len(ev.tokens)} {shown!r}",
                file=sys.stderr,
            )
    ids = output_ids(events)
    text = target.decode(ids)
    if args.json:
        json.dump({"text": text, "token_ids": ids, "steps": [e.to_dict() for e in events]}, sys.stdout)
        print()
        return 0
    t = events[-1].totals
    print(text)
    print(
        f"\n[{cfg.mode}] {t['new_tokens']} tokens in {t['target_steps']} target steps "
        f"({t['tokens_per_step']:.2f} tokens/step), {t['new_tokens'] / t['elapsed_s']:.1f} tokens/s, "
        f"accepted {t['accepted']}/{t['drafted']} drafted, finish: {events[-1].finish_reason}",
        file=sys.stderr,
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from app import bench

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise ConfigError(f"unknown mode '{m}' in --modes: choose from {', '.join(MODES)}")
    configs = {m: _config(args, m) for m in modes}
    target, draft = _models(args, "draft_target" in modes or (args.peers and args.draft_model))
    prompts = bench.load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    result = bench.run(target, configs, prompts, draft=draft, peers=args.peers, progress=sys.stderr)
    print(bench.format_table(result["summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description="SpecDec Studio")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with one decoding mode and show every step")
    g.add_argument("--mode", default="autoregressive", help=", ".join(MODES))
    g.add_argument("--prompt", required=True, help="the user turn (the chat template is applied)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, steps")
    _add_decoding_flags(g)
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="benchmark modes (and peers) on Spec-Bench prompts")
    b.add_argument("--prompts", default=None, help="Spec-Bench-format JSONL (default: assets/spec_bench/question.jsonl)")
    b.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    b.add_argument("--limit", type=int, default=5, help="prompts per category")
    b.add_argument("--modes", default="autoregressive,prompt_lookup,lookahead")
    b.add_argument("--peers", action="store_true", help="also run transformers' generate() variants")
    b.add_argument("--json", default=None, metavar="OUT", help="write summary and per-run records here")
    _add_decoding_flags(b)
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ModelError, ContextError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
