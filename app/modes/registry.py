"""What a mode entry is (`Mode`, its `Flag`s and `Control`s) and a registry of them (`Modes`).

A mode is its config class (app/modes/configs.py: TensorRT-LLM's or vLLM's field names, defaults and bounds), its
drafter (app/decoding/drafters/) and its entry, which says everything else about it: its display name and colour,
whether it is lossless, which backends and engines run it and under which names, the command-line flags and Run-tab
controls. The shipped entries are app/modes/shipped.py's. Plain data: nothing here imports gradio, plotly or torch,
or any layer above this one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Union

from pydantic import Field, create_model

from app.modes import configs
from app.modes.errors import ConfigError

# The mode whose candidates a tree mode's tree may verify too: its config is the tree config's field of that name, and
# the merged tree's name is the tree mode's with MERGED_SUFFIX ("eagle+prompt_lookup").
MERGED_MODE = "prompt_lookup"
MERGED_SUFFIX = "+" + MERGED_MODE


@dataclass(frozen=True)
class Flag:
    """A command-line flag of a mode. `field` names the config field whose default, type and help it takes;
    `to_fields` turns an irregular flag's value (a W,N,G triple, a count off by one) into config fields."""

    name: str  # argparse dest: "eagle_total_tokens" is --eagle-total-tokens
    field: str | None = None
    help: str = ""
    to_fields: Callable[[Any], dict[str, Any]] | None = None
    default: Any = None  # for a flag with to_fields (a plain flag takes its field's default)
    kind: type = str  # for a flag with to_fields: bool = a switch


@dataclass(frozen=True)
class Short:
    """A link's short form: one parameter for a group of a mode's Run-tab controls, comma-separated in this order
    (`la=4,3,4` for la_W, la_N, la_G)."""

    name: str
    keys: tuple[str, ...]
    # The short form whose values these controls take when a link gives that one and not this: lookahead's request
    # runs the whole window unless the link says less.
    follows: str = ""


