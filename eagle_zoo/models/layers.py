"""Shared building blocks: tensor-parallel linear layers, vocab embedding / lm head,
RMSNorm, rotary embedding and SiluAndMul.

Every parameter carries ``weight_loader(param, loaded, shard_id=None)``: it checks
the checkpoint tensor's (full, unsharded) shape, takes this rank's slice and, for
fused layers, copies it into the shard's rows. Shape problems raise ShapeMismatch,
which the loader turns into an error naming the file and key.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eagle_zoo.kernels import cpu_decode
from eagle_zoo.kernels._triton import needs_autograd
from eagle_zoo.kernels.activation import silu_and_mul, silu_and_mul_torch
from eagle_zoo.kernels.embedding import embedding
from eagle_zoo.kernels.linear import fp8_linear, fused_linear_triton, use_linear_kernel
from eagle_zoo.kernels.norm import rms_norm, rms_norm_torch
from eagle_zoo.kernels.rope import rope_angles, rope_neox_triton, rotate_qk_torch, signed_angles, use_rope_kernel

from . import parallel_state as ps
from .attention import get_context


class ShapeMismatch(ValueError):
    def __init__(self, expected, got, what: str = "tensor"):
        self.expected, self.got = tuple(expected), tuple(got)
        super().__init__(f"{what}: expected shape {self.expected}, got {self.got}")


def check_shape(loaded: torch.Tensor, expected: Sequence[int], what: str = "tensor") -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise ShapeMismatch(expected, loaded.shape, what)


@torch.no_grad()
def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor, shard_id: Any = None) -> None:
    """Plain copy for parameters and buffers that are neither sharded nor fused."""
    if shard_id is not None:
        raise ValueError(f"this parameter is not fused, but shard {shard_id!r} was given")
    check_shape(loaded, param.shape)
    param.data.copy_(loaded)


def _param(*shape: int) -> nn.Parameter:
    # Uninitialised like nano-vllm: weights come from a checkpoint (training code
    # initialises explicitly).
    return nn.Parameter(torch.empty(*shape))


# -- linear layers -------------------------------------------------------------

# On CPU, MKL computes x @ W^T for a few rows of x (decode T=1, verification T=k+1)
# through a general sgemm path that is up to 2x slower than (W @ x^T)^T on the same
# row-major weight (measured with SmolLM2 shapes: lm_head at 4 rows 22 -> 14 ms,
# the 30 layers' matmuls at 4 rows 56 -> 38 ms); at 8 rows they are about even, so
# verification of up to 5 drafts takes it and prefill does not. Only the float32 CPU
# path switches: CUDA keeps F.linear (cuBLAS, graph capture). Not bit-identical to
# F.linear (another summation order), like any change of BLAS kernel.
CPU_FEW_ROWS = 6


# Both paths below are the fallback: where kernels/cpu_decode.py builds (g++, AVX2), up to
# 8 rows go to its row-major dot products instead (~31 GB/s, batch invariant), and no
# column-major copies are made.
#
# One row (plain decoding, draft steps) is another story: MKL's matrix-vector product
# streams a row-major [out, in] weight at ~11 GB/s on this AMD CPU but the same matrix
# stored column-major at ~20 GB/s, for matrices at least as tall as wide (lm_head 8.7
# -> 5.1 ms, gate_up 18.7 -> 11.1 ms for 30 layers; down_proj, wider than tall, is not
# faster). Column-major is 2x slower at 4 rows, so the engine gives one-row calls a
# column-major *copy* (prepare_one_row_copies, called by engine/runner.py on CPU) and
# other calls keep the parameter (SmolLM2 decode step 55 -> 42 ms). The copies cost
# memory: at most CPU_ONE_ROW_COPY_BYTES in the process (0 turns them off).
CPU_ONE_ROW_COPY_BYTES = 1 << 30
_one_row_copies: dict[int, "weakref.ref[torch.Tensor]"] = {}


def _stamp(weight: torch.Tensor):
    # Training steps bump the version, .to() moves the data: a copy then no longer applies.
    return weight._version, weight.data_ptr(), weight.device, weight.dtype


def one_row_copy_bytes() -> int:
    """Bytes held by live column-major copies."""
    total = 0
    for key, ref in list(_one_row_copies.items()):
        w = ref()
        if w is None or getattr(w, "_one_row_copy", None) is None:
            del _one_row_copies[key]
        else:
            copy = w._one_row_copy[0]
            total += copy.numel() * copy.element_size()
    return total


@torch.no_grad()
def prepare_one_row_copies(module: nn.Module) -> int:
    """Column-major copies of the tall float32 CPU weights of ``module``'s linear layers
    and lm head, within the process budget; returns the bytes added. Call it after the
    weights are loaded (a copy made earlier is ignored, not refreshed, once they change
    through the parameter; loads through ``param.data`` are not seen: load first)."""
    added = 0
    if cpu_decode.available():  # the kernel reads row-major weights at full speed: no copies needed
        return added
    for m in module.modules():
        if not isinstance(m, (LinearBase, ParallelLMHead)):
            continue
        w = m.weight
        if w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2 or w.shape[0] < w.shape[1]:
            continue
        try:
            stamp = _stamp(w)
        except RuntimeError:  # an inference-mode tensor keeps no version: no copy
            continue
        cached = getattr(w, "_one_row_copy", None)
        if cached is not None and cached[1] == stamp:
            continue
        nbytes = w.numel() * w.element_size()
        if one_row_copy_bytes() + nbytes > CPU_ONE_ROW_COPY_BYTES:
            break
        w._one_row_copy = (w.detach().t().contiguous().t(), stamp)
        _one_row_copies[id(w)] = weakref.ref(w)
        added += nbytes
    return added


def _one_row_weight(weight: torch.Tensor) -> torch.Tensor:
    cached = getattr(weight, "_one_row_copy", None)
    if cached is None or (weight.requires_grad and torch.is_grad_enabled()) or cached[1] != _stamp(weight):
        return weight
    return cached[0]


def use_cpu_linear_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """kernels/cpu_decode.py's case: float32 CPU tensors, a contiguous 2-D weight, no
    autograd (the kernel has no backward), and the kernel built."""
    return (weight.dtype == torch.float32 and weight.dim() == 2 and weight.is_contiguous()
            and not needs_autograd(x, weight) and cpu_decode.available())


@torch.no_grad()
def add_exact_bf16_copies(module: nn.Module, keep: Sequence[torch.Tensor] = ()) -> int:
    """Give each float32 CPU weight of ``module``'s linear layers and lm heads whose every
    value is a bfloat16 value (a head shipped in bf16, run by a float32 engine) a bfloat16
    copy, which linear() hands kernels/cpu_decode.py for a few rows; returns the copies'
    bytes. The kernel reads it as its exact float32 values, so every product and sum is the
    float32 weight's, bit for bit, from half the bytes (a draft pass on two CPU cores is
    bound by reading its weights); larger calls keep the float32 weight. Not for weights in
    ``keep`` (the target's, which a head may share)."""
    return _add_exact_copies(module, "_bf16_copy", _exact_bf16, keep)


INT8_BLOCK = 32  # weights a scale of an int8 copy covers, along the input dimension


@torch.no_grad()
def add_exact_int8_copies(module: nn.Module) -> int:
    """Give each float32 CPU weight of ``module``'s linear layers and lm heads whose every
    block of INT8_BLOCK values along a row is exactly q * d (int8 q, one float32 d a block)
    an int8 copy (q, d), which linear() hands kernels/cpu_decode.py for a few rows; returns
    the copies' bytes. Such a weight is what a GGUF Q8_0 tensor dequantizes to (SmolLM2's
    tied embedding and lm_head: 113 MB read by every decode step on the CPU, a quarter of
    that as int8); the kernel multiplies back the same float32 values, so every product
    and sum is the float32 weight's, bit for bit."""
    return _add_exact_copies(module, "_int8_copy", _exact_int8)


Q4_BLOCK_BYTES = 24  # a 4-bit copy's bytes per INT8_BLOCK weights: 16 of q, d and m as float32


@torch.no_grad()
def add_exact_q4_copies(module: nn.Module) -> int:
    """Give each float32 CPU weight of ``module``'s linear layers and lm heads whose every
    block of INT8_BLOCK values along a row is exactly q * d + m (4-bit q, d and m float16
    values) a 4-bit copy (kernels/cpu_decode.py q4_blocks), which linear() and the decoder layers' C++ calls
    hand kernels/cpu_decode.py for a few rows; returns the copies' bytes. Such a weight is
    what a GGUF Q4_1 tensor dequantizes to (SmolLM2's decoder layers: 424 MB of float32
    read by every decode step on the CPU, 3/16 of that as 4-bit blocks); the kernel
    multiplies back the same float32 values, so every product and sum is the float32
    weight's, bit for bit."""
    return _add_exact_copies(module, "_q4_copy", _exact_q4)


def _add_exact_copies(module: nn.Module, attr: str, exact_copy, keep: Sequence[torch.Tensor] = ()) -> int:
    """Set ``attr`` of each float32 CPU weight of ``module``'s linear layers and lm heads
    (but those in ``keep``) to (exact_copy(w), w's stamp) where exact_copy gives one (a
    tensor or a tuple of them; None: the weight has none); returns the copies' bytes. Only
    where the kernel is built. Call it once the weights are loaded: a copy is dropped, not
    refreshed, once its weight changes (_current_copy)."""
    if not cpu_decode.available():
        return 0
    keep_ids = {id(t) for t in keep}
    added = 0
    for m in module.modules():
        if not isinstance(m, (LinearBase, ParallelLMHead)):
            continue
        w = m.weight
        if id(w) in keep_ids or w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2:
            continue
        copy = exact_copy(w)
        if copy is None:
            continue
        try:
            setattr(w, attr, (copy, _stamp(w)))
        except RuntimeError:  # an inference-mode tensor keeps no version: no copy
            continue
        added += sum(t.numel() * t.element_size() for t in (copy if isinstance(copy, tuple) else (copy,)))
    return added


def _exact_bf16(w: torch.Tensor) -> Optional[torch.Tensor]:
    copy = w.detach().to(torch.bfloat16)
    return copy if torch.equal(copy.float(), w) else None


def _exact_int8(w: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    if w.shape[1] % INT8_BLOCK or not w.is_contiguous() or exact_int8_blocks(w[:8]) is None:
        return None  # most weights that are not int8 blocks fail on their first rows, cheaply
    return exact_int8_blocks(w)


def exact_int8_blocks(w: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(q [N, K] int8, d [N, K / INT8_BLOCK] float32) with q * d == w exactly, block by
    block, or None: d the block's largest magnitude over 127 (Q8_0's scale), q the nearest
    integers of w / d (0 in all-zero blocks)."""
    blocks = w.view(w.shape[0], -1, INT8_BLOCK)
    d = blocks.abs().amax(-1) / 127
    q = (blocks / torch.where(d > 0, d, 1)[..., None]).round_().clamp_(-127, 127)
    if not torch.equal(q * d[..., None], blocks):
        return None
    return q.to(torch.int8).view(w.shape), d


def _exact_q4(w: torch.Tensor) -> Optional[torch.Tensor]:
    if w.shape[1] % INT8_BLOCK or not w.is_contiguous():
        return None
    return cpu_decode.q4_blocks(w)  # _add_exact_copies runs only where the kernels are built


def exact_q4_blocks_torch(w: torch.Tensor) -> Optional[torch.Tensor]:
    """The reference of kernels/cpu_decode.py q4_blocks, which the engine runs (one pass
    over a model's weights instead of a dozen): w [N, K] as 4-bit blocks, uint8
    [N, K / INT8_BLOCK * Q4_BLOCK_BYTES] (the layout
    kernels/csrc/cpu_decode.cpp's dot_rows_q4 reads: per block 16 bytes holding q[j] in
    byte j's low half and q[j + 16] in its high half, then d and m as float32), with
    q * d + m == w exactly, block by block, or None. m is the block's least value and d
    its range over 15 rounded to float16, Q4_1's scale and minimum (each block's least
    value is its q = 0), q the nearest integers of (w - m) / d."""
    blocks = w.view(w.shape[0], -1, INT8_BLOCK)
    m = blocks.amin(-1)
    d = ((blocks.amax(-1) - m) / 15).half().float()
    if not torch.equal(m.half().float(), m):
        return None
    q = ((blocks - m[..., None]) / torch.where(d > 0, d, 1)[..., None]).round_().clamp_(0, 15)
    if not torch.equal(q * d[..., None] + m[..., None], blocks):
        return None
    q = q.to(torch.uint8)
    half = INT8_BLOCK // 2
    nibbles = q[..., :half] | (q[..., half:] << 4)
    scales = torch.stack([d, m], -1).view(torch.uint8)  # [N, K / 32, 8]
    return torch.cat([nibbles, scales], -1).reshape(w.shape[0], -1).contiguous()


def _few_row_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight^T by the few-row kernel, from the weight's exact int8, 4-bit or
    bfloat16 copy while it is current (the same bits from fewer bytes), else the weight
    itself."""
    int8 = _current_copy(weight, "_int8_copy")
    if int8 is not None:
        return cpu_decode.few_row_linear_int8(x, *int8)
    return cpu_decode.few_row_linear(x, cpu_layer_weight(weight))


def has_exact_int8_copy(weight: torch.Tensor) -> bool:
    """Whether linear() reads ``weight`` from its exact int8 copy (add_exact_int8_copies)."""
    return _current_copy(weight, "_int8_copy") is not None


def cpu_layer_weight(weight: torch.Tensor) -> torch.Tensor:
    """What kernels/cpu_decode.py's decoder-layer calls read for ``weight``: its exact
    4-bit copy while current (a GGUF Q4_1 target's layers: the same bits from 3/16 of the
    bytes), else its exact bfloat16 copy (an EAGLE head's weights: from half the bytes),
    else the weight itself."""
    for attr in ("_q4_copy", "_bf16_copy"):
        copy = _current_copy(weight, attr)
        if copy is not None:
            return copy
    return weight


def _current_copy(weight: torch.Tensor, attr: str):
    cached = getattr(weight, attr, None)
    if cached is None or cached[1] != _stamp(weight):
        return None
    return cached[0]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias): on CUDA our kernel for a few rows, on CPU the faster
    formulations for a few rows. With scale, weight is fp8 with these row scales
    (models/quantization.py): kernels/linear.py fp8_linear."""
    if scale is not None:
        return fp8_linear(x, weight, scale, bias)
    if x.is_cuda:
        # A few rows (decode, verification, trees): our batch-invariant kernel, so a row
        # gets the same bits in any step (kernels/linear.py); more rows: cuBLAS.
        if use_linear_kernel(x, weight, bias):
            return fused_linear_triton(x, weight, bias)
        return F.linear(x, weight, bias)
    rows = x.numel() // max(x.shape[-1], 1)  # shapes only: no host sync
    if x.dtype == torch.float32 and 0 < rows <= cpu_decode.MAX_ROWS and use_cpu_linear_kernel(x, weight):
        # Our kernel (kernels/cpu_decode.py): the weights read at ~90% of the read
        # bandwidth, and a row's bits the same in plain decoding and in verification.
        y = _few_row_product(x.reshape(rows, x.shape[-1]), weight)
        y = y.view(*x.shape[:-1], weight.shape[0])
        return y if bias is None else y + bias
    if x.dtype != torch.float32 or not 0 < rows <= cpu_decode.MAX_ROWS:
        return F.linear(x, weight, bias)
    if rows > CPU_FEW_ROWS:
        return F.linear(x, weight, bias)
    if rows == 1:
        return F.linear(x, _one_row_weight(weight), bias)
    y = (weight @ x.reshape(rows, x.shape[-1]).t()).t()
    y = y.contiguous()  # [rows, out]: later splits and elementwise ops want rows contiguous
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class LinearBase(nn.Module):
    """y = x W^T + b with per-rank sizes; subclasses say how the full matrix is split."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.tp = ps.get_tp()  # the group this layer is built for; its collectives use it
        self.tp_rank, self.tp_size = self.tp.rank, self.tp.size
        self.input_size, self.output_size = input_size, output_size  # this rank's sizes
        self.weight = _param(output_size, input_size)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = _param(output_size)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)
        self.register_buffer("weight_scale", None)  # row scales of an fp8 weight (models/quantization.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.weight_scale)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, tp={self.tp_size}"


class ReplicatedLinear(LinearBase):
    """Same full matrix on every rank (EAGLE fc layers)."""

    @torch.no_grad()
    def weight_loader(self, param, loaded, shard_id=None):
        default_weight_loader(param, loaded, shard_id)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks (rows of W)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, ps.divide(output_size, ps.get_tp_size(), "output size"), bias)

    @torch.no_grad()
    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused, but shard {shard_id!r} was given")
        n = param.shape[0]
        check_shape(loaded, (n * self.tp_size, *param.shape[1:]))
        param.data.copy_(loaded.narrow(0, self.tp_rank * n, n))


