"""`python -m app bench`: the summary arithmetic, the verify-cost curve, and the command's JSON contract end to end."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import run_cli
from app import bench, runner
from app.decoding.linear import fast_bf16
from app.models import LoadedModel


def record(mode, category, tok_s, new, steps, identical=True, prefix=None):
    return {"mode": mode, "category": category, "tokens_per_s": tok_s, "new_tokens": new, "target_steps": steps,
            "identical": identical, "identical_prefix": new if prefix is None else prefix}


def test_summary_is_a_ratio_of_means_per_category_and_overall():
    runs = [
        record("autoregressive", "rag", 10.0, 8, 8), record("autoregressive", "rag", 20.0, 8, 8),
        record("autoregressive", "math", 30.0, 8, 8),
        record("prompt_lookup", "rag", 30.0, 8, 4), record("prompt_lookup", "rag", 30.0, 8, 2, identical=False, prefix=2),
        record("prompt_lookup", "math", 30.0, 8, 8),
    ]
    s = bench.summarize(runs)
    pl = s["prompt_lookup"]
    assert pl["categories"]["rag"]["speedup"] == pytest.approx(30.0 / 15.0)
    assert pl["categories"]["math"]["speedup"] == pytest.approx(1.0)
    assert pl["speedup"] == pytest.approx(30.0 / 20.0)
    assert pl["mean_accepted_tokens"] == pytest.approx(24 / 14)
    assert pl["identical_share"] == pytest.approx(2 / 3)
    assert pl["identical_prefix_share"] == pytest.approx(18 / 24)
    assert s["autoregressive"]["speedup"] == 1.0 and s["autoregressive"]["mean_accepted_tokens"] == 1.0
    table = bench.format_table(s)
    assert "rag" in table and "1.50x" in table and "2.00x" in table


def paired(mode, tok_s, category="rag", steps=8):
    """One run per prompt id, tokens/s as given; 8 tokens in `steps` target passes (τ 8 / steps)."""
    return [{**record(mode, category, x, 8, steps), "prompt_id": i} for i, x in enumerate(tok_s)]


def test_ratio_ci_is_a_paired_bootstrap_over_prompts():
    ar = paired("autoregressive", [10.0, 20.0, 30.0, 40.0])
    # Twice as fast on every prompt: the ratio is exactly 2 in every resample, so the interval is [2, 2].
    fast = paired("prompt_lookup", [20.0, 40.0, 60.0, 80.0])
    assert bench.ratio_ci(ar + fast, "prompt_lookup", "autoregressive") == pytest.approx((2.0, 2.0, 2.0))
    # Prompt-dependent gains: the point is the ratio of means, inside an interval that has width.
    mixed = paired("prompt_lookup", [10.0, 20.0, 60.0, 80.0])
    point, low, high = bench.ratio_ci(ar + mixed, "prompt_lookup", "autoregressive")
    assert point == pytest.approx(170 / 100) and low < point < high
    assert low >= 1.0 and high <= 2.0  # no resample can leave the per-prompt ratios' range
    assert bench.ratio_ci(ar + mixed, "prompt_lookup", "autoregressive", seed=0) == (point, low, high)  # reproducible
    # Only prompts both modes ran count, and a category narrows it down.
    other = [{**r, "prompt_id": r["prompt_id"] + 10, "category": "math"} for r in paired("prompt_lookup", [5.0])]
    assert bench.ratio_ci(ar + fast + other, "prompt_lookup", "autoregressive")[0] == pytest.approx(2.0)
    assert bench.ratio_ci(ar + fast, "prompt_lookup", "autoregressive", category="math") is None
    assert bench.ratio_ci([record("a", "rag", 1.0, 8, 8)], "a", "autoregressive") is None  # no prompt ids: no pairs
    # Two prompts: the ratio, but no interval (resampling two prompts says nothing about the spread).
    two = paired("autoregressive", [10.0, 20.0]) + paired("prompt_lookup", [15.0, 40.0])
    assert bench.ratio_ci(two, "prompt_lookup", "autoregressive") == (pytest.approx(55 / 30), None, None)
    assert bench.summarize(two)["prompt_lookup"]["speedup_ci"] is None


def test_step_cost_is_a_decoding_step_in_autoregressive_steps():
    def timed(mode, steps, decode_s, draft_s, verify_s, prompt_id):
        return {**record(mode, "rag", 10.0, 8, steps), "prompt_id": prompt_id, "decode_steps": steps,
                "decode_s": decode_s, "draft_s": draft_s, "verify_s": verify_s, "prefill_s": 0.1}

    runs = [timed("autoregressive", 8, 0.8, 0.0, 0.78, 0), timed("autoregressive", 8, 1.6, 0.0, 1.5, 1),
            timed("eagle", 4, 0.6, 0.1, 0.48, 0), timed("eagle", 4, 0.9, 0.14, 0.7, 1),
            {**record("hf_generate", "rag", 9.0, 8, 8), "prompt_id": 0}]  # generate() records no steps' times
    s = bench.summarize(runs)
    # Autoregressive: 2.4 s over 16 steps = 0.15 s a step; EAGLE: 1.5 s over 8 = 0.1875 s, 1.25 of those.
    assert s["eagle"]["step_cost"] == pytest.approx(1.25)
    assert s["eagle"]["draft_cost"] == pytest.approx(0.24 / 8 / 0.15)
    assert s["eagle"]["verify_cost"] == pytest.approx(1.18 / 8 / 0.15)
    assert s["eagle"]["categories"]["rag"]["step_cost"] == pytest.approx(1.25)
    assert s["autoregressive"]["step_cost"] == pytest.approx(1.0)
    assert s["hf_generate"]["step_cost"] is None
    table = bench.format_table(s)
    assert "1.25 (0.20)" in table and "tau / step is the speedup after the prefill" in table


def test_summary_and_versus_carry_the_intervals():
    runs = (paired("autoregressive", [10.0, 20.0, 30.0]) + paired("prompt_lookup", [15.0, 30.0, 50.0], steps=4)
            + paired("hf_prompt_lookup", [12.0, 28.0, 35.0]) + paired("hf_generate", [10.0, 19.0, 30.0]))
    s = bench.summarize(runs)
    low, high = s["prompt_lookup"]["speedup_ci"]
    assert low <= s["prompt_lookup"]["speedup"] <= high
    assert s["prompt_lookup"]["categories"]["rag"]["speedup_ci"] == [low, high]  # one category: the same prompts
    rows = bench.versus(runs)
    assert [(r["mode"], r["peer"]) for r in rows] == [("autoregressive", "hf_generate"), ("prompt_lookup", "hf_prompt_lookup")]
    assert rows[1]["ratio"] == pytest.approx(95 / 75)
    text = bench.format_versus(rows)
    assert "prompt_lookup / hf_prompt_lookup: 1.27x tokens/s (95% CI " in text
    assert "95% CI" in bench.format_table(s) and f"{low:.2f}-{high:.2f}" in bench.format_table(s)


def test_verify_cost_times_every_size_on_a_real_model(tiny_model):
    target = LoadedModel(name="tiny", model=tiny_model, tokenizer=None, dtype="float32")
    cost = runner.verify_cost(target, list(range(1, 20)), sizes=(1, 3, 9), repeats=3)
    assert cost["tokens"] == [1, 3, 9] and cost["context"] == 19
    assert len(cost["ms"]) == 3 and all(ms > 0 for ms in cost["ms"])
    assert cost["relative"][0] == 1.0
    # ms are rounded to 0.01 and a tiny model's pass takes well under 1 ms: the ratio of rounded times is that close;
    # a wider pass read cheaper than a narrower one (load that 40 rounds did not outlast) is printed at its level.
    rounding = 0.01 + 0.005 * (1 + cost["relative"][2]) / cost["ms"][0]
    assert cost["relative"][2] == pytest.approx(max(cost["ms"]) / cost["ms"][0], abs=rounding)
    assert bench.format_verify_cost(cost).startswith("verify pass of k tokens vs one")


def test_verify_cost_stops_at_its_time_budget_when_the_curve_never_settles(tiny_model, monkeypatch):
    """Sizes timed wide first: the one-token pass is always the cheaper, so the curve never reads monotone and only
    the budget ends the rounds (a clock that advances a second a reading stands in for a slow, busy machine)."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(runner.time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(runner.time, "process_time", lambda: 0.0)  # no share of that clock's seconds to compare
    target = LoadedModel(name="tiny", model=tiny_model, tokenizer=None, dtype="float32")
    cost = runner.verify_cost(target, list(range(1, 20)), sizes=(9, 1), repeats=3, most=10**5, budget_s=5.0)
    assert cost["tokens"] == [9, 1] and next(ticks) < 40, "rounds went on past the budget"


