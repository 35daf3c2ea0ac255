"""The layers of app/ (docs/architecture.md): every import, at module level or inside a function, goes down or
sideways, never up, and no modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

# Bottom first. A module belongs to the longest prefix listed; it may import its own layer and those below.
LAYERS = [
    ["app.modes"],
    ["app.decoding", "app.decoding.drafters.base", "app.prompts", "app.figures"],  # the loop and the drafter interface it calls
    ["app.heads"],
    ["app.decoding.drafters"],
    ["app.models"],
    ["app.runner", "app.traces"],  # a run, and the file format a run is recorded in
    ["app.training"],
    ["app.service.jobs", "app.service.errors"],  # what a backend's work is, and the errors of builds
    ["app.backends"],  # one package per engine, the build store and the registry that names the engines
    ["app.bench"],  # the benchmarks (a concurrency sweep is a job of the service's: Service.load_sweep)
    ["app.service"],
    ["app.ui"],
    ["app.cli", "app.__main__", "app"],
]


def modules() -> dict[str, Path]:
    out = {}
    for path in APP.rglob("*.py"):
        name = ".".join(path.relative_to(APP.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The app modules `path` imports anywhere in it (`from a.b import c` is a.b.c when that is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "app":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "app")
    return {m for m in out if m in known}


def layer(module: str) -> int:
    best, found = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    assert found is not None, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return found


def test_every_import_goes_down_or_sideways():
    known = modules()
    upward = sorted(f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
                    for m, path in known.items() for d in imports(path, known) if layer(d) > layer(m))
    assert upward == []


def test_the_mode_model_imports_nothing_above_it():
    known = modules()
    for name, path in known.items():
        if name.startswith("app.modes"):
            assert {d for d in imports(path, known) if not d.startswith("app.modes")} == set(), name


def resolved() -> dict[str, set[str]]:
    """The imports the shipped entries make at run time (registry.resolve of a module path): who resolves what."""
    from app.modes import MODES

    refs = {"app.ui.explain": [m.explainer for m in MODES], "app.runner": [m.drafter for m in MODES]}
    return {who: {ref.partition(":")[0] for ref in names if isinstance(ref, str)} for who, names in refs.items()}


# Where an import inside a function is the design: the command line's commands each import what they run, so `--help`
# or `generate` starts without the web UI, the service or the training code (seconds on a 2-core CPU).
DEFERRED_ON_PURPOSE = {"app.cli"}


def deferred_imports(source: str) -> list[str]:
    """The `app.` imports inside functions of `source`."""
    out: dict[int, str] = {}  # by line: a nested function's import is named once, with the outermost function
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").split(".")[0] == "app":
                    out.setdefault(inner.lineno, f"line {inner.lineno}: from {inner.module} import ... in {node.name}")
                elif isinstance(inner, ast.Import) and any(a.name.split(".")[0] == "app" for a in inner.names):
                    out.setdefault(inner.lineno, f"line {inner.lineno}: import in {node.name}")
    return [out[line] for line in sorted(out)]


def test_app_modules_import_each_other_at_the_top():
    """An import hidden in a function hides an edge of the layers (and, once, a circle): every `app.` import is at
    module level, except in DEFERRED_ON_PURPOSE (which says why)."""
    found = [f"{name} {hit}" for name, path in sorted(modules().items()) if name not in DEFERRED_ON_PURPOSE
             for hit in deferred_imports(path.read_text())]
    assert found == []


def test_the_check_sees_a_deferred_import():
    source = "import app.models\n\ndef f():\n    from app.heads import eagle\n\n    def g():\n        import app.runner\n"
    assert [h.split(":")[0] for h in deferred_imports(source)] == ["line 4", "line 7"]


def test_no_modules_import_each_other_in_a_circle():
    """Counting the imports the registry resolves at run time (the explainers once imported render, which calls them)."""
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    # A package's __init__ importing its own submodules is how a package exports them, not a circle.
    graph = {m: {d for d in ds if not (m == d.rpartition(".")[0] and (known[m].name == "__init__.py"))} for m, ds in graph.items()}
    for who, targets in resolved().items():
        graph[who] |= targets & set(known)
    state: dict[str, int] = {}
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_the_check_sees_an_upward_import(tmp_path):
    """The walk reads imports inside functions too (where an upward import would hide)."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from app.service import api\n")
    assert imports(source, modules()) == {"app.service.api"}
    assert layer("app.service.api") > layer("app.modes.configs")


