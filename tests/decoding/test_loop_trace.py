"""The step trace: invariants of StepEvents for every mode, and the edge cases of the verify loop."""

import json
import threading

import pytest

from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.lookahead import Lookahead
from app.modes.configs import lookahead_draft_tokens
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.drafters.suffix import Suffix
from app.decoding.loop import ContextError, generate
from app.decoding.sampling import SamplingParams
from app.decoding.target import TransformersTarget
from app.decoding.tree import depths
from app.runner import output_ids
from helpers import DrafterSpy, ancestors_path, check_target_probs, expected_added_kind, run

PROMPTS = {
    "repeat": [5, 6, 7, 8] * 6,
    "random": [17, 3, 88, 41, 9, 62, 30, 5, 77, 12, 50, 2, 91, 33, 8],
}

# name -> factory(target_model, draft_model)
MODES = {
    "autoregressive": lambda m, d: Autoregressive(),
    "prompt_lookup_10_2": lambda m, d: PromptLookup(10, 2),
    "prompt_lookup_3_1": lambda m, d: PromptLookup(3, 1),
    "lookahead_4_3_4": lambda m, d: Lookahead(4, 3, 4),
    "lookahead_5_4_5_nopool": lambda m, d: Lookahead(5, 4, 5, pool_from_prompt=False),
    "draft_target_small_4": lambda m, d: DraftModel(d, 4),
    "draft_target_self_3": lambda m, d: DraftModel(m, 3),
    "suffix_chain": lambda m, d: Suffix(8, 16, 1.0, 0.1),
    "suffix_tree": lambda m, d: Suffix(8, 16, 2.0, 0.0, use_tree_spec=True),
}
SPECULATIVE = [m for m in MODES if m != "autoregressive"]

SAMPLINGS = {
    "greedy": SamplingParams(),
    "t1": SamplingParams(temperature=1.0, seed=3),
    "t07_p09_k20": SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=5),
}


def is_cut(e) -> bool:
    return e.added_token is None


def check_trace(events, *, max_new_tokens, eos=(), context_limit=None, prompt_len=None):
    """Every invariant the trace promises; returns the output."""
    assert events, "generate() yields at least the prefill event"
    out = output_ids(events)
    assert out == [t for e in events for t in e.tokens]
    assert 1 <= len(out) <= max_new_tokens

    first = events[0]
    assert (first.step, first.kind) == (0, "prefill")
    assert first.proposed == {"tokens": [], "parents": []}
    assert (first.accepted, first.rejected, first.accepted_tokens) == ([], [], [])
    assert first.added_kind == "next" and first.tokens == [first.added_token]

    totals = {"new_tokens": 0, "target_steps": 0, "drafted": 0, "accepted": 0}
    elapsed = 0.0
    for i, e in enumerate(events):
        last = i == len(events) - 1
        assert e.step == i
        assert e.kind == ("prefill" if i == 0 else "decode")
        toks, parents = e.proposed["tokens"], e.proposed["parents"]
        assert len(toks) == len(parents)
        depths(parents)  # a valid tree: parents precede children
        # Accepted: a root path of the proposed tree, at most all draft nodes.
        assert len(e.accepted) <= len(toks)
        if e.accepted:
            assert e.accepted == ancestors_path(e.accepted[-1], parents), e
        assert e.accepted_tokens == [toks[j] for j in e.accepted]
        # tokens = accepted tokens + the added one (None only when cut on the last event).
        if e.added_token is None:
            assert last and e.finish_reason in ("eos", "length"), e
            assert e.tokens == e.accepted_tokens and e.tokens
        else:
            assert e.tokens == e.accepted_tokens + [e.added_token]
        # Rejected: sorted draft nodes off the accepted path; with the accepted ones, all of them.
        assert e.rejected == sorted(set(e.rejected))
        assert set(e.rejected) <= set(range(len(toks)))
        assert not set(e.rejected) & set(e.accepted)
        if not is_cut(e):
            assert set(e.accepted) | set(e.rejected) == set(range(len(toks))), e
            assert e.added_kind == expected_added_kind(e.accepted, parents), e
        # Cumulative totals.
        totals["new_tokens"] += len(e.tokens)
        totals["target_steps"] += 1
        totals["drafted"] += len(toks)
        totals["accepted"] += len(e.accepted)
        for key in ("new_tokens", "target_steps", "drafted"):
            assert e.totals[key] == totals[key], (key, e.totals, totals)
        if not is_cut(e):
            assert e.totals["accepted"] == totals["accepted"], (e.totals, totals)
        assert e.totals["tokens_per_step"] == pytest.approx(totals["new_tokens"] / totals["target_steps"])
        assert e.draft_time_s >= 0 and e.verify_time_s >= 0
        assert e.totals["elapsed_s"] >= elapsed
        elapsed = e.totals["elapsed_s"]
        check_target_view(e)
        # Finish reason on the last event only.
        assert (e.finish_reason is None) != last, (i, e.finish_reason)
        # JSON-serializable, losslessly.
        d = e.to_dict()
        assert json.loads(json.dumps(d)) == d
    assert totals["target_steps"] == len(events)
    assert events[-1].totals["new_tokens"] == len(out)

    reason = events[-1].finish_reason
    assert reason in ("eos", "length", "cancelled")
    eos = set(eos)
    assert not any(t in eos for t in out[:-1]), "generation continues past an EOS"
    if reason == "eos":
        assert out[-1] in eos
    if reason == "length":
        at_context_end = context_limit is not None and prompt_len + len(out) >= context_limit
        assert len(out) == max_new_tokens or at_context_end
    return out


