"""Shared helpers for the test suite: tiny models, running generate(), statistics.

Kept free of pytest fixtures so test modules can import it directly (`import helpers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from app.backends.processes import free_port  # noqa: F401 (the tests' too)
from app.decoding.loop import generate
from app.decoding.target import TransformersTarget
from app.decoding.tree import children

ROOT = Path(__file__).resolve().parent.parent


def tiny_llama(
    vocab: int = 96,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_pos: int = 256,
    seed: int = 0,
    init: float = 0.02,
) -> LlamaForCausalLM:
    """A randomly initialised Llama, float32, eval mode, reproducible from `seed`."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.requires_grad_(False)
    return model


def run(model, drafter, prompt, **kwargs):
    """(output tokens, events) of one generation (the target collects hidden states only for drafters that read them)."""
    events = list(generate(TransformersTarget(model, hidden_states=drafter.needs_hidden), drafter, prompt, **kwargs))
    return [t for e in events for t in e.tokens], events


def output_of(events) -> list[int]:
    return [t for e in events for t in e.tokens]


class DrafterSpy:
    """Wraps a drafter and records (context, room, proposal) of every propose() call."""

    def __init__(self, inner):
        self.inner, self.name, self.needs_hidden, self.calls = inner, inner.name, inner.needs_hidden, []

    def start(self, prompt, sampling, gen, prefill):
        self.inner.start(prompt, sampling, gen, prefill)

    def propose(self, context, room):
        prop = self.inner.propose(context, room)
        self.calls.append((list(context), room, prop))
        return prop

    def observe(self, proposal, verdict, out):
        self.inner.observe(proposal, verdict, out)


def ancestors_path(node: int, parents: Sequence[int]) -> list[int]:
    """Independent re-implementation of the root-to-node path (for checking traces)."""
    out = []
    while node != -1:
        out.append(node)
        node = parents[node]
    return out[::-1]


def expected_added_kind(accepted: list[int], parents: list[int]) -> str:
    if not parents:
        return "next"
    kids = children(parents)
    slot = accepted[-1] + 1 if accepted else 0
    return "correction" if kids[slot] else "bonus"


def check_target_probs(model, prompt, events, params) -> int:
    """Check every probability in the events' target views against the target recomputed from
    scratch (the whole context through the model, no cache); returns how many draft tokens were weighed."""

    def dist(context):
        with torch.no_grad():
            logits = model(torch.tensor([context])).logits[0, -1].double().numpy()
        if params.greedy:
            return reference_probs(logits)
        return reference_probs(logits, params.temperature, params.top_k, params.top_p)

    done, weighed = list(prompt), 0
    for e in events:
        view = e.target
        assert view["distribution"] == ("softmax" if params.greedy else "sampling")
        toks, parents = e.proposed["tokens"], e.proposed["parents"]
        for d in view["decided"]:
            path = ancestors_path(d["after"], parents) if d["after"] >= 0 else []
            ref = dist(done + [toks[j] for j in path])
            assert d["top"] == int(ref.argmax())
            assert d["top_p"] == pytest.approx(ref.max(), abs=1e-5)
            for c in [c for c, par in enumerate(parents) if par == d["after"]]:
                assert view["p"][c] == pytest.approx(ref[toks[c]], abs=1e-5)
                weighed += 1
            if d is view["decided"][-1] and e.added_token is not None:
                assert view["added_p"] == pytest.approx(ref[e.added_token], abs=1e-5)
                assert ref[e.added_token] > 0  # drawn from the distribution it reports
        done += e.tokens
    return weighed


