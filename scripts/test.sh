#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite on 2 workers (pytest-xdist).
# CI runs exactly this (.ci/run). Extra arguments replace the default test path `tests`:
#
#   bash scripts/test.sh
#   bash scripts/test.sh tests/cli/test_cli.py -k lookahead
#
# Artifacts (JUnit XML; tests may write more under $TEST_ARTIFACTS_DIR) go to test-artifacts/.
# Exit code: pytest's, except that "no tests collected" (5) is a failure too.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# The browser tests drive Debian's chromium through Playwright (never `playwright install`, which
# downloads a browser of its own from a host that is not reachable here).
if ! command -v chromium >/dev/null 2>&1; then
    echo "test.sh: installing chromium (Debian package) for the browser tests" >&2
    apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
    if ((EUID != 0)); then apt=(sudo "${apt[@]}"); fi
    "${apt[@]}" update -qq && "${apt[@]}" install -y -qq chromium >/dev/null \
        || echo "test.sh: could not install chromium; the browser tests will fail" >&2
fi

# axe-core from npm, which the browser tests inject into the page for its accessibility check (.node/, not committed).
AXE=4.14.1
if ! grep -qs "\"version\": \"$AXE\"" .node/node_modules/axe-core/package.json; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "test.sh: installing npm (Debian package) for axe-core" >&2
        apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
        if ((EUID != 0)); then apt=(sudo "${apt[@]}"); fi
        "${apt[@]}" update -qq && "${apt[@]}" install -y -qq npm >/dev/null || true
    fi
    npm install --silent --no-audit --no-fund --prefix .node "axe-core@$AXE" >/dev/null \
        || echo "test.sh: could not install axe-core; the accessibility test will fail" >&2
fi

export TEST_ARTIFACTS_DIR="$PWD/test-artifacts"
mkdir -p "$TEST_ARTIFACTS_DIR"
# Two workers on two cores: one torch thread each avoids oversubscription.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# No hub access here: fail fast instead of waiting on network timeouts.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

status=0
# loadfile: a test module runs in one worker, so its module-scoped servers (the web apps, the vLLM engines of
# tests/backends/on_vllm/test_vllm.py) start once. (loadgroup would not do: pytest-xdist 3.8 marks groups by rewriting a node id
# attribute that pytest 9 no longer reads, so every group's tests were spread over both workers.)
# --durations: the slowest tests in the log, where the suite's time goes (it must stay under 35 minutes).
# --no-loadscope-reorder: files go out in collection order (tests/conftest.py puts the longest first), not by
# their number of tests, which sent the 14 slow vLLM tests out last.
.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=40 --junitxml="$TEST_ARTIFACTS_DIR/junit.xml" "${@:-tests}" || status=$?

if ((status == 5)); then
    echo "test.sh: no tests were collected; treating as failure" >&2
    exit 1
fi
exit "$status"
