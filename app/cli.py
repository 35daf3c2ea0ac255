"""Command line: `python -m app generate|bench ...` (docs/cli.md has the contract)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from app.modes import ConfigError
from app.modes.notation import int_list
from app.modes import MERGED_MODE, MODES, Flag, Mode, Modes
from app.modes.shipped import NGRAM_FLAGS
from app.prompts import load_prompts
from app.modes import configs
from app.modes.errors import one_line
from app import runner
from app.runner import LoopConfig
from app.decoding.loop import ContextError
from app.decoding.linear import fast_bf16
from app.models import BUNDLED, DTYPES, ModelError
from app.backends import registry
from app.backends.transformers import backend as transformers
from app.service.errors import EngineError
from app.service.http import HttpSettings
from app import figures, traces
from app.traces import Recording
from app.training import recipes
from app.training.export import ExportError, formats as export_formats


def _flag_kwargs(mode: Mode, flag: Flag) -> dict[str, Any]:
    """argparse's arguments for a mode's flag: type, default and help from its config field where it sets one."""
    if flag.to_fields is not None:
        kind, default = flag.kind, flag.default
    else:
        info = mode.config.model_fields[flag.field]
        kind, default = _scalar(info.annotation), info.default
    help = flag.help or (configs.help_of(mode.config, flag.field) if flag.field else "")
    if kind is bool:  # a switch: --x turns a default off on; a default on gets --no-x too
        return {"action": argparse.BooleanOptionalAction if default is True else "store_true", "help": help}
    return {"type": kind, "default": default, "help": help}


def _scalar(annotation: Any) -> type:
    """int, float, bool or str: the type of a field's flag (a field of int | None takes an int)."""
    kinds = configs.kinds_of(annotation)
    return next((k for k in kinds if k in (bool, int, float)), str)


EAGER_HELP = ("transformers backend: run every pass eagerly. Without it the target runs its fast pass (compiled ahead "
              "of time once per machine under engines/compiled/, loaded in seconds after that; `python -m app compile` "
              "builds it)")


DTYPE_HELP = ("float32 (default: every mode's greedy output equals autoregressive token for token), bfloat16, or auto: "
              "what runs fastest on this CPU (bfloat16 on AVX2, AVX-512 and AMX CPUs)")


def _add_decoding_flags(p: argparse.ArgumentParser, modes: Modes = MODES) -> None:
    p.add_argument("--model", default=BUNDLED, help=f"registry name, local directory or hub id (default {BUNDLED})")
    p.add_argument("--dtype", default="float32", choices=["auto", *DTYPES], help=DTYPE_HELP)
    p.add_argument("--eager", action="store_true", help=EAGER_HELP)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    seen = set()
    for mode in modes:
        for flag in mode.cli_flags():
            if flag.name not in seen:  # a flag two modes share (--min-path-prob) is added once
                seen.add(flag.name)
                p.add_argument("--" + flag.name.replace("_", "-"), **_flag_kwargs(mode, flag))
    p.add_argument("--engines-dir", default=None, help="artifact store (default: engines/ in the repository)")


def _add_backend_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="auto", choices=["auto", *registry.BACKENDS],
                   help="auto: a reachable --remote-url, else TensorRT-LLM where installed, else transformers")
    p.add_argument("--remote-url", default=None, help="remote backend: an OpenAI-compatible server (python -m app serve, trtllm-serve)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="tensorrt_llm backend: GPUs per model")
    _add_vllm_flags(p)


def _add_vllm_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-python", default=None, help="vllm backend: the interpreter vLLM is installed in (default .venv-vllm)")
    p.add_argument("--vllm-eager", action="store_true",
                   help="vllm backend: start engines with --enforce-eager (no compilation: faster start, slower steps)")
    p.add_argument("--vllm-reserved-cpus", type=int, default=None,
                   help="vllm backend: cores vLLM leaves to its API server (VLLM_CPU_NUM_OF_RESERVED_CPU; default vLLM's, 1)")
    p.add_argument("--vllm-intel-openmp", action="store_true", help="vllm backend: preload Intel's OpenMP in the engine")
    p.add_argument("--vllm-distributed-executor-backend", choices=("uni", "mp"), default=None,
                   help="vllm backend: run the model in the engine process (uni, the default here: starts in half the "
                        "time) or in a worker process of its own (mp, vLLM's default)")


def _add_public_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--public", action="store_true",
                   help="public mode for anonymous visitors (on by itself in a Hugging Face Space): builds and training runs "
                   "belong to the visitor who made them, work is bounded, models are named from the registry only")
    p.add_argument("--allow-model-paths", action="store_true", help="public mode: speculative_model may name a local directory")
    p.add_argument("--allow-hub", action="store_true", help="public mode: speculative_model may name a Hugging Face hub id")
    p.add_argument("--train-time-limit", type=float, default=None,
                   help="seconds a training run may take before it is stopped (default: none; 240 in public mode, where 0 "
                   "turns training off)")
    p.add_argument("--forwarded-allow-ips", type=_proxies, default=(), metavar="ADDRESSES",
                   help="trust X-Forwarded-For only from these proxy addresses or networks (comma-separated; e.g. a "
                   "Space's proxy): otherwise the connection's own address identifies a client")


def _proxies(text: str) -> tuple[str, ...]:
    """--forwarded-allow-ips: "10.0.0.0/8, 192.168.0.1" as its entries, each an address, a network or "*"."""
    proxies = tuple(entry.strip() for entry in text.split(",") if entry.strip())
    try:
        HttpSettings(forwarded_allow_ips=proxies)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return proxies


