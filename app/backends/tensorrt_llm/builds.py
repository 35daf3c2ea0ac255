"""TensorRT-LLM's builds: a spec's plan (its LLM(...) arguments, the exports of this app's artifacts, what
TensorRT-LLM would refuse), the builder that runs it in this process, the one that prepares it for the worker in
TensorRT-LLM's own environment, and the LLM(...) arguments that serve a build. The engine bakes in the speculative
config (lookahead's (W, N, G) and the derived max_draft_len, a Medusa tree, ...), the build settings and the tensor
parallelism, so each is part of a build's id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app import models
from app.backends.store import (PLAN, BuildSpec, Builder, Engine, Progress, Store, artifact_config, dir_bytes,
                                export_eagle, export_medusa, fill_build_dir, installed, medusa_heads_of, model_dir_of,
                                uses_draft_model, uses_heads, write_json)
from app.backends.store import resolve as resolve_spec
from app.backends.tensorrt_llm import backend as trt
from app.heads import eagle
from app.modes import MODES, ConfigError, DecodeRequest, configs
from app.service.errors import BuildError, EngineError
from app.service.jobs import Limits

# Build settings of a TensorRT engine (BuildConfig); a spec may override them. The engine refuses a prompt over its
# max_input_len (BuildConfig's default 1024; LlmRequest::validate) and prompt + new tokens over its max_seq_len, so both
# come from what this app accepts: its longest prompt, and that plus its longest generation.
TRT_BUILD_DEFAULTS = {"max_batch_size": 8, "max_num_tokens": 8192, "max_input_len": Limits.max_prompt_tokens,
                      "max_seq_len": Limits.max_prompt_tokens + Limits.max_new_tokens}


def spec(request: DecodeRequest, model: str, *, build_config: dict | None = None, tensor_parallel_size: int = 1,
         **settings: Any) -> BuildSpec:
    """The build a checked request needs: the speculative config as the engine bakes it in, the build settings and
    the tensor parallelism."""
    unknown = sorted(set(build_config or {}) - set(TRT_BUILD_DEFAULTS))
    if unknown or tensor_parallel_size < 1:
        raise EngineError(f"build settings are {', '.join(TRT_BUILD_DEFAULTS)} and tensor_parallel_size >= 1; got {unknown or tensor_parallel_size}")
    c = request.speculative_config
    config: dict[str, Any] = {}
    if hasattr(c, "speculative_model"):
        config["speculative_model"] = c.speculative_model
    fields = c.model_dump(exclude={*request.entry.runtime_fields, "speculative_model"})
    for name in ("medusa_choices", "eagle_choices"):  # a tree by its paths, not by a name whose file may change
        if fields.get(name) is not None:
            fields[name] = configs.medusa_choices(fields[name] if isinstance(fields[name], str) else json.dumps(fields[name]))
    config.update(speculative_config=fields, max_draft_len=trt.trtllm_engine_draft_len(request),
                  trtllm_backend=trt.trtllm_backend(request),
                  tensor_parallel_size=tensor_parallel_size)
    if config["trtllm_backend"] == "tensorrt":
        config["build_config"] = {**TRT_BUILD_DEFAULTS, **(build_config or {})}
    return resolve(BuildSpec(model, c.mode, "tensorrt_llm", config, versions()))


def versions() -> dict:
    return installed(("tensorrt_llm",))


def resolve(spec: BuildSpec) -> BuildSpec:
    # A draft model is always named (TensorRT-LLM has no shipped one); an artifact may be a hub id TensorRT-LLM loads.
    return resolve_spec(spec, shipped_draft=False, local_artifact=False)


def builder(spec: BuildSpec, engines: Path) -> Builder:
    """The worker's builder for a spec it runs in TensorRT-LLM's own environment, else this process's."""
    return trtllm_worker_builder(spec, engines) if spec.config.get("worker") else trtllm_builder(spec, engines)


def plan(spec: BuildSpec, engines: Path) -> dict:
    return trtllm_plan(spec, engines)


