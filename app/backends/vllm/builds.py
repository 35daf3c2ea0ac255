"""vLLM's builds: what a vLLM server loads from disk (the prepared model, the draft model, the exported Medusa heads or
EAGLE-3 module) and the arguments it is started with (vllm.json), a server per dtype and `speculative_config`."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from app import models
from app.backends import store
from app.backends.store import BuildSpec, Builder, Engine, Progress
from app.backends.vllm import processes
from app.heads.draft import DRAFT_VOCAB
from app.modes import MODES, DecodeRequest
from app.service.errors import EngineError


def spec(request: DecodeRequest, model: str, *, dtype: str = "float32", **settings: Any) -> BuildSpec:
    """The build a checked request needs: a server per dtype (the one "auto" stands for) and vLLM `speculative_config`."""
    dtype = dtype if request.dtype == "auto" else request.dtype
    c = request.speculative_config
    config: dict[str, Any] = {"dtype": dtype}
    if hasattr(c, "speculative_model"):
        config["speculative_model"] = c.speculative_model
    spec = resolve(BuildSpec(model, c.mode, "vllm", {**config, "speculative_config": None}, versions()))
    heads = None
    if store.uses_heads(c.mode):
        artifact = Path(spec.config.get("speculative_model") or models.default_artifact(model, c.mode))
        reason = processes.method_reason(request, artifact)
        if reason:
            raise EngineError(reason)
        if request.entry.vllm == "medusa":  # vLLM's medusa drafts one token per head
            heads = medusa_heads(artifact)
            if c.num_medusa_heads is not None and c.num_medusa_heads > heads:
                raise EngineError(f"num_medusa_heads is {c.num_medusa_heads} but the Medusa artifact has {heads} heads")
    return replace(spec, config={**spec.config, "speculative_config": processes.speculative_config(request, heads=heads)})


def medusa_heads(artifact: Path) -> int:
    """The head count of a Medusa artifact (ours or an export), from its config.json."""
    heads = store.medusa_heads_of(store.artifact_config(str(artifact)))
    if not isinstance(heads, int) or heads < 1:
        raise EngineError(f"the Medusa artifact {Path(artifact).name} has no head count in its config.json")
    return heads


def plan(spec: BuildSpec, engines: Path, build_dir: str = "{build_dir}") -> dict:
    """The server a vLLM spec runs, as pure data ("{build_dir}" or the build directory where it keeps the draft)."""
    spec = resolve(spec)
    speculative = spec.config.get("speculative_config")
    if speculative is not None and "model" in speculative:
        folder = {"draft_model": "draft", "eagle3": "eagle3", "medusa": "medusa"}[speculative["method"]]
        speculative = {**speculative, "model": f"{build_dir}/{folder}"}
    return {"backend": "vllm", "kind": "vllm-server", "model": spec.model, "served_model_name": spec.model,
            "model_dir": store.model_dir_of(spec.model, engines), "dtype": spec.config["dtype"], "speculative_config": speculative,
            "speculative_model": spec.config.get("speculative_model")}


def builder(spec: BuildSpec, engines: Path) -> Builder:
    """What a vLLM server loads from disk: the prepared model, and the draft as a plain model directory (vLLM's
    draft_model reads no draft vocabulary: it scores the draft's full tied head) or a copy of the EAGLE-3 module."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        progress(0.0, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_bytes": store.dir_bytes(where)}
        server = plan(spec, engines, str(out))
        method = (server["speculative_config"] or {}).get("method")
        artifact = MODES[spec.mode].artifact  # the shipped one's kind, when the request names none
        if method == "draft_model":
            draft = spec.config["speculative_model"]
            progress(0.3, f"preparing the draft model {draft}")
            draft_dir = Path(models.locate(draft, engines))
            _link_tree(draft_dir, out / "draft", skip={DRAFT_VOCAB, "specdec_source.json"})
            source["speculative_model"] = draft
        elif method == "medusa":
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, artifact))
            progress(0.3, "exporting the Medusa heads")
            if store.artifact_config(str(src)).get("architecture") == "medusa":  # ours: export to Medusa's own layout
                store.export_medusa(src, Path(where), out / "medusa", spec.model)
            else:  # already in Medusa's own layout
                shutil.copytree(src, out / "medusa")
            source["speculative_model_sha256"] = spec.config.get("speculative_model_sha256")
        elif method == "eagle3":
            src = Path(spec.config.get("speculative_model") or models.default_artifact(spec.model, artifact))
            if store.artifact_config(str(src)).get("architecture") == "eagle":  # ours: export to the EAGLE-3 layout
                progress(0.3, "exporting the EAGLE-3 module")
                store.export_eagle(src, Path(where), out / "eagle3", spec.model)
            else:  # already an EAGLE-3 checkpoint
                shutil.copytree(src, out / "eagle3")
            source["speculative_model_sha256"] = store.tree_sha256(out / "eagle3")
        server["model_dir"] = where
        # Written with the build directory's final name: the store renames the temporary one when it is done.
        final = str(engines / "builds" / spec.key())
        store.write_json(out / "vllm.json", _fill_dir(server, str(out), final))
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


def versions() -> dict:
    return {"vllm": processes.version(processes.Settings().python)}


def resolve(spec: BuildSpec) -> BuildSpec:
    # A draft-model mode drafts with the shipped draft where none is named; an artifact may be a hub id vLLM loads.
    return store.resolve(spec, shipped_draft=True, local_artifact=False)


ENGINE = Engine(versions=versions, resolve=resolve, builder=builder, plan=plan, spec=spec)