def _fields(args: argparse.Namespace, flags) -> dict[str, Any]:
    """Config fields from the flags that set them."""
    out: dict[str, Any] = {}
    for flag in flags:
        value = getattr(args, flag.name)
        out.update(flag.to_fields(value) if flag.to_fields is not None else {flag.field: value})
    return out


def request_data(args: argparse.Namespace, mode: str, modes: Modes = MODES) -> dict:
    """The service's DecodeRequest data (TensorRT-LLM names) for the command-line flags of one mode;
    `medusa+prompt_lookup` / `eagle+prompt_lookup` add prompt lookup's candidates (its flags) to the tree."""
    mode, merged = modes.split(mode)
    entry = modes[mode]
    spec = _fields(args, entry.cli_flags())
    if merged:
        spec[MERGED_MODE] = _fields(args, NGRAM_FLAGS)
    data = {
        "speculative_config": {"decoding_type": entry.decoding_type, **spec},
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed},
        "max_new_tokens": args.max_new_tokens,
    }
    backend = getattr(args, "backend", "auto")
    if backend != "auto":  # absent: the service picks (auto)
        data["backend"] = backend
    return data


def _config(args: argparse.Namespace, mode: str) -> LoopConfig:
    """The runtime config of one mode, checked by its rules and the transformers backend's (bench runs that loop)."""
    request = MODES.parse(request_data(args, mode))
    transformers.check(request)
    return runner.to_runtime(request)


def _load(args, name):
    from app import models

    return models.load(name, dtype=args.dtype, engines=_engines(args), fast=_fast(args, "build"))


def _fast(args, default: str) -> str:
    """How the transformers backend gets its fast pass (models.load): `default` unless --eager."""
    return "eager" if getattr(args, "eager", False) else default


def _engines(args):
    from app import models

    return Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES


def _companions(args, target, configs: dict[str, LoopConfig]) -> dict:
    from app.runner import load_companion

    return {mode: load_companion(cfg, target, _engines(args)) for mode, cfg in configs.items()}


def _service(args: argparse.Namespace, policy=None, fast: str = "build", **limits):
    from app.service.api import Service
    from app.service.jobs import Limits
    from app.service.policy import Policy

    return Service(_engines(args), model=args.model, dtype=args.dtype, backend=getattr(args, "backend", "auto") or "auto",
                   remote_url=getattr(args, "remote_url", None), limits=Limits(**limits),
                   tensor_parallel_size=getattr(args, "tensor_parallel_size", 1), policy=policy or Policy(),
                   vllm_settings=vllm_settings(args), fast=_fast(args, fast))


def is_public(args: argparse.Namespace, environ) -> bool:
    """Whether the web app starts in public mode: --public, or a Hugging Face Space (the platform sets SPACE_ID).
    The one place the environment decides anything."""
    return bool(args.public or environ.get("SPACE_ID"))


def _policy(args: argparse.Namespace, public: bool):
    """The Policy of `ui` / `serve` from their flags (public mode: policy.py)."""
    from app.service import policy

    if not public:
        if args.train_time_limit is not None and not args.train_time_limit >= 0:
            raise ConfigError(f"--train-time-limit must be a number of seconds >= 0, got {args.train_time_limit}")
        limit = args.train_time_limit or float("inf")
        return policy.Policy(train_time_limit_s=limit)
    return policy.Policy.for_public(allow_model_paths=args.allow_model_paths, allow_hub=args.allow_hub,
                                    train_time_limit_s=args.train_time_limit)


def _limits(args: argparse.Namespace, public: bool) -> dict:
    """The job limits of `ui` / `serve`: the flags, or public mode's defaults for the ones not given."""
    from app.service import policy

    time_limit = args.time_limit if args.time_limit is not None else policy.PUBLIC_TIME_LIMIT_S if public else 300.0
    return {"max_concurrency": args.max_concurrency, "max_queue": args.max_queue, "time_limit_s": time_limit}


def vllm_settings(args: argparse.Namespace):
    from app.backends.vllm import processes as vllm_processes

    defaults = vllm_processes.Settings()
    return vllm_processes.Settings(python=Path(args.vllm_python) if getattr(args, "vllm_python", None) else defaults.python,
                         enforce_eager=getattr(args, "vllm_eager", False),
                         reserved_cpus=getattr(args, "vllm_reserved_cpus", None),
                         intel_openmp=getattr(args, "vllm_intel_openmp", False),
                         distributed_executor_backend=getattr(args, "vllm_distributed_executor_backend", None)
                         or defaults.distributed_executor_backend)


