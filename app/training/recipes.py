"""`python -m app train`: Medusa heads, an EAGLE module or a distilled draft model on a frozen target.

The seed workflow (ModelOpt's speculative-decoding example) at the bundled model's scale: the
target is frozen, its final hidden states over a fixed ShareGPT slice are computed once and cached
(data.py), and each recipe distils the target's own next-token distributions into its artifact.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from app.heads import vocab
from app.decoding.linear import fast_bf16
from app.models import LoadedModel
from app.training.data import (CONVERSATIONS, FeatureSet, atomic_write, cached_features, data_slices, print_progress,
                                self_distilled_sequences)
from app.training.trainer import Stopped, fit
from app.modes import MODES
from app.modes.registry import resolve
from app.heads.draft import make_draft, read_layers, rebuild, save_layers, write_model
from app.training.draft import distill_loss
from app.heads import eagle, medusa
from app import models
from app.prompts import load_prompts
from app.runner import LoopConfig, load_companion, run

DATA_SOURCES = ("self", "sharegpt")


@dataclass
class TrainSettings:
    # data: ShareGPT conversations [data_offset, data_offset + data_limit), cut to max_len tokens;
    # "self": their user turns answered by the target itself (greedy, float32), "sharegpt": the dataset's answers
    data_source: str = "self"
    answer_tokens: int = 128  # self: new tokens generated per answer
    data_offset: int = 0
    data_limit: int = 800
    max_len: int = 256
    holdout: int = 20
    # optimisation (the seed's knobs)
    epochs: float = 1.0
    lr: float | None = None  # per-kind default below
    batch_size: int = 8
    save_steps: int | None = None
    seed: int = 0
    # architecture
    medusa_num_heads: int = 3
    medusa_num_layers: int = 1
    eagle_num_layers: int = 1
    draft_vocab_size: int = 8192  # EAGLE and Medusa rank the target's most frequent tokens only
    draft_layers: int = 3
    eagle_steps: int = 1  # EAGLE: training-time-test unroll (2 = also learn from its own predicted features)
    eagle_ce_weight: float = 0.1  # EAGLE: token loss weight next to the feature loss (EAGLE-1's 0.1)
    # EAGLE: target layers fused into its input (EAGLE-3 style); () = none, None = EAGLE-3's (2, L/2, L-3).
    # Features are cached with these layers for every kind, so the three recipes share one extraction.
    eagle_aux_layers: tuple[int, ...] | None = None
    eagle_train_head: bool = False  # EAGLE: train its own LM head rows (else the target's, frozen and not shipped)
    eagle3: bool = False  # EAGLE: EAGLE-3's draft layer (heads/eagle.py, EagleConfig.eagle3)
    max_positions: int | None = None  # medusa: positions per head and batch (None = all; the ranked vocabulary is the cost)
    # Continue training this artifact of the same kind: its weights, architecture and vocabulary
    # replace the fields above that describe them (so train.json states what was trained).
    init_from: str | None = None


# EAGLE-3 learns from the token loss alone, a weaker signal than EAGLE-1's feature regression: one epoch
# on 1000 conversations reached τ 1.39 at 5e-4 and 1.51 at 2e-3 (assets/defaults/README.md).
EAGLE3_LR = 2e-3


@dataclass(frozen=True)
class Recipe:
    """How one kind of trained artifact is made, for `train` and `evaluate`. A registry entry names its kind's recipe by
    module path (`Mode.artifact`, `Mode.artifact_recipe`: "app.training.recipes:EAGLE"), so a new artifact kind is a
    recipe and an entry, nothing else here."""

    # build(target, settings, d2t) -> (module to train, loss_fn(batch), save(directory)); d2t: the draft vocabulary
    # (the target's most frequent tokens of the training data, vocab.py)
    build: Callable[[LoadedModel, TrainSettings, torch.Tensor], tuple[torch.nn.Module, Callable, Callable]]
    lr: Callable[[TrainSettings], float]  # the learning rate when --lr is unset
    config: Callable[[Path], dict]  # an artifact's config.json; a ValueError saying why when the path holds none
    # settings with the architecture fields of an artifact to go on from (its config)
    architecture: Callable[[TrainSettings, dict, LoadedModel, Path], TrainSettings]
    # `export`: the artifact's config.json names it by `saved_as`; it is written in one of `formats` (the default
    # first) by export(source, out, base_model, format) for the engines that load it (app/training/export.py)
    saved_as: str
    formats: tuple[str, ...]
    export: Callable[[Path, Path, str, str], None]
    # the kind's own `train` flags from a run's settings under their names (the Train tab's runs, service/training.py)
    flags: Callable[[object], list[str]] = lambda settings: []
    fuses_layers: bool = False  # it reads the target's other layers' features too (EAGLE-3), not the last only
    # evaluate's companion: the trained directory loaded beside the target (None: the mode's own loader)
    companion: Callable[[LoadedModel, Path], LoadedModel] | None = None


class ExportError(ValueError):
    """An artifact that cannot be exported; the message is meant for the user."""


def kinds(modes=None) -> tuple[str, ...]:
    """The artifact kinds `train --mode` makes: those with a recipe in the registry's entries."""
    return tuple(m.artifact for m in (modes or MODES) if m.artifact and m.artifact_recipe)


