"""Fixtures of the decoding tests: draft modules fitted to the tiny target (a trained EAGLE module, oracle Medusa heads);
the plain helpers they are built from are in tests/helpers_decoding.py."""

import pytest
import torch

from app.heads import eagle
from app.heads.eagle import EagleConfig, EagleModule
from app.heads.medusa import MedusaConfig, MedusaHeads, medusa_loss
from helpers_decoding import H, PROMPTS, V, ar_reference, features, greedy_data


@pytest.fixture(scope="module")
def trained(tiny_model):
    """A module trained for a couple of seconds on the tiny target's own greedy continuations."""
    ids, hidden = greedy_data(tiny_model, 128, 8, 40, seed=0)
    mask = torch.ones_like(ids, dtype=torch.bool)
    torch.manual_seed(0)
    module = EagleModule(EagleConfig.from_target(tiny_model.config))
    eagle.init_lm_head(module, tiny_model.get_output_embeddings())
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    embed, lm_head = tiny_model.get_input_embeddings(), tiny_model.get_output_embeddings()
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        rows = torch.randint(0, len(ids), (16,), generator=gen)
        loss = eagle.eagle_loss(module, embed, lm_head, ids[rows], hidden[rows], mask[rows], noise=0.05)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval()


@pytest.fixture(scope="module")
def oracle_heads(tiny_model):
    """Heads fitted for a second on the target's own greedy continuations of the test prompts, so
    their drafts on those prompts are often right (acceptance > 0 on the greedy path)."""
    seqs = [p + ar_reference(tiny_model, p, 60) for p in PROMPTS.values()]
    hidden, mask = features(tiny_model, seqs)
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(H, V, 3, 1))
    lm_head = tiny_model.get_output_embeddings()
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-2)
    for _ in range(120):
        loss = medusa_loss(heads, lm_head, None, hidden, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval()