def _request(spec: BuildSpec) -> DecodeRequest:
    """The checked DecodeRequest a tensorrt_llm spec was derived from (its build-relevant part)."""
    cfg = spec.config
    fields = dict(cfg.get("speculative_config") or {"decoding_type": MODES[spec.mode].decoding_type})
    if "speculative_model" in cfg:
        fields["speculative_model"] = cfg["speculative_model"]
    request = MODES.request(speculative_config=fields, backend="tensorrt_llm", trtllm_backend=cfg.get("trtllm_backend"))
    request.check()
    trt.check(request)
    return request


def trtllm_plan(spec: BuildSpec, engines: Path = models.DEFAULT_ENGINES) -> dict:
    """The TensorRT-LLM build of `spec` as pure data, its arguments as TensorRT-LLM 1.2 names and means them
    (docs/tensorrt-llm.md). "{build_dir}" stands for the build directory, "{checkpoint_dir}" for a TensorRT-LLM
    checkpoint converted from the model. `notes` says what is not sent or means something else there;
    `cannot_run` why TensorRT-LLM would refuse this build (the builder stops on it)."""
    if spec.backend != "tensorrt_llm":
        raise EngineError(f"a TensorRT-LLM plan needs a tensorrt_llm spec, not {spec.backend}")
    spec = resolve(spec)
    request = _request(spec)
    flavour = spec.config.get("trtllm_backend") or MODES[spec.mode].trtllm[0]
    model_dir = model_dir_of(spec.model, engines)
    llm: dict[str, Any] = {"model": model_dir, "tensor_parallel_size": spec.config.get("tensor_parallel_size", 1)}
    prepare: list[dict] = []
    notes: list[str] = []  # the artifact's; Service.engine_plan adds trt.trtllm_notes (runtime fields are not in a spec)
    cannot_run: list[str] = []
    speculative = trt.trtllm_speculative_config(request)
    artifact_kind = request.entry.artifact  # how a trained artifact is prepared for TensorRT-LLM depends on its kind
    if speculative is not None and speculative["decoding_type"] == "Eagle" and flavour == "pytorch":
        speculative, dropped = trt.eagle3_on_pytorch(speculative)
        notes += dropped
    if speculative is not None:
        given = spec.config.get("speculative_model")
        # resolve() made sure an artifact mode has one
        src = given or (str(models.default_artifact(spec.model, spec.mode)) if uses_heads(spec.mode) else None)
        artifact = artifact_config(src)
        if artifact_kind == "medusa":
            heads = request.speculative_config.num_medusa_heads or medusa_heads_of(artifact)
            if heads is None:
                raise EngineError(f"set num_medusa_heads: TensorRT-LLM needs the Medusa head count and {src} does not say it "
                                  "(its Medusa conversion takes the config's value as given, models/medusa/config.py)")
            speculative["num_medusa_heads"] = heads
            if artifact.get("architecture") == "medusa":
                # TensorRT-LLM reads Medusa's own heads layout (medusa_lm_head.safetensors), not our artifact.
                prepare.append({"step": "export_medusa", "from": src, "to": "{build_dir}/medusa"})
                src = "{build_dir}/medusa"
        elif artifact_kind == "eagle":
            src = _eagle_plan(src, artifact, flavour, speculative, prepare, notes, cannot_run)
        elif uses_draft_model(spec.mode) and src:
            src = model_dir_of(src, engines)  # a registry alias is a directory of ours, not a hub id to download
        if "speculative_model" in speculative:
            speculative["speculative_model"] = src
        llm["speculative_config"] = {k: v for k, v in speculative.items() if v is not None}
    plan: dict[str, Any] = {"backend": "tensorrt_llm", "trtllm_backend": flavour, "llm_class": trt.LLM_CLASSES[flavour],
                            "prepare": prepare, "llm": llm, "save": None, "trtllm_build": None, "notes": notes,
                            "cannot_run": cannot_run}
    if flavour == "tensorrt":
        build = {**TRT_BUILD_DEFAULTS, **spec.config.get("build_config", {}),
                 "speculative_decoding_mode": request.entry.trtllm_engine_mode or "NONE",
                 "max_draft_len": trt.trtllm_engine_draft_len(request)}
        # A spec from before max_input_len was set, or one that lowers max_seq_len only: the prompt fits the sequence.
        build["max_input_len"] = min(build.get("max_input_len", TRT_BUILD_DEFAULTS["max_input_len"]), build["max_seq_len"])
        llm["build_config"] = build
        # In its own environment the worker's LLM builds the engine from the checkpoint as it starts: nothing is saved.
        plan["save"] = None if spec.config.get("worker") else "{build_dir}/engine"
        command = trt.trtllm_build_plan(request, "{checkpoint_dir}", "{build_dir}/engine", build["max_batch_size"])
        command += ["--max_input_len", str(build["max_input_len"]), "--max_seq_len", str(build["max_seq_len"]),
                    "--max_num_tokens", str(build["max_num_tokens"])]
        plan["trtllm_build"] = {
            "command": command,
            "checkpoint_dir": f"a TensorRT-LLM checkpoint converted from {model_dir} by its model family's "
            "convert_checkpoint.py" + (" with --medusa_model_dir <the heads>" if artifact_kind == "medusa" else ""),
        }
    else:
        llm["max_input_len"] = TRT_BUILD_DEFAULTS["max_input_len"]  # BaseLlmArgs.max_input_len, default 1024
        plan["note"] = "TensorRT-LLM's PyTorch backend builds no engine: LLM(**llm) loads the checkpoint at run time"
    return plan


