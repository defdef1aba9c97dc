"""Shared layers: TP slicing at a faked tp size 2, norms, activation, rotary embedding."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama as hf

from eagle_zoo.models import parallel_state as ps
from eagle_zoo.models.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    ShapeMismatch,
    SiluAndMul,
    VocabParallelEmbedding,
    get_rope,
    rope_parameters,
)

g = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=g)


def per_rank(build, *loads):
    """Build the layer as rank 0 and 1 of 2 and load the same full tensors into each."""
    layers = []
    for rank in range(2):
        with ps.fake(rank, 2):
            layer = build()
        for name, tensor, shard in loads:
            param = getattr(layer, name)
            param.weight_loader(param, tensor, shard)
        layers.append(layer)
    assert ps.get_tp_size() == 1 and ps.get_tp_rank() == 0  # restored
    return layers


def test_column_parallel_slices_rows():
    w, b, x = rand(8, 6), rand(8), rand(3, 6)
    layers = per_rank(lambda: ColumnParallelLinear(6, 8, bias=True), ("weight", w, None), ("bias", b, None))
    for rank, layer in enumerate(layers):
        torch.testing.assert_close(layer.weight, w[rank * 4:(rank + 1) * 4])
    torch.testing.assert_close(torch.cat([layer(x) for layer in layers], -1), F.linear(x, w, b))


def test_row_parallel_slices_columns():
    w, b, x = rand(6, 8), rand(6), rand(3, 8)
    layers = per_rank(lambda: RowParallelLinear(8, 6, bias=True), ("weight", w, None), ("bias", b, None))
    for rank, layer in enumerate(layers):
        torch.testing.assert_close(layer.weight, w[:, rank * 4:(rank + 1) * 4])
    # what all_reduce would sum: each rank's partial product; the bias once
    partial = sum(F.linear(x[:, r * 4:(r + 1) * 4], layers[r].weight) for r in range(2))
    torch.testing.assert_close(partial + layers[0].bias, F.linear(x, w, b))


@pytest.mark.parametrize("kv_heads", [2, 4, 1])
def test_qkv_parallel_slices_heads(kv_heads):
    heads, d, inp = 4, 3, 10
    q, k, v = rand(heads * d, inp), rand(kv_heads * d, inp), rand(kv_heads * d, inp)
    qb, kb, vb = rand(heads * d), rand(kv_heads * d), rand(kv_heads * d)
    layers = per_rank(lambda: QKVParallelLinear(inp, d, heads, kv_heads, bias=True),
                      ("weight", q, "q"), ("weight", k, "k"), ("weight", v, "v"),
                      ("bias", qb, "q"), ("bias", kb, "k"), ("bias", vb, "v"))
    x = rand(2, inp)
    for rank, layer in enumerate(layers):
        local_kv = max(kv_heads // 2, 1)
        kv_index = rank if kv_heads >= 2 else 0  # one kv head: every rank keeps a copy
        qs = slice(rank * 2 * d, (rank + 1) * 2 * d)
        ks = slice(kv_index * local_kv * d, (kv_index + 1) * local_kv * d)
        torch.testing.assert_close(layer.weight, torch.cat([q[qs], k[ks], v[ks]]))
        torch.testing.assert_close(layer.bias, torch.cat([qb[qs], kb[ks], vb[ks]]))
        lq, lk, lv = layer.split(layer(x))
        assert lq.shape == (2, 2, d) and lk.shape == lv.shape == (2, local_kv, d)
        torch.testing.assert_close(lq.flatten(1), F.linear(x, q, qb)[:, qs])


def test_merged_column_parallel_slices_each_shard():
    gate, up = rand(6, 5), rand(6, 5)
    layers = per_rank(lambda: MergedColumnParallelLinear(5, [6, 6]), ("weight", gate, 0), ("weight", up, 1))
    for rank, layer in enumerate(layers):
        rows = slice(rank * 3, (rank + 1) * 3)
        torch.testing.assert_close(layer.weight, torch.cat([gate[rows], up[rows]]))


def test_vocab_parallel_embedding_and_lm_head_pad_the_last_rank():
    w = rand(7, 4)
    embeds = per_rank(lambda: VocabParallelEmbedding(7, 4), ("weight", w, None))
    heads = per_rank(lambda: ParallelLMHead(7, 4), ("weight", w, None))
    torch.testing.assert_close(embeds[0].weight, w[:4])
    torch.testing.assert_close(embeds[1].weight, torch.cat([w[4:], torch.zeros(1, 4)]))
    ids = torch.tensor([[0, 3, 4, 6]])
    # what all_reduce would sum: each rank contributes only its own rows
    local = []
    for e in embeds:
        inside = (ids >= e.start) & (ids < e.start + e.per_rank)
        local.append(F.embedding((ids - e.start).clamp(0, e.per_rank - 1), e.weight) * inside[..., None])
    torch.testing.assert_close(sum(local), F.embedding(ids, w))
    h = rand(2, 4)
    gathered = torch.cat([F.linear(h, head.weight) for head in heads], -1)[:, :7]  # what all_gather gives
    torch.testing.assert_close(gathered, F.linear(h, w))


def test_weight_loader_shape_checks():
    layer = QKVParallelLinear(10, 3, 4, 2)
    with pytest.raises(ShapeMismatch, match=r"shard 'k': expected shape \(6, 10\), got \(6, 9\)"):
        layer.weight_loader(layer.weight, rand(6, 9), "k")
    with pytest.raises(ValueError, match="unknown shard"):
        layer.weight_loader(layer.weight, rand(6, 10), "x")
    col = ColumnParallelLinear(6, 8)
    with pytest.raises(ShapeMismatch):
        col.weight_loader(col.weight, rand(8, 7))
    with pytest.raises(ValueError, match="not divisible"):
        with ps.fake(0, 2):
            ColumnParallelLinear(6, 7)


def test_rmsnorm_and_silu_match_transformers():
    x, w = rand(3, 5, 16), rand(16)
    ours, ref = RMSNorm(16, 1e-5), hf.LlamaRMSNorm(16, 1e-5)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours.to(torch.bfloat16)(x.bfloat16()), ref.to(torch.bfloat16)(x.bfloat16()))
    gu = rand(3, 8)
    torch.testing.assert_close(SiluAndMul()(gu), F.silu(gu[:, :4]) * gu[:, 4:])


def test_rmsnorm_cpu_fp32_fused_op_gives_the_reference_bits():
    """RMSNorm on CPU fp32 calls torch's fused F.rms_norm (one op instead of seven): it
    must give kernels/norm.py's reference formula bit for bit, so nothing downstream moves."""
    from eagle_zoo.kernels.norm import rms_norm_torch

    g = torch.Generator().manual_seed(0)
    for n in (64, 576, 2048):
        x, w = torch.randn(200, n, generator=g) * 3, torch.randn(n, generator=g)
        norm = RMSNorm(n, 1e-5)
        norm.weight.data.copy_(w)
        assert torch.equal(norm(x), rms_norm_torch(x, w, 1e-5))


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 500.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
             "beta_fast": 32, "beta_slow": 1},
}


