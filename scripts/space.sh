#!/bin/sh
# The container's (the Space's) entry point: the web app on the image's environment, keeping its store of built things
# (engines/: the fast pass built for this CPU, trained runs, engine builds) on the Space's persistent storage when the
# Space has one (mounted at /data), so the fast pass built on the first start serves every restart after it instead of
# being built again. The image's dequantized model is linked in, not copied.
#
#   sh scripts/space.sh PERSISTENT_DIR [python -m app arguments...]     (the Dockerfile: /data)
set -eu
cd "$(dirname "$0")/.."
data=$1
shift
store=engines
if [ -d "$data" ] && [ -w "$data" ]; then
    store=$data/specdec-engines
    mkdir -p "$store"
    [ -e "$store/models" ] || ln -s "$PWD/engines/models" "$store/models"
    echo "space.sh: keeping the store on persistent storage: $store" >&2
fi
exec .venv/bin/python -m app --engines-dir "$store" "$@"