def trtllm_serve_kwargs(store: Store, spec: BuildSpec) -> dict:
    """LLM(...) arguments, as plain data, that serve `spec`. What the plan builds (a TensorRT engine, Medusa heads
    in TensorRT-LLM's layout) comes from the store: built on first use, reused after. The PyTorch backend
    otherwise loads the checkpoint itself."""
    spec = resolve(spec)
    plan = trtllm_plan(spec, store.root)
    if plan["cannot_run"]:
        raise EngineError(f"TensorRT-LLM would refuse this: {'; '.join(plan['cannot_run'])}")
    # The model and a draft model of the registry are this app's directories, prepared here for every mode (the
    # PyTorch backend builds nothing that would prepare them): what the plan names exists before the engine starts.
    for name in (spec.model, spec.config.get("speculative_model")):
        if name in models.ALIASES or name in models.DRAFT_ALIASES:
            models.locate(name, store.root)
    llm = dict(plan["llm"])
    if plan["save"] or plan["prepare"]:
        build_dir = store.builds / store.build(spec)["id"]
        llm = fill_build_dir(llm, build_dir)
        if plan["save"]:
            # The engine bakes in the build settings; the tokenizer still comes from the model.
            llm.pop("build_config", None)
            llm.update(model=fill_build_dir(plan["save"], build_dir), tokenizer=plan["llm"]["model"])
    # No enable_iter_perf_stats: iteration statistics are engine-wide (every request of each iteration) and the backend
    # takes a run's figures from its own result (backend.py).
    if overlap_off(plan["trtllm_backend"], spec.mode):
        llm["disable_overlap_scheduler"] = True
    return llm


def overlap_off(trtllm_backend: str, mode: str) -> bool:
    """Whether an engine of this mode runs without the overlap scheduler, as upstream's NGram and DraftTarget examples
    on the PyTorch backend do (a runtime field: not in the plan)."""
    return trtllm_backend == "pytorch" and MODES[mode].trtllm_no_overlap