class RowParallelLinear(LinearBase):
    """Input features split across ranks (columns of W); partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(ps.divide(input_size, ps.get_tp_size(), "input size"), output_size, bias)

    @torch.no_grad()
    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused, but shard {shard_id!r} was given")
        if param.dim() == 1:  # the bias is not split; only rank 0 adds it
            check_shape(loaded, param.shape)
            param.data.copy_(loaded)
            return
        n = param.shape[1]
        check_shape(loaded, (param.shape[0], n * self.tp_size))
        param.data.copy_(loaded.narrow(1, self.tp_rank * n, n))

    def forward(self, x):
        y = linear(x, self.weight, self.bias if self.tp_rank == 0 else None, self.weight_scale)
        return ps.all_reduce(y, self.tp)


class FusedColumnLinear(LinearBase):
    """Several column-parallel matrices stacked in one (q/k/v, gate/up).

    shards: shard_id -> (full_rows, local_rows, tp_index). A rank holds rows
    [tp_index * local_rows, +local_rows) of each full matrix, stacked in order.
    """

    def __init__(self, input_size: int, shards: dict[Any, tuple[int, int, int]], bias: bool):
        super().__init__(input_size, sum(local for _, local, _ in shards.values()), bias)
        self.shards, self.offsets, offset = shards, {}, 0
        for sid, (_, local, _) in shards.items():
            self.offsets[sid] = offset
            offset += local
        self.weight.shard_ids = tuple(shards)  # the loader reports shards never loaded
        if self.bias is not None:
            self.bias.shard_ids = tuple(shards)

    @torch.no_grad()
    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:  # an already-fused checkpoint tensor: split it into its shards
            full = [self.shards[s][0] for s in self.shards]
            check_shape(loaded, (sum(full), *param.shape[1:]), "fused tensor")
            for sid, part in zip(self.shards, loaded.split(full, 0)):
                self.weight_loader(param, part, sid)
            return
        if shard_id not in self.shards:
            raise ValueError(f"unknown shard {shard_id!r}; this layer has shards {list(self.shards)}")
        full, local, index = self.shards[shard_id]
        check_shape(loaded, (full, *param.shape[1:]), f"shard {shard_id!r}")
        param.data.narrow(0, self.offsets[shard_id], local).copy_(loaded.narrow(0, index * local, local))


class MergedColumnParallelLinear(FusedColumnLinear):
    """gate_up_proj: shards 0, 1, ... of the given full output sizes."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False):
        tp, rank = ps.get_tp_size(), ps.get_tp_rank()
        shards = {i: (n, ps.divide(n, tp, "output size"), rank) for i, n in enumerate(output_sizes)}
        super().__init__(input_size, shards, bias)