def test_a_speculating_engine_peer_is_measured_by_its_own_counters():
    """vLLM's τ is 1 + accepted ÷ drafts summed over its requests (its counters), set beside ours in `versus`."""
    def engine(prompt, accepted, drafts):
        r = record("vllm_eagle3", "qa", 20.0, 8, 5)
        return {**r, "prompt_id": prompt, "spec_decode": {"num_drafts": drafts, "num_draft_tokens": 3 * drafts,
                                                          "num_accepted_tokens": accepted}}

    runs = [{**record("eagle", "qa", 30.0, 8, 4), "prompt_id": 1}, {**record("eagle", "qa", 30.0, 12, 4), "prompt_id": 2},
            engine(1, 4, 4), engine(2, 8, 4)]
    summary = bench.summarize(runs)
    assert summary["vllm_eagle3"]["engine_tau"] == 1 + 12 / 8 and summary["eagle"]["engine_tau"] is None
    (row,) = bench.versus(runs)
    assert (row["mode"], row["peer"], row["tau"], row["peer_tau"]) == ("eagle", "vllm_eagle3", 20 / 8, 2.5)
    assert "tau 2.500 ours, 2.500 by the engine's counters" in bench.format_versus([row])
    plain = [r for r in runs if r["mode"] == "eagle"] + [{**record("vllm_eagle3", "qa", 20.0, 8, 8), "prompt_id": 1}]
    assert "peer_tau" not in bench.versus(plain)[0]  # no counters, no engine τ