@dataclass(frozen=True)
class Control:
    """A Run-tab control of a mode. Its value is config field `field` (through `to_field` / `from_field` where the
    two differ, e.g. EAGLE's total tokens = max_total_draft_tokens + 1, the root counted); a control without a field is its mode's
    `to_fields` / `from_fields`' (lookahead's per-request w, n, g), or a merge box. What is left unset of a field's
    control comes from the field (`Mode.run_controls`): its label is the field's name (and other name), a slider's
    range the field's Bound (its `slider` range where narrower)."""

    key: str  # its name in the Run tab's values and in links: "pl_ngram"
    field: str | None
    label: str = ""
    kind: str = "slider"  # slider, number, checkbox, text, choice, merge (the box that merges prompt lookup's tree in)
    minimum: float | None = None
    maximum: float | None = None
    step: float = 1  # a whole step: the value is an int
    choices: str = ""  # a choice's menu: "trees", "eagle_trees", "drafts", or an artifact (train --mode's "medusa", "eagle")
    name: str = ""  # what a refusal calls it (default: its label)
    row: int = 0  # controls with the same row > 0 sit side by side
    value: Any = None  # the Run tab's start value where it is not the config's default (a smaller EAGLE tree)
    fastest: Any = None  # its value in the "fastest here" preset, where it differs from `value`
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    elem_id: str | None = None

    @property
    def preset(self) -> bool:
        """Whether settings presets set it: not the pickers of draft models and trained artifacts (the user's)."""
        return self.kind != "choice" or self.choices in ("trees", "eagle_trees")


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    config: type  # its config class (app/modes/configs.py); config.decoding_type is its TensorRT-LLM name
    colour: str  # its charts' colour
    lossless: str  # in words, as the Run tab says it
    # Its drafter class (app/decoding/drafters/) and its explainer module (app/ui/explain/), by module path
    # ("app.decoding.drafters.eagle:Eagle", "app.ui.explain.eagle") so that this layer imports nothing above it; the
    # layer that uses them resolves them (runner.drafter, explain.of). Objects do as well (a test's mode).
    drafter: str | type = ""
    explainer: str | Any = ""
    # The shapes of the provenance its drafter records in a step's `source` (what a replay keeps of it; the shape
    # vocabulary is app/traces.py's `_shaped`): {"match": ("opt", ("dict", {...}))}.
    provenance: dict[str, Any] = field(default_factory=dict)
    # Config fields an engine does not bake in (per request, or this app's loop only): a build's id leaves them out.
    runtime_fields: tuple[str, ...] = ()
    flags: tuple[Flag, ...] | None = None  # None: one flag per config field, `--<mode>-<field>`
    trtllm: tuple[str, ...] = ()  # TensorRT-LLM's backends that run it, the default first (llm_args.py supports_backend)
    trtllm_missing: str = ""  # why TensorRT-LLM has no such mode
    # TensorRT-LLM's speculative_config for a checked config beside its decoding_type: trtllm_fields(config, backend)
    # by its names (None: it runs without one), trtllm_ignored(config, backend) what of the config it has no field
    # for, in words; trtllm_check(request) refuses what it cannot take; trtllm_engine_mode is its engine's
    # SpeculativeDecodingMode member (BuildConfig.speculative_decoding_mode). app/modes/mappings.py has the shipped ones.
    trtllm_fields: Callable[[Any, str], dict[str, Any]] | None = None
    trtllm_ignored: Callable[[Any, str], list[str]] | None = None
    trtllm_check: Callable[[Any], None] | None = None
    trtllm_engine_mode: str = ""
    # What TensorRT-LLM takes per request beside the sampling (SamplingParams' own fields: lookahead's (w, n, g)).
    trtllm_request: Callable[[Any], dict[str, Any]] | None = None
    trtllm_no_overlap: bool = False  # upstream's examples run it without the overlap scheduler (PyTorch backend)
    vllm: str | None = None  # vLLM's speculative method ("" = none needed); None = vLLM cannot
    vllm_missing: str = ""  # why vLLM cannot
    vllm_compare: bool = False  # the Compare tab offers its run on a vLLM engine
    # vLLM's --speculative-config for a checked config, beside "method": vllm_fields(config, model, heads), by vLLM's
    # names (`model`: where the build put the draft, heads or module; `heads`: the Medusa artifact's head count); and
    # vllm_ignored(config): what of the config vLLM has no counterpart for, in words (the engine runs without it).
    vllm_fields: Callable[[Any, str | None, int | None], dict[str, Any]] | None = None
    vllm_ignored: Callable[[Any], list[str]] | None = None
    artifact: str = ""  # the trained artifact it drafts with, by `train --mode`'s name (draft, medusa, eagle)
    artifact_label: str = ""  # that artifact in words
    # How `train --mode <artifact>` makes one, by module path ("app.training.recipes:EAGLE"; app/training/recipes.py
    # `Recipe`); "" = this app does not train it.
    artifact_recipe: str | Any = ""
    # Heads or a module drafting beside the target: the function that loads one for a target model, by module path
    # ("app.heads.eagle:load_beside"; `load_beside(directory, target_model)`).
    artifact_loader: str | Callable[..., Any] = ""
    # Where the target runs its fast pass, the loaded artifact's own compiled pass: the function describing what is
    # exported ("app.decoding.compiled:draft_pass"; `(module, kv_dtype) -> compiled.Exported`), built once per artifact,
    # dtype and machine; the artifact takes it as `module.fast`. "" = it runs eagerly.
    artifact_pass: str | Callable[..., Any] = ""
    mergeable: bool = False  # its tree can verify prompt lookup's candidates too (<name>+prompt_lookup)
    merged_colour: str = ""
    drafts_free: bool = False  # drafting costs almost nothing (no model runs): render's explanation says so
    # This app's loop's own bounds on one step of it beyond the draft tokens every mode is held to (app/modes/limits.py):
    # loop_check(config) refuses what would make a step too long on the transformers backend.
    loop_check: Callable[[Any], None] | None = None
    tour: int | None = None  # its place in the Run tab's tour of the recordings (None: after those that have one)
    compared: bool = False  # the Compare tab ticks it on a fresh page, and `bench` runs it beside the baseline by default
    shorts: tuple[Short, ...] = ()  # its links' short forms
    # The Run tab: its controls (None: one per config field, app/ui/settings.py), the line above them, and the fields
    # the controls without a field make (to_fields: typed control values -> fields; from_fields: config -> control
    # values, None when the Run tab cannot express it).
    controls: tuple[Control, ...] | None = None
    heading: str = ""
    to_fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    from_fields: Callable[[Any], dict[str, Any] | None] | None = None
    fields_made: tuple[str, ...] = ()  # the config fields to_fields makes

    @property
    def decoding_type(self) -> str:
        return self.config.model_fields["decoding_type"].default

    @property
    def draft_model(self) -> bool:
        """It drafts with a model of its own (a draft model, by registry name or directory)."""
        return self.artifact == "draft"

    @property
    def heads(self) -> bool:
        """It drafts with a trained directory loaded beside the target (Medusa heads, an EAGLE module)."""
        return bool(self.artifact) and not self.draft_model

    @property
    def vllm_row(self) -> str | None:
        """The bench's row for vLLM doing this mode's job (None: vLLM has no method for it)."""
        return None if self.vllm is None else f"vllm_{self.vllm or 'generate'}"

    def run_controls(self) -> tuple[Control, ...]:
        """Its Run-tab controls, complete: its entry's, or one per plain config field (a bool, a number, a text), keyed
        `<mode>_<field>`; a number with a Bound is a slider. Fields of other types get none: a request that sets them
        is not one the Run tab can show."""
        if self.controls is not None:
            return tuple(self._completed(c) for c in self.controls)
        out = []
        for name, info in self.config.model_fields.items():
            kinds = configs.kinds_of(info.annotation)
            if name in ("decoding_type", "prompt_lookup") or len(kinds) != 1:
                continue
            kind, key = kinds[0], f"{self.name}_{name}"
            if kind is bool:
                out.append(self._completed(Control(key, name, kind="checkbox")))
            elif kind in (int, float):
                step = 1 if kind is int else 0.01
                b = configs.bound(self.config, name)
                out.append(self._completed(Control(key, name, kind="slider" if b else "number", step=step)))
            elif kind is str:
                out.append(self._completed(Control(key, name, kind="text")))
        return tuple(out)

    def _completed(self, c: Control) -> Control:
        if c.field is None:
            return replace(c, minimum=0 if c.minimum is None else c.minimum, maximum=1 if c.maximum is None else c.maximum)
        b = configs.bound(self.config, c.field)
        low, high = (b.slider or (b.low, b.high)) if b else (0, 1)
        label = c.label or c.field + (f" ({b.aka})" if b and b.aka else "")
        return replace(c, label=label, minimum=low if c.minimum is None else c.minimum,
                       maximum=high if c.maximum is None else c.maximum)

    def cli_flags(self) -> tuple[Flag, ...]:
        if self.flags is not None:
            return self.flags
        return tuple(Flag(f if f.startswith(self.name + "_") else f"{self.name}_{f}", f)
                     for f in self.config.model_fields if f not in ("decoding_type", "prompt_lookup"))