class QKVParallelLinear(FusedColumnLinear):
    """Fused q, k, v projections (shards "q", "k", "v").

    input_size may differ from the model's hidden size (EAGLE-3 attention reads 2H).
    With fewer kv heads than ranks, kv heads are replicated: each rank keeps one.
    """

    def __init__(self, input_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: Optional[int] = None, bias: bool = False):
        tp, rank = ps.get_tp_size(), ps.get_tp_rank()
        total_kv = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.num_heads = ps.divide(total_num_heads, tp, "number of attention heads")
        if total_kv >= tp:
            self.num_kv_heads, kv_index = ps.divide(total_kv, tp, "number of kv heads"), rank
        else:
            self.num_kv_heads, kv_index = 1, rank // ps.divide(tp, total_kv, "tp size over kv heads")
        q, kv = self.num_heads * head_size, self.num_kv_heads * head_size
        shards = {
            "q": (total_num_heads * head_size, q, rank),
            "k": (total_kv * head_size, kv, kv_index),
            "v": (total_kv * head_size, kv, kv_index),
        }
        super().__init__(input_size, shards, bias)
        self.q_size, self.kv_size = q, kv

    def split(self, qkv: torch.Tensor):
        """[..., q+2kv] -> q [..., heads, d], k, v [..., kv_heads, d]."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
        d = self.head_size
        return q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)), v.unflatten(-1, (-1, d))


# -- vocabulary ------------------------------------------------------------------


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split across ranks (padded to equal parts); lookups are all-reduced."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp = ps.get_tp()
        self.tp_rank, self.tp_size = self.tp.rank, self.tp.size
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.per_rank = -(-num_embeddings // self.tp_size)
        self.start = self.tp_rank * self.per_rank
        self.weight = _param(self.per_rank, embedding_dim)
        self.weight.weight_loader = self.weight_loader

    @torch.no_grad()
    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused, but shard {shard_id!r} was given")
        check_shape(loaded, (self.num_embeddings, self.embedding_dim))
        rows = loaded[self.start: self.start + self.per_rank]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        out = F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * inside.unsqueeze(-1)
        return ps.all_reduce(out, self.tp)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, tp={self.tp_size}"


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the vocabulary; each rank computes its rows, then they are gathered."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__(num_embeddings, embedding_dim)
        self.register_buffer("weight_scale", None)  # row scales of an fp8 weight (models/quantization.py)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = linear(h, self.weight, scale=self.weight_scale)
        if self.tp_size == 1:
            return logits
        return ps.all_gather(logits, -1, self.tp)[..., : self.num_embeddings]


# -- norms and activations --------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, scale in the input dtype (the convention of Llama checkpoints).
        # On CUDA one Triton kernel instead of seven (kernels/norm.py).
        if x.is_cuda:
            return rms_norm(x, self.weight, self.eps)
        if x.dtype == self.weight.dtype == torch.float32:
            rows = x.numel() // max(x.shape[-1], 1)
            if 0 < rows <= cpu_decode.MAX_ROWS and not needs_autograd(x, self.weight) and cpu_decode.available():
                # Decode steps: kernels/cpu_decode.py, one call instead of F.rms_norm's
                # internal ops (a SmolLM2 step on the CPU runs 61 norms; BENCHMARKS.md, CPU).
                y = cpu_decode.rms_norm_rows(x.reshape(rows, x.shape[-1]), self.weight, self.eps)
                return y.view(x.shape)
            # torch's fused op: the same bits as the reference in fp32 (tests/test_layers.py),
            # one op instead of seven.
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return rms_norm_torch(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class SiluAndMul(nn.Module):
    """silu(gate) * up for a [..., 2I] tensor holding gate then up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x) if x.is_cuda else silu_and_mul_torch(x)  # kernels/activation.py