@pytest.mark.bundled
def test_bench_command_writes_the_contracted_json(bundled, tmp_path):
    out = tmp_path / "results" / "bench.json"  # a folder that does not exist yet
    proc = run_cli(
        "bench", "--categories", "qa,translation", "--limit", "1", "--modes", "prompt_lookup,lookahead",
        "--lookahead-config", "3,3,2", "--peers", "--max-new-tokens", "12", "--dtype", "float32", "--json", str(out),
        "--vllm-python", str(tmp_path / "no-vllm" / "python"),  # the transformers peers only (vLLM's: test_vllm.py)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert list(summary) == ["autoregressive", "prompt_lookup", "lookahead", "hf_generate", "hf_prompt_lookup"]
    for mode, row in summary.items():
        assert {"tokens_per_s", "speedup", "mean_accepted_tokens", "identical_share"} <= set(row), mode
        assert set(row["categories"]) == {"qa", "translation"}
        assert row["tokens_per_s"] > 0
    # float32: every lossless mode reproduces autoregressive exactly, and so does transformers' greedy generate
    for mode in ("prompt_lookup", "lookahead", "hf_generate", "hf_prompt_lookup"):
        assert summary[mode]["identical_share"] == 1.0, mode
    assert summary["autoregressive"]["speedup"] == 1.0
    assert len(result["runs"]) == 2 * 5 and {r["new_tokens"] for r in result["runs"]} == {12}
    assert all(r["mean_accepted_tokens"] >= 1.0 for r in result["runs"])
    cost = result["verify_cost"]
    # every width timed: in the curve, or left out with its reason (timed under other load than the one-token pass)
    assert sorted(cost["tokens"] + [w["tokens"] for w in cost["withheld"]]) == list(runner.VERIFY_SIZES)
    assert cost["tokens"][0] == 1 and cost["relative"][0] == 1.0
    assert {"cpu_capability", "fast_bf16", "threads"} <= set(result["settings"])
    lookahead = result["settings"]["configs"]["lookahead"]  # each mode's config by the request's (TensorRT-LLM's) names
    assert lookahead["speculative_config"]["decoding_type"] == "Lookahead" and lookahead["max_new_tokens"] == 12
    assert [lookahead["speculative_config"][k] for k in ("max_window_size", "max_ngram_size", "max_verification_set_size")] == [3, 3, 2]
    assert "verify pass of k tokens vs one" in proc.stdout and "translation" in proc.stdout
    assert [(r["mode"], r["peer"]) for r in result["versus"]] == [("autoregressive", "hf_generate"),
                                                                   ("prompt_lookup", "hf_prompt_lookup")]
    assert "prompt_lookup / hf_prompt_lookup: " in proc.stdout
    # Two prompts (one per category): ratios, but too few prompts for an interval.
    assert all(row["speedup_ci"] is None for mode, row in summary.items() if mode != "autoregressive")
    assert summary["autoregressive"]["speedup_ci"] == [1.0, 1.0]  # itself: exact however few the prompts
    # Where our modes' decoding steps went; transformers' generate() does not say.
    ours = [r for r in result["runs"] if not r["mode"].startswith("hf_")]
    assert all(r["decode_steps"] == r["target_steps"] - 1 and 0 < r["draft_s"] + r["verify_s"] <= r["decode_s"] < r["elapsed_s"]
               for r in ours)
    # Lookahead's step in autoregressive steps, or withheld by the rule with its reason (2 prompts of 12 tokens beside
    # the suite's other worker: once measured below the pass it contains); generate() does not say its steps.
    look = summary["lookahead"]
    assert (look["step_cost"] or 0) >= 1.0 or "less than the pass it contains" in (look["doubt"] or ""), look
    assert summary["hf_prompt_lookup"]["step_cost"] is None
    assert all(r["ci"] is None for r in result["versus"]) and "no interval under 3 prompts" in proc.stdout


@pytest.mark.bundled
def test_versus_model_runs_a_second_artifact_as_a_row_of_its_own(bundled, tmp_path):
    from app import models

    shipped = models.default_artifact(models.BUNDLED, "eagle")
    # the same weights under another name: the rows must agree step for step
    copy = shutil.copytree(shipped, tmp_path / "another-module")
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--categories", "qa,coding", "--limit", "1", "--modes", "eagle", "--versus-model",
                   f"eagle={copy}", "--max-new-tokens", "12", "--dtype", "float32", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["summary"]) == ["autoregressive", "eagle", "eagle@another-module"]
    configs = result["settings"]["configs"]
    assert configs["eagle"]["speculative_config"]["speculative_model"] is None  # the shipped module
    assert configs["eagle@another-module"]["speculative_config"]["speculative_model"] == str(copy)
    rows = {m: [r for r in result["runs"] if r["mode"] == m] for m in ("eagle", "eagle@another-module")}
    assert [r["target_steps"] for r in rows["eagle"]] == [r["target_steps"] for r in rows["eagle@another-module"]]
    assert all(r["identical"] for rs in rows.values() for r in rs)
    assert "eagle@another-module" in proc.stdout


