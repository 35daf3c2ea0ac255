"""Training pipeline: ShareGPT data, cached target features, the shared fit() loop, the distilled draft."""

import itertools
import json
import lzma

import pytest
import torch

from app.decoding import attention
from app.training import data as data_mod
from app.training import recipes
from app.training.data import FeatureSet, compute_features, sharegpt_conversations
from app.training.draft import distill_loss
from app.heads.draft import make_draft, pick_layers, read_layers, rebuild, save_layers
from app.training.trainer import Stopped, fit
from helpers import tiny_llama, tiny_tokenizer


# ----------------------------------------------------------------------------- data


def test_sharegpt_slice_is_fixed_and_well_formed():
    first = sharegpt_conversations(0, 5)
    again = sharegpt_conversations(2, 3)
    assert len(first) == 5 and again == first[2:]
    for conv in first:
        assert [m["role"] for m in conv] == ["user", "assistant"]
        assert all(m["content"].strip() for m in conv)
    assert len(sharegpt_conversations(data_mod.CONVERSATIONS - 2, 10)) == 2  # the last two there are


def random_sequences(n, vocab, seed=0, lo=5, hi=30):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


@torch.inference_mode()
def test_batched_features_equal_unpadded_single_runs(tiny_model):
    seqs = random_sequences(7, 96)
    fs = compute_features(tiny_model, seqs, batch_size=3)
    assert len(fs) == 7 and fs.num_tokens == sum(map(len, seqs))
    for seq, ids, hidden in zip(seqs, fs.ids, fs.hidden):
        assert ids.tolist() == seq and hidden.dtype == torch.bfloat16
        ref = tiny_model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(hidden.float(), ref, atol=2e-2, rtol=2e-2)
        # The cached hidden states reproduce the target's logits through its own head.
        logits = tiny_model.get_output_embeddings()(hidden.float())
        assert (logits.argmax(-1) == tiny_model(input_ids=torch.tensor([seq])).logits[0].argmax(-1)).float().mean() > 0.9