def check_target_view(e):
    """The target's side of a step: it decided at the root and at every accepted node, weighed
    exactly the draft tokens hanging there, and its top token there has the highest probability."""
    view, toks, parents = e.target, e.proposed["tokens"], e.proposed["parents"]
    afters = [d["after"] for d in view["decided"]]
    assert afters[: len(e.accepted) + 1] == [-1, *e.accepted], (afters, e.accepted)
    assert len(view["p"]) == len(toks)
    for c, (par, pc) in enumerate(zip(parents, view["p"])):
        assert (pc is not None) == (par in afters), (c, par, afters)
        if pc is not None:
            assert 0.0 <= pc <= view["decided"][afters.index(par)]["top_p"] + 1e-6
    for d in view["decided"]:
        assert 0.0 < d["top_p"] <= 1.0 + 1e-6
    assert 0.0 <= view["added_p"] <= view["decided"][-1]["top_p"] + 1e-6
    if view["distribution"] == "softmax" and not is_cut(e):
        # Greedy: each accepted node was the target's top token where it hung, and so is the added one.
        assert [d["top"] for d in view["decided"]] == e.accepted_tokens + [e.added_token]
        assert all(view["p"][c] == d["top_p"] for c, d in zip(e.accepted, view["decided"]))


# ----------------------------------------------------------------------------- invariants, every mode


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("mode", list(MODES))
def test_trace_invariants(tiny_model, tiny_draft, mode, sampling, prompt):
    drafter = MODES[mode](tiny_model, tiny_draft)
    out, events = run(tiny_model, drafter, PROMPTS[prompt], sampling=SAMPLINGS[sampling], max_new_tokens=40)
    check_trace(events, max_new_tokens=40)
    assert events[-1].finish_reason == "length" and len(out) == 40
    if mode == "autoregressive":
        assert all(e.proposed["tokens"] == [] and e.added_kind == "next" for e in events)
    if mode.startswith("prompt_lookup"):
        for e in events[1:]:
            match = e.source["match"]
            assert (match is None) == (e.proposed["tokens"] == [])
    if mode == "prompt_lookup_10_2" and prompt == "repeat":
        assert events[-1].totals["accepted"] > 0


@pytest.mark.parametrize("sampling", ["greedy", "t07_p09_k20"])
@pytest.mark.parametrize("mode", ["prompt_lookup_10_2", "lookahead_4_3_4", "draft_target_small_4"])
def test_target_view_matches_a_fresh_forward_pass(tiny_model, tiny_draft, mode, sampling):
    """Every probability the trace reports is the target's, recomputed here from scratch: the whole
    context (prompt, output so far, accepted draft tokens) through the model without a cache."""
    params = SAMPLINGS[sampling]
    prompt = PROMPTS["repeat"]
    _, events = run(tiny_model, MODES[mode](tiny_model, tiny_draft), prompt, sampling=params, max_new_tokens=30)

    weighed = check_target_probs(tiny_model, prompt, events, params)
    assert weighed > 5


