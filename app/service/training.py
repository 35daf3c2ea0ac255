"""Training runs as builds: the seed workflow (heads on a frozen model), started, watched and kept by the service.

A training run is a build of the store (app/backends/store.py) whose spec holds the training settings, so it is
content-addressed (the same settings, data slice, starting point and libraries give the same id, and the
artifact is reused: seeds are fixed), made once across threads and processes, and crash-safe: a run that
is stopped or dies leaves `.failed-<id>/` or `.tmp-*`, never a directory that looks usable. The run itself
is `python -m app train` in a child process: it gets its own computing threads (a second OpenMP team in
the server would slow every generation, see docs/benchmarks.md), Stop ends it at once, and its progress arrives as
JSON lines (`--progress-jsonl`). A ready build holds the artifact in `<kind>/` (config.json,
model.safetensors, train.json); requests name it `trained:<id>` as their speculative_model, never by path.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from app import models
from app.modes import MODES, ConfigError
from app.modes.configs import validated
from app.modes.errors import one_line
from app.backends.registry import TRAINING
from app.backends.store import BuildSpec, Builder, Progress, Store, tree_sha256
from app.service.errors import BuildError
from app.training.data import CONVERSATIONS, shipped_ranges
from app.training.recipes import STAGES, recipe  # STAGES: the order a run goes through
from app.training.data import answers_to_generate

# What the Train tab trains: the kinds drafting beside the target (heads, a module) that have a recipe; a draft model
# is trained on the command line (`train --mode draft`).
KINDS = tuple(m.artifact for m in MODES if m.heads and m.artifact_recipe)
PREFIX = "trained:"
ROOT = Path(__file__).resolve().parents[2]
STARTS = ("shipped", "scratch")


def shipped_answers() -> str:
    """The conversations whose self-distilled answers ship with the app, in words ("0–3000 and 6000–11128")."""
    return " and ".join(f"{a}–{b}" for a, b in shipped_ranges()) or "none"


Events = Callable[[dict[str, Any]], None]


class TrainConfig(BaseModel):
    """What a training run is made from, under `python -m app train`'s names. The defaults fine-tune the
    model's shipped artifact on the first 128 conversations of a slice whose self-distilled answers ship
    with the code (assets/training_data), so nothing has to be generated: a few minutes on a 2-core CPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "eagle"  # one of KINDS (`train --mode`'s names)
    # "shipped": continue training the model's shipped artifact; "scratch": new heads; "trained:<id>": continue a run
    init_from: str = "shipped"
    data_source: Literal["self", "sharegpt"] = "self"
    data_offset: int = 6000
    data_limit: int = 128
    answer_tokens: int = 256
    max_len: int = 640
    epochs: float = 1.0
    lr: float | None = None  # None: the recipe's default for the kind
    batch_size: int = 8
    medusa_num_heads: int = 4  # from scratch only; a continued artifact keeps its own architecture
    medusa_num_layers: int = 1
    eagle_steps: int = 2
    # From scratch: EAGLE-3's architecture (what engines load, `python -m app export`); a continued module keeps its own
    eagle3: bool = True
    eval_prompts: int = 4
    dtype: Literal["float32", "bfloat16"] = "bfloat16"

    def check(self) -> None:
        """Every rule that needs no store; one ConfigError sentence per problem."""
        if self.kind not in KINDS:
            raise ConfigError(f"kind must be one of {', '.join(KINDS)} (what the Train tab trains), got '{one_line(self.kind)}'")
        if self.init_from not in STARTS and not is_name(self.init_from):
            raise ConfigError(f"init_from must be shipped, scratch or trained:<build id>, got '{one_line(self.init_from)}'")
        if not 0 <= self.data_offset < CONVERSATIONS:
            raise ConfigError(f"data_offset must be in [0, {CONVERSATIONS}) (ShareGPT conversations), got {self.data_offset}")
        if not 8 <= self.data_limit <= 2000:
            raise ConfigError(f"data_limit must be in [8, 2000] conversations (training on this CPU), got {self.data_limit}")
        if self.data_offset + self.data_limit > CONVERSATIONS:
            raise ConfigError(f"the slice ends at conversation {self.data_offset + self.data_limit}, but the dataset has {CONVERSATIONS}")
        if not 16 <= self.max_len <= 2048:
            raise ConfigError(f"max_len must be in [16, 2048] tokens, got {self.max_len}")
        if not 1 <= self.answer_tokens <= 512:
            raise ConfigError(f"answer_tokens must be in [1, 512], got {self.answer_tokens}")
        if not 0 < self.epochs <= 20:
            raise ConfigError(f"epochs must be in (0, 20], got {self.epochs}")
        if self.lr is not None and not 0 < self.lr <= 0.1:
            raise ConfigError(f"lr must be in (0, 0.1] (or unset for the default), got {self.lr}")
        if not 1 <= self.batch_size <= 64:
            raise ConfigError(f"batch_size must be in [1, 64], got {self.batch_size}")
        if not 1 <= self.medusa_num_heads <= 5 or not 1 <= self.medusa_num_layers <= 3:
            raise ConfigError("medusa_num_heads must be in [1, 5] and medusa_num_layers in [1, 3]")
        if not 1 <= self.eagle_steps <= 6:
            raise ConfigError(f"eagle_steps must be in [1, 6], got {self.eagle_steps}")
        if not 0 <= self.eval_prompts <= 13:
            raise ConfigError(f"eval_prompts must be in [0, 13] (one Spec-Bench prompt per category), got {self.eval_prompts}")


