"""The deepseek family (DeepSeek-V2 / V3): MLA attention, MoE, target model, EAGLE-1 /
EAGLE-3 heads and the mapping table.

Facts this file follows (transformers' modeling_deepseek_v2 / _v3, DeepSeek's own
inference code, vLLM's deepseek_eagle / deepseek_eagle3):

MLA attention
  q  = q_b_proj(q_a_layernorm(q_a_proj(x)))   (or q_proj(x) when q_lora_rank is None,
       as in V2-Lite), split per head into q_nope [qk_nope_head_dim] + q_pe [qk_rope_head_dim];
  kv_a_proj_with_mqa(x) = latent [kv_lora_rank] + k_pe [qk_rope_head_dim] (one rope key
       shared by all heads); kv_b_proj(kv_a_layernorm(latent)) = per head k_nope + v.
  q_a_proj and kv_a_proj_with_mqa read the same input, so with q_lora_rank set they are
  one replicated matrix here, ``fused_qkv_a_proj`` (shards "q_a", "kv_a").
  Rope acts on the q_pe / k_pe part only, with the pairs interleaved ((0,1), (2,3), ...):
  DeepSeek's checkpoints are laid out that way (transformers V2 always, V3 unless
  ``rope_interleave`` is false, then the half-split "neox" pairs).
  Softmax scale: qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 for a
  scaled rope (yarn); yarn's own attention factor scales cos / sin (layers.get_rope).
  q_a_layernorm / kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says (DeepSeek's
  code and transformers do).
  KV cache: each layer caches the expanded per-head key (qk_nope + qk_rope dims) and value
  (v_head_dim), not the compressed latent. It costs more memory than caching the
  latent (and absorbing kv_b_proj into q / o), but it is exact, simple, and reuses the
  shared Attention layer and cache layout unchanged.

MoE (a layer is MoE when n_routed_experts > 0, its index >= first_k_dense_replace and
index % moe_layer_freq == 0)
  router: logits = x @ gate.weight^T in float32; scores = softmax (V2) or sigmoid (V3);
  V3 ("noaux_tc") picks experts by scores + e_score_correction_bias within the
  topk_group best of n_group groups (a group scores the sum of its top-2); V2's
  "group_limited_greedy" scores a group by its best expert; "greedy" picks plainly.
  Weights are the unbiased scores of the chosen experts, renormalised when
  norm_topk_prob, then times routed_scaling_factor. Output = routed experts + the
  n_shared_experts shared MLP (moe_intermediate_size * n_shared_experts wide).
  Experts are stored as two 3-D tensors (``experts.gate_up_proj`` [E, 2I, H],
  ``experts.down_proj`` [E, H, I], as transformers 5 keeps them in memory); published
  checkpoints hold per-expert ``experts.N.{gate,up,down}_proj.weight``, loaded through
  a per-config table (expert_mapping). Both namings load.
  Computation is host-sync free with fixed shapes: for few tokens (N * top_k < E, the
  decode case) the chosen experts' weights are gathered per token; otherwise every
  expert runs on every token with a zero weight where it was not chosen. The dense
  branch spends E / top_k times the FLOPs of a grouped GEMM (fine for tiny and CPU
  models; a fused MoE kernel belongs in kernels/).

Heads
  EAGLE-1 (EagleDeepseekV2/V3ForCausalLM, EagleDeepSeekMTPModel):
  h = fc(cat([enorm(embed(ids)), hnorm(hidden)])) (vLLM's fc has no bias; as for every
  EAGLE-1 head, the file decides) -> full decoder layers (input norm kept) -> final norm.
  As in vLLM, forward returns the *normed* h (that is what is fed back at the next draft
  step) and compute_logits is lm_head(h) without another norm. Head layers count after
  the target's layers (vLLM numbers them so; SGLang marks them as next-n layers), so
  first_k_dense_replace never makes them dense: a head layer is MoE whenever
  n_routed_experts > 0.
  EAGLE-3 (Eagle3DeepseekV2/V3ForCausalLM): the generic EAGLE-3 layer with MLA attention
  reading cat([embeds, hidden]) (q_a_proj / q_proj and kv_a_proj_with_mqa take 2H) and
  a dense MLP (intermediate_size); later layers, if any, are dense DeepSeek layers.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from . import parallel_state as ps
from .attention import Attention
from .heads import Eagle3Head, EagleHead, cfg, rms_norm
from .layers import (
    ColumnParallelLinear,
    FusedColumnLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    check_shape,
    get_rope,
    rope_parameters,
)
from .llama import LlamaForCausalLM

# HF / DeepSeek checkpoint names -> this module's parameters (the family's table).
# A model's own table comes from deepseek_mapping(config): per-expert names (their
# number depends on the config) go first, and MLA_FUSED only when q_lora_rank is set
# (otherwise q_proj and kv_a_proj_with_mqa stay separate parameters).
MLA_FUSED = (
    (".fused_qkv_a_proj", ".q_a_proj", "q_a"),
    (".fused_qkv_a_proj", ".kv_a_proj_with_mqa", "kv_a"),
)
MLP_FUSED = (
    (".gate_up_proj", ".gate_proj", 0),  # dense MLPs and shared experts
    (".gate_up_proj", ".up_proj", 1),
)
DEEPSEEK_MAPPING = WeightMapping(
    renames=(("^model.", ""),),  # target checkpoints nest everything but lm_head under model.
    stacked=MLA_FUSED + MLP_FUSED,
    ignored=("rotary_emb.inv_freq",),
)
# Projection of one expert -> (fused 3-D parameter, part) in DeepseekExperts.
EXPERT_PARTS = (("gate_proj", "gate_up_proj", "gate"), ("up_proj", "gate_up_proj", "up"),
                ("down_proj", "down_proj", "down"))
# MLA's latent norms: fixed eps in DeepSeek's code and transformers (not rms_norm_eps).
LATENT_NORM_EPS = 1e-6
# model_type -> (scoring_func, topk_method) when a config names neither (transformers'
# DeepseekV3Config has no such keys; published V3 configs say sigmoid / noaux_tc).
ROUTING_DEFAULTS = {
    "deepseek_v2": ("softmax", "greedy"),
    "deepseek_v3": ("sigmoid", "noaux_tc"),
}
# topk_method -> the scoring function it works with.
TOPK_METHODS = {"greedy": "softmax", "group_limited_greedy": "softmax", "noaux_tc": "sigmoid"}


def expert_mapping(num_experts: int) -> WeightMapping:
    """Published per-expert keys ``.experts.N.gate_proj.weight`` -> shard (N, "gate") of
    ``.experts.gate_up_proj`` (and up, down)."""
    return WeightMapping(stacked=tuple(
        (f".experts.{fused}", f".experts.{e}.{proj}.weight", (e, part))
        for e in range(num_experts) for proj, fused, part in EXPERT_PARTS
    ))


def deepseek_mapping(config, mtp_after: int | None = None) -> WeightMapping:
    """The table for one config: expert entries first (the generic .gate_proj entry
    would claim an expert's too), MLA_FUSED when q_lora_rank is set, then the rest.

    mtp_after: a target's layer count; its checkpoint's next-n (MTP) layers
    ``model.layers.{L}...`` (num_nextn_predict_layers of them) are skipped, as
    transformers does.
    """
    stacked = expert_mapping(int(cfg(config, "n_routed_experts", 0))).stacked
    stacked += (MLA_FUSED if cfg(config, "q_lora_rank") else ()) + MLP_FUSED
    ignored = DEEPSEEK_MAPPING.ignored
    if mtp_after is not None:
        extra = int(cfg(config, "num_nextn_predict_layers", 0))
        ignored += tuple(f"model.layers.{mtp_after + i}." for i in range(extra))
    return WeightMapping(renames=DEEPSEEK_MAPPING.renames, stacked=stacked, ignored=ignored)


def _check_silu(config, what: str) -> None:
    if cfg(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"deepseek {what} supports hidden_act='silu', config has {config.hidden_act!r}")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(config, qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 for a scaled rope."""
    p = rope_parameters(config)
    scale = qk_head_dim ** -0.5
    if p["rope_type"] != "default" and p.get("mscale_all_dim"):
        scale *= _yarn_mscale(p["factor"], p["mscale_all_dim"]) ** 2
    return scale


# -- dense MLP and MoE ---------------------------------------------------------------


class DeepseekMLP(nn.Module):
    """silu(gate) * up -> down; the dense layers, the EAGLE-3 MLP and the shared experts."""

    def __init__(self, config, intermediate_size: int | None = None):
        super().__init__()
        _check_silu(config, "MLP")
        H, inter = config.hidden_size, intermediate_size or config.intermediate_size
        bias = bool(cfg(config, "mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(H, [inter, inter], bias=bias)
        self.down_proj = RowParallelLinear(inter, H, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DeepseekRouter(nn.Module):
    """Chooses num_experts_per_tok experts per token and their weights (float32)."""

    def __init__(self, config):
        super().__init__()
        self.num_experts, self.top_k = int(config.n_routed_experts), int(config.num_experts_per_tok)
        self.scoring, self.method = self._routing(config)
        self.n_group = int(cfg(config, "n_group", 1))
        self.topk_group = int(cfg(config, "topk_group", self.n_group))
        self.norm_topk_prob = bool(cfg(config, "norm_topk_prob", False))
        self.scaling = float(cfg(config, "routed_scaling_factor", 1.0))
        self.grouped = self.method != "greedy" and self.n_group > 1
        if self.grouped:
            per_group = self.num_experts // self.n_group
            if self.num_experts % self.n_group or self.top_k > self.topk_group * per_group:
                raise ValueError(
                    f"deepseek routing: n_routed_experts {self.num_experts} must split into n_group "
                    f"{self.n_group} equal groups, and num_experts_per_tok {self.top_k} must not exceed "
                    f"topk_group {self.topk_group} x experts per group; fix these config keys"
                )
        # Routing is decided in float32 (transformers keeps these in float32 too).
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size, dtype=torch.float32))
        if self.method == "noaux_tc":
            self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None

    @staticmethod
    def _routing(config) -> tuple[str, str]:
        scoring, method = cfg(config, "scoring_func"), cfg(config, "topk_method")
        if scoring is None or method is None:
            model_type = cfg(config, "model_type")
            if model_type not in ROUTING_DEFAULTS:
                raise ValueError(
                    f"deepseek routing: config model_type {model_type!r} has no default routing; set "
                    f"'scoring_func' (softmax | sigmoid) and 'topk_method' ({' | '.join(TOPK_METHODS)})"
                )
            default_scoring, default_method = ROUTING_DEFAULTS[model_type]
            method = method or default_method
            scoring = scoring or TOPK_METHODS.get(method, default_scoring)
        if TOPK_METHODS.get(method) != scoring:
            raise ValueError(
                f"deepseek routing: topk_method {method!r} with scoring_func {scoring!r} is not supported; "
                f"supported: {', '.join(f'{m} with {s}' for m, s in TOPK_METHODS.items())}"
            )
        return scoring, method

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) must not round the routing weights: move them, keep float32.
        saved = {n: t for n, t in (("weight", self.weight.data), ("bias", self.e_score_correction_bias))
                 if t is not None}
        super()._apply(fn, recurse)
        self.weight.data = saved["weight"].to(device=self.weight.device, dtype=torch.float32)
        if "bias" in saved:
            self.e_score_correction_bias = saved["bias"].to(device=self.weight.device, dtype=torch.float32)
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N,H] -> (weights [N,top_k] float32, expert ids [N,top_k])."""
        logits = F.linear(x.float(), self.weight.float())
        scores = logits.softmax(-1) if self.scoring == "softmax" else logits.sigmoid()
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if self.grouped:
            groups = choice.unflatten(-1, (self.n_group, -1))
            if self.method == "noaux_tc":
                group_scores = groups.topk(2, dim=-1).values.sum(-1)
            else:  # group_limited_greedy
                group_scores = groups.amax(-1)
            best = group_scores.topk(self.topk_group, dim=-1).indices
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(-1, best, True)
            choice = groups.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(-2)
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, ids)  # the unbiased scores
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class DeepseekExperts(nn.Module):
    """The routed experts as 3-D tensors: gate_up_proj [E, 2I, H] (gate rows then up rows
    of each expert), down_proj [E, H, I]. With tensor parallelism each rank holds a slice
    of every expert's intermediate dimension and the partial outputs are all-reduced."""

    def __init__(self, config):
        super().__init__()
        _check_silu(config, "experts")
        self.tp = ps.get_tp()  # kept for the all-reduce in forward
        self.tp_rank, self.tp_size = self.tp.rank, self.tp.size
        E, H = int(config.n_routed_experts), config.hidden_size
        self.num_experts, self.hidden_size = E, H
        self.full_inter = int(config.moe_intermediate_size)
        self.inter = ps.divide(self.full_inter, self.tp_size, "moe_intermediate_size")
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * self.inter, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, self.inter))
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.down_proj.weight_loader = self._load_down
        # Shards the loader must see (or the whole fused tensor) for each parameter.
        self.gate_up_proj.shard_ids = tuple((e, p) for e in range(E) for p in ("gate", "up"))
        self.down_proj.shard_ids = tuple((e, "down") for e in range(E))
        self.act = SiluAndMul()

    def _mine(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.narrow(dim, self.tp_rank * self.inter, self.inter)

    @torch.no_grad()
    def _load_gate_up(self, param, loaded, shard_id=None):
        E, I, H, n = self.num_experts, self.full_inter, self.hidden_size, self.inter
        if shard_id is None:  # transformers' in-memory naming: one [E, 2I, H] tensor
            check_shape(loaded, (E, 2 * I, H), "experts.gate_up_proj")
            gate, up = loaded.split(I, 1)
            param.data[:, :n].copy_(self._mine(gate, 1))
            param.data[:, n:].copy_(self._mine(up, 1))
            return
        expert, part = shard_id
        check_shape(loaded, (I, H), f"expert {expert} {part}_proj")
        param.data[expert, (0 if part == "gate" else n): (n if part == "gate" else 2 * n)].copy_(self._mine(loaded, 0))

    @torch.no_grad()
    def _load_down(self, param, loaded, shard_id=None):
        E, I, H = self.num_experts, self.full_inter, self.hidden_size
        if shard_id is None:
            check_shape(loaded, (E, H, I), "experts.down_proj")
            param.data.copy_(self._mine(loaded, 2))
            return
        expert, _ = shard_id
        check_shape(loaded, (H, I), f"expert {expert} down_proj")
        param.data[expert].copy_(self._mine(loaded, 1))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N,H], weights / ids [N,top_k] -> sum_k weights * expert_ids(x)  [N,H]."""
        N, k = ids.shape
        weights = weights.to(x.dtype)
        if N * k < self.num_experts:  # few tokens: gather the chosen experts' matrices
            gate_up = torch.einsum("nh,nkih->nki", x, self.gate_up_proj[ids])
            h = self.act(gate_up) * weights.unsqueeze(-1)
            out = torch.einsum("nki,nkhi->nh", h, self.down_proj[ids])
        else:  # many tokens: every expert on every token, weight 0 where not chosen
            dense = x.new_zeros(N, self.num_experts).scatter_(1, ids, weights)
            gate_up = torch.einsum("nh,eih->nei", x, self.gate_up_proj)
            h = self.act(gate_up) * dense.unsqueeze(-1)
            out = torch.einsum("nei,ehi->nh", h, self.down_proj)
        return ps.all_reduce(out, self.tp)


class DeepseekMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = DeepseekRouter(config)
        self.experts = DeepseekExperts(config)
        shared = int(cfg(config, "n_shared_experts", 0))
        self.shared_experts = DeepseekMLP(config, config.moe_intermediate_size * shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat)
        out = self.experts(flat, weights, ids).view_as(x)
        return out if self.shared_experts is None else out + self.shared_experts(x)


# -- MLA attention ---------------------------------------------------------------------


class ReplicatedFusedLinear(FusedColumnLinear):
    """Replicated matrices reading the same input, stacked in one (MLA's q_a_proj and
    kv_a_proj_with_mqa): every rank holds them whole."""

    def __init__(self, input_size: int, output_sizes: dict, bias: bool = False):
        super().__init__(input_size, {sid: (n, n, 0) for sid, n in output_sizes.items()}, bias)


class DeepseekMLAAttention(nn.Module):
    """Multi-head latent attention; input_size defaults to hidden_size (EAGLE-3: 2H)."""

    def __init__(self, config, layer_idx: int = 0, input_size: int | None = None):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        H_in = input_size or H
        self.q_lora_rank = cfg(config, "q_lora_rank")
        self.kv_lora_rank = config.kv_lora_rank
        self.nope, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        qk = self.nope + self.rope_dim
        bias = bool(cfg(config, "attention_bias", False))
        self.num_heads = ps.divide(heads, ps.get_tp_size(), "number of attention heads")
        kv_a = self.kv_lora_rank + self.rope_dim
        if self.q_lora_rank:
            self.fused_qkv_a_proj = ReplicatedFusedLinear(H_in, {"q_a": self.q_lora_rank, "kv_a": kv_a}, bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, heads * qk)
        else:  # V2-Lite: a plain query projection
            self.q_proj = ColumnParallelLinear(H_in, heads * qk)
            self.kv_a_proj_with_mqa = ReplicatedLinear(H_in, kv_a, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, heads * (self.nope + self.v_dim))
        self.o_proj = RowParallelLinear(heads * self.v_dim, H, bias=bias)
        self.rotary_emb = get_rope(config, self.rope_dim, interleaved=bool(cfg(config, "rope_interleave", True)))
        self.attn = Attention(self.num_heads, self.num_heads, qk, scale=mla_softmax_scale(config, qk),
                              layer_idx=layer_idx, v_head_dim=self.v_dim)
        # Mistral Large 3 (config key ``llama_4_scaling``: {original_max_position_embeddings,
        # beta}, as vLLM's Mistral params.json adapter writes it): queries are scaled by
        # 1 + beta * log(1 + floor(position / original_max_position_embeddings)).
        scaling = cfg(config, "llama_4_scaling")
        self.llama4_scaling = None if not scaling else (
            float(scaling["original_max_position_embeddings"]), float(scaling["beta"]))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank:
            q_a, kv_a = self.fused_qkv_a_proj(x).split([self.q_lora_rank, self.kv_lora_rank + self.rope_dim], -1)
            q = self.q_b_proj(self.q_a_layernorm(q_a))
        else:
            q, kv_a = self.q_proj(x), self.kv_a_proj_with_mqa(x)
        q_nope, q_pe = q.unflatten(-1, (self.num_heads, -1)).split([self.nope, self.rope_dim], -1)
        latent, k_pe = kv_a.split([self.kv_lora_rank, self.rope_dim], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).unflatten(-1, (self.num_heads, -1))
        k_nope, v = kv.split([self.nope, self.v_dim], -1)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe.unsqueeze(-2))  # one rope key for all heads
        q = torch.cat([q_nope, q_pe], -1)
        if self.llama4_scaling is not None:
            original, beta = self.llama4_scaling
            q = q * (1 + beta * torch.log1p(torch.floor(positions / original))).unsqueeze(-1).unsqueeze(-1).to(q.dtype)
        k = torch.cat([k_nope, k_pe.expand(*k_nope.shape[:-1], self.rope_dim)], -1)
        return self.o_proj(self.attn(q, k, v))


# -- decoder layers --------------------------------------------------------------------


def target_layer_is_moe(config, layer_idx: int) -> bool:
    n_experts = int(cfg(config, "n_routed_experts", 0))
    first_moe = int(cfg(config, "first_k_dense_replace", 0))
    return n_experts > 0 and layer_idx >= first_moe and layer_idx % int(cfg(config, "moe_layer_freq", 1)) == 0


def head_layer_is_moe(config, layer_idx: int) -> bool:
    # Head layers come after the target's (see the module docstring).
    return int(cfg(config, "n_routed_experts", 0)) > 0


class DeepseekDecoderLayer(nn.Module):
    """Pre-norm MLA attention, then a dense MLP or MoE as ``is_moe(config, layer_idx)`` says."""

    is_moe = staticmethod(target_layer_is_moe)
    make_norm = staticmethod(rms_norm)

    def __init__(self, config, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = self.make_norm(config, config.hidden_size)
        self.self_attn = DeepseekMLAAttention(config, layer_idx=layer_idx)
        self.post_attention_layernorm = self.make_norm(config, config.hidden_size)
        self.mlp = DeepseekMoE(config) if self.is_moe(config, layer_idx) else DeepseekMLP(config)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


class DeepseekEagleDecoderLayer(DeepseekDecoderLayer):
    is_moe = staticmethod(head_layer_is_moe)


class DeepseekDenseDecoderLayer(DeepseekDecoderLayer):
    """EAGLE-3 layers after the first: always a dense MLP (vLLM's deepseek_eagle3)."""

    is_moe = staticmethod(lambda config, layer_idx: False)


# -- target model and heads ------------------------------------------------------------


class DeepseekForCausalLM(LlamaForCausalLM):
    """Target model for DeepseekV2ForCausalLM and DeepseekV3ForCausalLM checkpoints."""

    decoder_layer_cls = DeepseekDecoderLayer
    weight_mapping = DEEPSEEK_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.weight_mapping = deepseek_mapping(config, mtp_after=config.num_hidden_layers)


class DeepseekEagleHead(EagleHead):
    decoder_layer_cls = DeepseekEagleDecoderLayer
    input_norm_identity = False
    pre_fc_norms = True
    final_norm = True
    weight_mapping = DEEPSEEK_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.weight_mapping = deepseek_mapping(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """-> norm(h): vLLM's DeepSeek EAGLE feeds the normed feature back."""
        return self.norm(super().forward(input_ids, positions, hidden))

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head(h); h is forward's output, already normed."""
        logits = self.lm_head(h)
        missing = self.vocab_size - logits.shape[-1]
        if missing > 0:  # truncated vocab = the first ids; the rest can never be drafted
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], missing), float("-inf"))], -1)
        return logits


class DeepseekEagle3Head(Eagle3Head):
    attention_cls = DeepseekMLAAttention
    mlp_cls = DeepseekMLP
    decoder_layer_cls = DeepseekDenseDecoderLayer
    weight_mapping = DEEPSEEK_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.weight_mapping = deepseek_mapping(config)


def _deepseek_config(*args, model_type: str = "deepseek_v3", **kwargs):
    from transformers import AutoConfig  # imported on use: plugin discovery stays quick

    if model_type not in ROUTING_DEFAULTS:
        raise ValueError(f"deepseek config: model_type must be one of {list(ROUTING_DEFAULTS)}, got {model_type!r}")
    return AutoConfig.for_model(model_type, *args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="deepseek",
        architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        model_types=("deepseek_v2", "deepseek_v3"),
        target_model=DeepseekForCausalLM,
        eagle_head=DeepseekEagleHead,
        eagle3_head=DeepseekEagle3Head,
        weight_mapping=DEEPSEEK_MAPPING,
        # vLLM renames DeepSeek drafts to DeepSeekMTPModel before the EAGLE rename.
        extra_head_architectures=(("EagleDeepSeekMTPModel", "eagle"),),
        config_class=_deepseek_config,
    ))
