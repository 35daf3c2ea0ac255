"""The build store: content-addressed, crash-safe builds of what a decoding config needs before it runs.

A build lives in `<engines>/builds/<id>/`, where id is a short sha256 of its spec: the model, the
mode, the backend, the build-relevant part of the config (a trained artifact by the hash of its
files) and the library versions. Sampling, budgets and other runtime settings never change the id.
Each build directory holds `manifest.json`:

  {"id", "spec", "kind" (see ENGINE_KINDS), "status": "ready" | "failed", "created" (ISO UTC),
   "duration_s", "source" (what it was built from), "files" ({relative path: bytes}), "error"?}

One builder runs per id at a time, across threads and processes (fcntl.flock on
`builds/<id>.lock`); later callers wait and reuse its result. A builder writes into
`builds/.tmp-<id>-<random>/`, which is renamed to `builds/<id>/` only once complete and fsynced,
so a crash leaves a `.tmp-*` directory (cleaned up by the next build of that id), never a
directory that looks usable. A failed build is kept as `builds/.failed-<id>/` (its manifest with
the error, and whatever the builder wrote, e.g. a TensorRT-LLM build plan) until the next attempt.

The store knows no engine: what it needs of one (its spec, its builder, its plan, the library versions its builds
depend on) the engine's package gives through `Engine`, and app/backends/registry.py hands the store every engine's.
Nothing here imports tensorrt_llm; its builder imports it lazily and, where it is missing (every CPU machine), fails
with a clear error after writing the build plan, which `plan()` also returns as pure data without building.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from app import models, runner
from app.heads import eagle, medusa
from app.modes import MODES, ConfigError
from app.modes.errors import one_line
from app.service.errors import BuildError, EngineError

Progress = Callable[[float, str], None]
Builder = Callable[[Path, Progress], dict]

ID_LENGTH = 16
MANIFEST = "manifest.json"
PLAN = "plan.json"
ENGINE_KINDS = {
    "transformers-model": "transformers backend, modes without a trained artifact (autoregressive, prompt lookup, "
    "lookahead): only the manifest; the build prepares and records the model cache it runs on "
    "(engines/models/<name>, the bundled GGUF dequantized once) or the local/hub model",
    "transformers-heads": "transformers backend, medusa / eagle: `medusa/` or `eagle/`, a verified copy of the trained "
    "artifact (config.json, model.safetensors, ...), plus the model cache record",
    "transformers-draft": "transformers backend, draft_target: the records of the prepared target and draft models",
    "tensorrt-engine": "TensorRT-LLM engine backend (lookahead, medusa, eagle, autoregressive): plan.json, "
    "`engine/` (LLM.save: config.json, rank<N>.engine) and, for Medusa from our artifact, `medusa/` (the heads "
    "exported in the layout TensorRT-LLM converts)",
    "tensorrt-pytorch": "TensorRT-LLM PyTorch backend (prompt lookup, draft_target, eagle): plan.json and, for EAGLE "
    "from this app's module, `eagle/` (exported in the EAGLE-3 layout); this backend compiles nothing ahead of time, "
    "LLM(**plan['llm']) loads the checkpoint at run time",
    "tensorrt-worker": "TensorRT-LLM in its own environment (tensorrt_llm/processes.py, either of its backends): "
    "plan.json, the model (and a draft model of the registry) prepared, `medusa/` or `eagle/` exported as above; the worker's LLM loads "
    "the checkpoint, or builds its TensorRT engine from it, when it starts; while it runs, llm.json (its LLM(...) "
    "arguments), server.json (pid, port) and server.log",
    "trained-medusa": "a training run (service/training.py): `medusa/`, Medusa heads trained on the frozen model "
    "(config.json, model.safetensors, train.json), and train.log; requests name them trained:<id>",
    "trained-eagle": "a training run (service/training.py): `eagle/`, an EAGLE module trained on the frozen model, and "
    "train.log; requests name it trained:<id>",
    "vllm-server": "a vLLM engine (vllm/processes.py): vllm.json (the server's arguments), `draft/` (draft_model: the "
    "distilled draft as a plain model directory), `medusa/` (the heads exported in Medusa's own layout) or `eagle3/` (the EAGLE-3 "
    "module); while it runs, server.json (pid, port) and server.log",
}


def uses_heads(mode: str) -> bool:
    """Whether the mode drafts with trained heads or a module beside the target (its registry entry says)."""
    entry = MODES.get(mode)
    return entry is not None and entry.heads


def uses_draft_model(mode: str) -> bool:
    """Whether the mode drafts with a draft model of its own (its registry entry says)."""
    entry = MODES.get(mode)
    return entry is not None and entry.draft_model


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class BuildSpec:
    """What a build is made from. `versions`: the libraries its engine builds with (Engine.versions), which the
    engine's spec fills in; the id hashes them, so a new library version gives a new build."""

    model: str
    mode: str
    backend: str = "transformers"
    config: dict = field(default_factory=dict)
    versions: dict | None = None

    def to_dict(self) -> dict:
        return {"model": self.model, "mode": self.mode, "backend": self.backend, "config": self.config, "versions": self.versions}

    def key(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]


