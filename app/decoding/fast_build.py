"""A fast pass's build (decoding/compiled.py), ordered and decided in a process that never imports torch.

What a build holds is its steps' memory (issue 58: at most 3 GB for its process tree, so that a 16 GB Space runs it
beside the app). Each graph's compilation and each candidate's timing loads the model in a short-lived process of its
own (`Elsewhere`, `compiled.run_step`), so what a step mapped goes with it; the process that orders the steps keeps only
their reports and decides. With torch, transformers and the app imported it held 0.26 GB beside every step's peak;
without them it holds a few MB. `python -m app compile` plans a build where torch is (the model's directory, the
packages' names for this machine: `models.pass_plan`) and then becomes this module's process (`main`).

How a choice is made: a build compiles each graph with every option set (OPTIONS), times them against each other and
the eager pass over the same slots at the graph's widths, keeps the fastest (`fastest`), and has it serve up to the
widest width where it is not slower than eager (`serving`). A timing is the fastest of rounds that call each candidate
in turn (other load only ever adds time), a candidate that wins or loses by less than the rounds' spread (NOISE at
least) changes nothing, and a measurement taken while other processes used the CPU (`Others`) is kept as provisional:
the build keeps every candidate, and `recheck` (`python -m app compile --recheck`, started by a serving process that
loads a provisional pass) measures them again, deciding for good only on a quiet machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# Two ways to compile the products, each graph built both ways and the faster kept (measured at build, per CPU).
# freezing: the weights are constants of the graph, packed at build time. "packed": oneDNN's products over packed
# weights, those that share an input (q, k, v; gate, up) concatenated into one (AMD EPYC with AVX-512 BF16, bfloat16
# one-token pass: 9.8 ms against 13.9 autotuned, 211 products down to 121). "autotuned": inductor's own GEMM
# micro-kernels, each timed against ATEN's product for its shape (what won on AVX2 before packing was in reach).
OPTIONS = {
    "packed": {"freezing": True, "cpp.enable_concat_linear": True},
    "autotuned": {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"},
}
NOISE = 0.05  # a difference smaller than this share (or than the rounds' own spread) is not a result
BUSY = 0.25  # other processes' share of the CPU above which a measurement is provisional
ROOT = Path(__file__).resolve().parents[2]


def say(text: str) -> None:
    print(f"[compile] {text}", file=sys.stderr, flush=True)


class Others:
    """What other processes took of this machine's CPU while the block ran: system-wide busy time less this process's
    own CPU time and its finished children's (the build's steps), over wall time times cores (`share`; None where
    /proc/stat cannot be read)."""

    def __enter__(self) -> "Others":
        self._start = (_busy_seconds(), _own_seconds(), time.perf_counter())
        self.share: float | None = None
        return self

    def __exit__(self, *exc) -> None:
        busy, own, wall = _busy_seconds(), _own_seconds(), time.perf_counter()
        if busy is None or self._start[0] is None:
            return
        cores = os.cpu_count() or 1
        spent = (busy - self._start[0]) - (own - self._start[1])
        self.share = round(max(0.0, spent / max(1e-9, (wall - self._start[2]) * cores)), 3)


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _busy_seconds() -> float | None:
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Elsewhere:
    """A pass this process does not make, only how a step's process makes it: `recipe` ("package.module:function" and
    its JSON arguments, compiled.make), the thread count its kernels are built for, this machine's facts
    (compiled.machine, computed where torch is) and, once the first compilation tells them, its graphs. The same
    face as compiled.Exported, whose steps run in the process that holds the module."""

    def __init__(self, recipe: tuple[str, list], threads: int, machine: dict, graphs: dict | None = None) -> None:
        self.recipe, self.threads, self.facts, self.graphs = (recipe[0], list(recipe[1])), threads, machine, graphs

    def machine(self) -> dict:
        return self.facts

    def compile(self, out: Path, log: Callable[[str], None]) -> dict[str, float]:
        """Each graph with each option set, one compilation a process: what one leaves in its process (~0.25 GB for
        the bundled model in float32, after release) the next would hold at its own peak."""
        seconds, graphs, index = {}, self.graphs, 0
        while graphs is None or index < len(graphs):
            for name in OPTIONS:
                done = self._step({"do": "compile", "graph": index, "options": name, "out": str(out)})
                seconds[done["name"]] = round(seconds.get(done["name"], 0) + done["seconds"], 1)
            graphs = {g: tuple(w) for g, w in done["graphs"].items()}
            index += 1
        self.graphs = graphs
        return seconds

    def time(self, graph: str, name: str, path: Path, reps: int) -> dict[int, dict[str, list]]:
        job = {"do": "time", "graph": graph, "name": name, "path": str(path), "reps": reps}
        return {int(n): t for n, t in self._step(job)["times"].items()}

    def _step(self, job: dict) -> dict:
        """Run one step in a short-lived process of its own (compiled.run_step) and return what it reports. Its log goes
        where this process's stderr goes."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        with tempfile.TemporaryDirectory(prefix="fast-pass-step-") as tmp:
            result = Path(tmp) / "result.json"
            job = {**job, "recipe": self.recipe, "threads": self.threads, "result": str(result)}
            code = "import sys; from app.decoding import compiled; compiled.run_step(sys.argv[1])"
            done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, stdin=subprocess.DEVNULL)
            if done.returncode or not result.exists():
                raise RuntimeError(f"a fast-pass build step ({job['do']}) failed in its own process (exit {done.returncode})")
            return json.loads(result.read_text())


