"""vLLM engines: a vLLM OpenAI server per (model, dtype, speculative config), started and kept by the service.

vLLM is an engine this project did not write, so it checks the project against something outside it:
the same model and prompts through vLLM's own speculative decoding, beside the project's verify loop.
It runs in its own interpreter (`.venv-vllm`, scripts/setup-vllm.sh) because it pins another
transformers than the app's; the app never imports it, it only starts its server and talks HTTP.

An engine is a build in the store (builds.py): content-addressed by its spec (model, mode, dtype,
vLLM's `speculative_config`, vLLM's version), built once under the store's lock. The build writes
`vllm.json` (the server's arguments) and whatever the method loads from disk (the distilled draft as
a plain model directory). Running it adds two files to the build directory: `server.json` (pid, port,
command) and `server.log` (the server's output). An engine is *running* while that pid still runs
that command and answers /health; a killed one reads as stopped, with its log's last lines, and the
next request starts it again.

Modes map to vLLM's methods by name: prompt lookup -> `ngram`, draft-target -> `draft_model`,
EAGLE -> `eagle3` (an EAGLE-3 checkpoint only), Medusa -> `medusa` (the heads exported in the layout
TensorRT-LLM and vLLM read), suffix -> `suffix` (Arctic Inference's suffix tree, installed beside vLLM by
scripts/setup-vllm.sh); lookahead has no vLLM counterpart.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import models
from app.backends.openai import WIRE_ERRORS
from app.backends.processes import (SERVER_JSON, SERVER_LOG, alive, free_port, listening, locked, log_tail, read_server,
                                    spawn, stop_server)
from app.modes.configs import DecodeRequest, merged
from app.service.errors import EngineError

VENV = models.ROOT / ".venv-vllm"
SETUP = "bash scripts/setup-vllm.sh"
SERVER = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails for the vllm-cpu package (its metadata is named vllm-cpu)
START_TIMEOUT_S = 900.0  # a first start compiles the model (minutes on 2 cores); later starts take about a minute


class VLLMError(EngineError):
    """An engine that cannot be set up, started or reached; the message is meant for the user."""


@dataclass(frozen=True)
class Settings:
    """How this machine runs vLLM engines (the operator's choices, not a request's)."""

    python: Path = VENV / "bin" / "python"
    # On CPU, gpu_memory_utilization is the share of host memory vLLM reserves (its default 0.92 takes the machine).
    gpu_memory_utilization: float = 0.15
    kv_cache_space_gib: int | None = 1  # VLLM_CPU_KVCACHE_SPACE: a fixed KV cache instead of one sized by free memory
    max_model_len: int = 4096
    # vLLM leaves one core to its API server by default; on a 2-core machine that halves the model's compute.
    reserved_cpus: int | None = None  # VLLM_CPU_NUM_OF_RESERVED_CPU; None = vLLM's default
    intel_openmp: bool = False  # preload Intel's OpenMP (vLLM warns speculative decoding is slow without it)
    # No torch.compile: a server starts in about a minute instead of three (a first start), and runs eager kernels.
    enforce_eager: bool = False
    # "uni" runs the model in the engine-core process; "mp" (vLLM's default) spawns a worker for it, a third
    # interpreter that imports vLLM again: a start takes about 80 s instead of 35 s here and holds more memory.
    distributed_executor_backend: str = "uni"


def version(python: Path) -> str | None:
    """vLLM's version in `python`'s environment, read from package metadata (importing vLLM takes seconds)."""
    lib = python.parent.parent / "lib"
    for info in sorted(lib.glob("python3*/site-packages/vllm*.dist-info/METADATA")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def unavailable(settings: Settings) -> str | None:
    """Why vLLM cannot run here, or None."""
    if not settings.python.exists():
        return f"the vLLM engine is not installed (its interpreter {_short(settings.python)} is missing; install it with {SETUP})"
    if version(settings.python) is None:
        return f"vLLM is not installed in {_short(settings.python.parent.parent)} ({SETUP} installs it)"
    return None


def has_arctic(python: Path) -> bool:
    """Whether Arctic Inference (vLLM's `suffix` method runs its suffix tree) is installed beside vLLM."""
    return any((python.parent.parent / "lib").glob("python3*/site-packages/arctic_inference/suffix_decoding"))


def missing(mode) -> str | None:
    """Why vLLM has no method for the mode (an entry of app/modes/), or None when it has one."""
    if mode.vllm is None:
        return mode.vllm_missing or f"vLLM has no {mode.label} decoding: run it on the transformers backend"
    return None


def method_reason(request: DecodeRequest, artifact: Path | None = None) -> str | None:
    """None when vLLM runs the request's mode, else why not (in words)."""
    mode = request.mode
    if no_method := missing(request.entry):
        return no_method
    c = request.speculative_config
    if merged(c) is not None:
        return f"merging prompt lookup into the {mode} tree is this app's own: vLLM cannot; leave it unset"
    if request.entry.vllm == "eagle3":
        if artifact is not None and not is_eagle3(artifact):
            return ("vLLM's eagle3 loads EAGLE-3 checkpoints (an fc over three captured layers' hidden states and a "
                    "reduced-vocabulary head); this EAGLE module is the app's earlier design, which no engine loads: train "
                    "an EAGLE-3 module (python -m app train --mode eagle --eagle3)")
    return None


def ignored(request: DecodeRequest) -> list[str]:
    """The request's settings vLLM has no counterpart for (the engine runs without them): its mode's (the entry's
    vllm_ignored), and this app's tree pruning."""
    c, entry = request.speculative_config, request.entry
    out = entry.vllm_ignored(c) if entry.vllm_ignored else []
    if getattr(c, "min_path_prob", None):
        out.append("min_path_prob (this app's tree pruning)")
    return out


def is_eagle3(directory: Path) -> bool:
    """An EAGLE-3 checkpoint, or a module of this app's that exports to one (`train --eagle3`)."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if config.get("architecture") == "eagle":
        return bool(config.get("eagle3"))
    return any("Eagle3" in a for a in config.get("architectures") or [])


def speculative_config(request: DecodeRequest, model_dir: str | None = None, heads: int | None = None) -> dict[str, Any] | None:
    """vLLM's `--speculative-config` for a checked request, by vLLM's field names (the mode's entry: vllm, vllm_fields);
    None for autoregressive. `model` (the draft, the Medusa heads or the EAGLE-3 module) is filled in by the build,
    which knows where it put them; `heads` is the Medusa artifact's head count (vLLM's medusa drafts one token per head)."""
    entry = request.entry
    if entry.vllm == "":  # the mode needs no speculative method (autoregressive)
        return None
    if entry.vllm is None or entry.vllm_fields is None:
        raise VLLMError(method_reason(request) or f"vLLM cannot run {request.mode}")
    return {"method": entry.vllm, **entry.vllm_fields(request.speculative_config, model_dir, heads)}


def command(settings: Settings, model_dir: str, served_name: str, dtype: str, speculative: dict | None, port: int) -> list[str]:
    cmd = [str(settings.python), "-m", SERVER, "--model", model_dir, "--served-model-name", served_name,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--gpu-memory-utilization", str(settings.gpu_memory_utilization), "--max-model-len", str(settings.max_model_len),
           "--generation-config", "vllm"]  # sampling as each request says, not the model's generation_config defaults
    if settings.enforce_eager:
        cmd.append("--enforce-eager")
    if settings.distributed_executor_backend:
        cmd += ["--distributed-executor-backend", settings.distributed_executor_backend]
    if speculative is not None:
        cmd += ["--speculative-config", json.dumps(speculative, sort_keys=True)]
    return cmd


def environment(settings: Settings, engines: Path) -> dict[str, str]:
    """The server's environment: ours, less what would steer it wrongly, plus the operator's settings."""
    # ARCTIC_INFERENCE_ENABLED would let Arctic Inference's plugin patch vLLM (GPU-only); suffix needs only its tree.
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "PYTHONPATH", "VIRTUAL_ENV", "ARCTIC_INFERENCE_ENABLED")}
    env["VLLM_CACHE_ROOT"] = str(engines / "vllm-cache")  # compiled graphs kept with the engines, reused by later starts
    # vLLM 0.32's AOT compile cache cannot be read back on CPU (each start logged "Compiling model again due to a load
    # failure ... 'function' object has no attribute 'finalize_loading'" and compiled again). Without it the engine
    # reuses its inductor cache: a second start of one configuration took 76 s instead of 166-192 s here.
    env["VLLM_USE_AOT_COMPILE"] = "0"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env["HF_HUB_OFFLINE"] = "1"  # the model is a local directory; nothing to fetch
    if settings.kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_space_gib)
    if settings.distributed_executor_backend == "uni":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # without it vLLM's CPU platform turns "uni" back into "mp"
    if settings.reserved_cpus is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(settings.reserved_cpus)
    if settings.intel_openmp:
        lib = settings.python.parent.parent / "lib" / "libiomp5.so"  # where the intel-openmp wheel (a vLLM dependency) puts it
        if not lib.is_file():
            raise VLLMError(f"Intel's OpenMP is not in {_short(lib.parent)}: reinstall with {SETUP}")
        env["LD_PRELOAD"] = ":".join(filter(None, [str(lib), env.get("LD_PRELOAD", "")]))
    return env


# ----------------------------------------------------------------------------- processes


class Processes:
    """The running servers of the store's vLLM builds: start (once, under a lock), health, stop."""

    def __init__(self, builds: Path, settings: Settings) -> None:
        self.builds = builds
        self.settings = settings

    def state(self, build_id: str) -> dict[str, Any]:
        """{"state": "running" | "stopped", "url"?, "pid"?, "log_tail"?} of a vLLM build."""
        directory = self.builds / build_id
        server = read_server(directory / SERVER_JSON)
        if server and alive(server) and _healthy(server["url"]) and listening(server["pid"], server.get("port")):
            return {"state": "running", "url": server["url"], "pid": server["pid"], "started": server.get("started")}
        out: dict[str, Any] = {"state": "stopped"}
        if server:
            out["log_tail"] = log_tail(directory / SERVER_LOG)
        return out

    def ensure(self, manifest: dict, progress: Callable[[float, str], None], cancel=None) -> tuple[str, bool]:
        """The URL of the build's running server, and whether this call started it (else it was running: started
        by another caller, thread or process). Started at most once at a time across threads and processes."""
        build_id = manifest["id"]
        directory = self.builds / build_id
        state = self.state(build_id)
        if state["state"] == "running":
            return state["url"], False
        with locked(self.builds / f"{build_id}.server.lock"):
            state = self.state(build_id)
            if state["state"] == "running":
                return state["url"], False
            self.stop(build_id)  # a half-started or dead server's leftovers (its workers may still run)
            plan = json.loads((directory / "vllm.json").read_text())
            port = free_port()
            cmd = command(self.settings, plan["model_dir"], plan["served_model_name"], plan["dtype"],
                          plan["speculative_config"], port)
            proc = spawn(cmd, directory, environment(self.settings, self.builds.parent))
            url = f"http://127.0.0.1:{port}"
            server = {"pid": proc.pid, "url": url, "port": port, "command": cmd, "started": time.time()}
            (directory / SERVER_JSON).write_text(json.dumps(server, indent=1))
            start, reported = time.monotonic(), 0.0
            progress(0.0, f"starting the vLLM engine {build_id} (a first start compiles for minutes; later ones take about a minute)")
            while True:
                if proc.poll() is not None:
                    raise VLLMError(f"the vLLM engine {build_id} exited with status {proc.returncode} while starting; "
                                    f"its log ends:\n{log_tail(directory / SERVER_LOG)}")
                if _healthy(url) and listening(proc.pid, port):  # its /health, not another's on the port
                    # Its first requests pay one-off costs (allocations, kernel choice): paid here, untimed, so the
                    # first timed run (a race's baseline) measures the engine as later runs find it.
                    progress(0.97, f"vLLM engine {build_id} up after {time.monotonic() - start:.0f} s; warming it up")
                    warmed = _warm(url, plan["served_model_name"])
                    progress(1.0, f"vLLM engine {build_id} ready at {url} after {time.monotonic() - start:.0f} s"
                                  + ("" if warmed else " (its warm-up request failed; the first run pays its start-up costs)"))
                    return url, True
                waited = time.monotonic() - start
                if waited > START_TIMEOUT_S or (cancel is not None and cancel.is_set()):
                    self.stop(build_id)
                    why = "was cancelled" if waited <= START_TIMEOUT_S else f"did not answer within {START_TIMEOUT_S:.0f} s"
                    raise VLLMError(f"starting the vLLM engine {build_id} {why}; its log ends:\n{log_tail(directory / SERVER_LOG)}")
                if waited >= reported + 10:  # a line every 10 s, not every poll
                    reported = waited
                    progress(min(waited / 120, 0.95), f"starting the vLLM engine {build_id}: {waited:.0f} s")
                time.sleep(1.0)

    def stop(self, build_id: str) -> bool:
        """Stop the build's server and its workers; True when one was running."""
        return stop_server(read_server(self.builds / build_id / SERVER_JSON))


def _healthy(url: str) -> bool:
    # Asked only of a live server process: on a 2-core machine under a load of 13 (a test suite beside a build) a
    # running server took over 2 s to answer, and the Engines tab called it stopped.
    try:
        with urllib.request.urlopen(url + "/health", timeout=10.0) as r:
            return r.status == 200
    except WIRE_ERRORS:
        return False


# Untimed completions on a fresh engine before anyone's run: vLLM compiles and picks kernels per shape on first use,
# and a speculative engine's verify shapes appear only once something is drafted, so the second prompt repeats itself
# (n-gram and suffix methods draft from it). 2 rounds: a first run after a start measured 20.8 plain steps a step.
WARM_UP = ({"prompt": "The weather today is", "max_tokens": 8, "temperature": 0.0},
           {"prompt": "one two three four five, one two three four five, one two three four five, one two",
            "max_tokens": 24, "temperature": 0.0})
WARM_UP_ROUNDS = 2


def _warm(url: str, served_name: str) -> bool:
    """A few short untimed completions on a fresh engine; False when one fails (the engine still serves)."""
    try:
        for body in [json.dumps({**w, "model": served_name}).encode() for w in WARM_UP] * WARM_UP_ROUNDS:
            request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120.0) as r:
                r.read()
        return True
    except WIRE_ERRORS:
        return False


def _short(path: Path) -> str:
    """A path as the user's repository names it (no absolute server path in messages)."""
    try:
        return str(Path(path).resolve().relative_to(models.ROOT))
    except ValueError:
        return Path(path).name
