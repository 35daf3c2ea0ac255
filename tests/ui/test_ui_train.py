"""The Train tab's pure helpers (app/ui/train_tab.py): control values -> the service's training config, the verdict line
before a run, the runs table, the lines a run shows while it goes and when it ends."""

import pytest

from app.service import training
from app.service.api import Service
from app.ui import train_tab

VALUES = {"kind": "medusa", "init_from": "shipped", "data_source": "self", "data_offset": 6000, "data_limit": 128,
          "epochs": 1, "lr": 0, "eval_prompts": 4, "medusa_num_heads": 4, "medusa_num_layers": 1, "eagle_steps": 2,
          "eagle3": True, "max_len": 640, "answer_tokens": 256, "dtype": "bfloat16"}


def test_the_controls_make_the_services_config():
    assert tuple(VALUES) == train_tab.FIELDS
    config = train_tab.config_from(VALUES)
    assert config["lr"] is None  # 0: the recipe's default rate
    assert training.parse(config) == training.parse({"kind": "medusa"})  # the controls' defaults are the config's
    blank = train_tab.config_from({**VALUES, "data_limit": None, "epochs": "", "lr": None, "init_from": None})
    assert (blank["data_limit"], blank["epochs"], blank["lr"], blank["init_from"]) == (128, 1.0, None, "shipped")
    assert train_tab.config_from({**VALUES, "lr": 0.002, "data_offset": 7000.0})["lr"] == 0.002
    assert train_tab.config_from({**VALUES, "data_offset": 7000.0})["data_offset"] == 7000


def test_the_verdict_says_what_a_run_costs_before_it_runs(tmp_path):
    service = Service(engines=tmp_path)
    assert train_tab.check_message(service, VALUES).startswith("✓ Valid · the answers for this slice are at hand")
    writes = train_tab.check_message(service, {**VALUES, "data_offset": 100})
    assert "the model first writes **128** answers for this slice (about 2 min" in writes
    assert train_tab.check_message(service, {**VALUES, "data_source": "sharegpt", "data_offset": 100}).startswith(
        "✓ Valid · the answers for this slice are at hand")
    assert train_tab.check_message(service, {**VALUES, "data_limit": 3}).startswith(
        "⚠ **Invalid:** data_limit must be in [8, 2000] conversations")


MANIFEST = {
    "id": "0123456789abcdef", "created": "2026-11-25T18:14:01.000+00:00", "duration_s": 121.4, "kind": "trained-medusa",
    "spec": {"mode": "medusa", "model": "m", "backend": "training",
             "config": {"train": {**training.parse({"kind": "medusa", "data_offset": 6256}).model_dump()}}},
    "source": {"steps": 14, "first_loss": 4.815, "last_loss": 4.893, "losses": [4.8] * 14,
               "eval": {"prompts": 4, "max_new_tokens": 64, "mean_accepted_tokens": 1.6,
                        "per_category": {"writing": 1.5, "roleplay": 1.7, "reasoning": 1.6, "math": 1.6}},
               "start_eval": {"prompts": 13, "per_category": {"writing": 1.4, "roleplay": 1.8, "reasoning": 1.5, "math": 1.5,
                                                               "coding": 2.0}}},
}


def test_the_runs_table_and_the_run_tabs_choices_name_runs_never_paths():
    (row,) = train_tab.trained_rows([MANIFEST])
    assert row == ["trained:0123456789abcdef", "Medusa heads", "shipped", "self 6256+128", 1.0, 14, 4.893, 1.6,
                   "2026-11-25 18:14:01", 121]
    assert train_tab._run_label(MANIFEST) == "trained 01234567 · 128 conv. from 6256 · τ 1.60 · 2026-11-25 18:14"
    bare = {**MANIFEST, "source": {}}
    assert train_tab.trained_rows([bare])[0][5:8] == [None, None, None]


def test_a_run_says_where_it_is_and_how_it_ended():
    assert train_tab.progress_line(None, 3.2) == "▶ Starting: loading the model… (3 s)"
    line = train_tab.progress_line({"stage": "train", "done": 2, "total": 14, "loss": 4.5804}, 82.4)
    assert line == "▶ Step 3 of 4, training the heads: 2/14 · loss 4.580 (82 s)"
    done = train_tab.finished_line(MANIFEST)
    assert done.startswith("✓ **Medusa heads** `trained:0123456789abcdef`: 14 steps, loss 4.815 → 4.893")
    assert "**τ 1.60** on 4 Spec-Bench prompts (64 tokens)" in done
    # Compared on the categories both checks ran: writing, roleplay, reasoning, math (not coding).
    assert "τ averages 1.60, and the heads it started from averaged 1.55" in done
    assert "started from" not in train_tab.finished_line({**MANIFEST, "source": {**MANIFEST["source"], "start_eval": None}})


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_the_run_tab_offers_the_shipped_heads_first(tmp_path, kind):
    assert train_tab.artifact_choices(Service(engines=tmp_path), kind) == [("shipped (assets/defaults)", "shipped")]


def test_a_run_starts_from_the_shipped_heads_new_ones_or_a_finished_run_of_its_kind(tmp_path):
    service = Service(engines=tmp_path)
    assert [v for _, v in train_tab.start_choices(service, "medusa")] == ["shipped", "scratch"]
    assert service.training_run("trained:" + "0" * 16) is None and service.training_run("../x") is None


def test_a_new_kind_keeps_the_start_the_user_picked_and_drops_one_of_the_other_kind(tmp_path):
    """The kind's answer must not undo a start picked while it was on its way (shipped and scratch suit every kind);
    a finished run of the other kind is no start for this one."""
    from types import SimpleNamespace

    tab = train_tab.TrainTab(Service(engines=tmp_path))
    tab.controls = {k: k for k in VALUES}  # a handler's {component: value}, keyed here by the field itself
    request = SimpleNamespace(username=None, session_hash="s", headers={}, client=None)
    kept, _ = tab.kind_changed(dict(VALUES, kind="eagle", init_from="scratch"), request)
    assert "value" not in kept and [v for _, v in kept["choices"]] == ["shipped", "scratch"]
    reset, _ = tab.kind_changed(dict(VALUES, kind="eagle", init_from="trained:" + "a" * 16), request)
    assert reset["value"] == "shipped"
