"""shardlab.models: config validation, deterministic init, shapes, learnability."""

from __future__ import annotations

import pytest
import torch
from shardlab.models import GPT, GPTConfig, make_batch

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)


def test_config_validation_sentences():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_head=3"):
        GPTConfig(d_model=10, n_head=3)
    with pytest.raises(ValueError, match="n_layer=0"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.5)
    assert CFG.d_ff == 64 and CFG.head_dim == 8


@pytest.mark.parametrize("tied", [False, True])
def test_param_count_and_blocks(tied):
    c = GPTConfig(vocab_size=32, seq_len=8, n_layer=3, n_head=2, d_model=16, tied_embeddings=tied)
    m = GPT(c)
    assert sum(p.numel() for p in m.parameters()) == c.n_params()
    assert isinstance(m.blocks, torch.nn.ModuleList) and len(m.blocks) == 3
    if tied:
        assert m.lm_head.weight is m.tok_emb.weight


def test_init_independent_of_global_rng():
    torch.manual_seed(1)
    a = GPT(CFG)
    torch.manual_seed(2)
    torch.rand(100)
    b = GPT(CFG)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    c = GPT(CFG, seed=1)
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_forward_shapes_loss_and_learning():
    m = GPT(CFG)
    idx, tgt = make_batch(CFG, 4, seed=0)
    i2, t2 = make_batch(CFG, 4, seed=0)
    assert torch.equal(idx, i2) and torch.equal(tgt, t2)
    assert torch.equal(idx[:, 1:], tgt[:, :-1])
    logits, loss = m(idx, tgt)
    assert logits.shape == (4, 8, 32) and loss is not None
    assert m(idx)[1] is None
    assert abs(loss.item() - torch.log(torch.tensor(32.0)).item()) < 0.2
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    first = loss.item()
    for _ in range(30):
        opt.zero_grad()
        loss = m(idx, tgt)[1]
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.5
    with pytest.raises(ValueError, match="exceeds config.seq_len=8"):
        m(torch.zeros(1, 9, dtype=torch.long))