def test_features_with_fused_layers(tiny_model, tmp_path):
    """aux holds the requested layers' hidden states side by side, batched, saved and loaded back."""
    seqs = random_sequences(5, 96, seed=3)
    fs = compute_features(tiny_model, seqs, batch_size=2, aux_layers=(0, 2))
    for seq, hidden, aux in zip(seqs, fs.hidden, fs.aux):
        states = tiny_model(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(aux.float(), torch.cat([states[0][0], states[2][0]], -1), atol=2e-2, rtol=2e-2)
    batch = next(fs.batches(batch_size=5, seq_len=64))
    assert batch.aux.shape == (*batch.ids.shape, 64) and not batch.aux[~batch.mask].any()
    fs.save(tmp_path / "f.safetensors")
    back = FeatureSet.load(tmp_path / "f.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(back.aux, fs.aux))
    train, held = fs.split(2)
    assert len(train.aux) == 3 and len(held.aux) == 2


def test_batches_cover_every_sequence_once_with_a_correct_mask(tiny_model, tmp_path):
    seqs = random_sequences(11, 96, seed=1)
    fs = compute_features(tiny_model, seqs, batch_size=4)
    seen = []
    for ids, hidden, mask, aux in fs.batches(batch_size=3, seq_len=20, seed=4):
        assert aux is None
        assert ids.shape == mask.shape and hidden.shape[:2] == ids.shape and hidden.dtype == torch.float32
        for row, m in zip(ids, mask):
            n = int(m.sum())
            assert m[:n].all() and not m[n:].any()
            seen.append(tuple(row[:n].tolist()))
    assert sorted(seen) == sorted(tuple(s[:20]) for s in seqs)
    fs.save(tmp_path / "f.safetensors")
    back = FeatureSet.load(tmp_path / "f.safetensors")
    assert [x.tolist() for x in back.ids] == seqs
    assert all(torch.equal(a, b) for a, b in zip(back.hidden, fs.hidden))
    train, held = fs.split(3)
    assert len(train) == 8 and len(held) == 3 and held.ids[0].tolist() == seqs[8]


class CharTokenizer:
    """A tokenizer without a chat template: one id per character (mod 96)."""

    chat_template = None

    def encode(self, text):
        return [ord(c) % 96 for c in text]


def test_cached_features_resume_after_an_interruption(tiny_model, tmp_path, monkeypatch):
    calls = []
    real = data_mod.compute_features

    def counting(model, seqs, **kw):
        calls.append(len(seqs))
        return real(model, seqs, **kw)

    monkeypatch.setattr(data_mod, "compute_features", counting)
    kw = dict(offset=0, limit=6, max_len=24, shard=2)
    fs = data_mod.cached_features("tiny", tiny_model, CharTokenizer(), tmp_path, **kw)
    assert calls == [2, 2, 2] and len(fs) == 6 and max(len(x) for x in fs.ids) == 24
    shards = sorted((tmp_path / "data").glob("*/shard-*.safetensors"))
    assert len(shards) == 3
    shards[1].unlink()  # as if the run had been killed while computing shard 1
    calls.clear()
    again = data_mod.cached_features("tiny", tiny_model, CharTokenizer(), tmp_path, **kw)
    assert calls == [2]
    assert [x.tolist() for x in again.ids] == [x.tolist() for x in fs.ids]
    assert not list((tmp_path / "data").glob("*/*.tmp"))


@pytest.mark.parametrize("attn", ["sdpa", "specdec"])
def test_batched_greedy_answers_equal_one_prompt_at_a_time(attn):
    """Left padding and length-sorted batches do not change any answer; an answer ends at its first EOS.
    "specdec": on the float32 attention the registry loads models with."""
    tiny_model = tiny_llama(vocab=96, hidden=32, layers=2, max_pos=256, seed=0)
    if attn == "specdec":
        tiny_model.config._attn_implementation = attention.register()
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 9, 2, 30, 11)]
    solo = [tiny_model.generate(input_ids=torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
            for p in prompts]
    batched = data_mod.generate_answers(tiny_model, None, prompts, max_new_tokens=12, eos_token_ids=[], pad_token_id=0, batch_size=4)
    assert batched == solo
    eos = solo[0][len(prompts[0]) + 3]  # a token the first answer produces
    cut = data_mod.generate_answers(tiny_model, None, prompts, max_new_tokens=12, eos_token_ids=[eos], pad_token_id=0, batch_size=4)
    for p, full, got in zip(prompts, solo, cut):
        answer = full[len(p):]
        want = answer[: answer.index(eos) + 1] if eos in answer else answer
        assert got == p + want


@pytest.fixture
def answer_calls(monkeypatch):
    """The batch sizes generate_answers is called with (the answers are still generated)."""
    calls = []
    real = data_mod.generate_answers

    def counting(model, tok, prompts, **kw):
        calls.append(len(prompts))
        return real(model, tok, prompts, **kw)

    monkeypatch.setattr(data_mod, "generate_answers", counting)
    return calls


def test_self_distilled_data_is_cached_resumable_and_trains(tiny_model, tmp_path, answer_calls):
    calls = answer_calls
    kw = dict(offset=0, limit=5, max_len=40, max_new_tokens=8, eos_token_ids=[], shard=2)
    seqs = data_mod.self_distilled_sequences("tiny", tiny_model, CharTokenizer(), tmp_path, **kw)
    assert calls == [2, 2, 1] and len(seqs) == 5
    prompts = data_mod._prompts(CharTokenizer(), sharegpt_conversations(0, 5), 32)
    for p, q in zip(prompts, seqs):
        assert len(p) <= 32 and q[: len(p)] == p and len(q) == len(p) + 8  # no EOS: every answer is full length
        assert q == tiny_model.generate(input_ids=torch.tensor([p]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0].tolist()
    shards = sorted((tmp_path / "data").glob("self-*/shard-*.json"))
    assert len(shards) == 3
    shards[2].unlink()
    calls.clear()
    assert data_mod.self_distilled_sequences("tiny", tiny_model, CharTokenizer(), tmp_path, **kw) == seqs and calls == [1]
    fs = data_mod.cached_features("tiny", tiny_model, CharTokenizer(), tmp_path, offset=0, limit=5, max_len=40,
                                  source="self", sequences=seqs)
    assert [x.tolist() for x in fs.ids] == seqs
    # other answers (another --answer-tokens) under the same slice get their own features, not the cached ones
    shorter = [q[:-3] for q in seqs]
    fs2 = data_mod.cached_features("tiny", tiny_model, CharTokenizer(), tmp_path, offset=0, limit=5, max_len=40,
                                   source="self", sequences=shorter)
    assert [x.tolist() for x in fs2.ids] == shorter
    with pytest.raises(ValueError, match="needs its token sequences"):
        data_mod.cached_features("tiny", tiny_model, CharTokenizer(), tmp_path, source="self")


def test_shipped_answers_replace_generation_on_a_fresh_machine(tiny_model, tmp_path, answer_calls):
    """ship_answers + a fresh engines/: the answers come from the shipped shards, not from the model;
    a shard answering other prompts (another tokenizer, say) is generated instead."""
    calls = answer_calls
    kw = dict(offset=0, limit=5, max_len=40, max_new_tokens=8, eos_token_ids=[], shard=2)
    seqs = data_mod.self_distilled_sequences("tiny", tiny_model, CharTokenizer(), tmp_path / "a", shipped=None, **kw)
    calls.clear()
    shipped = tmp_path / "assets"
    written = data_mod.ship_answers(tmp_path / "a", "tiny", CharTokenizer(), shipped, shard=2)
    assert [p.name for p in written] == ["shard-0000.json.xz", "shard-0001.json.xz", "shard-0002.json.xz"]
    assert data_mod.ship_answers(tmp_path / "a", "another-model", CharTokenizer(), tmp_path / "none") == []
    other = tiny_llama(vocab=96, hidden=32, layers=2, max_pos=256, seed=7)  # would answer differently
    got = data_mod.self_distilled_sequences("tiny", other, CharTokenizer(), tmp_path / "b", shipped=shipped, **kw)
    assert got == seqs and calls == []
    # The answers only are shipped (the prompts come from the dataset again); answers to other prompts
    # (another tokenizer or chat template) are not used.
    packed = json.loads(lzma.decompress(written[1].read_bytes()))
    assert packed["answers"] == [q[-8:] for q in seqs[2:4]]
    written[1].write_bytes(lzma.compress(json.dumps({**packed, "prompts": "0" * 16}).encode()))
    again = data_mod.self_distilled_sequences("tiny", tiny_model, CharTokenizer(), tmp_path / "c", shipped=shipped, **kw)
    assert again == seqs and calls == [2]


def test_long_prompts_keep_their_head_and_their_end():
    long = [{"role": "user", "content": "".join(chr(65 + i % 26) for i in range(100))}]
    (ids,) = data_mod._prompts(CharTokenizer(), [long], 40)
    full = CharTokenizer().encode(long[0]["content"])
    assert ids == full[:32] + full[-8:]


# ----------------------------------------------------------------------------- fit


def test_fit_lowers_the_loss_and_saves_checkpoints(tiny_model):
    seqs = random_sequences(16, 96, seed=2)
    fs = compute_features(tiny_model, seqs)
    probe = torch.nn.Linear(32, 32)
    target = torch.nn.Linear(32, 32)
    target.requires_grad_(False)
    saved = []

    def loss_fn(b):
        return ((probe(b.hidden) - target(b.hidden))[b.mask] ** 2).mean()

    losses = fit(probe, loss_fn, fs, epochs=30, lr=1e-2, batch_size=4, warmup=5, save_steps=40, save_fn=saved.append)
    assert len(losses) == 120
    assert sum(losses[-10:]) / 10 < 0.1 * sum(losses[:10]) / 10
    assert saved == [40, 80, 120]
    with pytest.raises(ValueError, match="no trainable"):
        fit(target, loss_fn, fs)


def noisy_probe(init_seed=1):
    """(module, loss_fn): a small MLP fitted to a fixed map, on inputs with noise from torch's global RNG."""
    torch.manual_seed(0)
    target = torch.nn.Linear(32, 32).requires_grad_(False)
    torch.manual_seed(init_seed)
    probe = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32))

    def loss_fn(b):
        x = b.hidden + 0.1 * torch.randn_like(b.hidden)
        return ((probe(x) - target(b.hidden))[b.mask] ** 2).mean()

    return probe, loss_fn