# -- rotary embedding ---------------------------------------------------------------


def rope_parameters(config) -> dict:
    """The rope settings of a config as one flat dict with rope_type and rope_theta.

    Reads transformers-5 ``rope_parameters`` and the older ``rope_theta`` +
    ``rope_scaling`` (whose type key may be ``type``).
    """
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_type", params.get("type") or "default")
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    if params.get("partial_rotary_factor") is None and getattr(config, "partial_rotary_factor", None):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    return params


def _base_inv_freq(p: dict, dim: int, factor: float = 1.0) -> torch.Tensor:
    return 1.0 / (factor * p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def _rope_default(p, dim, max_pos):
    return _base_inv_freq(p, dim), 1.0


def _rope_linear(p, dim, max_pos):
    return _base_inv_freq(p, dim) / p["factor"], 1.0


def _rope_llama3(p, dim, max_pos):
    # Llama 3.1: long wavelengths slowed down by `factor`, short ones kept, a smooth
    # blend in between (bounds from low/high_freq_factor of the original context).
    inv_freq = _base_inv_freq(p, dim)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p.get("original_max_position_embeddings") or max_pos
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, out), 1.0


def _rope_yarn(p, dim, max_pos):
    # YaRN: per-frequency blend of interpolated and original frequencies, with the
    # blend ramp given by beta_fast / beta_slow rotations over the original context.
    old_len = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / old_len
    base = p["rope_theta"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)

    def corr_dim(rotations):
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = corr_dim(p.get("beta_fast") or 32), corr_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float) - lo) / (hi - lo)).clamp(0, 1)
    extrapolate = 1 - ramp
    inv_freq = _base_inv_freq(p, dim, factor) * (1 - extrapolate) + _base_inv_freq(p, dim) * extrapolate
    return inv_freq, float(attn)


