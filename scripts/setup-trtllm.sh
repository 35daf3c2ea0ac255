#!/usr/bin/env bash
# Create or update TensorRT-LLM's own virtualenv (.venv-trtllm in the repository root), where this project's worker
# (app/backends/tensorrt_llm/worker.py) runs TensorRT-LLM's LLM API. It gets its own interpreter because
# TensorRT-LLM pins numpy<2, torch<=2.9 and transformers 4.57, which would break the app's environment.
# Idempotent: a stamp inside .venv-trtllm holds what was installed.
#
# Only on a Linux x86_64/aarch64 host where nvidia-smi lists a GPU: TensorRT-LLM has wheels for nothing else, and
# importing it needs the CUDA driver. Elsewhere it says so in one line and exits 0, creating nothing, so that any
# setup may call it.
#
#   bash scripts/setup-trtllm.sh           # from any directory
#   PYTHON=python3.10 bash scripts/setup-trtllm.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

NO_GPU="TensorRT-LLM needs a Linux host with an NVIDIA GPU: see docs/tensorrt-llm.md"
case "$(uname -s)/$(uname -m)" in
    Linux/x86_64 | Linux/aarch64) ;;
    *) echo "$NO_GPU"; exit 0 ;;
esac
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "$NO_GPU"
    exit 0
fi

VENV=.venv-trtllm
STAMP="$VENV/.specdec-setup"
# Upstream's Linux install (https://nvidia.github.io/TensorRT-LLM/installation/linux.html, the CUDA 13.1 line): torch 2.9.1 built for CUDA 13.0 from
# PyTorch's index first (PyPI's default torch is built for CUDA 12.8), then the wheel; PyPI's tensorrt-llm 1.2.1 is a
# stub that fetches the real wheel from NVIDIA's index, named here so that pip resolves it directly.
TORCH=(torch==2.9.1 --index-url https://download.pytorch.org/whl/cu130)
PACKAGES=(tensorrt-llm==1.2.1 --extra-index-url https://pypi.nvidia.com)

want="$(printf '%s\n' "${TORCH[@]}" "${PACKAGES[@]}" | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
    && "$VENV/bin/python" -c '' 2>/dev/null; then
    exit 0
fi

# Its wheels are cp310 and cp312 only (upstream tests on 3.12).
if [[ -z "${PYTHON:-}" ]]; then
    for candidate in python3.12 python3.10; do
        if command -v "$candidate" >/dev/null 2>&1; then PYTHON="$candidate"; break; fi
    done
fi
if [[ -z "${PYTHON:-}" ]]; then
    echo "setup-trtllm: TensorRT-LLM 1.2.1 has wheels for Python 3.12 and 3.10 only and neither is installed (set PYTHON=...)" >&2
    exit 1
fi

# mpi4py, a dependency, needs Open MPI's development files (upstream: apt-get install libopenmpi-dev).
if ! ldconfig -p 2>/dev/null | grep -q 'libmpi\.so'; then
    echo "setup-trtllm: installing libopenmpi-dev (Debian package), which TensorRT-LLM's mpi4py needs" >&2
    apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
    if ((EUID != 0)); then apt=(sudo "${apt[@]}"); fi
    "${apt[@]}" update -qq && "${apt[@]}" install -y -qq libopenmpi-dev >/dev/null \
        || { echo "setup-trtllm: could not install libopenmpi-dev; install it and run this again" >&2; exit 1; }
fi

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
    echo "setup-trtllm: creating $VENV with $("$PYTHON" --version 2>&1)" >&2
    "$PYTHON" -m venv --clear "$VENV"
fi

echo "setup-trtllm: installing tensorrt-llm 1.2.1 and torch 2.9.1 (CUDA 13) into $VENV (several GB)" >&2
rm -f "$STAMP"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q)
"${pip[@]}" install --upgrade pip setuptools wheel
"${pip[@]}" install "${TORCH[@]}"
"${pip[@]}" install "${PACKAGES[@]}"
"$VENV/bin/python" -c 'import tensorrt_llm' >/dev/null \
    || { echo "setup-trtllm: 'import tensorrt_llm' fails in $VENV" >&2; exit 1; }

echo "$want" > "$STAMP"
echo "setup-trtllm: $VENV ready" >&2
