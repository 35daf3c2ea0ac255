"""The trained artifacts shipped for the bundled model: present, small, lossless, and actually useful;
plus `python -m app train` / `export` end to end on a small data slice."""

import json
import lzma
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import ROOT, run_cli
from app import models
from app.training import data
from app.modes import MODES
from app.runner import LoopConfig
from app.runner import load_companion, output_ids, run
from app.modes import configs

KINDS = {"medusa": "medusa", "eagle": "eagle", "draft": "draft_target"}
# More than one token per target step where a trained drafter should help; an untrained or misaligned artifact gets
# about 1. The one-layer draft is weak (see assets/defaults/README.md), so its bar is lower.
MIN_TAU = {"medusa": 1.2, "eagle": 1.2, "draft_target": 1.05}
MAX_NEW = 40


def test_defaults_are_shipped_and_small():
    total = 0
    for kind in KINDS:
        path = models.default_artifact(models.BUNDLED, kind)
        assert path is not None, f"no shipped {kind} for {models.BUNDLED}"
        meta = json.loads((path / "config.json").read_text())
        assert meta.get("architecture") in ("medusa", "eagle", "layer_draft")
        assert (path / "train.json").exists(), "the training summary documents how it was made"
        total += sum(f.stat().st_size for f in path.iterdir())
    assert total <= 30 * 2**20, f"shipped artifacts take {total / 2**20:.1f} MiB"


@pytest.mark.bundled
@pytest.mark.parametrize("mode", list(KINDS.values()))
def test_shipped_artifacts_are_lossless_and_get_drafts_accepted(bundled, spec_bench_prompts, mode):
    """float32, greedy: identical to autoregressive, and more than one token per target step on
    prompts where a trained drafter should help (a random or misaligned artifact gets about 1)."""
    cfg = LoopConfig(MODES[mode].config(), max_new_tokens=MAX_NEW)
    companion = load_companion(cfg, bundled)
    ar_cfg = LoopConfig(max_new_tokens=MAX_NEW)
    tokens = steps = 0
    for category in ("writing", "qa", "math_reasoning"):
        ids = bundled.encode(spec_bench_prompts[category])
        ref = output_ids(list(run(bundled, ar_cfg, ids)))
        events = list(run(bundled, cfg, ids, companion))
        assert output_ids(events) == ref, f"{mode} differs from autoregressive on {category}"
        tokens += events[-1].totals["new_tokens"]
        steps += events[-1].totals["target_steps"]
    assert tokens / steps > MIN_TAU[mode], f"{mode}: {tokens / steps:.2f} tokens per step"


@pytest.mark.bundled
def test_draft_target_without_a_draft_says_how_to_get_one(bundled):
    """A model with no shipped draft (here: the bundled one under another name) gets told how to make one."""
    import dataclasses

    from app.modes import ConfigError

    with pytest.raises(ConfigError, match="python -m app train --mode draft"):
        load_companion(LoopConfig(MODES["draft_target"].config()), dataclasses.replace(bundled, name="another-model"))


@pytest.mark.bundled
def test_the_shipped_draft_loads_by_name_like_any_model(bundled):
    draft = load_companion(LoopConfig(MODES["draft_target"].config()), bundled)
    assert draft.name == f"{models.BUNDLED}-draft"
    assert draft.model.config.num_hidden_layers == 1 and draft.vocab_size == bundled.vocab_size


