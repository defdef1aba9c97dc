"""Decode / verification attention over the KV cache (flash-decoding with fixed splits).

cache_attention(q [B,T,H,d_k], k_cache [S,max_len,n_kv,d_k], v_cache [S,max_len,n_kv,d_v],
slot_ids [B], cache_positions [B,T], kv_len, scale, attn_mask=None, window=None)
-> [B,T,H,d_v] in q's dtype. Query (b, t) attends to row slot_ids[b], keys [0, kv_len):
  attn_mask None: key j visible iff j <= cache_positions[b,t] and, with a window,
                  cache_positions[b,t] - j < window;
  attn_mask [B,T,L>=kv_len] bool: exactly the True keys (the caller folds causality and
                  any window into it; the contract of eagle_zoo/models/attention.py).
Head h reads kv head h // (H // n_kv) (GQA). A query that sees no key gets zeros.
The cache must hold finite values in [0, kv_len) (it is allocated with zeros): a
masked key's value still enters the product with weight 0, and 0 * nan = nan.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, tl, triton, use_triton


def _check(q, k_cache, v_cache, attn_mask, kv_len, tree=None):
    if tree is not None and attn_mask is not None:
        raise ValueError("cache_attention: give a tree pass's keys as tree or as attn_mask, not both")
    B, T, H, d = q.shape
    n_kv = k_cache.shape[2]
    if H % n_kv or k_cache.shape[-1] != d or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"cache_attention: q {tuple(q.shape)} needs heads a multiple of k_cache's kv heads and "
                         f"the same head dim; k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if attn_mask is not None and (attn_mask.dtype != torch.bool or attn_mask.shape[:2] != (B, T)
                                  or attn_mask.shape[2] < min(kv_len, k_cache.shape[1])):
        raise ValueError(f"cache_attention: attn_mask must be bool [B={B}, T={T}, L>=kv_len={kv_len}], "
                         f"got {attn_mask.dtype} {tuple(attn_mask.shape)}")


def visible_keys(cache_positions, kv_len: int, attn_mask=None, window: Optional[int] = None):
    """[B,T,kv_len] bool: which keys each query may attend to (the rule in the module doc)."""
    if attn_mask is not None:
        return attn_mask[:, :, :kv_len]
    diff = cache_positions.unsqueeze(-1) - torch.arange(kv_len, device=cache_positions.device)
    vis = diff >= 0
    return vis & (diff < window) if window is not None else vis


def tree_visibility(tree, kv_len: int) -> torch.Tensor:
    """[B,T,kv_len] bool: the keys each node of an EAGLE-2 tree pass sees, from the tree's
    key walk (cache_attention_triton's ``tree``: positions [B,T], base [B], ancestors
    [B,T,L]): the history, columns [0, base), and the column base + ancestors[b,t,l] of
    each level l up to the node's own (positions - base)."""
    positions, base, ancestors = tree
    B, T, L = ancestors.shape
    levels = torch.arange(L, device=base.device)
    on_path = levels <= (positions - base.view(B, 1)).unsqueeze(-1)  # [B,T,L]
    columns = torch.where(on_path, base.view(B, 1, 1) + ancestors.clamp(min=0), kv_len).clamp(max=kv_len)
    seen = torch.zeros(B, T, kv_len + 1, dtype=torch.bool, device=base.device)  # column kv_len: off the path
    seen.scatter_(2, columns, True)
    history = torch.arange(kv_len, device=base.device) < base.view(B, 1, 1)
    return seen[..., :kv_len] | history