@pytest.mark.parametrize("mode", SPECULATIVE)
def test_trace_invariants_with_eos(tiny_model, tiny_draft, mode):
    """An EOS id that greedy decoding emits mid-way: invariants hold and output stops there."""
    prompt = PROMPTS["random"]
    ref, _ = run(tiny_model, Autoregressive(), prompt, max_new_tokens=40)
    eos = ref[20]
    out, events = run(tiny_model, MODES[mode](tiny_model, tiny_draft), prompt, max_new_tokens=40, eos_token_ids=[eos])
    check_trace(events, max_new_tokens=40, eos=[eos])
    assert out == ref[: ref.index(eos) + 1]
    assert events[-1].finish_reason == "eos"


@pytest.mark.parametrize("room", range(0, 12))
def test_lookahead_proposal_depth_fits_room(room):
    drafter = Lookahead(4, 3, 4)
    context = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 6, 1]
    drafter.start(context, SamplingParams(), None, None)
    prop = drafter.propose(context, room)
    assert max(depths(prop.parents), default=0) <= room


def test_lookahead_proposals_fit_the_trt_llm_budget(tiny_model):
    for args in [(4, 3, 4), (5, 4, 5), (7, 5, 7), (2, 2, 1)]:
        drafter = DrafterSpy(Lookahead(*args))
        run(tiny_model, drafter, PROMPTS["repeat"], max_new_tokens=40)
        assert max(len(p.tokens) for _, _, p in drafter.calls) <= lookahead_draft_tokens(*args)
        assert any(p.num_draft < len(p.tokens) for _, _, p in drafter.calls), "the Jacobi window is run"


# ----------------------------------------------------------------------------- EOS


def find_eos_inside_draft(out, events):
    """A token whose first occurrence in the output is an accepted draft token followed by more
    tokens of the same step: (token, its index in the output)."""
    pos = 0
    for e in events:
        for k, tok in enumerate(e.accepted_tokens):
            if k < len(e.tokens) - 1 and tok not in out[: pos + k]:
                return tok, pos + k
        pos += len(e.tokens)
    return None


EOS_MODES = {
    "draft_target_self_8": (lambda m, d: DraftModel(m, 8), "random"),
    "prompt_lookup_10_2": (lambda m, d: PromptLookup(10, 2), "continuation"),
    "lookahead_5_4_5": (lambda m, d: Lookahead(5, 4, 5), "repeat"),
}


@pytest.mark.parametrize("mode", list(EOS_MODES))
def test_eos_inside_a_draft(tiny_model, tiny_draft, mode):
    make, prompt_name = EOS_MODES[mode]
    if prompt_name == "continuation":
        # Prompt lookup drafts copy the context: end the prompt with the model's own greedy
        # continuation, so that the output repeats prompt text it has not generated yet.
        continuation = run(tiny_model, Autoregressive(), PROMPTS["random"], max_new_tokens=40)[0]
        prompts = [PROMPTS["random"] + continuation[:k] for k in (16, 12, 20, 8, 24)]
    else:
        prompts = [PROMPTS[prompt_name]]
    for prompt in prompts:
        out, events = run(tiny_model, make(tiny_model, tiny_draft), prompt, max_new_tokens=40)
        found = find_eos_inside_draft(out, events)
        if found:
            break
    assert found, "test setup: no accepted draft token to use as EOS"
    eos, index = found
    ref, _ = run(tiny_model, Autoregressive(), prompt, max_new_tokens=40, eos_token_ids=[eos])
    assert ref == out[: index + 1] and ref[-1] == eos
    spec, events = run(tiny_model, make(tiny_model, tiny_draft), prompt, max_new_tokens=40, eos_token_ids=[eos, 10**6])
    check_trace(events, max_new_tokens=40, eos=[eos])
    assert spec == ref
    assert events[-1].finish_reason == "eos"
    assert events[-1].added_token is None and events[-1].tokens[-1] == eos


