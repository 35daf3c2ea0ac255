"""A run as a document: the service's messages collected into a Recording, written out as one JSON
trace, and read back to be replayed.

A trace is what the Run tab's download offers and `python -m app generate --json` prints:
  mode, model, dtype, request (the DecodeRequest data), prompt (the user turn), finish_reason, text, token_ids, prompt_ids,
  texts (token id -> text piece, for every id the prompt and the steps show), steps (the service's step
  messages without `type` and `texts`), totals; and, when the run raced autoregressive decoding,
  baseline: that run's trace. A run on a vLLM engine adds `engine` (its build, version, dtype and the
  speculative_config it served, the request's settings it had no counterpart for, what it does not reveal)
  and `spec_decode` (the engine's counters for the request: num_drafts, num_draft_tokens,
  num_accepted_tokens, accepted_per_pos).
A trace read back may come from anyone, so `parse` checks and normalises it before anything draws it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app import figures
from app.modes import MODES, Modes
from app.models import DTYPES

MAX_BYTES = 8 * 2**20  # a 128-token EAGLE trace with its baseline is ~0.5 MB
MAX_STEPS = 4096  # four times the service's longest generation; the step view of more is megabytes of HTML a redraw
MAX_DEPTH = 24  # nesting of the JSON document (a real trace nests 6 deep)
MAX_NODES = 1024  # tokens a step commits or drafts (TensorRT-LLM's longest draft is 256)
MAX_TOKEN_TEXT = 128  # characters of one token's text (a real tokenizer's longest pieces are a few dozen)
MAX_STRING = 65536  # characters of the prompt, the output text and other free text
# What the step view of a whole trace may weigh: real 128-token traces draw 20-30 kB, a 1024-token one a few hundred.
# A replay redraws it every REDRAW_S, so this bounds the work a trace can make for the server and the browser.
MAX_HTML = 2 * 2**20
FINISH_REASONS = ("eos", "stop", "length", "cancelled", "timeout", "error")  # stop: TensorRT-LLM's end id or stop word
KINDS = ("prefill", "decode")
ADDED_KINDS = ("next", "correction", "bonus", "engine")  # engine: correction or bonus, the engine does not say
NOT_A_TRACE = ("not a SpecDec trace: expected the Run tab's download or the output of "
               "`python -m app generate --json`")


class TraceError(ValueError):
    """A file that is not a trace this app can replay; the message is meant for the user."""


class Recording:
    """What the display needs of one generation, built from service messages (JSON-like, deep-copyable)."""

    def __init__(self, mode: str | None, request: dict[str, Any] | None = None, prompt: str | None = None) -> None:
        self.mode = mode  # a mode, or a merged tree's name (eagle+prompt_lookup); None: unknown
        self.request = request  # the DecodeRequest data it ran with
        self.prompt = prompt  # the user turn
        self.model: str | None = None
        self.dtype: str | None = None
        self.prompt_ids: list[int] = []
        self.texts: dict[int, str] = {}
        self.events: list[dict[str, Any]] = []
        self.end: dict[str, Any] | None = None
        self.engine: dict[str, Any] | None = None  # a vLLM run's engine (see the module's docstring)
        # How the target ran: the transformers backend's pass ("compiled pass, loaded in 1.9 s", ...), the TensorRT-LLM
        # engine it ran on (opened, reused, another shut down first).
        self.pass_note: str | None = None
        self.waiting: str | None = None  # what it waits for before its first message (the display's, not recorded)

    def add(self, message: dict[str, Any]) -> None:
        self.texts.update(message.get("texts") or {})
        if message["type"] == "start":
            self.prompt_ids = message["prompt_ids"]
            self.dtype = message.get("dtype")
            self.model = message.get("model")
            self.pass_note = message.get("pass")
            if message.get("engine"):
                self.engine = {**message["engine"], "not_visible": message.get("not_visible") or []}
        elif message["type"] == "step":
            self.events.append({k: v for k, v in message.items() if k not in ("texts", "type", "side")})
        else:
            self.end = message

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events for t in e["tokens"]]

    def prefix(self, steps: int) -> Recording:
        """The run as it stood after its first `steps` steps (still running: no end)."""
        return Recording.from_record({**self.record(), "events": self.events[:steps], "end": None})

    def record(self) -> dict[str, Any]:
        """The run as session state (gr.State): from_record gives it back."""
        return {"mode": self.mode, "request": self.request, "prompt": self.prompt, "model": self.model, "dtype": self.dtype,
                "prompt_ids": self.prompt_ids, "texts": self.texts, "events": self.events, "end": self.end,
                "engine": self.engine, "pass": self.pass_note}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Recording:
        run = cls(record["mode"], record.get("request"), record.get("prompt"))
        run.prompt_ids, run.texts, run.events, run.end = record["prompt_ids"], record["texts"], record["events"], record["end"]
        run.dtype, run.model, run.engine = record.get("dtype"), record.get("model"), record.get("engine")
        run.pass_note = record.get("pass")
        return run

    @property
    def spec_decode(self) -> dict[str, Any] | None:
        """The engine's own acceptance counters for this run (vLLM), or None."""
        return (self.end or {}).get("spec_decode")

    def trace(self, baseline: Recording | None = None) -> dict[str, Any]:
        """The run as a trace (the module's docstring)."""
        end = self.end or {}
        out = {"mode": self.mode, "model": self.model, "dtype": self.dtype, "request": self.request, "prompt": self.prompt,
               "finish_reason": end.get("finish_reason"), "text": end.get("text", ""),
               "token_ids": end.get("token_ids", self.token_ids), "prompt_ids": self.prompt_ids, "texts": self.texts,
               "steps": self.events, "totals": end.get("totals")}
        if self.engine is not None:
            out.update(engine=self.engine, spec_decode=self.spec_decode)
        if self.pass_note:
            out["pass"] = self.pass_note
        if baseline is not None:
            out["baseline"] = baseline.trace()
        return out


