"""The target's forward compiled with torch.compile (inductor), for the one-token passes of every mode.

Eager transformers spends a quarter to a third of a one-token pass of a small model on CPU outside
its matrix products: a few hundred small element-wise kernels (RMSNorm, RoPE, SiLU, residuals) and
the Python that dispatches them. Inductor fuses those; its freezing makes the weights constants, but
with torch 2.13 here it leaves the products unpacked (plain `aten::mm`, docs/benchmarks.md). The cache (kv_cache.SlotLayer) gives every pass the same
shapes apart from its width and the session's slot count, which the graph takes as symbols. Only the
one-token pass runs compiled: for 2+ tokens the dynamic-width graph multiplies unpacked weights, and
the eager packed layers over the same slots are faster (a 2-8 token pass 1.6-1.7 one-token passes
compiled, against 1.1-1.3 eagerly). `warm_up` compiles that graph before the first request; after
it nothing recompiles (tests/test_compiled.py).

Compiling costs about a minute on a 2-core machine. Inductor's caches are saved under the artifact
store after the first warm-up and loaded before the next: that spares code generation (77 -> 55 s
here), not Dynamo's tracing nor AOTAutograd with freezing, which make up the rest (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from app.decoding.target import TransformersTarget


def compile_forward(model: torch.nn.Module):
    """The model's forward, compiled for passes over its slot cache (no graph is built until called)."""
    # dynamic: the pass width and the slot count are symbols from the first call on, not recompiled per value.
    # freezing: the weights are constants of the graph, so inductor may pack them (inference only).
    return torch.compile(model, dynamic=True, options={"freezing": True})


def cache_file(store: Path, model_name: str, dtype: str) -> Path:
    """Where the compile caches of this model, dtype and torch build live in the artifact store."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    return Path(store) / "compiled" / f"{safe}-{dtype}-torch{torch.__version__}.bin"


def warm_up(model: torch.nn.Module, forward, cache: Path | None = None) -> dict:
    """Build the graph now, through a real session (prefill, a one-token pass). With `cache`: inductor's caches
    are read from it first when it exists, and written to it after a warm-up that had to compile. Returns what
    it took."""
    loaded = False
    if cache is not None and cache.is_file():
        try:
            loaded = torch.compiler.load_cache_artifacts(cache.read_bytes()) is not None
        except Exception:  # a cache from another build is only a slower start
            loaded = False
    start = time.perf_counter()
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = [i % vocab for i in range(1, 17)]
    session = TransformersTarget(model, forward=forward)
    session.prefill(ids)
    session.forward(ids[0], [], [])
    seconds = time.perf_counter() - start
    if cache is not None and not loaded:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_bytes(artifacts[0])
            tmp.replace(cache)
    return {"seconds": round(seconds, 1), "cache": "loaded" if loaded else "built" if cache is not None else "none"}
