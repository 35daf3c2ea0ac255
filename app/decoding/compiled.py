"""The target's forward compiled with torch.compile (inductor), for the passes of every mode.

Two things make it fast on a CPU. Inductor fuses the few hundred small element-wise kernels (RMSNorm,
RoPE, SiLU, residuals) that eager transformers dispatches one by one. And with freezing and its C++
GEMM template (max-autotune), the weights become constants of the graph that inductor lays out for
its own micro-kernels once, at compile time. Bundled model, 2 cores AVX2: a float32 one-token pass
30 ms instead of 43 with plain products, 16 tokens 68 ms instead of 86 eagerly. In bfloat16 without
native instructions the graph multiplies 3+ rows against float32 copies of the weights (linear.widen),
as the eager layers do: 16 tokens 81 ms against 119 eagerly, one token 25 ms (docs/benchmarks.md).

Dynamo decides whether parameters become constants from inductor's global `freezing` flag while it
traces, not from the options handed to torch.compile (those reach inductor only, too late): traced
without it, freezing finds nothing to freeze. So `warm_up` traces under those options, and builds every
graph a run needs (one token, two tokens where wide products upcast, and any wider); after it nothing
recompiles (tests/test_compiled.py). The cache (kv_cache.SlotLayer) gives every pass the same
shapes apart from its width and the session's slot count, which the graph takes as symbols.

An EAGLE module beside a compiled target runs compiled too (`compile_eagle`, over the drafter's own slot cache):
bundled module, bfloat16, its draft passes take 7.4 ms a step instead of 10.2 eagerly, for 47 s more at start (float32:
9.1 instead of 11.0 ms, 91 s). What is left is mostly Dynamo choosing among the graphs (about 0.5 ms a call) and
reading the layer's weights. Medusa's heads and the draft model stay eager.

Compiling takes minutes on a 2-core machine (autotuning every product shape, then C++ builds of the
kernels), and on every start: inductor's caches cannot store graphs that hold oneDNN-packed weights
("mkldnn tensors unpickleable"), so nothing is kept on disk (docs/benchmarks.md gives the times).
"""

from __future__ import annotations

import time

import torch

from app.decoding import linear
from app.decoding.attention import additive, kv_dtype
from app.decoding.kv_cache import slot_cache, write_at
from app.decoding.target import TransformersTarget


# freezing: the weights are constants of the graph (inference only). max_autotune with the CPP backend:
# inductor's own GEMM kernels over weights it packs at compile time (ATEN stays a choice it may time).
OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def compile_forward(model: torch.nn.Module):
    """The model's forward, compiled for passes over its slot cache (no graph is built until `warm_up`)."""
    linear.widen(model)  # bfloat16 without native instructions: wide products in float32, as eagerly (linear.py)
    # dynamic: the pass width and the slot count are symbols, not recompiled per value.
    return torch.compile(model, dynamic=True, options=OPTIONS)


def warm_up(model: torch.nn.Module, forward) -> dict:
    """Build the graphs now, through a real session (prefill, passes of 1, 2 and 5 tokens). Returns what it
    took."""
    start = time.perf_counter()
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = [i % vocab for i in range(1, 17)]
    session = TransformersTarget(model, forward=forward)
    with torch._inductor.config.patch(OPTIONS):  # what Dynamo reads while tracing (module docstring)
        session.prefill(ids)
        session.forward(ids[0], [], [])
        session.commit([])
        # Width 1 is a graph of its own (Dynamo specializes sizes of 1); so is width 2 where wide products
        # upcast (linear.WIDE_ROWS). The wide one is a tree, as in a run.
        session.forward(ids[1], ids[2:3], [-1])
        session.commit([])
        session.forward(ids[3], ids[4:8], [-1, 0, 0, 1])
    return {"seconds": round(time.perf_counter() - start, 1)}


def compile_eagle(module: torch.nn.Module):
    """An EAGLE module's `hidden_states`, compiled for the drafter's passes over its slot cache (drafters/eagle.py);
    no graph is built until `warm_up_eagle`."""
    linear.widen(module)
    return torch.compile(module.hidden_states, dynamic=True, options=OPTIONS)


@torch.inference_mode()
def warm_up_eagle(module: torch.nn.Module, forward) -> dict:
    """Build the draft's graphs now: passes of one entry and of several, with the target's fused layers (a catch-up
    over committed positions) and without (a tree level), as the drafter makes them. Returns what it took."""
    start = time.perf_counter()
    config, dtype = module.config, module.fc.weight.dtype
    # A slot count no size of the module has: Dynamo would tie the two (duck sizing) and pin the slot count.
    slots = 257
    cache = slot_cache(module.llama_config, slots, kv_dtype(module.llama_config))
    with torch._inductor.config.patch(OPTIONS):  # what Dynamo reads while tracing (module docstring)
        # The first pass fills the cache eagerly (as the drafter's does); then widths 1, 2 (where wide products
        # upcast) and more, as the target's (warm_up).
        for at, n, fused in ((0, 4, True), (4, 5, True), (9, 1, True), (10, 2, True), (12, 3, False), (15, 1, False),
                             (16, 2, False)):
            run = forward if at else module.hidden_states
            write_at(cache, at, n, slots)
            allowed = torch.zeros(n, slots, dtype=torch.bool)
            allowed[:, : at + n] = torch.ones(n, at + n, dtype=torch.bool).tril(at)
            embeds, features = (torch.zeros(1, n, config.hidden_size, dtype=dtype) for _ in range(2))
            aux = None
            if fused and config.aux_layers:
                aux = torch.zeros(1, n, len(config.aux_layers) * config.hidden_size, dtype=dtype)
            run(embeds, features, cache, torch.arange(at, at + n)[None], additive(allowed, dtype)[None, None], aux)
    return {"seconds": round(time.perf_counter() - start, 1)}