def entry_of(kind: str, modes=None):
    """The registry entry that drafts with `kind` artifacts and names their recipe; ValueError for an unknown kind."""
    entry = next((m for m in (modes or MODES) if m.artifact == kind and m.artifact_recipe), None)
    if entry is None:
        raise ValueError(f"unknown training mode '{kind}': choose one of {', '.join(kinds(modes))}")
    return entry


def recipe(kind: str, modes=None) -> Recipe:
    return resolve(entry_of(kind, modes).artifact_recipe)


# report(stage, done, total, loss=None): how far a run is. Stages in order: "self-distil" (answers generated),
# "features" (sequences through the target), "train" (optimiser steps, with each step's loss), "eval" (prompts).
Report = Callable[..., None]
STAGES = ("self-distil", "features", "train", "eval")

# A run stopped by its time limit keeps what it needs to continue in <out>/resume/ (trainer.fit's state.pt);
# train.json's "state" says which it is.
RESUME = "resume"
# SAVED: the state a running session writes every SAVE_EVERY seconds; what a session killed before its end leaves.
STOPPED, SAVED, DONE = "stopped at time limit", "saved while running", "done"
SAVE_EVERY = 600.0


def stopped(out_dir: Path) -> bool:
    """Whether `out_dir` holds a run stopped by its time limit, or killed after a save (one `train(..., resume=True)`
    continues)."""
    return (out_dir / RESUME / "state.pt").is_file()


def stderr_report(kind: str) -> Report:
    """Progress bars on stderr for a person (stdout stays for the result)."""
    bars = {stage: print_progress(stage) for stage in STAGES}
    start = time.perf_counter()

    def report(stage: str, done: int, total: int, loss: float | None = None) -> None:
        if stage != "train":
            bars[stage](done, total)
            return
        end = "\n" if done >= total else ""
        print(f"\r[train {kind}] step {done}/{total} loss {loss:.4f} ({time.perf_counter() - start:.0f} s)",
              end=end, file=sys.stderr, flush=True)

    return report


def jsonl_report(stream=None) -> Report:
    """Progress as one JSON object per line (`train --progress-jsonl`), for the service to follow a run it started."""

    def report(stage: str, done: int, total: int, loss: float | None = None) -> None:
        line = {"stage": stage, "done": done, "total": total, **({} if loss is None else {"loss": loss})}
        print(json.dumps(line), file=stream or sys.stderr, flush=True)

    return report