def resolve(ref: Any) -> Any:
    """What an entry names by module path: "pkg.module:Name" is that attribute, "pkg.module" the module; anything
    else is returned as it is. Called by the layers above, when they build or show a mode, never at import."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name) if name else loaded


def _merged(entries: list[Mode]) -> list[str]:
    return [m.name + MERGED_SUFFIX for m in entries if m.mergeable]


class Modes:
    """A registry of modes, in display order. MODES is the app's; a test builds its own with `with_`."""

    def __init__(self, *entries: Mode) -> None:
        self.entries = entries
        self._by_name = {m.name: m for m in entries}
        self._by_type = {m.decoding_type: m for m in entries}
        self.names = tuple(m.name for m in entries)
        self.merged = tuple(m.name + MERGED_SUFFIX for m in entries if m.mergeable)
        union = Annotated[Union[tuple(m.config for m in entries)], Field(discriminator="decoding_type")]
        # The request type these modes validate: its speculative_config is one of their configs.
        self.request = create_model("DecodeRequest", __base__=configs.DecodeRequest,
                                    speculative_config=(union, Field(default_factory=configs.AutoregressiveConfig)))
        self.request.modes = self

    def provenance(self) -> dict[str, Any]:
        """Every key a step's `source` may hold in these modes, with its shape (one shape per key: modes that record
        the same key record it alike)."""
        out: dict[str, Any] = {}
        for entry in self.entries:
            out.update(entry.provenance)
        return out

    def with_(self, *entries: Mode) -> Modes:
        return Modes(*self.entries, *entries)

    def __iter__(self) -> Iterator[Mode]:
        return iter(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Mode:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"unknown mode '{name}': choose one of {', '.join(self.names)}") from None

    def get(self, name: str) -> Mode | None:
        return self._by_name.get(name)

    def by_type(self, decoding_type: str) -> Mode:
        return self._by_type[decoding_type]

    def split(self, name: str, where: str = "") -> tuple[str, bool]:
        """(mode, whether prompt lookup merges into its tree) of a name such as `eagle+prompt_lookup`."""
        if name not in self.names and name not in self.merged:
            raise ConfigError(f"unknown mode '{name}'{where}: choose one of {', '.join(self.names + self.merged)}")
        return name.removesuffix(MERGED_SUFFIX), name in self.merged

    def label(self, name: str) -> str:
        """A mode's display name; a merged tree's (`eagle+prompt_lookup`) reads "EAGLE + prompt lookup"."""
        base, _, extra = name.partition("+")
        return self[base].label + (f" + {self[extra].label.lower()}" if extra else "")

    def colour(self, name: str) -> str | None:
        base, merged = self.split(name) if name in self.names or name in self.merged else (name, False)
        entry = self._by_name.get(base)
        return None if entry is None else entry.merged_colour if merged else entry.colour

    def parse(self, data: Any, max_new_tokens_limit: int | None = None) -> configs.DecodeRequest:
        return configs.parse(data, self, max_new_tokens_limit)

    def tour(self) -> list[str]:
        """The tour's order: the modes with a place in it, then every other mode, then their merged trees alike."""
        placed = sorted((m for m in self.entries if m.tour is not None), key=lambda m: m.tour)
        rest = [m for m in self.entries if m.tour is None]
        return [m.name for m in placed] + _merged(placed) + [m.name for m in rest] + _merged(rest)

    def shorts(self) -> dict[str, Short]:
        """Every link short form of these modes, by name."""
        return {s.name: s for m in self.entries for s in m.shorts}
