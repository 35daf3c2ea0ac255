"""EAGLE draft module (arXiv 2401.15077, 2406.16858): one decoder layer that drafts on the target's features.

Entry i of the draft reads `fc(cat(embed(t_{i+1}), f_i))`: the embedding of the token that comes
after position i (the target's own input embedding, frozen, passed in by the caller and never
saved) and a feature f_i, the target's final normed hidden state at position i (the input of its
LM head). `eagle_num_layers` Llama decoder layers and a final RMSNorm turn that into the draft's
guess of f_{i+1}, in the same space as the target's features, so deeper draft steps feed the
draft's own output back as the feature. The draft has its own LM head over a reduced vocabulary:
draft id d is target id d + d2t[d] (ModelOpt's convention), which keeps the LM head cheap on CPU.

This is EAGLE-1's input (features of the last layer, token shifted one ahead) with the parts of
ModelOpt's "eagle" mode without aux hidden states (fc without bias, a full Llama layer, a final
norm, its own reduced LM head, d2t) and an optional EAGLE-3-style training-time-test unroll.
With `EagleConfig.eagle3` it is EAGLE-3 as the engines define it (`Eagle3Layer`), which is what
`export_checkpoint` writes and vLLM / TensorRT-LLM load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.cache_utils import DynamicCache

from app.decoding.attention import additive
from app.heads import artifact, vocab
from app.decoding import attention

ARCHITECTURE = "eagle"
WEIGHTS = artifact.WEIGHTS


class EagleError(ValueError):
    """An EAGLE artifact that cannot be read or does not fit the target."""


@dataclass
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary (what d2t maps into)
    draft_vocab_size: int
    eagle_num_layers: int = 1
    # EAGLE-3-style fusion: the target's hidden states after these layers (transformers' hidden_states
    # indices, 0 = embeddings), concatenated, are mapped by `fc_aux` and added to the final feature of
    # every committed position. None = EAGLE-1's input, the final feature alone.
    aux_layers: list[int] | None = None
    # EAGLE-1's head: the target's own rows for the draft vocabulary, frozen, so an artifact does not
    # carry them (a quarter of the bundled model's module); `load` takes them from the target.
    lm_head_from_target: bool = False
    # EAGLE-3's draft layer instead (arXiv 2503.01840; what TensorRT-LLM's PyTorch backend runs): `fc` maps
    # the fused layers alone (A*H -> H) into the feature h of a committed position, the layer's q/k/v
    # read cat(norm(embed), norm(h)) with h as the residual, and a drafted node reads its parent's
    # output before the final norm. Needs aux_layers; trained on the token loss alone.
    eagle3: bool = False
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    rope_parameters: dict | None = None
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "draft_vocab_size", "eagle_num_layers"):
            if int(getattr(self, name)) < 1:
                raise EagleError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size > self.vocab_size:
            raise EagleError(f"draft_vocab_size {self.draft_vocab_size} exceeds the target vocabulary {self.vocab_size}")
        if self.aux_layers is not None and (not self.aux_layers or min(self.aux_layers) < 0):
            raise EagleError(f"aux_layers must be a non-empty list of hidden-state indices >= 0, got {self.aux_layers}")
        if self.eagle3 and (not self.aux_layers or self.eagle_num_layers != 1):
            raise EagleError("an EAGLE-3 module fuses target layers (aux_layers) into one draft layer (eagle_num_layers = 1)")

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int | None = None, eagle_num_layers: int = 1,
                    aux_layers: list[int] | None = None, lm_head_from_target: bool = False, eagle3: bool = False) -> EagleConfig:
        """A draft shaped like one layer of the target (same attention heads, MLP width, RoPE)."""
        text = target_config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        rope = getattr(text, "rope_parameters", None)
        return cls(
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            vocab_size=text.vocab_size,
            draft_vocab_size=draft_vocab_size or text.vocab_size,
            eagle_num_layers=eagle_num_layers,
            aux_layers=list(aux_layers) if aux_layers else None,
            lm_head_from_target=lm_head_from_target,
            eagle3=eagle3,
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
            max_position_embeddings=int(getattr(text, "max_position_embeddings", 2048) or 2048),
            rope_parameters=dict(rope) if rope else None,
            hidden_act=getattr(text, "hidden_act", "silu"),
        )

    def llama_config(self, attn_implementation: str | None = None) -> LlamaConfig:
        kwargs = dict(rope_parameters=dict(self.rope_parameters)) if self.rope_parameters else {}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        return LlamaConfig(
            # The decoder stack is fed through inputs_embeds: a one-row token embedding is never used.
            vocab_size=1,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.eagle_num_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            hidden_act=self.hidden_act,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            **kwargs,
        )


class Eagle3Layer(nn.Module):
    """EAGLE-3's draft layer ("midlayer"): a Llama layer whose q/k/v read cat(norm(embed), norm(h)),
    with h, not the embedding, as the residual stream. Returns its output before the final norm."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(h, eps)
        self.hidden_norm = LlamaRMSNorm(h, eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn = self.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # 2H inputs: the embedding's half and the feature's
            setattr(attn, name, nn.Linear(2 * h, getattr(attn, name).out_features, bias=config.attention_bias))
        self.post_attention_layernorm = LlamaRMSNorm(h, eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds, hidden, position_embeddings, attention_mask, past_key_values):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                 past_key_values=past_key_values)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def _causal(rows: int, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, rows, past + rows) additive mask: new entry i sees the past and new entries up to i."""
    return additive(torch.ones(rows, past + rows, dtype=torch.bool, device=device).tril(past), dtype)[None, None]


class EagleModule(nn.Module):
    """fc → Llama decoder layer(s) → RMSNorm → own LM head over the draft vocabulary (EAGLE-1/2, with
    optional fused layers); with `config.eagle3`, EAGLE-3's fc over the fused layers → Eagle3Layer →
    RMSNorm → LM head.

    attn_implementation: pass `app.decoding.attention.register()` when the target runs with it
    (float32 attention over a float32 KV cache); None = transformers' sdpa.
    """

    def __init__(self, config: EagleConfig, d2t: torch.Tensor | None = None, attn_implementation: str | None = None) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.llama_config = config.llama_config(attn_implementation or "sdpa")
        if config.eagle3:
            self.fc = nn.Linear(len(config.aux_layers) * h, h, bias=False)
            self.midlayer = Eagle3Layer(self.llama_config)
            self.norm = LlamaRMSNorm(h, config.rms_norm_eps)
            self.rotary_emb = LlamaRotaryEmbedding(self.llama_config)
        else:
            self.fc = nn.Linear(2 * h, h, bias=False)
            if config.aux_layers:
                # Zero at start: the module begins as EAGLE-1 and learns what the other layers add.
                self.fc_aux = nn.Linear(len(config.aux_layers) * h, h, bias=False)
                nn.init.zeros_(self.fc_aux.weight)
            self.model = LlamaModel(self.llama_config)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        d2t = torch.zeros(config.draft_vocab_size, dtype=torch.long) if d2t is None else torch.as_tensor(d2t, dtype=torch.long)
        self.register_buffer("d2t", d2t.clone())
        _check_d2t(self.d2t, config)
        self.base_model: str | None = None  # the target it was trained for, when loaded from disk
        # Its compiled pass for this machine (decoding/compiled.py `draft_pass`), once loaded beside a target that runs
        # its own; None: the drafter runs the module eagerly.
        self.fast = None

    @property
    def target_ids(self) -> torch.Tensor:
        """(draft_vocab_size,) the target id of every draft id."""
        return vocab.target_ids(self.d2t)

    def aux_of(self, layers: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        """(positions, A*H) the fused layers' hidden states out of a target pass's `layers`, or None."""
        return torch.cat([layers[i] for i in self.config.aux_layers], dim=-1) if self.config.aux_layers else None

    def hidden_states(self, embeds, features, past_key_values=None, position_ids=None, attention_mask=None, aux=None) -> torch.Tensor:
        """(b, s, H) the draft's output features: what a child node reads as its feature (`head` turns
        them into logits). embeds = target embedding of the next tokens, features = target (or draft)
        features, both (b, s, H); aux = the target's fused layers (b, s, A*H) of committed positions
        (None for drafted ones); attention_mask is None (causal) or a 4D additive mask over [cache,
        new entries], like the target's tree pass.

        EAGLE-1/2: the output is after the final norm, in the space of the target's final normed hidden
        state, which is the feature of a committed position. EAGLE-3: a committed position's feature is
        fc(aux) (`features` unused), a drafted one's its parent's output before the final norm."""
        return self.decode(embeds, self.stream(features, aux), past_key_values, position_ids, attention_mask)

    def stream(self, features: torch.Tensor, aux: torch.Tensor | None = None) -> torch.Tensor:
        """What enters the draft layer beside the embeddings: for a committed position (aux given) the target's
        features, fused with its other layers (EAGLE-3: fc of them alone); for a drafted one its parent's output.
        Split from `decode` so that the compiled pass (decoding/compiled.py) takes one input for both."""
        dtype = self.fc.weight.dtype
        if self.config.eagle3:
            return self.fc(aux.to(dtype)) if aux is not None else features.to(dtype)
        features = features.to(dtype)
        return features + self.fc_aux(aux.to(dtype)) if aux is not None else features

    def decode(self, embeds, stream, past_key_values=None, position_ids=None, attention_mask=None) -> torch.Tensor:
        """`hidden_states` after `stream`: the draft layer(s) over the embeddings and the stream."""
        embeds = embeds.to(self.fc.weight.dtype)
        if self.config.eagle3:
            return self._eagle3(embeds, stream, past_key_values, position_ids, attention_mask)
        out = self.model(
            inputs_embeds=self.fc(torch.cat([embeds, stream], dim=-1)),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
        )
        return out.last_hidden_state

    def _eagle3(self, embeds, hidden, cache, position_ids, attention_mask):
        s = hidden.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + s, device=hidden.device)[None]
        if attention_mask is None and s > 1:
            # Explicit: a mask-free multi-row call would be causal from the first key, not after the cache.
            attention_mask = _causal(s, past, hidden.dtype, hidden.device)
        return self.midlayer(embeds, hidden, self.rotary_emb(hidden, position_ids), attention_mask, cache)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of `hidden_states`' output."""
        return self.lm_head(self.norm(hidden) if self.config.eagle3 else hidden)

    def forward(self, embeds, features, past_key_values=None, position_ids=None, attention_mask=None, aux=None):
        """(hidden (b, s, H), logits (b, s, draft_vocab_size))."""
        hidden = self.hidden_states(embeds, features, past_key_values, position_ids, attention_mask, aux)
        return hidden, self.head(hidden)