def cache_attention_torch(q, k_cache, v_cache, slot_ids, cache_positions, kv_len, scale,
                          attn_mask=None, window=None):
    """Reference: gather the rows, dense masked softmax in fp32."""
    _check(q, k_cache, v_cache, attn_mask, kv_len)
    G = q.shape[2] // k_cache.shape[2]
    k = k_cache[slot_ids, :kv_len].float().repeat_interleave(G, dim=2)  # [B,L,H,d]
    v = v_cache[slot_ids, :kv_len].float().repeat_interleave(G, dim=2)
    vis = visible_keys(cache_positions, k.shape[1], attn_mask, window).unsqueeze(1)  # [B,1,T,L]
    scores = torch.einsum("bthd,blhd->bhtl", q.float(), k) * scale
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
    probs = torch.where(vis.any(-1, keepdim=True), probs, 0.0)  # no visible key: zeros, not nan
    return torch.einsum("bhtl,blhd->bthd", probs, v).to(q.dtype)


# --- Triton -------------------------------------------------------------------------
# How the reduction order is fixed (batch invariance). A query row's result must not
# depend on B, T, the other rows, or kv_len (the batch's longest sequence):
# * Keys are cut into splits at absolute offsets s*SPLIT (SPLIT a constant, never chosen
#   from B or the GPU's occupancy as adaptive flash-decoding does); each split is walked
#   block by block (BLOCK_N keys, from its start) with an online softmax in fp32.
# * Splits are merged by a second kernel in index order, _MERGE_CHUNK splits at a time
#   (chunks at absolute offsets, each reduced in one fixed tree), up to the split holding
#   the query's position where no mask is given (the later ones are empty).
# * Every tile has the same shape (BLOCK_M query rows of one kv head, rows = (t, group
#   head) flattened, padded) and the same num_warps, so each row's dot products and
#   row reductions run the same instructions whichever tile or position it sits in.
# * A block or split with no key visible to a row is an exact no-op for that row:
#   m stays, alpha = exp2(0) = 1, p = 0, l + 0 = l, acc + 0 = acc. So blocks skipped for
#   the whole tile, extra masked blocks kept because another row needs them, and extra
#   empty splits from a larger kv_len change no bit.
# Not invariant across dtypes, head dims, SPLIT / BLOCK_* / num_warps, or GPU models.
_BLOCK_M, _SPLIT, _NUM_WARPS, _MERGE_CHUNK = 16, 128, 4, 8


def default_block_n(dtype: torch.dtype, dk: int, dv: int) -> int:
    """Keys a split walks a block: a split of 128 in one block for 16-bit heads of up to 64
    dims (SmolLM2's: the walk is the split kernel's critical path); else 64 (a block of 128
    fp32 keys and values of 128 dims asks 272 KiB of shared memory, over an H100's 227 KiB;
    16-bit heads of more than 64 dims were not timed with 128)."""
    return 128 if dtype in (torch.float16, torch.bfloat16) and max(dk, dv) <= 64 else 64


