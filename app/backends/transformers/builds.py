"""The transformers backend's builds: the prepared model cache, a verified copy of the trained artifact, the
prepared draft model. Tree shapes, (W, N, G) and the like are runtime settings here and never change a build's id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from app import models
from app.backends import store
from app.backends.store import BuildSpec, Builder, Progress
from app.modes import DecodeRequest
from app.service.errors import BuildError


def spec(request: DecodeRequest, model: str, **settings: Any) -> BuildSpec:
    """The build a checked request needs: the model, the trained artifact or the draft model (no build settings: those
    are TensorRT's)."""
    c = request.speculative_config
    config: dict[str, Any] = {}
    if hasattr(c, "speculative_model"):
        config["speculative_model"] = c.speculative_model
    return resolve(BuildSpec(model, c.mode, "transformers", config, versions()))


def versions() -> dict:
    return store.installed(("transformers", "torch"))


def resolve(spec: BuildSpec) -> BuildSpec:
    # The backend loads a local artifact only, and drafts with the shipped draft model where none is named.
    return store.resolve(spec, shipped_draft=True, local_artifact=True)


def plan(spec: BuildSpec, engines: Path) -> dict:
    return {"backend": spec.backend, "kind": kind(spec.mode), "model": spec.model,
            "model_dir": store.model_dir_of(spec.model, engines), "speculative_model": spec.config.get("speculative_model")}


def kind(mode: str) -> str:
    return "transformers-heads" if store.uses_heads(mode) else "transformers-draft" if store.uses_draft_model(mode) else "transformers-model"


def builder(spec: BuildSpec, engines: Path) -> Builder:
    """The prepared model cache (+ a verified copy of the trained artifact, + the prepared draft model)."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        steps = 2 if store.uses_heads(spec.mode) or store.uses_draft_model(spec.mode) else 1
        progress(0.0, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_path": where, "model_bytes": store.dir_bytes(where)}
        if store.uses_heads(spec.mode):
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, spec.mode))
            progress(1 / steps, f"copying the {spec.mode} artifact from {src}")
            _check_artifact_fits(src, where, spec.mode)
            shutil.copytree(src, out / spec.mode)
            digest = store.tree_sha256(out / spec.mode)
            if digest != spec.config["speculative_model_sha256"]:
                raise BuildError(f"the {spec.mode} artifact at {src} changed while it was being built from: build again")
            source.update(speculative_model=str(src), speculative_model_sha256=digest)
        elif store.uses_draft_model(spec.mode):
            draft = spec.config["speculative_model"]
            progress(1 / steps, f"preparing the draft model {draft}")
            draft_where = models.locate(draft, engines)
            source.update(speculative_model=draft, speculative_model_path=draft_where, speculative_model_bytes=store.dir_bytes(draft_where))
        return {"kind": kind(spec.mode), "source": source}

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


ENGINE = store.Engine(versions=versions, resolve=resolve, builder=builder, plan=plan, spec=spec)