@dataclass(frozen=True)
class Engine:
    """What the store needs of an engine; its package makes one and the registry hands it to the store."""

    versions: Callable[[], dict]  # the library versions its builds depend on
    resolve: Callable[[BuildSpec], BuildSpec]  # the spec with its trained artifact pinned (see `resolve`)
    builder: Callable[[BuildSpec, Path], Builder]  # (spec, engines root): what builds it
    plan: Callable[[BuildSpec, Path], dict]  # (spec, engines root): what building it would do, as pure data
    spec: Callable[..., BuildSpec] | None = None  # (request, model, **settings): the build a checked request needs


def installed(names: tuple[str, ...]) -> dict:
    """The installed versions of these distributions (package metadata: importing TensorRT-LLM needs CUDA)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def resolve(spec: BuildSpec, *, shipped_draft: bool, local_artifact: bool) -> BuildSpec:
    """The spec with its trained artifact pinned by content: a changed artifact gives a new id.

    medusa / eagle: speculative_model None = the model's shipped artifact; a local directory is
    hashed into `speculative_model_sha256` (`local_artifact`: the engine loads nothing else).
    draft_target: None = the shipped draft where the engine runs it (`shipped_draft`)."""
    cfg = dict(spec.config)
    given = cfg.get("speculative_model")
    if uses_heads(spec.mode):
        path = Path(given).expanduser() if given else models.default_artifact(spec.model, spec.mode)
        if path is None:
            raise EngineError(
                f"no {spec.mode} artifact for model '{spec.model}': train one (python -m app train --mode {spec.mode}) "
                "and set speculative_model to its directory"
            )
        if path.is_dir():
            cfg["speculative_model_sha256"] = tree_sha256(path)
            if given:
                cfg["speculative_model"] = str(path.resolve())
        elif local_artifact:
            raise EngineError(f"the {spec.mode} artifact '{given}' is not a directory")
    elif uses_draft_model(spec.mode) and shipped_draft and not given:
        try:
            cfg["speculative_model"] = runner.default_draft(spec.model)
        except ConfigError as err:
            raise EngineError(str(err)) from None
    return replace(spec, config=cfg)


def tree_sha256(directory: Path) -> str:
    """sha256 over every file's relative path and content, in a fixed order."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


# ----------------------------------------------------------------------------- the store