def decoding(events: list[dict] | None) -> dict | None:
    """What a run spent after its prefill, by the loop's clock: tokens, target passes, seconds, and the
    draft and verify seconds of its decoding steps; None without a decoding step or usable times."""
    events = steps(events)
    decode = [e for e in events if e.get("kind") == "decode"]
    if not decode:
        return None
    prefill = next((e for e in events if e.get("kind") == "prefill"), None)
    start = ((prefill or {}).get("totals") or {}).get("elapsed_s", 0.0)
    end = (decode[-1].get("totals") or {}).get("elapsed_s")
    if not (is_number(start) and is_number(end)) or end <= start:
        return None
    out = {"tokens": sum(len(e.get("tokens") or []) for e in decode), "steps": len(decode), "seconds": end - start,
           "draft_s": None, "verify_s": None}
    # An engine that does not time its steps apart (vLLM) leaves them None: tau and the step's cost are still known.
    if all(is_number(e.get(k)) for e in decode for k in ("draft_time_s", "verify_time_s")):
        out.update(draft_s=sum(e["draft_time_s"] for e in decode), verify_s=sum(e["verify_time_s"] for e in decode))
    return out


def steps(events: Iterable[Any] | None) -> list[dict]:
    """Step events only: a service stream also carries "start" and "end" messages."""
    return [e for e in events or [] if isinstance(e, dict) and e.get("type", "step") == "step"]


# A run and its baseline whose shares of the CPU they asked for (totals.cpu_share) differ by more than this factor did
# not run under the same load. Said beside the ratio, not instead of it: under the test suite's two workers the share
# swung by up to about 1.3 between a baseline and its run with no effect on the ratio beyond its interval.
LOAD_CHANGED = 1.5


