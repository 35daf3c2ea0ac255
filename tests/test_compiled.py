"""The compiled target pass (app/decoding/compiled.py): every mode's greedy output equals eager autoregressive,
and after warm-up nothing recompiles: not for another mode, a wider tree, a longer context, or more slots."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from app.decoding import compiled, linear
from app.decoding.drafters.autoregressive import Autoregressive
from app.decoding.drafters.draft_model import DraftModel
from app.decoding.drafters.eagle import Eagle
from app.decoding.drafters.lookahead import Lookahead
from app.decoding.drafters.medusa import Medusa
from app.decoding.drafters.merged import Merged
from app.decoding.drafters.prompt_lookup import PromptLookup
from app.decoding.drafters.suffix import Suffix
from app.decoding.kv_cache import SlotLayer
from app.decoding.loop import generate
from app.decoding.target import RESERVE, TransformersTarget
from app.config import medusa_choices
from helpers import output_of, tiny_llama
from test_eagle import make_module
from test_medusa import random_heads

PROMPT = [5, 6, 7, 8] * 3 + [9, 10, 11, 5, 6, 7]  # repeats, so the copying modes accept drafts
NEW = RESERVE + 40  # past the first slots: the cache grows during the run


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab=96, hidden=32, layers=2, max_pos=1024, seed=0)


@pytest.fixture(scope="module")
def warmed(model):
    """The compiled forward, warmed up, and how many of inductor's C++ GEMM kernels the warm-up built."""
    fn = compiled.compile_forward(model)
    before = counters["inductor"]["cpp_templated_kernel_counter"]
    compiled.warm_up(model, fn)
    return fn, counters["inductor"]["cpp_templated_kernel_counter"] - before


@pytest.fixture(scope="module")
def forward(warmed):
    return warmed[0]


@pytest.fixture(scope="module")
def eagle(model):
    """An EAGLE module that fuses target layers (so its catch-ups and tree levels are different graphs), compiled and
    warmed up, as runner.load_companion makes it beside a compiled target."""
    module = make_module(model, aux=[1, 2]).eval().requires_grad_(False)
    module.run = compiled.compile_eagle(module)
    compiled.warm_up_eagle(module, module.run)
    return module


def drafters(model, eagle):
    embed = model.get_input_embeddings()
    return {
        "prompt_lookup": PromptLookup(10, 2),
        "lookahead": Lookahead(4, 3, 4),
        "draft_target": DraftModel(tiny_llama(vocab=96, hidden=16, layers=1, max_pos=1024, seed=1), 3),
        "medusa": Medusa(random_heads(), model.get_output_embeddings(), medusa_choices("default")),
        "eagle": Eagle(eagle, embed, total_tokens=24, depth=5, top_k=4),
        "eagle+prompt_lookup": Merged(Eagle(eagle, embed, total_tokens=12, depth=4, top_k=3), PromptLookup(10, 2, max_candidates=2)),
        "suffix": Suffix(),
    }


def _run(model, drafter, forward=None):
    target = TransformersTarget(model, hidden_states=drafter.needs_hidden, forward=forward)
    return output_of(generate(target, drafter, PROMPT, max_new_tokens=NEW)), target


def test_every_mode_on_the_compiled_pass_equals_eager_autoregressive_and_nothing_recompiles(model, forward, eagle):
    reference, eager = _run(model, Autoregressive())
    assert len(reference) == NEW and not eager.slotted
    with torch._dynamo.config.patch(error_on_recompile=True):
        out, target = _run(model, Autoregressive(), forward)
        assert out == reference and target.run is forward and target.slotted
        assert target.capacity > len(PROMPT) + RESERVE  # the slots grew during the run
        for name, drafter in drafters(model, eagle).items():
            out, _ = _run(model, drafter, forward)
            assert out == reference, name