# 10 sequences in batches of 3: 4 steps an epoch, 10 steps, the last epoch cut short
FIT = dict(epochs=2.5, lr=1e-2, batch_size=3, warmup=3)


def fit_in_sessions(fs, state, steps_per_session=3, tamper=None, **kw):
    """A run of fit() stopped by its time limit every `steps_per_session` steps (a clock that ticks once per
    step) and resumed in a freshly made module each time, until it ends; `tamper(state dict)` edits the state
    saved by the first session. Returns (module, losses, the steps at which the sessions stopped)."""
    stops = []
    for session in itertools.count():
        module, loss_fn = noisy_probe(init_seed=1 if session == 0 else 10 + session)  # resuming restores the weights
        tick = itertools.count()
        try:
            return module, fit(module, loss_fn, fs, time_limit=steps_per_session, state=state, clock=lambda: next(tick),
                               **{**FIT, **kw}), stops
        except Stopped as stop:
            stops.append((stop.step, stop.total, len(stop.losses)))
        if tamper is not None and session == 0:
            saved = torch.load(state, weights_only=True)
            tamper(saved)
            torch.save(saved, state)


@pytest.fixture(scope="module")
def probe_features(tiny_model):
    return compute_features(tiny_model, random_sequences(10, 96, seed=2))


