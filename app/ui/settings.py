"""The Run tab's settings, generated from the mode registry (app/modes/, each entry's `controls`): every control
by name, their values on a fresh page, the settings presets, and the two directions between control values and the
service's DecodeRequest data (`to_request`, `from_request`). Functions of a registry; no components are made here
(run_tab.py makes them from the same `Control`s).
"""

from __future__ import annotations

from typing import Any

from app.modes.notation import CHOICES_DIR, ConfigError
from app.modes import MERGED_MODE, MERGED_SUFFIX, MODES, Control, Mode, Modes
from app.modes.shipped import DYNAMIC
from app.modes import configs
from app.service.training import PREFIX
from app.ui.controls import finite

SAMPLING = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")  # the Run tab's own, every mode's
ENGINE = ("backend", "dtype")
RUN_TAB_CHOICES = {"max_new_tokens": 64, "seed": 0}  # a short answer and a fixed seed on a fresh page
SHIPPED = "shipped"  # an artifact picker's choice of the model's shipped heads or module (speculative_model None)
TREES = tuple(sorted((p.stem for p in CHOICES_DIR.glob("*.json")), key=lambda name: (name != "default", name)))
STATIC_CHOICES = {"trees": TREES, "eagle_trees": (DYNAMIC, *TREES)}
PRESETS = ("defaults", "fastest here")
# An engine's maximum -> the request's own value bounded by it. TensorRT-LLM runs a request without its own
# lookahead_config with the engine's (W, N, G); with two rows of controls, raising N alone left the request at n = 3,
# the same run under a check line that promised a wider one. A move of a maximum takes the request's value with it
# (lower the request afterwards to run less), as a link's `la` without `la_req` does (links.parse).
FOLLOW = {"la_W": "la_w", "la_N": "la_n", "la_G": "la_g"}


def controls(mode: Mode) -> tuple[Control, ...]:
    """A mode's Run-tab controls, complete (app/modes/registry.py `Mode.run_controls`)."""
    return mode.run_controls()


def groups(modes: Modes = MODES) -> dict[str, tuple[Control, ...]]:
    """The modes with controls, in the registry's order, and their controls (one group of the Run tab each)."""
    return {m.name: c for m in modes if (c := controls(m))}


def keys(modes: Modes = MODES) -> tuple[str, ...]:
    """Every control of the Run tab, by name: sampling, each mode's, backend and dtype (also the order the
    /run_controls endpoint takes them in, after prompt, mode and race)."""
    return SAMPLING + tuple(c.key for cs in groups(modes).values() for c in cs) + ENGINE


def merge_boxes(modes: Modes = MODES) -> dict[str, str]:
    """Mode -> its control that merges prompt lookup's candidates into its tree."""
    return {m: c.key for m, cs in groups(modes).items() for c in cs if c.kind == "merge"}


def defaults(modes: Modes = MODES) -> dict[str, Any]:
    """Every control's value on a fresh page: its config's default (from_request of each mode's default config),
    except the Run tab's own choices (RUN_TAB_CHOICES, a control's `value`: a smaller EAGLE tree than its config's)."""
    values = dict.fromkeys(keys(modes))
    for m in modes:
        values.update(from_request({"speculative_config": {"decoding_type": m.decoding_type}}, modes)[1])
    values.update(RUN_TAB_CHOICES)
    values.update({c.key: c.value for cs in groups(modes).values() for c in cs if c.value is not None})
    return values


def preset_keys(modes: Modes = MODES) -> tuple[str, ...]:
    """What a settings preset sets: every mode's controls and the dtype; the sampling, the length, the pickers of
    draft models and trained artifacts and the backend stay the user's."""
    return tuple(c.key for cs in groups(modes).values() for c in cs if c.preset) + ("dtype",)


def preset(name: str, fast_dtype: str, modes: Modes = MODES) -> dict[str, Any]:
    """The values of preset_keys under a preset: the app's defaults (small trees, the server's dtype) or what the
    README's bench ran (each control's `fastest`, the fastest its sweeps found on a 2-core CPU) in `fast_dtype`
    (Service.fast_dtype: bfloat16 where the CPU has it natively)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown settings preset '{name}' (choose from {', '.join(PRESETS)})")
    values = defaults(modes)
    if name == "fastest here":
        values.update({c.key: c.fastest for cs in groups(modes).values() for c in cs if c.fastest is not None},
                      dtype=fast_dtype)
    return {k: values[k] for k in preset_keys(modes)}


def presets_note(fast_dtype: str) -> str:
    return ("defaults: small trees, the server's dtype. fastest here: what the README's bench ran — prompt lookup "
            "max_matching_ngram_size 3, the latest match, 2 matches verified together; EAGLE 8 tokens, depth 4, top-k 2; "
            f"draft-target max_draft_len 2; {fast_dtype} (this CPU's fastest dtype).")


def run_name(mode: str, values: dict[str, Any], modes: Modes = MODES) -> str:
    """What a run is called: its mode, or its merged tree's name when the mode's merge box is ticked."""
    box = merge_boxes(modes).get(mode)
    return mode + MERGED_SUFFIX if box and values.get(box) else mode


def visible(mode: str, values: dict[str, Any], modes: Modes = MODES) -> dict[str, bool]:
    """Which groups show: the mode's, and prompt lookup's when it sets the branch merged into the mode's tree."""
    merged = run_name(mode, values, modes) != mode
    return {m: m == mode or (merged and m == MERGED_MODE) for m in groups(modes)}