def _check_d2t(d2t: torch.Tensor, config: EagleConfig) -> None:
    reason = vocab.problem(d2t, config.draft_vocab_size, config.vocab_size)
    if reason:
        raise EagleError(reason)


@torch.no_grad()
def init_lm_head(module: EagleModule, target_lm_head: nn.Module) -> None:
    """Start the draft's LM head as the target's rows for the draft vocabulary (EAGLE-1 used the
    target's LM head itself): a draft that predicts the next feature then predicts the next token."""
    weight = target_lm_head.weight[module.target_ids.to(target_lm_head.weight.device)]
    module.lm_head.weight.copy_(weight.to(module.lm_head.weight.dtype))


# ----------------------------------------------------------------------------- artifacts


def _stored(module: EagleModule) -> dict[str, torch.Tensor]:
    """The state an artifact holds: without the LM head when it is the target's."""
    return {k: v for k, v in module.state_dict().items() if not (module.config.lm_head_from_target and k == "lm_head.weight")}


def save(module: EagleModule, directory: str | Path, base_model: str) -> Path:
    """config.json + model.safetensors (weights in bfloat16, d2t int64; the target's embedding, and
    its LM head rows when the module uses them, are not saved)."""
    config = {"architecture": ARCHITECTURE, **asdict(module.config), "base_model": base_model}
    return artifact.write(directory, config, _stored(module))