def cmd_generate(args: argparse.Namespace) -> int:
    data = request_data(args, args.mode)
    # The command line is one user on their own machine: no queue limits beyond the model's context.
    service = _service(args, max_new_tokens=max(args.max_new_tokens, 1), max_prompt_tokens=2**31, time_limit_s=float("inf"))
    baseline = None
    try:
        checked = service.check(data)  # every rule, once, before any model loads
        if args.race and args.mode != "autoregressive":
            # The Run tab's race: autoregressive first, on the same prompt, settings and machine. A short run of
            # each first, as `bench` does: a process's first calls pay one-off costs (allocations, kernel choice).
            base = request_data(args, "autoregressive")
            for warm, mode in ((base, "autoregressive"), (data, args.mode)):
                _generate(service, {**warm, "max_new_tokens": min(8, args.max_new_tokens)}, mode, "Say hello.", show=False)
            # Then both in one job, stepped in turn (Service.race): timed under the same load, pass by pass.
            baseline = Recording("autoregressive", base, args.prompt)
            run = _generate(service, data, args.mode, args.prompt, show=not args.json, checked=checked, baseline=baseline)
            if (baseline.end or {}).get("error"):
                print(f"error: the autoregressive baseline failed: {baseline.end['error']}", file=sys.stderr)
                return 1
        else:
            run = _generate(service, data, args.mode, args.prompt, show=not args.json, checked=checked)
    finally:
        # A vLLM engine took a minute or more to start: it stays up for the next command (`engines stop ID` ends it).
        service.close(stop_engines=False)
        for backend, build_id in service.engines_started():
            print(f"[{backend}] engine {build_id} keeps running: python -m app engines stop {build_id}", file=sys.stderr)
    end = run.end or {}
    if end.get("error"):
        print(f"error: generation failed: {end['error']}", file=sys.stderr)
        return 1
    if args.json:
        # The Run tab's trace format (with the baseline it raced, like its download), so the Run tab replays it.
        json.dump(run.trace(baseline), sys.stdout)
        print()
        return 0
    t = end["totals"]
    print(end["text"])
    print(
        f"\n[{args.mode}] {t['new_tokens']} tokens in {t['target_steps']} target steps "
        f"({t['new_tokens'] / max(t['target_steps'], 1):.2f} tokens/step), {t['new_tokens'] / t['elapsed_s']:.1f} tokens/s, "
        f"accepted {t.get('accepted', '?')}/{t.get('drafted', '?')} drafted, finish: {end['finish_reason']}",
        file=sys.stderr,
    )
    if baseline is not None:
        for line in versus_lines(traces.speedup_parts(run.events, baseline.events, (run.pass_note, baseline.pass_note))):
            print(line, file=sys.stderr)
    return 0


def versus_lines(parts: dict | None) -> list[str]:
    """traces.speedup_parts as `generate --race` prints it: the ratio with its split, or the rule's sentence for a
    withheld one (figures.withheld, as every tab says it)."""
    if not parts:
        return []
    if parts["doubt"]:
        return [f"[vs autoregressive] {figures.withheld(parts['doubt'])}"]
    overall = f"{parts['overall']:.2f}x tokens/s; " if "overall" in parts else ""
    split = (f" (verify {parts['verify']:.2f} + draft {parts['draft']:.2f} + loop {parts['loop']:.2f})"
             if parts["verify"] is not None else "")
    interval = " ({:.2f}-{:.2f}x, 95 % of the step times' spread)".format(*parts["interval"]) if parts["interval"] else ""
    lines = [f"[vs autoregressive] {overall}after the prefill {parts['decoding']:.2f}x{interval} = tau {parts['tau']:.2f} / "
             f"a step of {parts['step_cost']:.2f} autoregressive steps{split}"]
    return lines + [f"[vs autoregressive] {said}" for said in (parts["overall_doubt"], parts["load"] and traces.load_said(parts["load"]))
                    if said]


def _generate(service, data: dict, mode: str, prompt: str, show: bool, checked=None,
              baseline: Recording | None = None) -> Recording:
    """One generation of `data` through the service (`checked`: the service's check of it), recorded; with `show`, a
    line per step on stderr. With `baseline` (its request in `baseline.request`), raced against it (Service.race),
    whose messages it records."""
    run = Recording(mode, data, prompt)
    job = (service.submit(checked or data, prompt) if baseline is None
           else service.race(checked or data, baseline.request, prompt))
    try:
        for message in job.messages():
            if message.get("side") == "baseline":
                baseline.add(message)
                continue
            run.add(message)
            if message["type"] == "step" and show:
                print(
                    f"step {message['step']:4d}  proposed {len(message['proposed']['tokens']):3d}  accepted "
                    f"{len(message['accepted_tokens']):3d}  +{len(message['tokens'])} {message['text']!r}"
                    f"{_rejection(message)}",
                    file=sys.stderr,
                )
    finally:
        job.cancel()  # a Ctrl-C ends the job too
    return run


def _rejection(message: dict) -> str:
    """Where a step's draft was cut: the target's own top token there against the draft's best-ranked
    token, each with the probability the target gave it (from the step's `target` view)."""
    view = message.get("target") or {}
    if message.get("added_kind") != "correction" or not view.get("decided"):
        return ""
    last = view["decided"][-1]
    tokens, parents = message["proposed"]["tokens"], message["proposed"]["parents"]
    tried = [c for c, parent in enumerate(parents) if parent == last["after"]]
    if not tried or view["p"][tried[0]] is None:
        return ""
    texts = message.get("texts") or {}

    def text(tid: int) -> str:
        return repr(texts.get(tid, texts.get(str(tid), f"<{tid}>")))

    return (f"  (target: {text(last['top'])} p {last['top_p']:.2f}; draft: {text(tokens[tried[0]])} "
            f"p {view['p'][tried[0]]:.3f})")


def cmd_ui(args: argparse.Namespace) -> int:
    from app.ui import web

    public = is_public(args, os.environ)
    limits = _limits(args, public)
    if public:
        from app.service.policy import PUBLIC_MAX_NEW_TOKENS

        limits["max_new_tokens"] = PUBLIC_MAX_NEW_TOKENS
    service = _service(args, _policy(args, public), fast="background", **limits)
    if public:
        print("public mode: visitors' builds and runs are their own, work is bounded (see docs/ui.md, Hosting publicly)",
              file=sys.stderr, flush=True)
    if service.runs_here(service.default_backend()):
        print(f"loading {args.model} ...", file=sys.stderr, flush=True)
        service.preload(args.model)  # fail here, not on the first click
    try:
        web.launch(service, host=args.host, port=args.port,
                   http=HttpSettings(forwarded_allow_ips=args.forwarded_allow_ips))
    finally:
        service.close()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from app.service.policy import PUBLIC_MAX_NEW_TOKENS
    from app.service.server import serve

    data = request_data(args, args.mode)
    limits = _limits(args, args.public)
    limits["max_new_tokens"] = PUBLIC_MAX_NEW_TOKENS if args.public else max(args.max_new_tokens, 4096)
    service = _service(args, _policy(args, args.public), fast="background", **limits)
    service.check(data)  # the server-wide default, before the model loads
    service.preload(args.model)  # load before the first request, and fail here if it cannot
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (default mode {args.mode})", file=sys.stderr, flush=True)
    try:
        serve(service, host=args.host, port=args.port, default=data,
              http_settings=HttpSettings(forwarded_allow_ips=args.forwarded_allow_ips))
    finally:
        service.close()
    return 0