def train(kind: str, target: LoadedModel, out_dir: Path, settings: TrainSettings, engines: Path,
          report: Report | None = None, *, time_limit: float | None = None, resume: bool = False,
          save_every: float | None = None, clock: Callable[[], float] = time.monotonic, modes=None) -> dict:
    """Train one artifact into `out_dir`; returns a summary (losses, sizes, times) also written as train.json.

    `time_limit`: seconds (by `clock`) this session may run; training stops at the first step past it, with its
    state saved in `out_dir`/resume/ and its progress in train.json (state "stopped at time limit"), and
    `resume=True` with the same settings continues it. The run that ends writes what an uninterrupted one would.
    `save_every`: seconds between saves of that state while the run goes on (train.json's state "saved while
    running"), so a session killed before its end continues from the last save the same way (`train` saves every
    SAVE_EVERY seconds).
    """
    session_start = clock()
    report = report or stderr_report(kind)
    state = out_dir / RESUME / "state.pt"
    if resume and not stopped(out_dir):
        raise ValueError(f"{out_dir} holds no run stopped at its time limit (no {RESUME}/state.pt)")
    if not resume and stopped(out_dir):
        raise ValueError(f"{out_dir} holds a run stopped at its time limit: resume it, or remove {state.parent} to start over")
    before = json.loads((out_dir / "train.json").read_text()) if resume and (out_dir / "train.json").is_file() else {}
    if resume and before.get("state") not in (STOPPED, SAVED):
        raise ValueError(f"{out_dir}/train.json does not record a run stopped at its time limit or saved while running")
    how = recipe(kind, modes)
    if settings.data_source not in DATA_SOURCES:
        raise ValueError(f"unknown data source '{settings.data_source}': choose one of {', '.join(DATA_SOURCES)}")
    check_slice(settings.data_offset, settings.data_limit)
    if settings.init_from:
        settings = how.architecture(settings, how.config(Path(settings.init_from)), target, Path(settings.init_from))
    t0 = time.perf_counter()
    settings = replace(settings, eagle_aux_layers=resolve_aux_layers(settings.eagle_aux_layers, target.model))

    def within(stage: str, offset: int):  # a slice's progress as the whole range's
        return lambda i, n: report(stage, offset - settings.data_offset + i, settings.data_limit)

    parts = []
    for offset, limit in data_slices(settings.data_offset, settings.data_limit):
        sequences = None
        if settings.data_source == "self":
            sequences = _self_distilled(target, settings, engines, offset, limit, within("self-distil", offset))
        parts.append(cached_features(
            target.name, target.model, target.tokenizer, engines, offset=offset, limit=limit, max_len=settings.max_len,
            source=settings.data_source, sequences=sequences, progress=within("features", offset),
            aux_layers=settings.eagle_aux_layers,
        ))
    features = FeatureSet.concat(parts)
    t_data = time.perf_counter() - t0
    if not how.fuses_layers:
        features = FeatureSet(features.ids, features.hidden)
    train_set, eval_set = features.split(min(settings.holdout, len(features) // 5))
    lm_head = target.model.get_output_embeddings()
    lr = settings.lr or how.lr(settings)
    # New weights drawn from the seed: the same run in any process, and the run a resumed session continues.
    torch.manual_seed(settings.seed)
    # Every kind ranks the target's most frequent tokens of the training data (vocab.py).
    d2t = vocab.from_counts(train_set.token_counts(lm_head.weight.shape[0]), settings.draft_vocab_size,
                            include=target.eos_token_ids)
    module, loss_fn, save = how.build(target, settings, d2t)
    out_dir.mkdir(parents=True, exist_ok=True)
    if resume and (before.get("kind"), before.get("settings")) != (kind, json.loads(json.dumps(asdict(settings)))):
        raise ValueError(f"{out_dir} holds a run of other settings: resume it with its own (train.json)")
    t1 = time.perf_counter()

    def progress(state_name: str, step: int, total: int, losses: list[float]) -> dict:
        sessions = _sessions(before, losses, time.perf_counter() - t1)
        record = {
            "state": state_name, "kind": kind, "base_model": target.name, "out_dir": str(out_dir), "settings": asdict(settings),
            "lr": lr, "step": step, "total_steps": total, "last_loss": losses[-1],
            "losses": [round(x, 4) for x in losses], "sessions": sessions,
            "train_seconds": round(sum(s["train_seconds"] for s in sessions), 1),
        }
        atomic_write(out_dir / "train.json", lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2)))
        return record

    try:
        losses = fit(
            module, loss_fn, train_set, epochs=settings.epochs, lr=lr, batch_size=settings.batch_size,
            seq_len=settings.max_len, seed=settings.seed, bf16=fast_bf16(), save_steps=settings.save_steps,
            save_fn=lambda step: save(out_dir / f"checkpoint-{step}"),
            progress=lambda step, total, loss: report("train", step, total, loss=loss),
            time_limit=None if time_limit is None else time_limit - (clock() - session_start), state=state,
            save_every=save_every, saved=lambda step, total, losses: progress(SAVED, step, total, losses), clock=clock,
        )
    except Stopped as stop:
        return progress(STOPPED, stop.step, stop.total, stop.losses)
    sessions = _sessions(before, losses, time.perf_counter() - t1)
    save(out_dir)
    with torch.no_grad():
        eval_loss = _mean_loss(loss_fn, eval_set, settings)
    summary = {
        "kind": kind, "base_model": target.name, "out_dir": str(out_dir), "settings": asdict(settings), "lr": lr,
        "train_sequences": len(train_set), "train_tokens": train_set.num_tokens, "eval_sequences": len(eval_set),
        "trainable_params": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "first_loss": losses[0], "last_loss": losses[-1], "eval_loss": eval_loss, "steps": len(losses),
        "losses": [round(x, 4) for x in losses],
        "data_seconds": round(t_data, 1), "train_seconds": round(sum(s["train_seconds"] for s in sessions), 1),
        "bf16_autocast": fast_bf16(), "lm_head_params": lm_head.weight.numel(), "state": DONE, "sessions": sessions,
    }
    (out_dir / "train.json").write_text(json.dumps(summary, indent=2))
    shutil.rmtree(state.parent, ignore_errors=True)
    return summary