@pytest.mark.bundled
def test_the_shipped_draft_is_built_once_when_processes_ask_for_it_together(bundled, tmp_path):
    """Two processes (the test workers, a CLI next to the web app) asking at once: one builds the draft's
    model directory, the other waits for it; neither sees it half-written or moved aside. A changed
    shipped draft is rebuilt."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / models.BUNDLED).symlink_to(models.DEFAULT_ENGINES / "models" / models.BUNDLED)
    name = f"{models.BUNDLED}-draft"
    code = (
        "import sys; from pathlib import Path; from transformers import AutoConfig; from app import models; "
        "where = models.locate(sys.argv[1], Path(sys.argv[2])); AutoConfig.from_pretrained(where); print(where)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, name, str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outputs]
    target = tmp_path / "models" / name
    assert {out.strip() for out, _ in outputs} == {str(target)}
    assert sum("building the draft model" in err for _, err in outputs) == 1
    assert not [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]

    stamp = target / "specdec_source.json"
    stamp.write_text(json.dumps({"sha256": "an older draft"}))
    rebuilt = subprocess.run([sys.executable, "-c", code, name, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rebuilt.returncode == 0 and "building the draft model" in rebuilt.stderr
    assert json.loads(stamp.read_text())["sha256"] != "an older draft"


@pytest.mark.bundled
def test_the_shipped_eagle_module_is_eagle3_and_exports_what_vllm_loads(tmp_path):
    """The default EAGLE module is EAGLE-3 (issue 44): its export is vLLM's `eagle3` checkpoint (tests/backends/on_vllm/test_vllm.py
    runs one in a live engine), and it reads back as the same drafter."""
    from app.heads import eagle

    shipped = models.default_artifact(models.BUNDLED, "eagle")
    assert eagle.read_config(shipped).eagle3
    out = tmp_path / "out"
    proc = run_cli("export", str(shipped), "--output-dir", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8192
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["specdec"]["base_model"] == models.BUNDLED
    # How it was made: one run of the chain of stages, on the shipped answers of every conversation.
    made = json.loads((shipped / "train.json").read_text())
    settings = made["settings"]
    assert settings["eagle3"] and settings["data_offset"] == 0 and settings["data_limit"] == data.CONVERSATIONS
    # and its answers ship: the next run over them, on a fresh machine, generates none
    assert data.answers_to_generate(tmp_path, made["base_model"], torch.bfloat16, offset=0, limit=data.CONVERSATIONS,
                                    max_len=settings["max_len"], max_new_tokens=settings["answer_tokens"]) == 0
    assert made["eval"]["mean_accepted_tokens"] > 1.9


@pytest.mark.bundled
@pytest.mark.parametrize("kind", ["medusa", "eagle3", "draft"])
def test_train_and_export_end_to_end(bundled, tmp_path, kind):
    """A few conversations, one short epoch: the CLI trains, saves, evaluates, and exports a directory
    that reads back. (The bundled model's converted copy is shared through a symlink, not rebuilt.)"""
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "models").symlink_to(models.DEFAULT_ENGINES / "models")
    out = tmp_path / kind
    mode, flags = ("eagle", ["--eagle3"]) if kind == "eagle3" else (kind, [])
    proc = run_cli(
        "train", "--mode", mode, *flags, "--engines-dir", str(engines), "--output-dir", str(out), "--data-limit", "3",
        "--max-len", "48", "--batch-size", "3", "--epochs", "1", "--eval-prompts", "1", "--draft-layers", "1",
        "--draft-vocab-size", "2048", "--dtype", "float32", "--answer-tokens", "16", "--eagle-ce-weight", "0.5",
        # the draft reads the dataset's answers, the heads the model's own
        "--data-source", "sharegpt" if kind == "draft" else "self",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["steps"] >= 1 and summary["eval"]["mean_accepted_tokens"] >= 1.0
    assert (out / "config.json").exists() and (out / "train.json").exists()
    assert list((engines / "data").glob("*/shard-*.safetensors")), "features are cached for the next run"
    assert summary["settings"]["data_source"] == ("sharegpt" if kind == "draft" else "self")
    assert summary["settings"]["eagle_ce_weight"] == 0.5
    assert summary["lr"] == {"medusa": 1e-3, "eagle": 5e-4, "eagle3": 2e-3, "draft": 3e-4}[kind]  # each kind's default
    if kind == "medusa":  # the heads' self-distilled answers are shipped alike for every kind: checked once
        (answers,) = (engines / "data").glob("self-*/")
        assert json.loads((answers / "key.json").read_text())["dtype"] == "torch.float32"
        proc = run_cli("ship-data", "--engines-dir", str(engines), "--output-dir", str(tmp_path / "shipped"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        (packed,) = (tmp_path / "shipped" / answers.name).glob("shard-*.json.xz")
        shipped, cached = json.loads(lzma.decompress(packed.read_bytes())), json.loads((answers / "shard-0000.json").read_text())
        assert len(shipped["answers"]) == len(cached) == 3  # the answers only: the prompts are not shipped
        assert all(0 < len(a) <= 16 and q[-len(a):] == a for a, q in zip(shipped["answers"], cached))
    exported = tmp_path / f"{kind}-export"
    proc = run_cli("export", str(out), "--output-dir", str(exported))
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((exported / "config.json").read_text())
    if kind == "medusa":
        from app.heads import medusa

        assert config["medusa_num_heads"] == 3 and config["medusa_fc_bias"] and "truncated_vocab_size" not in config
        medusa.read_export(exported)
    elif mode == "eagle":
        from app.heads import eagle

        trained = json.loads((out / "config.json").read_text())
        assert trained["aux_layers"] == [2, 15, 27] and trained["lm_head_from_target"]  # EAGLE-3's layers of 30
        assert trained["eagle3"]
        assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    if kind == "eagle3":
        assert config["draft_vocab_size"] == 2048 and eagle.read_export(exported).config.eagle3
        # vLLM's numbering by default; ModelOpt's and TensorRT-LLM's (one less) with --format modelopt.
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
        proc = run_cli("export", str(out), "--output-dir", str(tmp_path / "modelopt"), "--format", "modelopt")
        assert proc.returncode == 0, proc.stderr[-3000:]
        theirs = json.loads((tmp_path / "modelopt" / "config.json").read_text())
        assert theirs["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
        assert eagle.read_export(tmp_path / "modelopt").config == eagle.read_export(exported).config
        proc = run_cli("export", str(out), "--output-dir", str(tmp_path / "hf"), "--format", "hf")
        assert proc.returncode == 2 and "exports as eagle3 or modelopt, not 'hf'" in proc.stderr, proc.stderr
    if kind == "draft":
        from transformers import AutoModelForCausalLM

        from app.heads.draft import rebuild

        # A plain model directory: transformers loads it as it is, and it writes what the project's draft writes.
        assert not list(exported.glob("draft_vocab*")) and (exported / "tokenizer.json").is_file()
        plain = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
        ours = rebuild(bundled.model, out)
        ids = torch.tensor([bundled.encode("List three rivers of Europe.")])
        kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=bundled.eos_token_ids[0])
        assert torch.equal(plain.generate(ids, **kw), ours.generate(ids, **kw))
    again = run_cli("export", str(out), "--output-dir", str(exported))
    assert again.returncode == 2 and "not an empty directory" in again.stderr

    # Continue training it: the artifact's architecture wins over flags that disagree, and its first batch
    # (the same batch as the first run's, by the fixed seed) scores better than it did from scratch.
    more = tmp_path / f"{kind}-more"
    proc = run_cli(
        "train", "--mode", mode, "--engines-dir", str(engines), "--output-dir", str(more), "--data-limit", "3",
        "--max-len", "48", "--batch-size", "3", "--epochs", "0.5", "--eval-prompts", "0", "--dtype", "float32",
        "--answer-tokens", "16", "--data-source", "sharegpt" if kind == "draft" else "self", "--init-from", str(out),
        "--medusa-num-heads", "2", "--draft-layers", "2", "--draft-vocab-size", "4096", "--eagle-aux-layers", "none",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    continued = json.loads(proc.stdout)
    assert continued["settings"]["init_from"] == str(out)
    assert continued["first_loss"] < summary["first_loss"]
    assert continued["settings"]["draft_vocab_size"] == 2048
    assert json.loads((more / "config.json").read_text()) == json.loads((out / "config.json").read_text())
    if kind == "medusa":
        assert continued["settings"]["medusa_num_heads"] == 3
    elif mode == "eagle":
        assert continued["settings"]["eagle_aux_layers"] == [2, 15, 27]
        assert continued["settings"]["eagle3"] == (kind == "eagle3")  # from the artifact, no --eagle3 given
    else:
        assert continued["settings"]["draft_layers"] == 1
    wrong = "eagle" if mode != "eagle" else "medusa"
    proc = run_cli("train", "--mode", wrong, "--engines-dir", str(engines), "--init-from", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert any(line.startswith("error: --init-from:") for line in proc.stderr.splitlines()), proc.stderr


@pytest.mark.bundled
def test_a_tree_deeper_than_the_shipped_heads_is_a_clean_config_error(bundled, capsys):
    from app import cli

    heads = json.loads((models.default_artifact(models.BUNDLED, "medusa") / "config.json").read_text())["medusa_num_heads"]
    chain = json.dumps([[0] * depth for depth in range(1, heads + 2)])  # one level deeper than the heads reach
    status = cli.main(["generate", "--prompt", "hi", "--mode", "medusa", "--medusa-choices", chain, "--max-new-tokens", "4",
                       "--eager"])
    err = capsys.readouterr().err
    # The model was loaded first (transformers' progress bar); then one error line, no traceback.
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status == 2 and "Traceback" not in err and len(errors) == 1 and f"{heads} heads" in errors[0], err


@pytest.mark.bundled
@pytest.mark.parametrize("mode, extra", [
    ("medusa", ["--min-path-prob", "0"]),
    ("eagle", ["--eagle-total-tokens", "12", "--eagle-depth", "3", "--min-path-prob", "0"]),
    ("eagle", []),  # pruned by default on this backend
])
def test_cli_generate_with_the_shipped_artifacts(bundled, mode, extra):
    proc = run_cli("generate", "--prompt", "Name three colours.", "--mode", mode, "--json", "--max-new-tokens", "16", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    steps = result["steps"][1:]
    pruned = "--min-path-prob" not in extra
    assert steps and any(s["proposed"]["tokens"] for s in steps)
    assert pruned or all(s["proposed"]["tokens"] for s in steps[:-1])  # unpruned, every step but the last drafts
    assert "tree" in steps[0]["source"]
    assert steps[0]["source"].get("min_path_prob") == (configs.MIN_PATH_PROB if pruned else None)
    ref = output_ids(list(run(bundled, LoopConfig(max_new_tokens=16), bundled.encode("Name three colours."))))
    assert result["token_ids"] == ref