ROPE_TYPES: dict[str, Callable[[dict, int, int], tuple[torch.Tensor, float]]] = {
    "default": _rope_default,
    "linear": _rope_linear,
    "llama3": _rope_llama3,
    "yarn": _rope_yarn,
}


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of each head by position * inv_freq.

    interleaved=False: pairs are (i, i + rotary_dim/2) ("neox", Llama checkpoints);
    interleaved=True: pairs are (2i, 2i+1) (GPT-J style).
    Angles are computed from the positions on the device once a forward (kernels/rope.py
    rope_angles): no table, no sync.
    """

    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0, interleaved: bool = False):
        super().__init__()
        self.rotary_dim, self.scaling, self.interleaved = 2 * inv_freq.numel(), scaling, interleaved
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        # Layers with equal frequencies share their angles within one forward.
        self._memo_key = (tuple(inv_freq.float().tolist()), float(scaling))

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) must not round the frequencies (angles grow with the
        # position): move them, but keep them float32.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions [B,T]; q [B,T,heads,d], k [B,T,kv_heads,d] -> rotated q, k."""
        cos, sin = self.angles(positions)
        if self.interleaved or q.shape[-1] != self.rotary_dim or k.shape[-1] != self.rotary_dim or q.dtype != k.dtype:
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        if q.is_cuda and use_rope_kernel(q, k, cos):  # one Triton kernel (kernels/rope.py)
            return rope_neox_triton(q, k, cos, sin)
        # Whole-head neox rotation of q and k as one tensor: x * [cos, cos] + [x2, x1] *
        # [-sin, sin]. Bit for bit the pairwise formula (x1 cos - x2 sin = x1 cos + x2 (-sin)
        # exactly), in 5 ops instead of 2 x 7 per layer (decode steps are op-bound on CPU).
        return rotate_qk_torch(q, k, *self._signed_angles(positions, cos, sin, q.dtype))

    def angles(self, positions: torch.Tensor):
        """cos, sin [B,T,1,rot/2] (float32, times the scaling), once per forward: every
        layer of a model rotates by the same positions (memo in the attention context)."""
        ctx = get_context()
        key = ("rope", self._memo_key)
        hit = ctx.memo.get(key) if ctx is not None else None
        if hit is not None and hit[0] is positions:
            return hit[1], hit[2]
        cos, sin = rope_angles(positions, self.inv_freq, self.scaling)  # one kernel on CUDA (kernels/rope.py)
        if ctx is not None:
            ctx.memo[key] = (positions, cos, sin)
        return cos, sin

    def _signed_angles(self, positions, cos, sin, dtype):
        ctx = get_context()
        key = ("rope-signed", self._memo_key, dtype)
        hit = ctx.memo.get(key) if ctx is not None else None
        if hit is not None and hit[0] is positions:
            return hit[1], hit[2]
        cos2, sin2 = signed_angles(cos, sin, dtype)
        if ctx is not None:
            ctx.memo[key] = (positions, cos2, sin2)
        return cos2, sin2

    def _rotate(self, x, cos, sin):
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        if self.interleaved:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
        else:
            x1, x2 = rot.chunk(2, -1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
        return torch.cat((out, rest), -1) if rest.shape[-1] else out

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, scaling={self.scaling}, interleaved={self.interleaved}"


def get_rope(config, head_dim: int, rotary_dim: Optional[int] = None, interleaved: bool = False) -> RotaryEmbedding:
    """Build the rotary embedding a config asks for (rope_type in ROPE_TYPES)."""
    p = rope_parameters(config)
    kind = p["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope_type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}. "
            f"Add a function to eagle_zoo.models.layers.ROPE_TYPES."
        )
    if rotary_dim is None:
        rotary_dim = int(head_dim * p.get("partial_rotary_factor", 1.0))
    max_pos = getattr(config, "max_position_embeddings", None) or 2048
    inv_freq, scaling = ROPE_TYPES[kind](p, rotary_dim, max_pos)
    return RotaryEmbedding(inv_freq, scaling, interleaved)
