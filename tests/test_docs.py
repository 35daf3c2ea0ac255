"""The README stays short, the rest lives in docs/, and every file the README, docs/ and app/ point at is in the
repository (issue 32): a reference that resolves only on one developer's machine is a broken reference."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TOP = ("app", "assets", "docs", "scripts", "tests", "engines", "deploy", ".ci")
# Design notes that lived outside the repository, and outside paths; none may be cited.
FORBIDDEN = ("ALGORITHMS.md", "TRTLLM.md", "UX.md", "STYLE.md", "../shared", "/work/")

# A repository path written out: it starts with a top-level directory, and is not the tail of a longer path or URL.
PATH = re.compile(r"(?<![\w./@~-])(?:%s)/[\w./<>{}*…-]*" % "|".join(re.escape(t) for t in TOP))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[<>{}*…]|\.\.\.")


def markdown_files():
    return [README, *sorted(DOCS.glob("*.md"))]


def python_files():
    return sorted(p for p in (ROOT / "app").rglob("*.py") if "__pycache__" not in p.parts)


def runtime_store():
    """The directories of engines/ that the app creates at run time, as engines/README.md describes them."""
    table = (ROOT / "engines" / "README.md").read_text()
    return set(re.findall(r"^\| `([\w-]+)/", table, re.M))


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def resolves(token: str) -> bool:
    """A repo-root-relative path exists, or names a directory of the run-time store under engines/."""
    token = token.rstrip(".,")
    if PLACEHOLDER.search(token):  # a pattern (engines/builds/<id>/, shard-*.json), not a file
        return True
    path = ROOT / token
    if inside(path) and path.exists():
        return True
    parts = token.split("/")
    return parts[0] == "engines" and len(parts) > 1 and parts[1] in runtime_store()


def path_tokens(text: str):
    return [m.group(0) for m in PATH.finditer(text)]


def references(text: str, python: bool):
    """(kind, token) for every file reference: markdown links, and repository paths in backticks (in markdown)
    or anywhere (in Python: comments, docstrings and messages cite files without backticks too)."""
    if python:
        return [("path", t) for t in path_tokens(text)]
    found = [("link", m.group(1)) for m in LINK.finditer(text)]
    for span in CODE.findall(text):
        found += [("path", t) for t in path_tokens(span)]
    return found


def broken(text: str, base: Path, python: bool = False):
    """The references in text (a file in directory base) that do not resolve inside the repository."""
    bad = []
    for kind, token in references(text, python):
        if kind == "link":
            target = token.split("#")[0]
            if not target or re.match(r"[a-z][a-z+.-]*:", target):  # an anchor in the same file, https:, mailto:
                continue
            path = base / target
            if not (inside(path) and path.exists()):
                bad.append(token)
        elif not resolves(token):
            bad.append(token)
    return bad


def test_the_readme_is_at_most_16_kb():
    size = len(README.read_bytes())
    assert size <= 16384, f"README.md is {size} bytes; move detail to docs/"


def test_docs_holds_at_least_three_documents():
    names = sorted(p.name for p in DOCS.glob("*.md"))
    assert len(names) >= 3, names


@pytest.mark.parametrize("file", [*markdown_files(), *python_files()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_reference_resolves_inside_the_repository(file):
    bad = broken(file.read_text(), file.parent, python=file.suffix == ".py")
    assert bad == [], f"{file.relative_to(ROOT)} cites files that are not in the repository"


@pytest.mark.parametrize("file", [*markdown_files(), *python_files()], ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_cites_design_notes_or_paths_outside_the_repository(file):
    text = file.read_text()
    assert [bad for bad in FORBIDDEN if bad in text] == []


def test_the_reference_check_can_fail():
    """A missing file, a link out of the repository and an unknown store directory are caught; URLs, anchors,
    placeholders, the run-time store and paths inside commands are handled as such."""
    text = ("[a](../../outside.md) [b](https://example.com/app/x.py) [c](#layout) [d](vllm.md#engines) "
            "`app/nope.py` `engines/builds/<id>/` `engines/models/` `engines/nope/` `app/cli.py:` see `docs/`, "
            "`python -m app ship-data --output-dir assets/training_data` `x/app/nope.py` app/plain.py\n")
    assert broken(text, DOCS) == ["../../outside.md", "app/nope.py", "engines/nope/"]
    assert broken("# see app/plain.py and `app/cli.py`", ROOT / "app", python=True) == ["app/plain.py"]
    assert [bad for bad in FORBIDDEN if bad in "see /work/main/TRTLLM.md"] == ["TRTLLM.md", "/work/"]


def test_the_settings_reference_is_what_the_configs_say():
    """docs/settings.md is written from the configs' field metadata; a field, bound or help changed without it fails."""
    from app.modes import MODES
    from app.modes.reference import markdown

    assert (DOCS / "settings.md").read_text() == markdown(MODES), \
        "docs/settings.md is stale: python -m app.modes.reference > docs/settings.md"
