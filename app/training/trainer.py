"""One small training loop for every draft artifact (Medusa heads, EAGLE module, distilled draft)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from app.training.data import Batch, FeatureSet, atomic_write

LossFn = Callable[[Batch], torch.Tensor]


class Stopped(Exception):
    """fit() reached its time limit and saved its state; fit() with the same arguments and state continues the run."""

    def __init__(self, step: int, total: int, losses: list[float]):
        super().__init__(f"stopped at the time limit after step {step} of {total}")
        self.step, self.total, self.losses = step, total, losses


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
    time_limit: float | None = None,
    state: Path | None = None,
    save_every: float | None = None,
    saved: Callable[[int, int, list[float]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[float]:
    """AdamW with linear warm-up and cosine decay over the module's trainable parameters.

    `loss_fn(batch)` is called on each Batch of `features.batches`; `epochs` may be
    fractional. `bf16` runs forward and backward under CPU autocast (about 2x faster here; the
    master weights stay float32). Returns the loss of every step of the run.

    `time_limit`: seconds (by `clock`) this call may train. The step that reaches it is the last: everything
    the rest of the run depends on is written to the file `state` and Stopped is raised. When `state` exists,
    fit continues from it, and the module ends exactly as one uninterrupted run leaves it.

    `save_every`: seconds (by `clock`) between writes of `state` while the run goes on, so a run killed between them
    (out of memory, a session's end) continues from the last one; `saved(step, total, losses)` is told of each.
    """
    start = clock()
    if (time_limit is not None or save_every is not None) and state is None:
        raise ValueError("a time limit or periodic saves need a state file to save the run in")
    torch.manual_seed(seed)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    if not params:
        raise ValueError("the module has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    per_epoch = math.ceil(len(features) / batch_size)
    total = max(1, int(per_epoch * epochs))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    # A state continues only the run that wrote it: the same steps over the same data with the same module.
    run = {"total": total, "sequences": len(features), "lr": lr, "batch_size": batch_size, "seq_len": seq_len,
           "warmup": warmup, "grad_clip": grad_clip, "weight_decay": weight_decay, "betas": list(betas), "seed": seed,
           "bf16": bf16, "params": {n: list(p.shape) for n, p in named}}
    step, epoch, position, losses = 0, 0, 0, []
    if state is not None and state.exists():
        saved = torch.load(state, weights_only=True)
        differ = [k for k in run if saved["run"].get(k) != run[k]]
        if differ:
            raise ValueError(f"{state} holds another run (its {', '.join(differ)} differ)")
        with torch.no_grad():
            for n, p in named:
                p.copy_(saved["params"][n])
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])  # loss functions draw noise and positions from torch's global RNG
        step, epoch, position, losses = saved["step"], saved["epoch"], saved["position"], list(saved["losses"])
    def keep() -> None:
        state.parent.mkdir(parents=True, exist_ok=True)
        kept = {"run": run, "params": {n: p.detach().clone() for n, p in named}, "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "rng": torch.get_rng_state(), "step": step, "epoch": epoch,
                "position": position, "losses": losses}
        atomic_write(state, lambda tmp: torch.save(kept, tmp))  # a session killed meanwhile keeps the last state

    last_kept = clock() if save_every is not None else 0.0  # a clock read only when saving (tests tick it)
    module.train()
    while step < total:
        # An epoch's batch order depends on its seed alone, so skipping the batches done resumes it.
        for batch in itertools.islice(features.batches(batch_size, seq_len, seed=seed + epoch), position, None):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            step += 1
            position += 1
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(step, total, losses[-1])
            if save_fn is not None and save_steps and step % save_steps == 0:
                save_fn(step)
            if step >= total:
                break
            if time_limit is not None and clock() - start >= time_limit:
                keep()
                module.eval()
                raise Stopped(step, total, losses)
            if save_every is not None and clock() - last_kept >= save_every:
                keep()
                last_kept = clock() if save_every is not None else 0.0  # a clock read only when saving (tests tick it)
                if saved is not None:
                    saved(step, total, losses)
        epoch, position = epoch + 1, 0
    module.eval()
    return losses

