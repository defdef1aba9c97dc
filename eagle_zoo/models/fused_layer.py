"""A Llama-style decoder layer in 6 kernels for decode-shaped steps on CUDA, and in one
C++ call on the CPU (cpu_decoder_layer and cpu_eagle3_layer, at the end; a target's
whole stack of such layers in one call, CpuDecoderStack).

The module path runs ~13 kernels a layer (norm, qkv, rope, KV write, attention split and
merge, o_proj, add, norm, gate_up, silu-and-mul, down_proj, add). At batch 1 a step of a
small model costs per kernel, not per byte, so the same layer is regrouped here:

  q     = rope(q of linear(rms_norm(h), W_qkv))    kernels/qkv_rope.py, norm as prologue,
          cache <- rope(k), v                      rope and the KV write as epilogue
  a     = attention over the cache                 kernels/attention.py (split + merge)
  h     = h + linear(a, W_o)                       residual add as epilogue
  m     = silu_and_mul(linear(rms_norm(h), W_gu))  norm prologue, activation epilogue
  h     = h + linear(m, W_down)

Roundings as kernels/linear.py says (the norm folded into the product, so in bf16 not the
module path's bits), and every kernel is batch invariant, so plain decoding, chain
verification and tree verification agree bit for bit.

Products wider than the linear kernel takes (linear.py MAX_K inputs: a Llama-3.1-8B's)
stay cuBLAS's, and the small kernels around them are regrouped instead
(wide_layer_kernels): rope with the KV write, the residual add with the norm after it,
the last residual added by the product. cuBLAS picks its kernel by the rows, so there
verification can round otherwise than plain decoding (BENCHMARKS.md, "Losslessness").
Whether a layer can take this path is decided once, when an engine's ModelRunner takes
the model (choose_decode_paths: exactly the Llama layer, as in Llama, SmolLM2,
Mistral-style targets and EAGLE-1 heads built on it, on one rank, without biases); per
call only the step decides (decode-shaped, under an engine step's AttentionContext).
Otherwise LlamaDecoderLayer runs its modules.

An EAGLE-3 head's layer (models/heads.py Eagle3DecoderLayer) takes the same path on CUDA
after one launch that norms its two inputs side by side (its module path: two norms, a
cat and the ~13 kernels above), so each draft and catch-up pass of the head runs 7; on
the CPU it is one C++ call too.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from eagle_zoo.kernels import cpu_decode
from eagle_zoo.kernels._triton import needs_autograd, use_triton
from eagle_zoo.kernels.activation import silu_and_mul_triton
from eagle_zoo.kernels.attention import cache_attention_triton
from eagle_zoo.kernels.linear import MAX_K, fused_linear_triton, use_linear_kernel
from eagle_zoo.kernels.norm import MAX_TRITON_HIDDEN, add_rms_norm_triton, rms_norm_pair_triton, rms_norm_triton
from eagle_zoo.kernels.qkv_rope import qkv_rope_write_kv_triton, rope_write_kv_triton

from .attention import KERNEL_MAX_T, AttentionContext, get_context, single_slot
from .layers import RMSNorm, cpu_layer_weight, has_exact_int8_copy, use_cpu_linear_kernel


def layer_supports_fusion(layer) -> bool:
    """The layer's structure allows the regrouped kernels: exact module types, one rank,
    no biases, no fp8 weights (models/quantization.py: the module path reads them),
    whole-head neox rope, no chunked attention."""
    return type(layer.input_layernorm) is RMSNorm and _attention_and_mlp_fusable(layer)


def eagle3_layer_supports_fusion(layer) -> bool:
    """The same for an EAGLE-3 head's first layer (models/heads.py Eagle3DecoderLayer),
    whose attention reads cat([input_layernorm(embeds), hidden_norm(hidden)])."""
    return (type(layer.input_layernorm) is RMSNorm and type(layer.hidden_norm) is RMSNorm
            and _attention_and_mlp_fusable(layer))


def _attention_and_mlp_fusable(layer) -> bool:
    from .llama import LlamaAttention, LlamaMLP  # the classes the regrouping reproduces

    attn, mlp = layer.self_attn, layer.mlp
    return (type(attn) is LlamaAttention and type(mlp) is LlamaMLP
            and type(layer.post_attention_layernorm) is RMSNorm
            and attn.qkv_proj.tp_size == 1 and attn.o_proj.tp_size == 1
            and mlp.gate_up_proj.tp_size == 1 and mlp.down_proj.tp_size == 1
            and all(m.bias is None and m.weight_scale is None
                    for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
            and not attn.rotary_emb.interleaved and attn.rotary_emb.rotary_dim == attn.qkv_proj.head_size
            and attn.attn.attention_chunk_size is None)


def choose_decode_paths(model) -> None:
    """Once per loaded model (engine/runner.py): every module with a regrouped decode path
    (LlamaDecoderLayer.choose_decode_path, LlamaForCausalLM's for its whole stack) decides
    whether it takes it, each after the modules it holds."""
    for module in reversed(list(model.modules())):  # modules() lists a module before those it holds
        choose = getattr(module, "choose_decode_path", None)
        if choose is not None:
            choose()


def stack_supports_cpu_call(layers) -> bool:
    """Whether a model's decoder layers can run as one C++ call on the CPU
    (CpuDecoderStack): weights on the CPU, every layer chose the regrouped path, of one
    attention shape (heads, kv heads, scale), none with a sliding window (the C++
    attention is causal only)."""
    if not layers or not all(getattr(layer, "fused_decode", False) for layer in layers):
        return False
    if layers[0].self_attn.qkv_proj.weight.device.type != "cpu":
        return False
    cores = [layer.self_attn.attn for layer in layers]
    return all((c.num_heads, c.num_kv_heads, c.scale, c.sliding_window) == (cores[0].num_heads, cores[0].num_kv_heads,
                                                                            cores[0].scale, None) for c in cores)


def fused_decoder_layer(layer, positions: torch.Tensor, h: torch.Tensor) -> Optional[torch.Tensor]:
    """The output of a layer that chose this path (layer_supports_fusion) through the
    regrouped kernels (wide_layer_kernels where its products are too wide for the linear
    kernel), or None when they do not apply to this call (prefill-sized steps, no engine
    context). On the CPU: the whole layer in one C++ call (cpu_decoder_layer)."""
    if not h.is_cuda:
        return cpu_decoder_layer(layer, positions, h)
    ctx = _cuda_step_context(layer, h)
    if ctx is None:
        return None
    if _linear_kernel_products(layer, h, layer.input_layernorm.weight):
        return fused_layer_kernels(layer, positions, h, ctx)
    return wide_layer_kernels(layer, positions, h, ctx) if _wide_products(layer, h) else None


def fused_eagle3_layer(layer, positions: torch.Tensor, embeds: torch.Tensor,
                       hidden: torch.Tensor) -> Optional[torch.Tensor]:
    """An EAGLE-3 head layer that chose this path (eagle3_layer_supports_fusion) through
    the regrouped kernels on CUDA, or None where they do not apply. On the CPU: one C++
    call (cpu_eagle3_layer)."""
    if embeds.shape != hidden.shape or embeds.dtype != hidden.dtype:
        return None
    if not hidden.is_cuda:
        return cpu_eagle3_layer(layer, positions, embeds, hidden)
    ctx = _cuda_step_context(layer, hidden)
    if ctx is None:
        return None
    norms = (layer.input_layernorm.weight, layer.hidden_norm.weight)
    if 2 * hidden.shape[-1] <= MAX_K and _linear_kernel_products(layer, hidden, *norms):  # qkv reads both halves
        return fused_eagle3_layer_kernels(layer, positions, embeds, hidden, ctx)
    if _wide_products(layer, hidden, *norms):
        return wide_eagle3_layer_kernels(layer, positions, embeds, hidden, ctx)
    return None


def _cuda_step_context(layer, h: torch.Tensor):
    """The engine step's AttentionContext where the regrouped kernels can apply to this
    call: a decode-shaped step (at most KERNEL_MAX_T tokens) and caches of h's dtype with
    unit stride in d (what kernels/qkv_rope.py writes); else None. Which products the
    layer takes is the caller's choice after it."""
    ctx = get_context()
    if ctx is None or h.dim() != 3 or h.shape[1] > KERNEL_MAX_T:
        return None
    k_cache, v_cache = ctx.kv_caches[layer.self_attn.attn.layer_idx]
    if not (k_cache.is_cuda and k_cache.dtype == v_cache.dtype == h.dtype
            and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1):
        return None
    return ctx


def _linear_kernel_products(layer, h: torch.Tensor, *norm_weights: torch.Tensor) -> bool:
    """Every product of the layer is the linear kernel's (kernels/linear.py use_linear_kernel)."""
    attn, mlp = layer.self_attn, layer.mlp
    return (use_linear_kernel(h, attn.qkv_proj.weight, *norm_weights, attn.o_proj.weight)
            and use_linear_kernel(h, mlp.gate_up_proj.weight, layer.post_attention_layernorm.weight,
                                  mlp.down_proj.weight))


def _wide_products(layer, h: torch.Tensor, *norm_weights: torch.Tensor) -> bool:
    """wide_layer_kernels' case: Triton for the small kernels (use_triton), activations in
    float16, bfloat16 or float32 (as the linear kernel's case), weights and norms of that
    dtype, contiguous, rows no wider than the norm kernels take."""
    attn, mlp = layer.self_attn, layer.mlp
    tensors = (attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight,
               layer.post_attention_layernorm.weight, *norm_weights)
    return (use_triton(h, *tensors) and h.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and h.shape[-1] <= MAX_TRITON_HIDDEN and h.stride(-1) == 1
            and all(t.dtype == h.dtype and t.is_contiguous() for t in tensors))


def fused_layer_kernels(layer, positions: torch.Tensor, h: torch.Tensor, ctx) -> torch.Tensor:
    """The regrouped layer itself, Triton kernels called directly (the checks are the
    caller's; tests run it on CPU tensors under TRITON_INTERPRET=1)."""
    norm1 = layer.input_layernorm
    q = _qkv_rope_write_kv(layer, positions, h, ctx, norm_weight=norm1.weight, eps=norm1.eps)
    return _attention_and_mlp_kernels(layer, q, h, ctx)


def fused_eagle3_layer_kernels(layer, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                               ctx) -> torch.Tensor:
    """An EAGLE-3 head layer in 7 kernels: both input norms side by side in one
    (kernels/norm.py rms_norm_pair), the qkv product over them, then as a Llama layer.
    The residual is the raw hidden state, or its norm under norm_before_residual."""
    e_norm, h_norm = layer.input_layernorm, layer.hidden_norm
    x = rms_norm_pair_triton(embeds, e_norm.weight, e_norm.eps, hidden, h_norm.weight, h_norm.eps)
    residual = x[..., hidden.shape[-1]:] if layer.norm_before_residual else hidden
    q = _qkv_rope_write_kv(layer, positions, x, ctx)
    return _attention_and_mlp_kernels(layer, q, residual, ctx)


def _qkv_rope_write_kv(layer, positions: torch.Tensor, x: torch.Tensor, ctx, **norm) -> torch.Tensor:
    """The qkv product (with the input norm as its prologue when given), rope, and k and v
    written into the layer's cache, in one launch (kernels/qkv_rope.py): the rotated q."""
    attn = layer.self_attn
    k_cache, v_cache = ctx.kv_caches[attn.attn.layer_idx]
    cos, sin = attn.rotary_emb.angles(positions)
    return qkv_rope_write_kv_triton(x, attn.qkv_proj.weight, cos, sin, k_cache, v_cache, ctx.slot_ids,
                                    ctx.cache_positions, attn.attn.num_heads, attn.attn.num_kv_heads, **norm)


def _attention_and_mlp_kernels(layer, q: torch.Tensor, residual: torch.Tensor, ctx) -> torch.Tensor:
    """From the rotated q on: attention (split and merge), o_proj with the residual
    added, gate_up with the norm before it and silu-and-mul after it, down_proj with its
    residual."""
    attn, mlp = layer.self_attn, layer.mlp
    norm2 = layer.post_attention_layernorm
    h = fused_linear_triton(_cache_attention(layer, q, ctx), attn.o_proj.weight, residual=residual)
    m = fused_linear_triton(h, mlp.gate_up_proj.weight, norm_weight=norm2.weight, eps=norm2.eps, gated=True)
    return fused_linear_triton(m, mlp.down_proj.weight, residual=h)


def _cache_attention(layer, q: torch.Tensor, ctx) -> torch.Tensor:
    """Attention of the rotated q over the layer's cache (kernels/attention.py: split and
    merge), heads flattened."""
    core = layer.self_attn.attn
    k_cache, v_cache = ctx.kv_caches[core.layer_idx]
    return cache_attention_triton(q, k_cache, v_cache, ctx.slot_ids, ctx.cache_positions, ctx.kv_len, core.scale,
                                  attn_mask=ctx.attn_mask, window=core.sliding_window, tree=ctx.tree_keys).flatten(2)


def wide_layer_kernels(layer, positions: torch.Tensor, h: torch.Tensor, ctx) -> torch.Tensor:
    """The layer regrouped around products too wide for the linear kernel (MAX_K: a
    Llama-3.1-8B's), which cuBLAS runs, in ~10 launches where the module path takes ~13
    and cuBLAS's split-K reductions: the norm; qkv; rope and the KV write in one
    (kernels/qkv_rope.py rope_write_kv); attention; o_proj; the residual add and the norm
    after it in one (kernels/norm.py add_rms_norm); gate_up; silu-and-mul; down_proj with
    the residual added by the product itself (cuBLAS's beta = 1: one rounding of the sum
    where the module path rounds the product, then the sum)."""
    norm1 = layer.input_layernorm
    q = _wide_qkv_rope(layer, positions, rms_norm_triton(h, norm1.weight, norm1.eps), ctx)
    return _wide_attention_and_mlp(layer, q, h, ctx)


def wide_eagle3_layer_kernels(layer, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                              ctx) -> torch.Tensor:
    """An EAGLE-3 head layer of such a width: both input norms in one launch, as
    fused_eagle3_layer_kernels, then wide_layer_kernels' steps."""
    e_norm, h_norm = layer.input_layernorm, layer.hidden_norm
    x = rms_norm_pair_triton(embeds, e_norm.weight, e_norm.eps, hidden, h_norm.weight, h_norm.eps)
    residual = x[..., hidden.shape[-1]:] if layer.norm_before_residual else hidden
    q = _wide_qkv_rope(layer, positions, x, ctx)
    return _wide_attention_and_mlp(layer, q, residual, ctx)


def _wide_qkv_rope(layer, positions: torch.Tensor, x: torch.Tensor, ctx) -> torch.Tensor:
    attn = layer.self_attn
    k_cache, v_cache = ctx.kv_caches[attn.attn.layer_idx]
    cos, sin = attn.rotary_emb.angles(positions)
    return rope_write_kv_triton(F.linear(x, attn.qkv_proj.weight), cos, sin, k_cache, v_cache, ctx.slot_ids,
                                ctx.cache_positions, attn.attn.num_heads, attn.attn.num_kv_heads)


def _wide_attention_and_mlp(layer, q: torch.Tensor, residual: torch.Tensor, ctx) -> torch.Tensor:
    attn, mlp, norm2 = layer.self_attn, layer.mlp, layer.post_attention_layernorm
    h, x = add_rms_norm_triton(F.linear(_cache_attention(layer, q, ctx), attn.o_proj.weight), residual,
                               norm2.weight, norm2.eps)
    m = silu_and_mul_triton(F.linear(x, mlp.gate_up_proj.weight))
    # h is this call's own tensor, so the product may add into it in place
    h.view(-1, h.shape[-1]).addmm_(m.view(-1, m.shape[-1]), mlp.down_proj.weight.t())
    return h


def cpu_decoder_layer(layer, positions: torch.Tensor, h: torch.Tensor) -> Optional[torch.Tensor]:
    """The layer (one that chose this path, layer_supports_fusion) for up to 8 float32
    tokens of one sequence in one C++ call (kernels/cpu_decode.py llama_layer_rows: norm,
    qkv, rope, KV write, causal attention, o_proj, norm, gate_up, silu, down_proj), or
    None where it does not apply (_cpu_step_context). Plain decoding and chain
    verification both take it, so a verified token gets plain decoding's bits."""
    ctx = _cpu_step_context(layer, h)
    if ctx is None:
        return None
    norm1 = layer.input_layernorm
    out = cpu_decode.llama_layer_rows(h[0], norm1.weight, norm1.eps, *_cpu_layer_arguments(layer, positions, ctx))
    return out.unsqueeze(0)


class CpuDecoderStack:
    """A model's whole stack of decoder layers (stack_supports_cpu_call) for up to 8 float32
    tokens of one sequence in one C++ call a step (kernels/cpu_decode.py llama_stack_rows:
    cpu_decoder_layer's call for each layer in turn, the same bits). Made once, when the
    model chooses its decode path after its weights are loaded (a layer Parameter replaced
    later is not seen; its data changed in place is): the layers' norms, projection weights,
    eps values and cache indices, so a step does not walk ~500 module attributes of 30
    layers. Each step still reads every projection through cpu_layer_weight, whose exact
    copy applies only while its weight is unchanged."""

    def __init__(self, layers):
        self.first = layers[0]
        self.layers = [(layer.input_layernorm.weight, layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                        layer.post_attention_layernorm.weight, layer.mlp.gate_up_proj.weight,
                        layer.mlp.down_proj.weight) for layer in layers]
        self.eps = [eps for layer in layers for eps in (layer.input_layernorm.eps, layer.post_attention_layernorm.eps)]
        self.cache_index = [layer.self_attn.attn.layer_idx for layer in layers]
        self.rotary_emb = self.first.self_attn.rotary_emb
        core = self.first.self_attn.attn
        self.heads = (core.num_heads, core.num_kv_heads, core.scale)

    def __call__(self, positions: torch.Tensor, h: torch.Tensor,
                 keep=()) -> Optional[tuple[torch.Tensor, list[torch.Tensor]]]:
        """-> (the last layer's output, the input of each layer in keep), or None where
        cpu_decoder_layer would not apply (_cpu_step_context of the first layer; the C++
        checks every layer's cache)."""
        ctx = _cpu_step_context(self.first, h)
        if ctx is None:
            return None
        weights = [w for norm1, qkv, o, norm2, gate_up, down in self.layers
                   for w in (norm1, cpu_layer_weight(qkv), cpu_layer_weight(o), norm2, cpu_layer_weight(gate_up),
                             cpu_layer_weight(down))]
        caches = [ctx.kv_caches[i] for i in self.cache_index]
        cos, sin = self.rotary_emb.angles(positions)
        T, half = h.shape[1], cos.shape[-1]
        out, *kept = cpu_decode.llama_stack_rows(h[0], weights, self.eps, [k for k, _ in caches],
                                                 [v for _, v in caches], cos.reshape(T, half), sin.reshape(T, half),
                                                 single_slot(ctx), ctx.cache_positions.reshape(T), ctx.kv_len,
                                                 *self.heads, keep)
        return out.unsqueeze(0), [x.unsqueeze(0) for x in kept]


def cpu_eagle3_layer(layer, positions: torch.Tensor, embeds: torch.Tensor,
                     hidden: torch.Tensor) -> Optional[torch.Tensor]:
    """An EAGLE-3 head layer (one that chose this path, eagle3_layer_supports_fusion) for
    up to 8 float32 tokens of one sequence in one C++ call (kernels/cpu_decode.py
    eagle3_layer_rows: both input norms, qkv over them side by side, then as
    llama_layer_rows), or None where it does not apply (_cpu_step_context)."""
    ctx = _cpu_step_context(layer, hidden)
    if ctx is None:
        return None
    e_norm, h_norm = layer.input_layernorm, layer.hidden_norm
    out = cpu_decode.eagle3_layer_rows(embeds[0], e_norm.weight, e_norm.eps, hidden[0], h_norm.weight, h_norm.eps,
                                       layer.norm_before_residual, *_cpu_layer_arguments(layer, positions, ctx))
    return out.unsqueeze(0)


class CpuEagle3Head:
    """An EAGLE-3 head's work in a CPU chain step of one float32 sequence, one C++ call
    each (kernels/cpu_decode.py): the catch-up over the verified tokens
    (eagle3_catch_up_rows: what the runner's pass over the head's modules computes) and
    the greedy drafts (eagle3_draft_rows: what k draft_argmax calls and k - 1 layer passes
    compute), the module path's calls in its order, so the same bits. Made once, when the
    proposer takes a head that supports() it: the checks the module path makes each call
    (caches, dtypes, copies, the kernels built) hold for the engine's life, so a call only
    gathers its arguments, and reads each projection through cpu_layer_weight (an exact
    copy applies only while its weight is unchanged)."""

    @staticmethod
    def supported(head, kv_caches) -> bool:
        """One decoder layer that chose the regrouped path, fc alone (no fc_norm or
        input_norm) without an int8 copy, an RMSNorm before a one-rank lm_head (not
        norm_output) read as float32 or bfloat16, a one-rank float32 embedding, float32
        caches the C++ attention takes, on the CPU."""
        layers = getattr(head, "layers", ())
        if not (len(layers) == 1 and hasattr(layers[0], "hidden_norm") and getattr(layers[0], "fused_decode", False)
                and hasattr(head, "d2t") and hasattr(head, "fc") and getattr(head, "fc_norm", None) is None
                and getattr(head, "input_norm", None) is None and not getattr(head, "norm_output", True)
                and type(head.norm) is RMSNorm and head.lm_head.tp_size == 1 and head.embed_tokens.tp_size == 1
                and head.lm_head.weight.device.type == "cpu"):
            return False
        embed, lm_head, fc = head.embed_tokens.weight, head.lm_head.weight, head.fc.weight
        probe = embed.new_empty(1, 1, 0)  # a one-token step in the head's dtype (the engine steps' inputs)
        ctx = AttentionContext(kv_caches, torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), 1)
        with torch.no_grad():  # as the engine's steps run
            return (embed.dtype == torch.float32 and embed.is_contiguous() and head.fc.bias is None
                    and use_cpu_linear_kernel(probe, lm_head) and use_cpu_linear_kernel(probe, fc)
                    and not has_exact_int8_copy(lm_head) and not has_exact_int8_copy(fc)
                    and layers[0].self_attn.attn.cpu_kernel_applies(ctx, probe))

    def __init__(self, head, kv_caches):
        layer = head.layers[0]
        attn, mlp, core = layer.self_attn, layer.mlp, layer.self_attn.attn
        e_norm, h_norm, norm2 = layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm
        self.head, self.rotary_emb = head, attn.rotary_emb
        self.projections = (attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight)
        self.norms = (e_norm.weight, e_norm.eps, h_norm.weight, h_norm.eps, layer.norm_before_residual)
        self.norm2 = (norm2.weight, norm2.eps)
        self.caches = kv_caches[core.layer_idx]
        self.heads = (core.num_heads, core.num_kv_heads, core.scale)

    def _layer_arguments(self, positions: torch.Tensor, slot: int, kv_len: int) -> tuple:
        """eagle3_layer_rows' arguments after its inputs' norms, for positions [1, T] and
        the step's kv_len (bounded by the cache rows, as the runner bounds it)."""
        qkv, o, gate_up, down = (cpu_layer_weight(w) for w in self.projections)
        cos, sin = self.rotary_emb.angles(positions)
        T, half = positions.shape[1], cos.shape[-1]
        return (*self.norms, qkv, o, *self.norm2, gate_up, down, cos.reshape(T, half), sin.reshape(T, half),
                *self.caches, slot, positions.reshape(T), min(kv_len, self.caches[0].shape[1]), *self.heads)

    def catch_up(self, aux: tuple, tokens: torch.Tensor, positions: torch.Tensor, slot: int,
                 kv_len: int) -> Optional[torch.Tensor]:
        """The head over T verified tokens [1, T] (the ids that follow each position, -1
        past the accepted run) at positions [1, T], from the target's aux residual streams
        [1, T, H_t] each, writing the head's cache: -> its output [T, H], or None where T
        is more than the C++ rows (the module path then runs)."""
        if tokens.shape[1] > cpu_decode.MAX_ROWS:
            return None
        head = self.head
        return cpu_decode.eagle3_catch_up_rows([a[0] for a in aux], cpu_layer_weight(head.fc.weight), tokens[0],
                                               head.embed_tokens.weight,
                                               *self._layer_arguments(positions, slot, kv_len))

    def drafts(self, hidden: torch.Tensor, positions: torch.Tensor, slot: int, kv_len: int, k: int,
               min_confidence: float) -> torch.Tensor:
        """The k greedy drafts [1, k] from the head's hidden state [1, H] (draft j + 1 fed
        at positions [1, k - 1]'s j); with min_confidence > 0, the first n <= k of them
        [1, n], as eagle3_draft_rows stops."""
        head = self.head
        norm = head.norm
        drafts = cpu_decode.eagle3_draft_rows(hidden, k, head.embed_tokens.weight, norm.weight, norm.eps,
                                              cpu_layer_weight(head.lm_head.weight), head.d2t,
                                              *self._layer_arguments(positions, slot, kv_len), min_confidence)
        return drafts.unsqueeze(0)


