"""Medusa heads (arXiv 2401.10774): K small residual blocks on the target's final normed hidden state.

Head k (0-based) reads the hidden state at position i (the one that produced the logits of token
i+1) and guesses token i+k+2. Every head is `medusa_num_layers` ResBlocks followed by an LM head.
Here all heads share the target's own LM head, frozen and passed in at call time, so an artifact
holds only the ResBlocks (a few MB instead of K vocabulary-sized matrices); the TensorRT-LLM export
writes a copy of it per head, as Medusa's checkpoints have. With `draft_vocab_size` the heads rank
only the target's most frequent tokens (`d2t`, see vocab.py): the rows of that shared head that the
target actually writes, a sixth of the cost per call for the bundled model.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
import torch.nn.functional as F
from torch import nn

from app.heads import artifact, vocab

ARCHITECTURE = "medusa"
WEIGHTS = artifact.WEIGHTS
# TensorRT-LLM's Medusa conversion (tensorrt_llm/models/medusa/weight.py, load_medusa_hf) reads this
# file, or medusa_lm_head.pt, with the keys of Medusa's `medusa_head` ModuleList:
# "{head}.{layer}.linear.weight", "{head}.{layer}.linear.bias", "{head}.{num_layers}.weight".
TRTLLM_WEIGHTS = "medusa_lm_head.safetensors"
_CONFIG_KEYS = ("hidden_size", "vocab_size", "medusa_num_heads", "medusa_num_layers")


class MedusaError(ValueError):
    """A Medusa artifact that cannot be read or does not fit the target."""


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    medusa_num_heads: int = 3
    medusa_num_layers: int = 1
    draft_vocab_size: int | None = None  # rank only this many tokens (d2t); None = the whole vocabulary

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "medusa_num_heads", "medusa_num_layers"):
            if int(getattr(self, name)) < 1:
                raise MedusaError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise MedusaError(f"draft_vocab_size must be in [1, {self.vocab_size}], got {self.draft_vocab_size}")


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)), zero-initialised so a fresh head is the identity (it starts as the LM head)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig, d2t: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.medusa_num_layers)])
            for _ in range(config.medusa_num_heads)
        )
        if config.draft_vocab_size is not None:
            d2t = torch.zeros(config.draft_vocab_size, dtype=torch.long) if d2t is None else torch.as_tensor(d2t, dtype=torch.long)
            reason = vocab.problem(d2t, config.draft_vocab_size, config.vocab_size)
            if reason:
                raise MedusaError(reason)
            self.register_buffer("d2t", d2t.clone())
        elif d2t is not None:
            raise MedusaError("d2t given but the config has no draft_vocab_size")

    @property
    def target_ids(self) -> torch.Tensor | None:
        """The target id of every token the heads rank, in order; None = the whole vocabulary."""
        return vocab.target_ids(self.d2t) if self.config.draft_vocab_size is not None else None

    def head_rows(self, lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of the shared LM head restricted to the ranked tokens (a copy when reduced):
        take it once per generation, not per call."""
        bias = getattr(lm_head, "bias", None)
        ids = self.target_ids
        if ids is None:
            return lm_head.weight, bias
        ids = ids.to(lm_head.weight.device)
        return lm_head.weight[ids], (bias[ids] if bias is not None else None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(num_heads, *hidden.shape): each head's transformed hidden state."""
        hidden = hidden.to(self.medusa_head[0][0].linear.weight.dtype)
        return torch.stack([head(hidden) for head in self.medusa_head])

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module, head=None) -> torch.Tensor:
        """(num_heads, *hidden.shape[:-1], ranked tokens) float32: all heads through the shared LM head
        in one call; column j is target token `target_ids[j]` (j itself for the whole vocabulary).
        `head`: linear.rows(*head_rows(lm_head)), when the caller keeps it across calls."""
        if head is not None:
            return head(self(hidden).to(lm_head.weight.dtype)).float()
        weight, bias = self.head_rows(lm_head)
        return F.linear(self(hidden).to(weight.dtype), weight, bias).float()


# ----------------------------------------------------------------------------- artifacts


def save(heads: MedusaHeads, directory: str | Path, base_model: str) -> Path:
    """Write config.json + model.safetensors (bfloat16, ResBlocks only: the LM head is the target's)."""
    sizes = {k: v for k, v in asdict(heads.config).items() if v is not None}
    config = {"architecture": ARCHITECTURE, **sizes, "base_model": base_model, "shared_lm_head": True}
    return artifact.write(directory, config, heads.state_dict())


def load_config(directory: str | Path) -> dict:
    """The config.json of a Medusa artifact written by `save`, checked."""
    config = artifact.read_config(directory, ARCHITECTURE, "Medusa heads", MedusaError)
    if not config.get("shared_lm_head", False):
        raise MedusaError(f"{directory}: only heads sharing the target's LM head are supported")
    return config


