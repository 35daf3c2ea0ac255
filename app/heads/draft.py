"""The layer draft for draft_target: a few of the target's own layers (app/training/draft.py distils them), and
its file format.

The draft is an ordinary transformers causal LM (same architecture class, same tokenizer, fewer
layers), so it loads like any other model. Its layers start as copies of evenly spaced target
layers (first and last included); embeddings and LM head are the target's and stay frozen, so
training only has to teach the kept layers (and the final norm) to stand in for the dropped ones.
With a draft vocabulary (`d2t`) the loss, like the drafter at inference, covers only the target's
most frequent tokens, and the model directory carries it in DRAFT_VOCAB next to its weights.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from app.heads import artifact

ARCHITECTURE = "layer_draft"
DRAFT_VOCAB = "draft_vocab.safetensors"  # in a draft model's directory: {"d2t": ...}, read by models.load


def pick_layers(num_layers: int, keep: int) -> list[int]:
    """`keep` evenly spaced layer indices of a `num_layers`-layer model, first and last included."""
    if not 1 <= keep <= num_layers:
        raise ValueError(f"the draft keeps between 1 and {num_layers} layers, got {keep}")
    if keep == 1:
        return [0]
    return sorted({round(i * (num_layers - 1) / (keep - 1)) for i in range(keep)})


def make_draft(target: torch.nn.Module, keep: int | list[int]) -> torch.nn.Module:
    """A float32 copy of `target` that keeps `keep` of its decoder layers (a count or the indices);
    only those layers and the final norm train."""
    layers = pick_layers(target.config.num_hidden_layers, keep) if isinstance(keep, int) else sorted(keep)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    draft = type(target)(config).to(torch.float32)
    source = target.state_dict()
    state = {}
    for key, value in source.items():
        if ".layers." in key:
            prefix, rest = key.split(".layers.", 1)
            index, tail = rest.split(".", 1)
            if int(index) not in layers:
                continue
            key = f"{prefix}.layers.{layers.index(int(index))}.{tail}"
        state[key] = value.float()
    draft.load_state_dict(state, strict=False)
    draft.tie_weights()
    draft.requires_grad_(False)
    for layer in draft.get_decoder().layers:
        layer.requires_grad_(True)
    draft.get_decoder().norm.requires_grad_(True)
    draft.config.specdec_draft = {"kept_layers": layers, "base_layers": target.config.num_hidden_layers}
    return draft


def _trained(key: str) -> bool:
    return ".layers." in key or key.endswith(".norm.weight")


def save_layers(draft: torch.nn.Module, directory: Path, base_model: str, d2t: torch.Tensor | None = None) -> None:
    """The trained part only (the kept layers and final norm, bfloat16; the draft vocabulary) plus what
    rebuilds the rest from the base model."""
    meta = {"architecture": ARCHITECTURE, "base_model": base_model, **draft.config.specdec_draft}
    tensors = {k: v for k, v in draft.state_dict().items() if _trained(k)}
    if d2t is not None:
        tensors["d2t"] = d2t
    artifact.write(directory, meta, tensors)


def read_layers(directory: Path) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor | None]:
    """(meta, trained weights, d2t or None)."""
    meta = artifact.read_config(directory, ARCHITECTURE, f"a '{ARCHITECTURE}' draft", ValueError)
    tensors = load_file(str(directory / artifact.WEIGHTS))
    d2t = tensors.pop("d2t", None)
    return meta, tensors, d2t


def rebuild(base: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """The full draft model: the base model's embeddings, norm and head with the checkpoint's layers."""
    meta, layers, _ = read_layers(directory)
    if meta["base_layers"] != base.config.num_hidden_layers:
        raise ValueError(
            f"the draft in {directory} was cut from a {meta['base_layers']}-layer model, "
            f"but the base model has {base.config.num_hidden_layers} layers"
        )
    draft = make_draft(base, meta["kept_layers"])
    missing = set(k for k in draft.state_dict() if ".layers." in k) - set(layers)
    if missing:
        raise ValueError(f"the draft checkpoint in {directory} lacks {sorted(missing)[:3]}...")
    draft.load_state_dict({k: v.float() for k, v in layers.items()}, strict=False)
    return draft.eval()


def write_model(base: torch.nn.Module, tokenizer, directory: Path, out: Path, draft_vocab: bool = True) -> None:
    """A complete Hugging Face model directory of the layer draft in `directory`, loadable by name like any
    model; with `draft_vocab`, also its draft vocabulary (DRAFT_VOCAB), which this app reads and engines do
    not (vLLM's loader refuses a weights file it has no parameter for: an engine scores the full head)."""
    draft = rebuild(base, directory)
    draft.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _, _, d2t = read_layers(directory)
    if d2t is not None and draft_vocab:
        save_file({"d2t": d2t.contiguous()}, str(Path(out) / DRAFT_VOCAB))


def read_draft_vocab(model_dir: Path) -> torch.Tensor | None:
    """The d2t a draft model directory carries (DRAFT_VOCAB), or None."""
    path = Path(model_dir) / DRAFT_VOCAB
    return load_file(str(path))["d2t"] if path.is_file() else None
