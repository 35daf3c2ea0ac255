"""Distilling the layer draft (app/heads/draft.py) on the target's outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from app.heads import vocab


def distill_loss(draft: torch.nn.Module, lm_head: torch.nn.Module, ids, hidden, mask, temperature: float = 1.0,
                 d2t: torch.Tensor | None = None):
    """KL(target || draft) per position; the target's logits are lm_head(hidden). Over the full
    vocabulary, or over the draft vocabulary `d2t` with both distributions renormalised there."""
    weight = lm_head.weight if d2t is None else lm_head.weight[vocab.target_ids(d2t).to(lm_head.weight.device)]
    out = draft.get_decoder()(input_ids=ids, attention_mask=mask.long()).last_hidden_state[mask]
    logits = F.linear(out.to(weight.dtype), weight).float()
    with torch.no_grad():
        teacher = F.log_softmax(F.linear(hidden[mask].to(weight.dtype), weight).float() / temperature, -1)
    student = F.log_softmax(logits / temperature, -1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")
