"""The GPU host's check of TensorRT-LLM (issue 61, item 5), run by scripts/gpu-check.sh with the app's interpreter.

Every mode TensorRT-LLM runs, on each of its backends that runs it (the mode's entry's `trtllm`), with the app's own
artifacts: the plan is the app's (registry.spec_for, EngineStore.plan), the artifacts are exported as the store's
builder exports them, and the engine is this project's worker (app/backends/tensorrt_llm/worker.py) in TensorRT-LLM's
own environment (.venv-trtllm). Each runs PROMPTS prompts greedily; per mode it prints: ran or refused (with the
reason), τ (tokens per engine iteration), tokens/s, and the share identical to autoregressive on the same backend.
The stream is read the way the app reads it (app/backends/tensorrt_llm/backend.py steps_from_diffs, with_perf_metrics).

    .venv/bin/python scripts/gpu_check.py [--dry-run]

--dry-run starts and prepares nothing: it prints what each mode would start and send, or why it is refused.
Exit status: 1 when a mode that is not refused does not run (or its stream does not add up), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import models, prompts, runner  # noqa: E402
from app.modes import MODES, ConfigError  # noqa: E402
from app.backends import registry  # noqa: E402
from app.backends.store import export_eagle, export_medusa, fill_build_dir  # noqa: E402
from app.backends.tensorrt_llm import builds as trtllm_builds, processes as trtllm_processes  # noqa: E402
from app.backends.tensorrt_llm import backend as trt  # noqa: E402
from app.service.errors import EngineError  # noqa: E402

ROOT = models.ROOT
WORKER = ROOT / "app" / "backends" / "tensorrt_llm" / "worker.py"
PYTHON = ROOT / ".venv-trtllm" / "bin" / "python"
OUT = models.DEFAULT_ENGINES / "gpu-check"
PROMPTS = 3
MAX_NEW_TOKENS = 64
START_TIMEOUT_S = 600.0  # a TensorRT engine is built from the checkpoint when the worker starts


def cases():
    """(mode entry, TensorRT-LLM backend) for every mode TensorRT-LLM runs; autoregressive first (the baseline)."""
    for mode in MODES:
        for flavour in mode.trtllm:
            yield mode, flavour


def request_for(mode, flavour: str):
    """The mode's default request on that backend, as the app checks it; a draft-model mode with the bundled draft."""
    fields = {"decoding_type": mode.decoding_type}
    if mode.draft_model:
        fields["speculative_model"] = runner.default_draft(models.BUNDLED)
    request = MODES.parse({"speculative_config": fields, "backend": "tensorrt_llm", "trtllm_backend": flavour,
                           "max_new_tokens": MAX_NEW_TOKENS})
    trt.check(request)
    return request


def worker_plan(mode, flavour: str, store: registry.EngineStore, root: Path = OUT) -> tuple[dict, dict, Path]:
    """(the app's plan, the worker's --llm file's content, the case's directory). The worker's LLM builds a
    TensorRT engine from the checkpoint itself (the plan's build_config), so nothing is saved ahead of it."""
    request = request_for(mode, flavour)
    spec = registry.spec_for(request, models.BUNDLED)
    plan = store.plan(spec)
    if plan["cannot_run"]:
        raise EngineError("; ".join(plan["cannot_run"]))
    out = root / f"{mode.name}-{flavour}"
    llm = fill_build_dir(plan["llm"], out)
    if trtllm_builds.overlap_off(flavour, mode.name):
        llm["disable_overlap_scheduler"] = True
    file = {"trtllm_backend": flavour, "llm": llm, "serves": f"{mode.name} on {models.BUNDLED} ({flavour} backend)"}
    return {**plan, "request": request}, file, out


def command(llm_file: Path, port: int, python: Path = PYTHON) -> list[str]:
    return [str(python), str(WORKER), "--host", "127.0.0.1", "--port", str(port), "--llm", str(llm_file)]


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A chat prompt with the model's template, as the app's in-process backend renders it (_prompt_ids)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


# ----------------------------------------------------------------------------- a real run