def load(directory: str | Path) -> MedusaHeads:
    """Heads written by `save`, in float32 and eval mode."""
    directory = Path(directory)
    config = load_config(directory)
    if not (directory / WEIGHTS).is_file():
        raise MedusaError(f"no Medusa heads at {directory}: {WEIGHTS} is missing")
    try:
        sizes = {k: int(config[k]) for k in _CONFIG_KEYS}
    except KeyError as e:
        raise MedusaError(f"{directory}/config.json lacks {e.args[0]!r}") from e
    tensors = load_file(str(directory / WEIGHTS))
    heads = MedusaHeads(MedusaConfig(**sizes, draft_vocab_size=config.get("draft_vocab_size")), tensors.get("d2t"))
    _load_state(heads, tensors, directory)
    return heads.eval()


def _load_state(heads: MedusaHeads, tensors: dict[str, torch.Tensor], source) -> None:
    state = heads.state_dict()
    missing = sorted(set(state) - set(tensors))
    unexpected = sorted(set(tensors) - set(state))
    if missing or unexpected:
        raise MedusaError(
            f"{source}: weights do not match the config (missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    for k, v in tensors.items():
        if v.shape != state[k].shape:
            raise MedusaError(f"{source}: {k} has shape {tuple(v.shape)}, expected {tuple(state[k].shape)}")
    heads.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})


def check_compatible(heads: MedusaHeads, target_model: nn.Module) -> None:
    """Raise MedusaError unless the heads were made for a target of this hidden and vocabulary size."""
    artifact.check_sizes("the Medusa heads", heads.config.hidden_size, heads.config.vocab_size, target_model, MedusaError)


def load_beside(directory: str | Path, target_model: nn.Module) -> MedusaHeads:
    """Heads to draft beside `target_model` (the mode entry's `artifact_loader`): loaded and checked against it."""
    heads = load(directory)
    check_compatible(heads, target_model)
    return heads


# ----------------------------------------------------------------------------- training


def medusa_loss(
    heads: MedusaHeads,
    lm_head: nn.Module,
    ids: torch.Tensor,
    hidden: torch.Tensor,
    mask: torch.Tensor,
    head_weights: list[float] | None = None,
    max_positions: int | None = None,
) -> torch.Tensor:
    """Self-distillation loss: head k at position i learns the frozen target's distribution of token i+k+2.

    That teacher distribution is softmax(lm_head(hidden[:, i+k+1])), the target's own prediction
    (hidden states are its final normed ones), so the heads learn what the target will say rather
    than the dataset's text; `ids` is not needed for it. Soft cross-entropy per head, averaged over
    positions where both i and i+k+1 are real tokens (mask), then weighted (default 0.8**k, normalised).
    With a draft vocabulary both distributions are over its tokens (the teacher renormalised there),
    which is what the heads rank at inference.
    hidden: (b, s, H) float; mask: (b, s) bool.

    `max_positions` draws that many random positions per head (torch's global RNG) instead of all:
    both the teacher and the student need the vocabulary-sized head, which is nearly all of the
    cost, while the heads themselves are tiny and learn from fewer positions.
    """
    k_heads = heads.config.medusa_num_heads
    weights = list(head_weights) if head_weights is not None else [0.8**k for k in range(k_heads)]
    if len(weights) != k_heads:
        raise ValueError(f"head_weights needs {k_heads} values, got {len(weights)}")
    norm = sum(weights)
    weight, bias = heads.head_rows(lm_head)
    out = heads(hidden)
    total = out.sum() * 0.0  # keeps the graph when no position is usable
    for k in range(k_heads):
        shift = k + 1
        if hidden.shape[1] <= shift:
            break
        valid = mask[:, :-shift] & mask[:, shift:]
        if not valid.any():
            continue
        source, later = out[k][:, :-shift][valid], hidden[:, shift:][valid]
        if max_positions is not None and len(source) > max_positions:
            pick = torch.randperm(len(source), device=source.device)[:max_positions]
            source, later = source[pick], later[pick]
        with torch.no_grad():
            target = F.linear(later.to(weight.dtype), weight, bias).float().softmax(-1)
        student = F.linear(source.to(weight.dtype), weight, bias).float().log_softmax(-1)
        total = total + (weights[k] / norm) * -(target * student).sum(-1).mean()
    return total


@torch.no_grad()
def head_accuracy(
    heads: MedusaHeads, lm_head: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, max_rank: int = 10
) -> list[list[float]]:
    """acc[k][r]: how often the rank-r guess of head k is the target's own argmax (the paper's a_k^(r)),
    measured on hidden states (b, s, H); the input of `greedy_tree`."""
    logits = heads.logits(hidden, lm_head)  # (K, b, s, ranked tokens)
    ids = heads.target_ids
    truth = lm_head(hidden.to(lm_head.weight.dtype)).argmax(-1)  # (b, s): the target's next token per position
    acc = []
    for k in range(heads.config.medusa_num_heads):
        shift = k + 1
        if hidden.shape[1] <= shift:
            acc.append([0.0] * max_rank)
            continue
        valid = mask[:, :-shift] & mask[:, shift:]
        top = logits[k][:, :-shift][valid].topk(max_rank, dim=-1).indices  # (n, max_rank)
        if ids is not None:
            top = ids.to(top.device)[top]
        hits = (top == truth[:, shift:][valid][:, None]).float()
        acc.append(hits.mean(0).tolist() if len(hits) else [0.0] * max_rank)
    return acc


