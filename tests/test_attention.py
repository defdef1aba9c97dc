"""Attention with and without a KV cache against the definition of attention."""
from __future__ import annotations

import math

import pytest
import torch

from eagle_zoo.kernels import cpu_decode
from eagle_zoo.models.attention import Attention, AttentionContext, get_context, use_context


def naive_attention(q, k, v, visible, scale):
    """softmax(q.k * scale) v written out per query; q [T,h,d], k [L,hk,d], v [L,hk,dv],
    visible [T,L] bool. GQA: query head i uses kv head i // (h / hk)."""
    T, h, _ = q.shape
    group = h // k.shape[1]
    out = torch.zeros(T, h, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        for i in range(h):
            keys = visible[t].nonzero().flatten()
            scores = torch.tensor([float(q[t, i] @ k[j, i // group]) * scale for j in keys], dtype=torch.float64)
            weights = torch.softmax(scores, 0)
            out[t, i] = sum(w * v[j, i // group].double() for w, j in zip(weights, keys))
    return out.flatten(1).float()


def causal(n, window=None, offset=0):
    """Visibility of keys 0..n-1 for queries at positions offset..n-1."""
    qpos, kpos = torch.arange(offset, n)[:, None], torch.arange(n)[None]
    m = kpos <= qpos
    return m & (qpos - kpos < window) if window else m


CASES = [  # heads, kv_heads, head_dim, v_head_dim, window
    (4, 4, 8, 8, None),
    (4, 2, 8, 8, None),  # GQA
    (4, 1, 8, 6, None),  # MQA + value dim != qk dim (MLA-like)
    (4, 2, 8, 8, 3),  # sliding window
]


def make_qkv(n_seq, length, heads, kv_heads, d, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_seq, length, heads, d, generator=g), torch.randn(n_seq, length, kv_heads, d, generator=g),
            torch.randn(n_seq, length, kv_heads, dv, generator=g))


@pytest.mark.parametrize("heads,kv_heads,d,dv,window", CASES)
def test_no_context_is_causal_attention(heads, kv_heads, d, dv, window):
    attn = Attention(heads, kv_heads, d, layer_idx=0, sliding_window=window, v_head_dim=dv)
    q, k, v = make_qkv(2, 6, heads, kv_heads, d, dv)
    out = attn(q, k, v)
    for b in range(2):
        torch.testing.assert_close(out[b], naive_attention(q[b], k[b], v[b], causal(6, window), d ** -0.5),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,d,dv,window", CASES)
def test_cache_prefill_decode_and_verify_equal_full_causal(heads, kv_heads, d, dv, window):
    """Three sequences in slots 2, 0, 3 (of 4) at lengths 5, 3, 7; prefill each, then two
    batched decode steps (T=1), then a batched 3-token step (verification-like)."""
    num_slots, max_len, scale = 4, 16, 0.37
    slots, prompt = torch.tensor([2, 0, 3]), [5, 3, 7]
    total = [n + 2 + 3 for n in prompt]
    q, k, v = make_qkv(3, max(total), heads, kv_heads, d, dv, seed=1)
    other = Attention(heads, kv_heads, d, scale=scale, layer_idx=0, v_head_dim=dv)  # layer 0: untouched
    attn = Attention(heads, kv_heads, d, scale=scale, layer_idx=1, sliding_window=window, v_head_dim=dv)
    caches = [(torch.zeros(num_slots, max_len, kv_heads, d), torch.zeros(num_slots, max_len, kv_heads, dv))
              for _ in range(2)]
    sentinel = torch.full((), 123.0)
    caches[0][0].fill_(sentinel)

    def expected(b, start, stop):
        return naive_attention(q[b, start:stop], k[b, :stop], v[b, :stop], causal(stop, window, start), scale)

    # prefill, one sequence at a time (different T)
    for b, n in enumerate(prompt):
        ctx = AttentionContext(caches, slots[b:b + 1], torch.arange(n)[None], kv_len=n)
        with use_context(ctx):
            out = attn(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n])
        torch.testing.assert_close(out[0], expected(b, 0, n), atol=1e-5, rtol=1e-5)
    lengths = list(prompt)
    for step in (1, 1, 3):  # two decode steps, then a verification-like step
        pos = torch.stack([torch.arange(n, n + step) for n in lengths])  # [3, step]
        idx = pos[..., None, None]
        take = lambda x: x.gather(1, idx.expand(-1, -1, *x.shape[2:]))  # noqa: E731
        ctx = AttentionContext(caches, slots, pos, kv_len=max(lengths) + step)
        with use_context(ctx):
            out = attn(take(q), take(k), take(v))
        for b, n in enumerate(lengths):
            torch.testing.assert_close(out[b], expected(b, n, n + step), atol=1e-5, rtol=1e-5)
        lengths = [n + step for n in lengths]
    # keys landed in their slots' rows; slot 1 and the other layer's cache were never written
    for b, n in enumerate(lengths):
        torch.testing.assert_close(caches[1][0][slots[b], :n], k[b, :n])
        torch.testing.assert_close(caches[1][1][slots[b], :n], v[b, :n])
    assert not caches[1][0][1].any()
    assert (caches[0][0] == sentinel).all()


def test_a_prompts_prefill_takes_sdpa_causal_mask_and_other_steps_build_theirs(monkeypatch):
    """One sequence's prefill (its T tokens are the cache's first kv_len == T positions)
    leaves the mask to SDPA's is_causal; a step behind a cached prefix, two sequences at
    once, a sliding window or a tree's mask build the mask. Both agree with attention's
    definition (the test above). T = 12: more rows than the CPU kernel below takes."""
    built = []
    original = Attention._mask
    monkeypatch.setattr(Attention, "_mask", lambda self, *a: built.append(self.layer_idx) or original(self, *a))
    monkeypatch.setattr(cpu_decode, "cache_attention", lambda *a: pytest.fail("the few-row CPU kernel ran"))
    heads, kv_heads, d, n = 4, 2, 8, 12
    q, k, v = make_qkv(2, n, heads, kv_heads, d, d, seed=3)
    caches = [(torch.zeros(2, 16, kv_heads, d), torch.zeros(2, 16, kv_heads, d)) for _ in range(2)]
    plain, windowed = Attention(heads, kv_heads, d, layer_idx=0), Attention(heads, kv_heads, d, layer_idx=1,
                                                                           sliding_window=3)

    def run(attn, slots, positions, kv_len, **keys):
        built.clear()
        ctx = AttentionContext(caches, torch.tensor(slots), positions, kv_len=kv_len, **keys)
        T = positions.shape[1]
        with use_context(ctx):
            out = attn(q[: len(slots), :T], k[: len(slots), :T], v[: len(slots), :T])
        return out, bool(built)

    out, masked = run(plain, [0], torch.arange(n)[None], n)
    assert not masked
    torch.testing.assert_close(out[0], naive_attention(q[0], k[0], v[0], causal(n), d ** -0.5), atol=1e-5, rtol=1e-5)
    assert run(plain, [0], torch.arange(2, n)[None], n)[1]  # behind 2 cached positions
    assert run(plain, [0, 1], torch.arange(n).expand(2, n), n)[1]  # two sequences
    assert run(windowed, [0], torch.arange(n)[None], n)[1]
    chain = (torch.arange(n)[None], torch.zeros(1, dtype=torch.long), torch.arange(n).expand(1, n, n))
    assert run(plain, [0], torch.arange(n)[None], n, attn_mask=causal(n)[None])[1]
    assert run(plain, [0], torch.arange(n)[None], n, tree_keys=chain)[1]  # a tree that is one chain


@pytest.mark.skipif(not cpu_decode.available(), reason="kernels/cpu_decode.py could not be built here")
@pytest.mark.parametrize("d,dv", [(8, 8), (64, 64), (8, 6)])
def test_one_sequences_few_tokens_on_the_cpu_take_the_flash_decoding_kernel(monkeypatch, d, dv):
    """A decode-sized step of one float32 sequence (an EAGLE head's draft or catch-up) runs
    kernels/cpu_decode.py's cache_attention, agreeing with attention's definition; value
    heads of another size (and autograd) keep SDPA."""
    calls = []
    kernel = cpu_decode.cache_attention
    monkeypatch.setattr(cpu_decode, "cache_attention", lambda q, *a: calls.append(q.shape[0]) or kernel(q, *a))
    heads, kv_heads, n = 6, 2, 300  # past one of the kernel's 256-key splits
    q, k, v = make_qkv(1, n, heads, kv_heads, d, dv, seed=4)
    caches = [(torch.zeros(2, 320, kv_heads, d), torch.zeros(2, 320, kv_heads, dv))]
    attn = Attention(heads, kv_heads, d, scale=0.3, layer_idx=0, v_head_dim=dv)
    with use_context(AttentionContext(caches, torch.tensor([1]), torch.arange(n - 3)[None], kv_len=n - 3)):
        attn(q[:, : n - 3], k[:, : n - 3], v[:, : n - 3])  # the prompt (SDPA)
    assert calls == []
    with use_context(AttentionContext(caches, torch.tensor([1]), torch.arange(n - 3, n)[None], kv_len=n)):
        out = attn(q[:, n - 3:], k[:, n - 3:], v[:, n - 3:])  # a 3-token step
        with torch.enable_grad():
            attn(q[:, n - 3:].requires_grad_(True), k[:, n - 3:], v[:, n - 3:])
    assert calls == ([3] if dv == d else [])
    torch.testing.assert_close(out[0], naive_attention(q[0, n - 3:], k[0], v[0], causal(n, offset=n - 3), 0.3),
                               atol=1e-5, rtol=1e-5)


def test_tree_mask():
    """Prefix of 4 tokens cached; a 4-node tree (0 <- root, 1 <- 0, 2 <- 0, 3 <- 2) written
    at cache positions 4..7 with its own mask. Each node must equal causal attention over
    prefix + its path from the root."""
    heads, kv_heads, d = 4, 2, 8
    parents = [-1, 0, 0, 2]
    attn = Attention(heads, kv_heads, d, layer_idx=0)
    caches = [(torch.zeros(1, 12, kv_heads, d), torch.zeros(1, 12, kv_heads, d))]
    pq, pk, pv = make_qkv(1, 4, heads, kv_heads, d, d, seed=2)
    tq, tk, tv = make_qkv(1, 4, heads, kv_heads, d, d, seed=3)
    slot = torch.tensor([0])
    with use_context(AttentionContext(caches, slot, torch.arange(4)[None], kv_len=4)):
        attn(pq, pk, pv)
    paths = []
    ancestors = torch.zeros(1, 4, 3, dtype=torch.long)
    for i in range(4):
        path, node = [], i
        while node != -1:
            path.insert(0, node)
            node = parents[node]
        paths.append(path)
        ancestors[0, i, : len(path)] = torch.tensor(path)
    depth = torch.tensor([[len(p) - 1 for p in paths]])
    tree_keys = (4 + depth, torch.tensor([4]), ancestors)
    with use_context(AttentionContext(caches, slot, torch.arange(4, 8)[None], kv_len=8, tree_keys=tree_keys)):
        out = attn(tq, tk, tv)
    for i, path in enumerate(paths):
        seq_q = torch.cat([pq[0], tq[0, path]])
        seq_k, seq_v = torch.cat([pk[0], tk[0, path]]), torch.cat([pv[0], tv[0, path]])
        n = len(seq_q)
        ref = naive_attention(seq_q[n - 1:], seq_k, seq_v, causal(n, None, n - 1), d ** -0.5)
        torch.testing.assert_close(out[0, i], ref[0], atol=1e-5, rtol=1e-5)


def test_context_is_restored():
    ctx = AttentionContext([], torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), kv_len=1)
    assert get_context() is None
    with pytest.raises(RuntimeError):
        with use_context(ctx):
            assert get_context() is ctx
            raise RuntimeError
    assert get_context() is None


def test_scale_default():
    assert math.isclose(Attention(2, 2, 16).scale, 0.25)
