"""kernels/: each Triton kernel against its torch reference, each reference against an
independent definition (python loops, scaled_dot_product_attention, the module path).

Triton runs on CPU tensors only under TRITON_INTERPRET=1, which triton reads when a
kernel is defined; so test_triton_in_interpreter re-runs this file's "interp" cases in
a subprocess with the variable set. "cuda" cases run on a GPU (marked gpu).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from eagle_zoo.kernels import (cache_attention, cache_attention_torch, cache_attention_triton, write_kv,
                               write_kv_torch, write_kv_triton)
from eagle_zoo.kernels._triton import HAS_TRITON

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
DEVICES = [
    pytest.param("interp", marks=pytest.mark.skipif(not INTERPRET, reason="runs in test_triton_in_interpreter")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        INTERPRET or not HAS_CUDA or not HAS_TRITON, reason="needs CUDA and triton")]),
]


def _dev(name):
    return "cpu" if name == "interp" else "cuda"


@pytest.mark.skipif(INTERPRET or not HAS_TRITON, reason="this is the launcher of the interpreter run")
@pytest.mark.skipif(HAS_CUDA, reason="with CUDA the compiled kernels are tested (and triton 3.6's interpreter "
                                     "fails on numpy >= 2.5: int() of a 1-element array)")
def test_triton_in_interpreter():
    # Two halves of the interpreter cases at once (the interpreter runs on one core, and
    # this process only waits): the attention and qkv-rope kernels' cases, then the rest.
    env = dict(os.environ, TRITON_INTERPRET="1")
    halves = ("interp and not in_interpreter and (attention or qkv)",
              "interp and not in_interpreter and not (attention or qkv)")
    runs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", __file__,
                              "-k", half], env=env, cwd=Path(__file__).resolve().parents[1],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for half in halves]
    try:
        for half, run in zip(halves, runs):
            stdout, stderr = run.communicate(timeout=600)
            assert run.returncode == 0, f"-k {half!r}:\n" + stdout[-6000:] + stderr[-3000:]
            assert " passed" in stdout, f"-k {half!r}:\n" + stdout[-2000:]
    finally:  # a failed or timed-out half leaves no interpreter run behind
        for run in runs:
            run.kill()
            run.wait()


# --- write_kv -------------------------------------------------------------------------

def _kv_problem(device, cache_dtype, in_dtype, n_kv=3, dk=6, dv=5):
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(4, 12, n_kv, dk, generator=g).to(device, cache_dtype)
    v_cache = torch.randn(4, 12, n_kv, dv, generator=g).to(device, cache_dtype)
    qkv = torch.randn(2, 3, n_kv, dk + dk + dv, generator=g).to(device, in_dtype)
    k, v = qkv[..., dk:2 * dk], qkv[..., 2 * dk:]  # strided views, as sliced from a fused projection
    slot_ids = torch.tensor([3, 1], device=device)
    positions = torch.tensor([[0, 5, 11], [2, 3, 4]], device=device)
    return k_cache, v_cache, k, v, slot_ids, positions


def test_write_kv_reference_matches_loop():
    k_cache, v_cache, k, v, slots, pos = _kv_problem("cpu", torch.float32, torch.float32)
    ek, ev = k_cache.clone(), v_cache.clone()
    for b in range(2):
        for t in range(3):
            ek[slots[b], pos[b, t]] = k[b, t]
            ev[slots[b], pos[b, t]] = v[b, t]
    write_kv_torch(k_cache, v_cache, k, v, slots, pos)
    assert torch.equal(k_cache, ek) and torch.equal(v_cache, ev)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_dtype,in_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.bfloat16, torch.float32)])
def test_write_kv_triton_matches_reference(device, cache_dtype, in_dtype):
    if device == "interp" and cache_dtype != in_dtype:
        pytest.skip("the interpreter truncates fp32 -> bf16; the GPU rounds to nearest like torch")
    dev = _dev(device)
    k_cache, v_cache, k, v, slots, pos = _kv_problem(dev, cache_dtype, in_dtype)
    ek, ev = k_cache.clone(), v_cache.clone()
    write_kv_torch(ek, ev, k, v, slots, pos)
    write_kv_triton(k_cache, v_cache, k, v, slots, pos)
    assert torch.equal(k_cache, ek) and torch.equal(v_cache, ev)
    # An out-of-range position is dropped by the kernel, never written elsewhere.
    before = k_cache.clone()
    write_kv_triton(k_cache, v_cache, k[:, :1], v[:, :1], slots, torch.full((2, 1), 12, device=dev))
    assert torch.equal(k_cache, before)


# --- attention ------------------------------------------------------------------------

def _attn_problem(device, *, B=2, T=3, H=4, n_kv=2, dk=16, dv=16, max_len=48, kv_len=40, tree=False,
                  dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, dk, generator=g)
    k_cache = torch.randn(B + 2, max_len, n_kv, dk, generator=g)
    v_cache = torch.randn(B + 2, max_len, n_kv, dv, generator=g)
    slot_ids = torch.randperm(B + 2, generator=g)[:B]
    start = torch.randint(0, kv_len - T + 1, (B,), generator=g)
    pos = start[:, None] + torch.arange(T)
    mask = None
    if tree:  # any pattern, keys after the query included: the mask alone decides
        mask = torch.rand(B, T, kv_len, generator=g) < 0.5
        mask[torch.arange(B)[:, None], torch.arange(T), pos] = True  # every query sees a key
    to = dict(device=device)
    return (q.to(device, dtype), k_cache.to(device, dtype), v_cache.to(device, dtype), slot_ids.to(**to),
            pos.to(**to), mask if mask is None else mask.to(**to))


def _sdpa_loops(q, k_cache, v_cache, slot_ids, pos, kv_len, scale, mask, window):
    """Independent reference: dense K/V and the mask built one entry at a time, then SDPA."""
    B, T, H, _ = q.shape
    G = H // k_cache.shape[2]
    heads = [h // G for h in range(H)]
    k = torch.stack([k_cache[int(slot_ids[b]), :kv_len][:, heads] for b in range(B)])  # [B,L,H,d]
    v = torch.stack([v_cache[int(slot_ids[b]), :kv_len][:, heads] for b in range(B)])
    vis = torch.zeros(B, 1, T, kv_len, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            p = int(pos[b, t])
            for j in range(kv_len):
                vis[b, 0, t, j] = bool(mask[b, t, j]) if mask is not None else (
                    j <= p and (window is None or p - j < window))
    out = F.scaled_dot_product_attention(q.transpose(1, 2).double(), k.transpose(1, 2).double(),
                                         v.transpose(1, 2).double(), attn_mask=vis, scale=scale)
    return out.transpose(1, 2)


ATTN_CASES = {  # name: (problem kwargs, window)
    "causal_gqa": (dict(), None),
    "window": (dict(kv_len=40), 7),
    "tree_mask": (dict(tree=True), None),
    "mha_dv": (dict(H=2, n_kv=2, dk=16, dv=8), None),
    "gqa4_short": (dict(H=8, n_kv=2, kv_len=20, max_len=24), 5),
}


@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention_reference_vs_sdpa(case):
    kwargs, window = ATTN_CASES[case]
    q, kc, vc, slots, pos, mask = _attn_problem("cpu", **kwargs)
    kv_len = kwargs.get("kv_len", 40)
    ref = cache_attention_torch(q, kc, vc, slots, pos, kv_len, 0.3, attn_mask=mask, window=window)
    exp = _sdpa_loops(q, kc, vc, slots, pos, kv_len, 0.3, mask, window)
    torch.testing.assert_close(ref.double(), exp, atol=2e-6, rtol=1e-5)


def test_attention_reference_no_visible_key_gives_zeros():
    q, kc, vc, slots, pos, _ = _attn_problem("cpu")
    mask = torch.zeros(2, 3, 40, dtype=torch.bool)
    mask[0, 1, 3] = True
    out = cache_attention_torch(q, kc, vc, slots, pos, 40, 0.3, attn_mask=mask)
    assert out[1].abs().sum() == 0 and out[0, 0].abs().sum() == 0
    torch.testing.assert_close(out[0, 1], vc[slots[0], 3].repeat_interleave(2, 0))  # one key: its value


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(ATTN_CASES) + ["no_visible_key"])
def test_attention_triton_matches_reference(device, case):
    kwargs, window = ATTN_CASES.get(case, (dict(tree=True), None))
    q, kc, vc, slots, pos, mask = _attn_problem(_dev(device), **kwargs)
    if case == "no_visible_key":
        mask[1] = False
    kv_len = kwargs.get("kv_len", 40)
    ref = cache_attention_torch(q, kc, vc, slots, pos, kv_len, 0.3, attn_mask=mask, window=window)
    for split, block in ((16, 16), (256, 64)):  # several splits, then one
        out = cache_attention_triton(q, kc, vc, slots, pos, kv_len, 0.3, attn_mask=mask, window=window,
                                     split_size=split, block_n=block)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [None, 9])
def test_attention_triton_batch_invariant(device, window):
    """A query row gives the same bits alone (decode, T=1, B=1, kv_len = its length) as
    inside a verification batch (T=4, other sequences, larger kv_len, more splits)."""
    dev = _dev(device)
    small = device == "interp"
    kw = dict(split_size=16, block_n=16) if small else {}
    L = 60 if small else 700
    for dtype in (torch.float32,) if small else (torch.float32, torch.bfloat16):
        q, kc, vc, slots, pos, _ = _attn_problem(dev, B=3, T=4, H=16, n_kv=2, dk=16 if small else 128,
                                                 dv=16 if small else 128, max_len=L + 4, kv_len=L, dtype=dtype)
        batch = cache_attention_triton(q, kc, vc, slots, pos, L, 0.3, window=window, **kw)
        b = 1
        verify = cache_attention_triton(q[b:b + 1], kc, vc, slots[b:b + 1], pos[b:b + 1], int(pos[b, -1]) + 1, 0.3,
                                        window=window, **kw)
        assert torch.equal(verify[0], batch[b])
        # The interpreter's tl.dot is numpy's BLAS, whose bits depend on a row's place in
        # the tile (row 8 != the same row at 0); a GPU's MMA does not: there, every t.
        for t in (0,) if small else range(4):
            alone = cache_attention_triton(q[b:b + 1, t:t + 1], kc, vc, slots[b:b + 1], pos[b:b + 1, t:t + 1],
                                           int(pos[b, t]) + 1, 0.3, window=window, **kw)
            assert torch.equal(alone[0, 0], batch[b, t])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRET or not HAS_TRITON, reason="needs CUDA and triton")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_attention_triton_cuda_realistic(dtype):
    q, kc, vc, slots, pos, _ = _attn_problem("cuda", B=5, T=4, H=32, n_kv=8, dk=128, dv=128, max_len=1100,
                                             kv_len=1000, dtype=dtype)
    for window in (None, 300):
        ref = cache_attention_torch(q, kc, vc, slots, pos, 1000, 128 ** -0.5, window=window)
        out = cache_attention(q, kc, vc, slots, pos, 1000, 128 ** -0.5, window=window)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRET or not HAS_TRITON, reason="needs CUDA and triton")
def test_cache_kernels_cuda_no_sync():
    q, kc, vc, slots, pos, _ = _attn_problem("cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        write_kv(kc, vc, q[:, :, :2], q[:, :, 2:], slots, pos)
        cache_attention(q, kc, vc, slots, pos, 40, 0.3, window=8)
        cache_attention_torch(q, kc, vc, slots, pos, 40, 0.3, window=8)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_dispatchers_use_the_reference_on_cpu():
    q, kc, vc, slots, pos, mask = _attn_problem("cpu", tree=True)
    assert torch.equal(cache_attention(q, kc, vc, slots, pos, 40, 0.3, attn_mask=mask),
                       cache_attention_torch(q, kc, vc, slots, pos, 40, 0.3, attn_mask=mask))


# --- the decoder layer's small ops: rms_norm, silu_and_mul, rope_neox -----------------------
# Each replaces several eager kernels by one (a batch-1 decode step of a small model is
# bound by kernel count). In the interpreter fp32 only: it truncates fp32 -> bf16 where
# the GPU rounds like torch.

from eagle_zoo.kernels import (rms_norm, rms_norm_torch, rms_norm_triton, rope_angles, rope_angles_torch,  # noqa: E402
                               rope_angles_triton, rope_neox, rope_neox_torch, rope_neox_triton, silu_and_mul,
                               silu_and_mul_torch, silu_and_mul_triton)


def _dtypes(device):
    return [torch.float32] if device == "interp" else [torch.float32, torch.bfloat16]


def _close(a, b, dtype):
    if dtype == torch.bfloat16:  # at most one bf16 step apart
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-5)
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_rms_norm_reference_matches_its_definition():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 5, 96, generator=g), torch.randn(96, generator=g)
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 96 + 1e-5) * w
    torch.testing.assert_close(rms_norm_torch(x, w, 1e-5), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hidden", [96, 576, 1000])
def test_rms_norm_triton_matches_reference_and_is_batch_invariant(device, hidden):
    g = torch.Generator().manual_seed(hidden)
    for dtype in _dtypes(device):
        x = torch.randn(2, 7, hidden, generator=g).to(_dev(device), dtype)
        w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(_dev(device), dtype)
        out = rms_norm_triton(x, w, 1e-6)
        assert out.shape == x.shape and out.dtype == dtype
        _close(out, rms_norm_torch(x, w, 1e-6), dtype)
        alone = rms_norm_triton(x[1:2, 3:4], w, 1e-6)
        assert torch.equal(alone[0, 0], out[1, 3])  # a row's bits do not depend on the others


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_triton_is_the_add_then_the_norm(device):
    """A wide layer's residual add and the norm after it in one launch: the sum with
    torch's add's bits, its norm with rms_norm_triton's, also from a strided residual;
    a row's bits do not depend on the others."""
    from eagle_zoo.kernels.norm import add_rms_norm_torch, add_rms_norm_triton

    g = torch.Generator().manual_seed(12)
    for dtype in _dtypes(device):
        x = torch.randn(2, 3, 96, generator=g).to(_dev(device), dtype)
        r = torch.randn(2, 3, 2 * 96, generator=g).to(_dev(device), dtype)[..., :96]  # rows 192 apart
        w = (1 + 0.1 * torch.randn(96, generator=g)).to(_dev(device), dtype)
        s, y = add_rms_norm_triton(x, r, w, 1e-5)
        assert s.shape == y.shape == x.shape and s.dtype == y.dtype == dtype
        assert torch.equal(s, x + r)
        assert torch.equal(y, rms_norm_triton(x + r, w, 1e-5))
        ref_s, ref_y = add_rms_norm_torch(x, r, w, 1e-5)
        assert torch.equal(s, ref_s)
        _close(y, ref_y, dtype)
        alone = add_rms_norm_triton(x[1:2, 2:3], r[1:2, 2:3], w, 1e-5)
        assert torch.equal(alone[0][0, 0], s[1, 2]) and torch.equal(alone[1][0, 0], y[1, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_pair_triton_is_two_norms_side_by_side(device):
    """An EAGLE-3 head layer's input in one launch: each half has rms_norm_triton's bits
    for its own input, weight and eps, also from a strided input."""
    from eagle_zoo.kernels.norm import rms_norm_pair_torch, rms_norm_pair_triton

    g = torch.Generator().manual_seed(11)
    for dtype in _dtypes(device):
        e = torch.randn(2, 3, 96, generator=g).to(_dev(device), dtype)
        h = torch.randn(2, 3, 2 * 96, generator=g).to(_dev(device), dtype)[..., :96]  # rows 192 apart
        w1, w2 = [(1 + 0.1 * torch.randn(96, generator=g)).to(_dev(device), dtype) for _ in range(2)]
        out = rms_norm_pair_triton(e, w1, 1e-6, h, w2, 1e-5)
        assert out.shape == (2, 3, 192) and out.dtype == dtype
        assert torch.equal(out[..., :96], rms_norm_triton(e, w1, 1e-6))
        assert torch.equal(out[..., 96:], rms_norm_triton(h.contiguous(), w2, 1e-5))
        _close(out, rms_norm_pair_torch(e, w1, 1e-6, h, w2, 1e-5), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_and_mul_triton_matches_reference(device):
    g = torch.Generator().manual_seed(2)
    for dtype in _dtypes(device):
        x = (3 * torch.randn(2, 3, 2 * 1536, generator=g)).to(_dev(device), dtype)
        out = silu_and_mul_triton(x)
        assert out.shape == (2, 3, 1536)
        _close(out, silu_and_mul_torch(x), dtype)
        assert torch.equal(silu_and_mul_triton(x[1:, 2:])[0, 0], out[1, 2])


def test_silu_and_mul_reference_matches_its_definition():
    x = torch.randn(4, 10)
    gate, up = x[:, :5], x[:, 5:]
    torch.testing.assert_close(silu_and_mul_torch(x), gate * torch.sigmoid(gate) * up)


def _rope_problem(device, dtype, B=2, T=3, hq=9, hk=3, d=64):
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, hq + 2 * hk, d, generator=g).to(device, dtype)
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]  # strided views of a fused projection
    positions = torch.tensor([[0, 7, 300], [5, 6, 7]])[:B, :T]
    angles = positions.unsqueeze(-1).float() * (10000.0 ** (-torch.arange(d // 2) / (d // 2)))
    return q, k, angles.cos().unsqueeze(-2).to(device), angles.sin().unsqueeze(-2).to(device)


def test_rope_reference_matches_the_pairwise_formula():
    q, k, cos, sin = _rope_problem("cpu", torch.float32)
    for x, out in zip((q, k), rope_neox_torch(q, k, cos, sin)):
        x1, x2 = x.chunk(2, -1)
        torch.testing.assert_close(out, torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1))


@pytest.mark.parametrize("device", DEVICES)
def test_rope_triton_matches_reference(device):
    for dtype in _dtypes(device):
        q, k, cos, sin = _rope_problem(_dev(device), dtype)
        got, ref = rope_neox_triton(q, k, cos, sin), rope_neox_torch(q, k, cos, sin)
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.is_contiguous()
            _close_rope(a, b, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling", [1.0, 0.7])
def test_rope_angles_triton_matches_reference(device, scaling):
    """One kernel for the cast, product, cos and sin. On the GPU the CUDA math library's
    cosf / sinf, as torch's kernels call, so the same bits; in the interpreter numpy's."""
    from eagle_zoo.models.layers import _rope_default

    inv_freq = _rope_default({"rope_theta": 100000.0}, 64, 8192)[0].to(_dev(device))
    wide = torch.tensor([[0, 1, 7, 300, 8191, 5000], [2, 3, 4, 5, 6, 65535]], device=_dev(device))
    for positions in (wide, wide[:, ::2], wide[:1, 2:3].expand(3, 4)):  # strided, one position everywhere
        got = rope_angles_triton(positions, inv_freq, scaling)
        want = rope_angles_torch(positions, inv_freq, scaling)
        for g_, w_ in zip(got, want):
            assert g_.shape == w_.shape == (*positions.shape, 1, 32) and g_.dtype == torch.float32
            if device == "cuda":
                assert torch.equal(g_, w_)
            else:
                torch.testing.assert_close(g_, w_, rtol=0, atol=1e-6)


def _close_rope(a, b, dtype):
    # bf16 on the H200: one step of a product apart (not bit for bit); where the two
    # products cancel, that step is large next to the result (0.0039 seen at a 0).
    if dtype == torch.bfloat16:
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=2 ** -6)
    else:
        _close(a, b, dtype)


def test_layer_op_dispatchers_use_the_reference_on_cpu():
    x = torch.randn(3, 64)
    w = torch.randn(64)
    assert torch.equal(rms_norm(x, w, 1e-6), rms_norm_torch(x, w, 1e-6))
    assert torch.equal(silu_and_mul(x), silu_and_mul_torch(x))
    q, k, cos, sin = _rope_problem("cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(rope_neox(q, k, cos, sin), rope_neox_torch(q, k, cos, sin)))
    positions, inv_freq = torch.tensor([[3, 90]]), torch.rand(8)
    assert all(torch.equal(a, b) for a, b in zip(rope_angles(positions, inv_freq, 0.5),
                                                 rope_angles_torch(positions, inv_freq, 0.5)))


# --- few-row linear with fused norm / activation / residual; rope + KV write; the fused layer ---

from eagle_zoo.kernels._triton import needs_autograd  # noqa: E402
from eagle_zoo.kernels.linear import (BLOCK_M, fused_linear, fused_linear_torch, fused_linear_triton,  # noqa: E402
                                      row_block, use_linear_kernel)

LINEAR_CASES = {  # name: fused_linear keyword arguments besides x and weight
    "plain": dict(),
    "bias": dict(bias=True),
    "norm": dict(norm=True),
    "norm_gated": dict(norm=True, gated=True),
    "residual": dict(residual=True),
    "gated_bias": dict(gated=True, bias=True),
    "wide": dict(N=4200),  # tile_config's wide tiles (a vocabulary)
}


def _linear_problem(device, dtype, M, case, K=200, N=40, seed=4):
    """K not a multiple of BLOCK_K, N not of the tile width: every mask is used."""
    g = torch.Generator().manual_seed(seed)
    opts = LINEAR_CASES[case]
    N = opts.get("N", N)
    rows_w = 2 * N if opts.get("gated") else N
    x = torch.randn(M, K, generator=g)
    w = torch.randn(rows_w, K, generator=g) / K ** 0.5
    kw = dict(gated=bool(opts.get("gated")), eps=1e-5)
    if opts.get("bias"):
        kw["bias"] = torch.randn(rows_w, generator=g)
    if opts.get("norm"):
        kw["norm_weight"] = 1 + 0.1 * torch.randn(K, generator=g)
    if opts.get("residual"):
        kw["residual"] = torch.randn(M, N, generator=g)
    to = lambda t: t.to(device, dtype) if torch.is_tensor(t) else t  # noqa: E731
    return to(x), to(w), {k: to(v) for k, v in kw.items()}


def test_fused_linear_reference_matches_its_definition():
    x, w, kw = _linear_problem("cpu", torch.float64, 5, "norm_gated")
    nw = kw["norm_weight"]
    xn = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * nw
    y = xn @ w.t()
    gate, up = y[:, :40], y[:, 40:]
    # (rms_norm_torch normalises in float32, whatever the input dtype)
    torch.testing.assert_close(fused_linear_torch(x, w, **kw), gate * torch.sigmoid(gate) * up, rtol=1e-5, atol=1e-6)
    x, w, kw = _linear_problem("cpu", torch.float64, 5, "residual")
    torch.testing.assert_close(fused_linear_torch(x, w, **kw), kw["residual"] + x @ w.t())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_fused_linear_triton_matches_reference(device, case):
    for dtype in _dtypes(device):
        for M in (1, 5, 37):
            x, w, kw = _linear_problem(_dev(device), dtype, M, case)
            out = fused_linear_triton(x, w, **kw)
            ref = fused_linear_torch(x, w, **kw)
            assert out.shape == ref.shape and out.dtype == dtype
            if dtype == torch.bfloat16:  # the product's summation order differs from cuBLAS
                torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
            else:
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_linear_triton_takes_the_tiling_it_is_given(device):
    """tile= (kernels/bench.py times tilings against tile_config's): another tiling of the
    wide case's weight, masks at both edges, computes the same product. In the interpreter
    (numpy's dot a BLOCK_K step) half the BLOCK_K gives other bits than the default's: the
    tiling is taken, not ignored; a GPU's fp32 FMA chain may give the same bits."""
    x, w, kw = _linear_problem(_dev(device), torch.float32, 5, "wide")
    own = fused_linear_triton(x, w, **kw)
    for tile in (dict(BLOCK_N=32, BLOCK_K=64, num_warps=2, num_stages=2),
                 dict(BLOCK_N=16, BLOCK_K=128, num_warps=2, num_stages=4)):
        out = fused_linear_triton(x, w, **kw, tile=tile)
        torch.testing.assert_close(out, fused_linear_torch(x, w, **kw), rtol=1e-5, atol=1e-5)
        if tile["BLOCK_K"] == 64 and device == "interp":
            assert not torch.equal(out, own)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["norm_gated", "residual", "bias", "wide"])
def test_fused_linear_triton_is_batch_invariant(device, case):
    """A row gives the same bits alone (plain decoding) as among 37, 60 or 130 rows (a
    verification or tree step): the reduction depends on the weight only, and from
    WIDE_ROWS rows on a program takes 32 rows (64 of the wide case's vocabulary-sized
    weight) instead of BLOCK_M without changing a row's bits."""
    assert row_block(16, 40) == row_block(16, 4200) == BLOCK_M
    assert row_block(37, 40) == row_block(130, 40) == 32 and row_block(37, 4200) == row_block(130, 4200) == 64
    for dtype in _dtypes(device):
        x, w, kw = _linear_problem(_dev(device), dtype, 130, case)
        full = fused_linear_triton(x, w, **kw)
        # The interpreter's tl.dot is numpy's BLAS, whose bits can depend on a row's place
        # in the tile; a GPU's MMA does not: there, rows in every place of a tile.
        for r in (0, 64) if device == "interp" else (0, 5, 17, 59, 100, 129):
            part = {k: (v[r:r + 1] if k == "residual" else v) for k, v in kw.items()}
            alone = fused_linear_triton(x[r:r + 1], w, **part)
            assert torch.equal(alone[0], full[r]), r
        for m in (37, 60):
            some = {k: (v[:m] if k == "residual" else v) for k, v in kw.items()}
            assert torch.equal(fused_linear_triton(x[:m], w, **some), full[:m]), m


def test_every_decode_shaped_step_takes_the_linear_kernel_whatever_its_batch():
    """A row's bits must be the same in a plain step and in a verification or tree step,
    so every decode-shaped step takes the batch-invariant kernel: a verification at
    batch 64 and k = 4 (320 rows), a (6, 3, 30) tree's 31 nodes at batch 64; a prompt
    (one sequence) only up to MAX_ROWS tokens, then cuBLAS."""
    from eagle_zoo.kernels.linear import MAX_ROWS, STEP_MAX_T, kernel_rows

    K = 576
    assert kernel_rows((64, 1, K)) and kernel_rows((64, 5, K)) and kernel_rows((64, 31, K))
    assert kernel_rows((128, STEP_MAX_T, K)) and kernel_rows((64, K))  # a draft step's [B, H]
    assert kernel_rows((1, MAX_ROWS, K)) and not kernel_rows((1, MAX_ROWS + 1, K))
    assert not kernel_rows((4 * MAX_ROWS, K)) and not kernel_rows((8, STEP_MAX_T + 1, K))


FP8_CASES = {  # name: (K, N, gated, bias); "wide": an input wider than MAX_K (fp8_wide_tile)
    "plain": (200, 40, False, False),
    "gated_bias": (200, 40, True, True),
    "wide": (2304, 48, False, False),
}


def _fp8_problem(device, dtype, M, case, seed=5):
    from eagle_zoo.kernels.linear import quantize_fp8

    K, N, gated, bias = FP8_CASES[case]
    g = torch.Generator().manual_seed(seed)
    rows_w = 2 * N if gated else N
    q, scale = quantize_fp8(torch.randn(rows_w, K, generator=g) / K ** 0.5)
    x = torch.randn(M, K, generator=g).to(device, dtype)
    b = torch.randn(rows_w, generator=g).to(device, dtype) if bias else None
    return x, q.to(device), scale.to(device), b, gated


def test_fp8_reference_is_the_dequantized_product():
    """fp8_linear_torch against its definition in float64: values times row scales."""
    from eagle_zoo.kernels.linear import fp8_linear_torch

    x, q, scale, b, _ = _fp8_problem("cpu", torch.float32, 5, "gated_bias")
    w = q.double() * scale.double()[:, None]
    torch.testing.assert_close(fp8_linear_torch(x, q, scale, b).double(), x.double() @ w.t() + b.double(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(FP8_CASES))
def test_fp8_weights_through_the_linear_kernel_match_the_reference(device, case):
    """The kernel reads e4m3 weights, widens them exactly, reduces in float32 and scales
    each output once: the reference's product up to summation order, at any input width
    (the wide case is past MAX_K, where bf16 weights keep cuBLAS)."""
    from eagle_zoo.kernels.activation import silu_and_mul_torch
    from eagle_zoo.kernels.linear import MAX_K, fp8_linear_torch

    assert (FP8_CASES["wide"][0] > MAX_K) and FP8_CASES["plain"][0] <= MAX_K
    for dtype in _dtypes(device):
        for M in (1, 5, 37):
            x, q, scale, b, gated = _fp8_problem(_dev(device), dtype, M, case)
            out = fused_linear_triton(x, q, b, scale=scale, gated=gated)
            ref = fp8_linear_torch(x, q, scale, b)
            ref = silu_and_mul_torch(ref) if gated else ref
            assert out.shape == ref.shape and out.dtype == dtype
            if dtype == torch.bfloat16:
                torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
            else:
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_weights_keep_the_kernel_batch_invariant(device):
    """A row's bits with fp8 weights are the same alone as among 37 rows, past MAX_K too."""
    for dtype in _dtypes(device):
        x, q, scale, b, gated = _fp8_problem(_dev(device), dtype, 37, "wide")
        full = fused_linear_triton(x, q, b, scale=scale)
        # The interpreter's tl.dot is numpy's BLAS (test_fused_linear_triton_is_batch_invariant):
        # there, rows that start a 32-row tile; on a GPU, rows in other places too.
        for r in (0, 32) if device == "interp" else (0, 20, 36):
            assert torch.equal(fused_linear_triton(x[r:r + 1], q, b, scale=scale)[0], full[r]), r


def test_fp8_wide_tiles_follow_the_rule_their_sweep_chose():
    """fp8_wide_tile at a Llama-3.1-8B-shaped head's products (weight rows, inputs; gate_up
    counts gate and up rows): K steps of 512 for inputs over 8,192, of 128 for weights over
    8,192 rows, else 256; tile_config hands it every input wider than MAX_K."""
    from eagle_zoo.kernels.linear import MAX_K, fp8_wide_tile, tile_config

    steps = {name: fp8_wide_tile(n, k)["BLOCK_K"] for name, n, k in (
        ("qkv", 6144, 8192), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down_proj", 4096, 14336),
        ("lm_head", 32000, 4096), ("fc", 4096, 12288))}
    assert steps == {"qkv": 256, "o_proj": 256, "gate_up": 128, "down_proj": 512, "lm_head": 128, "fc": 512}
    assert tile_config(4096, MAX_K + 1) == fp8_wide_tile(4096, MAX_K + 1) != tile_config(4096, MAX_K)


def test_fused_linear_dispatcher_keeps_autograd_and_cpu_on_the_reference():
    x, w, kw = _linear_problem("cpu", torch.float32, 3, "norm")
    assert not use_linear_kernel(x, w)  # CPU tensors
    assert torch.equal(fused_linear(x, w, **kw), fused_linear_torch(x, w, **kw))
    w.requires_grad_(True)
    assert needs_autograd(x, w)  # training: the kernels have no backward, use_triton says no
    with torch.no_grad():
        assert not needs_autograd(x, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [False, True])
def test_qkv_rope_write_kv_matches_the_separate_kernels_and_is_batch_invariant(device, norm):
    """kernels/qkv_rope.py: the qkv product, rope and the KV write in one launch, with 9 q
    and 3 k/v heads of 64 (SmolLM2's) and with 4 and 2 heads of 16 (pairs of two heads
    in one tile). The product is fused_linear_triton's bit for bit (the v cache); q and k
    are rope_neox_triton's within one rounding step (the compilers contract rope's
    product and sum differently in the two kernels); a row's bits are the same alone, and
    its first token's the same in a one-token step; a cache column outside the cache
    writes nothing. (The separate kernels' own tests hold them to the torch references.)"""
    from eagle_zoo.kernels.qkv_rope import qkv_rope_write_kv_triton

    dev = _dev(device)
    for dtype in _dtypes(device):
        for hq, hk, d, K in ((9, 3, 64, 96), (4, 2, 16, 40)):
            _, _, cos, sin = _rope_problem(dev, dtype, hq=hq, hk=hk, d=d)
            g = torch.Generator().manual_seed(7)
            x = torch.randn(2, 3, K, generator=g).to(dev, dtype)
            w = (0.2 * torch.randn((hq + 2 * hk) * d, K, generator=g)).to(dev, dtype)
            nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dev, dtype) if norm else None
            caches = (torch.randn(4, 400, hk, d, generator=g).to(dev, dtype),
                      torch.randn(4, 400, hk, d, generator=g).to(dev, dtype))
            slots = torch.tensor([2, 0], device=dev)
            pos = torch.tensor([[0, 7, 400], [5, 6, 7]], device=dev)  # 400: outside the cache

            def fused(rows, steps):
                kc, vc = caches[0].clone(), caches[1].clone()
                q = qkv_rope_write_kv_triton(x[rows, :steps], w, cos[rows, :steps], sin[rows, :steps], kc, vc,
                                             slots[rows], pos[rows, :steps], hq, hk, norm_weight=nw, eps=1e-5)
                return q, kc, vc

            q, kc, vc = fused(slice(None), 3)
            kc2, vc2 = caches[0].clone(), caches[1].clone()
            qkv = fused_linear_triton(x, w, norm_weight=nw, eps=1e-5).view(2, 3, hq + 2 * hk, d)
            q2, k2 = rope_neox_triton(qkv[:, :, :hq], qkv[:, :, hq:hq + hk], cos, sin)
            write_kv_triton(kc2, vc2, k2, qkv[:, :, hq + hk:], slots, pos)
            assert torch.equal(vc, vc2)
            _close_rope(q, q2, dtype)
            _close_rope(kc, kc2, dtype)
            written = torch.zeros(4, 400, dtype=torch.bool, device=dev)
            written[2, [0, 7]] = written[0, [5, 6, 7]] = True
            assert torch.equal(kc[~written], caches[0][~written]) and torch.equal(vc[~written], caches[1][~written])
            for b in (0, 1):  # batch invariance: alone, and its first token alone
                for steps in (3, 1):
                    qb, kcb, vcb = fused(slice(b, b + 1), steps)
                    assert torch.equal(qb[0], q[b, :steps]), (b, steps)
                    cols = pos[b, :steps][pos[b, :steps] < 400]
                    assert torch.equal(kcb[slots[b], cols], kc[slots[b], cols]), (b, steps)
                    assert torch.equal(vcb[slots[b], cols], vc[slots[b], cols]), (b, steps)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_write_kv_is_rope_then_the_kv_write(device):
    """kernels/qkv_rope.py rope_write_kv: rope and the KV write after a product of its
    own, in one launch, exactly rope_neox_triton then write_kv_triton (the same rotation
    code; v copied), with 9 q and 3 k/v heads of 64 and with 4 and 2 heads of 16; a
    cache column outside the cache writes nothing."""
    from eagle_zoo.kernels.qkv_rope import rope_write_kv_triton

    dev = _dev(device)
    for dtype in _dtypes(device):
        for hq, hk, d in ((9, 3, 64), (4, 2, 16)):
            _, _, cos, sin = _rope_problem(dev, dtype, hq=hq, hk=hk, d=d)
            g = torch.Generator().manual_seed(13)
            qkv = torch.randn(2, 3, (hq + 2 * hk) * d, generator=g).to(dev, dtype)
            caches = (torch.randn(4, 400, hk, d, generator=g).to(dev, dtype),
                      torch.randn(4, 400, hk, d, generator=g).to(dev, dtype))
            slots = torch.tensor([2, 0], device=dev)
            pos = torch.tensor([[0, 7, 400], [5, 6, 7]], device=dev)  # 400: outside the cache
            kc, vc = caches[0].clone(), caches[1].clone()
            q = rope_write_kv_triton(qkv, cos, sin, kc, vc, slots, pos, hq, hk)
            heads = qkv.view(2, 3, hq + 2 * hk, d)
            q2, k2 = rope_neox_triton(heads[:, :, :hq], heads[:, :, hq:hq + hk], cos, sin)
            kc2, vc2 = caches[0].clone(), caches[1].clone()
            write_kv_triton(kc2, vc2, k2, heads[:, :, hq + hk:], slots, pos)
            assert torch.equal(q, q2)
            assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
            written = torch.zeros(4, 400, dtype=torch.bool, device=dev)
            written[2, [0, 7]] = written[0, [5, 6, 7]] = True
            assert torch.equal(kc[~written], caches[0][~written]) and torch.equal(vc[~written], caches[1][~written])
            assert not torch.equal(kc[written], caches[0][written])
            with pytest.raises(ValueError, match=f"rope_write_kv_triton: qkv of width {qkv.shape[-1] - 2} must hold"):
                rope_write_kv_triton(qkv[..., :-2], cos, sin, kc, vc, slots, pos, hq, hk)


@pytest.mark.parametrize("device", DEVICES)
def test_qkv_rope_write_kv_rows_are_the_same_in_a_step_of_wide_row_blocks(device):
    """A step of 16 sequences x 4 tokens (64 rows: row_block's 32 rows a program) gives
    each sequence's q and cache rows the bits it gets alone (4 rows: BLOCK_M a program)."""
    from eagle_zoo.kernels.linear import row_block
    from eagle_zoo.kernels.qkv_rope import qkv_rope_write_kv_triton

    dev, (hq, hk, d, K), (B, T) = _dev(device), (9, 3, 64, 96), (16, 4)
    assert row_block(B * T, (hq + 2 * hk) * d) == 32 and row_block(T, (hq + 2 * hk) * d) == BLOCK_M
    g = torch.Generator().manual_seed(11)
    angles = torch.rand(B, T, 1, d // 2, generator=g) * 6
    cos, sin = angles.cos().to(dev), angles.sin().to(dev)
    pos = (torch.randint(0, 300, (B, 1), generator=g) + torch.arange(T)).to(dev)
    slots = torch.randperm(B, generator=g).to(dev)
    for dtype in _dtypes(device):
        x = torch.randn(B, T, K, generator=g).to(dev, dtype)
        w = (0.2 * torch.randn((hq + 2 * hk) * d, K, generator=g)).to(dev, dtype)

        def run(rows):
            kc, vc = (torch.zeros(B, 400, hk, d, dtype=dtype, device=dev) for _ in range(2))
            q = qkv_rope_write_kv_triton(x[rows], w, cos[rows], sin[rows], kc, vc, slots[rows], pos[rows], hq, hk)
            return q, kc, vc

        q, kc, vc = run(slice(None))
        # The interpreter's tl.dot (numpy's BLAS) can give a row other bits in another place
        # of its tile: there only sequences whose rows start a tile in both steps.
        for b in (0, 8) if device == "interp" else range(B):
            qb, kcb, vcb = run(slice(b, b + 1))
            assert torch.equal(qb[0], q[b]), b
            assert torch.equal(kcb[slots[b]], kc[slots[b]]) and torch.equal(vcb[slots[b]], vc[slots[b]]), b


def _tiny_llama_layer(device, dtype):
    from transformers import LlamaConfig

    from eagle_zoo.models.llama import LlamaDecoderLayer

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=100, rms_norm_eps=1e-5)
    torch.manual_seed(6)
    layer = LlamaDecoderLayer(config, 0)
    for p in layer.parameters():
        p.data.normal_(0, 0.1)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data = 1 + 0.1 * torch.randn(64)
    return layer.to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_decoder_layer_matches_the_module_path(device):
    """eagle_zoo/models/fused_layer.py's 6 kernels against LlamaDecoderLayer's modules
    (the torch references), same output and the same KV cache, for a decode step (T=1)
    and a verification step (T=4) of two sequences."""
    from eagle_zoo.models.fused_layer import fused_layer_kernels, layer_supports_fusion

    dev = _dev(device)
    layer = _tiny_llama_layer(dev, torch.float32)
    assert layer_supports_fusion(layer)
    _check_against_the_module_path(dev, 7, 1, lambda positions, h, ctx: fused_layer_kernels(layer, positions, h, ctx),
                                   layer)


@pytest.mark.parametrize("device", DEVICES)
def test_wide_decoder_layer_matches_the_module_path(device):
    """fused_layer.py's regrouping around cuBLAS products (wide_layer_kernels, for weights
    wider than the linear kernel takes) against the module path: output and KV cache
    for a decode and a verification step."""
    from eagle_zoo.models.fused_layer import wide_layer_kernels

    dev = _dev(device)
    layer = _tiny_llama_layer(dev, torch.float32)
    _check_against_the_module_path(dev, 7, 1, lambda positions, h, ctx: wide_layer_kernels(layer, positions, h, ctx),
                                   layer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("regrouping", ["fused_layer_kernels", "wide_layer_kernels"])
def test_regrouped_layers_verify_a_tree_as_the_module_path_does(device, regrouping):
    """A tree pass (EAGLE-2 verification: nodes at cache columns 4..7 after 4 cached
    tokens, rope positions base + depth, each node seeing the history and its ancestors)
    through either regrouping against the module path: output and KV cache."""
    from eagle_zoo.models import fused_layer
    from eagle_zoo.models.attention import AttentionContext, use_context

    dev = _dev(device)
    layer = _tiny_llama_layer(dev, torch.float32)
    g = torch.Generator().manual_seed(14)
    caches = [(torch.randn(1, 12, 2, 16, generator=g).to(dev), torch.randn(1, 12, 2, 16, generator=g).to(dev))]
    h = torch.randn(1, 4, 64, generator=g).to(dev)
    ancestors = torch.tensor([[[0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 2, 3]]], device=dev)  # 0 <- 1, 0 <- 2 <- 3
    depth = torch.tensor([[0, 1, 1, 2]], device=dev)
    positions = 4 + depth
    slots, columns = torch.tensor([0], device=dev), torch.arange(4, 8, device=dev)[None]
    tree = (positions, torch.tensor([4], device=dev), ancestors)
    mine = [(k.clone(), v.clone()) for k, v in caches]
    with torch.no_grad(), use_context(AttentionContext(mine, slots, columns, 8, tree_keys=tree)) as ctx:
        out = getattr(fused_layer, regrouping)(layer, positions, h, ctx)
    theirs = [(k.clone(), v.clone()) for k, v in caches]
    with torch.no_grad(), use_context(AttentionContext(theirs, slots, columns, 8, tree_keys=tree)):
        with patch_kernels_off():
            ref = layer(positions, h)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(mine[0], theirs[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_wide_eagle3_layer_matches_the_module_path(device, norm_before_residual):
    from eagle_zoo.models.fused_layer import wide_eagle3_layer_kernels

    dev = _dev(device)
    layer = _tiny_eagle3_layer(dev, torch.float32, norm_before_residual)
    _check_against_the_module_path(
        dev, 9, 2, lambda positions, embeds, hidden, ctx: wide_eagle3_layer_kernels(layer, positions, embeds,
                                                                                     hidden, ctx), layer)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not HAS_CUDA or not HAS_TRITON, reason="needs CUDA and triton")
@pytest.mark.parametrize("eagle3", [False, True])
def test_layers_too_wide_for_the_linear_kernel_take_the_wide_path(monkeypatch, eagle3):
    """With the linear kernel's MAX_K below the layer's width, a decode step's layer call
    runs wide_layer_kernels (wide_eagle3_layer_kernels for a head layer) and gives the
    module path's output; with it above, the linear kernel's path."""
    from eagle_zoo.kernels import linear
    from eagle_zoo.models import fused_layer
    from eagle_zoo.models.attention import AttentionContext, use_context

    layer = _tiny_eagle3_layer("cuda", torch.float32, False) if eagle3 else _tiny_llama_layer("cuda", torch.float32)
    fused_layer.choose_decode_paths(layer)
    assert layer.fused_decode
    wide_name = "wide_eagle3_layer_kernels" if eagle3 else "wide_layer_kernels"
    narrow_name = "fused_eagle3_layer_kernels" if eagle3 else "fused_layer_kernels"
    calls = []
    for name in (wide_name, narrow_name):
        real = getattr(fused_layer, name)
        monkeypatch.setattr(fused_layer, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(1, 1, 64, generator=g).cuda() for _ in range(2 if eagle3 else 1)]
    positions = torch.tensor([[3]], device="cuda")
    for max_k, expected in ((32, wide_name), (2048, narrow_name)):
        monkeypatch.setattr(linear, "MAX_K", max_k)
        outs = []
        for kernels_on in (True, False):
            caches = [(torch.zeros(1, 8, 2, 16, device="cuda"), torch.zeros(1, 8, 2, 16, device="cuda"))]
            with torch.no_grad(), use_context(AttentionContext(caches, torch.tensor([0], device="cuda"),
                                                               positions, 4)):
                if kernels_on:
                    outs.append(layer(positions, *inputs))
                else:
                    with patch_kernels_off():
                        outs.append(layer(positions, *inputs))
        assert calls.pop() == expected and not calls
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)


def _check_against_the_module_path(dev, seed: int, num_inputs: int, fused, layer):
    """fused(positions, *inputs, ctx) against layer(positions, *inputs) on the module path
    (the torch references): the same output and KV cache, for a one-token step and a
    4-token step of two sequences, each from its own copy of the same caches."""
    from eagle_zoo.models.attention import AttentionContext, use_context

    g = torch.Generator().manual_seed(seed)
    caches = [(torch.randn(3, 32, 2, 16, generator=g).to(dev), torch.randn(3, 32, 2, 16, generator=g).to(dev))]
    for T in (1, 4):
        inputs = [torch.randn(2, T, 64, generator=g).to(dev) for _ in range(num_inputs)]
        positions = torch.tensor([[9], [20]], device=dev) + torch.arange(T, device=dev)
        slots = torch.tensor([2, 0], device=dev)
        mine = [(k.clone(), v.clone()) for k, v in caches]
        with torch.no_grad(), use_context(AttentionContext(mine, slots, positions, 32)) as ctx:
            out = fused(positions, *inputs, ctx)
        theirs = [(k.clone(), v.clone()) for k, v in caches]
        with torch.no_grad(), use_context(AttentionContext(theirs, slots, positions, 32)):
            with patch_kernels_off():
                ref = layer(positions, *inputs)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for a, b in zip(mine[0], theirs[0]):  # k and v from another product's summation order
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _tiny_eagle3_layer(device, dtype, norm_before_residual: bool):
    from transformers import LlamaConfig

    from eagle_zoo.models.heads import Eagle3DecoderLayer
    from eagle_zoo.models.heads import rms_norm as make_norm
    from eagle_zoo.models.llama import LlamaAttention, LlamaMLP

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=100, rms_norm_eps=1e-5)
    config.norm_before_residual = norm_before_residual
    torch.manual_seed(8)
    layer = Eagle3DecoderLayer(config, LlamaAttention, LlamaMLP, make_norm, 0)
    for p in layer.parameters():
        p.data.normal_(0, 0.1)
    for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
        norm.weight.data = 1 + 0.1 * torch.randn(64)
    return layer.to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_fused_eagle3_layer_matches_the_module_path(device, norm_before_residual):
    """An EAGLE-3 head layer through the regrouped kernels (the pair norm, then a Llama
    layer's) against Eagle3DecoderLayer's modules: output and KV cache, for a draft
    (T=1) and a catch-up (T=4) of two sequences, with either residual convention."""
    from eagle_zoo.models.fused_layer import eagle3_layer_supports_fusion, fused_eagle3_layer_kernels

    dev = _dev(device)
    layer = _tiny_eagle3_layer(dev, torch.float32, norm_before_residual)
    assert eagle3_layer_supports_fusion(layer)
    _check_against_the_module_path(
        dev, 9, 2, lambda positions, embeds, hidden, ctx: fused_eagle3_layer_kernels(layer, positions, embeds,
                                                                                      hidden, ctx), layer)


def test_eagle3_layer_chooses_the_fused_path_only_for_the_llama_structure():
    from eagle_zoo.models.fused_layer import choose_decode_paths

    layer = _tiny_eagle3_layer("cpu", torch.float32, False)
    choose_decode_paths(layer)
    assert layer.fused_decode
    layer.hidden_norm = torch.nn.LayerNorm(64)  # not the RMSNorm the pair kernel computes
    choose_decode_paths(layer)
    assert not layer.fused_decode


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not HAS_CUDA or not HAS_TRITON, reason="needs CUDA and triton")
def test_eagle3_draft_logits_fold_the_norm_into_the_lm_head():
    """compute_draft_logits' one launch (the norm as the product's prologue) against the
    head's norm and lm_head modules, bf16 on CUDA."""
    from transformers import LlamaConfig

    from eagle_zoo.models.llama import LlamaEagle3Head

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=500, rms_norm_eps=1e-5)
    config.draft_vocab_size = 300
    torch.manual_seed(10)
    head = LlamaEagle3Head(config)
    for p in head.parameters():
        p.data.normal_(0, 0.1)
    head.norm.weight.data = 1 + 0.1 * torch.randn(64)
    head = head.to("cuda", torch.bfloat16)
    h = torch.randn(2, 4, 64).to("cuda", torch.bfloat16)
    with torch.no_grad():
        folded = head.compute_draft_logits(h)
        with patch_kernels_off():
            modules = head.lm_head(head.norm(h))
    assert folded.shape == (2, 4, 300)
    # The modules round the norm's output to bf16 before the product and the folded
    # launch does not, so a logit's 64 products differ by up to a bf16 step of the
    # larger terms: near-zero logits move by more than a step of their own. Tolerance:
    # two bf16 steps of the largest logit (a norm left out or applied twice is ~10x that).
    scale = modules.float().abs().max().item()
    torch.testing.assert_close(folded.float(), modules.float(), rtol=2 ** -7, atol=2 ** -6 * scale)


def patch_kernels_off():
    """Triton treated as absent for the duration: the module path on the references."""
    from unittest import mock

    from eagle_zoo.kernels import _triton

    return mock.patch.object(_triton, "HAS_TRITON", False)


# --- tree passes in position order (EAGLE-2 trees get plain decoding's bits) ------------------

def _tree_attention_problem(device, dtype=torch.float32, bases=(37, 46)):
    """Two sequences, histories of bases[0] and bases[1] tokens, a 7-node tree each at
    columns base..base+6 (node 0 the root), as tree_verify lays it out; depths up to 3 and
    4 (positions base..base+4)."""
    from eagle_zoo.kernels.attention import tree_visibility
    from eagle_zoo.kernels.tree_select import build_tree

    g = torch.Generator().manual_seed(8)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3, 2], [-1, 0, 1, 0, 2, 4, 3]])
    depth, anc = build_tree(parents, 4)
    base = torch.tensor(bases)
    B, N = parents.shape
    positions = base.view(B, 1) + depth
    columns = base.view(B, 1) + torch.arange(N)
    kv_len = max(bases) + 20
    mask = tree_visibility((positions, base, anc), kv_len)
    q = torch.randn(B, N, 6, 16, generator=g)
    kc, vc = torch.randn(4, kv_len + 6, 2, 16, generator=g), torch.randn(4, kv_len + 6, 2, 16, generator=g)
    slots = torch.tensor([3, 1])
    to = lambda t: t.to(device)  # noqa: E731
    return (to(q.to(dtype)), to(kc.to(dtype)), to(vc.to(dtype)), to(slots), to(columns), kv_len, to(mask),
            (to(positions), to(base), to(anc)), depth, anc)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_tree_mode_matches_reference_and_plain_decoding_bits(device):
    """Histories longer than a split (16 keys in the interpreter, 128 on the GPU), so that
    the splits of history alone (the nodes' rows together in a tile) and the split reaching
    the tree's columns (a node a tile) both count; the second sequence's deeper nodes'
    positions cross into the next split (46 + 2 = 48 = 3 x 16; 382 + 2 = 384 = 3 x 128), so
    a node's path reaches two splits."""
    dev = _dev(device)
    kw = dict(split_size=16, block_n=16) if device == "interp" else {}
    bases = (37, 46) if device == "interp" else (300, 382)
    for dtype in _dtypes(device):
        q, kc, vc, slots, cols, kv_len, mask, tree, depth, anc = _tree_attention_problem(dev, dtype, bases)
        out = cache_attention_triton(q, kc, vc, slots, cols, kv_len, 0.25, tree=tree, **kw)
        ref = cache_attention_torch(q, kc, vc, slots, cols, kv_len, 0.25, attn_mask=mask)
        # The CPU dispatcher takes the tree's keys through the reference with their mask: the
        # same bits as the reference on the CPU (the CUDA reference's bits differ from the CPU's).
        cpu = [t.cpu() for t in (q, kc, vc, slots, cols)]
        assert torch.equal(cache_attention(*cpu, kv_len, 0.25, tree=tuple(t.cpu() for t in tree)),
                           cache_attention_torch(*cpu, kv_len, 0.25, attn_mask=mask.cpu()))
        with pytest.raises(ValueError, match="not both"):
            cache_attention_triton(q, kc, vc, slots, cols, kv_len, 0.25, attn_mask=mask, tree=tree, **kw)
        # bf16: the kernel rounds each probability to bf16 before its value product (as
        # every flash kernel does), relative to the running max of one key per tile, so it
        # is not one bf16 step from the reference near zero; the tolerance of the other
        # bf16 attention tests. The bit check below is the property that matters.
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
        base = tree[1]
        for b in range(2):
            for i in range(7):
                d = int(depth[b, i])
                # The same path decoded as a chain: its nodes' k/v at columns base .. base + d.
                kc2, vc2 = kc.clone(), vc.clone()
                s, bb = int(slots[b]), int(base[b])
                for level in range(d + 1):
                    node = int(anc[b, i, level])
                    kc2[s, bb + level], vc2[s, bb + level] = kc[s, bb + node], vc[s, bb + node]
                pos = torch.tensor([[bb + d]], device=dev)
                plain = cache_attention_triton(q[b:b + 1, i:i + 1], kc2, vc2, slots[b:b + 1], pos, kv_len, 0.25,
                                               **kw)
                assert torch.equal(plain[0, 0], out[b, i]), (b, i)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_tree_of_wide_head_groups_takes_its_keys_as_a_mask(device):
    """More than 16 query heads a kv head do not fit the tree walk's tile: the same keys
    as a mask (tree_visibility), against the reference."""
    dev = _dev(device)
    kw = dict(split_size=16, block_n=16) if device == "interp" else {}
    _, kc, vc, slots, cols, kv_len, mask, tree, _, _ = _tree_attention_problem(dev)
    q = torch.randn(2, 7, 34, 16, generator=torch.Generator().manual_seed(3)).to(dev)  # 17 heads a kv head
    out = cache_attention_triton(q, kc, vc, slots, cols, kv_len, 0.25, tree=tree, **kw)
    ref = cache_attention_torch(q, kc, vc, slots, cols, kv_len, 0.25, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


# --- programmatic dependent launch (kernels/_triton.py) ---

from eagle_zoo.kernels import _triton  # noqa: E402
from eagle_zoo.kernels._triton import pdl_launch  # noqa: E402


def test_pdl_is_off_for_cpu_tensors():
    assert pdl_launch(torch.zeros(1)) == {"PDL": False}


def _layer_chain(x, ws, nw, res):
    """Kernels that read each other's outputs back to back, as a decode step's layers do:
    norm + gated projection, a projection with a residual add, a plain one."""
    h = fused_linear_triton(x, ws[0], norm_weight=nw, eps=1e-5, gated=True)
    h = fused_linear_triton(h, ws[1], residual=res)
    return fused_linear_triton(h, ws[2])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or INTERPRET or not HAS_TRITON, reason="needs CUDA and triton")