def test_eos_as_first_token(tiny_model):
    ref, _ = run(tiny_model, Autoregressive(), PROMPTS["random"], max_new_tokens=5)
    for make in MODES.values():
        out, events = run(tiny_model, make(tiny_model, tiny_model), PROMPTS["random"], max_new_tokens=5, eos_token_ids=[ref[0]])
        assert out == [ref[0]] and len(events) == 1 and events[0].finish_reason == "eos"


def test_eos_exactly_at_the_token_budget_is_eos(tiny_model):
    ref, _ = run(tiny_model, DraftModel(tiny_model, 8), PROMPTS["random"], max_new_tokens=40)
    index = next(i for i, t in enumerate(ref) if t not in ref[:i] and i >= 2)
    out, events = run(tiny_model, DraftModel(tiny_model, 8), PROMPTS["random"], max_new_tokens=index + 1, eos_token_ids=[ref[index]])
    assert out == ref[: index + 1]
    assert events[-1].finish_reason == "eos"


# ----------------------------------------------------------------------------- max_new_tokens


@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 8, 13, 21])
@pytest.mark.parametrize("mode", ["draft_target_self_8", "prompt_lookup_10_2", "lookahead_4_3_4"])
def test_max_new_tokens_inside_a_draft(tiny_model, tiny_draft, mode, max_new):
    make = {
        "draft_target_self_8": lambda: DraftModel(tiny_model, 8),
        "prompt_lookup_10_2": lambda: PromptLookup(10, 2),
        "lookahead_4_3_4": lambda: Lookahead(4, 3, 4),
    }[mode]
    prompt = PROMPTS["repeat"]
    ref, _ = run(tiny_model, Autoregressive(), prompt, max_new_tokens=max_new)
    out, events = run(tiny_model, make(), prompt, max_new_tokens=max_new)
    check_trace(events, max_new_tokens=max_new)
    assert out == ref and len(out) == max_new
    assert events[-1].finish_reason == "length"
    if mode == "draft_target_self_8" and max_new in (3, 4, 5, 8):
        # Prefill gives 1 token, the next step accepts 8 + bonus: the budget falls inside the draft.
        assert events[-1].added_token is None and len(events) == 2


def test_max_new_tokens_one_is_the_prefill_only(tiny_model, tiny_draft):
    for make in MODES.values():
        out, events = run(tiny_model, make(tiny_model, tiny_draft), PROMPTS["repeat"], max_new_tokens=1)
        assert len(events) == 1 and len(out) == 1
        assert events[0].kind == "prefill" and events[0].finish_reason == "length"


