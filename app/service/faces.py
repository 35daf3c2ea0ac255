"""Two faces of the Service (api.py composes them with its generation face): engines (the builds a request needs, made,
listed, stopped and removed, the servers of the engines it keeps, and in public mode who owns which build) and training
(runs of the seed workflow, service/training.py, within the policy's bounds)."""

from __future__ import annotations

import math
import shutil
import threading
from pathlib import Path
from typing import Any

from app.backends.base import Backend
from app.backends.registry import EngineStore, spec_for
from app.backends.store import BuildSpec, Progress
from app.modes import ConfigError, DecodeRequest
from app.modes.errors import one_line
from app.service import training
from app.service.errors import BuildError, EngineError
from app.service.policy import Policy
from app.training import export


class Face:
    """What a face uses of the Service, set where the Service is made (api.py). The faces also call each other: a
    request is checked by the generation face (Service.request), and a training run is a build, listed and claimed
    as the engines face lists and claims builds."""

    engines: Path
    store: EngineStore
    policy: Policy
    model: str
    dtype: str
    tensor_parallel_size: int
    backends: dict[str, Backend]
    keepers: list[Backend]  # the backends that keep engine processes on the store


class Engines(Face):
    """What the Service does with builds and engines. It asks each backend through its face (backends/base.py), by a
    request's backend name or over the `keepers`."""

    _owners: dict[str, set[str]]
    _owners_lock: threading.Lock
    _visitor_made: Path

    def engine(self, request: DecodeRequest, model: str, progress: Progress | None = None,
               visitor: str | None = None) -> tuple[dict[str, Any], str]:
        """The build of a request on a managed backend (vLLM, TensorRT-LLM's worker) and its running server's URL
        (built, started or reused); the visitor's when this made it (engine_build: also when they re-made another
        visitor's)."""
        existed = self._ready(self.engine_id(request, model))
        manifest, url = self.backends[request.backend].engine(model, request, progress)
        self._claim(manifest["id"], visitor, existed)
        return manifest, url

    def engine_id(self, request: DecodeRequest, model: str) -> str:
        """The id of the build each engine backend makes of the request (its `engine`, or the in-process TensorRT-LLM
        backend's LLM arguments: registry.make)."""
        try:
            return self.store.spec_id(self._spec(request, model))
        except EngineError as err:
            raise ConfigError(str(err)) from None

    def _spec(self, request: DecodeRequest, model: str) -> BuildSpec:
        own = self.backends[request.backend].spec(request, model)
        if own is not None:
            return own
        return spec_for(request, model, tensor_parallel_size=self.tensor_parallel_size, dtype=self.dtype)

    def _check_operators_engine(self, request: DecodeRequest, model: str) -> None:
        """A public server's anonymous client (no web page: `serve --public`) starts no engine: it may decode on one the
        operator started (running), else it is refused before anything is built."""
        backend = self.backends[request.backend]
        if not backend.engine_builds:
            return
        build_id = self.engine_id(request, model)
        up = backend.running(build_id) if backend.managed else self._ready(build_id)
        if up and not self.visible(build_id, None):  # a web visitor's engine is theirs, not the operator's
            up = False
        if not up:
            raise ConfigError(f"this public server's clients decode only on engines its operator started, and no "
                              f"{request.backend} engine for these settings is running: use the transformers backend")

    def engine_spec(self, data: dict[str, Any] | DecodeRequest, model: str | None = None, visitor: str | None = None) -> BuildSpec:
        return self._spec(self.request(data, visitor), model or self.model)

    def engine_plan(self, data: dict[str, Any] | DecodeRequest, model: str | None = None, visitor: str | None = None) -> dict[str, Any]:
        """What a build would do, as data; paths relative to the server's folders (responses never show them)."""
        request = self.request(data, visitor)
        plan = self.store.plan(self.engine_spec(request, model, visitor))
        if notes := self.notes(request):  # what its engine does not take, from the request: a spec keeps no runtime field
            plan["notes"] = notes + plan["notes"]
        return self.relative(plan)

    def engine_build(self, data: dict[str, Any] | DecodeRequest, model: str | None = None,
                     progress: Progress | None = None, visitor: str | None = None) -> dict[str, Any]:
        """The manifest of the build this config needs: reused, or built now (once, however many ask). In public mode
        the build is the visitor's when they made it, or re-made one another visitor made; an operator's stays read-only.
        A managed backend's engine (vLLM's server, TensorRT-LLM's worker) is also started (or found running): its
        manifest then carries `server` ({state, url or port, pid, started_here})."""
        self._check_visitor(visitor)
        spec = self.engine_spec(data, model, visitor)
        request = self.request(data, visitor)
        if self.backends[request.backend].managed:
            manifest, _ = self.engine(request, model or self.model, progress, visitor)
            return self._with_server(manifest)
        existed = self._ready(self.store.spec_id(spec))
        manifest = self.store.build(spec, progress=progress)
        self._claim(manifest["id"], visitor, existed)
        return manifest

    def engine_list(self, visitor: str | None = None) -> list[dict[str, Any]]:
        """The ready builds this caller sees (all; in public mode the operator's and the visitor's own), newest first;
        a vLLM engine's carries `server`: running (url, pid) or stopped."""
        return [self._with_server(m) for m in self.store.list() if self.visible(m["id"], visitor)]

    def engine_removable(self, visitor: str | None = None) -> list[str]:
        """The ids this caller may remove: all; in public mode only the visitor's own."""
        return [m["id"] for m in self.engine_list(visitor) if not self.policy.public or self._owns(m["id"], visitor)]

    def engine_get(self, build_id: str) -> dict[str, Any] | None:
        manifest = self.store.get(build_id)
        return self._with_server(manifest) if manifest else None

    def engine_stop(self, build_id: str, visitor: str | None = None) -> bool:
        """Stop a build's engine (a vLLM server, TensorRT-LLM's worker; the build stays); True when one was running. In
        public mode a visitor stops only their own (engine_removable), with the same answer whether the id exists or is
        someone else's."""
        if self.policy.public and build_id not in self.engine_removable(visitor):
            raise ConfigError(f"'{one_line(build_id)}' is not an engine of yours: in public mode a visitor stops only "
                              "the engines they started in this page (the operator manages the rest)")
        # store.get refuses what is not a build id (a path) before the process layer reads anything.
        keeper = self._keeper(self.store.get(build_id))
        return keeper.stop(build_id) if keeper else False

    def engine_remove(self, build_id: str, visitor: str | None = None) -> None:
        """Remove a build (its engine is stopped first). In public mode a visitor removes only their own (one answer
        whether the id exists or is someone else's); when other visitors made it too, only this visitor's claim goes
        and the build stays theirs."""
        if self.policy.public:
            with self._owners_lock:
                owners = self._owners.get(build_id, set())
                if visitor is None or visitor not in owners:
                    raise ConfigError(f"'{one_line(build_id)}' is not a build of yours: in public mode a visitor removes only "
                                      "the builds they made in this page (the operator manages the rest)")
                owners.discard(visitor)
                if owners:
                    return
                del self._owners[build_id]
        if keeper := self._keeper(self.store.get(build_id)):
            keeper.stop(build_id)  # ownership was checked above
        self.store.remove(build_id)
        (self._visitor_made / build_id).unlink(missing_ok=True)

    def _keeper(self, manifest: dict[str, Any] | None) -> Backend | None:
        """The backend that keeps the server of a build (by its kind), or None: a build no process serves."""
        kind = (manifest or {}).get("kind")
        return next((k for k in self.keepers if kind is not None and k.kind == kind), None)

    def _with_server(self, manifest: dict[str, Any]) -> dict[str, Any]:
        keeper = self._keeper(manifest)
        return {**manifest, "server": keeper.server(manifest["id"])} if keeper else manifest

    def engines_started(self) -> list[tuple[str, str]]:
        """(backend, build id) of each engine this service started that still runs as its own, by name."""
        return sorted((k.name, build_id) for k in self.keepers for build_id in k.started)

    def engine_running(self, backend: str, build_id: str) -> bool:
        """Whether the engine of a build runs now on `backend` (a registry name)."""
        return self.backends[backend].running(build_id)

    def engine_room(self, backend: str) -> int | None:
        """How many more engines requests may start on `backend` now (public mode's bound; None: no bound)."""
        return self.backends[backend].room()

    def engine_release(self, backend: str, build_id: str) -> None:
        """Stop an engine this service started on `backend` (a load sweep's, when it ends); others' are left alone."""
        self.backends[backend].release(build_id)

    def tokenizer(self, backend: str, model: str | None = None):
        """The tokenizer `backend` encodes `model`'s prompts with (an engine gets token ids)."""
        return self.backends[backend].tokenizer(model or self.model)

    # ------------------------------------------------------------------ ownership (public mode)
    def visible(self, build_id: str, visitor: str | None) -> bool:
        """Whether a caller sees a build: always off public mode; in it, the operator's (made by no visitor) and its own.
        A build a visitor made is marked in the store, so no other public process (`serve --public`, a restarted web
        app) takes it for the operator's."""
        if not self.policy.public:
            return True
        with self._owners_lock:
            owners = self._owners.get(build_id)
        if owners is not None:
            return visitor in owners
        return not (self._visitor_made / build_id).exists()

    def _owns(self, build_id: str, visitor: str | None) -> bool:
        with self._owners_lock:
            return visitor is not None and visitor in self._owners.get(build_id, set())

    def _claim(self, build_id: str, visitor: str | None, existed: bool) -> None:
        """After a build or a run: the visitor's when they made it, or when another visitor's build was re-made."""
        if not self.policy.public or visitor is None:
            return
        with self._owners_lock:
            if not existed or build_id in self._owners:
                self._owners.setdefault(build_id, set()).add(visitor)
                self._visitor_made.mkdir(parents=True, exist_ok=True)
                (self._visitor_made / build_id).touch()

    def _check_visitor(self, visitor: str | None) -> None:
        if self.policy.public and not visitor:
            raise ConfigError("this public server builds and trains only for a visitor of its web page")

    def _ready(self, build_id: str) -> bool:
        manifest = self.store.get(build_id)
        return manifest is not None and manifest.get("status") == "ready"