def load_said(load: dict) -> str:
    """speedup_parts' `load` in words: the shares of the CPU a run and its baseline got."""
    return (f"the machine's load changed: this run got {load['run']:.0%} of the CPU it asked for, its baseline "
            f"{load['baseline']:.0%}")


def step_times(events: list[dict] | None) -> list[tuple[int, float]]:
    """(tokens committed, seconds) of each decoding step, by the loop's clock (a step ends when the next starts)."""
    out, last = [], None
    for e in steps(events):
        elapsed = (e.get("totals") or {}).get("elapsed_s")
        if not is_number(elapsed):
            return []
        if e.get("kind") == "decode" and last is not None:
            out.append((len(e.get("tokens") or []), elapsed - last))
        last = elapsed
    return out


def moments(steps: list[tuple[int, float]]) -> dict[str, float] | None:
    """What `spread` needs of a run's (tokens, seconds) steps, in six sums (a sweep keeps these, not every step)."""
    if len(steps) < 2:
        return None
    return {"n": float(len(steps)), "t": float(sum(t for t, _ in steps)), "s": sum(s for _, s in steps),
            "tt": float(sum(t * t for t, _ in steps)), "ts": sum(t * s for t, s in steps), "ss": sum(s * s for _, s in steps)}


def spread(run: list[tuple[int, float]], base: list[tuple[int, float]]) -> tuple[float, float] | None:
    """A 95 % interval of the decoding speedup (tokens/s after the prefill over the baseline's) from the spread of
    step times. It says how much the figure rests on a few slow or fast steps; a machine whose load drifted during both
    runs alike is not seen by it (the race steps both in turn for that)."""
    return spread_of(moments(run), moments(base))


def spread_of(run: dict[str, float] | None, base: dict[str, float] | None) -> tuple[float, float] | None:
    """`spread` from the two runs' `moments`. Each run's rate is a ratio of sums over its steps, whose variance the
    delta method gives from the sums (a bootstrap took ~0.7 s for 4000 steps, per Compare row)."""
    if not run or not base or run["n"] < 2 or base["n"] < 2:
        return None

    def rate_and_relative_variance(m):
        if m["s"] <= 0:
            return None
        rate = m["t"] / m["s"]
        residual = max(0.0, m["tt"] - 2 * rate * m["ts"] + rate * rate * m["ss"]) / (m["n"] - 1)  # Σ(t - rate·s)²
        return rate, residual * m["n"] / m["s"] ** 2 / rate**2 if rate else math.inf

    a, b = rate_and_relative_variance(run), rate_and_relative_variance(base)
    if a is None or b is None or not b[0]:
        return None
    ratio, width = a[0] / b[0], 1.96 * math.sqrt(a[1] + b[1])  # on the log scale: a ratio's interval is not symmetric
    return ratio * math.exp(-width), ratio * math.exp(width)


def reach(interval: tuple[float, float] | None) -> float:
    """How far a reading's 95 % interval goes above it (symmetric in log): figures.at_least_one's `reach`."""
    return math.sqrt(interval[1] / interval[0]) if interval and interval[0] > 0 else 1.0


def pass_kind(note: str | None) -> str | None:
    """"compiled" or "eager" from the transformers backend's pass note (Recording.pass_note), else None."""
    return next((kind for kind in ("compiled", "eager") if (note or "").startswith(f"{kind} pass")), None)


