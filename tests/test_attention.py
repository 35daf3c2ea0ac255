"""The float32 attention registered for models loaded by the registry equals PyTorch's reference."""

import pytest
import torch
import torch.nn.functional as F

from app.decoding.attention import sdpa_fp32


class Layer(torch.nn.Module):
    """The attributes transformers' attention functions read from an attention module."""

    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.eval()


def reference(q, k, v, mask, causal):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len", [1, 3, 17, 200])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_matches_reference(dtype, q_len, mask_kind):
    torch.manual_seed(q_len)
    kv_len = q_len + 40
    q = torch.randn(1, 6, q_len, 16).to(dtype)
    k = torch.randn(1, 2, kv_len, 16)  # the cache stores float32 keys and values
    v = torch.randn(1, 2, kv_len, 16)
    allowed = torch.rand(q_len, kv_len) > 0.3
    allowed[:, 0] = True  # every row attends somewhere
    if mask_kind == "none":
        if q_len > 1:
            pytest.skip("without a mask, q > 1 means prefill over exactly q keys (covered below)")
        mask, ref_mask = None, None
    elif mask_kind == "bool":
        mask, ref_mask = allowed[None, None], allowed[None, None]
    else:
        mask = torch.zeros(q_len, kv_len).masked_fill(~allowed, torch.finfo(dtype).min).to(dtype)[None, None]
        ref_mask = mask.float()
    out, _ = sdpa_fp32(Layer(3), q, k, v, mask)
    assert out.shape == (1, q_len, 6, 16) and out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(q, k, v, ref_mask, False).to(dtype).float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)


def test_prefill_is_causal():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    out, _ = sdpa_fp32(Layer(2), q, k, v, None)
    torch.testing.assert_close(out, reference(q, k, v, None, True), atol=1e-5, rtol=1e-5)
