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
passes and the prefill run eagerly over the same cache. In bfloat16 without native instructions a third: inductor's
bfloat16 products cost about one row's up to FEW rows and grow fast after (bundled model, AVX2: 1 row 29.3 ms, 2-3
rows 30.7, 4 rows 42.9, 8 rows 76.3, 16 rows 134.6), where float32 copies of the weights (linear.widen) do better
(8 rows 71.3, 16 rows 102.8); so passes of 2..FEW rows run a graph of bfloat16 products, wider ones the float32.

How a graph multiplies, and which passes it serves, is measured, not assumed, and a build is ordered and decided in
a process that never imports torch (decoding/fast_build.py): each graph's compilation and each candidate's timing here,
in a short-lived process of its own (`run_step`). A build on a busy machine once measured the one-token graph at 39 ms
against eager's 21 (0.5 against 1.1 quiet) and kept eager passes for good: a choice measured under load is now
provisional until measured again. Where the CPU multiplies bfloat16 natively, inductor's own GEMM kernels lose to oneDNN's (AMD EPYC with
AVX-512 BF16, bundled model, bfloat16, 16 tokens: 55 ms autotuned against 22 ms eager), oneDNN's packed products win.

What a package holds depends on the CPU it was built on (its vector instructions, the thread count the kernels were
built for), the torch version, the model's weights and dtype: `key` names all of them, so a package is only ever
loaded where it was built for.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import Cache

from app.decoding import linear
from app.decoding import fast_build
from app.decoding.fast_build import OPTIONS, widths_to_time
from app.decoding.attention import SMALL_QUERY
from app.decoding.kv_cache import SlotLayer
from app.decoding.types import Forward

FORMAT = 4  # what the exported signature, the graphs and info.json are; a change makes every package stale
# What a build step holds (issue 58; measured: docs/benchmarks.md#the-fast-pass): one C++ compile worker (inductor's
# default is one per core, up to 32, each a process importing torch), the eager model without its oneDNN-packed copies
# while a graph compiles (it never reads them), what a compilation held given back before its package is written, and
# one candidate package loaded at a time while timing (a loaded package holds its weights twice: its shared library's
# data and the runtime's copy, ~1.25 GB for the bundled model in float32). A released package's shared library stays
# mapped (~0.6 GB each, torch never unloads it), so each step runs in a short-lived process of its own (fast_build.
# Elsewhere, `run_step`). The weights are appended to the shared library once it is linked (force_mmap_weights), not
# assembled into an object the linker copies: at the end of each compilation the linker held ~0.7 GB beside the
# compiling process. A loaded package reads them from the same file into the same runtime copy, so it runs and loads
# as before.
BUILD_CONFIG = {"compile_threads": 1, "aot_inductor.force_mmap_weights": True}
FEW = 4  # bfloat16 without native instructions: the widest pass whose products stay in bfloat16 (module docstring)
# A slot count of the example inputs that no size of a model has (export would tie equal sizes together).
EXAMPLE_SLOTS = 257
MEASURED_CONTEXT = 128  # the committed length of the passes a build times (graph against eager)


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


