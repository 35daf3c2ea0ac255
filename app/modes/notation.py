"""The notations users write settings in: trees of rank paths, integer lists, W,N,G triples."""

from __future__ import annotations

import json
from pathlib import Path

from app.modes.errors import ConfigError, one_line

CHOICES_DIR = Path(__file__).resolve().parents[2] / "assets" / "medusa_choices"


def medusa_choices(spec: str) -> list[list[int]]:
    """A tree of per-depth rank paths: a name from assets/medusa_choices/ or a JSON list like [[0],[0,0],[1]]."""
    text = spec.strip()
    if len(text) > 65536:
        raise ConfigError(f"a tree is at most 65,536 characters of JSON; got {len(text):,}")
    if not text.startswith("["):
        # A name is looked up among the shipped files, never joined into a path: '../x' or an absolute path names no
        # preset, and the refusal is the same whether such a file exists or not.
        presets = {p.stem: p for p in CHOICES_DIR.glob("*.json")}
        if text not in presets:
            raise ConfigError(f"unknown tree '{one_line(spec, 60)}': use one of {', '.join(sorted(presets))} or a JSON list of paths")
        text = presets[text].read_text()
    try:
        paths = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, a number of thousands of digits, nested too deep
        raise ConfigError(f"a tree must be a JSON list of paths such as [[0],[0,0],[1]]; got '{one_line(spec, 60)}'") from None
    if not isinstance(paths, list) or not paths or len(paths) > 1024 or not all(
        isinstance(p, list) and 0 < len(p) <= 64 and all(isinstance(r, int) and 0 <= r < 1024 for r in p) for p in paths
    ):
        raise ConfigError("a tree must be a non-empty list (at most 1024) of non-empty paths (at most 64 deep) of ranks "
                          "in [0, 1024), e.g. [[0],[0,0],[1]]")
    known = {tuple(p) for p in paths}
    for p in paths:
        if len(p) > 1 and tuple(p[:-1]) not in known:
            raise ConfigError(f"tree path {p} has no parent path {p[:-1]}")
    if len(known) > 256:
        raise ConfigError(f"the tree has {len(known)} nodes; at most 256 (TensorRT-LLM's max_draft_len)")
    return [list(p) for p in sorted(known, key=lambda p: (len(p), p))]


def int_list(text: str, what: str) -> tuple[int, ...]:
    """Comma-separated integers such as 2,5 ('' = none)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers such as 2,5; got '{one_line(text)}'") from None


def parse_triple(text: str, what: str) -> tuple[int, int, int]:
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ConfigError(f"{what} must be three integers W,N,G such as 4,3,4; got '{one_line(text)}'")
    return parts  # type: ignore[return-value]
