"""The in-place growing KV cache behaves like transformers' DynamicCache under appends, crops and growth."""

import torch
from transformers import LlamaConfig
from transformers.cache_utils import DynamicLayer

from app.decoding.kv_cache import GrowingLayer, new_cache


def test_matches_dynamic_layer_through_appends_crops_and_growth():
    torch.manual_seed(0)
    ours, ref = GrowingLayer(), DynamicLayer()
    for step, (append, crop) in enumerate([(300, 0), (5, 3), (1, 0), (40, 39), (400, 10), (1, 1), (7, 0)]):
        k, v = torch.randn(1, 2, append, 4), torch.randn(1, 2, append, 4)
        ok, ov = ours.update(k, v)
        rk, rv = ref.update(k, v)
        assert torch.equal(ok, rk) and torch.equal(ov, rv), step
        ours.crop(-crop)
        ref.crop(-crop)
        assert ours.get_seq_length() == ref.get_seq_length()
    assert ours._k.shape[-2] >= ours.get_seq_length()


def test_stores_the_requested_dtype():
    layer = GrowingLayer(torch.float32)
    k = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    keys, values = layer.update(k, k)
    assert keys.dtype == torch.float32 and torch.equal(keys, k.float())


def test_sliding_window_models_fall_back_to_dynamic_cache():
    full = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=8)
    assert all(isinstance(layer, GrowingLayer) for layer in new_cache(full).layers)
    from transformers import MistralConfig

    sliding = MistralConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=8, sliding_window=16)
    assert not any(isinstance(layer, GrowingLayer) for layer in new_cache(sliding).layers)