def _cpu_step_context(layer, h: torch.Tensor):
    """The engine step's AttentionContext where the C++ layer call applies to h, else
    None: a mask other than causal (trees), a sliding window, several sequences,
    prefill-sized steps, a head size not a multiple of 8, autograd, or the kernels not
    built."""
    ctx = get_context()
    if (ctx is None or h.dim() != 3 or not layer.self_attn.attn.cpu_kernel_applies(ctx, h)
            or needs_autograd(h, layer.self_attn.qkv_proj.weight)):
        return None
    return ctx


def _cpu_layer_arguments(layer, positions: torch.Tensor, ctx) -> tuple:
    """The arguments the C++ layer calls share after their inputs: the projections (an
    EAGLE head's read from their exact bfloat16 copies), the second norm, the angles of
    positions [1, T], the cache row and the heads."""
    attn, mlp, core = layer.self_attn, layer.mlp, layer.self_attn.attn
    norm2 = layer.post_attention_layernorm
    k_cache, v_cache = ctx.kv_caches[core.layer_idx]
    cos, sin = attn.rotary_emb.angles(positions)
    T, half = positions.shape[1], cos.shape[-1]
    return (cpu_layer_weight(attn.qkv_proj.weight), cpu_layer_weight(attn.o_proj.weight), norm2.weight, norm2.eps,
            cpu_layer_weight(mlp.gate_up_proj.weight), cpu_layer_weight(mlp.down_proj.weight),
            cos.reshape(T, half), sin.reshape(T, half), k_cache, v_cache, single_slot(ctx),
            ctx.cache_positions.reshape(T), ctx.kv_len, core.num_heads, core.num_kv_heads, core.scale)
