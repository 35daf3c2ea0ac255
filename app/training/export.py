"""`python -m app export`: trained artifacts in the layouts engines load (docs/training.md#export).

| artifact (`train --mode`) | --format | what is written | loaded by |
|---|---|---|---|
| eagle (`--eagle3`) | eagle3 (default) | EAGLE-3 draft checkpoint, captured layers in vLLM's numbering | vLLM `eagle3`, SGLang |
| | modelopt | the same, layers in ModelOpt's / TensorRT-LLM's numbering | TensorRT-LLM (PyTorch backend) |
| medusa | medusa (default) | Medusa heads checkpoint (medusa_lm_head.safetensors) | vLLM `medusa`, TensorRT-LLM's Medusa conversion |
| draft | hf (default) | a plain Hugging Face model directory | `AutoModelForCausalLM`, vLLM `draft_model`, TensorRT-LLM draft-target |

Each kind's recipe (app/training/recipes.py, named by its registry entry) owns its formats and writes them: this
module only finds the recipe of the artifact at hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.training.recipes import ExportError, Recipe, entry_of, kinds, recipe

__all__ = ["ExportError", "architecture", "export", "formats"]


def _recipes(modes=None) -> dict[str, tuple[str, Recipe]]:
    """{the architecture an artifact's config.json records: (its registry entry's label, its recipe)}."""
    return {recipe(kind, modes).saved_as: (entry_of(kind, modes).artifact_label, recipe(kind, modes))
            for kind in kinds(modes)}


def formats(modes=None) -> dict[str, tuple[str, ...]]:
    """Every artifact architecture's export formats, the default first."""
    return {arch: how.formats for arch, (_, how) in _recipes(modes).items()}


def architecture(source: Path, modes=None) -> str:
    """The architecture of the `train` output in `source` (a key of `formats`); ExportError saying why not."""
    config_path = Path(source) / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{source} has no config.json: not a directory written by `python -m app train`")
    try:
        data = json.loads(config_path.read_text())
    except ValueError as err:
        raise ExportError(f"{config_path} is not JSON: {err}") from err
    arch = data.get("architecture") if isinstance(data, dict) else None
    known = _recipes(modes)
    if arch not in known:
        hint = " (it looks exported already)" if isinstance(data, dict) and ("eagle_config" in data or "medusa_num_heads" in data) else ""
        raise ExportError(f"{source} holds no artifact of `python -m app train`{hint}: expected one of "
                          f"{', '.join(known)} in its config.json's \"architecture\"")
    return arch


def export(source: Path, out: Path, base_model: str | None = None, format: str | None = None, modes=None) -> Path:
    """Write the artifact in `source` to `out` in `format` (its recipe's formats; None = the default). The base
    model defaults to the one the artifact was trained for. Returns `out`."""
    source, out = Path(source), Path(out)
    label, how = _recipes(modes)[architecture(source, modes)]
    fmt = format or how.formats[0]
    if fmt not in how.formats:
        raise ExportError(f"a {label} exports as {' or '.join(how.formats)}, not '{fmt}'")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory: choose a new --output-dir")
    base_model = base_model or json.loads((source / "config.json").read_text()).get("base_model")
    if not base_model:
        raise ExportError(f"{source} does not say which model it was trained for: pass --model")
    how.export(source, out, base_model, fmt)
    return out