def prepare(plan: dict, out: Path) -> None:
    """The model (and a draft model of the registry) prepared, and the artifacts exported as the store's builder
    exports them (trtllm_builds.trtllm_builder), into the case's directory."""
    where = models.locate(models.BUNDLED)
    draft = plan["request"].speculative_config.model_dump().get("speculative_model")
    if draft in models.DRAFT_ALIASES:
        models.locate(draft)
    for step in plan["prepare"]:
        target = Path(fill_build_dir(step["to"], out))
        if target.exists():
            continue
        export = {"export_medusa": export_medusa,
                  "export_eagle": lambda *a: export_eagle(*a, layout="modelopt")}[step["step"]]
        export(Path(step["from"]), Path(where), target, models.BUNDLED)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:  # 503 while it loads
        return json.loads(err.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(file: dict, out: Path, python: Path) -> tuple[subprocess.Popen, int]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm.json").write_text(json.dumps(file, indent=1))
    port = free_port()
    log = open(out / "worker.log", "ab")
    proc = subprocess.Popen(command(out / "llm.json", port, python), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=out)
    log.close()
    began = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with status {proc.returncode}; its log ends:\n{log_tail(out / 'worker.log')}")
        state = health(port)
        if state and state.get("ready"):
            print(f"  worker ready after {time.monotonic() - began:.0f} s: TensorRT-LLM {state.get('tensorrt_llm')}, "
                  f"{state.get('llm_class')}", flush=True)
            return proc, port
        if time.monotonic() - began > START_TIMEOUT_S:
            stop(proc, port)
            raise RuntimeError(f"the worker was not ready within {START_TIMEOUT_S:.0f} s; its log ends:\n{log_tail(out / 'worker.log')}")
        time.sleep(2)


def stop(proc: subprocess.Popen, port: int) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/shutdown", b"{}"), timeout=10).read()
        proc.wait(timeout=120)
    except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
        pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def generate(port: int, ids: list[int], sampling: dict) -> dict:
    """One request, read as the service reads the stream (trtllm_processes.generate): its steps, totals and output."""
    *steps, end = trtllm_processes.generate(port, ids, sampling)
    if end["error"] or end["aborted"]:
        raise RuntimeError(f"the request ended with {end['error'] or end['aborted']}")
    tokens = [t for step in steps for t in step["tokens"]]
    if tokens != end["token_ids"]:
        raise RuntimeError(f"the streamed steps add up to {len(tokens)} tokens but the output has {len(end['token_ids'])}")
    return {"tokens": tokens, "totals": end["totals"], "elapsed_s": end["elapsed_s"]}


def run_case(plan: dict, file: dict, out: Path, texts: list[str], tokenizer, python: Path) -> list[dict]:
    prepare(plan, out)
    proc, port = start(file, out, python)
    try:
        sampling = trt.sampling_kwargs(plan["request"])
        return [generate(port, prompt_ids(tokenizer, text), sampling) for text in texts]
    finally:
        stop(proc, port)


def summary(results: list[dict], baseline: list[dict] | None) -> str:
    new = sum(len(r["tokens"]) for r in results)
    iters = sum(r["totals"].get("target_steps") or 0 for r in results)
    seconds = sum(r["elapsed_s"] for r in results)
    tau = f"{new / iters:.2f}" if iters else "n/a"
    rate = f"{new / seconds:.1f}" if seconds else "n/a"
    accepted = ", ".join(sorted({str(r["totals"].get("accepted_from")) for r in results}))
    if baseline is results:
        same = "(the baseline)"
    elif baseline is None:
        same = "n/a (autoregressive did not run on this backend)"
    else:
        prefix = [_common(r["tokens"], b["tokens"]) for r, b in zip(results, baseline)]
        share = sum(prefix) / max(sum(len(b["tokens"]) for b in baseline), 1)
        exact = sum(r["tokens"] == b["tokens"] for r, b in zip(results, baseline))
        same = f"{exact}/{len(results)} prompts, {share:.0%} of tokens (common prefix)"
    return f"ran; τ {tau} tokens/iteration, {rate} tokens/s, identical to autoregressive: {same}; accepted counted from: {accepted}"


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print what each mode would start and send; start nothing")
    parser.add_argument("--python", type=Path, default=PYTHON, help="TensorRT-LLM's interpreter (default %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT, help="where each mode's files go (default %(default)s)")
    args = parser.parse_args(argv)
    args.python = args.python.absolute()  # not resolved: a venv's python is a symlink that must stay inside the venv
    store = registry.EngineStore(models.DEFAULT_ENGINES)
    texts = [p["text"] for p in prompts.load_prompts(None, None, 1)[:PROMPTS]]
    tokenizer = None if args.dry_run else models.load_tokenizer(models.BUNDLED)
    baselines: dict[str, list[dict] | None] = {}
    failed, ran, refused = [], 0, 0
    for mode, flavour in cases():
        title = f"{mode.name} on TensorRT-LLM's {flavour} backend ({trt.LLM_CLASSES[flavour]})"
        try:
            plan, file, out = worker_plan(mode, flavour, store, args.out.absolute())
        except (ConfigError, EngineError) as err:
            refused += 1
            print(f"== {title}\n  refused: {err}\n", flush=True)
            continue
        if args.dry_run:
            ran += 1
            steps = [f"{s['step']} from {s['from']} to {fill_build_dir(s['to'], out)}" for s in plan["prepare"]] or ["nothing to export"]
            print(f"== {title}\n  would prepare: {models.BUNDLED} in {models.DEFAULT_ENGINES / 'models'}; {'; '.join(steps)}\n"
                  f"  would start: {' '.join(command(out / 'llm.json', 0, args.python)).replace('--port 0', '--port <free port>')}\n"
                  f"  {out / 'llm.json'}: {json.dumps(file)}\n"
                  f"  would send, for each of {len(texts)} prompts (token ids from the app's tokenizer): "
                  f"sampling_params {json.dumps(trt.sampling_kwargs(plan['request']))}\n"
                  + "".join(f"  note: {n}\n" for n in trt.trtllm_notes(plan["request"]) + plan["notes"]), flush=True)
            continue
        print(f"== {title}", flush=True)
        try:
            results = run_case(plan, file, out, texts, tokenizer, args.python)
        except Exception as err:  # noqa: BLE001 - whatever stops a supported mode is the check's finding
            failed.append(mode.name + "/" + flavour)
            print(f"  DID NOT RUN: {type(err).__name__}: {err}\n", flush=True)
            continue
        ran += 1
        if mode.name == "autoregressive":
            baselines[flavour] = results
        print(f"  {summary(results, baselines.get(flavour))}\n", flush=True)
    what = "would run" if args.dry_run else "ran"
    print(f"{ran} {what}, {refused} refused, {len(failed)} did not run" + (f": {', '.join(failed)}" if failed else "")
          + ("; nothing was started (dry run)" if args.dry_run else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