class _DraftPass(nn.Module):
    """An EAGLE module's pass exported the same way (heads/eagle.py `decode`): the target's embeddings of the tokens
    and the stream beside them (`stream`) in; the draft's outputs and their log q over the draft vocabulary out."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, embeds, stream, position_ids, mask, at, kv: list[torch.Tensor]):
        layers = [SlotLayer.over(kv[i], kv[i + 1], at) for i in range(0, len(kv), 2)]
        hidden = self.module.decode(embeds, stream, Cache(layers=layers), position_ids, mask)
        return hidden, self.module.head(hidden).float().log_softmax(-1)


@dataclass
class Exported:
    """What a build exports and times, held in this process: a pass over a slot cache (`module`, called with
    `examples(n, slots, at)`), the dynamic dimensions of those inputs for a graph of n-token passes (`dims(n, slots)`:
    n is 1 or a Dim) and the graphs with the widths each is built for. A build's steps run here (`compile`, `time`):
    fast_build.Elsewhere is the same face for a pass whose steps each run in a process of their own."""

    module: nn.Module
    examples: Callable[[int, int, int], tuple]
    dims: Callable[[object, object], tuple]
    graphs: dict[str, tuple[int, int]]

    def machine(self) -> dict:
        return machine()

    def compile(self, out: Path, log: Callable[[str], None]) -> dict[str, float]:
        unpack(self.module)  # the eager pass repacks them when it is first timed
        return {graph: compile_graph(self, graph, out, log) for graph in self.graphs}

    def time(self, graph: str, name: str, path: Path, reps: int) -> dict[int, dict[str, list]]:
        return time_candidate(self, graph, name, path, reps)


def make(recipe: tuple[str, list]) -> Exported:
    """The Exported a recipe ("package.module:function" and its JSON arguments) makes."""
    import importlib

    module, _, name = recipe[0].partition(":")
    return getattr(importlib.import_module(module), name)(*recipe[1])


def _kv(config, kv_dtype: torch.dtype, slots: int) -> list[torch.Tensor]:
    heads = config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return [torch.zeros(1, heads, slots, dim, dtype=kv_dtype) for _ in range(2 * config.num_hidden_layers)]


def target_pass(model: nn.Module, kv_dtype: torch.dtype) -> Exported:
    """A target model's pass (what TransformersTarget runs)."""
    config = model.config.get_text_config(decoder=True)
    layers = 2 * config.num_hidden_layers

    def examples(n: int, slots: int, at: int) -> tuple:
        mask = torch.zeros(1, 1, n, slots, dtype=model.dtype)
        return torch.zeros(1, n, dtype=torch.long), torch.arange(at, at + n)[None], mask, torch.tensor(at), \
            _kv(config, kv_dtype, slots)

    def dims(n, slots) -> tuple:
        if n == 1:
            return None, None, {3: slots}, None, [{2: slots}] * layers
        return {1: n}, {1: n}, {2: n, 3: slots}, None, [{2: slots}] * layers

    return Exported(_SlotPass(model), examples, dims, graphs(model.dtype))


def draft_pass(module: nn.Module, kv_dtype: torch.dtype) -> Exported:
    """An EAGLE module's pass (what the EAGLE drafter runs): one graph for every width, its own products being few."""
    config = module.llama_config
    dtype, h = module.fc.weight.dtype, config.hidden_size

    def examples(n: int, slots: int, at: int) -> tuple:
        mask = torch.zeros(1, 1, n, slots, dtype=dtype)
        return torch.zeros(1, n, h, dtype=dtype), torch.zeros(1, n, h, dtype=dtype), torch.arange(at, at + n)[None], \
            mask, torch.tensor(at), _kv(config, kv_dtype, slots)

    def dims(n, slots) -> tuple:
        return {1: n}, {1: n}, {1: n}, {2: n, 3: slots}, None, [{2: slots}] * (2 * config.num_hidden_layers)

    return Exported(_DraftPass(module), examples, dims, {"draft": (1, SMALL_QUERY)})


