"""Where one target pass's time goes (issue 34): the project's pass (TransformersTarget) over k = 1..32 tokens with a
tree mask at a short and a long context, timed and broken down by torch.profiler; and vLLM's autoregressive step at
the same contexts (the gap between streamed tokens of a running engine).

    python scripts/profile_pass.py [--dtype float32] [--vllm] > profile.md

Run it on a quiet machine: it measures speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import models  # noqa: E402
from app.decoding.target import TransformersTarget  # noqa: E402
from app.prompts import load_prompts  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)
CONTEXTS = (128, 1024)
# aten op -> what it is part of in a Llama pass (self CPU time, so nested ops are not counted twice)
CATEGORIES = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("attention", ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::softmax", "aten::_softmax",
                   "aten::baddbmm")),
    ("cache (cat/copy)", ("aten::cat", "aten::copy_", "aten::index_select", "aten::slice_scatter", "aten::index_copy")),
    ("norm, RoPE, SiLU (elementwise)", ("aten::mul", "aten::add", "aten::rsqrt", "aten::pow", "aten::mean",
                                        "aten::silu", "aten::neg", "aten::sub", "aten::div", "aten::cos",
                                        "aten::sin", "aten::to", "aten::_to_copy", "aten::where", "aten::masked_fill")),
)


def tree_parents(n: int) -> list[int]:
    """A binary tree of n nodes (parent of node i is (i - 1) // 2, the root's children first): a real tree mask."""
    return [-1 if i < 2 else (i - 2) // 2 for i in range(n)]


def context_ids(target, length: int) -> list[int]:
    text = " ".join(p["text"] for p in load_prompts(None, None, 2))
    ids = target.encode(text)
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


def session_at(target, ids):
    s = TransformersTarget(target.model, hidden_states=False, forward=target.forward)
    s.prefill(ids)
    return s


def rewind(s) -> None:
    """Drop what the last forward fed: the cache holds the context again (a slot cache needs nothing: the next
    pass writes over the same slots)."""
    if not s.slotted:
        s.cache.crop(-s.fed)
    s.fed = 0


def timed(target, ids, k: int, repeats: int = 7) -> float:
    """Median ms of a pass over the root and k - 1 tree nodes after `ids` (the cache is cropped back each time)."""
    s = session_at(target, ids)
    tokens, parents = ids[: k - 1], tree_parents(k - 1)
    out = []
    for r in range(repeats + 1):
        t = time.perf_counter()
        s.forward(ids[-1], tokens, parents)
        elapsed = time.perf_counter() - t
        rewind(s)
        if r:
            out.append(1000 * elapsed)
    return statistics.median(out)


def breakdown(target, ids, k: int, repeats: int = 5) -> dict[str, float]:
    """ms per pass by category (self CPU time), plus what no aten op accounts for (Python, dispatch)."""
    s = session_at(target, ids)
    tokens, parents = ids[: k - 1], tree_parents(k - 1)
    s.forward(ids[-1], tokens, parents)
    rewind(s)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(repeats):
            s.forward(ids[-1], tokens, parents)
            rewind(s)
        wall = 1000 * (time.perf_counter() - t) / repeats
    parts: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1000 / repeats
        name = next((c for c, ops in CATEGORIES if any(e.key.startswith(op) for op in ops)), "other aten")
        parts[name] += ms
    parts["outside aten ops (Python, dispatch, profiler)"] = max(0.0, wall - sum(parts.values()))
    parts["wall"] = wall
    return dict(parts)


def lm_head_ms(target, k: int, repeats: int = 20) -> float:
    head = target.model.get_output_embeddings()
    x = torch.randn(1, k, head.weight.shape[1], dtype=head.weight.dtype)
    with torch.inference_mode():
        head(x)
        t = time.perf_counter()
        for _ in range(repeats):
            head(x)
    return 1000 * (time.perf_counter() - t) / repeats


def vllm_steps(dtype: str, contexts) -> dict[int, float]:
    """Median ms between streamed tokens of vLLM's autoregressive engine (compiled, as vLLM runs by default) after
    a prompt of each context length."""
    from app.service.api import Service
    from app.backends.base import Prompt

    service = Service()
    try:
        target = models.load(models.BUNDLED, dtype="float32")
        out = {}
        for n in contexts:
            prompt = Prompt(target.decode(context_ids(target, n)), raw=True)
            request = {"speculative_config": {"decoding_type": "Autoregressive"}, "backend": "vllm", "dtype": dtype,
                       "max_new_tokens": 64, "sampling": {"temperature": 0.0}}
            for _ in range(2):  # the first run warms the engine (and starts it)
                gaps, last = [], None
                for message in service.stream(request, prompt):
                    if message.get("tokens"):  # a step's message
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(1000 * (now - last))
                        last = now
            out[n] = statistics.median(gaps[2:]) if len(gaps) > 4 else float("nan")
        return out
    finally:
        service.close()


def bandwidth() -> float:
    """GB/s this machine reads memory at: the median of 7 sums over 512 MB (far past the caches)."""
    x = torch.ones(128 << 20, dtype=torch.float32)
    times = []
    for _ in range(8):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times[1:]) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--vllm", action="store_true", help="also time vLLM's autoregressive step (starts an engine)")
    ap.add_argument("--eager", action="store_true", help="the eager pass (default: the fast pass, app/decoding/compiled.py, "
                    "built first when it is not)")
    ap.add_argument("--no-breakdown", action="store_true", help="only the timings")
    args = ap.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    target = models.load(models.BUNDLED, dtype=args.dtype, fast="eager" if args.eager else "build")
    print(f"## One pass of the bundled model, {args.dtype}, {target.fast['note']}, torch threads {torch.get_num_threads()}\n")
    print(f"Loading took {time.perf_counter() - start:.0f} s\n")
    gbps = bandwidth()
    weights = sum(p.numel() * p.element_size() for p in target.model.parameters())
    print(f"Memory floor: the weights {weights / 1e6:.0f} MB read once at {gbps:.1f} GB/s (the median of 7 sums over a "
          f"512 MB tensor on {torch.get_num_threads()} threads) = {weights / gbps / 1e6:.1f} ms a token\n")
    print("| context | " + " | ".join(f"k={k}" for k in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for n in CONTEXTS:
        ids = context_ids(target, n)
        ms = [timed(target, ids, k) for k in SIZES]
        print(f"| {n} | " + " | ".join(f"{m:.1f} ms" for m in ms) + " |")
    print(f"\nThe LM head alone (49152 x 576): k=1 {lm_head_ms(target, 1):.1f} ms, k=32 {lm_head_ms(target, 32):.1f} ms "
          "(a verify pass needs the logits of every node)\n")
    if args.no_breakdown:
        return
    cats = [c for c, _ in CATEGORIES] + ["other aten", "outside aten ops (Python, dispatch, profiler)"]
    cols = [(n, k) for n in CONTEXTS for k in (1, 16)]
    rows = {col: breakdown(target, context_ids(target, col[0]), col[1]) for col in cols}
    print("| ms per pass (self CPU time) | " + " | ".join(f"ctx {n}, k={k}" for n, k in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for c in [*cats, "wall"]:
        print(f"| {c} | " + " | ".join(f"{rows[col].get(c, 0.0):.1f}" for col in cols) + " |")
    if args.vllm:
        steps = vllm_steps(args.dtype, CONTEXTS)
        print("\nvLLM 0.32 for CPU, autoregressive (compiled), median ms between streamed tokens: "
              + ", ".join(f"context {n}: {m:.1f} ms" for n, m in steps.items()))


if __name__ == "__main__":
    main()
