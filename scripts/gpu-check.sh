#!/usr/bin/env bash
# The GPU host's check of TensorRT-LLM (issue 61, item 5), from a fresh clone on a Linux host with one NVIDIA GPU:
# sets up TensorRT-LLM's environment (scripts/setup-trtllm.sh) and the app's (scripts/setup.sh), then runs every
# mode TensorRT-LLM supports on 3 prompts with the app's own artifacts, each through this project's worker, and
# prints per mode: ran / refused with the reason, τ, tokens/s, and the share identical to autoregressive (greedy).
# Exits non-zero when a mode that is not refused does not run. The driver is scripts/gpu_check.py.
#
#   bash scripts/gpu-check.sh             # on the GPU host
#   bash scripts/gpu-check.sh --dry-run   # anywhere: what each mode would start and send, or why it is refused
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${1:-}" == "--dry-run" ]]; then
    [[ -x .venv/bin/python ]] || bash scripts/setup.sh
    exec .venv/bin/python scripts/gpu_check.py --dry-run
fi
if [[ $# -gt 0 ]]; then
    echo "usage: bash scripts/gpu-check.sh [--dry-run]" >&2
    exit 2
fi

# First, as it is the step that says (in one line) when this host cannot run TensorRT-LLM at all.
bash scripts/setup-trtllm.sh
if [[ ! -x .venv-trtllm/bin/python ]]; then
    echo "gpu-check: nothing checked on this host; bash scripts/gpu-check.sh --dry-run prints the plan" >&2
    exit 2
fi
bash scripts/setup.sh
exec .venv/bin/python scripts/gpu_check.py