@pytest.mark.parametrize("spec, message", [("medusa=x", "one of --modes"), ("eagle", "MODE=DIR"),
                                           ("prompt_lookup=x", "no trained artifact")])
def test_versus_model_refuses_what_it_cannot_run(spec, message):
    modes = "eagle,prompt_lookup"
    proc = run_cli("bench", "--modes", modes, "--versus-model", spec, "--limit", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr


def test_bench_rejects_an_invalid_config_with_status_2():
    proc = run_cli("bench", "--modes", "lookahead", "--lookahead-config", "0,3,2", "--limit", "1")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert lines[-1].startswith("error: ") and "lookahead" in lines[-1].lower(), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA bfloat16 is always native")
@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU flags from Linux's /proc/cpuinfo")
def test_fast_bf16_means_native_bfloat16_instructions_not_just_avx512():
    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert fast_bf16() == bool({"avx512_bf16", "amx_bf16"} & flags)


def test_the_summary_prints_no_speedup_beyond_tau_and_no_step_under_its_pass():
    """The one rule in `bench`'s table: our mode's speedup over the autoregressive runs it was interleaved with is at
    most τ (its interval bounded by τ), a step at least one autoregressive step; beyond, withheld with the reason.
    A peer divides by another engine's baseline: its ratio stands as measured."""
    runs = (paired("autoregressive", [10.0, 20.0, 30.0]) + paired("prompt_lookup", [30.0, 50.0, 90.0], steps=4)
            + paired("suffix", [19.0, 38.0, 58.0], steps=4) + paired("hf_prompt_lookup", [30.0, 60.0, 90.0]))
    for r in runs:  # decode seconds per step: prompt lookup 0.8 of autoregressive's, suffix 1.5
        r.update(decode_steps=10, decode_s={"autoregressive": 1.0, "prompt_lookup": 0.8, "suffix": 1.5}.get(r["mode"], 0.0),
                 draft_s=0.0, verify_s=0.0)
    s = bench.summarize(runs)
    pl, sx = s["prompt_lookup"], s["suffix"]
    assert pl["speedup"] is None and pl["speedup_ci"] is None and pl["step_cost"] is None  # 2.83x at τ 2, step 0.8
    assert "2.83× is more than τ 2.00 allows" in pl["doubt"] and "a step took 0.80 autoregressive steps" in pl["doubt"]
    assert sx["doubt"] is None and sx["speedup"] == pytest.approx(115 / 60) and sx["step_cost"] == pytest.approx(1.5)
    assert sx["speedup_ci"][1] <= 2.0  # bounded by τ
    assert s["hf_prompt_lookup"]["speedup"] == pytest.approx(3.0) and s["hf_prompt_lookup"]["doubt"] is None
    table = bench.format_table(s)
    assert "withheld*" in table and "* overall / prompt_lookup: No speedup shown: its 2.83× is more than τ 2.00 allows" in table