def greedy_tree(accuracy: list[list[float]], num_nodes: int) -> list[list[int]]:
    """The paper's tree construction: add, one at a time, the rank path with the highest expected
    acceptance prod_d accuracy[d][r_d] (heads assumed independent). Paths come out ordered by
    (depth, path) and every prefix is kept before its extensions, so the tree is ancestor-closed."""
    heap = [(-a, (r,)) for r, a in enumerate(accuracy[0])] if accuracy else []
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < num_nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(list(path))
        if len(path) < len(accuracy):
            for r, a in enumerate(accuracy[len(path)]):
                heapq.heappush(heap, (neg * a, path + (r,)))
    return sorted(chosen, key=lambda p: (len(p), p))


# ----------------------------------------------------------------------------- TensorRT-LLM export


def export_trtllm(
    heads: MedusaHeads,
    lm_head_weight: torch.Tensor,
    directory: str | Path,
    base_model: str,
    dtype: torch.dtype = torch.float16,
) -> Path:
    """Write the heads as a FasterDecoding/Medusa heads checkpoint, the layout TensorRT-LLM's Medusa
    conversion reads (`examples/medusa/convert_checkpoint.py --medusa_model_dir <directory>`):
    config.json (medusa_num_heads, medusa_num_layers, ...) and medusa_lm_head.safetensors with the
    state dict of Medusa's `medusa_head` ModuleList: "{k}.{layer}.linear.weight/bias" and
    "{k}.{num_layers}.weight" (each head's LM head, here a copy of the shared one). A draft
    vocabulary has no place in that layout: TensorRT-LLM and vLLM rank the whole vocabulary with these
    heads. (vLLM 0.32 has `token_map` + `truncated_vocab_size` for one, but its loader cannot load it:
    per-head LM heads keep the whole vocabulary's rows, and with `original_lm_head` the loaded token_map is
    reported as "not initialized from checkpoint".)
    """
    cfg = heads.config
    if tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise MedusaError(
            f"lm_head_weight has shape {tuple(lm_head_weight.shape)}, expected ({cfg.vocab_size}, {cfg.hidden_size})"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        k.removeprefix("medusa_head."): v.detach().to("cpu", dtype).contiguous()
        for k, v in heads.state_dict().items() if k != "d2t"
    }
    lm = lm_head_weight.detach().to("cpu", dtype)
    for k in range(cfg.medusa_num_heads):
        tensors[f"{k}.{cfg.medusa_num_layers}.weight"] = lm.clone()  # safetensors refuses shared storage
    save_file(tensors, str(directory / TRTLLM_WEIGHTS))
    config = {
        "medusa_num_heads": cfg.medusa_num_heads,
        "medusa_num_layers": cfg.medusa_num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "base_model_name_or_path": base_model,
        # vLLM's Medusa loader builds its ResBlocks without biases (and drops ours) unless this says they have them.
        "medusa_fc_bias": True,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_export(directory: str | Path, lm_head_weight: torch.Tensor | None = None) -> MedusaHeads:
    """Load a Medusa heads checkpoint (as written by `export_trtllm`) back into shared-head MedusaHeads.

    Raises MedusaError when the per-head LM heads differ (a checkpoint trained with separate LM
    heads cannot be represented) or differ from `lm_head_weight` when that is given.
    """
    directory = Path(directory)
    if not (directory / "config.json").is_file() or not (directory / TRTLLM_WEIGHTS).is_file():
        raise MedusaError(f"no Medusa heads checkpoint at {directory}: needs config.json and {TRTLLM_WEIGHTS}")
    config = json.loads((directory / "config.json").read_text())
    tensors = {k.removeprefix("medusa_head."): v for k, v in load_file(str(directory / TRTLLM_WEIGHTS)).items()}
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
    lm_heads = [tensors.pop(f"{k}.{num_layers}.weight", None) for k in range(num_heads)]
    if any(w is None for w in lm_heads):
        raise MedusaError(f"{directory}: a head's LM head weight '{{k}}.{num_layers}.weight' is missing")
    reference = lm_heads[0] if lm_head_weight is None else lm_head_weight.to(lm_heads[0].dtype)
    if any(not torch.equal(w, reference) for w in lm_heads):
        raise MedusaError(
            f"{directory}: the heads' LM heads differ from the shared one; only shared-LM-head checkpoints can be read"
        )
    vocab, hidden = lm_heads[0].shape
    heads = MedusaHeads(MedusaConfig(hidden, vocab, medusa_num_heads=num_heads, medusa_num_layers=num_layers))
    _load_state(heads, {f"medusa_head.{k}": v for k, v in tensors.items()}, directory)
    return heads.eval()