def parse(data: dict[str, Any] | TrainConfig) -> TrainConfig:
    """A checked TrainConfig from JSON-like data; every problem becomes one ConfigError sentence."""
    if not isinstance(data, TrainConfig):
        data = validated(TrainConfig, data, "training")
    data.check()
    return data


def is_name(name: str) -> bool:
    """Whether `name` has the form of a trained artifact's name (trained: and a 16-digit build id)."""
    return bool(re.fullmatch(PREFIX + r"[0-9a-f]{16}", name or ""))


def artifact_dir(store: Store, name: str, kind: str, model: str) -> Path:
    """The directory of the trained artifact `trained:<id>`, checked: a ready training build of `kind` for
    `model`. Raises ConfigError saying what is wrong (ids come from users: nothing else is ever read)."""
    if not is_name(name):
        raise ConfigError(f"'{name}' is not a trained artifact's name (trained: and a 16-digit build id)")
    build_id = name.removeprefix(PREFIX)
    manifest = store.get(build_id)
    if manifest is None or manifest.get("status") != "ready":
        raise ConfigError(f"there is no finished training run '{build_id}' (see the Train tab or `engines list`)")
    spec = manifest["spec"]
    if spec.get("backend") != "training":
        raise ConfigError(f"build '{build_id}' is not a training run")
    if spec.get("mode") != kind:
        raise ConfigError(f"training run '{build_id}' made {spec.get('mode')} heads, not {kind}")
    if spec.get("model") != model:
        raise ConfigError(f"training run '{build_id}' trained heads for '{spec.get('model')}', not '{model}'")
    return store.builds / build_id / kind


def start_dir(store: Store, config: TrainConfig, model: str) -> Path | None:
    """The artifact a run continues from (None: from scratch)."""
    if config.init_from == "scratch":
        return None
    if config.init_from == "shipped":
        path = models.default_artifact(model, config.kind)
        if path is None:
            raise ConfigError(f"no {config.kind} artifact ships for '{model}': train from scratch")
        return path
    return artifact_dir(store, config.init_from, config.kind, model)


def spec(model: str, config: TrainConfig, start: Path | None) -> BuildSpec:
    """The build a training run is: its settings, and where it starts pinned by content (a changed artifact
    to continue from gives a new id)."""
    settings = config.model_dump()
    if start is not None:
        settings["init_from_sha256"] = tree_sha256(start)
    return BuildSpec(model, config.kind, backend="training", config={"train": settings}, versions=TRAINING.versions())


def plan(store: Store, model: str, config: TrainConfig) -> dict[str, Any]:
    """What a run would do, before it runs: its build id, whether that build is ready (then it is reused), and how
    many answers the model must write first (self-distilled data neither cached nor shipped for this slice)."""
    start = start_dir(store, config, model)
    build_id = store.spec_id(spec(model, config, start))
    ready = (store.get(build_id) or {}).get("status") == "ready"
    generate = 0
    if config.data_source == "self" and not ready:
        generate = answers_to_generate(store.root, model, models.DTYPES[config.dtype], offset=config.data_offset,
                                       limit=config.data_limit, max_len=config.max_len, max_new_tokens=config.answer_tokens)
    return {"id": build_id, "ready": ready, "generate": generate}