def test_pdl_chain_in_a_cuda_graph_gives_the_bits_of_serial_launches(monkeypatch):
    """With PDL each kernel may start before the one it reads from ends (it waits in
    gdc_wait): a captured chain must give the bits of the same chain launched without it,
    replay after replay, with the input changed between replays."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9")
    g = torch.Generator().manual_seed(11)
    dev, dt = "cuda", torch.bfloat16
    K, I = 576, 1536
    ws = [(torch.randn(2 * I, K, generator=g) / K ** 0.5).to(dev, dt),
          (torch.randn(K, I, generator=g) / I ** 0.5).to(dev, dt),
          (torch.randn(4096 + 64, K, generator=g) / K ** 0.5).to(dev, dt)]
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dev, dt)
    x = torch.randn(3, K, generator=g).to(dev, dt)
    res = torch.randn(3, K, generator=g).to(dev, dt)
    assert pdl_launch(x)["PDL"]
    _layer_chain(x, ws, nw, res)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _layer_chain(x, ws, nw, res)
    for step in range(3):
        x.copy_(torch.randn(3, K, generator=g).to(dev, dt))
        graph.replay()
        with monkeypatch.context() as serial:  # the same kernels launched without PDL
            serial.setattr(_triton, "HAS_PDL", False)
            want = _layer_chain(x, ws, nw, res)
        torch.cuda.synchronize()
        assert torch.equal(out, want), step


# --- log_softmax_top_k (an EAGLE-2 tree level's top k) ------------------------------------

from eagle_zoo.kernels import argmax_rows, argmax_rows_triton  # noqa: E402
from eagle_zoo.kernels import log_softmax_top_k, log_softmax_top_k_torch, log_softmax_top_k_triton  # noqa: E402


def _top_k_rows(V, dtype, device, seed=0):
    """[2, 3, V] rows with ties among their largest values (bf16 rounding, planted
    repeats), a -inf entry and a -0.0 beside a 0.0."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, 3, V, generator=g) * 3).to(dtype)
    x[0, 0, V // 2] = x[0, 0, 1] = x[0, 0].max()  # a tie for first place, higher column first
    x[1, 2, :4] = float("-inf")
    x[1, 1, 3], x[1, 1, 5] = -0.0, 0.0
    x[1, 1, 7:] = -1.0
    return x.to(device)


def test_log_softmax_top_k_reference_matches_its_definition():
    x = _top_k_rows(50, torch.bfloat16, "cpu")
    offsets = torch.arange(50) % 7
    scores, ids = log_softmax_top_k_torch(x, 5, offsets)
    logp = torch.log_softmax(x.float(), dim=-1)
    for row in range(6):
        r = x.float().reshape(6, 50)[row].tolist()
        cols = sorted(range(50), key=lambda c: (-r[c], c))[:5]  # largest first, ties to the lower column
        assert ids.reshape(6, 5)[row].tolist() == [c + int(offsets[c]) for c in cols]
        assert torch.equal(scores.reshape(6, 5)[row], logp.reshape(6, 50)[row, cols])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,k,dtype,block", [(50, 5, torch.bfloat16, 1024), (50, 5, torch.bfloat16, 16),
                                             (20000, 3, torch.bfloat16, 1024), (1000, 16, torch.float32, 1024),
                                             (1000, 16, torch.float32, 64), (7, 7, torch.float32, 1024)])