def load_config(directory: str | Path) -> dict:
    return artifact.read_config(directory, ARCHITECTURE, "an EAGLE module", EagleError)


def read_config(directory: str | Path) -> EagleConfig:
    """The EagleConfig of a `save`d module, without its weights."""
    return _config_from(load_config(directory), directory)


def _config_from(data: dict, source) -> EagleConfig:
    fields = EagleConfig.__dataclass_fields__
    try:
        return EagleConfig(**{k: data[k] for k in fields if k in data})
    except TypeError as e:
        raise EagleError(f"{source}: incomplete EAGLE config ({e})") from e


def load(directory: str | Path, attn_implementation: str | None = None, target_lm_head: nn.Module | None = None) -> EagleModule:
    """A module written by `save`, in float32 and eval mode; `target_lm_head`: the target's LM head,
    which a module with `lm_head_from_target` needs. An EAGLE-3 draft checkpoint (an engine's layout) loads too."""
    directory = Path(directory)
    if is_checkpoint(directory):
        return read_export(directory, attn_implementation)
    data = load_config(directory)
    if not (directory / WEIGHTS).is_file():
        raise EagleError(f"no EAGLE module at {directory}: {WEIGHTS} is missing")
    tensors = load_file(str(directory / WEIGHTS))
    config = _config_from(data, directory)
    if "d2t" not in tensors:
        raise EagleError(f"{directory}: {WEIGHTS} has no d2t")
    module = EagleModule(config, tensors["d2t"], attn_implementation)
    if config.lm_head_from_target:
        if target_lm_head is None:
            raise EagleError(f"{directory}: the module uses its target's LM head; load it with the target")
        if tuple(target_lm_head.weight.shape) != (config.vocab_size, config.hidden_size):
            raise EagleError(f"{directory}: made for a ({config.vocab_size}, {config.hidden_size}) LM head, "
                             f"the target's is {tuple(target_lm_head.weight.shape)}: it belongs to another model")
        init_lm_head(module, target_lm_head)
    _load_state(module, tensors, directory)
    module.base_model = data.get("base_model")
    return module.eval()