def cmd_engines(args: argparse.Namespace) -> int:
    service = _service(args)
    if args.action == "list":
        builds = service.engine_list()
        if args.json:
            json.dump(builds, sys.stdout, indent=1)
            print()
            return 0
        print(f"{'id':16}  {'model':24} {'mode':14} {'backend':12} {'kind':20} {'created':24} {'build s':>8} {'MB':>8}  server")
        for m in builds:
            spec = m["spec"]
            size = sum(m.get("files", {}).values()) / 2**20
            server = m.get("server")
            # A vLLM server's URL, or the port of TensorRT-LLM's worker (it serves this app's own protocol only).
            state = "" if server is None else f"{server['state']} {server.get('url') or server.get('port') or ''}".rstrip()
            print(f"{m['id']:16}  {spec['model'][:24]:24} {spec['mode']:14} {spec['backend']:12} {m['kind']:20} "
                  f"{m['created'][:24]:24} {m['duration_s']:8.1f} {size:8.1f}  {state}")
        if not builds:
            print(f"(no builds in {service.store.builds})", file=sys.stderr)
        return 0
    if args.action == "show":
        manifest = service.engine_get(args.id)
        if manifest is None:
            raise EngineError(f"there is no build '{args.id}'")
        json.dump(manifest, sys.stdout, indent=1)
        print()
        return 0
    if args.action == "rm":
        service.engine_remove(args.id)
        print(f"removed {args.id}", file=sys.stderr)
        return 0
    if args.action == "stop":
        if service.engine_get(args.id) is None:
            raise EngineError(f"there is no build '{args.id}'")
        print(f"stopped {args.id}" if service.engine_stop(args.id) else f"{args.id} was not running", file=sys.stderr)
        return 0
    data = request_data(args, args.mode)
    if args.plan:
        json.dump(service.engine_plan(data), sys.stdout, indent=1)
        print()
        return 0

    def progress(fraction: float, message: str) -> None:
        print(f"[build {fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    manifest = service.engine_build(data, progress=progress)
    json.dump(manifest, sys.stdout, indent=1)
    print()
    if "server" in manifest:  # an engine's server: it keeps running after this command (engines stop / rm ID ends it)
        server = manifest["server"]
        print(f"{manifest['id']} {server.get('url') or server.get('port') or server['state']}", file=sys.stderr)
    return 0


def _write_json(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def cmd_bench(args: argparse.Namespace) -> int:
    from app import bench
    from app.bench import load

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        MODES.split(m, " in --modes")
    if args.ui_overhead:
        from app.ui import overhead

        prompts = load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
        service = _service(args, max_new_tokens=max(args.max_new_tokens, 1))
        try:
            result = overhead.measure(service, prompts, modes, args.max_new_tokens, progress=sys.stderr)
        finally:
            service.close()
        print(overhead.format_table(result))
        if args.json:
            _write_json(args.json, result)
        return 0
    configs = {m: _config(args, m) for m in modes}
    configs.update(_versus_configs(args, modes))
    target = _load(args, args.model)
    companions = _companions(args, target, configs)
    draft = companions.get("draft_target")
    if draft is None and args.peers and args.draft_model:
        draft = _companions(args, target, {"draft_target": _config(args, "draft_target")})["draft_target"]
    prompts = load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    if target.dtype == "bfloat16" and not fast_bf16():
        print("note: this CPU has no native bfloat16 matrix multiply (AVX-512 BF16 or AMX): a one-token pass reads "
              "half the bytes in bfloat16, but passes over several tokens multiply in float32, so a pass over k tokens "
              "costs more one-token passes than in float32 and speculative modes earn less; see the verify cost below",
              file=sys.stderr)
    service = _service(args)
    try:
        engines = _vllm_peers(args, service, modes) if args.peers else {}
        result = bench.run(target, configs, prompts, companions=companions, draft=draft, peers=args.peers,
                           progress=sys.stderr, engines=engines)
        if args.concurrency:
            points = _load_sweep(args, target, engines)
            result["load"], result["load_points"] = load.table(points), points
    finally:
        service.close()  # the vLLM engines the bench started
    print(bench.format_table(result["summary"]))
    if result["versus"]:
        print(bench.format_versus(result["versus"]) + "\n")
    if result.get("load_points"):
        print(load.format_lines(result["load_points"]) + "\n")
    print(bench.format_verify_cost(result["verify_cost"]))
    if args.json:
        _write_json(args.json, result)
    return 0


def _versus_configs(args: argparse.Namespace, modes: list[str]) -> dict[str, LoopConfig]:
    """--versus-model MODE=DIR: MODE's config again with DIR as its speculative_model, as the row MODE@<DIR's name>,
    so two trained artifacts meet the same prompts in one interleaved run."""
    out = {}
    for spec in args.versus_model:
        mode, sep, path = spec.partition("=")
        if not sep or not path or mode not in modes:
            raise ConfigError(f"--versus-model takes MODE=DIR with MODE one of --modes ({', '.join(modes)}), got '{one_line(spec)}'")
        flag = next((f for f in MODES[MODES.split(mode)[0]].cli_flags() if f.field == "speculative_model"), None)
        if flag is None:
            raise ConfigError(f"--versus-model: {mode} runs no trained artifact (speculative_model)")
        out[f"{mode}@{Path(path).name}"] = _config(argparse.Namespace(**{**vars(args), flag.name: path}), mode)
    return out


def _vllm_peers(args: argparse.Namespace, service, modes: list[str]) -> dict:
    """The vLLM engines doing our modes' jobs (bench.VLLM_PEERS), started in the bench's dtype; {} without vLLM."""
    from app import bench
    from app.backends.vllm.client import Engine

    state = service.available("vllm")
    if not state.available:
        print(f"note: no vLLM peers: {state.reason}", file=sys.stderr)
        return {}
    engines = {}
    for mode in ["autoregressive", *modes]:
        name = bench.VLLM_PEERS.get(mode)
        if name is None or name in engines:
            continue
        request = service.request({**request_data(args, mode), "backend": "vllm"})
        try:
            manifest, url = service.engine(request, args.model, progress=lambda f, m: print(f"[vllm] {m}", file=sys.stderr, flush=True))
        except (ConfigError, EngineError) as err:
            print(f"note: no {name} row: {err}", file=sys.stderr)
            continue
        info = {"engine": "vllm", "speculative_config": manifest["spec"]["config"]["speculative_config"]}
        engines[name] = (Engine(url, args.model, texts=lambda ids: {}), request, info)
    return engines


def _load_sweep(args: argparse.Namespace, target, engines: dict) -> list[dict]:
    """--concurrency: the load sweep (app/bench/load.py) of every speculative vLLM row against vllm_generate, on
    distinct prompts of the bench's categories; [] without vLLM rows."""
    import threading

    from app.bench import load

    ns = load.parse_ns(args.concurrency)
    if load.PLAIN not in engines or len(engines) < 2:
        print("note: no load sweep: it needs vllm_generate and a speculative vLLM row (--peers, vLLM installed)", file=sys.stderr)
        return []
    chosen = load.pick_prompts(load_prompts(args.prompts, args.categories.split(",") if args.categories else None, None), max(ns))
    ids = [target.encode(p["text"]) for p in chosen]

    def row(name: str) -> load.Target:
        client, _, info = engines[name]
        return load.Target(name, client.url, client.model, info.get("speculative_config"))

    points = []
    for p in load.points(row(load.PLAIN), [row(n) for n in engines if n != load.PLAIN], ids, ns, args.max_new_tokens,
                         threading.Event()):
        print(f"[load] N={p['n']:<3} {p['row']:>16}: {p['tokens_per_s']:7.1f} tok/s all, "
              f"{(p['seconds_per_token'] or 0) * 1000:7.1f} ms/token each, tau {p['tau'] or 0:.2f}, "
              f"identical {p['identical_share']:.0%}", file=sys.stderr, flush=True)
        points.append({k: v for k, v in p.items() if k != "requests"})
    return points


# `train` flags that belong to one session, not to the run: --resume takes the others from the run it continues.
SESSION_FLAGS = ("command", "func", "resume", "time_limit", "output_dir", "engines_dir", "progress_jsonl")


def _resumed(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the settings of the run stopped in args.resume; a ConfigError when there is none, or when a flag
    given now differs from the run's (a flag left at its default is the run's)."""

    out = Path(args.resume)
    saved_file = out / recipes.RESUME / "args.json"
    if not recipes.stopped(out) or not saved_file.is_file():
        raise ConfigError(f"--resume: {out} holds no run stopped by --time-limit or saved while running (no "
                          f"{recipes.RESUME}/state.pt and {recipes.RESUME}/args.json there)")
    saved = json.loads(saved_file.read_text())
    defaults = vars(build_parser().parse_args(["train"]))
    given = vars(args)
    differ = [f"--{k.replace('_', '-')} {given[k]} (the run's: {v})" for k, v in saved.items()
              if given.get(k) not in (defaults.get(k), v)]
    if args.output_dir is not None and Path(args.output_dir).resolve() != out.resolve():
        differ.append(f"--output-dir {args.output_dir} (the run's: {out})")
    if differ:
        raise ConfigError(f"--resume continues the run in {out} with its own settings; these differ: {', '.join(differ)}")
    return argparse.Namespace(**{**given, **saved, "output_dir": str(out)})


def cmd_train(args: argparse.Namespace) -> int:
    from app import models

    started = time.monotonic()
    if args.resume:
        args = _resumed(args)
    elif args.mode is None:
        raise ConfigError("train needs --mode (or --resume DIR to continue a run stopped by --time-limit)")
    if args.time_limit is not None and not args.time_limit >= 0:
        raise ConfigError(f"--time-limit must be a number of seconds >= 0, got {args.time_limit}")
    if args.epochs <= 0:
        raise ConfigError(f"--epochs must be positive, got {args.epochs}")
    if args.answer_tokens <= 0:
        raise ConfigError(f"--answer-tokens must be positive, got {args.answer_tokens}")
    if args.eagle3 and args.eagle_aux_layers == "none":
        raise ConfigError("--eagle3 fuses target layers: give --eagle-aux-layers auto or a list, not none")
    if args.eagle_ce_weight < 0:
        raise ConfigError(f"--eagle-ce-weight must be >= 0, got {args.eagle_ce_weight}")
    try:
        recipes.check_slice(args.data_offset, args.data_limit)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    settings = recipes.TrainSettings(
        data_source=args.data_source, answer_tokens=args.answer_tokens,
        data_offset=args.data_offset, data_limit=args.data_limit, max_len=args.max_len, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, save_steps=args.save_steps, seed=args.seed,
        medusa_num_heads=args.medusa_num_heads, medusa_num_layers=args.medusa_num_layers,
        eagle_num_layers=args.eagle_num_layers, draft_vocab_size=args.draft_vocab_size, draft_layers=args.draft_layers,
        eagle_steps=args.eagle_steps, eagle_train_head=args.eagle_train_head, init_from=args.init_from,
        eagle_ce_weight=args.eagle_ce_weight, eagle3=args.eagle3,
        eagle_aux_layers=() if args.eagle_aux_layers == "none" else
        None if args.eagle_aux_layers == "auto" else int_list(args.eagle_aux_layers, "--eagle-aux-layers"),
    )
    if args.init_from:
        try:
            recipes.artifact_config(args.mode, args.init_from)
        except (ValueError, OSError) as err:
            raise ConfigError(f"--init-from: {err}") from err
    engines = Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES
    out = Path(args.output_dir) if args.output_dir else engines / "trained" / f"{args.model.replace('/', '--')}-{args.mode}"
    if not args.resume and recipes.stopped(out):
        raise ConfigError(f"{out} holds a run stopped by --time-limit: continue it with --resume {out}, "
                          f"or remove {out / recipes.RESUME} to start over")
    target = models.load(args.model, dtype=args.dtype, engines=engines)
    # What --resume reads, written before the run: a session killed after a periodic save continues too.
    (out / recipes.RESUME).mkdir(parents=True, exist_ok=True)
    (out / recipes.RESUME / "args.json").write_text(json.dumps({k: v for k, v in vars(args).items() if k not in SESSION_FLAGS}, indent=2))
    report = recipes.jsonl_report() if args.progress_jsonl else recipes.stderr_report(args.mode)
    summary = recipes.train(args.mode, target, out, settings, engines, report=report,
                            time_limit=None if args.time_limit is None else args.time_limit - (time.monotonic() - started),
                            resume=bool(args.resume), save_every=recipes.SAVE_EVERY)
    if summary["state"] == recipes.STOPPED:
        json.dump(summary, sys.stdout, indent=2)
        print(f"\nstopped at the time limit after step {summary['step']} of {summary['total_steps']}: continue with "
              f"`python -m app train --resume {out}`", file=sys.stderr)
        return 0
    if args.eval_prompts:
        summary["eval"] = recipes.evaluate(args.mode, target, out, args.eval_prompts, engines, report=report)
        (out / "train.json").write_text(json.dumps(summary, indent=2))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from app.training import export

    out = export.export(Path(args.source), Path(args.output_dir), base_model=args.model, format=args.format)
    print(out)
    return 0


def cmd_ship_data(args: argparse.Namespace) -> int:
    from app import models
    from app.training import data

    engines = Path(args.engines_dir) if args.engines_dir else models.DEFAULT_ENGINES
    if not list((engines / "data").glob("self-*/shard-*.json")):
        raise ConfigError(f"no self-distilled answers under {engines / 'data'}: run `python -m app train` first")
    tokenizer = models.load_tokenizer(args.model, engines)  # the prompts are rebuilt; the weights are not needed
    try:
        written = data.ship_answers(engines, args.model, tokenizer,
                                    Path(args.output_dir) if args.output_dir else data.SHIPPED_DATA)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if not written:
        raise ConfigError(f"no self-distilled answers of '{args.model}' under {engines / 'data'}")
    for path in written:
        print(f"{path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    """Plan the build here (torch), then become a process without torch that runs it (fast_build.main): it orders
    the steps, each in a process of its own, and would otherwise hold 0.26 GB beside each step's peak (issue 58)."""
    from app import models

    print(f"[compile] planning the build (CPU priority: nice {os.nice(args.nice)})", file=sys.stderr, flush=True)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    engines = _engines(args)
    plan = {"model": args.model, "dtype": args.dtype, "recheck": args.recheck, "companions": []}
    if args.recheck:
        plan["target"] = models.built_plan(args.model, args.dtype, engines)
    else:
        plan["target"] = models.pass_plan(args.model, args.dtype, engines)
        # The shipped artifacts that run compiled beside it (EAGLE's module), so their first run does not build them.
        plan["companions"] = [models.companion_plan(plan["target"], e, path) for e in args.registry
                              if e.artifact_pass and (path := models.default_artifact(args.model, e.artifact))]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "app.decoding.fast_build", json.dumps(plan)])