def speedup_parts(events: list[dict] | None, baseline: list[dict] | None,
                  passes: tuple[str | None, str | None] = (None, None)) -> dict | None:
    """Why a run is as fast as it is against the autoregressive run it raced: its decoding speedup is τ
    (tokens per target pass) divided by what a step of it cost in autoregressive steps, and that cost
    splits into the verify pass, the drafting and the loop's own work. Prefill excluded: both runs pay
    it alike (the race and `overall` include it). `interval`: the decoding speedup's 95 % interval from the
    step times' spread; `doubt`: why the ratio is not a result (the two ran on different passes, `passes` being the
    run's and the baseline's pass notes; or a step cheaper than the pass it contains), else None;
    `load`: the CPU shares of the run and its baseline when they differ by more than LOAD_CHANGED, else None;
    `overall`: the whole run's tokens/s over the baseline's, unless that is more than τ allows (`overall_doubt` says
    so instead)."""
    run, base = decoding(events), decoding(baseline)
    if not run or not base or not base["tokens"]:
        return None
    ar_step = base["seconds"] / base["tokens"]  # autoregressive commits one token a step
    step = run["seconds"] / run["steps"]
    interval = spread(step_times(events), step_times(baseline))
    up = reach(interval)  # how far the step times' spread lets the step cost reach above its reading
    cost, possible = figures.at_least_one(step / ar_step, up)
    parts = {"tau": run["tokens"] / run["steps"], "step_cost": cost, "verify": None, "draft": None, "loop": None}
    doubt = None if possible else (f"a step took {step / ar_step:.2f} of an autoregressive step (its spread reaching "
                                   f"{step / ar_step * up:.2f}), less than the one-token target pass it contains")
    if run["verify_s"] is not None:
        verify, draft = run["verify_s"] / run["steps"] / ar_step, run["draft_s"] / run["steps"] / ar_step
        parts.update(verify=verify, draft=draft, loop=max(0.0, cost - verify - draft))
        if base["verify_s"]:  # a verify pass against the baseline's own pass over one token
            ratio = (run["verify_s"] / run["steps"]) / (base["verify_s"] / base["steps"])
            if not figures.at_least_one(ratio, up)[1] and doubt is None:  # the verify times share the steps' noise
                doubt = f"a verify pass took {ratio:.2f} of the baseline's one-token pass, though it contains one"
    parts["decoding"] = parts["tau"] / cost
    parts["interval"] = figures.bounded_interval(interval, parts["tau"])
    parts["doubt"] = (f"{doubt}: the machine's load changed between this run and its baseline in a way the race did not "
                      "even out; run again for the ratio" if doubt else None)
    kinds = [pass_kind(p) for p in passes]
    if None not in kinds and kinds[0] != kinds[1]:  # the fast pass, built in the background, became ready in between
        parts["doubt"] = (f"the baseline ran on the {kinds[1]} pass and this run on the {kinds[0]} pass (the fast pass "
                          "became ready in between): run again to race both on it")
    totals = [(steps(e)[-1].get("totals") or {}) for e in (events, baseline)]
    shares = [t.get("cpu_share") for t in totals]
    parts["load"] = None
    if all(is_number(s) and 0 < s <= 1 for s in shares) and max(shares) / min(shares) > LOAD_CHANGED:  # a share, or none
        parts["load"] = {"run": shares[0], "baseline": shares[1]}
    parts["overall_doubt"] = None
    if all(is_number(t.get("elapsed_s")) and t["elapsed_s"] > 0 and t.get("new_tokens") for t in totals):
        overall = (totals[0]["new_tokens"] / totals[0]["elapsed_s"]) / (totals[1]["new_tokens"] / totals[1]["elapsed_s"])
        # With equal prefills the whole run's ratio lies between 1 and the decoding's, so at most τ; above it, the
        # run's prefill cost less than the baseline's (the baseline's was the first, cold one, or ran under load).
        if not figures.within(overall, parts["tau"]):
            parts["overall_doubt"] = (f"the whole run's {overall:.2f}× the autoregressive run's tokens/s is more than "
                                      f"τ {parts['tau']:.2f} allows: its prefill cost less than the baseline's, so only "
                                      "the ratio after the prefill is shown")
        else:
            parts["overall"] = min(overall, parts["tau"])
    return parts