def reference_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Temperature, then keep the k largest, then the smallest head of the sorted distribution
    whose mass reaches top_p (the top token always kept); renormalise over what is kept."""
    z = logits.astype(np.float64) / temperature
    keep = np.ones_like(z, dtype=bool)
    if top_k and top_k < len(z):
        kth = np.sort(z)[::-1][top_k - 1]
        keep &= z >= kth
    if top_p < 1.0:
        w = np.where(keep, np.exp(z - z[keep].max()), 0.0)
        w /= w.sum()
        order = np.argsort(-w, kind="stable")
        cum = 0.0
        nucleus = np.zeros_like(keep)
        for i in order:
            if not keep[i]:
                break
            nucleus[i] = True
            cum += w[i]
            if cum >= top_p:
                break
        keep &= nucleus
    out = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    return out / out.sum()


# ----------------------------------------------------------------------------- statistics


def chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(x / 2.0, dtype=torch.float64)))


def chisquare_gof(counts: Counter, probs: dict, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson goodness of fit of observed `counts` to the exact distribution `probs` (outcome -> prob).

    Outcomes with expected count < min_expected are pooled into one bin. Observed outcomes that
    have probability zero make the statistic infinite (p-value 0).
    """
    n = sum(counts.values())
    for k in counts:
        if probs.get(k, 0.0) <= 0.0:
            return math.inf, 0, 0.0
    big = [k for k, p in probs.items() if p * n >= min_expected]
    small = [k for k, p in probs.items() if 0 < p * n < min_expected]
    obs = [counts.get(k, 0) for k in big]
    exp = [probs[k] * n for k in big]
    if small:
        obs.append(sum(counts.get(k, 0) for k in small))
        exp.append(sum(probs[k] for k in small) * n)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    dof = len(obs) - 1
    return stat, dof, chi2_sf(stat, dof)


