"""One small training loop for every draft artifact (Medusa heads, EAGLE module, distilled draft)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from app.training.data import Batch, FeatureSet

LossFn = Callable[[Batch], torch.Tensor]


def fit(
    module: torch.nn.Module,
    loss_fn: LossFn,
    features: FeatureSet,
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 8,
    seq_len: int = 256,
    warmup: int = 20,
    grad_clip: float = 0.5,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    seed: int = 0,
    bf16: bool = False,
    save_steps: int | None = None,
    save_fn: Callable[[int], None] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> list[float]:
    """AdamW with linear warm-up and cosine decay over the module's trainable parameters.

    `loss_fn(batch)` is called on each Batch of `features.batches`; `epochs` may be
    fractional. `bf16` runs forward and backward under CPU autocast (about 2x faster here; the
    master weights stay float32). Returns the loss of every step.
    """
    torch.manual_seed(seed)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the module has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    per_epoch = math.ceil(len(features) / batch_size)
    total = max(1, int(per_epoch * epochs))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    module.train()
    losses: list[float] = []
    step, epoch = 0, 0
    while step < total:
        for batch in features.batches(batch_size, seq_len, seed=seed + epoch):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            step += 1
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(step, total, losses[-1])
            if save_fn is not None and save_steps and step % save_steps == 0:
                save_fn(step)
            if step >= total:
                break
        epoch += 1
    module.eval()
    return losses