def read(path: str | Path, max_bytes: int = MAX_BYTES, modes: Modes = MODES) -> tuple[Recording, Recording | None]:
    """The run (and the baseline it raced, if any) of a trace file of `modes`' runs; TraceError if it is not one."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceError(f"the file has {size:,} bytes; a trace to replay may have {max_bytes:,} bytes at most")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TraceError(f"{NOT_A_TRACE} (the file is not JSON: {err})") from None
    except (RecursionError, ValueError):  # nested deeper than the parser goes; a number of thousands of digits
        raise TraceError(f"{NOT_A_TRACE} (its JSON nests too deep or holds a number too long to read)") from None
    return parse(data, modes)


def parse(data: Any, modes: Modes = MODES) -> tuple[Recording, Recording | None]:
    """A trace's run and baseline, checked: steps with token ids and numeric totals, known names only.

    Whatever the display prints as markup (mode, dtype, finish reasons, totals) is reduced to known
    names and numbers here; token texts and the rest stay data, which the renderer escapes. Every field the
    display reads is checked for its shape and size, the nesting of the whole document is bounded, and so is
    the HTML the step view of the run would be (MAX_HTML): nothing is drawn before all of it passed."""
    _check_depth(data)
    run = _parse(data, "the trace", modes)
    baseline = data.get("baseline")
    if baseline is None:
        return run, None
    base = _parse(baseline, "its baseline", modes)
    if base.mode != "autoregressive":
        raise TraceError(f"its baseline must be an autoregressive run, not {base.mode}")
    return run, base


def _parse(data: Any, what: str, modes: Modes) -> Recording:
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or not data["steps"]:
        raise TraceError(f"{NOT_A_TRACE} ({what} has no list of steps)")
    if len(data["steps"]) > MAX_STEPS:
        raise TraceError(f"{what} has {len(data['steps']):,} steps; a replay shows at most {MAX_STEPS:,}")
    mode = data.get("mode")
    if mode not in modes.names + modes.merged:
        raise TraceError(f"{what} names no mode of this app (its `mode` must be one of {', '.join(modes.names + modes.merged)})")
    run = Recording(mode)
    source = {**COMMON_SOURCE, **modes[modes.split(mode)[0]].provenance}
    run.events = [_step(step, i, what, source) for i, step in enumerate(data["steps"])]
    if run.events[0]["kind"] != "prefill":
        raise TraceError(f"{what} does not start with its prefill step")
    run.dtype = data.get("dtype") if data.get("dtype") in DTYPES else None
    run.model = data["model"][:200] if isinstance(data.get("model"), str) else None
    run.request = data["request"] if isinstance(data.get("request"), dict) else None
    run.prompt = data["prompt"] if isinstance(data.get("prompt"), str) else None
    if run.prompt is not None and len(run.prompt) > MAX_STRING:
        raise TraceError(f"{what}'s prompt has {len(run.prompt):,} characters; a replay takes at most {MAX_STRING:,}")
    prompt_ids = data.get("prompt_ids")
    run.prompt_ids = prompt_ids if _ids(prompt_ids) and len(prompt_ids) <= 2**20 else []
    texts = data.get("texts")
    run.texts = {int(k): v for k, v in texts.items() if _is_id(k) and isinstance(v, str)} if isinstance(texts, dict) else {}
    longest = max(run.texts.values(), key=len, default="")
    if len(longest) > MAX_TOKEN_TEXT:
        raise TraceError(f"{what} gives a token a text of {len(longest):,} characters; a token's text has at most {MAX_TOKEN_TEXT}")
    size = _drawn_size(run.events, run.texts)
    if size > MAX_HTML:
        raise TraceError(f"{what} would draw about {size / 2**20:.1f} MB of HTML; a replay draws at most {MAX_HTML / 2**20:.0f} MB "
                         "(fewer steps, drafts or shorter token texts)")
    text = data.get("text")
    last = run.events[-1]
    run.end = {"type": "end", "finish_reason": _reason(data.get("finish_reason")) or last.get("finish_reason"),
               "text": text if isinstance(text, str) and len(text) <= MAX_STRING else "", "token_ids": run.token_ids,
               "totals": last["totals"], "error": None, "spec_decode": _spec_decode(data.get("spec_decode"))}
    run.engine = _engine(data.get("engine"))
    note = data.get("pass")
    run.pass_note = note[:200] if isinstance(note, str) else None
    return run


def _check_depth(data: Any) -> None:
    """TraceError when the document nests deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TraceError(f"{NOT_A_TRACE} (it nests {MAX_DEPTH}+ levels deep; a trace nests a few)")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _drawn_size(events: list[dict], texts: dict[int, str]) -> int:
    """About how many characters of HTML the step view of these steps is, at most: every committed and drafted
    token as a span with its escaped text (escaping makes a character up to 6), plus each step's own markup."""
    size = 0
    for e in events:
        for t in (*e["tokens"], *e["proposed"]["tokens"]):
            size += 80 + 6 * len(texts.get(t, "⟨0000000⟩"))
        size += 400 + 6 * len(e.get("text") or "")
    return size


