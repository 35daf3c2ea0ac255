"""Packed linear layers (app/decoding/linear.py): the results of F.linear (bit for bit in bfloat16 on a CPU with
native bfloat16, within float32 rounding otherwise), tied weights kept, autograd and in-place updates handled,
applied by models.load to float32 and bfloat16 CPU models."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_llama
from torch import nn

from app.decoding import linear
from app.decoding.linear import PackedLinear, fast_bf16

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
DTYPES = [pytest.param(torch.bfloat16, marks=needs_onednn), pytest.param(torch.float32, marks=needs_onednn)]


def _tiny(dtype=torch.bfloat16, tie: bool = True):
    model = tiny_llama(vocab=96, hidden=32, layers=2, seed=3)
    model.config.tie_word_embeddings = tie
    if tie:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(dtype).requires_grad_(False)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """bfloat16 with native instructions: bit for bit (oneDNN on both sides). Without them, and in float32, the
    sums run in float32 in another order than F.linear's kernel: equal within float32 rounding (in bfloat16, a
    sum that lands near a rounding boundary may round to the neighbouring bfloat16 value)."""
    if a.dtype == torch.bfloat16 and fast_bf16():
        assert torch.equal(a, b)
    elif a.dtype == torch.bfloat16:
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)
    else:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 17])  # bfloat16 without native support: 1-2 rows in bfloat16, 3+ in float32
def test_packed_linear_matches_f_linear(rows, dtype):
    torch.manual_seed(rows)
    plain = nn.Linear(64, 96, bias=rows != 3).to(dtype)
    packed = PackedLinear.wrap(plain)
    x = torch.randn(2, rows, 64, dtype=dtype)
    with torch.no_grad():
        assert_same(packed(x), F.linear(x, plain.weight, plain.bias))
    assert packed.weight is plain.weight and packed.bias is plain.bias
    assert set(packed.state_dict()) == set(plain.state_dict())  # the packed copy is derived, never saved
    twin = copy.deepcopy(packed)
    with torch.no_grad():
        assert torch.equal(twin(x), packed(x)) and twin.weight is not packed.weight


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_gathered_from_a_head_are_packed_once_with_the_same_results(dtype):
    torch.manual_seed(0)
    head = nn.Linear(32, 96, bias=True).to(dtype).requires_grad_(False)
    ids = torch.tensor([5, 0, 95, 17])
    weight, bias = head.weight[ids], head.bias[ids]
    fn = linear.rows(weight, bias)
    assert isinstance(fn, PackedLinear)
    x = torch.randn(3, 32, dtype=dtype)
    with torch.inference_mode():
        assert_same(fn(x), F.linear(x, weight, bias))
        assert_same(fn(x)[:, 1], F.linear(x, head.weight, head.bias)[:, 0])  # column j is row ids[j]


def test_rows_of_a_dtype_that_does_not_pack_use_f_linear():
    weight = torch.randn(8, 4, dtype=torch.float64)
    fn = linear.rows(weight)
    assert not isinstance(fn, PackedLinear)
    x = torch.randn(2, 4, dtype=torch.float64)
    assert torch.equal(fn(x), F.linear(x, weight))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_swaps_every_linear_keeps_ties_and_logits(dtype):
    model = _tiny(dtype)
    reference = copy.deepcopy(model)
    n = linear.pack(model)
    assert n == sum(type(m) is nn.Linear for m in reference.modules()) == 2 * 7 + 1  # q k v o gate up down per layer, lm_head
    assert all(type(m) is not nn.Linear for m in model.modules())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.get_output_embeddings() is model.lm_head and isinstance(model.lm_head, nn.Linear)
    ids = torch.randint(0, 96, (1, 40))
    with torch.inference_mode():
        assert_same(model(ids).logits, reference(ids).logits)
    assert linear.pack(model) == 0  # nothing plain is left to pack


@needs_onednn
def test_autograd_falls_back_to_f_linear():
    plain = nn.Linear(16, 8).to(torch.bfloat16)
    packed = PackedLinear.wrap(plain)
    x = torch.randn(4, 16, dtype=torch.bfloat16, requires_grad=True)
    packed(x).float().sum().backward()
    expected = plain.weight.float().sum(0).to(torch.bfloat16).expand(4, 16)
    assert torch.allclose(x.grad.float(), expected.float(), atol=1e-2)


@needs_onednn
def test_an_in_place_weight_update_is_repacked():
    packed = PackedLinear.wrap(nn.Linear(16, 8, bias=False).to(torch.bfloat16))
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        before = packed(x)
        packed.weight.mul_(2)  # an optimizer step or load_state_dict does this
        after = packed(x)
    assert torch.equal(after, F.linear(x, packed.weight)) and not torch.equal(after, before)


@needs_onednn
def test_a_dtype_conversion_or_swapped_weight_data_is_followed():
    packed = PackedLinear.wrap(nn.Linear(16, 8).to(torch.bfloat16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        packed.float()  # .to() swaps the storage without bumping the weight's version
        assert_same(packed(x), F.linear(x, packed.weight, packed.bias))
        packed.bfloat16()
        packed.weight.data = torch.randn(8, 16, dtype=torch.bfloat16)
        xb = x.bfloat16()
        assert torch.equal(packed(xb), F.linear(xb, packed.weight, packed.bias))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_are_left_alone(dtype):
    model = tiny_llama(vocab=96, hidden=32, layers=1, seed=0).to(dtype)
    assert linear.pack(model) == 0
    assert type(model.lm_head) is nn.Linear


@needs_onednn
def test_a_packed_layer_converted_to_float64_goes_through_f_linear():
    packed = PackedLinear.wrap(nn.Linear(16, 8)).double()
    x = torch.randn(2, 16, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(packed(x), F.linear(x, packed.weight, packed.bias))


@needs_onednn
@pytest.mark.bundled
def test_the_bundled_model_loads_packed_in_bfloat16_with_the_same_results(tmp_path):
    """Natively: the same greedy output. Without native bfloat16 the wide products sum in float32 in another
    order, so a near-tie may break the other way some tokens in; the prompt's logits agree within bfloat16
    rounding and its greedy token is the same."""
    from app import models
    from app.modes.configs import NGramDecodingConfig
    from app.runner import LoopConfig
    from app.runner import output_ids, run

    packed = models.load(models.BUNDLED, dtype="bfloat16")
    assert isinstance(packed.model.lm_head, PackedLinear)
    assert packed.model.lm_head.weight is packed.model.get_input_embeddings().weight
    plain = copy.deepcopy(packed)
    for parent in list(plain.model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, PackedLinear):
                setattr(parent, name, nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                                dtype=torch.bfloat16))
                getattr(parent, name).weight, getattr(parent, name).bias = child.weight, child.bias
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    prompt = packed.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        fast, slow = packed.model(ids).logits[0].float(), plain.model(ids).logits[0].float()
    assert (fast - slow).abs().max() < 0.05 * slow.abs().max()  # bfloat16 keeps 8 bits of mantissa
    assert (fast.argmax(-1) == slow.argmax(-1)).float().mean() > 0.9 and fast[-1].argmax() == slow[-1].argmax()
    if linear.fast_bf16():
        cfg = LoopConfig(NGramDecodingConfig(), max_new_tokens=24)
        assert output_ids(list(run(packed, cfg, prompt))) == output_ids(list(run(plain, cfg, prompt)))
