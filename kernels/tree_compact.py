"""An EAGLE-2 tree step's cache compaction, every layer's k and v in one launch.

tree_compact(caches [G, num_slots, max_len, n_kv, d], slots [B], base [B], path [B, T]):
for d = 1 .. T-1 and every g, caches[g, slots[b], base[b] + d] = caches[g, slots[b], base[b] + path[b, d]]
(G = layers x 2, the engine's stacked k/v caches, engine/cache.py). The node at level d of
the accepted path moves to the column a chain of the same tokens would have written, so
the cache looks as if the path had been decoded (eagle_zoo/engine/tree_verify.py).
A node's index is at least its level (path[b, d] >= d), so taking d upwards reads each
source before any write reaches it; past the accepted depth path[b, d] = d copies a
column onto itself.
Why: torch takes five launches for this (an arange, two adds, a gather and a scatter),
once per tree step.
"""
from __future__ import annotations

import torch

from ._triton import MAX_ROW, gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def tree_compact_torch(caches: torch.Tensor, slots: torch.Tensor, base: torch.Tensor, path: torch.Tensor) -> None:
    B, T = path.shape
    src = base.view(B, 1) + path[:, 1:]
    dst = base.view(B, 1) + torch.arange(1, T, device=path.device)
    rows = slots.view(B, 1).expand(B, T - 1)
    caches[:, rows, dst] = caches[:, rows, src]  # the gather copies every source first


@triton.jit(do_not_specialize=["T"])
def _tree_compact_kernel(C, SLOT, BASE, PATH, T, s_g, s_slot, s_col, s_slots, s_base, s_path, E,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the path is the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    # Program (g, b): sequence b's cache row of layer-and-k/v g, its columns in level order.
    g = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    row = C + g * s_g + tl.load(SLOT + b * s_slots).to(tl.int64) * s_slot
    base = tl.load(BASE + b * s_base).to(tl.int64)
    e = tl.arange(0, BLOCK)
    for d in range(1, T):
        src = base + tl.load(PATH + b * s_path + d).to(tl.int64)
        x = tl.load(row + src * s_col + e, mask=e < E)
        # Every thread has read level d's source before any writes a column: a later
        # level's destination can be this level's source.
        tl.debug_barrier()
        tl.store(row + (base + d) * s_col + e, x, mask=e < E)


def tree_compact_triton(caches: torch.Tensor, slots: torch.Tensor, base: torch.Tensor, path: torch.Tensor) -> None:
    G, _, _, n_kv, d = caches.shape
    B, T = path.shape
    if n_kv * d > MAX_ROW:
        raise ValueError(f"tree_compact_triton: cache columns of {n_kv} x {d} values, at most {MAX_ROW}")
    if B and T > 1:
        _tree_compact_kernel[(G, B)](
            caches, slots, base, path, T, caches.stride(0), caches.stride(1), caches.stride(2), slots.stride(0),
            base.stride(0), path.stride(0), n_kv * d, BLOCK=triton.next_power_of_2(n_kv * d), **pdl_launch(path))


def tree_compact(caches: torch.Tensor, slots: torch.Tensor, base: torch.Tensor, path: torch.Tensor) -> None:
    """Triton on CUDA for caches whose columns are contiguous and a path of unit stride
    along its levels; the reference otherwise (module doc)."""
    ok = (use_triton(caches, slots, base, path) and caches[0, 0, 0].is_contiguous()
          and caches.shape[-2] * caches.shape[-1] <= MAX_ROW and path.stride(1) == 1)
    (tree_compact_triton if ok else tree_compact_torch)(caches, slots, base, path)