# ----------------------------------------------------------------------------- the engines' names

REGISTRY = "app.backends.registry"  # the one module that switches on an engine's name (docs/architecture.md)


def engine_names() -> tuple[str, ...]:
    from app.backends.registry import BACKENDS

    return tuple(BACKENDS)


def named(node: ast.AST, names: tuple[str, ...]) -> set[str]:
    """The engine names a literal spells: a string, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and node.value in names:
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
    return set()


def switches(source: str, names: tuple[str, ...]) -> list[tuple[int, set[str]]]:
    """Where `source` switches on an engine's name: compares a value with one (==, !=, in, a match case), or takes a
    backend by one (`backends["vllm"]`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found: set[str] = set()
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found |= named(side, names)
        elif isinstance(node, ast.MatchValue):
            found = named(node.value, names)
        elif isinstance(node, ast.Subscript):
            container = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            found = named(node.slice, names) if container.lower() == "backends" else set()
        if found:
            out.append((node.lineno, found))
    return out


def test_only_the_registry_and_the_engines_own_package_switch_on_its_name():
    """Outside app/backends/registry.py an engine is asked through the face every backend has (backends/base.py),
    never picked by its name: the Service iterates the registry's backends or resolves a request's name there, and
    the CLI and the tabs ask the Service. An engine's own package may say its own name, no other."""
    names = engine_names()
    found = []
    for module, path in modules().items():
        if module == REGISTRY:
            continue
        own = {n for n in names if module.startswith(f"app.backends.{n}.") or module == f"app.backends.{n}"}
        found += [f"{module}:{line} {sorted(hit)}" for line, hit in switches(path.read_text(), names) if hit - own]
    assert found == []


def test_no_engine_package_imports_another():
    """What two engines share lives beside them in app/backends/ (base.py, processes.py, openai.py, store.py), which no
    engine owns; the registry alone hands one engine's part to another (the remote backend's clients)."""
    known = modules()
    names = engine_names()
    crossing = []
    for module, path in known.items():
        mine = next((n for n in names if module == f"app.backends.{n}" or module.startswith(f"app.backends.{n}.")), None)
        if mine is None:
            continue
        crossing += [f"{module} imports {d}" for d in imports(path, known)
                     for n in names if n != mine and (d == f"app.backends.{n}" or d.startswith(f"app.backends.{n}."))]
    assert crossing == []


def test_the_check_sees_a_switch_on_an_engines_name():
    names = ("vllm", "tensorrt_llm")
    source = ('if request.backend == "vllm": pass\n'
              'if b in ("tensorrt_llm", "x"): pass\n'
              'service.backends["vllm"].stop_started()\n'
              'match b:\n    case "vllm": pass\n'
              'record["vllm"]\n'  # a field of a document, not a switch
              '{"backend": "vllm"}\n')  # a request that names its engine
    assert sorted(line for line, _ in switches(source, names)) == [1, 2, 3, 5]


# ----------------------------------------------------------------------------- the mode entry owns its mode

BASELINE = "autoregressive"  # what every mode races: the app's baseline, not a mode's own branch
# what a variable or field holding a mode's name, or the name of the artifact it drafts with, is called
MODE_WORDS = ("mode", "name", "mode_name", "m", "kind", "artifact", "arch")


def own_files() -> set[Path]:
    """The files that may know a mode by its config class or its name: the mode model, and each shipped mode's
    drafter and explainer."""
    from app.modes import MODES

    refs = [ref.partition(":")[0] for m in MODES for ref in (m.drafter, m.explainer) if isinstance(ref, str)]
    return {p for p in (APP / "modes").rglob("*.py")} | {modules()[ref] for ref in refs}


def _names_a_mode(node: ast.AST) -> bool:
    """`mode`, `x.name`, `spec.mode`, `d["mode"]`: an expression holding a mode's name."""
    if isinstance(node, ast.Name):
        return node.id in MODE_WORDS
    if isinstance(node, ast.Attribute):
        return node.attr in MODE_WORDS
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in MODE_WORDS
    return False


def mode_switches(source: str, mode_names: set[str], config_names: set[str]) -> list[str]:
    """Where `source` asks which mode a config is: isinstance on a mode's config class, or a comparison of a mode's
    name with a mode's name written out (`mode == "eagle"`, `name in ("medusa", "eagle")`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {c.id if isinstance(c, ast.Name) else c.attr for c in classes if isinstance(c, (ast.Name, ast.Attribute))}
            if named & config_names:
                out.append(f"line {node.lineno}: isinstance on {', '.join(sorted(named & config_names))}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            words = {c.value for side in sides for c in ([side] if isinstance(side, ast.Constant) else getattr(side, "elts", []))
                     if isinstance(c, ast.Constant) and c.value in mode_names}
            if words and any(_names_a_mode(side) for side in sides):
                out.append(f"line {node.lineno}: compares a mode's name with {', '.join(sorted(words))}")
    return out


def test_no_code_outside_a_mode_asks_which_mode_it_is():
    """A mode's behaviour is its entry's (hooks and data: app/modes/shipped.py) and its own files': elsewhere no
    isinstance on its config and no branch on its name."""
    from app.modes import MODES

    mode_names = set(MODES.names + MODES.merged) - {BASELINE} | {m.artifact for m in MODES if m.artifact}
    config_names = {m.config.__name__ for m in MODES}
    own = own_files()
    found = [f"{path.relative_to(APP.parent)} {hit}" for path in sorted(APP.rglob("*.py")) if path not in own
             for hit in mode_switches(path.read_text(), mode_names, config_names)]
    assert found == []


def test_the_check_sees_a_switch_on_a_mode():
    source = ("def f(c, mode, spec):\n"
              "    if isinstance(c, configs.LookaheadDecodingConfig): pass\n"
              "    if mode == 'eagle' or spec.mode in ('medusa', 'x') or spec['mode'] != 'suffix': pass\n"
              "    if mode == 'autoregressive' or c.vllm == 'eagle3': pass\n"
              "    if config.kind == 'medusa': pass\n")  # a trained artifact's kind (its recipe owns what differs)
    hits = mode_switches(source, {"eagle", "medusa", "suffix"}, {"LookaheadDecodingConfig"})
    assert sorted(h.split(":")[0] for h in hits) == ["line 2", "line 3", "line 3", "line 3", "line 5"]


def test_no_test_folder_is_named_like_a_package_code_may_import():
    """pytest puts a test file's folder's parent on sys.path, so a folder named like a package that is not installed
    in this environment (vllm and tensorrt_llm live in environments of their own) is imported as that package: the
    availability checks would find TensorRT-LLM "installed". The engines' test folders are named on_<engine>."""
    import importlib.util

    tests = Path(__file__).resolve().parent
    taken = set(engine_names()) | {"vllm", "tensorrt_llm", "tensorrt", "app"}
    # stand_ins/ holds a stand-in tensorrt_llm on purpose: tests put that folder itself on a worker's path.
    folders = {p.name for p in tests.rglob("*") if p.is_dir() and "stand_ins" not in p.relative_to(tests).parts}
    assert not folders & taken
    for name in ("vllm", "tensorrt_llm"):
        spec = importlib.util.find_spec(name)
        assert spec is None or tests not in Path(spec.origin or next(iter(spec.submodule_search_locations))).parents