@pytest.fixture(scope="module")
def uninterrupted(probe_features):
    module, loss_fn = noisy_probe()
    return module, fit(module, loss_fn, probe_features, **FIT)


def test_fit_stopped_by_its_time_limit_and_resumed_ends_as_one_uninterrupted_run(probe_features, uninterrupted, tmp_path):
    module, losses, stops = fit_in_sessions(probe_features, tmp_path / "resume" / "state.pt")
    assert stops == [(3, 10, 3), (6, 10, 6), (9, 10, 9)]  # the last across an epoch's end
    assert losses == uninterrupted[1]
    for (name, a), b in zip(uninterrupted[0].named_parameters(), module.parameters()):
        assert torch.equal(a, b), name
    assert not list((tmp_path / "resume").glob("*.tmp"))


def _scramble_rng(saved):
    torch.manual_seed(123)
    saved["rng"] = torch.get_rng_state()


@pytest.mark.parametrize("tamper", [
    lambda s: s["optimizer"].update(state={}),  # Adam's moments
    lambda s: s["scheduler"].update(last_epoch=0),  # the learning-rate schedule
    _scramble_rng,  # the noise the loss draws
    lambda s: s.update(position=0),  # where the epoch's batch order was
    lambda s: s["params"].update({k: v + 1e-6 for k, v in s["params"].items()}),
], ids=["optimizer", "scheduler", "rng", "position", "params"])
def test_every_part_of_the_saved_state_matters(probe_features, uninterrupted, tmp_path, tamper):
    """Losing any part of the state changes the result: the equality above is a test that can fail."""
    module, _, _ = fit_in_sessions(probe_features, tmp_path / "state.pt", tamper=tamper)
    assert not all(torch.equal(a, b) for a, b in zip(uninterrupted[0].parameters(), module.parameters()))


