"""The fast pass: a model's forward over a slot cache, compiled ahead of time (AOTInductor) and kept on disk.

What makes a pass fast on a CPU is what inductor does to it: the few hundred small element-wise kernels of eager
transformers (RMSNorm, RoPE, SiLU, residuals) fused, the weights frozen into the graph and packed once for its own C++
GEMM micro-kernels (max-autotune). Compiled just in time (torch.compile) that cost every start 6-9 minutes on a 2-core
CPU: inductor's caches refuse a graph that holds oneDNN-packed weights, so nothing could be reused (measured here: a
second start with every kernel cache warm took as long). Compiled ahead of time, the graphs, their C++ kernels and the
packed weights are one package per graph, written once per machine and loaded in a second or two by a later start.
A call also skips Dynamo (its guards and bytecode cost ~3 ms a pass), since the package's runner takes tensors.

The exported function is the model's forward over a slot cache (kv_cache.SlotLayer): a pass writes its n entries at
the committed length and attends to every slot under the caller's mask, so passes differ only in their width n and
the slot count, both symbols of the graph: nothing is ever recompiled. Two graphs: n = 1 (the autoregressive step,
whose products read each weight once) and n = 2..SMALL_QUERY (verify passes, whose products are compute). Wider
passes and the prefill run eagerly over the same cache. In bfloat16 without native instructions the wide graph
multiplies against float32 copies of the weights (linear.widen), as the eager layers do.

What a package holds depends on the CPU it was built on (its vector instructions, the thread count the kernels were
built for), the torch version, the model's weights and dtype: `key` names all of them, so a package is only ever
loaded where it was built for.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import Cache

from app.decoding import linear
from app.decoding.attention import SMALL_QUERY
from app.decoding.kv_cache import SlotLayer
from app.decoding.types import Forward

FORMAT = 1  # what the exported signature is; a change makes every package stale
# freezing: the weights are constants of the graph, packed at build time. max_autotune with the CPP backend:
# inductor's own GEMM micro-kernels, each timed against ATEN's product for its shape.
OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
GRAPHS = ("one", "wide")  # n = 1, and n = 2..SMALL_QUERY
# A slot count of the example inputs that no size of a model has (export would tie equal sizes together).
EXAMPLE_SLOTS = 257


def machine() -> dict:
    """What a package's kernels depend on: the vector instructions inductor builds for, native bfloat16, the number
    of threads the kernels are built for, and the torch version."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return {"isa": str(pick_vec_isa()) or "none", "native_bf16": linear.fast_bf16(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}


def key(model_id: str, dtype: str) -> str:
    """The name of the packages for this model (its weights' identity), dtype and machine."""
    data = {"format": FORMAT, "model": model_id, "dtype": dtype, **machine()}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


class _SlotPass(nn.Module):
    """The function exported: ids, positions, mask and the cache's tensors in; logits and every layer's hidden
    states out; the pass's keys and values written into the cache tensors at slot `at` (an input mutation)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, mask, at, kv: list[torch.Tensor]):
        layers = [SlotLayer.over(kv[i], kv[i + 1], at) for i in range(0, len(kv), 2)]
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         past_key_values=Cache(layers=layers), use_cache=True, output_hidden_states=True)
        return out.logits, torch.cat(out.hidden_states)


def _examples(model: nn.Module, n: int, kv_dtype: torch.dtype) -> tuple:
    config = model.config.get_text_config(decoder=True)
    heads = config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = [torch.zeros(1, heads, EXAMPLE_SLOTS, dim, dtype=kv_dtype) for _ in range(2 * config.num_hidden_layers)]
    ids = torch.zeros(1, n, dtype=torch.long)
    positions = torch.arange(16, 16 + n)[None]
    mask = torch.zeros(1, 1, n, EXAMPLE_SLOTS, dtype=model.dtype)
    return ids, positions, mask, torch.tensor(16), kv


def build(model: nn.Module, out: Path, kv_dtype: torch.dtype, log: Callable[[str], None] = print) -> dict:
    """Export and compile both graphs of `model` (packed, eval, on the CPU) into `out`; returns what it took."""
    from torch.export import Dim

    linear.widen(model)
    start = time.perf_counter()
    seconds = {}
    layers = 2 * model.config.get_text_config(decoder=True).num_hidden_layers
    slots = Dim("slots", min=16, max=1 << 24)
    for graph in GRAPHS:
        t = time.perf_counter()
        n = 1 if graph == "one" else Dim("n", min=2, max=SMALL_QUERY)
        dims = ({1: n}, {1: n}, {2: n, 3: slots}, None, [{2: slots}] * layers) if graph == "wide" else \
            (None, None, {3: slots}, None, [{2: slots}] * layers)
        example = _examples(model, 1 if graph == "one" else 5, kv_dtype)
        log(f"exporting the {graph}-token graph")
        with torch.no_grad():
            program = torch.export.export(_SlotPass(model), example, dynamic_shapes=dims, strict=False)
        log(f"compiling the {graph}-token graph (inductor, C++ kernels, autotuning each product)")
        with torch._inductor.config.patch(OPTIONS):
            torch._inductor.aoti_compile_and_package(program, package_path=str(out / f"{graph}.pt2"))
        seconds[graph] = round(time.perf_counter() - t, 1)
    info = {"seconds": round(time.perf_counter() - start, 1), "graphs": seconds,
            "bytes": sum(f.stat().st_size for f in out.glob("*.pt2")), **machine()}
    (out / "info.json").write_text(json.dumps(info, indent=1))
    return info


class FastPass:
    """A model's compiled graphs, loaded: a pass over a slot cache, as a Forward. Shared by every session of the
    model (the runners hold no state between calls; the cache is the caller's)."""

    def __init__(self, where: Path, runners: dict, info: dict, load_seconds: float) -> None:
        self.where, self.runners, self.info, self.load_seconds = where, runners, info, load_seconds

    def fits(self, n: int) -> bool:
        return n <= SMALL_QUERY

    def __call__(self, input_ids, position_ids, mask, cache: Cache) -> Forward:
        n = input_ids.shape[1]
        at = cache.layers[0].cumulative_length
        kv = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        logits, hidden = self.runners["one" if n == 1 else "wide"](input_ids, position_ids, mask, at.clone(), kv)
        layers = tuple(hidden)
        return Forward(logits[0], layers[-1], layers)


def load(where: Path, runners: int = 2) -> FastPass:
    """The packages in `where`, ready to run (`runners`: calls that may run at once, one per concurrent session)."""
    from torch._inductor.package import load_package

    start = time.perf_counter()
    loaded = {g: load_package(str(where / f"{g}.pt2"), num_runners=runners) for g in GRAPHS}
    info = json.loads((where / "info.json").read_text())
    return FastPass(where, loaded, info, round(time.perf_counter() - start, 2))


def built(where: Path) -> bool:
    return all((where / f"{g}.pt2").exists() for g in GRAPHS) and (where / "info.json").exists()