def _load_state(module: EagleModule, tensors: dict[str, torch.Tensor], source) -> None:
    state = _stored(module)
    missing, unexpected = sorted(set(state) - set(tensors)), sorted(set(tensors) - set(state))
    if missing or unexpected:
        raise EagleError(f"{source}: weights do not match the config (missing {missing[:4]}, unexpected {unexpected[:4]})")
    for k, v in tensors.items():
        if v.shape != state[k].shape:
            raise EagleError(f"{source}: {k} has shape {tuple(v.shape)}, expected {tuple(state[k].shape)}")
    module.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, strict=False)


def check_compatible(module: EagleModule, target_model: nn.Module) -> None:
    """Raise EagleError unless the module fits this target (hidden size, vocabulary)."""
    made_for = f" (trained for {module.base_model})" if module.base_model else ""
    artifact.check_sizes(f"the EAGLE module{made_for}", module.config.hidden_size, module.config.vocab_size, target_model, EagleError)
    hidden = module.config.hidden_size
    embed = target_model.get_input_embeddings().weight
    if embed.shape[-1] != hidden or embed.shape[0] < int(module.target_ids.max()) + 1:
        raise EagleError(f"the target's input embedding {tuple(embed.shape)} cannot embed the EAGLE draft vocabulary")
    layers = target_model.config.get_text_config(decoder=True).num_hidden_layers
    if module.config.aux_layers and max(module.config.aux_layers) > layers:
        raise EagleError(f"the EAGLE module{made_for} fuses layers {module.config.aux_layers} but the target has {layers}")


def load_beside(directory: str | Path, target_model: nn.Module) -> EagleModule:
    """A module to draft beside `target_model` (the mode entry's `artifact_loader`): loaded with this app's attention
    and the target's LM head where it shares it, and checked against the target."""
    module = load(directory, attn_implementation=attention.register(), target_lm_head=target_model.get_output_embeddings())
    check_compatible(module, target_model)
    return module


# ----------------------------------------------------------------------------- training