def _eagle_plan(src: str, artifact: dict, flavour: str, speculative: dict, prepare: list, notes: list, cannot_run: list) -> str:
    """EAGLE's part of a TensorRT-LLM plan; returns the speculative_model to pass.

    PyTorch backend: an EAGLE-3 checkpoint under TensorRT-LLM 1.2's parameter names, with the target layers it reads
    as eagle3_layers_to_capture in TensorRT-LLM's numbering (the output of decoder layer i; upstream's default is
    {1, L//2-1, L-4}: a module trained on others would silently mismatch). A `train` output of ours is exported to
    that layout first (heads/eagle.export_checkpoint); an exported checkpoint, ours or another trainer's, says its
    layers in its config.json (eagle.aux_layers_of). The engine backend builds EAGLE-1/2 checkpoints in the EAGLE
    repository's layout (models/eagle/config.py), which this app does not write."""
    trained = artifact.get("architecture") == "eagle"  # a `train` output, not yet a checkpoint engines load
    aux = (artifact.get("aux_layers") if trained else eagle.aux_layers_of(artifact)) or []
    layers = [i - 1 for i in aux]  # hidden-state index i = decoder layer i-1's output
    if flavour == "tensorrt":
        if trained or artifact.get("eagle_config"):
            what = ("this app's module, which exports to the EAGLE-3 layout only" if trained else
                    "in the EAGLE-3 / ModelOpt layout (its config.json has eagle_config)")
            cannot_run.append(f"TensorRT-LLM's engine backend builds EAGLE-1/2 checkpoints (the EAGLE repository's layout, "
                              f"converted by its examples/eagle/convert_checkpoint.py); {src} is {what}: use the PyTorch "
                              "backend with an EAGLE-3 checkpoint")
        return src
    if trained:
        prepare.append({"step": "export_eagle", "from": src, "to": "{build_dir}/eagle"})
        if not artifact.get("eagle3"):
            h = artifact.get("hidden_size")
            cannot_run.append(
                f"the EAGLE module at {src} is not an EAGLE-3 checkpoint: its fc maps [{2 * h} → {h}] (the next token's "
                f"embedding and the final hidden state) plus an fc_aux over its fused layers, where EAGLE-3's fc maps "
                f"[{len(layers) * h} → {h}] and its attention reads 2H = {2 * h}; TensorRT-LLM's PyTorch backend runs "
                "EAGLE-3 only. Train an EAGLE-3 module (python -m app train --mode eagle --eagle3) and pass it")
        src = "{build_dir}/eagle"
    elif artifact.get("eagle_config"):
        _check_eagle3_checkpoint(Path(src), artifact, len(layers) or 3, cannot_run)
    if layers:
        speculative["eagle3_layers_to_capture"] = sorted(layers)
        if min(layers) < 0:
            cannot_run.append(f"the EAGLE module at {src} fuses the target's embeddings (hidden state 0): TensorRT-LLM "
                              "captures decoder-layer outputs only (eagle3_layers_to_capture)")
        if len(layers) == 1:
            cannot_run.append(f"the EAGLE module at {src} reads one target layer: TensorRT-LLM 1.2 makes EAGLE-3's fc only "
                              "for more than one captured layer (_torch/models/modeling_speculative.py Eagle3DraftModel) and "
                              "would leave this module's fc out")
    else:
        notes.append(f"the target layers {src} reads are not known here: TensorRT-LLM captures its default "
                     "{1, L//2-1, L-4}, which must be the ones the module was trained on")
    return src


def _check_eagle3_checkpoint(directory: Path, config: dict, captured: int, cannot_run: list) -> None:
    """What TensorRT-LLM 1.2 loading an EAGLE-3 checkpoint would stop on (_torch/models/modeling_speculative.py at
    1.2.0rc2): Eagle3DraftModel's parameters are copied by name with no renaming, so the draft layer must be
    `midlayer.*`, and its fc takes target_hidden_size x the captured layers (3 unless eagle3_layers_to_capture
    says otherwise). A hub id is left to TensorRT-LLM."""
    if not (directory / eagle.EXPORT_WEIGHTS).is_file():
        return
    shapes = eagle.tensor_shapes(directory)
    if not any(k.startswith("midlayer.") for k in shapes) and any(k.startswith("layers.") for k in shapes):
        cannot_run.append(f"{directory} names its draft layer `layers.0.*` (later ModelOpt exports): TensorRT-LLM 1.2.0rc2 "
                          "loads EAGLE-3 weights by the names `midlayer.*` and renames nothing (a missing one is a "
                          "KeyError); rename the `layers.0.` keys to `midlayer.`")
    width = int(config.get("target_hidden_size") or config.get("hidden_size") or 0) * captured
    fc = shapes.get("fc.weight")
    if captured > 1 and (fc is None or fc[-1] != width):
        got = "has no fc" if fc is None else f"has an fc over {fc[-1]} inputs"
        cannot_run.append(f"{directory} {got}: TensorRT-LLM makes EAGLE-3's fc over target_hidden_size x {captured} "
                          f"captured layers = {width} inputs and its load fails on anything else")




