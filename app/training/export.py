"""`python -m app export`: trained artifacts in the layouts engines load (docs/training.md#export).

| artifact (`train --mode`) | --format | what is written | loaded by |
|---|---|---|---|
| eagle (`--eagle3`) | eagle3 (default) | EAGLE-3 draft checkpoint, captured layers in vLLM's numbering | vLLM `eagle3`, SGLang |
| | modelopt | the same, layers in ModelOpt's / TensorRT-LLM's numbering | TensorRT-LLM (PyTorch backend) |
| medusa | medusa (default) | Medusa heads checkpoint (medusa_lm_head.safetensors) | vLLM `medusa`, TensorRT-LLM's Medusa conversion |
| draft | hf (default) | a plain Hugging Face model directory | `AutoModelForCausalLM`, vLLM `draft_model`, TensorRT-LLM draft-target |
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# artifact architecture (its config.json) -> its formats, the default first
FORMATS = {"eagle": ("eagle3", "modelopt"), "medusa": ("medusa",), "layer_draft": ("hf",)}
KIND_OF = {"eagle": "EAGLE module", "medusa": "Medusa heads", "layer_draft": "distilled draft"}


class ExportError(ValueError):
    """An artifact that cannot be exported; the message is meant for the user."""


def architecture(source: Path) -> str:
    """The architecture of the `train` output in `source` (a key of FORMATS); ExportError saying why not."""
    config_path = Path(source) / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{source} has no config.json: not a directory written by `python -m app train`")
    try:
        data = json.loads(config_path.read_text())
    except ValueError as err:
        raise ExportError(f"{config_path} is not JSON: {err}") from err
    arch = data.get("architecture") if isinstance(data, dict) else None
    if arch not in FORMATS:
        hint = " (it looks exported already)" if isinstance(data, dict) and ("eagle_config" in data or "medusa_num_heads" in data) else ""
        raise ExportError(f"{source} holds no artifact of `python -m app train`{hint}: expected one of "
                          f"{', '.join(FORMATS)} in its config.json's \"architecture\"")
    return arch


def export(source: Path, out: Path, base_model: str | None = None, format: str | None = None) -> Path:
    """Write the artifact in `source` to `out` in `format` (FORMATS; None = the artifact's default). The base
    model defaults to the one the artifact was trained for. Returns `out`."""
    source, out = Path(source), Path(out)
    arch = architecture(source)
    fmt = format or FORMATS[arch][0]
    if fmt not in FORMATS[arch]:
        raise ExportError(f"a {KIND_OF[arch]} exports as {' or '.join(FORMATS[arch])}, not '{fmt}'")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory: choose a new --output-dir")
    base_model = base_model or json.loads((source / "config.json").read_text()).get("base_model")
    if not base_model:
        raise ExportError(f"{source} does not say which model it was trained for: pass --model")
    if arch == "eagle":
        from app.heads import eagle

        try:
            eagle.check_exportable(eagle.read_config(source))  # before loading the base model
            weight = _lm_head(base_model)
            lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            lm_head.weight.data = weight.float()
            module = eagle.load(source, target_lm_head=lm_head)
            eagle.export_checkpoint(module, out, base_model, layout=fmt)
        except eagle.EagleError as err:
            raise ExportError(str(err)) from err
    elif arch == "medusa":
        from app.heads import medusa

        heads = medusa.load(source)
        medusa.export_trtllm(heads, _lm_head(base_model), out, base_model)
    else:
        from app.heads.draft import write_model

        base = _base(base_model)
        write_model(base.model, base.tokenizer, source, out, draft_vocab=False)
    return out


def _lm_head(name: str):
    """The base model's LM head tensor, read without loading the model."""
    from app import models

    return models.lm_head_weight(models.locate(name)).float()


def _base(name: str):
    from app import models

    return models.load(name, dtype="float32")
