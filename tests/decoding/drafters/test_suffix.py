"""Suffix decoding's drafter: its suffix trie counts, its drafts, greedy identity, and agreement with Arctic
Inference's suffix tree (the implementation vLLM runs), when the vLLM engine's venv has it."""

import json
import random
import subprocess

import pytest

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.suffix import Suffix, SuffixTrie
from app.backends.vllm import processes as vllm_processes
from app import runner
from helpers import run


def _repetitive(rng: random.Random, n: int, vocab: int) -> list[int]:
    base = [rng.randrange(vocab) for _ in range(rng.randint(1, 15))]
    seq: list[int] = []
    while len(seq) < n:
        seq += base[: rng.randint(1, len(base))] if rng.random() < 0.7 else [rng.randrange(vocab)]
    return seq[:n]


def _occurrences(seq, s):
    return sum(seq[i : i + len(s)] == s for i in range(len(seq) - len(s) + 1))


@pytest.mark.parametrize("seed", range(5))
def test_trie_counts_every_substring_up_to_its_depth(seed):
    rng = random.Random(seed)
    seq = _repetitive(rng, 60, 4)
    trie = SuffixTrie(depth=5)
    trie.extend(seq[:17])
    trie.extend(seq[17:])  # grows like a generation: the counts are those of the whole sequence
    for _ in range(200):
        i = rng.randrange(len(seq))
        s = seq[i : i + rng.randint(1, 7)]
        node = trie.find(s)
        if len(s) > 5:
            assert node is None or not node.children, "the trie stops at its depth"
            continue
        assert node is not None and node.count == _occurrences(seq, s), s


def test_chain_follows_the_most_frequent_continuation():
    # "1 2" is followed by 3 twice and by 4 once; the context ends in "1 2"
    seq = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2]
    d = Suffix(max_draft_len=8, suffix_decoding_max_tree_depth=8, suffix_decoding_max_spec_factor=4.0, suffix_decoding_min_token_prob=0.0)
    d.start(seq[:4], None, None, None)
    p = d.propose(seq, room=100)
    assert p.tokens[:2] == [3, 9] and p.parents[:2] == [-1, 0]
    src = p.source["suffix"]
    assert seq[-len(src["match"]) :] == src["match"] and src["count"] >= 2
    assert all(0 < x <= 1 for x in src["probs"]) and src["probs"] == sorted(src["probs"], reverse=True)


def test_limits_room_factor_and_min_prob():
    seq = [1, 2, 3, 4, 5, 6, 7, 8] * 4 + [1, 2]
    d = Suffix(max_draft_len=24, suffix_decoding_max_tree_depth=24, suffix_decoding_max_spec_factor=1.0, suffix_decoding_min_token_prob=0.1)
    d.start(seq, None, None, None)
    assert len(d.propose(seq, room=3).tokens) == 3
    assert len(d.propose(seq, room=100).tokens) <= 23  # a match of m tokens drafts at most m (factor 1)
    d = Suffix(max_draft_len=24, suffix_decoding_max_tree_depth=24, suffix_decoding_max_spec_factor=0.5, suffix_decoding_min_token_prob=0.1)
    d.start(seq, None, None, None)
    p = d.propose(seq, room=100)
    assert len(p.tokens) <= len(p.source["suffix"]["match"]) // 2
    # nothing recurs: no draft, and the source says so
    d = Suffix()
    d.start([1, 2, 3], None, None, None)
    assert d.propose([1, 2, 3], room=10).tokens == [] and d.propose([1, 2, 3], room=10).source["suffix"] is None


def test_tree_drafts_are_a_valid_best_first_tree():
    rng = random.Random(3)
    seq = _repetitive(rng, 200, 3)
    d = Suffix(max_draft_len=12, suffix_decoding_max_tree_depth=8, suffix_decoding_max_spec_factor=4.0,
                suffix_decoding_min_token_prob=0.0, use_tree_spec=True)
    d.start(seq[:50], None, None, None)
    p = d.propose(seq, room=100)
    assert 1 < len(p.tokens) <= 12
    assert all(-1 <= parent < i for i, parent in enumerate(p.parents))
    probs = p.source["suffix"]["probs"]
    assert probs == sorted(probs, reverse=True)  # best first
    assert len({(parent, t) for parent, t in zip(p.parents, p.tokens)}) == len(p.tokens)  # no duplicate sibling


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("prompt", [[5, 6, 7, 8] * 6, [3, 1, 4, 1, 5, 9, 2, 6] * 2 + [3, 1, 4]])
def test_greedy_output_equals_autoregressive(tiny_model, prompt, tree):
    ref, _ = run(tiny_model, Autoregressive(), prompt, max_new_tokens=40)
    out, events = run(tiny_model, Suffix(8, 16, 2.0, 0.0, use_tree_spec=tree), prompt, max_new_tokens=40)
    assert out == ref
    assert any(len(e.accepted) for e in events), "a repetitive prompt must get drafts accepted"


def _cases(n=200):
    rng = random.Random(0)
    out = []
    for _ in range(n):
        seq = _repetitive(rng, rng.randint(2, 120), rng.choice([3, 5, 8, 20]))
        out.append(dict(seq=seq, prompt=rng.randint(1, len(seq)), depth=rng.choice([4, 8, 24]), k=rng.choice([1, 5, 24]),
                        factor=rng.choice([0.5, 1.0, 2.0]), minp=rng.choice([0.0, 0.1, 0.3]), tree=rng.random() < 0.5))
    return out