def test_the_compiled_eagle_drafter_drafts_the_trees_the_eager_one_does(model, forward, eagle):
    """Its passes write into slots and attend under a mask over all of them; eagerly the cache grows and is cropped.
    Same trees, step by step, over a run whose slots grow; and no recompile after warm_up_eagle."""
    def trees(module):
        drafter = Eagle(module, model.get_input_embeddings(), total_tokens=24, depth=5, top_k=4)
        target = TransformersTarget(model, hidden_states=True, forward=forward)
        return [(e.proposed, e.tokens) for e in generate(target, drafter, PROMPT, max_new_tokens=NEW)]

    eager = make_module(model, aux=[1, 2]).eval().requires_grad_(False)
    assert eager.run is None and eagle.run is not None
    reference = trees(eager)
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert trees(eagle) == reference
    assert sum(len(p["tokens"]) for p, _ in reference) > 100


def test_two_sessions_at_once_share_the_compiled_pass(model, forward):
    """The service runs sessions in threads (--max-concurrency): each keeps its own slots, the graph is shared."""
    from concurrent.futures import ThreadPoolExecutor

    reference, _ = _run(model, Autoregressive())
    with torch._dynamo.config.patch(error_on_recompile=True), ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_run, model, drafter, forward) for drafter in (Autoregressive(), PromptLookup(10, 2), Suffix())]
        assert [run.result()[0] for run in runs] == [reference] * 3


def test_a_recompile_would_be_caught(model, forward):
    """The check above can fail: a graph it has not seen (another dtype of input) raises under the same patch."""
    with torch._dynamo.config.patch(error_on_recompile=True), pytest.raises(Exception, match="[Rr]ecompil"):
        forward(input_ids=torch.tensor([[1, 2]], dtype=torch.int32), use_cache=False)


def test_bfloat16_passes_of_every_width_run_compiled_near_eager_without_recompiling():
    """bfloat16: without native instructions the graph multiplies 3+ rows against float32 copies of the weights, as
    the eager layers do (linear.py); with them, in bfloat16. Either way one warm-up covers every width."""
    model = tiny_llama(vocab=96, hidden=32, layers=2, max_pos=1024, seed=0).to(torch.bfloat16)
    linear.pack(model)
    fn = compiled.compile_forward(model)
    wide = [m for m in model.modules() if getattr(m, "_wide", None) is not None]
    assert bool(wide) == linear.upcasts(torch.bfloat16) and all(m._wide.dtype == torch.float32 for m in wide)
    compiled.warm_up(model, fn)
    eager, fast = TransformersTarget(model, hidden_states=False), TransformersTarget(model, hidden_states=False, forward=fn)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for target in (eager, fast):
            target.prefill(PROMPT)
        for width in (1, 2, 3, 5, 17, 2, 1):
            tokens, parents = list(range(10, 9 + width)), [i // 2 - 1 for i in range(width - 1)]
            a, b = (t.forward(7, tokens, parents).logits.float() for t in (eager, fast))
            for t in (eager, fast):
                t.commit([])
            assert a.shape == b.shape == (width, 96)
            assert (a - b).abs().max() <= 0.05 * a.abs().max(), width


def test_warm_up_freezes_the_weights_into_inductors_own_products(warmed):
    """torch.compile's options reach inductor only: traced without inductor's freezing flag set, the weights stay
    graph inputs and every product is a plain aten::mm, none of inductor's own kernels. warm_up traces with it."""
    _, kernels = warmed
    assert kernels >= 2 * (2 * 7 + 1)  # 7 products a layer and the LM head, in both graphs (one token, any width)


def test_slot_layer_writes_at_its_pointer_and_keeps_its_slots_when_it_grows():
    layer = SlotLayer(4, torch.float32)
    k = torch.arange(1 * 2 * 3 * 2, dtype=torch.bfloat16).reshape(1, 2, 3, 2)
    keys, _ = layer.update(k, k)
    assert keys.dtype == torch.float32 and keys.shape[-2] == 4 and torch.equal(keys[..., :3, :], k.float())
    layer.cumulative_length.fill_(1)  # a rejected draft at slots 1-2 is overwritten by the next pass
    layer.update(k[..., :1, :] + 100, k[..., :1, :])
    assert torch.equal(layer.keys[..., 1, :], (k[..., 0, :] + 100).float())
    before = layer.keys.clone()
    layer.grow(9)
    assert layer.keys.shape[-2] == 9 and torch.equal(layer.keys[..., :4, :], before)
    assert not layer.keys[..., 4:, :].any()