def follows(modes: Modes = MODES) -> dict[str, str]:
    """FOLLOW's pairs whose two controls this registry has."""
    have = set(keys(modes))
    return {lead: follower for lead, follower in FOLLOW.items() if lead in have and follower in have}


def follow(key: str, values: dict[str, Any], modes: Modes = MODES) -> dict[str, Any]:
    """The values a user's move of control `key` (already in `values`) carries along: a maximum's request value."""
    follower = follows(modes).get(key)
    return {follower: values[key]} if follower else {}


def mode_values(name: str, modes: Modes = MODES, **overrides) -> tuple[str, dict[str, Any]]:
    """(mode, control values) for a mode name of the command line, where `eagle+prompt_lookup` is EAGLE with the
    merge box ticked; the other controls at their defaults."""
    mode, merged = modes.split(name)
    values = dict(defaults(modes), **overrides)
    if merged:
        values[merge_boxes(modes)[mode]] = True
    return mode, values


def _number(values: dict[str, Any], key: str, name: str | None = None) -> float:
    return finite(values.get(key), name or key)


def _read(c: Control, value: Any) -> Any:
    """A control's value as its field takes it (a refusal names the control as its label does)."""
    if c.kind in ("slider", "number"):
        x = finite(value, c.name or c.label)
        return int(x) if c.step and float(c.step).is_integer() else x
    if c.kind in ("checkbox", "merge"):
        return bool(value)
    if c.kind == "choice" and c.choices == "drafts":
        return value or None
    if c.kind == "choice" and c.choices not in STATIC_CHOICES:  # an artifact picker: trained:<id>, or the shipped one
        return None if value in (None, "", SHIPPED) else value
    return value


def _fields(entry: Mode, values: dict[str, Any]) -> dict[str, Any]:
    """The config fields the mode's controls set."""
    typed = {c.key: _read(c, values.get(c.key)) for c in controls(entry)}
    out = {c.field: c.to_field(typed[c.key]) if c.to_field else typed[c.key] for c in controls(entry) if c.field}
    return out | (entry.to_fields(typed) if entry.to_fields else {})


def to_request(mode: str, values: dict[str, Any], modes: Modes = MODES) -> dict[str, Any]:
    """The service's DecodeRequest data for the Run tab's control values (TensorRT-LLM's field names)."""
    if mode not in modes:
        raise ConfigError(f"unknown mode '{mode}'")
    spec = {"decoding_type": modes[mode].decoding_type} | _fields(modes[mode], values)
    if run_name(mode, values, modes) != mode:
        spec[MERGED_MODE] = _fields(modes[MERGED_MODE], values)
    seed = values.get("seed")
    return {
        "speculative_config": spec,
        "sampling": {"temperature": _number(values, "temperature"), "top_p": _number(values, "top_p"),
                     "top_k": int(_number(values, "top_k")),
                     "seed": None if seed in (None, "") or _number(values, "seed") < 0 else int(_number(values, "seed"))},
        "max_new_tokens": int(_number(values, "max_new_tokens")),
        "backend": values.get("backend"),
        "dtype": values.get("dtype") or "auto",
    }


def _values(entry: Mode, config: Any) -> dict[str, Any] | None:
    """The control values that make this config, or None when its controls cannot say it (a custom tree, a heads
    directory of its own rather than a training run's name, a field no control sets away from its default)."""
    out: dict[str, Any] = {}
    said = set(entry.fields_made)
    for c in controls(entry):
        if not c.field:
            continue
        said.add(c.field)
        x = getattr(config, c.field)
        if c.kind == "choice" and c.choices == "drafts":
            if x is None:
                continue  # the page's own pick (the shipped draft)
        elif c.kind == "choice" and c.choices not in STATIC_CHOICES:
            if x is not None and not x.startswith(PREFIX):
                return None  # a directory: the pickers name the shipped artifact or a training run, never a path
            x = x or SHIPPED
        out[c.key] = c.from_field(x) if c.from_field else x
    if entry.from_fields:
        made = entry.from_fields(config)
        if made is None:
            return None
        out.update(made)
    for c in controls(entry):
        if c.kind == "choice" and c.choices in STATIC_CHOICES and c.key in out and out[c.key] not in STATIC_CHOICES[c.choices]:
            return None  # a tree of its own (paths, or a file this server does not ship)
    for name, info in type(config).model_fields.items():
        if name not in said and name not in ("decoding_type", MERGED_MODE) and getattr(config, name) != info.default:
            return None
    return out


def from_request(data: Any, modes: Modes = MODES) -> tuple[str, dict[str, Any]] | None:
    """to_request's inverse: the Run tab's mode and the control values that make this request (the ones it sets;
    sampling, length, backend and dtype always), or None when the Run tab cannot express it (an invalid request,
    a custom tree, a heads or module directory of its own)."""
    try:
        r = configs.parse(data, modes)
    except (ConfigError, ValueError, TypeError):
        return None
    c, s = r.speculative_config, r.sampling
    values: dict[str, Any] = {"max_new_tokens": r.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                              "top_k": s.top_k, "seed": -1 if s.seed is None else s.seed, "backend": r.backend, "dtype": r.dtype}
    own = _values(modes[c.mode], c)
    if own is None:
        return None
    values.update(own)
    merged = getattr(c, MERGED_MODE, None)
    if c.mode in merge_boxes(modes):
        values[merge_boxes(modes)[c.mode]] = merged is not None
    if merged is not None:
        values.update(_values(modes[MERGED_MODE], merged) or {})
    return c.mode, values


CONTROLS = keys()  # the app's registry's (tests and links read them; the Run tab reads its service's registry)
DEFAULTS = defaults()