def check_slice(offset: int, limit: int) -> None:
    """A ValueError saying why unless conversations [offset, offset + limit) are a slice of the dataset."""
    if not 0 <= offset < offset + limit <= CONVERSATIONS:
        raise ValueError(f"conversations {offset}-{offset + limit} are not a slice of the dataset: it has {CONVERSATIONS} "
                         "(--data-offset from 0, --data-limit at least 1)")


def _sessions(before: dict, losses: list[float], seconds: float) -> list[dict]:
    """The sessions of a run so far (train.json's progress record), this one last."""
    done = before.get("step", 0)
    mine = losses[done:]
    return before.get("sessions", []) + [{"steps": len(mine), "train_seconds": round(seconds, 1),
                                          "mean_loss": round(sum(mine) / max(1, len(mine)), 4)}]


def artifact_config(kind: str, path: str | Path, modes=None) -> dict:
    """The config.json of a `kind` artifact written by `train`; a ValueError saying why when `path` holds none."""
    return recipe(kind, modes).config(Path(path))


def resolve_aux_layers(layers: tuple[int, ...] | None, model: torch.nn.Module) -> tuple[int, ...]:
    """The target layers EAGLE fuses: None = EAGLE-3's choice for an L-layer target, (2, L//2, L-3)."""
    if layers is not None:
        return tuple(layers)
    n = model.config.get_text_config(decoder=True).num_hidden_layers
    return tuple(sorted({min(2, n), n // 2, max(n - 3, 0)}))


def _self_distilled(target: LoadedModel, settings: TrainSettings, engines: Path, offset: int, limit: int,
                    progress) -> list[list[int]]:
    """The seed's data: the target's own greedy answers, generated by the target as loaded (--dtype),
    so the heads learn the text the model writes in the dtype it is deployed in."""
    return self_distilled_sequences(
        target.name, target.model, target.tokenizer, engines, offset=offset, limit=limit,
        max_len=settings.max_len, max_new_tokens=settings.answer_tokens, eos_token_ids=target.eos_token_ids,
        progress=progress,
    )


def _mean_loss(loss_fn, features, settings: TrainSettings) -> float:
    values = [float(loss_fn(b)) for b in features.batches(settings.batch_size, settings.max_len, seed=0)]
    return sum(values) / max(1, len(values))


# The shipped kinds' recipes (named by app/modes/shipped.py's entries).
def _draft_config(path: Path) -> dict:
    return read_layers(path)[0]


def _draft_architecture(s: TrainSettings, c: dict, target: LoadedModel, path: Path) -> TrainSettings:
    d2t = read_layers(path)[2]
    vocab_size = target.model.get_output_embeddings().weight.shape[0]
    return replace(s, draft_layers=len(c["kept_layers"]), draft_vocab_size=len(d2t) if d2t is not None else vocab_size)


def _draft_build(target: LoadedModel, s: TrainSettings, d2t: torch.Tensor):
    model, lm_head = target.model, target.model.get_output_embeddings()
    if s.init_from:
        draft, d2t = rebuild(model, Path(s.init_from)), read_layers(Path(s.init_from))[2]
    else:
        draft = make_draft(model, s.draft_layers)
    return (draft, lambda b: distill_loss(draft, lm_head, b.ids, b.hidden, b.mask, d2t=d2t),
            lambda d: save_layers(draft, d, target.name, d2t))


def _draft_companion(target: LoadedModel, out_dir: Path) -> LoadedModel:
    """The draft's kept layers rebuilt over the target's (a draft artifact is layers, not a model of its own)."""
    return LoadedModel(name=str(out_dir), model=rebuild(target.model, out_dir).to(target.model.dtype),
                       tokenizer=target.tokenizer, dtype=target.dtype, draft_vocab=read_layers(out_dir)[2])


def _medusa_config(path: Path) -> dict:
    return medusa.load_config(path)


def _medusa_architecture(s: TrainSettings, c: dict, target: LoadedModel, path: Path) -> TrainSettings:
    vocab_size = target.model.get_output_embeddings().weight.shape[0]
    return replace(s, medusa_num_heads=int(c["medusa_num_heads"]), medusa_num_layers=int(c["medusa_num_layers"]),
                   draft_vocab_size=int(c.get("draft_vocab_size") or vocab_size))


def _medusa_build(target: LoadedModel, s: TrainSettings, d2t: torch.Tensor):
    model, lm_head = target.model, target.model.get_output_embeddings()
    if s.init_from:
        heads = medusa.load(s.init_from)
        medusa.check_compatible(heads, model)
    else:
        config = medusa.MedusaConfig(model.config.hidden_size, lm_head.weight.shape[0], s.medusa_num_heads,
                                     s.medusa_num_layers, draft_vocab_size=len(d2t))
        heads = medusa.MedusaHeads(config, d2t)
    return (heads, lambda b: medusa.medusa_loss(heads, lm_head, b.ids, b.hidden, b.mask, max_positions=s.max_positions),
            lambda d: medusa.save(heads, d, target.name))


def _eagle_config(path: Path) -> dict:
    return eagle.load_config(path)


def _eagle_architecture(s: TrainSettings, c: dict, target: LoadedModel, path: Path) -> TrainSettings:
    return replace(s, eagle_num_layers=int(c["eagle_num_layers"]), eagle_aux_layers=tuple(c.get("aux_layers") or ()),
                   eagle_train_head=not c.get("lm_head_from_target", False), draft_vocab_size=int(c["draft_vocab_size"]),
                   eagle3=bool(c.get("eagle3", False)))


def _eagle_build(target: LoadedModel, s: TrainSettings, d2t: torch.Tensor):
    model, lm_head = target.model, target.model.get_output_embeddings()
    if s.init_from:
        module = eagle.load(s.init_from, target_lm_head=lm_head)
        eagle.check_compatible(module, model)
    else:
        config = eagle.EagleConfig.from_target(model.config, draft_vocab_size=len(d2t), eagle_num_layers=s.eagle_num_layers,
                                               aux_layers=list(s.eagle_aux_layers) or None, lm_head_from_target=not s.eagle_train_head,
                                               eagle3=s.eagle3)
        module = eagle.EagleModule(config, d2t)
        eagle.init_lm_head(module, lm_head)  # the target's own rows for the draft vocabulary (a warm start when trained)
    module.lm_head.requires_grad_(s.eagle_train_head)
    embed = model.get_input_embeddings()
    return (module, lambda b: eagle.eagle_loss(module, embed, lm_head, b.ids, b.hidden, b.mask, ce_weight=s.eagle_ce_weight,
                                               steps=s.eagle_steps, aux=b.aux),
            lambda d: eagle.save(module, d, target.name))


def _lm_head(base_model: str) -> torch.Tensor:
    """The base model's LM head tensor, read without loading the model."""
    return models.lm_head_weight(models.locate(base_model)).float()


def _draft_export(source: Path, out: Path, base_model: str, fmt: str) -> None:
    """A plain Hugging Face model directory (AutoModelForCausalLM, vLLM draft_model, TensorRT-LLM draft-target)."""
    base = models.load(base_model, dtype="float32")
    write_model(base.model, base.tokenizer, source, out, draft_vocab=False)


def _medusa_export(source: Path, out: Path, base_model: str, fmt: str) -> None:
    """Medusa heads' checkpoint (medusa_lm_head.safetensors: vLLM medusa, TensorRT-LLM's Medusa conversion)."""
    medusa.export_trtllm(medusa.load(source), _lm_head(base_model), out, base_model)


def _eagle_export(source: Path, out: Path, base_model: str, fmt: str) -> None:
    """An EAGLE-3 draft checkpoint, its captured layers numbered as vLLM numbers them ("eagle3") or as ModelOpt and
    TensorRT-LLM do ("modelopt")."""
    try:
        eagle.check_exportable(eagle.read_config(source))  # before loading the base model
        weight = _lm_head(base_model)
        lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        lm_head.weight.data = weight.float()
        eagle.export_checkpoint(eagle.load(source, target_lm_head=lm_head), out, base_model, layout=fmt)
    except eagle.EagleError as err:
        raise ExportError(str(err)) from err


def _medusa_flags(c) -> list[str]:
    return ["--medusa-num-heads", str(c.medusa_num_heads), "--medusa-num-layers", str(c.medusa_num_layers)]


def _eagle_flags(c) -> list[str]:
    # The shipped module's own recipe (assets/defaults/README.md): the token loss weighted 1.0; EAGLE-3's layer when
    # it starts from scratch (a continued module keeps its own architecture).
    return (["--eagle-steps", str(c.eagle_steps), "--eagle-ce-weight", "1.0"]
            + (["--eagle3"] if c.eagle3 and c.init_from == "scratch" else []))


DRAFT = Recipe(_draft_build, lambda s: 3e-4, _draft_config, _draft_architecture, saved_as="layer_draft",
               formats=("hf",), export=_draft_export, companion=_draft_companion)
MEDUSA = Recipe(_medusa_build, lambda s: 1e-3, _medusa_config, _medusa_architecture, saved_as="medusa",
                formats=("medusa",), export=_medusa_export, flags=_medusa_flags)
EAGLE = Recipe(_eagle_build, lambda s: EAGLE3_LR if s.eagle3 else 5e-4, _eagle_config, _eagle_architecture,
               saved_as="eagle", formats=("eagle3", "modelopt"), export=_eagle_export, flags=_eagle_flags,
               fuses_layers=True)


def evaluate(kind: str, target: LoadedModel, out_dir: Path, n_prompts: int, engines: Path, max_new_tokens: int = 64,
             report: Report | None = None, modes=None) -> dict:
    """Mean accepted tokens per target step (τ) of the trained artifact, greedy, on the first
    Spec-Bench prompt of each category (up to `n_prompts` prompts), in the mode that drafts with it."""
    prompts = load_prompts(None, None, 1)[:n_prompts]
    entry, how = entry_of(kind, modes), recipe(kind, modes)
    if how.companion is not None:
        cfg = LoopConfig(entry.config(), max_new_tokens=max_new_tokens)
        companion = how.companion(target, out_dir)
    else:
        cfg = LoopConfig(entry.config(speculative_model=str(out_dir)), max_new_tokens=max_new_tokens)
        companion = load_companion(cfg, target, engines)
    tokens = steps = 0
    per_category = {}
    for i, p in enumerate(prompts):
        events = list(run(target, cfg, target.encode(p["text"]), companion))
        t = events[-1].totals
        per_category[p["category"]] = round(t["tokens_per_step"], 3)
        tokens += t["new_tokens"]
        steps += t["target_steps"]
        if report is not None:
            report("eval", i + 1, len(prompts))
    return {"mode": cfg.mode, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "mean_accepted_tokens": round(tokens / max(1, steps), 3), "per_category": per_category}
