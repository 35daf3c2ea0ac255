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


@pytest.mark.parametrize("q_len", [1, 5, 200])
def test_a_row_with_no_allowed_key_stays_finite(q_len):
    """Left padding: a padding query attends to nothing; its output is garbage but not NaN."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, q_len, 8), torch.randn(2, 2, q_len + 3, 8), torch.randn(2, 2, q_len + 3, 8)
    allowed = torch.ones(2, 1, q_len, q_len + 3, dtype=torch.bool)
    allowed[1, :, 0] = False
    out, _ = sdpa_fp32(Layer(2), q, k, v, allowed)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], reference(q[:1], k[:1], v[:1], None, False)[0], atol=1e-5, rtol=1e-5)


def test_left_padded_batch_equals_single_rows():
    """A batch of left-padded prompts through a model on this attention: every real row's last
    hidden state equals that prompt's own unpadded run (a NaN from a padding row would spread)."""
    from app.decoding import attention
    from helpers import tiny_llama

    model = tiny_llama(layers=3, seed=4)
    model.config._attn_implementation = attention.register()
    decoder = model.get_decoder()
    prompts = [[5, 6, 7], list(range(3, 40)), [9] * 12]
    s = max(map(len, prompts))
    x = torch.zeros(len(prompts), s, dtype=torch.long)
    attn = torch.zeros_like(x)
    for r, p in enumerate(prompts):
        x[r, s - len(p):], attn[r, s - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        batched = decoder(input_ids=x, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp_min(0)).last_hidden_state
        for r, p in enumerate(prompts):
            alone = decoder(input_ids=torch.tensor([p])).last_hidden_state
            torch.testing.assert_close(batched[r, -1], alone[0, -1], atol=1e-5, rtol=1e-5)
