"""The CPU decode-step shortcuts against independent references.

- layers.linear: the few-rows formulation (W @ x^T)^T equals F.linear (to fp32
  rounding) for every row count around the switch, with and without bias; one-row
  calls through column-major weight copies equal F.linear, never read a stale copy,
  stay within the memory budget and leave training gradients alone;
- RotaryEmbedding: the joint q/k rotation equals transformers' rotate_half rope bit
  for bit, and angles memoised in an AttentionContext are never reused for other
  positions;
- Attention masks memoised per context: layers with different sliding windows in one
  context each get their own mask (checked against attention written out per query).
"""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from eagle_zoo.models import layers
from eagle_zoo.models.attention import Attention, AttentionContext, use_context
from eagle_zoo.models.layers import RotaryEmbedding, get_rope, linear
from eagle_zoo.kernels import cpu_decode

CPU_KERNEL_AVAILABLE = cpu_decode.available  # the real check, for tests that patch it


@pytest.mark.parametrize("rows", range(0, layers.CPU_FEW_ROWS + 3))
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(300, 96, generator=g)
    b = torch.randn(300, generator=g) if bias else None
    for shape in ((rows, 96), (1, rows, 96), (rows, 1, 96)):
        x = torch.randn(*shape, generator=g)
        got = linear(x, w, b)
        assert got.shape == F.linear(x, w, b).shape and got.is_contiguous()
        torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    x = torch.randn(96, rows, generator=g).t()  # a non-contiguous input
    torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_linear_gradients_match():
    """Training runs through the same layers: gradients agree with F.linear's."""
    g = torch.Generator().manual_seed(0)
    w0, x0 = torch.randn(40, 16, generator=g), torch.randn(3, 16, generator=g)
    grads = []
    for fn in (linear, F.linear):
        w, x = w0.clone().requires_grad_(), x0.clone().requires_grad_()
        (fn(x, w) ** 2).sum().backward()
        grads.append((w.grad, x.grad))
    torch.testing.assert_close(grads[0], grads[1])