def _unroll_mask(s: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, s, step*s) additive mask of unroll step `step` (1-based, >= 2) over the keys of steps 1..step.

    Step j's entry at position i is what a tree node j-1 levels below the root feeds at inference
    (step 1 = the committed entries, the root's included): it sees the committed entries up to
    position i-j+1, its ancestors' entries (step m at position i-j+m) and itself.
    """
    i = torch.arange(s)[:, None]
    k = torch.arange(s)[None, :]
    blocks = [k <= i - step + 1] + [k == i - step + m for m in range(2, step + 1)]
    return additive(torch.cat(blocks, dim=1), dtype)[None, None]


def unroll(module: EagleModule, embeds: torch.Tensor, features: torch.Tensor, steps: int = 1, aux: torch.Tensor | None = None):
    """[(hidden, logits)] of unroll steps 1..steps over a whole sequence, each (b, s, ...).

    Step 1 is the teacher-forced pass: entry i reads (embeds[i], features[i], aux[i]). Step j > 1 (EAGLE-3's
    training-time test) feeds the draft's own guess of f_i, step j-1's output at i-1, so its entry
    at i computes what a tree node j-1 levels deep computes at inference (see `_unroll_mask`);
    rows i < j-1 have no such input chain and are garbage.
    """
    s = embeds.shape[1]
    cache = DynamicCache() if steps > 1 else None
    outs = [module(embeds, features, past_key_values=cache, aux=aux)]
    for j in range(2, steps + 1):
        prev = outs[-1][0]
        shifted = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)
        positions = torch.arange(s, device=embeds.device)[None]
        mask = _unroll_mask(s, j, module.fc.weight.dtype).to(embeds.device)
        outs.append(module(embeds, shifted, cache, positions, mask))
    return outs


def eagle_loss(
    module: EagleModule,
    embed: nn.Module,
    lm_head: nn.Module,
    ids: torch.Tensor,
    hidden: torch.Tensor,
    mask: torch.Tensor,
    ce_weight: float = 0.1,
    noise: float = 0.2,
    steps: int = 1,
    step_decay: float = 0.8,
    aux: torch.Tensor | None = None,
) -> torch.Tensor:
    """EAGLE-1's loss: SmoothL1(f̂_{i+1}, f_{i+1}) + ce_weight * soft CE(draft logits, teacher); an
    EAGLE-3 module (`config.eagle3`) learns from the soft CE alone.

    Entry i reads (embed(ids[i+1]), hidden[i] + noise) and predicts hidden[i+1] and the teacher's
    next-token distribution softmax(lm_head(hidden[i+1])), restricted (renormalised) to the draft
    vocabulary. `noise` is the width of EAGLE-1's uniform feature noise U(-noise/2, noise/2) (EAGLE-1
    uses 0.2 * 512 / seq_len). `steps` > 1 adds EAGLE-3's training-time test (`unroll`): step j
    learns from the draft's own features as a depth-j tree node does, weighted step_decay**(j-1)
    (the total is normalised).
    embed / lm_head: the target's frozen input embedding and LM head (teacher).
    ids (b, s) long, hidden (b, s, H) float, mask (b, s) bool (False on padding), aux (b, s, A*H) the
    target's fused layers when the module has `aux_layers`.
    """
    if (aux is None) != (module.config.aux_layers is None):
        raise EagleError("aux must be given exactly when the module fuses aux_layers")
    if ids.shape[1] < 2:
        return module.fc.weight.sum() * 0.0
    dtype = module.fc.weight.dtype
    with torch.no_grad():
        embeds = embed(ids[:, 1:]).to(dtype)
        target = hidden[:, 1:].float()
        rows = module.target_ids.to(lm_head.weight.device)
        bias = lm_head.bias[rows] if getattr(lm_head, "bias", None) is not None else None
        teacher = F.linear(target.to(lm_head.weight.dtype), lm_head.weight[rows], bias).float().softmax(-1)
    valid = mask[:, 1:] & mask[:, :-1]
    features = hidden[:, :-1].to(dtype)
    if noise and not module.config.eagle3:  # EAGLE-3 reads fc(aux), not these features
        features = features + (torch.rand_like(features) - 0.5) * noise
    total, norm = None, 0.0
    aux = aux[:, :-1] if aux is not None else None
    for j, (out, logits) in enumerate(unroll(module, embeds, features, steps, aux), start=1):
        ok = valid.clone()
        ok[:, : j - 1] = False
        token_loss = -(teacher * logits.float().log_softmax(-1)).sum(-1)
        if module.config.eagle3:  # its output is no target feature: the token loss alone (EAGLE-3's)
            per = token_loss.masked_fill(~ok, 0.0)
        else:
            feature_loss = F.smooth_l1_loss(out.float(), target, reduction="none").mean(-1)
            per = (feature_loss + ce_weight * token_loss).masked_fill(~ok, 0.0)
        loss = step_decay ** (j - 1) * per.sum() / ok.sum().clamp_min(1)
        total = loss if total is None else total + loss
        norm += step_decay ** (j - 1)
    return total / norm


# ----------------------------------------------------------------------------- EAGLE-3 checkpoints for engines

EXPORT_WEIGHTS = "model.safetensors"
# The engines' EAGLE-3 checkpoints differ in how `eagle_aux_hidden_state_layer_ids` numbers the captured layers.
# vLLM captures the residual stream *before* decoder layer i, i.e. after i layers: transformers' hidden_states[i],
# our own numbering. ModelOpt, which defines the field, hooks the *output* of decoder layer i, hidden_states[i + 1]
# (modelopt/torch/speculative/plugins/transformers.py, 0.37), and TensorRT-LLM captures the same (its default
# {1, L//2-1, L-4} is vLLM's {2, L//2, L-3}); TensorRT-LLM reads them from Eagle3DecodingConfig.eagle3_layers_to_capture,
# not from the checkpoint. Both layouts name the layer `midlayer.*`: ModelOpt 0.37 exports that name, TensorRT-LLM
# 1.2.0rc2 loads only that name, and vLLM maps it itself. (Later ModelOpt writes `layers.0.*`; `read_export` takes it.)
LAYOUTS = {"eagle3": 0, "modelopt": 1}  # layout -> what to subtract from a hidden-state index


class OldFormatError(EagleError):
    """A module of this project's earlier EAGLE-1/2-style design, which no engine loads."""


