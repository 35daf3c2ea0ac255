"""The on-disk form every trained artifact shares: config.json (naming its "architecture") next to
model.safetensors with floating-point weights in bfloat16."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHTS = "model.safetensors"


def write(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stored = {
        k: (v.detach().to("cpu", torch.bfloat16) if v.is_floating_point() else v.detach().cpu()).contiguous()
        for k, v in tensors.items()
    }
    save_file(stored, str(directory / WEIGHTS))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_config(directory: str | Path, architecture: str, what: str, error: type[Exception]) -> dict:
    """The checked config.json of a `what` (e.g. "Medusa heads") artifact; `error` carries the message."""
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise error(f"no {what} at {directory}: config.json is missing")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON: {e}") from e
    if config.get("architecture") != architecture:
        raise error(f"{directory} holds a {config.get('architecture')!r} artifact, not {what}")
    return config


def check_sizes(what: str, hidden_size: int, vocab_size: int, target_model, error: type[Exception]) -> None:
    """Raise `error` unless an artifact made for (hidden_size, vocab_size) fits the target's LM head."""
    vocab, hidden = target_model.get_output_embeddings().weight.shape
    if hidden_size != hidden:
        raise error(f"{what} was made for hidden size {hidden_size} but the target has {hidden}: it belongs to another model")
    if vocab_size != vocab:
        raise error(f"{what} was made for a vocabulary of {vocab_size} tokens but the target has {vocab}: it belongs to another model")