@pytest.mark.parametrize("bad", [0, -3])
def test_max_new_tokens_must_be_positive(tiny_model, bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(generate(TransformersTarget(tiny_model), Autoregressive(), [1, 2, 3], max_new_tokens=bad))


# ----------------------------------------------------------------------------- prompts and the context window


def test_empty_prompt_is_a_clear_error(tiny_model):
    with pytest.raises(ValueError, match="empty"):
        list(generate(TransformersTarget(tiny_model), Autoregressive(), []))


@pytest.mark.parametrize("length", [48, 49, 100])
def test_prompt_longer_than_context(short_model, length):
    with pytest.raises(ContextError, match=f"{length}.*48"):
        list(generate(TransformersTarget(short_model), Autoregressive(), [1] * length))
    assert issubclass(ContextError, ValueError)


def test_prompt_one_short_of_the_context_gives_one_token(short_model):
    out, events = run(short_model, PromptLookup(10, 1), [1, 2, 3] * 15 + [1, 2], max_new_tokens=10)
    assert len(out) == 1 and events[-1].finish_reason == "length"


@pytest.mark.parametrize("sampling", ["greedy", "t1"])
@pytest.mark.parametrize("mode", list(MODES))
def test_generation_stops_at_the_end_of_the_context(short_model, mode, sampling):
    prompt = PROMPTS["repeat"]  # 24 of the 48 positions
    drafter = DrafterSpy(MODES[mode](short_model, short_model))
    out, events = run(short_model, drafter, prompt, sampling=SAMPLINGS[sampling], max_new_tokens=100)
    check_trace(events, max_new_tokens=100, context_limit=48, prompt_len=len(prompt))
    assert len(prompt) + len(out) == 48
    assert events[-1].finish_reason == "length"
    if sampling == "greedy":
        ref, _ = run(short_model, Autoregressive(), prompt, max_new_tokens=100)
        assert out == ref
    # No proposal reaches past the context: node depth <= room.
    for context, room, prop in drafter.calls:
        assert room == 48 - len(context) - 1
        assert max(depths(prop.parents), default=0) <= room, (len(context), room, prop)


# ----------------------------------------------------------------------------- cancel


@pytest.mark.parametrize("mode", list(MODES))
def test_cancel_after_the_second_event(tiny_model, tiny_draft, mode):
    cancel = threading.Event()
    events = []
    for e in generate(TransformersTarget(tiny_model), MODES[mode](tiny_model, tiny_draft), PROMPTS["random"], max_new_tokens=100, cancel=cancel):
        events.append(e)
        if len(events) == 2:
            cancel.set()
    assert len(events) <= 3, "at most the step already under way finishes after cancel"
    assert events[-1].finish_reason == "cancelled"
    check_trace(events, max_new_tokens=100)
    ref, _ = run(tiny_model, Autoregressive(), PROMPTS["random"], max_new_tokens=100)
    assert output_ids(events) == ref[: len(output_ids(events))]


def test_cancel_before_start_stops_after_prefill(tiny_model):
    cancel = threading.Event()
    cancel.set()
    events = list(generate(TransformersTarget(tiny_model), PromptLookup(), PROMPTS["repeat"], cancel=cancel))
    assert len(events) == 1 and events[0].finish_reason == "cancelled"


def test_cancel_from_another_thread(tiny_model):
    cancel = threading.Event()
    events = []
    gen = generate(TransformersTarget(tiny_model), Autoregressive(), PROMPTS["random"], max_new_tokens=200, cancel=cancel)
    events.append(next(gen))
    t = threading.Thread(target=cancel.set)
    t.start()
    t.join()
    events.extend(gen)
    assert len(events) == 2 and events[-1].finish_reason == "cancelled"


# ----------------------------------------------------------------------------- known bugs


def cut_run(tiny_model):
    """Self-draft with 8 tokens and a budget of 4: step 1's 8 accepted drafts are cut to 3."""
    out, events = run(tiny_model, DraftModel(tiny_model, 8), PROMPTS["random"], max_new_tokens=4)
    last = events[-1]
    assert len(events) == 2 and last.added_token is None and len(last.proposed["tokens"]) == 8
    assert last.accepted == [0, 1, 2]
    return last


def test_cut_event_rejected_lists_every_node_off_the_accepted_path(tiny_model):
    last = cut_run(tiny_model)
    assert last.rejected == [3, 4, 5, 6, 7], last.rejected


def test_cut_event_totals_accepted_matches_events(tiny_model):
    last = cut_run(tiny_model)
    assert last.totals["accepted"] == len(last.accepted), last.totals


@pytest.mark.parametrize("room", [2, 3, 4])
def test_lookahead_respects_room(room):
    drafter = Lookahead(4, 3, 4)
    context = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 6, 1]
    drafter.start(context, SamplingParams(), None, None)
    prop = drafter.propose(context, room)
    assert len(prop.tokens) <= room, (room, prop.tokens)


@pytest.mark.parametrize("caps", [(), (2,), (2, 5), (0, 3)])
def test_prompt_lookup_draft_length_follows_the_matched_ngram_size(caps):
    drafter = PromptLookup(10, 3, ngram_draft_lens=caps)
    drafter.start([], SamplingParams(), None, None)
    # "7 8 9" recurs (3-gram match), "8 9" alone recurs with "5 8 9", "9" alone after "4 9".
    contexts = {
        3: [7, 8, 9] + list(range(20, 40)) + [7, 8, 9],
        2: [5, 8, 9] + list(range(20, 40)) + [7, 8, 9],
        1: [4, 9] + list(range(20, 40)) + [7, 8, 9],
    }
    for n, context in contexts.items():
        prop = drafter.propose(context, room=100)
        want = min(10, caps[n - 1]) if n <= len(caps) else 10
        if want == 0:
            assert prop.tokens == [] and prop.source["match"] is None
            continue
        assert prop.source["match"]["ngram"] == context[-n:]
        assert len(prop.tokens) == want
        start = prop.source["match"]["continuation_position"]
        assert prop.tokens == context[start : start + want]