class Store:
    """The builds under `root`, of the engines it is given (name -> Engine; app/backends/registry.py has them all)."""

    def __init__(self, root: Path, engines: Mapping[str, Engine]) -> None:
        self.root = Path(root)
        self.builds = self.root / "builds"
        self.engines = engines

    def engine(self, backend: str) -> Engine:
        try:
            return self.engines[backend]
        except KeyError:
            raise EngineError(f"the {backend} backend has nothing to build") from None

    def resolve(self, spec: BuildSpec) -> BuildSpec:
        """The spec with its trained artifact pinned, the way its engine does (a spec of no engine as it is)."""
        engine = self.engines.get(spec.backend)
        return engine.resolve(spec) if engine is not None else spec

    def spec_id(self, spec: BuildSpec) -> str:
        return self.resolve(spec).key()

    def plan(self, spec: BuildSpec) -> dict:
        """What building `spec` would do, as pure data (nothing is built, imported or prepared)."""
        spec = self.resolve(spec)
        return self.engine(spec.backend).plan(spec, self.root)

    def get(self, build_id: str) -> dict | None:
        """The manifest of a ready build, else that of its last failed attempt, else None."""
        _check_id(build_id)
        for directory in (self.builds / build_id, self.builds / f".failed-{build_id}"):
            manifest = _read_manifest(directory)
            if manifest is not None:
                return manifest
        return None

    def list(self) -> list[dict]:
        """Manifests of the ready builds, newest first (temporary, failed and half-done directories are skipped)."""
        if not self.builds.is_dir():
            return []
        found = []
        for directory in self.builds.iterdir():
            if not directory.name.startswith(".") and (manifest := _ready(directory, directory.name)) is not None:
                found.append(manifest)
        return sorted(found, key=lambda m: (m.get("created", ""), m["id"]), reverse=True)

    def build(self, spec: BuildSpec, builder: Builder | None = None, progress: Progress | None = None) -> dict:
        """The manifest of the ready build of `spec`: reused when it exists, else built now (once across
        threads and processes). Raises BuildError when the builder fails."""
        progress = progress or _quiet
        spec = self.resolve(spec)
        build_id = spec.key()
        final = self.builds / build_id
        manifest = _ready(final, build_id)
        if manifest is not None:
            progress(1.0, f"reusing build {build_id}")
            return manifest
        with self._locked(build_id, progress):
            manifest = _ready(final, build_id)  # another caller may have finished it while we waited
            if manifest is not None:
                progress(1.0, f"reusing build {build_id}")
                return manifest
            for stale in [*self.builds.glob(f".tmp-{build_id}-*"), self.builds / f".failed-{build_id}"]:
                shutil.rmtree(stale, ignore_errors=True)
            if final.exists():  # not made by us (no ready manifest): never reuse, never merge into it
                shutil.rmtree(final)
            return self._run(spec, build_id, builder or self.engine(spec.backend).builder(spec, self.root), progress)

    def remove(self, build_id: str) -> None:
        """Delete a build (and its failed attempt); unknown ids are an error."""
        _check_id(build_id)
        with self._locked(build_id, _quiet):
            targets = [d for d in (self.builds / build_id, self.builds / f".failed-{build_id}") if d.exists()]
            if not targets:
                known = ", ".join(m["id"] for m in self.list()) or "none"
                raise EngineError(f"there is no build '{one_line(build_id)}' in {self.builds} (ready builds: {known})")
            for directory in targets:
                # Renamed first: a removal cut short leaves a .tmp-* directory, not a half-deleted build.
                doomed = self.builds / f".tmp-{build_id}-removed-{secrets.token_hex(4)}"
                os.replace(directory, doomed)
                shutil.rmtree(doomed)

    # -------------------------------------------------------------------------

    def _run(self, spec: BuildSpec, build_id: str, builder: Builder, progress: Progress) -> dict:
        tmp = self.builds / f".tmp-{build_id}-{secrets.token_hex(4)}"
        tmp.mkdir()
        created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        start = time.monotonic()
        base = {"id": build_id, "spec": spec.to_dict(), "created": created}
        progress(0.0, f"building {build_id}: {spec.mode} for {spec.model} on {spec.backend}")
        try:
            result = builder(tmp, progress)
            if not isinstance(result, dict) or not isinstance(result.get("kind"), str):
                raise BuildError(f"the builder of {build_id} returned {type(result).__name__}, not a dict with a 'kind'")
        except Exception as err:
            raise self._failure(tmp, base, err, time.monotonic() - start) from err
        except BaseException:  # interrupted: like a crash, the next build cleans up
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        extra = {k: v for k, v in result.items() if k not in ("kind", "source")}
        manifest = {**base, "kind": result["kind"], "status": "ready", "duration_s": round(time.monotonic() - start, 3),
                    "source": result.get("source", {}), "files": _files(tmp), **extra}
        write_json(tmp / MANIFEST, manifest)
        _fsync_tree(tmp)
        os.replace(tmp, self.builds / build_id)
        _fsync_dir(self.builds)
        progress(1.0, f"build {build_id} ready")
        return manifest

    def _failure(self, tmp: Path, base: dict, err: Exception, duration: float) -> BuildError:
        """Keep what a failed builder left as .failed-<id>/ with its manifest; the error to raise."""
        failed = self.builds / f".failed-{base['id']}"
        message = str(err) if isinstance(err, EngineError) else f"{type(err).__name__}: {err}"
        # Paths the builder named inside its temporary directory now live in the failed one.
        message = message.replace(str(tmp), str(failed))
        manifest = {**base, "kind": None, "status": "failed", "duration_s": round(duration, 3), "source": {},
                    "files": _files(tmp), "error": message}
        try:
            write_json(tmp / MANIFEST, manifest)
            os.replace(tmp, failed)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, BuildError):
            return BuildError(message)
        spec = base["spec"]
        return BuildError(f"building {spec['mode']} for {spec['model']} ({spec['backend']}) failed: {message}")

    @contextmanager
    def _locked(self, build_id: str, progress: Progress) -> Iterator[None]:
        # Lock files stay: unlinking one while another process waits on it would let a third one in.
        self.builds.mkdir(parents=True, exist_ok=True)
        with open(self.builds / f"{build_id}.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(0.0, f"waiting for another build of {build_id}")
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def _quiet(fraction: float, message: str) -> None:
    pass


def _check_id(build_id: str) -> None:
    if not isinstance(build_id, str) or not re.fullmatch(f"[0-9a-f]{{{ID_LENGTH}}}", build_id):
        raise EngineError(f"'{one_line(build_id)}' is not a build id ({ID_LENGTH} hex digits)")


def _read_manifest(directory: Path) -> dict | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "id" in manifest else None


def _ready(directory: Path, build_id: str) -> dict | None:
    manifest = _read_manifest(directory)
    return manifest if manifest and manifest["id"] == build_id and manifest.get("status") == "ready" else None


def _files(directory: Path) -> dict[str, int]:
    out = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = Path(parent) / name
            rel = path.relative_to(directory).as_posix()
            if rel != MANIFEST:
                out[rel] = path.stat().st_size
    return dict(sorted(out.items()))


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _fsync_tree(directory: Path) -> None:
    for parent, _, names in os.walk(directory):
        for name in names:
            fd = os.open(Path(parent) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(parent))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_bytes(path: str) -> int | None:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else None


def model_dir_of(name: str, engines: Path) -> str:
    """Where models.locate puts or finds `name`, without preparing it: an absolute path for a registry alias or a
    local directory (engines such as TensorRT-LLM take any other string for a hub id and download it)."""
    if name in models.ALIASES or name in models.DRAFT_ALIASES:
        return str((engines / "models" / name).absolute())
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


# ----------------------------------------------------------------------------- what builders share


def artifact_config(src: str | None) -> dict:
    """config.json of a local artifact directory; {} for a hub id or anything unreadable."""
    try:
        data = json.loads((Path(src) / "config.json").read_text()) if src else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def medusa_heads_of(config: dict) -> int | None:
    """The head count of our heads, of a FasterDecoding/Medusa checkpoint or of a ModelOpt one ("medusa")."""
    return config.get("medusa_num_heads") or config.get("num_medusa_heads") or (config.get("medusa") or {}).get("num_medusa_heads")


def fill_build_dir(value: Any, build_dir: Path) -> Any:
    """A plan's value with its `{build_dir}` placeholders made that build's directory."""
    if isinstance(value, str):
        return value.replace("{build_dir}", str(build_dir))
    if isinstance(value, dict):
        return {k: fill_build_dir(v, build_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_build_dir(v, build_dir) for v in value]
    return value


def lm_head_weight(model_dir: Path, what: str):
    try:
        return models.lm_head_weight(model_dir)
    except models.ModelError as err:
        raise BuildError(f"{err}: {what} cannot be exported for TensorRT-LLM") from err


def export_medusa(src: Path, model_dir: Path, out: Path, base_model: str) -> None:
    """Our Medusa heads in Medusa's own layout (what TensorRT-LLM converts and vLLM loads)."""
    medusa.export_trtllm(medusa.load(src), lm_head_weight(model_dir, "the Medusa heads"), out, base_model)


def export_eagle(src: Path, model_dir: Path, out: Path, base_model: str, layout: str = "eagle3") -> None:
    """Our EAGLE module as an EAGLE-3 checkpoint (`layout`: vLLM's or ModelOpt's names)."""
    weight = lm_head_weight(model_dir, "the EAGLE module")
    lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lm_head.weight.data = weight.float()
    eagle.export_checkpoint(eagle.load(src, target_lm_head=lm_head), out, base_model, layout=layout)
