"""Command line: `python -m app generate|bench ...` (see README for the contract)."""

from __future__ import annotations

import argparse
import json
import sys

from app.config import MODES, ConfigError, DecodingConfig, parse_triple
from app.decoding.loop import ContextError
from app.decoding.sampling import SamplingParams
from app.models import BUNDLED, DTYPES, ModelError
from app.training.export import ExportError


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
    p.add_argument("--draft-model", default=None, help="draft model for draft_target (same tokenizer as --model; default: the shipped distilled draft)")
    p.add_argument("--max-draft-len", type=int, default=4)
    p.add_argument("--medusa-model", default=None, help="Medusa heads directory (default: the shipped heads of --model)")
    p.add_argument("--medusa-choices", default="default", help="Medusa tree: a name in assets/medusa_choices/ or a JSON list of rank paths")
    p.add_argument("--typical-acceptance", action="store_true", help="Medusa under sampling: typical acceptance (faster, NOT lossless)")
    p.add_argument("--posterior-threshold", type=float, default=0.09)
    p.add_argument("--posterior-alpha", type=float, default=0.3)
    p.add_argument("--eagle-model", default=None, help="EAGLE module directory (default: the shipped module of --model)")
    p.add_argument("--eagle-total-tokens", type=int, default=24, help="EAGLE-2 dynamic tree: nodes verified per step")
    p.add_argument("--eagle-depth", type=int, default=5)
    p.add_argument("--eagle-top-k", type=int, default=4)
    p.add_argument("--eagle-choices", default=None, help="EAGLE static tree (rank paths) instead of the dynamic tree")
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
        medusa_model=args.medusa_model,
        medusa_choices=args.medusa_choices,
        typical_acceptance=args.typical_acceptance,
        posterior_threshold=args.posterior_threshold,
        posterior_alpha=args.posterior_alpha,
        eagle_model=args.eagle_model,
        eagle_total_tokens=args.eagle_total_tokens,
        eagle_depth=args.eagle_depth,
        eagle_top_k=args.eagle_top_k,
        eagle_choices=args.eagle_choices,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
    )
    cfg.validate()
    return cfg


def _load(args, name):
    from app import models

    return models.load(name, dtype=args.dtype, engines=_engines(args))


def _engines(args):
    from pathlib import Path

    from app import models

    return Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES


def _companions(args, target, configs: dict[str, DecodingConfig]) -> dict:
    from app.runner import load_companion

    return {mode: load_companion(cfg, target, _engines(args)) for mode, cfg in configs.items()}


def cmd_generate(args: argparse.Namespace) -> int:
    from app.runner import output_ids, run

    cfg = _config(args, args.mode)
    target = _load(args, args.model)
    companion = _companions(args, target, {cfg.mode: cfg})[cfg.mode]
    prompt_ids = target.encode(args.prompt)
    events = []
    for ev in run(target, cfg, prompt_ids, companion):
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
    target = _load(args, args.model)
    companions = _companions(args, target, configs)
    draft = companions.get("draft_target")
    if draft is None and args.peers and args.draft_model:
        draft = _companions(args, target, {"draft_target": _config(args, "draft_target")})["draft_target"]
    prompts = bench.load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    result = bench.run(target, configs, prompts, companions=companions, draft=draft, peers=args.peers, progress=sys.stderr)
    print(bench.format_table(result["summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app import models
    from app.training import recipes

    if args.epochs <= 0:
        raise ConfigError(f"--epochs must be positive, got {args.epochs}")
    settings = recipes.TrainSettings(
        data_offset=args.data_offset, data_limit=args.data_limit, max_len=args.max_len, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, save_steps=args.save_steps, seed=args.seed,
        medusa_num_heads=args.medusa_num_heads, medusa_num_layers=args.medusa_num_layers,
        eagle_num_layers=args.eagle_num_layers, draft_vocab_size=args.draft_vocab_size, draft_layers=args.draft_layers,
        eagle_steps=args.eagle_steps,
    )
    engines = Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES
    target = models.load(args.model, dtype=args.dtype, engines=engines)
    out = Path(args.output_dir) if args.output_dir else engines / "trained" / f"{args.model.replace('/', '--')}-{args.mode}"
    summary = recipes.train(args.mode, target, out, settings, engines)
    if args.eval_prompts:
        summary["eval"] = recipes.evaluate(args.mode, target, out, args.eval_prompts, engines)
        (out / "train.json").write_text(json.dumps(summary, indent=2))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.training import export

    out = export.export(Path(args.source), Path(args.output_dir), base_model=args.model)
    print(out)
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
    t = sub.add_parser("train", help="train Medusa heads, an EAGLE module or a distilled draft on a frozen model")
    t.add_argument("--mode", required=True, choices=["medusa", "eagle", "draft"])
    t.add_argument("--model", default=BUNDLED, help="the frozen base (target) model")
    t.add_argument("--dtype", default="bfloat16", choices=list(DTYPES), help="dtype of the frozen base model")
    t.add_argument("--output-dir", default=None, help="default: engines/trained/<model>-<mode>")
    t.add_argument("--data-offset", type=int, default=0, help="first ShareGPT conversation used")
    t.add_argument("--data-limit", type=int, default=800, help="ShareGPT conversations used")
    t.add_argument("--max-len", type=int, default=256, help="tokens kept per conversation")
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--lr", type=float, default=None, help="default: 1e-3 for heads, 3e-4 for the draft")
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--save-steps", type=int, default=None, help="also save a checkpoint every N steps")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--medusa-num-heads", type=int, default=3)
    t.add_argument("--medusa-num-layers", type=int, default=1)
    t.add_argument("--eagle-num-layers", type=int, default=1)
    t.add_argument("--eagle-steps", type=int, default=1, help="EAGLE: training-time-test unroll steps")
    t.add_argument("--draft-vocab-size", type=int, default=8192, help="EAGLE: most frequent tokens its head predicts")
    t.add_argument("--draft-layers", type=int, default=3, help="draft: target layers kept (evenly spaced)")
    t.add_argument("--eval-prompts", type=int, default=13, help="Spec-Bench prompts (one per category) for the final acceptance check; 0 = skip")
    t.add_argument("--engines-dir", default=None)
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export", help="write trained heads in the layout TensorRT-LLM consumes")
    e.add_argument("source", help="a directory written by `train` (Medusa heads, EAGLE module or draft layers)")
    e.add_argument("--output-dir", required=True)
    e.add_argument("--model", default=BUNDLED, help="the base model the artifact belongs to")
    e.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ModelError, ContextError, ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