def _export_name(key: str) -> str | None:
    if key.startswith("rotary_emb."):
        return None  # RoPE tables: the config's rope parameters
    return key  # fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t


def aux_layers_of(config: dict) -> list[int] | None:
    """The target layers an EAGLE-3 checkpoint's config.json says its fc reads, as hidden-state indices (our
    numbering), or None when it does not say. Ours state the layers themselves (`specdec.aux_layers`); another
    trainer's `eagle_config.eagle_aux_hidden_state_layer_ids` are read as the field's definer, ModelOpt, numbers
    them, whatever the checkpoint's key names (ModelOpt 0.37 exports `midlayer.*`, later versions `layers.0.*`)."""
    ours = config.get("specdec") or {}
    if ours.get("aux_layers"):
        return [int(i) for i in ours["aux_layers"]]
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        return None
    layout = ours.get("layout") if ours.get("layout") in LAYOUTS else "modelopt"
    return [int(i) + LAYOUTS[layout] for i in ids]


def tensor_shapes(directory: str | Path) -> dict[str, list[int]]:
    """Name -> shape of an exported checkpoint's tensors, read from the file's header (no weights loaded)."""
    from safetensors import safe_open

    with safe_open(str(Path(directory) / EXPORT_WEIGHTS), "pt") as f:
        return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}


def check_exportable(cfg: EagleConfig) -> None:
    """Raise OldFormatError unless a module of this config is an EAGLE-3 module (what engines load)."""
    if not cfg.eagle3:
        h = cfg.hidden_size
        raise OldFormatError(
            f"this EAGLE module is the project's earlier design (fc [{h}, {2 * h}] over the next token's embedding and "
            f"the final hidden state{', plus fc_aux over the fused layers' if cfg.aux_layers else ''}, then a plain Llama "
            "layer), which no engine loads: vLLM, SGLang and TensorRT-LLM load EAGLE-3 checkpoints only. Train an "
            "EAGLE-3 module (python -m app train --mode eagle --eagle3) and export that")