# The shapes of what the display reads in a step's `source` (its provenance: COMMON_SOURCE and its mode's entry's)
# and `target` (what the target made of the draft): "id" a token id, "int" any integer, "num" a finite number,
# "num?" one or None, "str" a short text, "bool", ("list", shape, most), ("dict", {key: shape}) (other keys
# dropped), ("opt", shape) the shape or None.
# What every mode's steps may hold in `source` besides its own provenance (its entry's `provenance`).
COMMON_SOURCE = {"min_path_prob": "num", "observed": "str", "not_visible": ("list", "str", 32), "engine": "str"}
TARGET = {"distribution": "str", "decided": ("list", ("dict", {"after": "int", "top": "id", "top_p": "num?"}), MAX_NODES),
          "p": ("list", "num?", MAX_NODES), "added_p": "num?"}


def _shaped(value: Any, shape: Any, where: str) -> Any:
    """`value` checked against `shape` (above), unknown dict keys dropped; TraceError naming `where` otherwise."""
    def bad(what: str) -> TraceError:
        return TraceError(f"{where} must be {what}")

    if isinstance(shape, tuple) and shape[0] == "opt":
        return None if value is None else _shaped(value, shape[1], where)
    if isinstance(shape, tuple) and shape[0] == "list":
        if not isinstance(value, list) or len(value) > shape[2]:
            raise bad(f"a list of at most {shape[2]} items")
        return [_shaped(v, shape[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(shape, tuple) and shape[0] == "dict":
        if not isinstance(value, dict):
            raise bad("an object")
        return {k: _shaped(value[k], s, f"{where}.{k}") for k, s in shape[1].items() if k in value}
    if shape == "id" and not _is_id(value) or shape == "id" and isinstance(value, str):
        raise bad("a token id")
    if shape == "int" and not (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**31):
        raise bad("an integer")
    if shape == "num" and not (is_number(value) and abs(value) <= 1e9):
        raise bad("a number")
    if shape == "num?" and value is not None and not (is_number(value) and abs(value) <= 1e9):
        raise bad("a number or null")
    if shape == "bool" and not isinstance(value, bool):
        raise bad("true or false")
    if shape == "str" and not (isinstance(value, str) and len(value) <= 200):
        raise bad("a short text")
    return value


def _spec_decode(value: Any) -> dict[str, Any] | None:
    """An engine's counters: whole numbers only (anything else is dropped, not shown)."""
    if not isinstance(value, dict):
        return None
    out = {k: value[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens") if _is_count(value.get(k))}
    per_pos = value.get("accepted_per_pos")
    if isinstance(per_pos, list) and len(per_pos) <= MAX_STEPS and all(_is_count(x) for x in per_pos):
        out["accepted_per_pos"] = per_pos
    return out if len(out) == 4 else None


def _engine(value: Any) -> dict[str, Any] | None:
    """An engine's description, reduced to short strings and numbers the display prints."""
    if not isinstance(value, dict) or not isinstance(value.get("engine"), str):
        return None
    out: dict[str, Any] = {k: value[k][:64] for k in ("engine", "build", "version", "dtype") if isinstance(value.get(k), str)}
    spec = value.get("speculative_config")
    if isinstance(spec, dict):
        out["speculative_config"] = {str(k)[:64]: v for k, v in list(spec.items())[:16]
                                     if is_number(v) or (isinstance(v, str) and len(v) <= 256) or v is None}
    for key in ("ignored", "not_visible"):
        items = value.get(key)
        out[key] = [x[:200] for x in items[:16] if isinstance(x, str)] if isinstance(items, list) else []
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def _step(step: Any, i: int, what: str, source: dict[str, Any]) -> dict[str, Any]:
    """A step event (app.decoding.types.StepEvent) with the types the display relies on, or TraceError."""
    def bad(why: str) -> TraceError:
        return TraceError(f"step {i} of {what} is malformed: {why}")

    if not isinstance(step, dict) or not _ids(step.get("tokens")) or not isinstance(step.get("totals"), dict):
        raise bad("a step needs its token ids (tokens) and totals")
    if step.get("kind") not in KINDS:
        raise bad("its kind must be prefill or decode")
    out = {"kind": step["kind"], "tokens": step["tokens"]}  # the fields the display reads, each checked: no others
    proposed = step.get("proposed") or {"tokens": [], "parents": []}
    if not isinstance(proposed, dict) or not _ids(proposed.get("tokens", [])) or not _ints(proposed.get("parents", [])):
        raise bad("proposed must hold the draft's token ids and parent indices")
    if max(len(step["tokens"]), len(proposed.get("tokens", [])), len(proposed.get("parents", []))) > MAX_NODES:
        raise bad(f"a step commits and drafts at most {MAX_NODES} tokens each")
    n = len(proposed.get("tokens", []))
    out["proposed"] = {"tokens": proposed.get("tokens", []), "parents": proposed.get("parents", [-1] * n)}
    for key in ("accepted", "rejected"):
        nodes = step.get(key, [])
        if not _ids(nodes) or any(node >= n for node in nodes):
            raise bad(f"{key} must list draft node indices")
        out[key] = nodes
    if not _ids(step.get("accepted_tokens", [])) or not (step.get("added_token") is None or _ids([step["added_token"]])):
        raise bad("accepted_tokens and added_token must be token ids")
    out["accepted_tokens"], out["added_token"] = step.get("accepted_tokens", []), step.get("added_token")
    for key, shape in (("source", source), ("target", TARGET)):
        try:
            out[key] = _shaped(step.get(key) or {}, ("dict", shape), key)
        except TraceError as err:
            raise bad(str(err)) from None
    out["step"] = step["step"] if isinstance(step.get("step"), int) and not isinstance(step.get("step"), bool) and 0 <= step["step"] < 2**31 else i
    text = step.get("text")
    out["text"] = text if isinstance(text, str) and len(text) <= MAX_NODES * MAX_TOKEN_TEXT else ""
    out["added_kind"] = step.get("added_kind") if step.get("added_kind") in ADDED_KINDS else None
    for key in ("draft_time_s", "verify_time_s"):
        out[key] = step.get(key) if is_number(step.get(key)) and 0 <= step[key] <= 1e6 else None
    # Numbers a person could read: a total of 1e308 is no count of tokens or seconds.
    out["totals"] = {k: v for k, v in step["totals"].items() if isinstance(k, str) and len(k) <= 40 and is_number(v) and abs(v) <= 1e12}
    out["finish_reason"] = _reason(step.get("finish_reason"))
    return out


def _reason(value: Any) -> str | None:
    return value if value in FINISH_REASONS else None


def is_number(value: Any) -> bool:
    """A finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_id(value: Any) -> bool:
    if isinstance(value, str):
        return value.isdigit()
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
