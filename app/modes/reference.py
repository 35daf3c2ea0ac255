"""docs/settings.md, written from the registry: every mode's settings with their defaults, ranges, command-line flags,
Run-tab controls (the names links use) and help, as the config fields' metadata says them (`configs.Bound`, each
field's description). `python -m app.modes.reference > docs/settings.md` writes it; tests/test_docs.py checks that the
file is what this writes.
"""

from __future__ import annotations

from typing import Any

from app.modes import configs
from app.modes.registry import Mode, Modes

HEAD = """# Settings

Every mode's settings, written from the configs themselves (`app/modes/reference.py` writes this file from each field's
metadata: its default, its range and its help): the request field (TensorRT-LLM's or vLLM's name), the command-line
flag of `generate`, `bench` and `serve`, and the Run tab's control (its key is the name a link uses). A value outside
its range is refused in one sentence before anything runs; a backend adds its own limits (the transformers backend's
draft tokens per step, TensorRT-LLM's support matrix, vLLM's methods: [service.md](service.md)).
"""


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "empty"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def mode_table(mode: Mode) -> str:
    config = mode.config
    flags: dict[str, list[str]] = {}
    for flag in mode.cli_flags():
        if flag.field:
            flags.setdefault(flag.field, []).append("--" + flag.name.replace("_", "-"))
    controls = {c.field: c.key for c in mode.run_controls() if c.field}
    rows = ["| field | default | range | flag | Run tab | what it does |", "|---|---|---|---|---|---|"]
    for name, info in config.model_fields.items():
        if name in ("decoding_type", "prompt_lookup"):
            continue
        b = configs.bound(config, name)
        rows.append("| " + " | ".join(_cell(x) for x in (
            f"`{name}`" + (f" ({b.aka})" if b and b.aka else ""), f"`{_value(info.default)}`", b.range() if b else "",
            " ".join(f"`{f}`" for f in flags.get(name, [])), f"`{controls[name]}`" if name in controls else "",
            info.description or "")) + " |")
    irregular = [f for f in mode.cli_flags() if not f.field]
    made = [c for c in mode.run_controls() if not c.field and c.kind != "merge"]
    lines = [f"## {mode.label} (`{mode.decoding_type}`)", "", *rows]
    if irregular:
        lines += ["", "Flags written otherwise than their fields: " + "; ".join(
            f"`--{f.name.replace('_', '-')}` ({f.help})" for f in irregular) + "."]
    if made:
        lines += ["", "Run-tab controls that set several fields: " + ", ".join(f"`{c.key}` ({c.label})" for c in made) + "."]
    if mode.mergeable:
        lines += ["", f"`{mode.name}+prompt_lookup` also verifies prompt lookup's candidates in its tree (`prompt_lookup`: "
                      "a Prompt lookup config, under prompt lookup's flags)."]
    return "\n".join(lines)


def markdown(modes: Modes) -> str:
    sampling = configs.SamplingConfig
    rows = ["| field | default | range | what it does |", "|---|---|---|---|"]
    for name, info in sampling.model_fields.items():
        b = configs.bound(sampling, name)
        rows.append(f"| `{name}` | `{_value(info.default)}` | {b.range() if b else ''} | "
                    f"{_cell(info.description or '')} |")
    b = configs.bound(configs.DecodeRequest, "max_new_tokens")
    parts = [HEAD, "## Sampling and length (every mode)", "", *rows,
             f"| `max_new_tokens` | `{configs.DecodeRequest.model_fields['max_new_tokens'].default}` | {b.range()} | "
             "the answer's length at most (a server may set a lower limit) |", ""]
    parts += [mode_table(m) + "\n" for m in modes if m.name != "autoregressive"]
    return "\n".join(parts)


if __name__ == "__main__":
    from app.modes import MODES

    print(markdown(MODES), end="")