def chisquare_two_sample(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square test of homogeneity of two samples over a common set of outcomes (sparse bins pooled)."""
    na, nb = sum(a.values()), sum(b.values())
    keys = set(a) | set(b)
    pooled = {k: (a.get(k, 0) + b.get(k, 0)) / (na + nb) for k in keys}
    big = [k for k in keys if pooled[k] * min(na, nb) >= min_expected]
    small = [k for k in keys if k not in big]
    rows_a = [a.get(k, 0) for k in big] + ([sum(a.get(k, 0) for k in small)] if small else [])
    rows_b = [b.get(k, 0) for k in big] + ([sum(b.get(k, 0) for k in small)] if small else [])
    stat = 0.0
    for oa, ob in zip(rows_a, rows_b):
        tot = oa + ob
        if tot == 0:
            continue
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    dof = len(rows_a) - 1
    return stat, dof, chi2_sf(stat, dof)


def empirical(samples: Iterable) -> dict:
    c = Counter(samples)
    n = sum(c.values())
    return {k: v / n for k, v in c.items()}


def total_variation(p: dict, q: dict) -> float:
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def marginal(dist: dict, length: int) -> dict:
    """Distribution of the first `length` items of tuple outcomes."""
    out: dict = {}
    for k, v in dist.items():
        out[k[:length]] = out.get(k[:length], 0.0) + v
    return out


# ----------------------------------------------------------------------------- servers and stand-in packages


# The commands that run the transformers backend's fast pass by default (building it first, minutes, on a fresh
# store); tests run them eagerly unless they test that pass (tests/decoding/test_compiled.py).
FAST_COMMANDS = ("generate", "bench", "serve", "ui")


def collect(messages):
    """A service job's messages as (its start message, its steps, its end message)."""
    start, steps, end = None, [], None
    for m in messages:
        if m["type"] == "start":
            start = m
        elif m["type"] == "step":
            steps.append(m)
        else:
            end = m
    return start, steps, end


class Job:
    """A finished service job: its messages in one batch."""

    def __init__(self, messages):
        self.messages, self.cancelled = messages, False

    def batches(self, every):
        yield self.messages

    def cancel(self):
        self.cancelled = True


def app_command(*args) -> list[str]:
    """The command line of `python -m app ARGS`, on this interpreter: every test that runs the app runs this."""
    return [sys.executable, "-m", "app", *(str(a) for a in args)]


def run_cli(*args, timeout: float = 900, store: Path | None = None, env: dict | None = None,
            default_pass: bool = False) -> subprocess.CompletedProcess:
    """`python -m app ARGS` from the repository, offline, on the eager pass where the command takes it (`eager`; with
    `default_pass` the arguments as given: the command's own default, the fast pass), with `--engines-dir store` when
    given and `env` over the environment; its output captured."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    store_args = ["--engines-dir", str(store)] if store is not None else []
    args = [str(a) for a in args] if default_pass else eager(args)
    return subprocess.run(app_command(*args, *store_args), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@contextlib.contextmanager
def chromium():
    """Debian's chromium driven by Playwright (never `playwright install`), headless; closed after."""
    import shutil

    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.fail("chromium is missing: scripts/test.sh installs Debian's chromium package")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# The browser tests (tests/ui/browser/, and the vLLM backend's pages): what they load and where their screenshots go.
SHOTS = ROOT / "assets" / "screenshots"
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", ROOT / "test-artifacts"))
PROMPT = "Repeat this list exactly: apples, pears, plums, apples, pears, plums."
RECORDINGS = sorted((ROOT / "assets" / "traces").glob("*.json"))


def set_number(page, label, value):
    box = page.get_by_label(f"number input for {label}", exact=True)
    box.fill(str(value))
    box.press("Enter")


def inspect_step(page, n):
    """Type step `n` into the Inspect step box, as a user would, and wait for its detail.
    The box is enabled by the run's final update; Gradio applies that update's props (enabled, then the value of the
    last step) in separate ticks, so a number typed in between can be overwritten by the last step before it is sent:
    like a user who sees that, type it again (once)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.get_by_label("number input for Inspect step", exact=True)
    shown = "n => document.querySelector('#step-detail h4')?.innerText.startsWith(`Step ${n} `)"
    for attempt in range(2):
        box.fill(str(n))
        box.press("Enter")
        try:
            page.wait_for_function(shown, arg=n, timeout=15_000)
            return
        except PlaywrightTimeout:
            if attempt:
                raise


def wait_status(page, pattern, timeout=180_000):
    page.wait_for_function(
        "p => { const s = document.querySelector('#status'); return s && new RegExp(p).test(s.innerText); }",
        arg=pattern, timeout=timeout,
    )
    return page.inner_text("#status")


def eager(args) -> list[str]:
    """`python -m app` arguments with --eager added where the command takes it."""
    args = [str(a) for a in args]
    command = args[0] if args and not args[0].startswith("-") else "ui"
    if command in FAST_COMMANDS and "--eager" not in args:
        return [*args, "--eager"]
    return args


@contextlib.contextmanager
def running_server(args: list[str], ready_path: str, port: int, log: Path, env: dict | None = None, timeout: float = 240):
    """`python -m app ARGS` as a real server on 127.0.0.1:port; yields its URL once `ready_path` answers
    (servers print their URL before they answer), and stops it afterwards."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(app_command(*eager(args)), cwd=ROOT, env={**os.environ, **(env or {})},
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(url + ready_path, timeout=2).read()
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def serve_engines(tmp: Path) -> Path:
    """An engines store for a `serve` under test: its own builds, the shared dequantized models."""
    from app import models

    engines = tmp / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    models.locate(models.BUNDLED)
    return engines


def soak(attack, other, sample, calls: int = 200, at_once: int = 4):
    """`attack(i)` for each i < `calls`, `at_once` at a time, while `other()` (another visitor's request, timed by the
    caller) runs again and again in a thread of its own; `sample()` (the server's memory) every 20 calls and at the
    end. Returns (the attacks' answers, the samples)."""
    import concurrent.futures
    import threading

    done, samples = threading.Event(), []

    def again():
        while not done.is_set():
            other()
            done.wait(0.2)

    def one(i):
        if i % 20 == 0:
            samples.append(sample())
        return attack(i)

    watcher = threading.Thread(target=again)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
            answers = list(pool.map(one, range(calls)))
    finally:
        done.set()
        watcher.join(60)
    samples.append(sample())
    return answers, samples


def tiny_tokenizer(vocab: int = 96):
    """A word-level fast tokenizer of `vocab` single-character tokens ("t0".. as text), savable with
    save_pretrained, so tiny models can be written as complete model directories."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0")


STAND_INS = Path(__file__).resolve().parent / "stand_ins"


@contextlib.contextmanager
def trtllm_stand_in(pins: bool = False):
    """tests/stand_ins/tensorrt_llm (TensorRT-LLM 1.2's rules, no GPU) importable as `tensorrt_llm`; removed after.
    Upstream pins numpy<2 and the stand-in refuses to import beside numpy 2 as upstream would not run there; tests of
    the glue code opt out of that one check knowingly (pins=False), a test of the check itself keeps it (pins=True)."""
    previous = os.environ.get("TRTLLM_STAND_IN_IGNORE_PINS")
    if pins:
        os.environ.pop("TRTLLM_STAND_IN_IGNORE_PINS", None)
    else:
        os.environ["TRTLLM_STAND_IN_IGNORE_PINS"] = "1"
    sys.path.insert(0, str(STAND_INS))
    try:
        yield
    finally:
        sys.path.remove(str(STAND_INS))
        if previous is None:
            os.environ.pop("TRTLLM_STAND_IN_IGNORE_PINS", None)
        else:
            os.environ["TRTLLM_STAND_IN_IGNORE_PINS"] = previous
        for module in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[module]


def checked(data, modes=None):
    """A request checked as Service.request checks it: its mode's rules (configs.parse), then its backend's own."""
    from app.modes import MODES
    from app.backends.tensorrt_llm import backend as tensorrt_llm
    from app.backends.transformers import backend as transformers
    from app.backends.vllm import backend as vllm

    request = (modes or MODES).parse(data)
    own = {"transformers": transformers.check, "tensorrt_llm": tensorrt_llm.check, "vllm": vllm.check}
    own.get(request.backend, lambda r: None)(request)  # remote: the server it talks to checks
    return request


def earlier_design(directory: Path) -> Path:
    """An EAGLE module of the project's earlier design (fc over the embedding and the final hidden state plus the
    fused layers) with the bundled model's sizes and random weights: no engine loads that design."""
    from app import models
    from app.heads import eagle

    config = dataclasses.replace(eagle.read_config(models.default_artifact(models.BUNDLED, "eagle")), eagle3=False)
    eagle.save(eagle.EagleModule(config), directory, base_model=models.BUNDLED)
    return directory


def _busy(stop) -> None:
    while not stop.is_set():
        pass


@contextlib.contextmanager
def busy_cores(n: int = 2):
    """`n` cores taken by other processes while inside: the injected busy loop of a machine shared with other work."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_busy, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def _busy_when(go, stop) -> None:
    while not stop.is_set():
        if go.wait(0.05):
            while go.is_set():  # takes the event's lock: checked every ~0.1 ms, not in a tight loop that would contend
                for _ in range(2000):  # with the measured side's set and clear
                    pass


@contextlib.contextmanager
def busy_cores_when(n: int = 2):
    """`n` processes that keep `n` cores busy while the event it yields is set (and wait while it is not): load on one
    side of a measurement only, switched on and off around that side's steps (`loaded`)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_busy_when, args=(go, stop), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield go
    finally:
        go.clear()
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def loaded(work, go=None, seen: list | None = None):
    """A job's work (jobs.Work) whose every step runs with `go` set (busy_cores_when; None: as it is) and whose messages
    are also kept in `seen`. `go` is set just before the generator resumes and cleared when it yields: the loop's clock
    leaves out the time a generation waits at its yield, so the step is timed under the load and the switching is not."""
    def work_loaded(cancel):
        messages = work(cancel)
        try:
            while True:
                if go is not None:
                    go.set()
                try:
                    message = next(messages)
                except StopIteration:
                    return
                finally:
                    if go is not None:
                        go.clear()
                if seen is not None:
                    seen.append(message)
                yield message
        finally:
            messages.close()

    return work_loaded


def command_line(process) -> str:
    """A psutil process's command line, or "" for one that has ended (an earlier test's child can linger as a
    zombie among the worker's children, whose command line psutil refuses to read)."""
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""
