"""Speculative decoding under concurrent load: a sweep of N simultaneous requests to a plain vLLM engine and to
speculative engines of the same model.

Speculation spends spare compute to cut latency: at batch 1 a verify pass over k + 1 positions costs little more
than a one-token pass, because the pass is limited by reading the weights. An engine that batches continuously
fills that spare compute with other requests as they arrive, so the extra positions stop being free and, at some
N, speculation costs more than it saves. This module measures where, on real engines: for each N (1, 2, 4, 8, 16
by default) it sends N requests at once (distinct Spec-Bench prompts) to each engine in turn and records per
request the time to first token and the time per output token, all requests' tokens per second together, τ from
the engine's spec-decode counters, and whether each output equals the plain engine's.

A sweep is data (`run` returns it, `Service.load_sweep` streams it as a job's messages); the arithmetic on it
(speedups, the crossover) is pure and shared by the web UI, the bench and the docs. The project's own verify loop
runs one request at a time: the sweep may carry its batch-1 point (`ours`) beside the engines'.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import figures, traces
from app.modes import ConfigError
from app.modes.errors import one_line
from app.service import jobs
from app.backends.openai import WIRE_ERRORS, RemoteError, sse
from app.backends.vllm import client
from app.backends.base import Prompt, encode
from app.prompts import load_prompts

DEFAULT_N = (1, 2, 4, 8, 16)
MAX_N = 32  # the operator's bound: each request holds KV cache in the engine's fixed 1 GiB
PUBLIC_MAX_N = 4  # a visitor's sweep on a shared 2-core machine
MAX_PROMPT_CHARS = 1500  # long Spec-Bench prompts (some summarization and rag ones) would time prefill, not decoding
VERSION = 1
PLAIN = "vllm_generate"
SPEC_BENCH_TASKS = ("summarization", "translation", "qa", "math_reasoning", "rag")


class LoadError(ConfigError):
    """A sweep that cannot run as asked, or a file that is not a sweep; the message is meant for the user."""


@dataclass(frozen=True)
class Target:
    """One engine under load: its row name in the bench (vllm_generate, vllm_ngram, ...), its server and whether it
    speculates (it then has spec-decode counters)."""

    row: str
    url: str
    model: str
    speculative: dict | None = None


def parse_ns(text: str | Sequence[int] | None, allowed: int = MAX_N) -> list[int]:
    """The concurrency levels of a sweep ("1,2,4" or a list), increasing, each 1..allowed."""
    if text is None:
        values = list(DEFAULT_N)
    elif isinstance(text, str):
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise LoadError(f"concurrency must be a comma-separated list of request counts such as 1,2,4,8, got '{one_line(text)}'") from None
    else:
        values = [int(v) for v in text]
    if not values:
        raise LoadError("concurrency needs at least one request count, such as 1,2,4,8")
    bad = [v for v in values if not 1 <= v <= allowed]
    if bad:
        raise LoadError(f"concurrency must be between 1 and {allowed} requests at once here, got {bad[0]}")
    return sorted(set(values))


def pick_prompts(rows: list[dict], n: int) -> list[dict]:
    """`n` distinct prompts, one category after another in turn (Spec-Bench's tasks first, the file's order within
    each), short enough that the sweep times decoding rather than prefill."""
    by_category: dict[str, list[dict]] = {}
    for r in rows:
        if len(r["text"]) <= MAX_PROMPT_CHARS:
            by_category.setdefault(r["category"], []).append(r)
    out: list[dict] = []
    # Spec-Bench's own tasks first (summarization repeats its source, where drafting from context pays), then MT-Bench's.
    order = [c for c in SPEC_BENCH_TASKS if c in by_category] + [c for c in by_category if c not in SPEC_BENCH_TASKS]
    queues = [by_category[c] for c in order]
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    if len(out) < n:
        raise LoadError(f"the prompt set has only {len(out)} prompts of at most {MAX_PROMPT_CHARS} characters; {n} requests need {n}")
    return out


# ----------------------------------------------------------------------------- measuring


def _request(target: Target, prompt_ids: list[int], max_new_tokens: int, cancel: threading.Event,
             start: float, timeout_s: float) -> dict[str, Any]:
    """One streamed greedy request: its tokens, chunks (engine steps as streamed) and times from `start`."""
    body = {"model": target.model, "prompt": prompt_ids, "max_tokens": max_new_tokens, "stream": True,
            "return_token_ids": True, "temperature": 0.0, "ignore_eos": False}
    req = urllib.request.Request(target.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    out: dict[str, Any] = {"token_ids": [], "chunks": 0, "first_s": None, "last_s": None, "finish_reason": None,
                           "error": None, "steps": []}
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            for chunk in sse(response):
                if "error" in chunk:
                    raise RemoteError(chunk["error"].get("message", "the vLLM engine failed"))
                choice = (chunk.get("choices") or [{}])[0]
                ids = [int(t) for t in choice.get("token_ids") or []]
                if ids:
                    now = time.perf_counter() - start
                    if out["last_s"] is not None:  # an engine step after the first: (tokens, seconds) for its spread
                        out["steps"].append((len(ids), now - out["last_s"]))
                    out["first_s"] = now if out["first_s"] is None else out["first_s"]
                    out["last_s"] = now
                    out["token_ids"] += ids
                    out["chunks"] += 1
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
                if cancel.is_set():
                    out["finish_reason"] = "cancelled"
                    break  # closing the connection makes vLLM abort the request
    except (*WIRE_ERRORS, RemoteError) as err:  # a stream cut short included (http.client.IncompleteRead)
        out["error"] = str(getattr(err, "reason", err))
    return out


def measure(target: Target, prompts: list[list[int]], max_new_tokens: int, cancel: threading.Event,
            timeout_s: float) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """N = len(prompts) requests sent to `target` at once: each request's record, the wall time, the spec-decode
    counters' growth (what `point` makes a point of)."""
    engine = client.Engine(target.url, target.model)
    before = engine.counters() if target.speculative else {}
    start = time.perf_counter()
    results: list[dict[str, Any]] = [{} for _ in prompts]

    def one(i: int) -> None:
        results[i] = _request(target, prompts[i], max_new_tokens, cancel, start, timeout_s)

    threads = [threading.Thread(target=one, args=(i,), name=f"load-{target.row}-{i}", daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max([r["last_s"] for r in results if r.get("last_s") is not None], default=time.perf_counter() - start)
    streamed_accepted = sum(len(r["token_ids"]) - r["chunks"] for r in results)
    counters = client.settled(client.Engine(target.url, target.model), before, streamed_accepted) if before else {}
    return results, wall, counters


def point(row: str, results: list[dict[str, Any]], wall_s: float, counters: dict[str, Any], speculates: bool,
          n: int | None = None) -> dict[str, Any]:
    """A sweep point from its requests' records (pure): see `points` for its fields. `n`: the requests sent at once
    when `results` pools repeats of them (prompt i of a repeat is prompt i % n)."""
    n_at_once = n or len(results)
    requests = []
    for i, r in enumerate(results):
        count = len(r.get("token_ids") or [])
        tpot = (r["last_s"] - r["first_s"]) / (count - 1) if count > 1 else None
        requests.append({"prompt": i % n_at_once, "new_tokens": count, "chunks": r.get("chunks", 0), "ttft_s": r.get("first_s"),
                         "tpot_s": tpot, "elapsed_s": r.get("last_s"), "finish_reason": r.get("finish_reason"),
                         "error": r.get("error"), "token_ids": list(r.get("token_ids") or [])})
    tokens = sum(q["new_tokens"] for q in requests)
    chunks = sum(q["chunks"] for q in requests)
    tpots = [q["tpot_s"] for q in requests if q["tpot_s"] is not None]
    ttfts = [q["ttft_s"] for q in requests if q["ttft_s"] is not None]
    # vLLM's own mean acceptance length: a verify pass that drafted commits its accepted tokens and one of the target's.
    # (tokens - accepted would count passes only if no request's last step were cut by max_tokens after accepting more.)
    drafts = counters.get("num_drafts") if counters else None
    tau = (1 + counters["num_accepted_tokens"] / drafts if drafts else None) if speculates else 1.0
    steps = [tuple(x) for r in results for x in r.get("steps") or []]
    return {"row": row, "n": n_at_once, "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
            "seconds_per_token": sum(tpots) / len(tpots) if tpots else None,
            "ttft_s": sum(ttfts) / len(ttfts) if ttfts else None, "tau": tau,
            "tau_streamed": tokens / chunks if chunks else None, "new_tokens": tokens, "wall_s": wall_s,
            "spec_decode": counters or None, "moments": traces.moments(steps), "requests": requests}


def points(plain: Target, speculative: Sequence[Target], prompts: list[list[int]], ns: Sequence[int],
           max_new_tokens: int, cancel: threading.Event, timeout_s: float = 300.0) -> Iterator[dict[str, Any]]:
    """The sweep's points as they are measured: for each N, N requests at once to the plain engine, then to each
    speculative one (interleaved, so every engine meets the machine's load of the moment), until done or `cancel`
    is set (a point whose requests were cancelled is not one).

    Each point: row, n, tokens_per_s (all requests' tokens over the time from sending them to the last one's last
    token), seconds_per_token (per request after its first token, the mean over requests), ttft_s (mean), tau
    (the engine's counters: 1 + accepted ÷ drafts, tokens per verify pass that drafted; 1 for the plain engine),
    tau_streamed (tokens per streamed chunk: per engine step, drafted or not), identical_share (outputs equal to the plain engine's for the same prompt, the first time it ran it),
    spec_decode (the counters' growth), requests, at_s (when it finished, from the sweep's start).
    """
    if len(prompts) < max(ns):
        raise LoadError(f"{max(ns)} requests need {max(ns)} distinct prompts, got {len(prompts)}")
    # A first request pays one-off costs (allocations, kernels chosen for new shapes): each engine takes a short one
    # first, 8 prompt tokens (less than a block of vLLM's prefix cache) and 4 new tokens.
    for target in (plain, *speculative):
        if cancel.is_set():
            return
        _request(target, prompts[-1][:8], 4, cancel, time.perf_counter(), timeout_s)
    start = time.perf_counter()
    reference: dict[int, list[int]] = {}
    order = [plain, *speculative]
    for n in ns:
        # At N = 1, the point the figures rule reads (one request's verify step contains a plain step), each engine
        # runs twice in the order A B … B A and its two runs are pooled: a load that rose or fell during the pair
        # weighs on both sides alike (an engine cannot be stepped in turn with another within a request, as the Run
        # tab's race steps two runs).
        rounds = [order, order[::-1]] if n == 1 else [order]
        runs: dict[str, list[tuple[list[dict[str, Any]], float, dict[str, Any]]]] = {t.row: [] for t in order}
        for targets in rounds:
            for target in targets:
                if cancel.is_set():
                    return
                results, wall, counters = measure(target, prompts[:n], max_new_tokens, cancel, timeout_s)
                if any(r["finish_reason"] == "cancelled" for r in results):
                    return
                failed = next((r["error"] for r in results if r["error"]), None)
                if failed:
                    raise LoadError(f"a request to the {target.row} engine failed: {failed}")
                runs[target.row].append((results, wall, counters))
        for target in order:
            measured = runs[target.row]
            p = point(target.row, [r for results, _, _ in measured for r in results], sum(w for _, w, _ in measured),
                      _pooled([c for _, _, c in measured]), bool(target.speculative), n)
            if target is plain:
                for q in p["requests"]:
                    reference.setdefault(q["prompt"], q["token_ids"])
            judged = [q for q in p["requests"] if q["prompt"] in reference]
            for q in p["requests"]:
                q["identical"] = q["token_ids"] == reference[q["prompt"]] if q["prompt"] in reference else None
            p["identical_share"] = sum(q["identical"] for q in judged) / len(judged) if judged else None
            p["at_s"] = time.perf_counter() - start
            yield p


def _pooled(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats' spec-decode counter growths summed ({} for an engine without counters)."""
    if not any(deltas):
        return {}
    out: dict[str, Any] = {key: sum(d.get(key, 0) for d in deltas) for key in client.COUNTERS}
    per_pos = [d.get("accepted_per_pos") or [] for d in deltas]
    out["accepted_per_pos"] = [sum(p[i] for p in per_pos if i < len(p)) for i in range(max(map(len, per_pos)))]
    return out


def run(plain: Target, speculative: Sequence[Target], prompts: list[list[int]], ns: Sequence[int], max_new_tokens: int,
        cancel: threading.Event, timeout_s: float = 300.0) -> dict[str, Any]:
    """The whole sweep (see `points`): {points, finish_reason, seconds}."""
    start = time.perf_counter()
    measured = list(points(plain, speculative, prompts, ns, max_new_tokens, cancel, timeout_s))
    return {"points": measured, "finish_reason": "cancelled" if cancel.is_set() else "length",
            "seconds": time.perf_counter() - start}


def running(url: str, model: str) -> dict[str, float]:
    """The engine's requests running and waiting now (vLLM's gauges): 0 and 0 once a cancelled sweep is gone."""
    out = {"running": 0.0, "waiting": 0.0}
    for name, labels, value in re.findall(r"^vllm:num_requests_(running|waiting)\{([^}]*)\}\s+([0-9.eE+-]+)$",
                                          _metrics(url), re.M):
        if f'model_name="{model}"' in labels:
            out[name] += float(value)
    return out


def generated(url: str, model: str) -> float:
    """The tokens the engine has generated since it started (vLLM's counter): it stands still once nothing runs."""
    found = re.findall(r"^vllm:generation_tokens_total\{([^}]*)\}\s+([0-9.eE+-]+)$", _metrics(url), re.M)
    return sum(float(value) for labels, value in found if f'model_name="{model}"' in labels)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10.0) as r:
        return r.read().decode()


# ----------------------------------------------------------------------------- reading a sweep (pure)


def table(points: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """The bench's `load` object: load[row][str(N)] = {tokens_per_s, seconds_per_token, ttft_s, tau, identical_share}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p in points:
        out.setdefault(p["row"], {})[str(p["n"])] = {k: p.get(k) for k in
                                                     ("tokens_per_s", "seconds_per_token", "ttft_s", "tau", "identical_share")}
    return out


def speedups(points: list[dict], row: str, plain: str = PLAIN) -> list[dict[str, Any]]:
    """Per N where both ran: `latency` (the plain engine's time per output token over the row's: > 1 is faster per
    request), `throughput` (the row's tokens/s over the plain engine's), τ (tokens per engine step as streamed), and
    `step_cost` (a speculative step's time in plain steps at that N: time per token × τ; latency = τ ÷ step_cost).
    step_cost assumes the N requests share every step; a request that speculation finishes early leaves the rest a
    smaller, cheaper batch, and step_cost can then fall below 1 (docs/benchmarks.md, suffix at N = 4).
    `reach`: how far above its reading the 95 % interval of the step times' spread goes (traces.reach; 1 without
    the points' `moments`).

    At N = 1 the figures rule (app/figures.py) applies: one request's verify step contains a plain step, so a
    step_cost below 1 within its spread's reach is read as 1 (latency τ), and one beyond it withholds both ratios
    (None) with `doubt` saying why. Above N = 1 a step may cost less (the note above): nothing is withheld."""
    by = {(p["row"], p["n"]): p for p in points}
    out = []
    for n in sorted({p["n"] for p in points if p["row"] == row}):
        mine, base = by.get((row, n)), by.get((plain, n))
        if not mine or not base:
            continue
        # Per engine step, drafted or not (what a step's time is divided by); the counters' τ counts drafting steps only.
        tau = mine.get("tau_streamed") or mine.get("tau")
        spt, base_spt = mine.get("seconds_per_token"), base.get("seconds_per_token")
        latency = base_spt / spt if spt and base_spt else None
        reach = traces.reach(traces.spread_of(mine.get("moments"), base.get("moments")))
        r = {"n": n, "latency": latency, "reach": reach,
             "throughput": mine["tokens_per_s"] / base["tokens_per_s"] if base.get("tokens_per_s") else None,
             "tau": tau, "step_cost": spt * tau / base_spt if spt and base_spt and tau else None,
             "plain_tokens_per_s": base.get("tokens_per_s"), "doubt": None}
        if n == 1 and r["step_cost"] is not None:
            cost, possible = figures.at_least_one(r["step_cost"], reach)
            if possible:
                r["latency"] = tau / cost
                r["throughput"] = None if r["throughput"] is None else min(r["throughput"], tau)
            else:
                r["doubt"] = (f"at N = 1 a verify step measured {r['step_cost']:.2f} plain steps (its spread reaching "
                              f"{r['step_cost'] * reach:.2f}), less than the plain step it contains: the machine's load "
                              "changed between the two engines' runs")
                r["latency"] = r["throughput"] = None
        out.append(r)
    return out


def crossover(rows: list[dict[str, Any]], key: str = "latency") -> dict[str, Any]:
    """Where speculation stops paying by `key`: {"state": "crosses", "last": N it paid at, "at": first N it no
    longer did}, {"state": "never_pays"} (not even at the smallest N), {"state": "always_pays"} (up to the
    largest N measured), or {"state": "unknown"} with fewer than one figure."""
    values = [(r["n"], r[key]) for r in rows if r.get(key) is not None]
    if not values:
        return {"state": "unknown"}
    if values[0][1] < 1:
        return {"state": "never_pays", "at": values[0][0]}
    for (n0, _), (n1, v1) in zip(values, values[1:]):
        if v1 < 1:
            return {"state": "crosses", "last": n0, "at": n1}
    return {"state": "always_pays", "last": values[-1][0]}


# ----------------------------------------------------------------------------- a sweep as a document


def document(sweep: dict[str, Any], **about: Any) -> dict[str, Any]:
    """What a recording keeps: the sweep without token ids (the identity verdicts stay), with what it ran on."""
    points = [{**p, "requests": [{k: v for k, v in q.items() if k != "token_ids"} for q in p["requests"]]}
              for p in sweep["points"]]
    return {"kind": "load-sweep", "version": VERSION, **about, "finish_reason": sweep.get("finish_reason"),
            "seconds": sweep.get("seconds"), "points": points}


_POINT_NUMBERS = ("tokens_per_s", "seconds_per_token", "ttft_s", "tau", "tau_streamed", "identical_share", "at_s", "wall_s")


MAX_BYTES = 2**20  # a sweep of 256 points with their requests is ~0.3 MB


def read(path: str | Path, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """A sweep file read back and checked (parse); LoadError, in words, if it is too big or not a sweep."""
    size = Path(path).stat().st_size
    if size > max_bytes:
        raise LoadError(f"the file has {size:,} bytes; a sweep to replay may have {max_bytes:,} bytes at most")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise LoadError("not a recorded load sweep (the file is not JSON; expected the Load sweep's download)") from None
    return parse(data)


def parse(data: Any) -> dict[str, Any]:
    """A recorded sweep read back, checked and reduced to what the display reads (names, numbers); LoadError if it
    is not one."""
    if not isinstance(data, dict) or data.get("kind") != "load-sweep" or not isinstance(data.get("points"), list):
        raise LoadError("not a recorded load sweep (expected the Load sweep's download)")
    if len(data["points"]) > 256:
        raise LoadError(f"the sweep has {len(data['points'])} points; a replay shows at most 256")
    points = []
    for p in data["points"]:
        if not isinstance(p, dict) or not isinstance(p.get("row"), str) or not re.fullmatch(r"[a-z0-9_]{1,40}", p["row"]):
            raise LoadError("a point of the sweep has no engine row name")
        if not isinstance(p.get("n"), int) or not 1 <= p["n"] <= 1024:
            raise LoadError("a point of the sweep has no request count")
        clean = {"row": p["row"], "n": p["n"]}
        for key in _POINT_NUMBERS:
            value = p.get(key)
            clean[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
                and abs(value) < 1e9 else None
        if clean["tokens_per_s"] is None:
            raise LoadError("a point of the sweep has no tokens per second")
        m = p.get("moments")
        if isinstance(m, dict) and set(m) == {"n", "t", "s", "tt", "ts", "ss"} and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12 for v in m.values()):
            clean["moments"] = {k: float(v) for k, v in m.items()}
        points.append(clean)
    out = {"kind": "load-sweep", "points": points}
    for key in ("model", "dtype", "mode", "method", "cpu", "recorded", "finish_reason"):
        if isinstance(data.get(key), str):
            out[key] = data[key][:200]
    for key in ("max_new_tokens",):
        if isinstance(data.get(key), int):
            out[key] = data[key]
    ours = data.get("ours")
    if isinstance(ours, dict):
        out["ours"] = {"speedup": _positive(ours.get("speedup")), "tau": _positive(ours.get("tau")),
                       "raced": ours.get("raced") is True,
                       "doubt": ours["doubt"][:400] if isinstance(ours.get("doubt"), str) else None}
        interval = ours.get("interval")
        if isinstance(interval, (list, tuple)) and len(interval) == 2 and all(_positive(v) for v in interval):
            out["ours"]["interval"] = [float(v) for v in interval]
    return out


def _positive(value: Any) -> float | None:
    """A recorded number read back: a positive finite one, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9:
        return float(value)
    return None


# ----------------------------------------------------------------------------- the service's sweep


def cpu_name() -> str:
    """This machine's CPU as the docs name it (model name and cores), from Linux's /proc/cpuinfo."""
    import os

    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "a CPU")
    except OSError:
        name = "a CPU"
    return f"{name}, {os.cpu_count()} cores"


def allowed(policy) -> int:
    """The largest N a sweep may send on this server: public mode caps it (a shared machine)."""
    return PUBLIC_MAX_N if policy.public else MAX_N


def submit(service, data: dict[str, Any], ns: str | Sequence[int] | None = None, max_new_tokens: int = 32,
           ours: bool = False, progress=None, visitor: str | None = None, categories: list[str] | None = None,
           starting: Callable[[str], None] | None = None):
    """Service.load_sweep: a speculative request's engine and the plain engine of the same model and dtype (started
    or found running), distinct Spec-Bench prompts, then the sweep queued as a job (its time limit, Stop) whose
    messages are a `point` per measured point and an `end` carrying the recorded sweep (`document`). `ours`: first
    run the request's mode in this project's own loop and autoregressive decoding at batch 1, for its point.
    `starting(mode)` is told each engine's mode (the request's, then autoregressive) before it is started or found
    running: a first start takes minutes, and a page says which one it waits for."""
    ns = parse_ns(ns, allowed(service.policy))
    request = service.request({**data, "backend": "vllm", "max_new_tokens": max_new_tokens}, visitor)
    if request.mode == "autoregressive":
        raise LoadError("a load sweep compares a speculative mode with plain decoding: choose a speculative mode")
    plain_request = service.request({**data, "backend": "vllm", "max_new_tokens": max_new_tokens,
                                     "speculative_config": {"decoding_type": "Autoregressive"}}, visitor)
    state = service.available(request.backend)
    if not state.available:
        raise LoadError(f"a load sweep runs on vLLM engines: {state.reason}")
    if reason := service.supports(request.backend, request.entry, service.model):
        raise LoadError(reason)
    model = service.model
    # Public mode: a sweep runs on engines that are up, or starts only as many as visitors may start now (checked
    # before anything starts, so a refused sweep leaves no engine behind); what it starts it stops when it ends.
    ids = [service.engine_id(r, model) for r in (request, plain_request)]
    missing = [i for i in dict.fromkeys(ids) if not service.engine_running(request.backend, i)] if service.policy.public else []
    room = service.engine_room(request.backend)
    if missing and room is not None and len(missing) > room:
        raise LoadError(f"a load sweep needs the vLLM engines of {request.mode} and of plain decoding; {len(missing)} of "
                        f"them {'is' if len(missing) == 1 else 'are'} not running and visitors may start {room} more on "
                        "this public server now: try when the operator has started them, or later")

    def release() -> None:
        for build_id in missing:
            service.engine_release(request.backend, build_id)

    try:
        if starting:
            starting(request.mode)
        manifest, url = service.engine(request, model, progress, visitor)
        if starting:
            starting(plain_request.mode)
        plain_manifest, plain_url = service.engine(plain_request, model, progress, visitor)
    except BaseException:
        release()
        raise
    speculative = manifest["spec"]["config"]["speculative_config"]
    tok = service.tokenizer(request.backend, model)
    chosen = pick_prompts(load_prompts(None, categories, None), max(ns))
    prompts = [encode(tok, Prompt(p["text"])) for p in chosen]
    method = speculative["method"]
    plain = Target(PLAIN, plain_url, model)
    target = Target(f"vllm_{method}", url, model, speculative)
    about = {"model": model, "dtype": manifest["spec"]["config"]["dtype"], "mode": request.mode, "method": method,
             "speculative_config": speculative, "max_new_tokens": max_new_tokens, "ns": ns, "cpu": cpu_name(),
             "vllm": manifest["spec"]["versions"].get("vllm"), "recorded": time.strftime("%Y-%m-%d"),
             "prompts": [{"id": p["id"], "category": p["category"], "tokens": len(ids)} for p, ids in zip(chosen, prompts)]}
    ours_data = {**data, "backend": "transformers", "dtype": about["dtype"], "max_new_tokens": max_new_tokens}

    def work(cancel: threading.Event) -> Iterator[dict[str, Any]]:
        # On the job's worker: our loop's passes run where the service's generations run (JobManager.call).
        mine = our_point(service, ours_data, chosen[0]["text"], cancel) if ours else None
        start = time.perf_counter()
        measured = []
        for p in points(plain, [target], prompts, ns, max_new_tokens, cancel, timeout_s=service.limits.time_limit_s):
            measured.append(p)
            yield {"type": "point", "point": {k: v for k, v in p.items() if k != "requests"}}
        finish = "cancelled" if cancel.is_set() else "length"
        sweep = {"points": measured, "finish_reason": finish, "seconds": time.perf_counter() - start}
        yield {"type": "end", "finish_reason": finish, "error": None,
               "sweep": document(sweep, **about, **({"ours": mine} if mine else {}))}

    try:
        job = service.queue(work, visitor)
    except BaseException:
        release()
        raise
    if missing:  # however the job ends (finished, stopped, or cancelled before a worker reached it)
        threading.Thread(target=lambda: (job.done.wait(), release()), name="sweep-engines", daemon=True).start()
    return job


def our_point(service, data: dict[str, Any], prompt: str, cancel: threading.Event) -> dict[str, Any] | None:
    """This project's own loop at batch 1 (it runs one request at a time), raced step by step against autoregressive
    decoding on the sweep's first prompt as the Run tab races (jobs.race), read by the same rule
    (traces.speedup_parts): `speedup` after the prefill with its `interval`, τ, or `doubt` saying why no ratio is
    shown; None when it was stopped."""
    def work(spec: dict) -> Any:
        return service.prepare({**data, "speculative_config": spec}, Prompt(prompt))

    events: dict[str, list[dict]] = {"run": [], "baseline": []}
    for message in jobs.race(work(data["speculative_config"]), work({"decoding_type": "Autoregressive"}), True)(cancel):
        events[message["side"]].append(message)
    parts = traces.speedup_parts(events["run"], events["baseline"])
    if cancel.is_set() or parts is None:
        return None
    doubt = parts["doubt"]
    return {"raced": True, "tau": parts["tau"], "speedup": None if doubt else parts["decoding"],
            "interval": None if doubt else parts["interval"], "doubt": doubt}


def format_lines(points: list[dict], plain: str = PLAIN) -> str:
    """The bench's ratio lines: per speculative row and N, its speedup per request and in throughput over the plain
    engine, τ, and the crossover."""
    lines = []
    for row in sorted({p["row"] for p in points} - {plain}):
        rows = speedups(points, row, plain)
        for r in rows:
            per = "-" if r["latency"] is None else f"{r['latency']:.2f}x"
            through = "-" if r["throughput"] is None else f"{r['throughput']:.2f}x"
            tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
            lines.append(f"{row} / {plain} at N={r['n']}: {per} per request (time per token), {through} tokens/s "
                         f"(all requests), tau {tau}" + (f" ({figures.withheld(r['doubt'])})" if r["doubt"] else ""))
        cross = crossover(rows, "latency")
        lines.append(f"{row}: " + {"crosses": f"stops paying per request between N={cross.get('last')} and N={cross.get('at')}",
                                   "never_pays": "does not pay per request at any N measured",
                                   "always_pays": f"pays per request up to N={cross.get('last')}",
                                   "unknown": "no figures"}[cross["state"]])
    return "\n".join(lines)