def test_a_run_killed_after_a_periodic_save_resumes_as_one_uninterrupted_run(probe_features, uninterrupted, tmp_path):
    """`save_every` writes the state while the run goes on (a clock ticking once per call: every few steps); a
    session that dies between two saves (here at step 7) continues from the last one to the uninterrupted result."""
    state = tmp_path / "resume" / "state.pt"
    module, loss_fn = noisy_probe()
    tick, saves = itertools.count(), []

    def dies(step, total, loss):
        if step == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(module, loss_fn, probe_features, state=state, save_every=3, saved=lambda step, *_: saves.append(step),
            progress=dies, clock=lambda: next(tick), **FIT)
    assert saves == [3, 6] and torch.load(state, weights_only=True)["step"] == 6
    fresh, loss_fn = noisy_probe(init_seed=42)  # resuming restores the weights
    assert fit(fresh, loss_fn, probe_features, state=state, **FIT) == uninterrupted[1]
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[0].parameters(), fresh.parameters()))


def test_a_state_continues_only_the_run_that_saved_it(probe_features, tmp_path):
    state = tmp_path / "state.pt"
    module, loss_fn = noisy_probe()
    tick = itertools.count()
    with pytest.raises(Stopped):
        fit(module, loss_fn, probe_features, time_limit=2, state=state, clock=lambda: next(tick), **FIT)
    with pytest.raises(ValueError, match=r"holds another run \(its total, lr, batch_size differ\)"):
        fit(module, loss_fn, probe_features, state=state, **{**FIT, "lr": 1e-3, "batch_size": 4})
    with pytest.raises(ValueError, match="a time limit or periodic saves need a state file"):
        fit(module, loss_fn, probe_features, time_limit=5, **FIT)


def tiny_train_run(tmp_path):
    """(`train` arguments of a two-epoch EAGLE run on a tiny model saved under tmp_path, its --engines-dir flag)."""
    from helpers import tiny_tokenizer

    tiny_llama().save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    engines = ["--engines-dir", str(tmp_path / "engines")]
    return ["train", "--mode", "eagle", "--model", str(tmp_path / "model"), "--data-source", "sharegpt", "--data-limit",
            "12", "--max-len", "32", "--epochs", "2", "--eval-prompts", "0", *engines], engines


def test_data_slices_cut_a_range_at_multiples_of_the_slice():
    assert data_mod.data_slices(6000, 5000) == [(6000 + 1000 * k, 1000) for k in range(5)]
    assert data_mod.data_slices(995, 1010) == [(995, 5), (1000, 1000), (2000, 5)]
    assert data_mod.data_slices(0, 800) == [(0, 800)] and data_mod.data_slices(6128, 128) == [(6128, 128)]
    assert data_mod.data_slices(7, 5, size=4) == [(7, 1), (8, 4)]


def test_a_training_range_reuses_the_data_of_the_slices_it_spans(tmp_path):
    """A run over conversations 995-1005 caches its features as two slices, 995-1000 and 1000-1005; a later run
    over 1000-1005 computes nothing and trains on the same sequences."""
    from app import cli

    run, engines = tiny_train_run(tmp_path)
    assert cli.main([*run, "--data-offset", "995", "--data-limit", "10", "--output-dir", str(tmp_path / "a")]) == 0
    caches = sorted((tmp_path / "engines" / "data").glob("*/key.json"))
    assert sorted((k["offset"], k["limit"]) for k in map(lambda p: json.loads(p.read_text()), caches)) == [(995, 5), (1000, 5)]
    shards = {p: p.stat().st_mtime_ns for p in (tmp_path / "engines" / "data").rglob("shard-*")}
    assert json.loads((tmp_path / "a" / "train.json").read_text())["train_sequences"] == 8  # 10 less 2 held out
    assert cli.main([*run, "--data-offset", "1000", "--data-limit", "5", "--output-dir", str(tmp_path / "b")]) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "engines" / "data").rglob("shard-*")} == shards
    from helpers import tiny_tokenizer

    tok, other = tiny_tokenizer(), tmp_path / "other"
    whole = data_mod.cached_features("t", tiny_llama(), tok, other, offset=995, limit=10, max_len=32)
    pieces = [data_mod.cached_features("t", tiny_llama(), tok, other, offset=a, limit=n, max_len=32)
              for a, n in data_mod.data_slices(995, 10)]
    assert [x.tolist() for x in whole.ids] == [x.tolist() for p in pieces for x in p.ids]