ARCTIC = """
import json, sys
from arctic_inference.suffix_decoding import SuffixDecodingCache
out = []
for c in json.load(sys.stdin):
    cache = SuffixDecodingCache(max_tree_depth=c["depth"], max_cached_requests=0)
    cache.start_request("r", c["seq"][: c["prompt"]])
    if c["prompt"] < len(c["seq"]):
        cache.add_active_response("r", c["seq"][c["prompt"] :])
    d = cache.speculate("r", c["seq"][-c["depth"] :], max_spec_tokens=c["k"], max_spec_factor=c["factor"],
                        min_token_prob=c["minp"], use_tree_spec=c["tree"])
    out.append({"tokens": list(d.token_ids), "parents": list(d.parents), "probs": [float(x) for x in d.probs],
                "match": int(d.match_len)})
print(json.dumps(out))
"""


def test_drafts_agree_with_arctic_inference():
    """The drafter is written from the paper; Arctic Inference's C++ suffix tree (what vLLM's `suffix` runs) is the
    independent reference. Its tree orders equally frequent continuations by its update history; this drafter takes
    the oldest. So a draft either is Arctic's token for token, or the two first part where both had the same
    probability (a tie); nearly all are identical."""
    python = vllm_processes.Settings().python
    if not python.exists():
        pytest.skip("the vLLM engine's venv is not installed (scripts/setup-vllm.sh)")
    cases = _cases()
    done = subprocess.run([str(python), "-c", ARCTIC], input=json.dumps(cases), capture_output=True, text=True,
                          env={"ARCTIC_INFERENCE_ENABLED": "0", "PATH": "/usr/bin:/bin"}, timeout=300)
    if "No module named 'arctic_inference'" in done.stderr:
        pytest.fail("arctic-inference is missing from the vLLM venv: scripts/setup-vllm.sh installs it")
    assert done.returncode == 0, done.stderr[-2000:]
    same = 0
    for c, ref in zip(cases, json.loads(done.stdout)):
        d = Suffix(c["k"], c["depth"], c["factor"], c["minp"], c["tree"])
        d.start(c["seq"][: c["prompt"]], None, None, None)
        p = d.propose(c["seq"], room=1000)
        if (p.tokens, p.parents) == (ref["tokens"], ref["parents"]):
            same += 1
            continue
        src = p.source["suffix"] or {"match": [], "probs": []}
        probs = src["probs"]
        if src["match"] and len(src["match"]) != ref["match"] and sum(probs) == pytest.approx(sum(ref["probs"]), abs=1e-3):
            continue  # two match lengths whose drafts score the same
        first = next(i for i, pair in enumerate(zip(p.tokens, p.parents)) if pair != (ref["tokens"][i], ref["parents"][i]))
        assert probs[first] == pytest.approx(ref["probs"][first], abs=1e-3), (c, p, ref)
    assert same >= 0.95 * len(cases), f"only {same} of {len(cases)} drafts are Arctic's"


def test_vllm_mapping_and_what_it_ignores(tmp_path):
    from app.modes import MODES

    request = MODES.parse({"speculative_config": {"decoding_type": "Suffix", "max_draft_len": 12, "use_tree_spec": True},
                             "backend": "vllm"})
    assert vllm_processes.speculative_config(request) == {
        "method": "suffix", "num_speculative_tokens": 12, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1,
        "suffix_decoding_max_cached_requests": 0}
    assert any("use_tree_spec" in note for note in vllm_processes.ignored(request))
    python = tmp_path / "bin" / "python"
    assert not vllm_processes.has_arctic(python)
    (tmp_path / "lib" / "python3.11" / "site-packages" / "arctic_inference" / "suffix_decoding").mkdir(parents=True)
    assert vllm_processes.has_arctic(python)


def test_what_each_backend_says_about_suffix():
    from app.modes import MODES, configs
    from helpers import checked

    # llm_args.py's SpeculativeConfig union in the 1.2 line has no SADecodingConfig: it came later on main.
    with pytest.raises(configs.ConfigError, match="its 1.2 line has none \\(SADecodingConfig, .* came later on its main branch\\)"):
        checked({"speculative_config": {"decoding_type": "Suffix"}, "backend": "tensorrt_llm"})
    with pytest.raises(configs.ConfigError, match="the vLLM engine's"):
        checked({"speculative_config": {"decoding_type": "Suffix", "suffix_decoding_max_cached_requests": 5}})
    for field, bad in (("suffix_decoding_max_tree_depth", 0), ("suffix_decoding_min_token_prob", 1.5),
                       ("suffix_decoding_max_spec_factor", -1), ("max_draft_len", 0)):
        with pytest.raises(configs.ConfigError, match=field.split("_", 2)[-1] if field != "max_draft_len" else "max_draft_len"):
            MODES.parse({"speculative_config": {"decoding_type": "Suffix", field: bad}})
    assert runner.drafter(runner.to_runtime(MODES.parse({"speculative_config": {"decoding_type": "Suffix", "use_tree_spec": True}}))).tree