def export_checkpoint(module: EagleModule, directory: str | Path, base_model: str, layout: str = "eagle3",
                      dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write an EAGLE-3 module as the EAGLE-3 draft checkpoint engines load (docs/training.md#export).

    model.safetensors: `fc` (H, A*H) over the captured layers' hidden states side by side, `midlayer.self_attn.
    {q,k,v}_proj` (., 2H) over cat(input_layernorm(embed), hidden_norm(h)), `midlayer.self_attn.o_proj`,
    `midlayer.mlp.{gate,up,down}_proj`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}`,
    `norm`, `lm_head` (draft_vocab_size, H), `d2t` (target id = draft id + d2t[draft id]) and `t2d` (which
    target ids the draft vocabulary holds). config.json: a Llama config of one layer with `draft_vocab_size`,
    `target_hidden_size` and `eagle_config` naming the captured layers in `layout`'s numbering (LAYOUTS).
    The "modelopt" layout is ModelOpt 0.37's export: the same names, ModelOpt's numbering, no `t2d`."""
    check_exportable(module.config)
    if layout not in LAYOUTS:
        raise EagleError(f"unknown EAGLE-3 layout '{layout}': choose one of {', '.join(LAYOUTS)}")
    cfg = module.config
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, value in module.state_dict().items():
        name = _export_name(key)
        if name is not None:
            value = value.detach().cpu()
            tensors[name] = (value.to(dtype) if value.is_floating_point() else value).contiguous()
    if layout == "eagle3":
        tensors["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, module.target_ids, True)
    save_file(tensors, str(directory / EXPORT_WEIGHTS))
    rope = dict(cfg.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    layer_ids = [i - LAYOUTS[layout] for i in cfg.aux_layers]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "target_hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope,
        "rope_parameters": rope,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": layer_ids,
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "use_mtp_layernorm": False,
        },
        # Ours (engines ignore it): the layout, the base model, and the layers in transformers' numbering.
        "specdec": {"architecture": ARCHITECTURE, "layout": layout, "base_model": base_model,
                    "aux_layers": cfg.aux_layers, "eagle3_layers_to_capture": [i - 1 for i in cfg.aux_layers]},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def is_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` holds an EAGLE-3 draft checkpoint (an engine's layout) rather than a `train` output."""
    try:
        data = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "eagle_config" in data


def read_export(directory: str | Path, attn_implementation: str | None = None) -> EagleModule:
    """An EAGLE-3 draft checkpoint (ours from `export_checkpoint`, or another trainer's in the same layout:
    `midlayer.*` or `layers.0.*`) as an EagleModule in float32, eval mode."""
    directory = Path(directory)
    if not (directory / "config.json").is_file() or not (directory / EXPORT_WEIGHTS).is_file():
        raise EagleError(f"no EAGLE-3 draft checkpoint at {directory}: needs config.json and {EXPORT_WEIGHTS}")
    data = json.loads((directory / "config.json").read_text())
    eagle_config = data.get("eagle_config") or {}
    ours = data.get("specdec") or {}
    if not eagle_config.get("use_aux_hidden_state", True):
        raise EagleError(f"{directory}: not an EAGLE-3 checkpoint (eagle_config.use_aux_hidden_state is false)")
    if int(data.get("num_hidden_layers", 1)) != 1:
        raise EagleError(f"{directory}: a draft of {data['num_hidden_layers']} layers; this app runs one-layer EAGLE-3 modules")
    for unsupported in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        if data.get(unsupported) or eagle_config.get(unsupported):
            raise EagleError(f"{directory}: the EAGLE-3 variant with {unsupported} is not one this app runs")
    aux = aux_layers_of(data)
    if aux is None:
        raise EagleError(f"{directory}: the checkpoint does not name the target layers it reads "
                         "(eagle_config.eagle_aux_hidden_state_layer_ids)")
    raw = load_file(str(directory / EXPORT_WEIGHTS))
    tensors = {"midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k: v for k, v in raw.items()}
    h = int(data["hidden_size"])
    if "fc.weight" in tensors and tensors["fc.weight"].shape[-1] != len(aux) * h:
        raise EagleError(f"{directory}: fc takes {tensors['fc.weight'].shape[-1]} inputs, expected {len(aux)} layers x {h}")
    config = _config_from({**data, "eagle_num_layers": 1, "aux_layers": aux, "eagle3": True,
                           "draft_vocab_size": data.get("draft_vocab_size") or data["vocab_size"]}, directory)
    tensors.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))  # none: the whole vocabulary
    tensors.pop("t2d", None)
    tensors.pop("embed_tokens.weight", None)  # a copy of the target's embedding, which the drafter takes from the target
    module = EagleModule(config, tensors["d2t"], attn_implementation)
    state = {key: value if _export_name(key) is None else tensors.get(_export_name(key))
             for key, value in module.state_dict().items()}
    if any(v is None for v in state.values()):
        raise EagleError(f"{directory}: missing weights {[k for k, v in state.items() if v is None][:4]}")
    _load_state(module, state, directory)
    module.base_model = ours.get("base_model")
    return module.eval()