def command(model: str, config: TrainConfig, start: Path | None, out: Path, engines: Path) -> list[str]:
    """The `python -m app train` command line of a run, writing its artifact into `out`."""
    c = config
    args = [sys.executable, "-m", "app", "train", "--mode", c.kind, "--model", model, "--dtype", c.dtype,
            "--output-dir", str(out), "--engines-dir", str(engines), "--progress-jsonl",
            "--data-source", c.data_source, "--data-offset", str(c.data_offset), "--data-limit", str(c.data_limit),
            "--answer-tokens", str(c.answer_tokens), "--max-len", str(c.max_len), "--epochs", str(c.epochs),
            "--batch-size", str(c.batch_size), "--eval-prompts", str(c.eval_prompts)]
    if c.lr is not None:
        args += ["--lr", str(c.lr)]
    if start is not None:
        args += ["--init-from", str(start)]
    return args + recipe(c.kind).flags(c)  # the kind's own flags, its recipe's


def fraction(event: dict[str, Any]) -> float:
    """How far a run is, from one of its progress events (each stage a quarter; a stage it skips counts as done)."""
    stage = STAGES.index(event["stage"])
    return min(1.0, (stage + event["done"] / max(1, event["total"])) / len(STAGES))


def describe(event: dict[str, Any]) -> str:
    what = {"self-distil": "the model answers the prompts", "features": "the model reads the conversations",
            "train": "training", "eval": "measuring acceptance (τ) on Spec-Bench prompts"}[event["stage"]]
    loss = f", loss {event['loss']:.3f}" if event.get("loss") is not None else ""
    return f"{what}: {event['done']}/{event['total']}{loss}"


def read_event(line: str) -> dict[str, Any] | None:
    """A progress event from a line the child wrote, or None for any other line (warnings, tracebacks)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("stage") not in STAGES:
        return None
    if not all(isinstance(event.get(k), int) for k in ("done", "total")):
        return None
    return event


def builder(model: str, config: TrainConfig, start: Path | None, engines: Path, *, events: Events | None = None,
            cancel: threading.Event | None = None) -> Builder:
    """The store's builder for a run: the child process, followed line by line until it ends or `cancel` is set."""
    cancel = cancel or threading.Event()

    def build(out: Path, progress: Progress) -> dict:
        progress(0.0, "starting: loading the model")
        log_lines: list[str] = []
        with open(out / "train.log", "w") as log:
            proc = subprocess.Popen(command(model, config, start, out / config.kind, engines), cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
            watcher = threading.Thread(target=_stop_when, args=(cancel, proc), daemon=True)
            watcher.start()
            for line in proc.stderr:
                event = read_event(line)
                if event is None:
                    log.write(line)
                    log_lines = (log_lines + [line.rstrip()])[-20:]
                    continue
                progress(fraction(event), describe(event))
                if events is not None:
                    events(event)
            code = proc.wait()
        if cancel.is_set():
            raise BuildError("training was stopped before it finished")
        if code != 0:
            said = next((l for l in reversed(log_lines) if l.strip()), "no message")
            raise BuildError(f"training failed (exit status {code}): {said}")
        summary = json.loads((out / config.kind / "train.json").read_text())
        kept = ("steps", "first_loss", "last_loss", "eval_loss", "train_sequences", "train_tokens", "trainable_params",
                "data_seconds", "train_seconds", "lr", "eval", "losses")
        # What the artifact it started from measured in the same check when it was made: did this run help?
        before = json.loads((start / "train.json").read_text()).get("eval") if start and (start / "train.json").is_file() else None
        return {"kind": f"trained-{config.kind}",
                "source": {"init_from": str(start) if start else None, **{k: summary.get(k) for k in kept}, "start_eval": before}}

    return build


def _stop_when(cancel: threading.Event, proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        if cancel.wait(0.2):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            return
