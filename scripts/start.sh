#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job. Until the web UI lands, that is one CLI
# generation with prompt lookup on the bundled SmolLM2-135M-Instruct (the first run dequantizes
# the model into engines/models/, ~25 s; later runs load it in seconds).
#
#   bash scripts/start.sh                                  # default prompt
#   bash scripts/start.sh Explain lookahead decoding.      # leading words are the prompt
#   bash scripts/start.sh "Write a haiku." --mode lookahead --max-new-tokens 64
#   bash scripts/start.sh --mode autoregressive --json     # flags only: default prompt
#
# Words before the first argument starting with '-' form the prompt; the rest are passed to
# `python -m app generate` as they are, and override the defaults below (--mode prompt_lookup).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

words=()
while (($#)) && [[ "$1" != -* ]]; do
    words+=("$1")
    shift
done
prompt="${words[*]:-Explain speculative decoding in two sentences.}"

exec .venv/bin/python -m app generate --mode prompt_lookup --prompt "$prompt" "$@"
