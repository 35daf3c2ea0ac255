"""`python -m app export`: trained artifacts in the layouts TensorRT-LLM consumes (docs/tensorrt-llm.md)."""

from __future__ import annotations

import json
from pathlib import Path


class ExportError(ValueError):
    """An artifact that cannot be exported; the message is meant for the user."""


def export(source: Path, out: Path, base_model: str) -> Path:
    """Medusa heads → a Medusa heads checkpoint (`medusa_num_heads` in its config); EAGLE → the EAGLE-3 /
    ModelOpt draft layout; a layer draft → a complete Hugging Face model directory (draft-target's
    `speculative_model`). Returns the output directory."""
    config_path = source / "config.json"
    if not config_path.exists():
        raise ExportError(f"{source} has no config.json: not a directory written by `python -m app train`")
    arch = json.loads(config_path.read_text()).get("architecture")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty: choose a new --output-dir")
    if arch == "medusa":
        from app.heads import medusa

        heads = medusa.load(source)
        lm_head = _base(base_model).model.get_output_embeddings().weight
        medusa.export_trtllm(heads, lm_head, out, base_model)
    elif arch == "eagle":
        from app.heads import eagle

        module = eagle.load(source, target_lm_head=_base(base_model).model.get_output_embeddings())
        eagle.export_trtllm(module, out, base_model)
    elif arch == "layer_draft":
        from app.training.draft import write_model

        base = _base(base_model)
        write_model(base.model, base.tokenizer, source, out)
    else:
        raise ExportError(f"{source} holds an unknown artifact '{arch}': expected medusa, eagle or layer_draft")
    return out


def _base(name: str):
    from app import models

    return models.load(name, dtype="float32")