def trtllm_builder(spec: BuildSpec, engines: Path) -> Builder:
    """Writes plan.json first, then runs it through TensorRT-LLM's LLM API and saves the engine."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        plan = trtllm_plan(spec, engines)
        write_json(out / PLAN, plan)
        progress(0.05, "wrote the build plan")
        if plan["cannot_run"]:
            raise BuildError(f"TensorRT-LLM would refuse this build: {'; '.join(plan['cannot_run'])}; the build plan is in {out / PLAN}")
        state = trt.probe()
        if not state.available:
            raise BuildError(f"TensorRT-LLM cannot build here: {state.reason}; the build plan is in {out / PLAN}")
        where = models.locate(spec.model, engines)
        source = {"model": spec.model, "model_path": where, "model_bytes": dir_bytes(where),
                  "speculative_model": spec.config.get("speculative_model"),
                  "tensorrt_llm": versions()["tensorrt_llm"]}
        _trtllm_exports(plan, spec.model, where, out, progress)
        try:
            kwargs = trt.llm_objects(fill_build_dir(plan["llm"], out))  # checked by the installed version's own classes
        except ConfigError as err:
            raise BuildError(str(err)) from err
        if plan["save"]:  # the PyTorch backend has nothing to compile: its LLM is made when it serves
            progress(0.2, f"building with {plan['llm_class']} (this takes minutes)")
            llm = trt.import_object(plan["llm_class"])(**kwargs)
            try:
                progress(0.9, "saving the engine")
                llm.save(fill_build_dir(plan["save"], out))
            finally:
                llm.shutdown()
        kind = "tensorrt-engine" if plan["save"] else "tensorrt-pytorch"
        return {"kind": kind, "source": source, "plan": PLAN}

    return build


def trtllm_worker_builder(spec: BuildSpec, engines: Path) -> Builder:
    """What TensorRT-LLM's worker, in its own environment, loads from disk, made by this app: the model and a draft
    model of the registry prepared, the artifacts exported (plan.json's `prepare`). Nothing of TensorRT-LLM runs here:
    the worker's LLM builds the TensorRT engine (lookahead, Medusa) from the checkpoint itself when it starts."""
    spec = resolve(spec)

    def build(out: Path, progress: Progress) -> dict:
        plan = trtllm_plan(spec, engines)
        write_json(out / PLAN, plan)
        if plan["cannot_run"]:
            raise BuildError(f"TensorRT-LLM would refuse this build: {'; '.join(plan['cannot_run'])}")
        progress(0.05, f"preparing the model {spec.model}")
        where = models.locate(spec.model, engines)
        source: dict[str, Any] = {"model": spec.model, "model_path": where, "model_bytes": dir_bytes(where)}
        draft = spec.config.get("speculative_model")
        if draft in models.DRAFT_ALIASES or draft in models.ALIASES:  # the plan names its directory, which must exist
            progress(0.1, f"preparing the draft model {draft}")
            source.update(speculative_model=draft, speculative_model_path=models.locate(draft, engines))
        _trtllm_exports(plan, spec.model, where, out, progress)
        return {"kind": "tensorrt-worker", "source": source, "plan": PLAN}

    return build


def _trtllm_exports(plan: dict, model: str, where: str, out: Path, progress: Progress) -> None:
    """The plan's `prepare` steps: this app's artifacts exported where the plan's LLM(...) arguments name them."""
    for step in plan["prepare"]:
        progress(0.1, f"{step['step']}: from {step['from']}")
        export = {"export_medusa": export_medusa,
                  # ModelOpt 0.37's layout: `midlayer.*` names, TensorRT-LLM's numbering in its config
                  "export_eagle": lambda *a: export_eagle(*a, layout="modelopt")}[step["step"]]
        export(Path(step["from"]), Path(where), Path(fill_build_dir(step["to"], out)), model)


ENGINE = Engine(versions=versions, resolve=resolve, builder=builder, plan=plan, spec=spec)