def test_train_refuses_a_slice_past_the_end_of_the_dataset(tmp_path, capsys):
    from app import cli

    run, _ = tiny_train_run(tmp_path)
    assert cli.main([*run, "--data-offset", "11000", "--data-limit", "1000", "--output-dir", str(tmp_path / "a")]) == 2
    assert "conversations 11000-12000 are not a slice of the dataset: it has 11128" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_train_cli_stopped_by_time_limit_and_resumed_writes_the_uninterrupted_artifact(tmp_path, capsys):
    """`train --time-limit 0` stops after each step (the limit is checked after a step); `--resume` with only the
    session's flags continues until the run ends, and the artifact is the one a single run writes."""
    from app import cli

    run, engines = tiny_train_run(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main([*run, "--output-dir", str(one)]) == 0
    assert cli.main([*run, "--output-dir", str(two), "--time-limit", "0"]) == 0
    progress = json.loads((two / "train.json").read_text())
    assert (progress["state"], progress["step"], progress["total_steps"], len(progress["sessions"])) == ("stopped at time limit", 1, 4, 1)
    assert not (two / "model.safetensors").exists()
    capsys.readouterr()
    assert cli.main([*run, "--output-dir", str(two)]) == 2  # a new run would throw the stopped one away
    assert f"holds a run stopped by --time-limit: continue it with --resume {two}" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(two), "--epochs", "3", *engines]) == 2
    assert "these differ: --epochs 3.0 (the run's: 2.0)" in capsys.readouterr().err
    sessions = 1
    while (two / "resume").exists():
        assert cli.main(["train", "--resume", str(two), "--time-limit", "0", "--mode", "eagle", *engines]) == 0
        sessions += 1
    assert sessions == 4
    assert (two / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()
    a, b = json.loads((one / "train.json").read_text()), json.loads((two / "train.json").read_text())
    assert a["losses"] == b["losses"] and b["state"] == "done" and [s["steps"] for s in b["sessions"]] == [1, 1, 1, 1]
    assert a["settings"] == b["settings"]


def test_train_cli_killed_after_a_save_resumes_to_the_uninterrupted_artifact(tmp_path, monkeypatch):
    """`train` saves its state while it runs (here after every step); a session killed at step 3 (out of memory, a
    closed terminal) leaves train.json "saved while running" at step 2, and `--resume` ends as one uninterrupted run."""
    from app import cli

    run, engines = tiny_train_run(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main([*run, "--output-dir", str(one)]) == 0

    def killed_at_step_3(kind):
        def report(stage, done, total, loss=None):
            if stage == "train" and done == 3:
                raise KeyboardInterrupt
        return report

    with monkeypatch.context() as m:
        m.setattr(recipes, "SAVE_EVERY", 0.0)
        m.setattr(recipes, "stderr_report", killed_at_step_3)
        with pytest.raises(KeyboardInterrupt):
            cli.main([*run, "--output-dir", str(two)])
    progress = json.loads((two / "train.json").read_text())
    assert (progress["state"], progress["step"], progress["total_steps"]) == (recipes.SAVED, 2, 4)
    assert recipes.stopped(two) and not (two / "model.safetensors").exists()
    assert cli.main(["train", "--resume", str(two), *engines]) == 0
    assert (two / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()
    a, b = json.loads((one / "train.json").read_text()), json.loads((two / "train.json").read_text())
    assert a["losses"] == b["losses"] and b["state"] == "done" and not (two / "resume").exists()


def test_resume_refuses_a_directory_without_a_stopped_run(tmp_path, capsys):
    from app import cli

    assert cli.main(["train", "--resume", str(tmp_path)]) == 2
    assert f"--resume: {tmp_path} holds no run stopped by --time-limit" in capsys.readouterr().err
    assert cli.main(["train"]) == 2
    assert "train needs --mode (or --resume DIR" in capsys.readouterr().err


# ----------------------------------------------------------------------------- distilled draft


@pytest.mark.parametrize("n, keep, want", [(30, 3, [0, 14, 29]), (30, 1, [0]), (4, 4, [0, 1, 2, 3]), (5, 2, [0, 4])])
def test_pick_layers(n, keep, want):
    assert pick_layers(n, keep) == want


def test_pick_layers_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pick_layers(4, 5)
    with pytest.raises(ValueError):
        pick_layers(4, 0)


@torch.inference_mode()
def test_a_draft_keeping_every_layer_is_the_target():
    target = tiny_llama(layers=3, seed=3)
    draft = make_draft(target, 3)
    x = torch.tensor([[1, 5, 9, 2, 7]])
    torch.testing.assert_close(draft(input_ids=x).logits, target(input_ids=x).logits)
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert trainable and all(".layers." in n or n == "model.norm.weight" for n in trainable)


def test_distillation_over_a_draft_vocabulary(tmp_path):
    """The loss with a draft vocabulary is KL over those tokens, both distributions renormalised there;
    the draft's model directory carries the vocabulary and models.load hands it to draft_target."""
    from app import models
    from app.heads.draft import DRAFT_VOCAB, write_model

    target = tiny_llama(layers=3, seed=6, init=0.2)
    fs = compute_features(target, random_sequences(4, 96, seed=7))
    draft = make_draft(target, 1)
    head = target.get_output_embeddings()
    ids = [1, 4, 9, 16, 25, 36, 49, 64, 81]
    d2t = torch.tensor(ids) - torch.arange(len(ids))
    b = next(fs.batches(4, 64))
    with torch.no_grad():
        loss = float(distill_loss(draft, head, b.ids, b.hidden, b.mask, d2t=d2t))
        student = draft(input_ids=b.ids, attention_mask=b.mask.long()).logits[b.mask][:, ids].log_softmax(-1)
        teacher = head(b.hidden[b.mask])[:, ids].log_softmax(-1)
        want = float((teacher.exp() * (teacher - student)).sum(-1).mean())
    assert loss == pytest.approx(want, rel=1e-4)
    save_layers(draft, tmp_path / "d", "tiny", d2t)
    assert torch.equal(read_layers(tmp_path / "d")[2], d2t)
    write_model(target, tiny_tokenizer(), tmp_path / "d", tmp_path / "model")
    assert (tmp_path / "model" / DRAFT_VOCAB).is_file()
    loaded = models.load(str(tmp_path / "model"))
    assert torch.equal(loaded.draft_vocab, d2t)


def test_distillation_brings_the_draft_closer_and_round_trips(tmp_path):
    target = tiny_llama(layers=4, seed=3, init=0.2)
    fs = compute_features(target, random_sequences(24, 96, seed=5))
    draft = make_draft(target, 2)
    head = target.get_output_embeddings()
    loss = lambda b: distill_loss(draft, head, b.ids, b.hidden, b.mask)  # noqa: E731
    with torch.no_grad():
        before = sum(float(loss(b)) for b in fs.batches(8, 64)) / 3
    fit(draft, loss, fs, epochs=25, lr=3e-3, batch_size=8, warmup=5)
    with torch.no_grad():
        after = sum(float(loss(b)) for b in fs.batches(8, 64)) / 3
    assert after < 0.7 * before, (before, after)
    save_layers(draft, tmp_path / "d", "tiny")
    meta, layers, d2t = read_layers(tmp_path / "d")
    assert d2t is None
    assert meta["kept_layers"] == [0, 3] and meta["base_layers"] == 4 and meta["base_model"] == "tiny"
    assert all((".layers." in k or k == "model.norm.weight") and v.dtype == torch.bfloat16 for k, v in layers.items())
    back = rebuild(target, tmp_path / "d")
    x = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        torch.testing.assert_close(back(input_ids=x).logits, draft(input_ids=x).logits, atol=5e-2, rtol=5e-2)
    with pytest.raises(ValueError, match="5-layer|layers"):
        rebuild(tiny_llama(layers=5), tmp_path / "d")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text(json.dumps({"architecture": "medusa"}))
    with pytest.raises(ValueError, match="not a 'layer_draft' draft"):
        read_layers(tmp_path / "e")