WHOLE = "with_companions_s"  # info.json: seconds of the target's build and its companions' (main)


def built(where: Path) -> bool:
    """Whether `where` holds a complete build (its info.json is written last)."""
    if not (where / "info.json").exists():
        return False
    graphs = json.loads((where / "info.json").read_text()).get("built") or {}
    return bool(graphs) and all((where / f"{g}.pt2").exists() for g in graphs)


def build(exported, out: Path, log: Callable[[str], None] = print) -> dict:
    """Compile each graph of `exported` (compiled.Exported, or Elsewhere) with every option set into `out`, time them
    (`decide`) and keep the fastest of each; returns what it took (info.json)."""
    start = time.perf_counter()
    seconds = exported.compile(out, log)
    log("timing each graph's builds against each other and the eager pass at its widths")
    info = decide(exported, out, {g: {name: out / f"{g}-{name}.pt2" for name in OPTIONS} for g in exported.graphs}, log)
    info.update(seconds=round(time.perf_counter() - start, 1), graphs=seconds)
    _write_info(out, info)
    return info


def recheck(exported, out: Path, log: Callable[[str], None] = print, others=None) -> dict:
    """Measure a built pass's candidates again (its graphs and the option sets a provisional build kept) and decide
    anew: for good when the machine is quiet, else still provisional. Nothing is compiled. Returns the new info.
    `others`: what tells the machine's load (Others)."""
    info = json.loads((out / "info.json").read_text())
    exported.graphs = exported.graphs or {g: tuple(w) for g, w in info["built"].items()}
    candidates = {}
    for graph in info["built"]:
        candidates[graph] = {info["options"][graph]: out / f"{graph}.pt2"}
        candidates[graph].update({p.stem.split("-", 1)[1]: p for p in out.glob(f"{graph}-*.pt2")})
    log("timing each graph's builds against each other and the eager pass at its widths, again")
    new = decide(exported, out, candidates, log, others or Others)
    _write_info(out, {**info, **new, "rechecked": time.strftime("%Y-%m-%d %H:%M:%S")})
    return {**info, **new}


