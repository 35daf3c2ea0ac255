"""The web app (Gradio 6): Run, Compare, Train, Learn and Engines tabs, all through the service.

Nothing here touches tensors or tokenizers: the service streams JSON-like messages with token
texts, `render` turns them into escaped HTML and `charts` into Plotly figures. Drawing happens
once per batch of messages (Job.batches), so a fast generation is never slowed by its own display.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app.config import CHOICES_DIR, ConfigError
from app.modes import MERGED_SUFFIX, MODES, Modes
from app.service import configs, traces
from app.service.api import DTYPES, ModelError, Service
from app.service.configs import (MIN_PATH_PROB, DraftTargetDecodingConfig, EagleDecodingConfig,
                                 LookaheadDecodingConfig, MedusaDecodingConfig, NGramDecodingConfig,
                                 SuffixDecodingConfig)
from app.service.jobs import QueueFull
from app.service.traces import Recording, TraceError
from app.service.training import PREFIX
from app.ui import charts, learn, links, presenter, render
from app.ui.controls import Number, Slider, finite
from app.ui.sessions import Sessions
from app.ui.train import SHIPPED, TrainTab, visitor_of, artifact_choices

REDRAW_S = 0.75
REPLAY_MAX_S = 120  # a replay at the recorded pace lasts at most this long
RECORDINGS_DIR = Path(__file__).resolve().parents[2] / "assets" / "traces"
RECORDINGS = tuple(sorted(p.stem for p in RECORDINGS_DIR.glob("*.json")))
TREES = tuple(sorted((p.stem for p in CHOICES_DIR.glob("*.json")), key=lambda name: (name != "default", name)))
DYNAMIC = "dynamic (EAGLE-2)"
PRUNE_LABEL = "min path probability (prune unlikely nodes; 0 = off)"
DEFAULT_MODE = "prompt_lookup"  # the Run tab's mode on a fresh page
OUTPUTS = 13  # what a run or a replay updates (Studio._run_outputs)
# A fresh page's prompt: its answer copies the prompt, so the first Run shows prompt lookup earning (measured on a
# 2-core CPU, float32, five fresh pages: τ 3.50 tokens/pass, 2.2-3.0× the autoregressive run's tokens/s). The counter-example
# is Spec-Bench's writing prompt: a new text, nothing to copy, nothing gained.
FIRST_PROMPT = ("Correct the spelling mistakes in this paragraph and return the whole corrected paragraph: The quick "
                "brown fox jumpd over the lazy dog. The dog was not amused, and it barkd loudly at the fox, who ran "
                "away into the forrest. Later that day the fox came back and apologised to the dog.")
COUNTER_EXAMPLE = 81  # Spec-Bench question id: a travel blog post
WHY_FIRST = ("<small><b>Why this prompt:</b> the answer copies the paragraph it was given, so prompt lookup finds the "
             "text that comes next in the prompt and the target accepts several tokens per pass. The counter-example "
             "asks for new text: nothing to copy, so prompt lookup drafts little, the target rejects most of it, and "
             "the run goes no faster than plain decoding.</small>")
# Copy link: the server gives the query string; the browser adds its own address (a proxy's or a Space's, which
# the server cannot know) and copies it where the page may use the clipboard.
COPY_LINK_JS = """(q) => {
  const url = location.origin + location.pathname + (q ? '?' + q : '');
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""
# ... and, where vLLM is installed, the same jobs on its engines (their speedup is over our autoregressive run)
VLLM_COMPARED = tuple(learn.ENGINE_PREFIX + m.name for m in MODES if m.vllm_compare)
MERGE_BOX = {"medusa": "md_pl", "eagle": "eg_pl"}  # the control that merges prompt lookup into that mode's tree
MERGE_LABEL = "merge prompt lookup's candidates into the tree (its settings: the Prompt lookup group)"

# Every control of the Run tab, by name; handlers receive their values in this order.
CONTROLS = (
    "max_new_tokens", "temperature", "top_p", "top_k", "seed",
    "pl_num_tokens", "pl_ngram", "pl_draft_lens", "pl_candidates", "pl_oldest",
    "la_W", "la_N", "la_G", "la_w", "la_n", "la_g",
    "dt_model", "dt_len",
    "md_tree", "md_typical", "md_threshold", "md_alpha", "md_prune", "md_pl", "md_model",
    "eg_total", "eg_depth", "eg_topk", "eg_tree", "eg_prune", "eg_pl", "eg_model",
    "sx_len", "sx_depth", "sx_factor", "sx_min_prob", "sx_tree",
    "backend", "dtype",
)


# Settings presets: every control a preset sets (the sampling, the length, the draft model and the backend stay
# the user's), and what the README's bench ran (the fastest settings its sweeps found on a 2-core CPU).
PRESET_KEYS = tuple(k for k in CONTROLS if k not in ("max_new_tokens", "temperature", "top_p", "top_k", "seed",
                                                      "dt_model", "md_model", "eg_model", "backend"))
FASTEST = {"pl_ngram": 3, "pl_oldest": False, "pl_candidates": 2, "dt_len": 2, "eg_total": 24, "eg_depth": 5, "eg_topk": 4}
# (EAGLE's are its config's defaults: the Run tab starts smaller, RUN_TAB_CHOICES)
PRESETS = ("defaults", "fastest here")


def preset(name: str, fast_dtype: str) -> dict[str, Any]:
    """The values of PRESET_KEYS under a preset: the app's defaults (small trees, the server's dtype) or
    the bench's fastest settings in `fast_dtype` (Service.fast_dtype: bfloat16 where the CPU has it natively)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown settings preset '{name}' (choose from {', '.join(PRESETS)})")
    values = dict(DEFAULTS)
    if name == "fastest here":
        values.update(FASTEST, dtype=fast_dtype)
    return {k: values[k] for k in PRESET_KEYS}


def request_from(mode: str, v: dict[str, Any], modes: Modes = MODES) -> dict[str, Any]:
    """The service's DecodeRequest data for the Run tab's control values (TensorRT-LLM names); a mode without
    controls here runs with its config's defaults."""
    if mode not in modes:
        raise ConfigError(f"unknown mode '{mode}'")
    spec: dict[str, Any] = {"decoding_type": modes[mode].decoding_type}
    if mode == "prompt_lookup":
        spec.update(_ngram(v))
    elif mode == "lookahead":
        spec.update(max_window_size=_int(v, "la_W"), max_ngram_size=_int(v, "la_N"), max_verification_set_size=_int(v, "la_G"),
                    request=[_int(v, "la_w"), _int(v, "la_n"), _int(v, "la_g")])
    elif mode == "draft_target":
        spec.update(max_draft_len=_int(v, "dt_len"), speculative_model=v["dt_model"] or None)
    elif mode == "medusa":
        spec.update(medusa_choices=v["md_tree"], typical_acceptance=bool(v["md_typical"]),
                    posterior_threshold=_float(v, "md_threshold"), posterior_alpha=_float(v, "md_alpha"),
                    min_path_prob=_float(v, "md_prune"), speculative_model=_heads(v.get("md_model")))
    elif mode == "eagle":
        static = v["eg_tree"] not in (None, "", DYNAMIC)
        spec.update(max_draft_len=_int(v, "eg_total") - 1, num_eagle_layers=_int(v, "eg_depth"),
                    dynamic_tree_max_topK=_int(v, "eg_topk"), use_dynamic_tree=not static,
                    eagle_choices=v["eg_tree"] if static else None, min_path_prob=0.0 if static else _float(v, "eg_prune"),
                    speculative_model=_heads(v.get("eg_model")))
    elif mode == "suffix":
        spec.update(max_draft_len=_int(v, "sx_len"), suffix_decoding_max_tree_depth=_int(v, "sx_depth"),
                    suffix_decoding_max_spec_factor=_float(v, "sx_factor"),
                    suffix_decoding_min_token_prob=_float(v, "sx_min_prob"), use_tree_spec=bool(v["sx_tree"]))
    if run_name(mode, v) != mode:
        spec["prompt_lookup"] = _ngram(v)
    seed = v["seed"]
    return {
        "speculative_config": spec,
        "sampling": {"temperature": _float(v, "temperature"), "top_p": _float(v, "top_p"), "top_k": _int(v, "top_k"),
                     "seed": None if seed in (None, "") or _float(v, "seed") < 0 else _int(v, "seed")},
        "max_new_tokens": _int(v, "max_new_tokens"),
        "backend": v["backend"],
        "dtype": v.get("dtype") or "auto",
    }


# What a control is called in a refusal (the label's name for it).
NAMES = {"la_W": "max_window_size W", "la_N": "max_ngram_size N", "la_G": "max_verification_set_size G", "la_w": "w",
         "la_n": "n", "la_g": "g", "dt_len": "max_draft_len", "md_threshold": "posterior_threshold",
         "md_alpha": "posterior_alpha", "md_prune": "min path probability", "eg_total": "total tokens",
         "eg_depth": "depth", "eg_topk": "top-k", "eg_prune": "min path probability",
         "pl_num_tokens": "max_draft_len (prompt_lookup_num_tokens)", "pl_ngram": "max_matching_ngram_size",
         "pl_candidates": "matches verified together", "sx_len": "max_draft_len (num_speculative_tokens)",
         "sx_depth": "suffix_decoding_max_tree_depth", "sx_factor": "suffix_decoding_max_spec_factor",
         "sx_min_prob": "suffix_decoding_min_token_prob"}


def _float(v: dict[str, Any], key: str) -> float:
    return finite(v.get(key), NAMES.get(key, key))


def _int(v: dict[str, Any], key: str) -> int:
    return int(_float(v, key))


def values_from(data: Any) -> tuple[str, dict[str, Any]] | None:
    """request_from's inverse: the Run tab's mode and the control values that make this request (the
    ones it sets; sampling, length, backend and dtype always), or None when the Run tab cannot express it
    (an invalid request, a custom tree, a heads or module directory of its own)."""
    try:
        r = configs.parse(data)
    except (ConfigError, ValueError, TypeError):
        return None
    c, s = r.speculative_config, r.sampling
    v: dict[str, Any] = {"max_new_tokens": r.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                         "top_k": s.top_k, "seed": -1 if s.seed is None else s.seed, "backend": r.backend, "dtype": r.dtype}
    pl = c if isinstance(c, NGramDecodingConfig) else getattr(c, "prompt_lookup", None)
    if pl is not None:
        v.update(pl_num_tokens=pl.max_draft_len, pl_ngram=pl.max_matching_ngram_size, pl_candidates=pl.max_candidates,
                 pl_draft_lens=",".join(map(str, pl.ngram_draft_lens)), pl_oldest=pl.is_use_oldest)
    prune = MIN_PATH_PROB if getattr(c, "min_path_prob", None) is None else c.min_path_prob
    if isinstance(c, LookaheadDecodingConfig):
        W, N, G = c.max_window_size, c.max_ngram_size, c.max_verification_set_size
        w, n, g = c.request or (W, N, G)
        v.update(la_W=W, la_N=N, la_G=G, la_w=w, la_n=n, la_g=g)
    elif isinstance(c, DraftTargetDecodingConfig):
        v.update(dt_len=c.max_draft_len, **({"dt_model": c.speculative_model} if c.speculative_model else {}))
    elif isinstance(c, MedusaDecodingConfig):
        if c.medusa_choices not in TREES or not _nameable(c.speculative_model):
            return None
        v.update(md_tree=c.medusa_choices, md_typical=c.typical_acceptance, md_threshold=c.posterior_threshold,
                 md_alpha=c.posterior_alpha, md_prune=prune, md_pl=pl is not None, md_model=c.speculative_model or SHIPPED)
    elif isinstance(c, EagleDecodingConfig):
        static = not c.use_dynamic_tree
        if (static and c.eagle_choices not in TREES) or not _nameable(c.speculative_model):
            return None
        v.update(eg_total=c.max_draft_len + 1, eg_depth=c.num_eagle_layers, eg_topk=c.dynamic_tree_max_topK,
                 eg_tree=c.eagle_choices if static else DYNAMIC, eg_pl=pl is not None, eg_model=c.speculative_model or SHIPPED,
                 **({} if static else {"eg_prune": prune}))  # a static tree is never pruned
    elif isinstance(c, SuffixDecodingConfig):
        if c.suffix_decoding_max_cached_requests:
            return None  # the vLLM engine's cache across requests: no control for it
        v.update(sx_len=c.max_draft_len, sx_depth=c.suffix_decoding_max_tree_depth, sx_factor=c.suffix_decoding_max_spec_factor,
                 sx_min_prob=c.suffix_decoding_min_token_prob, sx_tree=c.use_tree_spec)
    return c.mode, v


def _heads(choice: str | None) -> str | None:
    """The speculative_model of a heads picker's choice: None for the shipped heads, else a run's trained:<id>."""
    return None if choice in (None, "", SHIPPED) else choice


def _nameable(speculative_model: str | None) -> bool:
    """Whether the Run tab can pick these heads: the shipped ones or a training run by name (never a path)."""
    return speculative_model is None or speculative_model.startswith(PREFIX)


def mode_values(name: str, **overrides) -> tuple[str, dict[str, Any]]:
    """(mode, control values) for a mode name of the command line, where `eagle+prompt_lookup` is EAGLE
    with the merge box ticked; the other controls at their defaults."""
    mode, merged = MODES.split(name)
    values = dict(DEFAULTS, **overrides)
    if merged:
        values[MERGE_BOX[mode]] = True
    return mode, values


def run_name(mode: str, v: dict[str, Any]) -> str:
    """What a run is called: its mode, or its merged tree's name when the mode's merge box is ticked."""
    return mode + MERGED_SUFFIX if mode in MERGE_BOX and v.get(MERGE_BOX[mode]) else mode


def _ngram(v: dict[str, Any]) -> dict[str, Any]:
    """NGramDecodingConfig data from the prompt lookup group (its own mode, or the branch merged into a tree)."""
    lens = str(v["pl_draft_lens"] or "").replace(" ", "")
    try:
        draft_lens = [int(x) for x in lens.split(",") if x]
    except ValueError:
        raise ConfigError(f"draft caps must be comma-separated integers such as 2,5; got '{v['pl_draft_lens']}'") from None
    return dict(max_draft_len=_int(v, "pl_num_tokens"), max_matching_ngram_size=_int(v, "pl_ngram"),
                ngram_draft_lens=draft_lens, max_candidates=_int(v, "pl_candidates"), is_use_oldest=bool(v["pl_oldest"]))


def check_message(service: Service, mode: str, v: dict[str, Any]) -> str:
    """The line shown under the controls: the service's verdict on these settings, before anything runs.
    Its marks (✓ ⚠ ✗) are text symbols, not emoji: a lecture-room Linux machine often has no emoji font."""
    info = {m["mode"]: m for m in service.modes(backend=v["backend"])}[mode]
    if not info["available"]:
        return f"✗ **{service.registry.label(mode)} is unavailable on {v['backend']}:** {info['reason']}"
    try:
        request = service.request(request_from(mode, v, service.registry))
        engine = service.vllm_note(request) if request.backend == "vllm" else None
    except ConfigError as err:
        return f"⚠ **Invalid:** {err}"
    if engine is not None:
        return f"✓ Valid · {info['lossless']} · {engine}"
    c = request.speculative_config
    extra = ""
    if isinstance(c, LookaheadDecodingConfig):
        extra = f" · engine max_draft_len = (N−2) + (W−1+G)(N−1) = **{c.max_draft_len}**"
    elif mode != "autoregressive":
        extra = f" · verifies up to **{c.max_draft_len}** draft tokens per step"
        if getattr(c, "prompt_lookup", None) is not None:
            pl = c.prompt_lookup
            extra += f" and up to **{pl.max_draft_len * pl.max_candidates}** more from prompt lookup"
    if note := service.dtype_note(request.dtype):
        extra += f" · {note}"
    if request.backend == "tensorrt_llm":  # said, not dropped silently: settings TensorRT-LLM has no field for
        extra += "".join(f" · ⚠ {n}" for n in configs.trtllm_notes(request))
    return f"✓ Valid · {info['lossless']}{extra}"


def summary_row(mode: str, run: Recording, baseline: Recording | None, modes: Modes = MODES) -> dict[str, Any]:
    t = run.events[-1]["totals"] if run.events else {}
    tps = t.get("new_tokens", 0) / t["elapsed_s"] if t.get("elapsed_s") else 0.0
    base = baseline.events[-1]["totals"] if baseline is not None and baseline.events else None
    base_tps = base["new_tokens"] / base["elapsed_s"] if base and base.get("elapsed_s") else None
    parts = traces.speedup_parts(run.events, baseline.events) if baseline is not None else None
    return {"mode": learn.label(mode, modes), "tokens_per_s": tps, "speedup": tps / base_tps if base_tps else None,
            "step_cost": parts["step_cost"] if parts else None, "decoding_tau": parts["tau"] if parts else None,
            "tau": t.get("tokens_per_step"), "acceptance_rate": (t["accepted"] / t["drafted"]) if t.get("drafted") else None,
            "identical": None if baseline is None else run.token_ids == baseline.token_ids,
            "new_tokens": t.get("new_tokens", 0), "elapsed_s": t.get("elapsed_s")}


class Pace:
    """Redraw only when due: at most every REDRAW_S, and rarely enough that drawing takes at most
    about 5% of the wall time (the generation thread shares the interpreter and the cores with it)."""

    def __init__(self) -> None:
        self.last_at = -1e9
        self.cost = 0.0

    def due(self) -> bool:
        return time.perf_counter() - self.last_at >= max(REDRAW_S, 19 * self.cost)

    def __enter__(self) -> None:
        self.last_at = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.cost = time.perf_counter() - self.last_at


def _paced(parts, draw):
    """draw(part) for the parts that come when a redraw is due (see Pace)."""
    pace = Pace()
    for part in parts:
        if pace.due():
            with pace:
                outputs = draw(part)
            yield outputs


class Studio:
    """The app around one Service: per-session running jobs (for Stop), and the Blocks."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.modes = service.registry  # the modes it offers (app/modes.py)
        self.sessions = Sessions()  # what each page runs, for its Stop
        self.trainer = TrainTab(service)
        self.example_ids = _example_ids(service)  # read once: links and the counter-example look prompts up by id
        # The Run tab's downloads: a folder per session, a file per mode, rewritten by the next run (Gradio serves a copy).
        self._traces = Path(tempfile.mkdtemp(prefix="specdec-traces-"))
        weakref.finalize(self, shutil.rmtree, self._traces, ignore_errors=True)

    # ------------------------------------------------------------------ jobs
    @contextlib.contextmanager
    def _skippable(self, request: gr.Request | None):
        """A replay's skip flag, registered as the session's running job so Stop sets it."""
        skip = threading.Event()
        with self.sessions.running(request.session_hash if request is not None else "local",
                                   SimpleNamespace(cancel=skip.set, replay=True)):
            yield skip

    def visitor_left(self, request: gr.Request) -> None:
        """The page closed (Gradio's unload): what it runs stops, so nobody's work outlives their visit."""
        self.sessions.cancel(request.session_hash)
        self.trainer.visitor_left(request)

    def stop(self, request: gr.Request) -> str:
        job = self.sessions.cancel(request.session_hash)
        if job is None:
            return "Nothing is running."
        # A replay skips to its end at once and says so itself: this answer could land after that line.
        return gr.skip() if getattr(job, "replay", False) else "⏹ Stopping after the current step…"

    def _stream(self, session: str, data: dict[str, Any], prompt: str, run: Recording):
        """DecodeRequest `data` run as the session's job (Stop cancels it); each batch of messages added to `run`."""
        try:
            job = self.service.submit(data, prompt if isinstance(prompt, str) else "", visitor=session)
        except (ConfigError, ModelError, QueueFull) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        with self.sessions.running(session, job):
            try:
                for batch in job.batches(REDRAW_S):
                    for message in batch:
                        run.add(message)
                    yield run
            finally:
                job.cancel()
        if run.end and run.end.get("error"):
            raise gr.Error(f"generation failed: {run.end['error']}")

    # ------------------------------------------------------------------ Run tab
    def run(self, request: gr.Request, prompt: str, mode: str, race: bool, baselines: dict, *values):
        v = dict(zip(CONTROLS, values))
        session = request.session_hash if request is not None else "local"
        baseline: Recording | None = None
        try:  # every setting checked before anything runs: a bad one is one sentence, not a bare "Error"
            base_request = request_from("autoregressive", v)
            self.service.request(request_from(mode, v, self.modes), session)
        except ConfigError as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        baselines = baselines if isinstance(baselines, dict) else {}
        key = json.dumps([prompt, base_request], sort_keys=True)
        if race and mode != "autoregressive":
            if key in baselines:
                baseline = Recording.from_record(baselines[key])
            else:
                baseline = Recording("autoregressive", base_request, prompt)
                yield from _paced(self._stream(session, base_request, prompt, baseline), lambda part: self._run_outputs(
                    Recording(run_name(mode, v)), part, "Racing… first the autoregressive baseline", baselines, final=False))
                if baseline.end and baseline.end.get("finish_reason") == "cancelled":
                    yield self._run_outputs(Recording(run_name(mode, v)), baseline, "⏹ Stopped during the baseline.", baselines, final=True)
                    return
                baselines = {**baselines, key: baseline.record()}
        run = Recording(run_name(mode, v), request_from(mode, v, self.modes), prompt)
        yield from _paced(self._stream(session, run.request, prompt, run),
                          lambda part: self._run_outputs(part, baseline, _status(part, self.modes), baselines, final=False))
        if mode == "autoregressive" and run.end and run.end.get("finish_reason") != "cancelled":
            baselines = {**baselines, key: run.record()}
        folder = self._traces / (re.sub(r"[^A-Za-z0-9_-]", "", session)[:40] or "local")
        folder.mkdir(exist_ok=True)
        trace = folder / f"specdec-{run.mode}-trace.json"
        trace.write_text(json.dumps(run.trace(baseline)))
        yield self._run_outputs(run, baseline, _status(run, self.modes), baselines, final=True, trace=str(trace))

    def run_request(self, request: dict[str, Any], session: gr.Request) -> Iterator[dict[str, Any]]:
        """Run one request object: the DecodeRequest JSON (as `generate --json` records it and `serve` takes in
        `specdec`: speculative_config, sampling, max_new_tokens, backend, dtype, trtllm_backend) plus `prompt`.
        Yields the trace as it grows; the last value is the whole trace, as `generate --json` prints it."""
        if not isinstance(request, dict):
            raise gr.Error("request must be an object: prompt plus the DecodeRequest fields (speculative_config, "
                           "sampling, max_new_tokens, backend, dtype)", duration=None)
        data = dict(request)
        prompt = data.pop("prompt", None)
        if not isinstance(prompt, str):
            raise gr.Error("request.prompt must be text: the user turn (the chat template is applied)", duration=None)
        if "mode" in data:  # the name the Run tab and the command line use; a request says it as a config's type
            raise gr.Error("a request names its mode in speculative_config.decoding_type (" + ", ".join(
                f"{m.decoding_type} = {m.name}" for m in self.modes) + "), not in 'mode'", duration=None)
        session_hash = session.session_hash if session is not None else "local"
        try:
            config = self.service.request(data, session_hash).speculative_config
        except (ConfigError, ModelError) as err:
            raise gr.Error(self.service.relative(str(err)), duration=None) from None
        name = config.mode + MERGED_SUFFIX if getattr(config, "prompt_lookup", None) is not None else config.mode
        run = Recording(name, data, prompt)
        for part in self._stream(session_hash, data, prompt, run):
            # Through JSON, as `generate --json` prints it: Gradio sends a gr.api value as it is, and refuses the
            # token texts' int keys.
            yield json.loads(json.dumps(part.trace()))

    def _run_outputs(self, run: Recording, baseline: Recording | None, status: str, baselines: dict, final: bool,
                     trace: str | None = None):
        events = run.events
        last = len(events) - 1
        history = [t for e in events[:-1] for t in e["tokens"]]
        if final and baseline is not None and run.mode != "autoregressive":
            versus = render.speedup_line(events, baseline.events)
            status = f"{status}\n\n{versus}" if versus else status
        detail = render.step_detail(events[-1], run.texts, run.prompt_ids, history, run.mode) if events else ""
        return (
            render.step_view(events, run.texts),
            status,
            gr.update(maximum=max(last, 1), value=max(last, 0), interactive=final and last > 0),
            detail,
            charts.race(events, baseline.events if baseline else None, label=learn.label(run.mode, self.modes)),
            charts.tokens_per_step(events),
            # The browser redraws every chart it is sent, on the cores the model runs on: while generating,
            # only the race and the per-step bars are live; the rest are drawn once at the end.
            charts.acceptance_by_depth(events, run.spec_decode) if final else gr.skip(),
            charts.tokens_per_step_hist(events) if final else gr.skip(),
            charts.throughput(events) if final else gr.skip(),
            charts.timing(events) if final else gr.skip(),
            dict(run.record(), baseline=baseline.events if baseline else None) if final else gr.skip(),
            baselines,
            gr.update(value=trace, interactive=trace is not None),
        )

    def inspect(self, step: float, record: dict) -> tuple:
        """One step's detail, and the race and per-step charts with a cursor on it (they follow the step)."""
        if not record or not record.get("events"):
            return "", gr.skip(), gr.skip()
        events = record["events"]
        i = min(max(int(step), 0), len(events) - 1) if isinstance(step, (int, float)) and math.isfinite(step) else 0
        history = [t for e in events[:i] for t in e["tokens"]]
        try:  # a record is this session's own run or a checked trace; a shape that still slipped through gets words
            detail = render.step_detail(events[i], record["texts"], record["prompt_ids"], history, record.get("mode"))
        except Exception as err:
            raise gr.Error(f"step {i} cannot be drawn ({type(err).__name__})") from None
        number = events[i].get("step", i)
        return (detail, charts.race(events, record.get("baseline"), label=learn.label(record["mode"], self.modes) if record.get("mode") else None,
                                    cursor=number),
                charts.tokens_per_step(events, cursor=number))

    # ------------------------------------------------------------------ replay
    def replay(self, request: gr.Request, path: str | None, paced: bool, baselines: dict):
        """Draw a recorded trace as if it ran now: at its recorded pace, the run and the baseline it raced
        side by side from one start (Stop skips to the end), or all at once."""
        if not path:
            return
        try:
            run, baseline = traces.read(path)
        except (TraceError, OSError) as err:
            raise gr.Error(f"cannot replay this file: {self.service.relative(str(err))}", duration=None) from None
        run.mode = run.mode or render.infer_mode(run.events)
        if run.mode is None:
            raise gr.Error("cannot replay this file: it does not say which mode made it", duration=None)
        try:  # parse checked every field the display reads; should a shape still slip through, say so in words
            for r in (run, baseline or run):
                render.step_view(r.events, r.texts)
                render.step_detail(r.events[-1], r.texts, r.prompt_ids, r.token_ids[: -len(r.events[-1]["tokens"]) or None], r.mode)
        except Exception as err:
            raise gr.Error(f"cannot replay this file: it could not be drawn ({type(err).__name__})", duration=None) from None
        with self._skippable(request) as skip:
            if paced:
                runs = [run] if baseline is None else [run, baseline]
                for parts in _replayed(runs, skip):
                    yield self._run_outputs(parts[0], parts[1] if baseline else None, "▶ Replaying a recording · " + _status(parts[0], self.modes),
                                            baselines, final=False)
        where = "⏭ Skipped to the end of the recording" if skip.is_set() else "Replayed a recording"
        yield self._run_outputs(run, baseline, f"{where} · {_status(run, self.modes)}", baselines, final=True)

    def replay_settings(self, path: str | None) -> list:
        """The prompt, mode and controls a trace ran with, so Run runs it again here; each left as it is
        where the trace does not say or the Run tab cannot express it (its replay says what is wrong)."""
        keep = [gr.skip()] * (2 + len(CONTROLS))
        try:
            run, _ = traces.read(path) if path else (None, None)
        except (TraceError, OSError):
            return keep
        settings = values_from(run.request) if run and run.request else None
        if settings is None:
            return [run.prompt if run and run.prompt else gr.skip(), *keep[1:]]
        mode, v = settings
        if v.get("dt_model") not in (None, *self.service.drafts()):
            del v["dt_model"]
        for key, kind in (("md_model", "medusa"), ("eg_model", "eagle")):  # a run this server has not made
            if key in v and v[key] not in {value for _, value in artifact_choices(self.service, kind)}:
                del v[key]
        if v["backend"] not in self.service.availability():
            del v["backend"]
        return [run.prompt or gr.skip(), mode, *(v[k] if k in v else gr.skip() for k in CONTROLS)]

    def replay_recording(self, request: gr.Request, name: str | None, paced: bool, baselines: dict):
        """A recording shipped in assets/traces/, by its name in the menu."""
        yield from self.replay(request, _recording_path(name), paced, baselines)

    def replay_linked(self, request: gr.Request, name: str | None, paced: bool, baselines: dict):
        """The recording a link named, after the page loaded; without one, every output stays as it is (an event
        that yields nothing would blank them)."""
        if name is None:
            yield (gr.skip(),) * OUTPUTS
            return
        yield from self.replay_recording(request, name, paced, baselines)

    def tour(self, request: gr.Request, paced: bool, baselines: dict):
        """Every mode's recording in turn (TOUR): its settings in the controls, its Learn paragraph, its replay
        with the step narration; Stop skips the current one."""
        stops = tour_stops()
        for i, name in enumerate(stops, 1):
            mode = name.split("-")[0]
            line = (f"**Tour {i}/{len(stops)}: {learn.label(mode, self.modes)}** · {_recording_label(name).split(' · ', 1)[1]} · "
                    f"{RECORDING_WHY.get(mode, '')}")
            settings = self.replay_settings(_recording_path(name))
            fresh = True
            for out in self.replay(request, _recording_path(name), paced, baselines):
                extra = [*settings, learn.explain(MODES.split(mode)[0]), line] if fresh else [gr.skip()] * (len(settings) + 2)
                fresh = False
                yield (*out, *extra)

    # ------------------------------------------------------------------ links
    def open_link(self, request: gr.Request) -> list:
        """The page's setup from its URL's query string (links.parse); what the link gets wrong, in a note."""
        keep = [gr.skip()] * (4 + len(CONTROLS))
        query = dict(request.query_params) if request is not None else {}
        if not query:
            return [*keep, "", gr.skip(), None]
        link = links.parse(query, self.page_defaults(), self.modes.names, self.example_ids, RECORDINGS,
                           lambda m, v: _link_check(self.service, m, v))
        values = [link.values.get(k, gr.skip()) for k in CONTROLS]
        return [gr.update(selected=link.tab) if link.tab else gr.skip(), link.prompt or gr.skip(), link.mode or gr.skip(),
                *values, gr.skip() if link.present is None else link.present, link.note(), link.replay or gr.skip(), link.replay]

    def page_defaults(self) -> dict[str, Any]:
        """The controls' values on a fresh page (DEFAULTS, with the choices only the server knows)."""
        drafts = self.service.drafts()
        return dict(DEFAULTS, dt_model=drafts[0] if drafts else None, backend=self.service.default_backend("lookahead"))

    def link(self, mode: str, prompt: str, present: bool, *values) -> Any:
        """The query string of the Run tab's setup (the browser adds its own address and copies it)."""
        return gr.update(value=links.build("run", mode, dict(zip(CONTROLS, values)), prompt or "", self.page_defaults(), self.example_ids,
                                           DEFAULT_MODE, FIRST_PROMPT, present=bool(present)), visible=True)

    # ------------------------------------------------------------------ Compare tab
    def compare(self, prompt: str, modes: list[str], max_new_tokens: float, dtype: str, settings: str, request: gr.Request):
        session = request.session_hash if request is not None else "local"
        backend = self.service.default_backend("lookahead")
        # `settings` is one of the radio's choices (Gradio refuses others); the dtype radio has the last word.
        try:
            overrides = dict(preset(settings, self.service.fast_dtype()), max_new_tokens=max_new_tokens, backend=backend,
                             dtype=dtype or "auto")
            request_from("autoregressive", overrides | {k: DEFAULTS[k] for k in CONTROLS if k not in overrides})
        except ConfigError as err:
            raise gr.Error(str(err), duration=None) from None
        compared = self.modes.names + self.modes.merged + VLLM_COMPARED
        chosen = ["autoregressive"] + [m for m in compared if m in (modes or []) and m != "autoregressive"]
        available = {m["mode"]: m for m in self.service.modes(backend=backend)}
        engine = {m["mode"]: m for m in self.service.modes(backend="vllm")}
        runs: dict[str, Recording] = {}
        rows: list[dict[str, Any]] = []
        notes = []
        # One request holds the CPU for at most twice the time limit (as a raced run does): no new mode after one.
        deadline = time.monotonic() + self.service.limits.time_limit_s
        for name in chosen:
            if time.monotonic() > deadline:
                notes.append(f"⏱ {learn.label(name, self.modes)} and the rest were skipped: a comparison starts no new mode after "
                             f"the server's time limit ({self.service.limits.time_limit_s:g} s).")
                break
            on_vllm = name.startswith(learn.ENGINE_PREFIX)
            mode, values = mode_values(name.removeprefix(learn.ENGINE_PREFIX), **overrides)
            if on_vllm:
                values["backend"] = "vllm"
            state = (engine if on_vllm else available)[mode]
            if not state["available"]:
                notes.append(f"{learn.label(name, self.modes)} skipped: {state['reason']}")
                continue
            run = runs[name] = Recording(name)

            def draw(part: Recording, name=name) -> tuple:
                current = rows + [summary_row(name, part, runs.get("autoregressive") if name != "autoregressive" else None, self.modes)]
                return (render.summary_table(current), charts.race_runs(_curves(runs, self.modes)), charts.compare(current),
                        charts.tau_vs_cost(current), f"Running {learn.label(name, self.modes)}…", gr.skip())

            yield from _paced(self._stream(session, request_from(mode, values, self.modes), prompt, run), draw)
            if run.end and run.end.get("finish_reason") == "cancelled":
                notes.append("⏹ Stopped.")
                break
            rows.append(summary_row(name, run, runs.get("autoregressive") if name != "autoregressive" else None, self.modes))
        ran_in = next((f" in {r.dtype}" for r in runs.values() if r.dtype), "")
        done = ("Done. " + " ".join(notes) if notes
                else f"Done: every mode ran the same prompt with the same settings{ran_in}, one after another.")
        records = {name: run.record() for name, run in runs.items() if run.events}
        yield (render.summary_table(rows), charts.race_runs(_curves(runs, self.modes)), charts.compare(rows), charts.tau_vs_cost(rows),
               done, records)

    def replay_race(self, records: dict, request: gr.Request):
        """The last comparison's race again, every mode on one clock from one start, as if they had run side
        by side (they ran one after another); Stop skips to the end."""
        runs = {name: Recording.from_record(r) for name, r in (records or {}).items()}
        if not runs:
            raise gr.Error("Nothing to replay yet: compare first.")
        curves = _curves(runs, self.modes)
        total = max(_clock(r.events)[-1] for r in runs.values())
        with self._skippable(request) as skip:
            for now in _ticks(total, skip):
                yield charts.race_runs(curves, until=now), f"▶ Replaying the race side by side: {now:.1f} s of {total:.1f} s"
        yield charts.race_runs(curves, until=total), "Replayed the race: every mode on one clock, from one start."

    # ------------------------------------------------------------------ Learn tab
    def pass_cost(self, prompt: str):
        """The verify-cost curve of this machine in both dtypes, with the Run tab's prompt as the context."""
        try:
            costs = [self.service.pass_cost(prompt, dtype) for dtype in ("float32", "bfloat16")]
        except (ConfigError, ModelError, QueueFull) as err:
            raise gr.Error(str(err)) from None
        return charts.pass_cost(costs), learn.pass_cost_note(costs), costs

    def earnings(self, costs: list[dict], draft_cost: float):
        """What drafting can earn on the measured curve of the dtype that runs fastest here."""
        cost = next((c for c in costs or [] if c.get("dtype") == self.service.fast_dtype()), (costs or [None])[0])
        return charts.earnings(cost, draft_cost), learn.earnings_note(cost, draft_cost)

    # ------------------------------------------------------------------ Engines tab
    def engines_table(self, visitor: str | None = None) -> list[list[Any]]:
        rows = []
        for m in self.service.engine_list(visitor):
            spec = m["spec"]
            rows.append([m["id"], spec["model"], spec["mode"], spec["backend"], m["kind"], m["created"][:19],
                         round(m["duration_s"], 1), round(sum(m.get("files", {}).values()) / 2**20, 1)])
        return rows

    def engine_build(self, request: gr.Request, progress=gr.Progress(), mode: str = "autoregressive", *values):
        v, visitor = dict(zip(CONTROLS, values)), visitor_of(request)
        try:
            manifest = self.service.engine_build(request_from(mode, v, self.modes), progress=lambda f, msg: progress(f, desc=msg),
                                                 visitor=visitor)
        except (ConfigError, ModelError, ValueError) as err:
            return (f"⚠ {self.service.relative(str(err))}", gr.update(value=self.engines_table(visitor)),
                    gr.update(choices=self._ids(visitor)))
        return (f"✓ Build `{manifest['id']}` ready ({manifest['kind']}, {manifest['duration_s']:.1f} s).",
                gr.update(value=self.engines_table(visitor)), gr.update(choices=self._ids(visitor)))

    def engine_plan(self, request: gr.Request, mode: str, *values) -> str:
        v = dict(zip(CONTROLS, values))
        try:
            return json.dumps(self.service.engine_plan(request_from(mode, v, self.modes), visitor=visitor_of(request)), indent=1)
        except (ConfigError, ModelError, ValueError) as err:
            return f"# {self.service.relative(str(err))}"

    def engine_remove(self, request: gr.Request, build_id: str):
        visitor = visitor_of(request)
        try:
            self.service.engine_remove(build_id if isinstance(build_id, str) else "", visitor=visitor)
            message = f"Removed `{build_id}`."
        except ValueError as err:
            message = f"⚠ {self.service.relative(str(err))}"
        return message, gr.update(value=self.engines_table(visitor)), gr.update(choices=self._ids(visitor), value=None)

    def _ids(self, visitor: str | None = None) -> list[str]:
        """The Remove menu: the builds this visitor may remove (in public mode, only their own)."""
        return self.service.engine_removable(visitor)

    # ------------------------------------------------------------------ layout
    def blocks(self) -> gr.Blocks:
        service = self.service
        availability = service.availability()
        examples = _examples(service)
        # delete_cache: Gradio keeps a copy of every trace it served; an hour is enough to download one.
        with gr.Blocks(title="SpecDec Studio", delete_cache=(3600, 3600)) as demo:
            gr.Markdown(
                f"# SpecDec Studio\nWatch speculative decoding step by step on **{service.model}** ({service.dtype}) — "
                "what was drafted, what the target accepted, what it added, and whether it is faster than plain decoding."
            )
            link_note = gr.Markdown("", elem_id="link-note")
            baselines = gr.State({})
            compared = gr.State({})  # the last comparison's runs, for its race replay
            record = gr.State({})
            linked = gr.State(None)  # the recording a link asked to replay
            with gr.Tabs(selected="run") as tabs:
                with gr.Tab("Run", id="run"):
                    with gr.Row():
                        with gr.Column(scale=1, min_width=340):
                            prompt = gr.Textbox(label="Prompt", lines=5, value=FIRST_PROMPT, elem_id="prompt")
                            with gr.Row():
                                gr.Markdown(WHY_FIRST, elem_id="prompt-why")
                                counter_btn = gr.Button("Counter-example: nothing to copy", size="sm", elem_id="counter-example",
                                                        scale=0, min_width=200)
                            example = _examples_dropdown(examples, "examples")
                            mode = gr.Radio([(m.label, m.name) for m in self.modes], value=DEFAULT_MODE, label="Decoding mode",
                                            elem_id="mode")
                            modes_note = gr.Markdown(_modes_note(service, service.default_backend("lookahead")), elem_id="modes-note")
                            with gr.Row():
                                presets = {name: gr.Button(f"Settings: {name}", size="sm", elem_id=f"preset-{name.split()[0]}")
                                           for name in PRESETS}
                            gr.Markdown(f"<small>{_presets_note(service)}</small>", elem_id="presets-note")
                            c = self._controls(service, availability)
                            race = gr.Checkbox(value=True, label="Race against autoregressive (runs the baseline once per prompt)")
                            check = gr.Markdown(check_message(service, DEFAULT_MODE, dict(DEFAULTS, backend=service.default_backend("lookahead"))),
                                                elem_id="check")
                            with gr.Row():
                                run_btn = gr.Button("Run", variant="primary", elem_id="run")
                                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                                link_btn = gr.Button("Copy link", size="sm", elem_id="copy-link")
                            link_box = gr.Textbox(label="Link to this setup (copied)", visible=False, elem_id="link",
                                                  buttons=["copy"])
                            with gr.Accordion("Replay a recorded run", open=False, elem_id="replay"):
                                gr.Markdown("<small>A trace from <b>Download the trace</b> or <code>python -m app generate "
                                            "--json</code>, drawn step by step as it ran, with the baseline it raced. No model "
                                            "runs: it looks the same on any machine, busy or not.</small>")
                                recording = gr.Dropdown([(_recording_label(n), n) for n in RECORDINGS], value=None,
                                                        label="Recordings shipped with the app (2-core CPU)", elem_id="recordings",
                                                        visible=bool(RECORDINGS))
                                with gr.Row():
                                    recording_btn = gr.Button("Replay the recording", size="sm", elem_id="replay-recording",
                                                              visible=bool(RECORDINGS))
                                    upload = gr.UploadButton("Replay a trace file (JSON)…", file_types=[".json"], type="filepath",
                                                             size="sm", elem_id="replay-upload")
                                paced = gr.Checkbox(value=True, label="at the recorded pace (off: all at once)", elem_id="replay-paced")
                                tour_btn = gr.Button("Tour: every mode, recorded", size="sm", elem_id="tour",
                                                     visible=bool(tour_stops()))
                                tour_note = gr.Markdown("", elem_id="tour-note")
                            explain = gr.Markdown(learn.explain(DEFAULT_MODE, self.modes), elem_id="learn-mode")
                        with gr.Column(scale=2):
                            present = gr.Checkbox(False, label="Presenter mode (large type; → and ← step through the run, "
                                                  "space plays it)", elem_id="present")
                            with gr.Row(elem_id="presenter-row"):
                                back_btn = gr.Button("◀ step", size="sm", elem_id="step-back")
                                play_btn = gr.Button("play / pause", size="sm", elem_id="step-play")
                                next_btn = gr.Button("step ▶", size="sm", elem_id="step-next")
                                pace = Number(value=1.5, label="seconds per step", minimum=0.2, maximum=30, step=0.1, interactive=True,
                                              elem_id="pace")
                            status = gr.Markdown("Pick a mode and press **Run**.", elem_id="status")
                            view = gr.HTML(render.step_view([], {}), elem_id="step-view")
                            step = Slider(0, 1, value=0, step=1, label="Inspect step", interactive=False, elem_id="step")
                            detail = gr.HTML("", elem_id="step-detail")
                            download = gr.DownloadButton("Download the trace (JSON)", value=None, interactive=False, size="sm",
                                                         elem_id="download-trace")
                            # Rows: live while generating (race, tokens per pass); acceptance; speed. Empty charts at
                            # first, so the browser loads Plotly before the first run instead of during it (on a 2-core
                            # machine that load slowed the first run's own numbers about twofold).
                            with gr.Row():
                                race_plot = gr.Plot(charts.race([], None, label=""), label="Race: tokens vs time", elem_id="race")
                                tps_plot = gr.Plot(charts.tokens_per_step([]), label="Tokens per target step", elem_id="tokens-per-step")
                            with gr.Row():
                                hist_plot = gr.Plot(charts.tokens_per_step_hist([]), label="Tokens per step: histogram", elem_id="histogram")
                                depth_plot = gr.Plot(charts.acceptance_by_depth([]), label="Acceptance by draft depth", elem_id="acceptance-depth")
                            with gr.Row():
                                speed_plot = gr.Plot(charts.throughput([]), label="Tokens/s", elem_id="throughput")
                                time_plot = gr.Plot(charts.timing([]), label="Draft vs verify time", elem_id="timing")
                with gr.Tab("Compare", id="compare"):
                    gr.Markdown("One prompt through several modes, one after another, with the chosen settings of each mode "
                                "and greedy decoding: speed, tokens per target step, and whether the output is identical to "
                                "autoregressive decoding (always in float32; in bfloat16 outputs can part after a while).")
                    with gr.Row():
                        with gr.Column(scale=3):
                            cmp_prompt = gr.Textbox(label="Prompt", lines=3, value=examples[0][1], elem_id="cmp-prompt")
                            cmp_example = _examples_dropdown(examples, "cmp-examples")
                        with gr.Column(scale=2):
                            offered = [m for m in self.modes.names + self.modes.merged if m != "autoregressive"]
                            if service.backends["vllm"].availability().available:
                                offered += VLLM_COMPARED
                            cmp_modes = gr.CheckboxGroup([(learn.label(m, self.modes), m) for m in offered],
                                                         value=["prompt_lookup", "lookahead"], label="Modes (autoregressive always runs)",
                                                         elem_id="cmp-modes")
                            cmp_tokens = Slider(8, 256, value=64, step=8, label="max_new_tokens")
                            cmp_preset = gr.Radio(list(PRESETS), value=PRESETS[0], label="settings", elem_id="cmp-preset",
                                                  info=_presets_note(service))
                            cmp_dtype = _dtype_radio(service, "cmp-dtype")
                    with gr.Row():
                        cmp_btn = gr.Button("Compare", variant="primary", elem_id="compare-run")
                        cmp_stop = gr.Button("Stop", variant="stop", elem_id="compare-stop")
                        cmp_replay = gr.Button("Replay the race side by side", elem_id="compare-replay")
                    cmp_status = gr.Markdown("", elem_id="cmp-status")
                    cmp_table = gr.HTML(render.summary_table([]), elem_id="cmp-table")
                    with gr.Row():
                        cmp_race = gr.Plot(charts.race_runs({}), label="Race", elem_id="cmp-race")
                        cmp_bars = gr.Plot(charts.compare([]), label="Speedup", elem_id="cmp-speedup")
                        cmp_tau = gr.Plot(charts.tau_vs_cost([]), label="τ vs step time", elem_id="cmp-tau-cost")
                with gr.Tab("Train", id="train"):
                    self.trainer.layout({"medusa": c["md_model"], "eagle": c["eg_model"]})
                with gr.Tab("Learn", id="learn"):
                    gr.Markdown(learn.OVERVIEW)
                    gr.HTML(_example_tree(), elem_id="learn-tree")
                    gr.Markdown(learn.PASS_COST)
                    cost_btn = gr.Button("Measure (float32 and bfloat16)", elem_id="cost-run")
                    cost_note = gr.Markdown("", elem_id="cost-note")
                    cost_plot = gr.Plot(charts.pass_cost([]), label="Verify cost", elem_id="cost-plot")
                    costs = gr.State([])
                    gr.Markdown(learn.EARNINGS)
                    draft_cost = Slider(0, 0.5, value=0, step=0.01, label="draft cost per drafted token (× a one-token pass)",
                                           elem_id="draft-cost")
                    earn_note = gr.Markdown("", elem_id="earn-note")
                    earn_plot = gr.Plot(charts.earnings(None), label="Expected speedup", elem_id="earn-plot")
                    for m in self.modes:
                        with gr.Accordion(m.label, open=False):
                            gr.Markdown(learn.explain(m.name, self.modes))
                with gr.Tab("Engines", id="engines"):
                    gr.Markdown("Builds are content-addressed directories under `engines/builds/`: built once, reused, "
                                "built atomically. **Build** prepares what the Run tab's current mode and settings need on "
                                "the chosen backend; **Plan** shows what a TensorRT-LLM build would run."
                                + (" On this public server you see the operator's builds (read-only) and the ones you made "
                                   "in this page, and remove only yours." if service.policy.public else ""))
                    eng_status = gr.Markdown("", elem_id="eng-status")
                    # A callable: each page load lists what a new visitor sees (in public mode, the operator's builds).
                    eng_table = gr.Dataframe(self.engines_table, headers=["id", "model", "mode", "backend", "kind", "created",
                                                                            "build s", "MB"], interactive=False, elem_id="eng-table")
                    with gr.Row():
                        eng_build = gr.Button("Build for the Run tab's settings", variant="primary", elem_id="eng-build")
                        eng_plan_btn = gr.Button("Plan", elem_id="eng-plan")
                    with gr.Row():
                        eng_id = gr.Dropdown(self._ids(), label="Build", value=None, elem_id="eng-id")
                        eng_rm = gr.Button("Remove", variant="stop", elem_id="eng-rm")
                    eng_plan = gr.Code(language="json", label="Plan", elem_id="eng-plan-out")

            inputs = [c[name] for name in CONTROLS]
            # What the settings decide is shown: the service's verdict on them (before anything runs), which
            # groups of controls show, and the mode's explanation. A user's move (.input) redraws them; code that
            # sets many controls at once (a preset, a replay's settings) redraws them once after. Not on .change:
            # the browser then sends one request per changed control, some with the values half set, and
            # answered out of order those left a verdict on settings no longer shown.
            def verdict(m, *vals):
                return check_message(service, m, dict(zip(CONTROLS, vals)))

            shown = [(verdict, [mode, *inputs], check), (_visible, [mode, c["md_pl"], c["eg_pl"]], c["groups"]),
                     (lambda m: learn.explain(m, self.modes), [mode], explain)]
            quiet = dict(queue=False, show_progress="hidden", api_visibility="private")
            for fn, ins, outs in shown:
                gr.on([comp.input for comp in ins], fn, ins, outs, **quiet)

            def redraw(event):
                for fn, ins, outs in shown:
                    event.then(fn, ins, outs, **quiet)
                return event

            for name, button in presets.items():
                redraw(button.click(lambda name=name: list(preset(name, service.fast_dtype()).values()), None,
                                    [c[k] for k in PRESET_KEYS], **quiet))
            c["backend"].change(lambda b: _modes_note(service, b), c["backend"], modes_note, queue=False, show_progress="hidden",
                                api_visibility="private")
            for menu, box in ((example, prompt), (cmp_example, cmp_prompt)):
                menu.change(lambda t: t or gr.update(), menu, box, queue=False, show_progress="hidden", api_visibility="private")
            outputs = [view, status, step, detail, race_plot, tps_plot, depth_plot, hist_plot, speed_plot, time_plot, record,
                       baselines, download]
            assert len(outputs) == OUTPUTS
            run_evt = run_btn.click(self.run, [prompt, mode, race, baselines, *inputs], outputs, api_name="run_controls",
                                    show_progress="hidden", concurrency_id="generate")
            # gr.api, not an invisible event: an API-only endpoint typed by run_request's signature (one object),
            # with no hidden components in the page; it queues with the Run button (one concurrency group).
            gr.api(self.run_request, api_name="run", concurrency_id="generate")
            stop_btn.click(self.stop, None, status, queue=False, api_name="stop")
            # Replays use no model: their own queue, so one never waits behind a generation.
            # First the controls the trace ran with (so Run runs it again here), then the replay.
            settings = [prompt, mode, *inputs]
            redraw(upload.upload(self.replay_settings, upload, settings, **quiet)).then(
                self.replay, [upload, paced, baselines], outputs, api_name="replay", show_progress="hidden",
                concurrency_id="replay", concurrency_limit=4)
            redraw(recording_btn.click(lambda name: self.replay_settings(_recording_path(name)), recording, settings, **quiet)).then(
                self.replay_recording, [recording, paced, baselines], outputs, api_name="replay_recording",
                show_progress="hidden", concurrency_id="replay", concurrency_limit=4)
            # Only the user's moves: the run's own updates of the slider would each call inspect with the
            # record of the run before, and one answering late would blank the step the run just drew.
            step.input(self.inspect, [step, record], [detail, race_plot, tps_plot], queue=False, show_progress="hidden",
                       api_name="inspect")
            cmp_preset.change(lambda name: preset(name, service.fast_dtype())["dtype"], cmp_preset, cmp_dtype, queue=False,
                              show_progress="hidden", api_visibility="private")
            cmp_evt = cmp_btn.click(self.compare, [cmp_prompt, cmp_modes, cmp_tokens, cmp_dtype, cmp_preset],
                                    [cmp_table, cmp_race, cmp_bars, cmp_tau, cmp_status, compared], api_name="compare",
                                    show_progress="hidden", concurrency_id="generate")
            cmp_stop.click(self.stop, None, cmp_status, queue=False, api_name="compare_stop")
            cmp_replay.click(self.replay_race, compared, [cmp_race, cmp_status], api_name="compare_replay", show_progress="hidden",
                             concurrency_id="replay", concurrency_limit=4)
            cost_btn.click(self.pass_cost, prompt, [cost_plot, cost_note, costs], api_name="pass_cost",
                           concurrency_id="generate").then(
                self.earnings, [costs, draft_cost], [earn_plot, earn_note], queue=False, show_progress="hidden",
                api_visibility="private")
            draft_cost.change(self.earnings, [costs, draft_cost], [earn_plot, earn_note], queue=False, show_progress="hidden",
                              api_visibility="private")
            eng_build.click(self.engine_build, [mode, *inputs], [eng_status, eng_table, eng_id], api_name="engine_build")
            eng_plan_btn.click(self.engine_plan, [mode, *inputs], eng_plan, api_name="engine_plan")
            eng_rm.click(self.engine_remove, eng_id, [eng_status, eng_table, eng_id], api_name="engine_remove")
            counter_btn.click(lambda: self.example_ids[COUNTER_EXAMPLE], None, prompt, **quiet)
            redraw(tour_btn.click(self.tour, [paced, baselines], [*outputs, *settings, explain, tour_note], api_name="tour",
                                  show_progress="hidden", concurrency_id="replay", concurrency_limit=4))
            present.change(None, present, None, js=presenter.TOGGLE_JS, **quiet)
            for button, js in ((back_btn, "() => { window.sdStep(-1); }"), (next_btn, "() => { window.sdStep(1); }"),
                               (play_btn, "() => { window.sdPlay(); }")):
                button.click(None, None, None, js=js, **quiet)
            # A link opens the page set up as it says; Copy link writes the current setup's link.
            redraw(demo.load(self.open_link, None, [tabs, prompt, mode, *inputs, present, link_note, recording, linked],
                             **quiet)).then(
                self.replay_linked, [linked, paced, baselines], outputs, show_progress="hidden", concurrency_id="replay",
                concurrency_limit=4, api_visibility="private")
            link_btn.click(self.link, [mode, prompt, present, *inputs], link_box, **quiet).then(
                None, link_box, link_box, js=COPY_LINK_JS, **quiet)
            demo.unload(self.visitor_left)
            del run_evt, cmp_evt
        return demo

    def _controls(self, service: Service, availability) -> dict[str, Any]:
        c: dict[str, Any] = {}
        d = DEFAULTS
        with gr.Accordion("Sampling and length", open=False):
            c["max_new_tokens"] = Slider(1, service.limits.max_new_tokens, value=d["max_new_tokens"], step=1, label="max_new_tokens")
            c["temperature"] = Slider(0, 2, value=d["temperature"], step=0.05, label="temperature (0 = greedy)")
            c["top_p"] = Slider(0.05, 1, value=d["top_p"], step=0.05, label="top_p")
            c["top_k"] = Slider(0, 100, value=d["top_k"], step=1, label="top_k (0 = off)")
            # No precision: Gradio's rounding fails on NaN without a word; request_from says what is wrong instead.
            c["seed"] = Number(value=d["seed"], label="seed (-1 = random)")
        with gr.Group(visible=False) as g_pl:
            gr.Markdown("**Prompt lookup** (TensorRT-LLM `NGramDecodingConfig`)")
            c["pl_num_tokens"] = Slider(1, 32, value=d["pl_num_tokens"], step=1, label="max_draft_len (prompt_lookup_num_tokens)")
            c["pl_ngram"] = Slider(1, 6, value=d["pl_ngram"], step=1, label="max_matching_ngram_size")
            c["pl_draft_lens"] = gr.Textbox(value=d["pl_draft_lens"], label="draft caps after a 1-gram, 2-gram… match (empty = none)")
            c["pl_candidates"] = Slider(1, 4, value=d["pl_candidates"], step=1, label="matches verified together (tree)")
            c["pl_oldest"] = gr.Checkbox(value=d["pl_oldest"], label="is_use_oldest (copy after the earliest match; off = the latest)")
        with gr.Group(visible=False) as g_la:
            gr.Markdown("**Lookahead** (`LookaheadDecodingConfig`): engine maxima (W, N, G) and this request's (w, n, g) ≤ them")
            with gr.Row():
                c["la_W"] = Slider(1, 8, value=d["la_W"], step=1, label="max_window_size W")
                c["la_N"] = Slider(1, 6, value=d["la_N"], step=1, label="max_ngram_size N")
                c["la_G"] = Slider(0, 8, value=d["la_G"], step=1, label="max_verification_set_size G")
            with gr.Row():
                c["la_w"] = Slider(1, 8, value=d["la_w"], step=1, label="w")
                c["la_n"] = Slider(1, 6, value=d["la_n"], step=1, label="n")
                c["la_g"] = Slider(0, 8, value=d["la_g"], step=1, label="g")
        with gr.Group(visible=False) as g_dt:
            gr.Markdown("**Draft-target** (`DraftTargetDecodingConfig`)")
            drafts = service.drafts()
            c["dt_model"] = gr.Dropdown(drafts, value=drafts[0] if drafts else None, allow_custom_value=False,
                                        label="speculative_model (registry names only)")
            c["dt_len"] = Slider(1, 16, value=d["dt_len"], step=1, label="max_draft_len")
        with gr.Group(visible=False) as g_md:
            gr.Markdown("**Medusa** (`MedusaDecodingConfig`)")
            c["md_tree"] = gr.Dropdown(list(TREES), value=d["md_tree"], label="medusa_choices (tree)")
            c["md_typical"] = gr.Checkbox(value=False, label="typical acceptance (sampling only — NOT lossless)")
            c["md_threshold"] = Slider(0.01, 1, value=d["md_threshold"], step=0.01, label="posterior_threshold")
            c["md_alpha"] = Slider(0, 1, value=d["md_alpha"], step=0.05, label="posterior_alpha")
            c["md_prune"] = Slider(0, 0.5, value=d["md_prune"], step=0.01, label=PRUNE_LABEL)
            c["md_pl"] = gr.Checkbox(value=d["md_pl"], label=MERGE_LABEL, elem_id="md-pl")
            c["md_model"] = gr.Dropdown(artifact_choices(service, "medusa"), value=SHIPPED, allow_custom_value=False,
                                        label="heads (speculative_model; train your own in the Train tab)", elem_id="md-model")
        with gr.Group(visible=False) as g_eg:
            gr.Markdown("**EAGLE** (`EagleDecodingConfig`): EAGLE-2 dynamic tree or a static tree")
            c["eg_total"] = Slider(2, 64, value=d["eg_total"], step=1, label="total tokens (max_draft_len + 1)")
            c["eg_depth"] = Slider(1, 8, value=d["eg_depth"], step=1, label="depth (num_eagle_layers)")
            c["eg_topk"] = Slider(1, 10, value=d["eg_topk"], step=1, label="top-k (dynamic_tree_max_topK)")
            c["eg_tree"] = gr.Dropdown([DYNAMIC, *TREES], value=DYNAMIC, label="tree (eagle_choices)")
            c["eg_prune"] = Slider(0, 0.5, value=d["eg_prune"], step=0.01, label=PRUNE_LABEL + ", dynamic tree")
            c["eg_pl"] = gr.Checkbox(value=d["eg_pl"], label=MERGE_LABEL, elem_id="eg-pl")
            c["eg_model"] = gr.Dropdown(artifact_choices(service, "eagle"), value=SHIPPED, allow_custom_value=False,
                                        label="module (speculative_model; train your own in the Train tab)", elem_id="eg-model")
        with gr.Group(visible=False) as g_sx:
            gr.Markdown("**Suffix decoding** (vLLM's `suffix` method, `suffix_decoding_*`)")
            c["sx_len"] = Slider(1, 64, value=d["sx_len"], step=1, label="max_draft_len (num_speculative_tokens)")
            c["sx_depth"] = Slider(1, 64, value=d["sx_depth"], step=1, label="suffix_decoding_max_tree_depth")
            c["sx_factor"] = Slider(0, 4, value=d["sx_factor"], step=0.25, label="suffix_decoding_max_spec_factor (draft ≤ factor × match length)")
            c["sx_min_prob"] = Slider(0, 1, value=d["sx_min_prob"], step=0.05, label="suffix_decoding_min_token_prob")
            c["sx_tree"] = gr.Checkbox(value=d["sx_tree"], label="use_tree_spec (verify the likeliest continuations as a tree; this app's loop only)")
        c["backend"] = gr.Dropdown(
            [(name if state.available else f"{name} (unavailable)", name) for name, state in availability.items()],
            value=service.default_backend("lookahead"), label="Backend", elem_id="backend",
            info="; ".join(f"{n}: {s.reason}" for n, s in availability.items() if not s.available) or None,
        )
        c["dtype"] = _dtype_radio(service, "dtype")
        c["groups"] = [g_pl, g_la, g_dt, g_md, g_eg, g_sx]
        # The initial mode is prompt lookup: show its group.
        g_pl.visible = True
        return c


# Every control's value on a fresh page: its config's default (values_from each mode's default config), except
# the Run tab's own choices: a short answer, a fixed seed, and a smaller EAGLE tree than EagleDecodingConfig's
# (24 tokens, depth 5, top-k 4, which the "fastest here" preset sets): a cheaper step and a tree that reads at a glance.
CONFIG_DEFAULTS: dict[str, Any] = {"dt_model": None} | {
    k: v for m in MODES for k, v in values_from({"speculative_config": {"decoding_type": m.decoding_type}})[1].items()}
RUN_TAB_CHOICES = {"max_new_tokens": 64, "seed": 0, "eg_total": 12, "eg_depth": 4, "eg_topk": 3}
DEFAULTS: dict[str, Any] = CONFIG_DEFAULTS | RUN_TAB_CHOICES


def _dtype_radio(service: Service, elem_id: str) -> gr.Radio:
    return gr.Radio(["auto", *DTYPES], value="auto", label="dtype", elem_id=elem_id,
                    info=f"auto = the server's ({service.dtype}). float32: every mode's greedy output equals "
                         "autoregressive. bfloat16: half the bytes per pass, faster where the CPU has native bfloat16; "
                         "the first run in a dtype loads the model in it (transformers backend only).")


def _presets_note(service: Service) -> str:
    return ("defaults: small trees, the server's dtype. fastest here: what the README's bench ran — prompt lookup "
            "max_matching_ngram_size 3, the latest match, 2 matches verified together; EAGLE 24 tokens, depth 5, top-k 4; "
            f"draft-target max_draft_len 2; {service.fast_dtype()} (this CPU's fastest dtype).")


def _visible(mode: str, md_pl: bool = False, eg_pl: bool = False):
    # The prompt lookup group also sets the branch a Medusa or EAGLE tree merges in.
    merged = run_name(mode, {"md_pl": md_pl, "eg_pl": eg_pl}) != mode
    return [gr.update(visible=mode == m or (m == "prompt_lookup" and merged))
            for m in ("prompt_lookup", "lookahead", "draft_target", "medusa", "eagle", "suffix")]


def _status(run: Recording, modes: Modes = MODES) -> str:
    label = f"**{learn.label(run.mode, modes)}**" + (f" ({run.dtype})" if run.dtype else "")
    if run.engine:
        method = (run.engine.get("speculative_config") or {}).get("method")
        label += f" on vLLM {run.engine.get('version') or ''}".rstrip() + (f" (`{method}`)" if method else "")
    if not run.events:
        return f"{label}: loading and prefilling…"
    line = render.totals_line(run.events[-1])
    if run.end is None:
        return f"{label} · {line}"
    reason = run.end.get("finish_reason")
    word = {"eos": "finished (end of sequence)", "length": "finished (max_new_tokens)", "cancelled": "⏹ stopped",
            "timeout": "⏱ stopped by the time limit"}.get(reason, "finished")
    counters = render.spec_decode_line(run.spec_decode)
    return f"{label} {word} · {line}" + (f" · {counters}" if counters else "")


# The tour's order, one recording per mode and merged tree; what each recording shows, in one line.
TOUR_MODES = ("autoregressive", "prompt_lookup", "suffix", "lookahead", "draft_target", "medusa", "eagle",
              "medusa+prompt_lookup", "eagle+prompt_lookup")
RECORDING_WHY = {
    "autoregressive": "the baseline: one target pass per token, nothing drafted.",
    "prompt_lookup": "the answer copies its input, so matches in the prompt are accepted many tokens at a time.",
    "suffix": "the answer repeats what it has written, and the counts pick the continuation that recurs most.",
    "lookahead": "no draft model: the window's n-grams hit on text that repeats a pattern.",
    "draft_target": "a one-layer draft, distilled from the target, drafts one token per small pass.",
    "medusa": "heads on the target's last hidden state guess several positions ahead, as a tree.",
    "eagle": "a draft layer on the target's features grows a tree per step; the target keeps the best branch.",
    "medusa+prompt_lookup": "Medusa's tree and prompt lookup's copy verified in one pass: each wins where the other misses.",
    "eagle+prompt_lookup": "EAGLE's tree with prompt lookup's copy merged in: the best of both in one pass.",
}


def tour_stops() -> list[str]:
    """The shipped recording of each TOUR_MODES mode that has one (the first by name), in tour order."""
    return [next(n for n in RECORDINGS if n.split("-")[0] == mode) for mode in TOUR_MODES
            if any(n.split("-")[0] == mode for n in RECORDINGS)]


def _recording_path(name: str | None) -> str | None:
    """A shipped recording's file, by its menu name: the menu's names are the only paths this opens."""
    return str(RECORDINGS_DIR / f"{name}.json") if name in RECORDINGS else None


def _recording_label(name: str) -> str:
    """A shipped recording's menu entry, from its file name (mode-category-dtype)."""
    mode, category, dtype = (name.split("-") + ["", ""])[:3]
    return f"{learn.label(mode) if mode in MODES else mode} · {category.replace('_', ' ')} ({dtype})"


def _ticks(total: float, skip: threading.Event):
    """When to redraw a replay of a recording `total` seconds long at its recorded pace: seconds into
    the recording, one per REDRAW_S, the last one `total`; a recording over REPLAY_MAX_S is sped up to
    fit. Stops early once `skip` is set."""
    speed = max(1.0, total / REPLAY_MAX_S)
    start = time.perf_counter()
    while not skip.is_set():
        now = min(total, (time.perf_counter() - start) * speed)
        yield now
        if now >= total:
            return
        skip.wait(REDRAW_S)


def _replayed(runs: list[Recording], skip: threading.Event):
    """The runs as they stood at each redraw, replayed at the recorded pace from one start, so they race
    as they would have side by side."""
    clocks = [_clock(r.events) for r in runs]
    for now in _ticks(max(c[-1] for c in clocks), skip):
        yield [r.prefix(bisect.bisect_right(c, now)) for r, c in zip(runs, clocks)]


def _clock(events: list[dict]) -> list[float]:
    """When each step ended, in seconds from the run's start (never earlier than the step before)."""
    out, last = [], 0.0
    for e in events:
        last = max(last, e["totals"].get("elapsed_s", last))
        out.append(last)
    return out


def _curves(runs: dict[str, Recording], modes: Modes = MODES) -> dict[str, list[dict]]:
    return {learn.label(m, modes): r.events for m, r in runs.items()}


def _modes_note(service: Service, backend: str) -> str:
    lines = []
    for m in service.modes(backend=backend):
        mark = "✓" if m["available"] else "✗"
        why = f" — {m['reason']}" if m["reason"] else ""
        lines.append(f"{mark} {service.registry.label(m['mode'])}{why}")
    return "<small>" + " · ".join(lines) + "</small>"


def _example_ids(service: Service) -> dict[int, str]:
    """Every Spec-Bench first turn shipped, by question id (what a link's `example=` names)."""
    return {int(r["id"]): r["text"] for r in service.examples()}


def _link_check(service: Service, mode: str, values: dict[str, Any]) -> str | None:
    try:
        service.request(request_from(mode, values, service.registry))
    except (ConfigError, ValueError, TypeError) as err:
        return str(err)
    return None


def _examples(service: Service) -> list[tuple[str, str]]:
    """One Spec-Bench prompt per category (first turns)."""
    return [(r["category"], r["text"]) for r in service.examples(1)]


def _examples_dropdown(examples: list[tuple[str, str]], elem_id: str) -> gr.Dropdown:
    return gr.Dropdown([(f"{c}: {t[:60]}…", t) for c, t in examples], label="Spec-Bench examples", value=None, elem_id=elem_id)


def _example_tree() -> str:
    """Medusa's default tree, drawn as data: each node is (head depth, top-k rank)."""
    from app.config import medusa_choices
    from app.decoding.tree import from_paths

    paths = medusa_choices("default")
    parents = from_paths(paths)
    texts = {i: f"h{len(p)}:top{p[-1] + 1}" for i, p in enumerate(paths)}
    path = [paths.index(p) for p in ([0], [0, 0], [0, 0, 0]) if p in paths]  # the top-1 chain, as if accepted
    return render.tree_svg(list(range(len(paths))), parents, path, texts)


# The page's own styles, given once at launch: the token view's and presenter mode's.
CSS = render.CSS + presenter.CSS


def launch(service: Service, host: str | None = None, port: int | None = None, **kwargs):
    """Serve the app; host/port None = Gradio's own defaults (GRADIO_SERVER_NAME/PORT, else 127.0.0.1:7860)."""
    studio = Studio(service)
    demo = studio.blocks()
    demo.queue(max_size=service.limits.max_queue, default_concurrency_limit=service.limits.max_concurrency)
    return demo.launch(server_name=host, server_port=port, footer_links=["api", "gradio"], css=CSS,
                       head=presenter.HEAD, **kwargs)