def test_log_softmax_top_k_triton_matches_reference(device, V, k, dtype, block):
    """block: a part's entries (the module doc); the small ones make many parts to merge."""
    x = _top_k_rows(V, dtype, _dev(device)) if V > 8 else torch.randn(2, 3, V).to(_dev(device), dtype)
    for offsets in (None, torch.randint(0, 9, (V,), generator=torch.Generator().manual_seed(1)).to(x.device)):
        scores, ids = log_softmax_top_k_triton(x, k, offsets, block=block)
        want_scores, want_ids = log_softmax_top_k_torch(x, k, offsets)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(scores, want_scores, rtol=0, atol=2e-6 * max(1.0, want_scores.abs().max().item()))
    # a row's result does not depend on the others (one program a row)
    s1, i1 = log_softmax_top_k_triton(x[1:, 2:], k)
    assert torch.equal(i1[0, 0], log_softmax_top_k_triton(x, k)[1][1, 2])


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_top_k_adds_each_rows_parent_score(device):
    """An EAGLE-2 round's children (engine/tree_proposer.py): each row's scores plus its
    parent's score, the bits of adding it after the launch, as the reference does."""
    x = _top_k_rows(12000, torch.bfloat16, _dev(device))
    add = -torch.rand(x.shape[:-1], generator=torch.Generator().manual_seed(2)).to(x.device) * 5
    scores, ids = log_softmax_top_k_triton(x, 6)
    got_scores, got_ids = log_softmax_top_k_triton(x, 6, add=add)
    assert torch.equal(got_ids, ids) and torch.equal(got_scores, scores + add.unsqueeze(-1))
    want_scores, want_ids = log_softmax_top_k_torch(x, 6, add=add)
    assert torch.equal(want_scores, log_softmax_top_k_torch(x, 6)[0] + add.unsqueeze(-1))
    torch.testing.assert_close(got_scores, want_scores, rtol=0, atol=2e-6 * want_scores.abs().max().item())
    with pytest.raises(ValueError, match="one float32 value a row"):
        log_softmax_top_k_triton(x, 6, add=add[..., :1])


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_top_k_writes_into_slices_of_candidate_rows(device):
    """out = (scores, ids): an EAGLE-2 tree's levels written in place into its candidate
    rows (engine/tree_proposer.py), a [B, k] slice for one row a sequence and a [B, k, k]
    view of a slice for k rows a sequence; what the slices do not cover is left alone."""
    dev = _dev(device)
    x = _top_k_rows(12000, torch.bfloat16, dev)  # [2, 3, V]: 2 sequences, 3 rows each
    add = -torch.rand(2, 3, generator=torch.Generator().manual_seed(2)).to(dev)
    offsets = torch.arange(12000, device=dev) % 7
    for fn in (log_softmax_top_k_torch, log_softmax_top_k, log_softmax_top_k_triton):
        scores = torch.full((2, 4 + 9 + 3), 7.0, device=dev)
        ids = torch.full((2, 16), -7, dtype=torch.long, device=dev)
        got = fn(x[:, 0], 4, offsets, None, (scores[:, :4], ids[:, :4]))
        assert got[0].data_ptr() == scores.data_ptr()
        want = fn(x[:, 0], 4, offsets)  # the same function's own result
        assert torch.equal(scores[:, :4], want[0]) and torch.equal(ids[:, :4], want[1])
        fn(x, 3, offsets, add, (scores[:, 4:13].view(2, 3, 3), ids[:, 4:13].view(2, 3, 3)))
        want = fn(x, 3, offsets, add)
        assert torch.equal(scores[:, 4:13].view(2, 3, 3), want[0]) and torch.equal(ids[:, 4:13].view(2, 3, 3), want[1])
        assert (scores[:, 13:] == 7.0).all() and (ids[:, 13:] == -7).all()
    for bad, match in (((scores[:, :3], ids[:, :3]), "shapes"), ((scores[:, :4].double(), ids[:, :4]), "float32"),
                       ((scores[:, :8:2], ids[:, :8:2]), "strides")):
        for fn in (log_softmax_top_k_torch, log_softmax_top_k_triton):
            with pytest.raises(ValueError, match=match):
                fn(x[:, 0], 4, out=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_top_1_is_argmax_with_its_id_mapped(device):
    """The top 1 through the id map is argmax's first maximum, mapped, ties and -inf
    included: log_softmax_top_k and argmax_rows (Eagle3Head.draft_argmax) agree."""
    for V in (50, 12000):
        x = _top_k_rows(V, torch.bfloat16, _dev(device))
        offsets = torch.arange(V, device=x.device) % 7
        ids = x.argmax(-1)
        assert torch.equal(log_softmax_top_k_triton(x, 1, offsets)[1][..., 0], ids + offsets[ids])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,block", [(50, 1024), (50, 16), (12000, 1024), (49152, 1024)])
def test_argmax_rows_triton_is_torch_argmax(device, V, block):
    """The target's greedy tokens (engine/verify.py) and an EAGLE-3 head's greedy drafts
    through its id map (Eagle3Head.draft_argmax): torch's first maximum, ties across
    parts, -inf and -0.0 included, each row alone as among the others."""
    x = _top_k_rows(V, torch.bfloat16, _dev(device))
    x[1, 0, V - 1] = x[1, 0].max() + 1  # the maximum in the last part
    ids = argmax_rows_triton(x, block=block)
    assert torch.equal(ids, x.argmax(-1))
    assert torch.equal(argmax_rows_triton(x[1:, 1:], block=block), ids[1:, 1:])
    assert torch.equal(argmax_rows(x), ids)
    offsets = torch.arange(V, device=x.device) % 7
    assert torch.equal(argmax_rows_triton(x, offsets, block=block), ids + offsets[ids])
    assert torch.equal(argmax_rows(x, offsets), ids + offsets[ids])


def test_argmax_rows_refuses_empty_rows():
    with pytest.raises(ValueError, match="no entries"):
        argmax_rows_triton(torch.empty(2, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_top_k_triton_refuses_k_it_cannot_hold(device):
    x = torch.randn(2, 20).to(_dev(device))
    for k in (0, 21, 17):
        with pytest.raises(ValueError, match=f"k = {k}"):
            log_softmax_top_k_triton(x, k)


def test_log_softmax_top_k_dispatches_to_the_reference_on_cpu():
    x = _top_k_rows(300, torch.float32, "cpu")
    got, want = log_softmax_top_k(x, 4), log_softmax_top_k_torch(x, 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- tree_expand (an EAGLE-2 drafting round's nodes to expand) ------------------------------

from eagle_zoo.kernels import tree_expand, tree_expand_torch, tree_expand_triton  # noqa: E402


def _expand_problem(device, B=3, k=4, H=70, W=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    cum = -(torch.rand(B, k * k, generator=g) * 4).to(torch.bfloat16).float()  # bf16 steps: ties
    if k * k > 5:
        cum[0, 5] = cum[0, 2] = cum[0].max()  # a tie for first place, the higher index first
        cum[1, :3] = float("-inf")
        cum[2, 1], cum[2, 4] = -0.0, 0.0
    tokens = torch.randint(0, 1000, (B, k * k + 5), generator=g)
    wide = torch.randn(B, k, H + 6, generator=g).to(torch.bfloat16)
    ancestors = torch.randint(0, 100, (B, k, W), generator=g)
    # tokens and hidden: strided rows (the candidate rows' slice, the head's output slice)
    return [t.to(device) for t in (cum, tokens[:, 2:2 + k * k], wide[..., 3:H + 3], ancestors)]


def _parent_rows(cum):
    """A stand-in for the tree's candidate rows (-5 everywhere) and the slice of them that
    tree_expand writes the next round's parents into."""
    B, kk = cum.shape
    rows = torch.full((B, 3 + kk + 4), -5, dtype=torch.long, device=cum.device)
    return rows, rows[:, 3:3 + kk]


def test_tree_expand_reference_matches_its_definition():
    cum, tokens, hidden, ancestors = _expand_problem("cpu")
    B, k = hidden.shape[:2]
    _, child_parents = _parent_rows(cum)
    scores, toks, node_hidden, anc = tree_expand_torch(cum, tokens, hidden, ancestors, first=7, level=5,
                                                       parents_out=child_parents)
    for b in range(B):
        row = cum[b].tolist()
        pick = sorted(range(k * k), key=lambda i: (-row[i], i))[:k]
        assert scores[b].tolist() == [row[i] for i in pick]
        assert toks[b].tolist() == [tokens[b, i].item() for i in pick]
        assert child_parents[b].tolist() == [7 + i for i in pick for _ in range(k)]
        assert torch.equal(node_hidden[b], hidden[b, [i // k for i in pick]])
        for j, i in enumerate(pick):
            want = ancestors[b, i // k].tolist()
            want[5] = 5 * k + j  # its own scratch column at its level
            assert anc[b, j].tolist() == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,H,W", [(4, 70, 12), (3, 2000, 18), (5, 64, 25), (1, 8, 1)])
def test_tree_expand_triton_matches_reference(device, k, H, W):
    args = _expand_problem(_dev(device), k=k, H=H, W=W)
    first_round = args[:3] + [args[3][0].expand(args[3].shape)]  # the engine's first rows: one for every b
    for level in {0, W // 2, W - 1}:
        for case in (args, first_round):
            # The parents written into a slice of the candidate rows, nothing else of them touched.
            (got_rows, got_parents), (want_rows, want_parents) = _parent_rows(args[0]), _parent_rows(args[0])
            got = tree_expand_triton(*case, first=11, level=level, parents_out=got_parents)
            want = tree_expand_torch(*case, first=11, level=level, parents_out=want_parents)
            for g_, w_ in zip(got, want):
                assert g_.dtype == w_.dtype and torch.equal(g_, w_)
            assert torch.equal(got_rows, want_rows)
            assert (got_rows[:, :3] == -5).all() and (got_rows[:, 3 + k * k:] == -5).all()


@pytest.mark.parametrize("device", DEVICES)
def test_tree_expand_triton_refuses_what_it_cannot_hold(device):
    cum, tokens, hidden, ancestors = _expand_problem(_dev(device), k=17, H=8, W=4)
    with pytest.raises(ValueError, match="k = 17"):
        tree_expand_triton(cum, tokens, hidden, ancestors, first=0, level=1, parents_out=_parent_rows(cum)[1])
    cum, tokens, hidden, ancestors = _expand_problem(_dev(device), k=2, H=8, W=4)
    with pytest.raises(ValueError, match="level 4 outside"):
        tree_expand_triton(cum, tokens, hidden, ancestors, first=0, level=4, parents_out=_parent_rows(cum)[1])


def test_tree_expand_dispatches_to_the_reference_on_cpu():
    args = _expand_problem("cpu")
    (got_rows, got_parents), (want_rows, want_parents) = _parent_rows(args[0]), _parent_rows(args[0])
    got = tree_expand(*args, first=3, level=2, parents_out=got_parents)
    for g_, w_ in zip(got, tree_expand_torch(*args, first=3, level=2, parents_out=want_parents)):
        assert torch.equal(g_, w_)
    assert torch.equal(got_rows, want_rows)


# --- tree_select (an EAGLE-2 tree from its candidates) --------------------------------------

from eagle_zoo.kernels import tree_select, tree_select_torch, tree_select_triton  # noqa: E402


def _candidates(B, k, rounds, seed=0):
    """Candidates as TreeEagleProposer.propose_tree numbers them: the root's k children,
    then each round's k * k children of k expanded candidates of the level before; scores
    add log-probs in bf16 steps (ties), some -inf (outside a draft vocabulary); the roots'
    tokens last."""
    g = torch.Generator().manual_seed(seed)
    scores, parents = [], []
    for _ in range(B):
        lp = -(torch.rand(k + rounds * k * k, generator=g) * 3).to(torch.bfloat16).float()
        lp[torch.rand(lp.shape, generator=g) < 0.05] = float("-inf")
        sc, par, level = [], [], []
        for c in range(k):
            sc.append(lp[c].item()), par.append(-1)
        level = list(range(k))
        for _r in range(rounds):
            expanded = sorted(level, key=lambda c: (-sc[c], c))[:k]
            level = []
            for p_ in expanded:
                for _ in range(k):
                    c = len(sc)
                    sc.append(sc[p_] + lp[c].item()), par.append(p_), level.append(c)
        scores.append(sc), parents.append(par)
    tokens = torch.randint(0, 5000, (B, len(scores[0])), generator=g)
    roots, bases = torch.randint(0, 5000, (2, B), generator=g)
    return torch.tensor(scores), tokens, torch.tensor(parents), roots, bases


def test_tree_select_reference_keeps_the_best_candidates_with_their_ancestors():
    scores, tokens, parents, root, base = _candidates(3, 3, 2)
    node_tokens, node_parents, depth, anc, positions = tree_select_torch(scores, tokens, parents, root, base, 9, 3)
    assert torch.equal(positions, base.view(3, 1) + depth)
    assert node_tokens[:, 0].tolist() == root.tolist() and node_parents[:, 0].tolist() == [-1] * 3
    for b in range(3):
        row = scores[b].tolist()
        kept = sorted(sorted(range(len(row)), key=lambda c: (-row[c], c))[:8])
        assert node_tokens[b, 1:].tolist() == [tokens[b, c].item() for c in kept]
        for i, c in enumerate(kept, start=1):
            p_ = parents[b, c].item()
            assert node_parents[b, i].item() == (0 if p_ < 0 else kept.index(p_) + 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,rounds,total,max_depth", [(3, 2, 9, 3), (6, 3, 30, 4), (8, 5, 60, 6), (2, 1, 3, 2)])
def test_tree_select_triton_matches_reference(device, k, rounds, total, max_depth):
    args = [t.to(_dev(device)) for t in _candidates(3, k, rounds, seed=k)]
    args[4] = torch.stack([args[4], -args[4]], dim=1)[:, 0]  # base strided, as select_tree's columns[:, 0]
    got = tree_select_triton(*args, total, max_depth)
    want = tree_select_torch(*args, total, max_depth)
    assert len(got) == len(want) == 5
    for name, g_, w_ in zip(("tokens", "parents", "depth", "ancestors", "positions"), got, want):
        assert g_.dtype == w_.dtype and torch.equal(g_, w_), name


@pytest.mark.parametrize("device", DEVICES)
def test_tree_select_triton_refuses_more_nodes_than_candidates(device):
    args = [t.to(_dev(device)) for t in _candidates(1, 2, 1)]
    with pytest.raises(ValueError, match="7 draft nodes of 6 candidates"):
        tree_select_triton(*args, 8, 2)


def test_tree_select_dispatches_to_the_reference_on_cpu():
    args = _candidates(2, 3, 2)
    for g_, w_ in zip(tree_select(*args, 9, 3), tree_select_torch(*args, 9, 3)):
        assert torch.equal(g_, w_)


# --- tree_accept_greedy (an EAGLE-2 tree's greedy acceptance) -------------------------------

from eagle_zoo.kernels import tree_accept_greedy, tree_accept_greedy_torch, tree_accept_greedy_triton  # noqa: E402


def _accept_problem(device, seed=0):
    """Trees from tree_select over random candidates, and target choices that follow each
    tree's nodes to a random depth (every depth from none to the deepest, over the rows)."""
    from eagle_zoo.kernels.tree_select import tree_select_torch

    g = torch.Generator().manual_seed(seed)
    scores, tokens, parents, _, base = _candidates(8, 4, 3, seed=seed)
    distinct = torch.arange(tokens.shape[1]).expand_as(tokens)  # siblings hold distinct tokens, as top-k gives
    root = torch.zeros(8, dtype=torch.long)
    node_tokens, node_parents, depth, anc, _ = tree_select_torch(scores, distinct, parents, root, base, 20, 4)
    argmax = torch.randint(0, tokens.shape[1], node_tokens.shape, generator=g)
    for b in range(8):  # row b: the target agrees along one leaf's path up to depth b % 5
        leaf = int(depth[b].argmax())
        path = [n for n in anc[b, leaf].tolist() if n >= 0]
        for level in range(1, min(b % 5, len(path) - 1) + 1):
            argmax[b, path[level - 1]] = node_tokens[b, path[level]]
    return [t.to(device) for t in (argmax, node_tokens, node_parents, depth, anc)]


def test_tree_accept_greedy_reference_accepts_the_agreeing_path():
    argmax, tokens, parents, depth, anc = _accept_problem("cpu")
    emitted, accepted, path = tree_accept_greedy_torch(argmax, tokens, parents, depth, anc)
    for b in range(8):
        node, walked = 0, [0]
        while True:  # from the root, the child whose token the target chose after the node
            kids = [c for c in range(tokens.shape[1]) if parents[b, c] == node and tokens[b, c] == argmax[b, node]]
            if not kids:
                break
            node = kids[0]
            walked.append(node)
        assert accepted[b].item() == len(walked) - 1
        want = [tokens[b, n].item() for n in walked[1:]] + [argmax[b, node].item()]
        assert emitted[b].tolist() == want + [-1] * (5 - len(want))
        assert path[b].tolist() == walked + list(range(len(walked), 5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_accept_greedy_triton_matches_reference(device, seed):
    args = _accept_problem(_dev(device), seed)
    for g_, w_ in zip(tree_accept_greedy_triton(*args), tree_accept_greedy_torch(*args)):
        assert g_.dtype == w_.dtype and torch.equal(g_, w_)


def test_tree_accept_greedy_dispatches_to_the_reference_on_cpu():
    args = _accept_problem("cpu")
    for g_, w_ in zip(tree_accept_greedy(*args), tree_accept_greedy_torch(*args)):
        assert torch.equal(g_, w_)


# --- chain_accept_greedy (a chain of drafts' greedy acceptance) -------------------------------

from eagle_zoo.kernels import chain_accept_greedy, chain_accept_greedy_torch, chain_accept_greedy_triton  # noqa: E402


def _chain_problem(device, B=16, K=4, seed=0):
    """Target choices and drafts that agree for runs of every length."""
    g = torch.Generator().manual_seed(seed)
    argmax = torch.randint(0, 50, (B, K + 1), generator=g)
    agree = torch.rand(B, K, generator=g) < 0.7
    drafts = torch.where(agree, argmax[:, :K], (argmax[:, :K] + 1) % 50)
    num_draft = torch.randint(0, K + 1, (B,), generator=g)
    return argmax.to(device), drafts.to(device), num_draft.to(device)


def test_chain_accept_greedy_reference_stops_at_the_first_disagreement():
    argmax, drafts, num_draft = _chain_problem("cpu")
    for n in (None, num_draft):
        tokens, accepted = chain_accept_greedy_torch(argmax, drafts, n)
        for b in range(16):
            limit = 4 if n is None else int(n[b])
            a = 0
            while a < limit and drafts[b, a] == argmax[b, a]:
                a += 1
            assert accepted[b].item() == a
            assert tokens[b].tolist() == argmax[b, : a + 1].tolist() + [-1] * (4 - a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K", [0, 1, 3, 7])
def test_chain_accept_greedy_triton_matches_reference(device, K):
    argmax, drafts, num_draft = _chain_problem(_dev(device), K=K, seed=K)
    for n in (None, num_draft):
        for g_, w_ in zip(chain_accept_greedy_triton(argmax, drafts, n), chain_accept_greedy_torch(argmax, drafts, n)):
            assert g_.dtype == w_.dtype and torch.equal(g_, w_)


def test_chain_accept_greedy_dispatches_to_the_reference_on_cpu():
    args = _chain_problem("cpu")
    for g_, w_ in zip(chain_accept_greedy(*args), chain_accept_greedy_torch(*args)):
        assert torch.equal(g_, w_)


# --- step_outputs (a step's read-back row and the next step's inputs) ---------------------

from eagle_zoo.kernels.step_outputs import step_outputs, step_outputs_torch, step_outputs_triton  # noqa: E402


def _step_problem(device, B=6, T=4, seed=0):
    """A step's emitted tokens (-1 past each row's accepted drafts), the last row a padding
    row of scratch slot 9."""
    g = torch.Generator().manual_seed(seed)
    accepted = torch.randint(0, T, (B,), generator=g)
    tokens = torch.randint(0, 50, (B, T), generator=g)
    tokens = torch.where(torch.arange(T) <= accepted[:, None], tokens, -1)
    base = torch.randint(0, 100, (B,), generator=g)
    slots = torch.arange(B)
    slots[-1] = 9
    drafted = torch.randint(0, T, (B,), generator=g)
    return [t.to(device) for t in (tokens, accepted, base, slots, drafted)]


def test_step_outputs_reference_gives_the_row_the_last_token_and_the_next_length():
    tokens, accepted, base, slots, drafted = _step_problem("cpu")
    out, last, nxt = step_outputs_torch(tokens, accepted, 3, base, slots, 9)
    for b in range(6):
        a = int(accepted[b])
        assert out[b].tolist() == tokens[b].tolist() + [a, 3]
        assert last[b, 0].item() == tokens[b, a].item() != -1
        assert nxt[b].item() == (0 if b == 5 else int(base[b]) + a + 1)  # the padding row stays at 0
    out, _, _ = step_outputs_torch(tokens, accepted, drafted, base, slots, 9)
    assert out[:, -1].tolist() == drafted.tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 4, 7])
def test_step_outputs_triton_matches_reference(device, T):
    tokens, accepted, base, slots, drafted = _step_problem(_dev(device), T=T, seed=T)
    for d in (T - 1, drafted):
        got, want = step_outputs_triton(tokens, accepted, d, base, slots, 9), \
            step_outputs_torch(tokens, accepted, d, base, slots, 9)
        for g_, w_ in zip(got, want):
            assert g_.dtype == w_.dtype and torch.equal(g_, w_)


@pytest.mark.parametrize("device", DEVICES)
def test_step_outputs_into_a_steps_own_inputs(device):
    """A step graph's form: next_last and next_base written over column 0 of its own
    input_ids and positions ([B, T] buffers, strided columns), which base is read from."""
    tokens, accepted, base, slots, _ = _step_problem(_dev(device), T=3)
    want = step_outputs_torch(tokens, accepted, 2, base, slots, 9)
    ids = torch.zeros(6, 3, dtype=torch.long, device=tokens.device)
    positions = base[:, None] + torch.arange(3, device=tokens.device)
    out, last, nxt = step_outputs_triton(tokens, accepted, 2, positions[:, 0], slots, 9,
                                         into=(ids[:, :1], positions[:, 0]))
    assert torch.equal(out, want[0]) and torch.equal(ids[:, :1], want[1]) and torch.equal(positions[:, 0], want[2])
    assert last.data_ptr() == ids.data_ptr() and nxt.data_ptr() == positions.data_ptr()
    assert torch.equal(positions[:, 1:], (base[:, None] + torch.arange(1, 3, device=tokens.device)))


def test_step_outputs_dispatches_to_the_reference_on_cpu():
    tokens, accepted, base, slots, _ = _step_problem("cpu")
    for g_, w_ in zip(step_outputs(tokens, accepted, 2, base, slots, 9),
                      step_outputs_torch(tokens, accepted, 2, base, slots, 9)):
        assert torch.equal(g_, w_)


# --- tree_compact (a tree step's accepted path moved into chain order) ---------------------

from eagle_zoo.kernels.tree_compact import tree_compact, tree_compact_torch, tree_compact_triton  # noqa: E402


def _compact_problem(device, dtype=torch.float32, G=6, n_kv=3, d=5):
    """Caches of G layer-and-k/v rows and three sequences: one whose level-1 node (2) sits
    where level 2 is written, one whose path is already in place (nothing accepted), one
    in a scratch-like last slot with a deep path."""
    g = torch.Generator().manual_seed(5)
    caches = torch.randn(G, 4, 24, n_kv, d, generator=g).to(device, dtype)
    slots = torch.tensor([1, 0, 3], device=device)
    base = torch.tensor([2, 4, 9], device=device)
    path = torch.tensor([[0, 2, 5, 3], [0, 1, 2, 3], [0, 3, 7, 11]], device=device)
    return caches, slots, base, path


def test_tree_compact_reference_moves_each_level_into_place():
    caches, slots, base, path = _compact_problem("cpu")
    before = caches.clone()
    tree_compact_torch(caches, slots, base, path)
    want = before.clone()
    for b in range(3):
        s, c = int(slots[b]), int(base[b])
        for lvl in range(1, 4):
            want[:, s, c + lvl] = before[:, s, c + int(path[b, lvl])]  # every source read before the writes
    assert torch.equal(caches, want)
    assert not torch.equal(caches, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_compact_triton_matches_reference(device, dtype):
    caches, slots, base, path = _compact_problem(_dev(device), dtype)
    want = caches.clone()
    tree_compact_torch(want, slots, base, path)
    # slots and base as strided columns, as a step graph holds them
    wide = torch.stack([slots, base], dim=1)
    tree_compact_triton(caches, wide[:, 0], wide[:, 1], path)
    assert torch.equal(caches, want)


def _dispatches_in_place_to_the_reference(dispatcher, reference, args):
    """An in-place kernel's dispatcher on CPU tensors writes what its reference writes
    into args[0]."""
    want = args[0].clone()
    reference(want, *args[1:])
    dispatcher(*args)
    assert torch.equal(args[0], want)


def test_tree_compact_dispatches_to_the_reference_on_cpu():
    _dispatches_in_place_to_the_reference(tree_compact, tree_compact_torch, _compact_problem("cpu"))


# --- scatter_row (a catch-up's output at each sequence's last accepted position) ------------

from eagle_zoo.kernels.scatter_row import scatter_row, scatter_row_torch, scatter_row_triton  # noqa: E402


def _scatter_problem(device, dtype=torch.bfloat16, H=576):
    g = torch.Generator().manual_seed(7)
    dst = torch.randn(6, H, generator=g).to(device, dtype)
    src = torch.randn(3, 5, H, generator=g).to(device, dtype)
    return dst, torch.tensor([4, 0, 2], device=device), src, torch.tensor([2, 0, 4], device=device)


def test_scatter_row_reference_stores_each_sequences_row_at_its_slot():
    dst, slots, src, index = _scatter_problem("cpu")
    before = dst.clone()
    scatter_row_torch(dst, slots, src, index)
    for b, (s, t) in enumerate(zip(slots.tolist(), index.tolist())):
        assert torch.equal(dst[s], src[b, t])
    assert torch.equal(dst[[1, 3, 5]], before[[1, 3, 5]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,H", [(torch.bfloat16, 576), (torch.float32, 100)])
def test_scatter_row_triton_matches_reference(device, dtype, H):
    dst, slots, src, index = _scatter_problem(_dev(device), dtype, H)
    want = dst.clone()
    scatter_row_torch(want, slots, src, index)
    scatter_row_triton(dst, slots, src, index.view(-1, 1)[:, 0])  # the chain's [B, 1] counts, viewed
    assert torch.equal(dst, want)


def test_scatter_row_dispatches_to_the_reference_on_cpu():
    _dispatches_in_place_to_the_reference(scatter_row, scatter_row_torch, _scatter_problem("cpu"))


# --- embedding (token ids to rows of a table) ----------------------------------------------

from eagle_zoo.kernels.embedding import embedding, embedding_torch, embedding_triton  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,H", [(torch.bfloat16, 576), (torch.float32, 100)])
def test_embedding_triton_matches_reference(device, dtype, H):
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(300, H, generator=g).to(_dev(device), dtype)
    ids = torch.randint(0, 300, (3, 7), generator=g).to(weight.device)
    ids[0, 0], ids[2, 6] = 0, 299  # the table's first and last rows
    assert torch.equal(embedding_triton(ids, weight), embedding_torch(ids, weight))
    column = torch.stack([ids[:, 0], ids[:, 1]], dim=1)[:, :1]  # a strided [B, 1] column, as a step graph holds ids
    assert torch.equal(embedding_triton(column, weight), weight[column])


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_triton_gives_zeros_for_ids_past_the_table(device):
    weight = torch.randn(10, 8).to(_dev(device))
    out = embedding_triton(torch.tensor([[3, 10, 12]], device=weight.device), weight)
    assert torch.equal(out[0, 0], weight[3]) and not out[0, 1:].any()


def test_embedding_dispatches_to_the_reference_on_cpu():
    weight = torch.randn(10, 8)
    ids = torch.tensor([[1, 9], [0, 4]])
    assert torch.equal(embedding(ids, weight), F.embedding(ids, weight))
    with pytest.raises(IndexError):
        embedding(torch.tensor([10]), weight)


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_gives_zeros_for_padding_in_both_forms(device):
    """A catch-up's tokens past the accepted run are -1: both forms give zero rows there
    and the table's rows elsewhere."""
    weight = torch.randn(10, 8).to(_dev(device))
    ids = torch.tensor([[3, 0, -1, -1]], device=weight.device)
    for out in (embedding_torch(ids, weight), embedding_triton(ids, weight)):
        assert torch.equal(out[0, :2], weight[[3, 0]]) and not out[0, 2:].any()


# --- gather_rows (rows of several tensors side by side) ----------------------------------------

from eagle_zoo.kernels.gather_rows import gather_rows, gather_rows_torch, gather_rows_triton  # noqa: E402


def _gather_problem(device, dtype=torch.bfloat16, H=576, S=3):
    """S streams [B = 2, N = 7, H] and a path of T = 4 node rows per sequence (a tree's
    accepted path, the level number itself past its end)."""
    g = torch.Generator().manual_seed(9)
    sources = [torch.randn(2, 7, H, generator=g).to(device, dtype) for _ in range(S)]
    return sources, torch.tensor([[0, 3, 6, 3], [0, 1, 2, 3]], device=device)


def test_gather_rows_reference_puts_each_rows_streams_side_by_side():
    sources, rows = _gather_problem("cpu", H=8)
    out = gather_rows_torch(sources, rows)
    assert out.shape == (2, 4, 24)
    for b in range(2):
        for t, n in enumerate(rows[b].tolist()):
            assert torch.equal(out[b, t], torch.cat([s[b, n] for s in sources]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,H,S", [(torch.bfloat16, 576, 3), (torch.float32, 100, 1), (torch.bfloat16, 64, 2)])
def test_gather_rows_triton_matches_reference(device, dtype, H, S):
    sources, rows = _gather_problem(_dev(device), dtype, H, S)
    assert torch.equal(gather_rows_triton(sources, rows), gather_rows_torch(sources, rows))
    strided = torch.stack([rows, rows], dim=2)[..., 0]  # a path view of any strides
    assert torch.equal(gather_rows_triton(sources, strided), gather_rows_torch(sources, rows))


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rows_triton_refuses_sources_it_cannot_take(device):
    sources, rows = _gather_problem(_dev(device), H=8, S=4)
    with pytest.raises(ValueError, match="4 sources"):
        gather_rows_triton(sources, rows)
    with pytest.raises(ValueError, match="share shape"):
        gather_rows_triton([sources[0], sources[1].float()], rows)


def test_gather_rows_dispatches_to_the_reference_on_cpu():
    sources, rows = _gather_problem("cpu")
    assert torch.equal(gather_rows(sources, rows), gather_rows_torch(sources, rows))