def graphs(dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """The graphs a model of `dtype` gets here, each with the pass widths it serves."""
    if linear.upcasts(dtype):
        return {"one": (1, 1), "few": (2, FEW), "wide": (FEW + 1, SMALL_QUERY)}
    return {"one": (1, 1), "wide": (2, SMALL_QUERY)}


def build(model: nn.Module, out: Path, kv_dtype: torch.dtype, log: Callable[[str], None] = print) -> dict:
    """Export the graphs of a target `model` (packed, eval, on the CPU), compile each with every option set (OPTIONS),
    time them against each other and the eager pass, and keep in `out` the fastest of each; returns what it took."""
    return fast_build.build(prepared_target(model, kv_dtype), out, log)


def prepared_target(model: nn.Module, kv_dtype: torch.dtype) -> Exported:
    """A target `model`'s pass as a build exports and times it (its widest products widened, linear.widen)."""
    linear.widen(model, rows=FEW + 1)
    return target_pass(model, kv_dtype)


def recheck_target(model: nn.Module, out: Path, kv_dtype: torch.dtype, log: Callable[[str], None] = print,
                   others=None) -> dict:
    """`fast_build.recheck` for a target `model`'s built pass, the model prepared as `build` prepares it."""
    return fast_build.recheck(prepared_target(model, kv_dtype), out, log, others)


def build_draft(module: nn.Module, out: Path, kv_dtype: torch.dtype, log: Callable[[str], None] = print) -> dict:
    """The same for an EAGLE module's pass (`draft_pass`)."""
    return fast_build.build(draft_pass(module, kv_dtype), out, log)


def compile_graph(exported: Exported, graph: str, out: Path, log: Callable[[str], None] = print,
                  names: list[str] | None = None) -> float:
    """Export one graph of `exported` and compile it with every option set (or those `names`) into
    `out/<graph>-<options>.pt2`, giving back what each compilation held before the next; returns the seconds it took."""
    from torch._inductor.package import package_aoti
    from torch.export import Dim

    t = time.perf_counter()
    low, high = exported.graphs[graph]
    slots = Dim("slots", min=16, max=1 << 24)
    n = 1 if high == 1 else Dim(f"n_{graph}", min=low, max=high)
    # A width inside the range, not at its ends (export would specialize an example of width 1).
    example = exported.examples(low if high == 1 else min(max(low + 1, 2), high), EXAMPLE_SLOTS, 16)
    log(f"exporting the graph of {low}..{high}-token passes")
    with torch.no_grad():
        program = torch.export.export(exported.module, example, dynamic_shapes=exported.dims(n, slots), strict=False)
        for name in names or OPTIONS:
            options = OPTIONS[name]
            log(f"compiling the graph of {low}..{high}-token passes: {name} products (inductor, C++ kernels)")
            # Under no_grad, or inductor's freezing leaves the products unpacked (plain aten::mm calls).
            with torch._inductor.config.patch({**options, **BUILD_CONFIG}):
                files = torch._inductor.aot_compile(program.module(check_guards=False), *program.example_inputs,
                                                    options={"aot_inductor.package": True})
            # Packaged once what the compilation held is given back (its graph and frozen constants linger until
            # collected): writing the package holds its shared library, weights and all, in memory more than twice
            # over for a moment (up to ~1.8 GB for the bundled model in float32; torch's package_aoti).
            release()
            package_aoti(str(out / f"{graph}-{name}.pt2"), files)
            del files
            release()
    del program, example
    release()
    return round(time.perf_counter() - t, 1)


def run_step(text: str) -> None:
    """The process of one build step (fast_build.Elsewhere): compile one graph with one option set, or time one
    candidate against eager; what it reports goes to the job's `result` file."""
    job = json.loads(text)
    torch.set_num_threads(job["threads"])
    exported = make(job["recipe"])
    log = fast_build.say
    if job["do"] == "compile":
        graph = list(exported.graphs)[job["graph"]]
        unpack(exported.module)
        seconds = compile_graph(exported, graph, Path(job["out"]), log, names=[job["options"]])
        report = {"name": graph, "graphs": exported.graphs, "seconds": seconds}
    else:
        times = time_candidate(exported, job["graph"], job["name"], Path(job["path"]), job["reps"])
        report = {"times": {str(n): t for n, t in times.items()}}
    Path(job["result"]).write_text(json.dumps(report))


def unpack(module: nn.Module) -> int:
    """Drop the oneDNN-packed copies of `module`'s PackedLinear layers (as much memory again as their weights): export
    and compilation never read them, and an eager call repacks a layer first (linear.PackedLinear). Returns how many."""
    layers = [m for m in module.modules() if isinstance(m, linear.PackedLinear) and m._packed is not None]
    for m in layers:
        m._packed, m._packed_key = None, None
    return len(layers)


def release() -> None:
    """Give back what a compilation or a loaded package held: collect its reference cycles, and have glibc return its
    freed heap to the system (it keeps freed blocks otherwise, and the next step's peak stacks on top)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def time_candidate(exported: Exported, graph: str, name: str, path: Path, reps: int) -> dict[int, dict[str, list]]:
    """One candidate package of `graph` and the eager pass, timed in rounds at the graph's widths (`measure`):
    {n: {name: [seconds], "eager": [seconds]}}; the package is released after."""
    from torch._inductor.package import load_package

    low, high = exported.graphs[graph]
    times = {n: {name: [], "eager": []} for n in widths_to_time(low, high)}
    times.update({n: {"eager": []} for n in fast_build.eager_only_widths(exported.graphs, graph)})
    runs = {name: load_package(str(path), num_runners=1), "eager": exported.module}
    for n in times:
        inputs = exported.examples(n, MEASURED_CONTEXT + max(n, 16), MEASURED_CONTEXT)
        with torch.inference_mode():
            for rep in range(reps + 1):
                for run_name, run in runs.items():
                    if run_name not in times[n]:
                        continue
                    t = time.perf_counter()
                    run(*inputs)
                    if rep:  # the first call of each warms up
                        times[n][run_name].append(time.perf_counter() - t)
    del runs
    release()
    return times


class FastPass:
    """A model's compiled graphs, loaded: a pass over a slot cache, as a Forward. Shared by every session of the
    model (the runners hold no state between calls; the cache is the caller's)."""

    def __init__(self, where: Path, runners: dict, info: dict, load_seconds: float) -> None:
        self.where, self.runners, self.info, self.load_seconds = where, runners, info, load_seconds
        self.widths = {g: tuple(w) for g, w in info["widths"].items()}
        # The graph one-token passes run padded to two tokens, where the build measured it faster (one_token_route);
        # only while that graph serves widths of its own (the build routes only to one: a store's edited or older
        # info.json must not send them to a graph measured slower than eager).
        via = info.get("one_token_via")
        self.one_token_via = via if via in self.widths else None

    def graph(self, n: int) -> str | None:
        """The graph that serves a pass of n tokens; None: wider than any (it runs eagerly)."""
        if n == 1 and self.one_token_via:
            return self.one_token_via
        return next((g for g, (low, high) in self.widths.items() if low <= n <= high), None)

    def slots(self, n: int) -> int:
        """The cache slots a pass of n tokens writes from the committed length: two for a padded one-token pass."""
        return 2 if n == 1 and self.one_token_via else n

    def fits(self, n: int) -> bool:
        return self.graph(n) is not None

    def eager_widths(self) -> list[tuple[int, int]]:
        """The ranges of pass widths up to SMALL_QUERY that no graph serves (measured faster eagerly at build)."""
        ranges = []
        for n in range(1, SMALL_QUERY + 1):
            if self.fits(n):
                continue
            if ranges and ranges[-1][1] == n - 1:
                ranges[-1] = (ranges[-1][0], n)
            else:
                ranges.append((n, n))
        return ranges

    def run(self, n: int, cache: Cache, *inputs):
        """The outputs of the graph serving n-token passes on `inputs` over `cache`, written at its layers' slot."""
        at = cache.layers[0].cumulative_length
        kv = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        # `at` is read, not advanced: each layer of the graph advances a copy of its own (SlotLayer.over).
        return self.runners[self.graph(n)](*inputs, at, kv)

    def __call__(self, input_ids, position_ids, mask, cache: Cache) -> Forward:
        """A target's pass (`target_pass`)."""
        n = input_ids.shape[1]
        if self.slots(n) > n:
            # The token twice, at its position and under its mask: the copy's keys and values land in the next slot,
            # which the next pass writes first, and its outputs are dropped.
            input_ids, position_ids, mask = input_ids.repeat(1, 2), position_ids.repeat(1, 2), mask.repeat(1, 1, 2, 1)
        logits, hidden = self.run(n, cache, input_ids, position_ids, mask)
        layers = tuple(hidden[:, :n])
        return Forward(logits[0, :n], layers[-1], layers)


def load(where: Path, runners: int = 2) -> FastPass:
    """The packages in `where`, ready to run (`runners`: calls that may run at once, one per concurrent session)."""
    from torch._inductor.package import load_package

    start = time.perf_counter()
    info = json.loads((where / "info.json").read_text())
    # Only the graphs that serve some width: a graph the build measured slower than eager everywhere stays on disk.
    loaded = {g: load_package(str(where / f"{g}.pt2"), num_runners=runners) for g in info["widths"]}
    return FastPass(where, loaded, info, round(time.perf_counter() - start, 2))
