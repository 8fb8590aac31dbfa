"""shardlab.models: config validation, deterministic init, shapes, learnability; the labs'
tiny-GPT setup (tiny_gpt, step_batch, rank_slice, split_microbatches, lm_loss, make_optimizer)."""

from __future__ import annotations

import pytest
import torch
from shardlab.models import (
    GPT,
    OPTIMIZERS,
    SIZES,
    GPTConfig,
    lm_loss,
    make_batch,
    make_optimizer,
    rank_slice,
    split_microbatches,
    step_batch,
    tiny_gpt,
)

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)


def test_config_validation_sentences():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_head=3"):
        GPTConfig(d_model=10, n_head=3)
    with pytest.raises(ValueError, match="n_layer=0"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.5)
    assert CFG.d_ff == 64 and CFG.head_dim == 8


def test_config_from_and_to_the_accounting_shape():
    """One vocabulary: ``accounting.compute.ModelShape`` describes the model, ``GPTConfig``
    is built from it and back; ``shardlab train``'s shapes build the same GPTs as before."""
    from dataclasses import replace

    from shardlab.accounting.compute import ModelShape
    from shardlab.train import MODELS

    shape = ModelShape(layers=2, hidden=16, heads=2, kv_heads=2, ffn=64, vocab=32, seq_len=8,
                       gated=False, norm="layernorm")
    assert GPTConfig.from_shape(shape) == CFG and CFG.to_shape() == shape
    tied = replace(shape, tied_embeddings=True)
    assert GPTConfig.from_shape(tied).to_shape() == tied
    assert GPTConfig.from_shape(MODELS["tiny"]) == GPTConfig(
        vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, d_ff=128)
    assert GPTConfig.from_shape(MODELS["small"]) == GPTConfig(
        vocab_size=512, seq_len=128, n_layer=4, n_head=8, d_model=256, d_ff=1024)
    with pytest.raises(ValueError, match=r"GPTConfig.from_shape .* gated=True, norm='rmsnorm'"):
        GPTConfig.from_shape(replace(shape, gated=True, norm="rmsnorm"))
    with pytest.raises(ValueError, match="kv_heads=1"):
        GPTConfig.from_shape(replace(shape, kv_heads=1))


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


def _trainable(m):
    return {n for n, p in m.named_parameters() if p.requires_grad}


def test_tiny_gpt_kinds_and_sizes():
    plain = tiny_gpt("plain")
    assert plain.config == GPTConfig(**SIZES["small"])
    every = _trainable(plain)
    tied = tiny_gpt("tied")
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert every - _trainable(tiny_gpt("frozen")) == {"pos_emb.weight"}
    assert every - _trainable(tiny_gpt("frozen-ln1")) == {
        "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
    }
    assert _trainable(tiny_gpt("two")) == {"lm_head.weight", "ln_f.bias"}
    assert tiny_gpt("odd").config == GPTConfig(**SIZES["odd"])
    assert _trainable(tiny_gpt("odd")) == _trainable(tiny_gpt("plain", size="odd"))
    big = tiny_gpt("plain", size="two-block", d_model=16, n_layer=3)
    assert (big.config.d_model, big.config.n_layer, big.config.vocab_size) == (16, 3, 37)
    a, b = tiny_gpt("plain", seed=3), tiny_gpt("plain", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="kind='nope'"):
        tiny_gpt("nope")
    with pytest.raises(ValueError, match="size='huge'"):
        tiny_gpt("plain", size="huge")


def test_make_optimizer_skips_frozen():
    m = tiny_gpt("frozen")
    o = make_optimizer("adamw", m.parameters())
    assert isinstance(o, OPTIMIZERS["adamw"][0]) and o.defaults["lr"] == 1e-2
    stepped = {id(p) for g in o.param_groups for p in g["params"]}
    assert id(m.pos_emb.weight) not in stepped and len(stepped) == len(_trainable(m))
    with pytest.raises(ValueError, match="name='lion'"):
        make_optimizer("lion", m.parameters())


def test_batches_slices_and_microbatches():
    c = tiny_gpt().config
    x, y = step_batch(c, 2)
    assert x.shape == (24, c.seq_len)
    assert all(torch.equal(a, b) for a, b in zip((x, y), make_batch(c, 24, seed=1002)))
    parts = [rank_slice((x, y), r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(rank_slice(y, 1, 3), y[8:16])
    mbs = split_microbatches(parts[0], 2)
    assert len(mbs) == 2 and torch.equal(torch.cat([m[1] for m in mbs]), parts[0][1])
    with pytest.raises(ValueError, match="does not divide by world=5"):
        rank_slice(x, 0, 5)
    with pytest.raises(ValueError, match="rank=2"):
        rank_slice(x, 2, 2)
    with pytest.raises(ValueError, match="m=0"):
        split_microbatches((x, y), 0)


def test_lm_loss_equals_model_loss_bitwise():
    a, b = tiny_gpt("tied"), tiny_gpt("tied")
    x, y = step_batch(a.config, 0)
    la, lb = lm_loss(a, x, y), b(x, y)[1]
    assert torch.equal(la, lb)
    la.backward()
    lb.backward()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)
    low = tiny_gpt().to(torch.bfloat16)
    assert lm_loss(low, x, y).dtype == torch.float32
