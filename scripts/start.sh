#!/usr/bin/env bash
# Set up (scripts/setup.sh) and start the web app on the bundled SmolLM2-135M-Instruct at
# http://127.0.0.1:7860 (the first run dequantizes the model into engines/models/, ~25 s).
# Arguments go to `python -m app`:
#
#   bash scripts/start.sh                        # http://127.0.0.1:7860
#   bash scripts/start.sh --port 8080 --dtype bfloat16
#   bash scripts/start.sh --host 0.0.0.0         # reachable from other machines: only when you mean it
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

exec .venv/bin/python -m app "$@"