@triton.jit(do_not_specialize=["T", "n_split", "kv_len", "window", "n_levels", "tree_splits", "spb"])
def _attn_split_kernel(Q, K, V, SLOT, POS, MASK, ACC, M, L, BASE, ANC,
                       T, H, G, n_kv, n_mtiles, n_split, kv_len, window, scale_log2e, n_levels, tree_splits,
                       sqb, sqt, sqh, sqd, sks, skl, skh, skd, svs, svl, svh, svd,
                       ssb, spb, spt, smb, smt, sml, sbb, sab, sat, sal,
                       HAS_MASK: tl.constexpr, HAS_WINDOW: tl.constexpr, TREE: tl.constexpr, IEEE: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    if TREE:
        # Grid (b x kv head, history programs then node programs). A split of history alone
        # (below base): every node sees the same keys, so its row tiles (n_mtiles) take the
        # nodes' rows together, as a verification's do. A split reaching the tree's columns:
        # one program per node and split (tree_splits: the most a node's path can reach),
        # its group heads in rows 0..G-1 (a decode step's tile), walking its own ancestors
        # (the loop below). So no program is launched for a (tile, split) pair that has
        # nothing to do: T x n_split of them for a graph's whole cache row.
        pid = tl.program_id(0)
        kvh = pid % n_kv
        b = pid // n_kv
        base = tl.load(BASE + b * sbb).to(tl.int32)
        j = tl.program_id(1)
        n_hist = n_mtiles * n_split
        if j < n_hist:
            mt = j % n_mtiles
            s = j // n_mtiles
            lo = s * SPLIT
            if lo + SPLIT > base:  # a node program's split
                return
            rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # (t, group head) flattened
            row_ok = rows < T * G
            t = rows // G
            h = kvh * G + rows % G
        else:
            mt = (j - n_hist) // tree_splits  # the node
            s = base // SPLIT + (j - n_hist) % tree_splits
            if s >= n_split:  # past the keys (a padding row's garbage base): no partials to write
                return
            lo = s * SPLIT
            head = tl.arange(0, BLOCK_M)
            row_ok = head < G
            t = mt + head * 0
            h = kvh * G + head
    else:
        pid = tl.program_id(0)  # (b, kv head, row tile)
        s = tl.program_id(1)    # key split
        mt = pid % n_mtiles
        kvh = (pid // n_mtiles) % n_kv
        b = pid // (n_mtiles * n_kv)
        lo = s * SPLIT
        rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # (t, group head) flattened, BLOCK_M a tile
        row_ok = rows < T * G
        t = rows // G
        h = kvh * G + rows % G
    pos = tl.load(POS + b * spb + t * spt, mask=row_ok, other=-1).to(tl.int32)
    if not HAS_MASK:
        if lo > tl.max(pos):
            # No row sees a key of this split, and the merge reads no split past a row's
            # position: nothing to compute or store (a captured graph's kv_len is the cache's
            # length, so most splits of a short sequence end here).
            return
    slot = tl.load(SLOT + b * ssb).to(tl.int64)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * sqb + t[:, None] * sqt + h[:, None] * sqh + dk[None, :] * sqd,
                mask=row_ok[:, None] & (dk[None, :] < DK), other=0.0)
    k_base = K + slot * sks + kvh * skh
    v_base = V + slot * svs + kvh * svh

    hi = tl.minimum(lo + SPLIT, kv_len)
    if not HAS_MASK:  # skip blocks no row of the tile can see (exact no-ops, see above)
        hi = tl.minimum(hi, tl.max(pos) + 1)
        if HAS_WINDOW:
            first = tl.min(tl.where(row_ok, pos, 2147483647)) - window + 1
            lo = lo + (tl.maximum(first - lo, 0) // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < kv_len
        kcols = cols
        if TREE:
            # Key j is the key at position j of this node's path: the history below base,
            # then its ancestors level by level (root at base). Their cache columns are the
            # nodes' own; walking them in position order gives the blocks and order of a
            # decode step at this position, so the same bits as plain decoding.
            level = cols - base
            tail = (level >= 0) & (level < n_levels)
            node = tl.load(ANC + b * sab + mt * sat + level * sal, mask=tail, other=0)
            kcols = tl.where(tail, base + tl.maximum(node, 0), cols)
        k = tl.load(k_base + kcols[None, :] * skl + dk[:, None] * skd,
                    mask=col_ok[None, :] & (dk[:, None] < DK), other=0.0).to(q.dtype)
        if IEEE:  # fp32 inputs: no tf32 rounding
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        vis = row_ok[:, None] & col_ok[None, :]
        if HAS_MASK:
            vis &= tl.load(MASK + b * smb + t[:, None] * smt + cols[None, :] * sml, mask=vis, other=0) != 0
        else:
            vis &= cols[None, :] <= pos[:, None]
            if HAS_WINDOW:
                vis &= (pos[:, None] - cols[None, :]) < window
        sc = tl.where(vis, qk * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: keep exp2 finite
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(sc - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + kcols[:, None] * svl + dv[None, :] * svd,
                    mask=col_ok[:, None] & (dv[None, :] < DV), other=0.0).to(q.dtype)
        if IEEE:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    part = ((b * T + t) * H + h) * n_split + s  # partials [B,T,H,n_split(,DV)]
    tl.store(M + part, m_i, mask=row_ok)
    tl.store(L + part, l_i, mask=row_ok)
    tl.store(ACC + part[:, None] * DV + dv[None, :], acc, mask=row_ok[:, None] & (dv[None, :] < DV))


@triton.jit(do_not_specialize=["n_split"])
def _attn_merge_kernel(ACC, M, L, O, POS, T, H, n_split, sob, sot, soh, sod, spb, spt,
                       DV: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
                       BY_POSITION: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)  # (b, t, h)
    h = pid % H
    t = (pid // H) % T
    b = pid // (H * T)
    dv = tl.arange(0, BLOCK_DV)
    dmask = dv < DV
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    last = n_split
    if BY_POSITION:
        # A query sees no key past its position, so the splits after the one holding it are
        # empty: skipping them changes no bit, and the loop does not grow with the cache
        # length a captured graph's kv_len stands for.
        pos = tl.load(POS + b * spb + t * spt).to(tl.int32)
        last = tl.minimum(n_split, tl.maximum(pos, 0) // SPLIT + 1)
    # CHUNK splits at a time, at absolute offsets (a fixed order), their partials loaded
    # together, for long rows, where 128-key splits are many (not timed on its own:
    # BENCHMARKS.md's step costs time the 128-key change as a whole, at a few splits). A
    # split past `last`, or an empty one (m=-inf, l=0, acc=0), adds exact zeros.
    for c0 in range(0, last, CHUNK):
        s = c0 + tl.arange(0, CHUNK)
        ok = s < last
        ms = tl.load(M + pid * n_split + s, mask=ok, other=float("-inf"))
        ls = tl.load(L + pid * n_split + s, mask=ok, other=0.0)
        accs = tl.load(ACC + (pid * n_split + s)[:, None] * DV + dv[None, :], mask=ok[:, None] & dmask[None, :],
                       other=0.0)
        m_new = tl.maximum(m, tl.max(ms, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m - m_use)
        w = tl.exp2(ms - m_use)
        l = l * a + tl.sum(ls * w, 0)
        acc = acc * a + tl.sum(accs * w[:, None], 0)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)  # a query that saw no key: acc = 0 -> zeros
    tl.store(O + b * sob + t * sot + h * soh + dv * sod, out.to(O.dtype.element_ty), mask=dmask)


def cache_attention_triton(q, k_cache, v_cache, slot_ids, cache_positions, kv_len, scale,
                           attn_mask=None, window=None, *, tree=None, split_size: int = _SPLIT,
                           block_n: Optional[int] = None):
    """Triton version; split_size / block_n (default: default_block_n) are for tests (each
    value is its own fixed order).

    tree = (positions [B,T], base [B], ancestors [B,T,L]) for an EAGLE-2 tree pass whose
    node t sits at cache column cache_positions[b,t] with rope position positions[b,t] =
    base + its depth, ancestors[b,t,d] the column (less base) of its ancestor at level d,
    itself at its depth (a verified tree: node numbers, node 0 the root at column base;
    entries past its depth are not read): node t attends to the history [0, base) and its
    ancestors, walked in position order (see the kernel): a split reaching the tree's
    columns takes one token per tile, a split of history alone the nodes' rows together
    (as a verification's tiles do), so a node gets the bits a decode step at its position
    would. attn_mask is then not given; groups of more than 16 heads per kv head take the
    same keys as a mask (tree_visibility)."""
    _check(q, k_cache, v_cache, attn_mask, kv_len, tree)
    block_n = block_n or default_block_n(q.dtype, q.shape[-1], v_cache.shape[-1])
    if split_size % block_n:
        raise ValueError(f"cache_attention_triton: split_size {split_size} must be a multiple of block_n {block_n}")
    B, T, H, DK = q.shape
    n_kv, DV = k_cache.shape[2], v_cache.shape[-1]
    G = H // n_kv
    kv_len = min(int(kv_len), k_cache.shape[1])
    out = q.new_empty(B, T, H, DV)
    if B * T == 0:
        return out
    n_split = max(1, triton.cdiv(kv_len, split_size))
    acc = torch.empty(B, T, H, n_split, DV, device=q.device, dtype=torch.float32)
    m = torch.empty(B, T, H, n_split, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    use_tree = tree is not None and G <= _BLOCK_M
    n_mtiles = triton.cdiv(T * G, _BLOCK_M)
    grid = (B * n_kv * n_mtiles, n_split)
    if use_tree:
        cache_positions, base, anc = tree  # visibility by position, keys through the ancestors
        # A node's keys past the history, base .. base + its depth (< anc's levels), reach
        # at most this many splits.
        tree_splits = triton.cdiv(anc.shape[-1] - 1, split_size) + 1
        grid = (B * n_kv, n_mtiles * n_split + T * tree_splits)
    else:
        tree_splits = 0
        if tree is not None:
            attn_mask = tree_visibility(tree, kv_len)
        base, anc = slot_ids, cache_positions.unsqueeze(-1)  # dummies when unused
    mask = attn_mask.view(torch.uint8) if attn_mask is not None else cache_positions  # dummy when unused
    msk_strides = mask.stride() if attn_mask is not None else (0, 0, 0)
    _attn_split_kernel[grid](
        q, k_cache, v_cache, slot_ids, cache_positions, mask, acc, m, l, base, anc,
        T, H, G, n_kv, n_mtiles, n_split, kv_len, 0 if window is None else int(window),
        float(scale) * 1.4426950408889634,  # log2(e): exp2 instead of exp
        anc.shape[-1], tree_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), slot_ids.stride(0), *cache_positions.stride(),
        *msk_strides, base.stride(0), *anc.stride(),
        HAS_MASK=attn_mask is not None, HAS_WINDOW=window is not None, TREE=use_tree,
        IEEE=q.dtype == torch.float32,
        DK=DK, DV=DV, BLOCK_DK=max(16, triton.next_power_of_2(DK)), BLOCK_DV=max(16, triton.next_power_of_2(DV)),
        BLOCK_M=_BLOCK_M, BLOCK_N=block_n, SPLIT=split_size, num_warps=_NUM_WARPS, **pdl_launch(q),
    )
    _attn_merge_kernel[(B * T * H,)](
        acc, m, l, out, cache_positions, T, H, n_split, *out.stride(), *cache_positions.stride(),
        DV=DV, BLOCK_DV=triton.next_power_of_2(DV), SPLIT=split_size, CHUNK=_MERGE_CHUNK, BY_POSITION=attn_mask is None,
        num_warps=1, **pdl_launch(q),
    )
    return out


def cache_attention(q, k_cache, v_cache, slot_ids, cache_positions, kv_len: int, scale: float,
                    attn_mask: Optional[torch.Tensor] = None, window: Optional[int] = None,
                    tree=None) -> torch.Tensor:
    """Attention of new queries over the KV cache (module doc); an EAGLE-2 tree pass gives
    ``tree`` instead of attn_mask (cache_attention_triton). Triton on CUDA, else the
    reference (a tree as its mask, tree_visibility)."""
    if use_triton(q, k_cache):
        return cache_attention_triton(q, k_cache, v_cache, slot_ids, cache_positions, kv_len, scale,
                                      attn_mask, window, tree=tree)
    if tree is not None:
        _check(q, k_cache, v_cache, attn_mask, kv_len, tree)
        attn_mask = tree_visibility(tree, min(int(kv_len), k_cache.shape[1]))
    return cache_attention_torch(q, k_cache, v_cache, slot_ids, cache_positions, kv_len, scale, attn_mask, window)