class Training(Face):
    """What the Service does with training runs: checks a config against the policy, plans, runs one at a time within
    the policy's time limit, lists and exports the finished runs."""

    _training: threading.Lock  # one training run at a time: each takes both cores for minutes

    def train_config(self, data: dict[str, Any] | training.TrainConfig, visitor: str | None = None) -> training.TrainConfig:
        """A checked training config, its starting artifact included, within the policy's bounds. Raises
        ConfigError (one sentence)."""
        config = self._train_parse(data, visitor)
        training.start_dir(self.store, config, self.model)
        return config

    def train_plan(self, data: dict[str, Any] | training.TrainConfig, visitor: str | None = None) -> dict[str, Any]:
        """What training `data` would do before it runs (training.plan): reused, or how many answers to generate first."""
        return training.plan(self.store, self.model, self._train_parse(data, visitor))  # plan finds (and so checks) the start

    def _train_parse(self, data: dict[str, Any] | training.TrainConfig, visitor: str | None) -> training.TrainConfig:
        if not self.policy.train:
            raise ConfigError(TRAINING_OFF)
        config = training.parse(data)
        if self.policy.train_caps is not None:
            self.policy.train_caps.check(config)
        if config.init_from.startswith(training.PREFIX) and not self.visible(config.init_from.removeprefix(training.PREFIX), visitor):
            raise ConfigError(f"there is no finished training run '{config.init_from[:60]}' of yours to go on from")
        return config

    def train(self, data: dict[str, Any] | training.TrainConfig, progress: Progress | None = None,
              events: training.Events | None = None, cancel: threading.Event | None = None,
              visitor: str | None = None) -> dict[str, Any]:
        """Train Medusa heads or an EAGLE module on this server's frozen model (training.py) and keep them in the
        store; returns the build's manifest (reused when the same run was made before). `events` receives every
        progress event ({stage, done, total, loss}); setting `cancel` stops the run. One run at a time; the policy's
        time limit stops the training child (BuildError saying so)."""
        self._check_visitor(visitor)
        config = self._train_parse(data, visitor)
        start = training.start_dir(self.store, config, self.model)
        spec = training.spec(self.model, config, start)
        existed = self._ready(self.store.spec_id(spec))
        if not self._training.acquire(blocking=False):
            raise ConfigError("another training run is under way on this server: wait for it to finish")
        cancel = cancel or threading.Event()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            cancel.set()

        timer = threading.Timer(self.policy.train_time_limit_s, expire) if math.isfinite(self.policy.train_time_limit_s) else None
        data = self.engines / "data"  # what a run generates to train on (answers, features): up to hundreds of MB
        kept = set(data.glob("*"))
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            manifest = self.store.build(spec, training.builder(self.model, config, start, self.engines, events=events,
                                                               cancel=cancel), progress=progress)
        except BuildError as err:
            if expired.is_set():
                raise TrainingTimeout(f"the run was stopped by this server's time limit of {self.policy.train_time_limit_s:g} s "
                                 "per training run, before it finished") from err
            raise BuildError(self.relative(str(err))) from err
        finally:
            if timer is not None:
                timer.cancel()
            if self.policy.public:  # a visitor's run stores no data beyond itself; the operator's stay cached for reuse
                for made in set(data.glob("*")) - kept:
                    shutil.rmtree(made, ignore_errors=True)
            self._training.release()
        self._claim(manifest["id"], visitor, existed)
        return manifest

    def trained(self, kind: str | None = None, visitor: str | None = None) -> list[dict[str, Any]]:
        """The finished training runs for this server's model that the caller sees (their manifests, newest first)."""
        return [m for m in self.engine_list(visitor) if m["spec"]["backend"] == "training" and m["spec"]["model"] == self.model
                and kind in (None, m["spec"]["mode"])]

    def training_run(self, name: str, visitor: str | None = None) -> dict[str, Any] | None:
        """The manifest of the finished training run `trained:<id>` for this server's model, or None."""
        return next((m for m in self.trained(visitor=visitor) if training.PREFIX + m["id"] == name), None)

    def export_trained(self, name: str, format: str | None = None, visitor: str | None = None) -> Path:
        """A zip of the finished training run `trained:<id>` exported for engines (app/training/export.py: the
        EAGLE-3 checkpoint vLLM loads, Medusa heads); made once per format and kept with the run."""
        import shutil
        import tempfile


        manifest = self.training_run(name, visitor)
        if manifest is None:
            raise ConfigError(f"there is no finished training run '{str(name)[:60]}' of yours to export")
        kind = manifest["spec"]["mode"]
        source = training.artifact_dir(self.store, name, kind, self.model)
        fmt = format or export.formats()[export.architecture(source)][0]
        out = source.parent / f"{kind}-{fmt}.zip"
        if not out.is_file():
            with tempfile.TemporaryDirectory(dir=source.parent) as tmp:
                folder = Path(tmp) / f"{manifest['id']}-{kind}-{fmt}"
                export.export(source, folder, self.model, fmt)
                made = shutil.make_archive(str(Path(tmp) / "export"), "zip", tmp, folder.name)
                Path(made).replace(out)  # whole or not at all: a cancelled export leaves no half zip
        return out


class TrainingTimeout(BuildError):
    """A training run the policy's time limit stopped; the message says so."""


TRAINING_OFF = ("training is off on this public server: a run takes both CPU cores of a machine every visitor shares "
                "(the operator turns it on with --train-time-limit)")