CONCURRENCY_HELP = ("generations running at once (keep 1 on a small CPU: each worker thread keeps its own OpenMP team, "
                    "which slows every pass)")


def build_parser(modes: Modes = MODES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description="SpecDec Studio")
    sub = parser.add_subparsers(dest="command", required=True)
    u = sub.add_parser("ui", help="the web app (the default command: `python -m app` starts it)")
    u.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    u.add_argument("--port", type=int, default=7860)
    u.add_argument("--model", default=BUNDLED, help=f"registry name, local directory or hub id (default {BUNDLED})")
    u.add_argument("--dtype", default="float32", choices=["auto", *DTYPES], help=DTYPE_HELP)
    u.add_argument("--eager", action="store_true", help=EAGER_HELP + "; the web app serves eager passes while it builds")
    u.add_argument("--max-concurrency", type=int, default=1, help=CONCURRENCY_HELP)
    u.add_argument("--max-queue", type=int, default=8, help="generations waiting before new ones are refused")
    u.add_argument("--time-limit", type=float, default=None, help="seconds a generation may run (default 300; 60 in public mode)")
    u.add_argument("--engines-dir", default=None)
    _add_public_flags(u)
    _add_backend_flags(u)
    u.set_defaults(func=cmd_ui)
    g = sub.add_parser("generate", help="generate text with one decoding mode and show every step")
    g.add_argument("--mode", default="autoregressive", help=", ".join(modes.names + modes.merged))
    g.add_argument("--prompt", required=True, help="the user turn (the chat template is applied)")
    g.add_argument("--json", action="store_true", help="print the run as one JSON trace (text, token_ids, steps: the trace events, "
                   "texts, mode, request...); the web app's Run tab replays it")
    g.add_argument("--race", action="store_true", help="run autoregressive first on the same prompt and settings, then "
                   "say why the mode is as fast as it is against it (tau / a step's cost); with --json the trace "
                   "carries it as `baseline`")
    _add_decoding_flags(g, modes)
    _add_backend_flags(g)
    g.set_defaults(func=cmd_generate)
    v = sub.add_parser("serve", help="serve the model as an OpenAI-compatible HTTP API with the per-step trace")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--mode", default="autoregressive", help="the server-wide default mode; requests may choose another")
    v.add_argument("--max-concurrency", type=int, default=1, help=CONCURRENCY_HELP)
    v.add_argument("--max-queue", type=int, default=8, help="generations waiting before new ones get 429")
    v.add_argument("--time-limit", type=float, default=None, help="seconds a generation may run (default 300; 60 in public mode)")
    _add_public_flags(v)
    _add_decoding_flags(v, modes)
    _add_backend_flags(v)
    v.set_defaults(func=cmd_serve)
    en = sub.add_parser("engines", help="list, build, inspect and remove engine builds in engines/builds/")
    en_sub = en.add_subparsers(dest="action", required=True)
    el = en_sub.add_parser("list", help="ready builds, newest first")
    el.add_argument("--json", action="store_true")
    es = en_sub.add_parser("show", help="one build's manifest (or its failed attempt's)")
    es.add_argument("id")
    er = en_sub.add_parser("rm", help="remove a build (a vLLM engine is stopped first)")
    er.add_argument("id")
    est = en_sub.add_parser("stop", help="stop a vLLM engine's server (its build stays)")
    est.add_argument("id")
    eb = en_sub.add_parser("build", help="build (or reuse) what a mode needs on a backend")
    eb.add_argument("--mode", default="autoregressive", help=", ".join(modes.names))
    eb.add_argument("--plan", action="store_true", help="print what the build would do (TensorRT-LLM: LLM API arguments, trtllm-build command) and stop")
    _add_decoding_flags(eb, modes)
    _add_backend_flags(eb)
    for p in (el, es, er, est):
        p.add_argument("--engines-dir", default=None)
        p.add_argument("--model", default=BUNDLED)
        p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    en.set_defaults(func=cmd_engines)
    b = sub.add_parser("bench", help="benchmark modes (and peers) on Spec-Bench prompts")
    b.add_argument("--prompts", default=None, help="Spec-Bench-format JSONL (default: assets/spec_bench/question.jsonl)")
    b.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    b.add_argument("--limit", type=int, default=5, help="prompts per category")
    b.add_argument("--modes", default=",".join(["autoregressive", *(m.name for m in modes if m.compared)]))
    b.add_argument("--peers", action="store_true", help="also run transformers' generate() variants and, where vLLM "
                   "is installed (.venv-vllm), vLLM engines doing the same jobs (vllm_generate, vllm_ngram, vllm_draft_model)")
    b.add_argument("--json", default=None, metavar="OUT", help="write summary and per-run records here")
    b.add_argument("--versus-model", action="append", default=[], metavar="MODE=DIR",
                   help="also run MODE (one of --modes that runs a trained artifact: draft_target, medusa, eagle) with the "
                   "artifact DIR instead, as the row MODE@<DIR's name>, interleaved prompt by prompt: two artifacts compared "
                   "in one run (repeatable)")
    b.add_argument("--concurrency", default=None, metavar="N,N,...",
                   help="with --peers and vLLM: also sweep N concurrent requests (e.g. 1,2,4,8) to vllm_generate and every "
                   "speculative vLLM row that runs (the JSON's `load`: load[row][N] = tokens_per_s, seconds_per_token, tau, "
                   "identical_share)")
    b.add_argument("--ui-overhead", action="store_true",
                   help="instead: time each mode through the web app (launched in this process) against the same "
                   "generation without it, alternately, and report the overhead (the app's own defaults per mode)")
    _add_decoding_flags(b, modes)
    _add_vllm_flags(b)
    b.set_defaults(func=cmd_bench)
    t = sub.add_parser("train", help="train Medusa heads, an EAGLE module or a distilled draft on a frozen model")
    t.add_argument("--mode", default=None, choices=recipes.kinds(modes), help="required unless --resume")
    t.add_argument("--model", default=BUNDLED, help="the frozen base (target) model")
    t.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="dtype of the frozen base model while it writes its answers (--data-source self) and its features are extracted; pick the dtype you deploy in")
    t.add_argument("--output-dir", default=None, help="default: engines/trained/<model>-<mode>")
    t.add_argument("--data-offset", type=int, default=0, help="first ShareGPT conversation used")
    t.add_argument("--data-limit", type=int, default=800, help="ShareGPT conversations used")
    t.add_argument("--data-source", default="self", choices=["self", "sharegpt"],
                   help="self: the model's own greedy answers to the user turns (the seed's way); sharegpt: the dataset's answers")
    t.add_argument("--answer-tokens", type=int, default=128, help="self: new tokens generated per answer (at most half of --max-len)")
    t.add_argument("--max-len", type=int, default=256, help="tokens kept per conversation")
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--lr", type=float, default=None, help="default: 1e-3 for Medusa, 5e-4 for EAGLE (2e-3 with --eagle3), 3e-4 for the draft")
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--save-steps", type=int, default=None, help="also save a checkpoint every N steps")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--medusa-num-heads", type=int, default=3)
    t.add_argument("--medusa-num-layers", type=int, default=1)
    t.add_argument("--eagle-num-layers", type=int, default=1)
    t.add_argument("--eagle-steps", type=int, default=1, help="EAGLE: training-time-test unroll steps")
    t.add_argument("--eagle-ce-weight", type=float, default=0.1,
                   help="EAGLE: weight of the token loss (soft cross-entropy against the target) next to the feature "
                        "regression; EAGLE-1 uses 0.1, a larger weight trains more for the token the target picks")
    t.add_argument("--eagle-aux-layers", default="auto",
                   help="EAGLE: target layers whose hidden states it fuses into its input, EAGLE-3 style: 'auto' = 2, L/2, L-3 "
                        "of an L-layer target (EAGLE-3's choice), a list such as 2,15,27, or 'none' (EAGLE-1's input)")
    t.add_argument("--eagle3", action="store_true",
                   help="EAGLE: EAGLE-3's draft layer (fc over the fused layers alone, q/k/v over cat(norm(embed), norm(h)), "
                        "the token loss alone; its export is a true EAGLE-3 checkpoint for TensorRT-LLM's PyTorch backend)")
    t.add_argument("--eagle-train-head", action="store_true",
                   help="EAGLE: train its own LM head rows (default: the target's rows, frozen and not shipped)")
    t.add_argument("--draft-vocab-size", type=int, default=8192, help="EAGLE, Medusa and the draft: the most frequent tokens they rank (the vocabulary size = all)")
    t.add_argument("--draft-layers", type=int, default=3, help="draft: target layers kept (evenly spaced)")
    t.add_argument("--init-from", default=None, metavar="DIR",
                   help="continue training this artifact of the same mode (a `train` output, e.g. a shipped default); "
                        "its architecture and draft vocabulary replace the flags that describe them")
    t.add_argument("--eval-prompts", type=int, default=13, help="Spec-Bench prompts (one per category) for the final acceptance check; 0 = skip")
    t.add_argument("--engines-dir", default=None)
    t.add_argument("--progress-jsonl", action="store_true",
                   help="progress as one JSON object per line on stderr ({stage, done, total, loss}) instead of bars")
    t.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop training at the first step after this many seconds of this session, keeping what "
                        "the run needs to continue in OUT/resume/ and its progress in OUT/train.json")
    t.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run --time-limit stopped in output dir DIR (or a run killed after its state's "
                        "last save, written every 10 minutes), with that run's settings; it ends exactly as one "
                        "uninterrupted run (--time-limit may stop it again)")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export", help="write a trained artifact in the layout engines (vLLM, TensorRT-LLM, SGLang) load")
    e.add_argument("source", help="a directory written by `train` (an EAGLE-3 module, Medusa heads or a distilled draft)")
    e.add_argument("--output-dir", required=True)
    e.add_argument("--format", default=None, choices=sorted({f for fs in export_formats().values() for f in fs}),
                   help="EAGLE-3: eagle3 (default; vLLM's and SGLang's numbering of the captured layers) or modelopt "
                        "(ModelOpt's and TensorRT-LLM's); Medusa heads: medusa; the draft: hf (a plain model directory)")
    e.add_argument("--model", default=None, help="the base model the artifact belongs to (default: the one it was trained for)")
    e.set_defaults(func=cmd_export)
    c = sub.add_parser("compile", help="build the transformers backend's fast pass for this machine now (the app, "
                       "generate, bench and serve otherwise build it on first use): once per model, dtype and CPU")
    c.add_argument("--model", default=BUNDLED)
    c.add_argument("--dtype", default="float32", choices=["auto", *DTYPES], help=DTYPE_HELP)
    c.add_argument("--engines-dir", default=None)
    c.add_argument("--nice", type=int, default=0, help="lower this build's CPU priority by N (the app's background build: "
                   "19, so the runs it serves meanwhile keep the cores)")
    c.add_argument("--threads", type=int, default=None, help="torch threads to build and time the pass for (default: "
                   "torch's; the app passes its own, since a pass is built for the thread count that serves it)")
    c.add_argument("--recheck", nargs="?", const="always", choices=["always", "provisional"], default=None,
                   help="measure a built pass's choices again without rebuilding (provisional: only when they were "
                   "measured under load; the app starts that when it loads such a pass)")
    c.set_defaults(func=cmd_compile, registry=modes)
    d = sub.add_parser("ship-data", help="copy the self-distilled training answers cached in engines/ into assets/ "
                       "(compressed), so later training runs, here or on a fresh clone, start from them")
    d.add_argument("--model", default=BUNDLED, help="the model whose answers to ship (its tokenizer rebuilds the prompts)")
    d.add_argument("--engines-dir", default=None)
    d.add_argument("--output-dir", default=None, help="default: assets/training_data")
    d.set_defaults(func=cmd_ship_data)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["ui", *argv]  # `python -m app [--host H] [--port P] ...` starts the web app
    args = build_parser().parse_args(argv)
    if getattr(args, "dtype", None) == "auto":
        from app.models import fast_dtype

        args.dtype = fast_dtype()
    # A stop request (kill, a container's shutdown) unwinds like Ctrl-C: the finally blocks stop the vLLM engines
    # this process started instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return args.func(args)
    except (ConfigError, ModelError, ContextError, ExportError, EngineError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