@pytest.mark.parametrize("kind", list(ROPES))
def test_rope_matches_transformers(kind):
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=512, rope_parameters=dict(ROPES[kind]))
    rope = get_rope(config, 32)
    ref_rope = hf.LlamaRotaryEmbedding(config)
    if kind != "default":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config)
        torch.testing.assert_close(rope.inv_freq, inv_freq)
        assert rope.scaling == pytest.approx(scaling)
    positions = torch.tensor([[0, 1, 7, 300], [5, 63, 64, 511]])
    q, k = rand(2, 4, 4, 32), rand(2, 4, 2, 32)
    cos, sin = ref_rope(q, positions)
    rq, rk = hf.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    oq, ok = rope(positions, q, k)
    torch.testing.assert_close(oq, rq.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ok, rk.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_rope_reads_old_style_configs():
    old = SimpleNamespace(rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 2.0},
                          max_position_embeddings=100)
    assert rope_parameters(old) == {"type": "linear", "factor": 2.0, "rope_type": "linear", "rope_theta": 1234.0}
    rope = get_rope(old, 8)
    torch.testing.assert_close(rope.inv_freq, 1.0 / (1234.0 ** (torch.arange(0, 8, 2).float() / 8)) / 2.0)
    assert rope_parameters(SimpleNamespace()) == {"rope_type": "default", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope_type 'mystery' is not supported"):
        get_rope(SimpleNamespace(rope_parameters={"rope_type": "mystery"}), 8)


def test_rope_partial_and_interleaved():
    rope = get_rope(SimpleNamespace(rope_theta=100.0, partial_rotary_factor=0.5), 16)
    assert rope.rotary_dim == 8
    x, pos = rand(1, 3, 2, 16), torch.tensor([[0, 4, 9]])
    out, _ = rope(pos, x, x)
    torch.testing.assert_close(out[..., 8:], x[..., 8:])  # the rest passes through
    # GPT-J pairs (2i, 2i+1) == neox pairs (i, i+d/2) after de-interleaving the features
    neox, inter = get_rope(SimpleNamespace(), 8), get_rope(SimpleNamespace(), 8, interleaved=True)
    y = rand(1, 3, 2, 8)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])
    torch.testing.assert_close(inter(pos, y, y)[0][..., perm], neox(pos, y[..., perm], y[..., perm])[0])


def test_rope_frequencies_stay_float32_under_half_precision():
    rope = get_rope(SimpleNamespace(rope_theta=10000.0), 8).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32
    q = rand(1, 1, 1, 8).bfloat16()
    exact = get_rope(SimpleNamespace(rope_theta=10000.0), 8)(torch.tensor([[4000]]), q.float(), q.float())[0]
    got = rope(torch.tensor([[4000]]), q, q)[0]
    torch.testing.assert_close(got.float(), exact, atol=0.05, rtol=0.05)