def hf_rope(q, k, positions, config):
    """transformers' Llama rope: LlamaRotaryEmbedding + apply_rotary_pos_emb."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cos, sin = LlamaRotaryEmbedding(config)(q, positions)
    # transformers' layout is [B, heads, T, d]; ours [B, T, heads, d]
    qh, kh = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return qh.transpose(1, 2), kh.transpose(1, 2)


def rope_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


@pytest.mark.parametrize("T", [1, 4, 9])
def test_joint_rope_is_transformers_rope_bit_for_bit(T):
    config = rope_config()
    rope = get_rope(config, 16)
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(2, T, 4, 16, generator=g), torch.randn(2, T, 2, 16, generator=g)
    positions = torch.randint(0, 5000, (2, T), generator=g)
    want_q, want_k = hf_rope(q, k, positions, config)
    got_q, got_k = rope(positions, q, k)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    # the same inside an attention context (memoised angles), for every layer's rope
    ctx = AttentionContext([], torch.zeros(2, dtype=torch.long), positions, kv_len=1)
    with use_context(ctx):
        for layer_rope in (rope, get_rope(config, 16)):
            got_q, got_k = layer_rope(positions, q, k)
            assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_memoised_angles_follow_the_positions_tensor():
    """Two positions tensors in one context (e.g. a proposer's two forwards) each get
    their own angles; equal values in another tensor are recomputed, not mixed up."""
    config = rope_config()
    rope = get_rope(config, 16)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 3, 4, 16, generator=g), torch.randn(1, 3, 2, 16, generator=g)
    p1, p2 = torch.tensor([[5, 6, 7]]), torch.tensor([[100, 200, 300]])
    ctx = AttentionContext([], torch.zeros(1, dtype=torch.long), p1, kv_len=1)
    with use_context(ctx):
        a = rope(p1, q, k)
        b = rope(p2, q, k)
        c = rope(p1, q, k)
    for got, pos in ((a, p1), (b, p2), (c, p1)):
        want = hf_rope(q, k, pos, config)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_interleaved_and_partial_rope_unchanged():
    """The paths the joint rotation does not take (GPT-J pairs, partial rotary dims)
    against the rotation written out pair by pair."""
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 3, 12, generator=g), torch.randn(1, 2, 1, 12, generator=g)
    pos = torch.tensor([[3, 40]])
    for interleaved in (False, True):
        rope = RotaryEmbedding(inv, interleaved=interleaved)
        got_q, got_k = rope(pos, q, k)
        for x, got in ((q, got_q), (k, got_k)):
            want = x.clone()
            for t in range(2):
                for i in range(4):
                    a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + 4)
                    ang = pos[0, t].double() * inv[i].double()
                    c, s = torch.cos(ang), torch.sin(ang)
                    want[0, t, :, a] = (x[0, t, :, a] * c - x[0, t, :, b] * s).float()
                    want[0, t, :, b] = (x[0, t, :, b] * c + x[0, t, :, a] * s).float()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def naive(q, keys, values, visible, scale):
    """q [T,h,d], keys/values [L,h,d] (no GQA), visible [T,L] -> [T, h*d]."""
    s = torch.einsum("thd,lhd->htl", q.double(), keys.double()) * scale
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("htl,lhd->thd", torch.softmax(s, -1), values.double()).flatten(1).float()


def test_memoised_masks_per_window():
    """Two layers in one context, one with a sliding window of 2: each attends over its
    own visible keys (the memo is keyed by window)."""
    h, d, L, T = 2, 8, 6, 2
    layers_ = [Attention(h, h, d, layer_idx=0), Attention(h, h, d, layer_idx=1, sliding_window=2)]
    caches = [(torch.zeros(1, L, h, d), torch.zeros(1, L, h, d)) for _ in layers_]
    g = torch.Generator().manual_seed(3)
    past_k, past_v = torch.randn(L, h, d, generator=g), torch.randn(L, h, d, generator=g)
    for kc, vc in caches:
        kc[0], vc[0] = past_k, past_v
    q, k, v = (torch.randn(1, T, h, d, generator=g) for _ in range(3))
    pos = torch.tensor([[3, 4]])
    ctx = AttentionContext(caches, torch.tensor([0]), pos, kv_len=5)
    with use_context(ctx):
        outs = [layer(q, k, v) for layer in layers_]
    keys, values = past_k[:5].clone(), past_v[:5].clone()
    keys[3:5], values[3:5] = k[0], v[0]
    qpos, kpos = pos[0, :, None], torch.arange(5)[None]
    for out, window in zip(outs, (None, 2)):
        visible = kpos <= qpos
        if window:
            visible &= qpos - kpos < window
        torch.testing.assert_close(out[0], naive(q[0], keys, values, visible, d ** -0.5), rtol=1e-5, atol=1e-5)



@pytest.fixture
def without_cpu_kernel(monkeypatch):
    """The column-major copies are the path without kernels/cpu_decode.py (no g++)."""
    monkeypatch.setattr(cpu_decode, "available", lambda: False)


def one_row_model():
    """A tall layer, a wide layer and an lm head, random weights."""
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.up = layers.ReplicatedLinear(16, 64)
    m.down = layers.ReplicatedLinear(64, 16)  # wider than tall: no copy
    m.head = layers.ParallelLMHead(100, 16)
    for p in m.parameters():
        torch.nn.init.normal_(p)
    return m


def test_one_row_copies_give_f_linear_results(monkeypatch, without_cpu_kernel):
    gc.collect()  # the budget is per process: room beyond the copies of live models
    monkeypatch.setattr(layers, "CPU_ONE_ROW_COPY_BYTES", layers.one_row_copy_bytes() + (1 << 20))
    m = one_row_model()
    assert layers.prepare_one_row_copies(m) == (64 * 16 + 100 * 16) * 4
    assert getattr(m.down.weight, "_one_row_copy", None) is None
    assert layers.prepare_one_row_copies(m) == 0  # already there
    with monkeypatch.context() as built:
        built.setattr(cpu_decode, "available", CPU_KERNEL_AVAILABLE)
        if cpu_decode.available():  # the kernel reads the row-major parameter: no copies
            assert layers.prepare_one_row_copies(one_row_model()) == 0
    with torch.inference_mode():
        for mod, x in ((m.up, torch.randn(1, 1, 16)), (m.head, torch.randn(1, 16)), (m.down, torch.randn(1, 64))):
            torch.testing.assert_close(mod(x), F.linear(x, mod.weight), rtol=1e-5, atol=1e-5)
        for mod in (m.up, m.head):
            copy = mod.weight._one_row_copy[0]
            assert copy.data_ptr() != mod.weight.data_ptr() and torch.equal(copy, mod.weight)
            assert copy.t().is_contiguous()  # column-major


def test_one_row_copy_not_used_once_stale(without_cpu_kernel):
    """An in-place update of the parameter (an optimizer step) or a move makes the copy
    inapplicable: the layer reads the parameter again."""
    m = one_row_model()
    layers.prepare_one_row_copies(m)
    x = torch.randn(1, 16)
    with torch.no_grad():
        m.up.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(m.up(x), F.linear(x, m.up.weight), rtol=1e-5, atol=1e-5)
    m.up.weight.data = m.up.weight.data.clone() * 3  # a new tensor behind the parameter
    with torch.inference_mode():
        torch.testing.assert_close(m.up(x), F.linear(x, m.up.weight), rtol=1e-5, atol=1e-5)


def test_one_row_copies_respect_the_budget_and_gradients(monkeypatch, without_cpu_kernel):
    gc.collect()  # copies of earlier tests' models must not count
    monkeypatch.setattr(layers, "CPU_ONE_ROW_COPY_BYTES", layers.one_row_copy_bytes() + 64 * 16 * 4)
    m = one_row_model()
    assert layers.prepare_one_row_copies(m) == 64 * 16 * 4  # the lm head no longer fits
    assert getattr(m.head.weight, "_one_row_copy", None) is None
    x = torch.randn(1, 16)
    (m.up(x) ** 2).sum().backward()  # training: the parameter itself, so it gets a gradient
    want = torch.autograd.grad((F.linear(x, m.up.weight) ** 2).sum(), m.up.weight)[0]
    torch.testing.assert_close(m.up.weight.grad, want)
