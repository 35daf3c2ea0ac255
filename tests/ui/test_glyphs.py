"""Every symbol the web app writes renders in the fonts a lecture-room Linux machine has: status lines, notes and
token marks use ASCII plus an allowed set of symbols that DejaVu or Liberation (Debian chromium's fonts) draw. Emoji
such as ⏱ ⏹ ⏭ ⏳ have no glyph there and showed as empty boxes; ■ ◷ ▶ ⚠ ✓ ✗ say the same in text symbols."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT

UI = ROOT / "app" / "ui"

# Typography, Greek letters and maths for the figures, arrows and the token view's whitespace marks, and the status
# lines' marks: each in at least one of the fonts Debian's chromium installs (fonts-dejavu, fonts-liberation).
ALLOWED = set("·×÷αγδετᵢ–—’“”…₁←→↵⇥∅−≈≤≥␣■▶◀◷★⚠✓✗⟨⟩")


def shown_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module but its docstrings: what the module can put on the page."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


@pytest.mark.parametrize("module", sorted(str(p.relative_to(UI)) for p in UI.rglob("*.py")))
def test_the_ui_writes_only_symbols_the_lecture_rooms_fonts_draw(module):
    found = [f"line {line}: {c!r} (U+{ord(c):04X}) in {text[:60]!r}" for line, text in shown_strings(UI / module)
             for c in dict.fromkeys(text) if ord(c) > 127 and c not in ALLOWED]
    assert not found, "\n".join(found)


def test_the_allowed_symbols_have_a_glyph_in_an_installed_font():
    if shutil.which("fc-list") is None:
        pytest.skip("fc-list (fontconfig) is not installed: the installed fonts cannot be asked")
    missing = [f"{c} U+{ord(c):04X}" for c in sorted(ALLOWED)
               if not subprocess.run(["fc-list", f":charset={ord(c):x}", "family"], capture_output=True, text=True,
                                     timeout=30).stdout.strip()]
    assert not missing, f"no installed font draws {missing}"