def decide(exported, out: Path, candidates: dict[str, dict[str, Path]], log: Callable[[str], None],
           others=None) -> dict:
    """Time `candidates` ({graph: {option set: package}}) and eager, keep the fastest of each graph as `<graph>.pt2`
    and the widths it serves; while the measurement is provisional the other candidates stay as `<graph>-<name>.pt2`
    for a recheck, else they go. Returns the decision's part of info.json."""
    with (others or Others)() as load:
        measured, spread = measure(exported, candidates)
    busy = load.share is not None and load.share > BUSY
    provisional = f"other processes used {load.share:.0%} of the CPU while it was measured" if busy else None
    chosen = {graph: fastest(times, spread[graph], first=_incumbent(candidates[graph])) for graph, times in measured.items()}
    for graph, name in chosen.items():
        kept = candidates[graph][name]
        current = out / f"{graph}.pt2"
        if kept != current:
            if current.exists():  # the incumbent stays a candidate under its own name, and `built` never sees a gap
                incumbent = next(n for n, p in candidates[graph].items() if p == current)
                os.link(current, out / f"{graph}-{incumbent}.pt2")
            os.replace(kept, current)
        if not provisional:
            for other in out.glob(f"{graph}-*.pt2"):
                other.unlink()
    # (A width timed with eager alone is a reference for another graph: one_token_route.)
    widths = serving(exported.graphs, {g: {n: (t[chosen[g]], t["eager"]) for n, t in m.items() if chosen[g] in t}
                                       for g, m in measured.items()},
                     {g: {n: max(s[chosen[g]], s["eager"]) for n, s in sp.items() if chosen[g] in s}
                      for g, sp in spread.items()})
    route = one_token_route(exported.graphs, measured, spread, chosen, widths)
    for graph, (low, high) in exported.graphs.items():
        times = ", ".join(f"{n}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()) + " ms" for n, t in measured[graph].items())
        serves = f"serves {widths[graph][0]}..{widths[graph][1]}" if graph in widths else "serves none (eager is faster)"
        log(f"graph {graph} ({low}..{high} tokens): {times}; keeps {chosen[graph]}, {serves}")
    if route:
        log(f"one-token passes run the graph {route} padded to two tokens: measured faster than the one-token graph")
    if provisional:
        log(f"provisional: {provisional}; every candidate is kept until `python -m app compile --recheck` measures "
            "them on a quiet machine")
    return {"built": exported.graphs, "widths": widths, "options": chosen, "one_token_via": route,
            "measured": {g: {str(n): t for n, t in m.items()} for g, m in measured.items()},
            "spread": {g: {str(n): t for n, t in m.items()} for g, m in spread.items()},
            "others": load.share, "provisional": provisional,
            "bytes": sum(f.stat().st_size for f in out.glob("*.pt2")), **exported.machine()}


def _incumbent(candidates: dict[str, Path]) -> str:
    """The option set that stands unless another beats it beyond noise: the one serving now, else the first."""
    return next((name for name, path in candidates.items() if "-" not in path.stem), next(iter(candidates)))


def _write_info(out: Path, info: dict) -> None:
    tmp = out / "info.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, out / "info.json")  # a reader sees the old decision or the new, whole


def widths_to_time(low: int, high: int) -> list[int]:
    return sorted({low, high} | {1 << k for k in range(8) if low <= 1 << k <= high})


def measure(exported, candidates: dict[str, dict[str, Path]], reps: int = 5) -> tuple[dict, dict]:
    """Each graph's candidate packages and the eager pass over the same slots, at the graph's widths, in rounds that
    call a candidate and eager in turn (a load that changes meanwhile weighs on both alike; one candidate package is
    loaded at a time: each holds its weights twice): ({graph: {n: {name or "eager": ms}}}, {graph: {n: {name:
    spread}}}), the fastest round (other load only adds time) and how far the median round lies above it, as a share.
    Eager's times are those of every candidate's rounds."""
    result, spread = {}, {}
    for graph in exported.graphs:
        times = {}
        for name, path in candidates[graph].items():
            for n, got in sorted(exported.time(graph, name, path, reps).items()):
                for run_name, t in got.items():
                    times.setdefault(n, {}).setdefault(run_name, []).extend(t)
        order = [*candidates[graph], "eager"]
        times = {n: {name: runs[name] for name in order if name in runs} for n, runs in times.items()}
        result[graph] = {n: {name: round(1e3 * min(t), 2) for name, t in runs.items()} for n, runs in times.items()}
        spread[graph] = {n: {name: round(statistics.median(t) / min(t) - 1, 3) for name, t in runs.items()}
                         for n, runs in times.items()}
    return result, spread


def eager_only_widths(graphs: dict, graph: str) -> list[int]:
    """Widths at which a graph's timing runs eager alone, beside its own: the one-token graph's rounds also time an
    eager two-token pass, the common reference that compares it with the graph serving two tokens (one_token_route)."""
    low, high = graphs[graph]
    return [2] if (low, high) == (1, 1) and any(lo <= 2 <= hi for lo, hi in graphs.values()) else []


def one_token_route(graphs: dict, measured: dict, spread: dict, chosen: dict, widths: dict) -> str | None:
    """The graph that serves one-token passes padded to two tokens (a duplicate of the token whose outputs are dropped),
    or None: they run the one-token graph (or eagerly, where it serves none).

    Where the CPU makes wide products cheap (AMX: a two-token pass measured at 0.9 of a one-token one), the wider graph
    runs a one-token pass faster than the graph built for it. The two graphs are timed in rounds of their own, so the
    two-token graph's time is scaled by eager's two-token pass as each graph's rounds measured it (a load that changed
    between them weighs on eager alike), then compared with the one-token pass as it runs now; it must win beyond the
    noise of every time it rests on."""
    one = next((g for g, (low, high) in graphs.items() if (low, high) == (1, 1)), None)
    wide = next((g for g, (low, high) in widths.items() if low <= 2 <= high and g != one), None)
    if one is None or wide is None or 2 not in measured[one] or 2 not in measured[wide]:
        return None
    incumbent = chosen[one] if one in widths else "eager"
    now, now_noise = measured[one][1][incumbent], spread[one][1][incumbent]
    runs = measured[wide][2]
    padded = runs[chosen[wide]] * measured[one][2]["eager"] / runs["eager"]
    noise = max(NOISE, now_noise, spread[one][2]["eager"], spread[wide][2][chosen[wide]], spread[wide][2]["eager"])
    return wide if padded < now * (1 - noise) else None


def fastest(times: dict, spread: dict | None = None, first: str | None = None) -> str:
    """The option set whose package took the least time summed over the widths timed ({n: {options: ms}}), unless it
    beats `first` (the incumbent, default the first set) by less than the noise: then `first` stands. Widths timed
    with eager alone (eager_only_widths) do not count."""
    times = {n: t for n, t in times.items() if set(t) - {"eager"}}
    names = [name for name in OPTIONS if all(name in t for t in times.values())] or list(next(iter(times.values())))
    names = [name for name in names if name != "eager"]
    first = first if first in names else names[0]
    total = {name: sum(t[name] for t in times.values()) for name in names}
    best = min(names, key=total.get)
    noise = max([NOISE] + [s.get(name, 0) for s in (spread or {}).values() for name in (best, first)])
    return best if total[best] < total[first] * (1 - noise) else first


def serving(built: dict, measured: dict, spread: dict | None = None) -> dict[str, tuple[int, int]]:
    """The widths each graph serves ({graph: {n: (compiled ms, eager ms)}}; `spread` {graph: {n: share}}, the rounds'
    noise): from its lowest up to the widest width timed where neither it nor any narrower timed width ran slower than
    eager beyond the noise (a width between two timed ones goes with the narrower). A graph slower at its lowest width
    serves none: those passes run eagerly."""
    widths = {}
    for graph, (low, high) in built.items():
        served = None
        for n, (fast, eager) in sorted((int(n), t) for n, t in measured[graph].items()):
            noise = max(NOISE, (spread or {}).get(graph, {}).get(n, 0))
            if fast > eager * (1 + noise):
                break
            served = n
        if served is not None:
            widths[graph] = (low, served)
    return widths


# ----------------------------------------------------------------------------- one builder, one build


def build_once(target: Path, is_fresh, make) -> Path:
    """Return `target`, first running make(tmp_dir) and renaming it into place unless is_fresh().

    Builders in other processes (test workers, a CLI next to the web app) take turns on a lock file, so the directory
    is built once and a reader never sees it half-written or moved aside."""
    if is_fresh():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fresh():  # built by whoever held the lock before us
            return target
        for stale in target.parent.glob(f".{target.name}-*"):  # an interrupted build's leftovers (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            make(tmp)
            if target.exists():  # stale (e.g. retrained weights checked out): move it aside
                stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=target.parent))
                os.replace(target, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def one_builder(engines: Path, quiet: bool = False) -> Iterator[None]:
    """One fast-pass build at a time on this store, whatever its model and dtype: a build holds its model, the
    graphs and inductor's workers (GBs), and every process that serves a model starts a builder of its own. A builder
    waits here before it loads anything, saying so once (unless `quiet`: a write of a built pass's info.json)."""
    root = engines / "compiled"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".builder.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                say("another process is building a fast pass on this machine: waiting for it before loading anything")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_pass(plan: dict) -> dict | None:
    """Build the pass a plan names (models.pass_plan: `out`, `engines`, how its steps make it) unless it is built;
    returns its info. A companion's plan names the target pass it drafts beside (`beside`): None where that one
    serves no width (every pass of the target runs eagerly: so does the companion)."""
    return _build_pass(plan)[0]


def _build_pass(plan: dict) -> tuple[dict | None, bool]:
    """build_pass, and whether this call built it (else it was built, here or by another process meanwhile)."""
    beside = plan.get("beside")
    if beside and not (built(Path(beside)) and json.loads((Path(beside) / "info.json").read_text())["widths"]):
        return None, False
    out = Path(plan["out"])
    made = []
    if not built(out):
        steps = Elsewhere(plan["recipe"], plan["threads"], plan["machine"])
        with one_builder(Path(plan["engines"])):  # bounded: compiled.BUILD_CONFIG
            build_once(out, lambda: built(out), lambda tmp: made.append(build(steps, tmp, log=say)))
    return json.loads((out / "info.json").read_text()), bool(made)


def recheck_pass(plan: dict, only_provisional: bool = False) -> dict:
    """`recheck` of the built pass a plan names, under the builders' lock; `only_provisional`: only when its choices
    are still provisional (another process's recheck may have decided meanwhile). Returns its info."""
    out = Path(plan["out"])
    with one_builder(Path(plan["engines"])):
        info = json.loads((out / "info.json").read_text())
        if only_provisional and not info.get("provisional"):
            return info
        return recheck(Elsewhere(plan["recipe"], plan["threads"], plan["machine"]), out, log=say)


def served(info: dict) -> str:
    spans = ", ".join(f"{a}..{b}" for a, b in info["widths"].values()) or "none"
    via = info.get("one_token_via")
    return spans + (f" (one-token passes through the {'..'.join(map(str, info['widths'][via]))} graph)" if via else "")


def main(plan: dict) -> int:
    """`python -m app compile` once planned (cli.cmd_compile): build (or recheck) the target's pass, then the shipped
    companions' beside it, saying each on stdout as the command does."""
    # A stop request unwinds like Ctrl-C: the step running is killed with it (subprocess.run) and the build's
    # temporary folder removed (build_once).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    target, name = plan["target"], f"{plan['model']} ({plan['dtype']})"
    if plan.get("recheck"):
        info = recheck_pass(target, only_provisional=plan["recheck"] == "provisional")
        state = f"still provisional ({info['provisional']})" if info.get("provisional") else "final"
        print(f"fast pass of {name} rechecked: the graphs serve passes of {served(info)} tokens, options "
              f"{info['options']}; {state}", flush=True)
        return 0
    info, made = _build_pass(target)
    print(f"fast pass of {name} for this machine ({info['isa']}, {info['threads']} threads): built in "
          f"{info['seconds']:.0f} s, {info['bytes'] / 1e6:.0f} MB; the graphs serve passes of {served(info)} tokens "
          f"(measured against eager; others run eagerly)"
          + (f"; provisional: {info['provisional']}" if info.get("provisional") else ""), flush=True)
    # The shipped artifacts that run compiled beside it (EAGLE's module), so their first run does not build them.
    whole = info["seconds"]
    for companion in plan["companions"]:
        t = time.perf_counter()
        done = build_pass(companion)
        if done is None:  # every pass of the target runs eagerly: so do they
            break
        whole += done["seconds"]
        print(f"compiled pass of the shipped {companion['label']} ({companion['file']}): "
              f"{'ready' if done['widths'] else 'measured slower than eager, not used'}, {time.perf_counter() - t:.0f} s",
              flush=True)
    if made:
        # What a whole build (the target's pass and its companions') takes on this machine: the estimate an app shows
        # while the next one runs (a companion's pass alone, a minute, is not one). Under the lock: a recheck rewrites
        # info.json too.
        out = Path(target["out"])
        with one_builder(Path(target["engines"]), quiet=True):
            _write_info(out, {**json.loads((out / "info.json").read_text()), WHOLE: round(whole, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
