"""The deepseek family against transformers' own DeepSeek-V2 / V3 modules (same weights, fp32).

References: transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM and their
attention / MLP / MoE / RMSNorm / rotary classes; the published checkpoint layout as
transformers' save_pretrained writes it (per-expert keys); the head layouts vLLM's
deepseek_eagle / deepseek_eagle3 read (flat config, ``layers.0.*`` / ``midlayer.*``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf2
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf3

import eagle_zoo
import reference_models as rm
from eagle_zoo.config.eagle_config import rename_architecture
from eagle_zoo.engine.cache import allocate_kv_caches
from eagle_zoo.models import parallel_state as ps
from eagle_zoo.models.deepseek import (
    DEEPSEEK_MAPPING,
    DeepseekEagle3Head,
    DeepseekEagleHead,
    DeepseekForCausalLM,
    DeepseekMLAAttention,
    DeepseekMoE,
    DeepseekRouter,
    deepseek_mapping,
    register_families,
)
from eagle_zoo.models.loader import WeightLoadError, load_weights, map_name

V, H, B, T = 96, 32, 2, 7
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8,
        "original_max_position_embeddings": 16}


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 agreement relative to the tensor's scale: random 0.3-scale weights grow the
    residual stream to ~30, where summation order alone moves the last bits by ~1e-5
    (decode steps of up to 8 rows run kernels/cpu_decode.py, prefill MKL: 2.1e-5 seen
    where the scale was 5.5, so 5e-6 of the scale; a wrong layer misses by far more)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-6 * max(1.0, want.abs().max().item()))


class HF:
    """transformers' classes of one DeepSeek version, by role."""

    def __init__(self, version: str):
        m, p = (hf3, "DeepseekV3") if version == "v3" else (hf2, "DeepseekV2")
        self.version, self.config = version, DeepseekV3Config if version == "v3" else DeepseekV2Config
        self.causal_lm, self.layer = getattr(m, f"{p}ForCausalLM"), getattr(m, f"{p}DecoderLayer")
        self.attention, self.mlp = getattr(m, f"{p}Attention"), getattr(m, f"{p}MLP")
        self.norm = getattr(m, f"{p}RMSNorm")
        self.moe = getattr(m, "DeepseekV3MoE" if version == "v3" else "DeepseekV2Moe")
        self.rotary = getattr(m, f"{p}RotaryEmbedding")
        self.arch = f"{p}ForCausalLM"


def tiny_config(version: str, **kw):
    """Three layers (one dense, then MoE), 4 experts top-2 + 1 shared, v_head_dim != qk head dim."""
    base = dict(vocab_size=V, hidden_size=H, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
                num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, max_position_embeddings=64,
                rms_norm_eps=1e-5, attn_implementation="eager")
    # V3: sigmoid + bias routing within the best of 2 groups; V2: softmax, greedy.
    base.update(dict(n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                     num_nextn_predict_layers=0) if version == "v3" else dict(routed_scaling_factor=1.5))
    base.update(kw)
    return HF(version).config(**base)


def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Random weights everywhere, norms and V3's routing bias (a buffer, around 0) included
    (transformers initialises them to 1 / 0)."""
    return rm.randomize(module, seed, zero_centred=("e_score",))


causal_mask = rm.causal_mask


def inputs(seed=1, offset=3):
    return rm.token_inputs(V, B, T, seed, offset)


def published_experts(state: dict, prefix: str = "") -> dict:
    """transformers' in-memory fused experts -> the published per-expert keys
    (``experts.N.{gate,up,down}_proj.weight``), every other tensor unchanged."""
    out = {}
    for name, t in state.items():
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e, w in enumerate(t):  # [2I, H]: gate rows, then up rows
                gate, up = w.chunk(2, dim=0)
                out[f"{prefix}{base}{e}.gate_proj.weight"] = gate.clone()
                out[f"{prefix}{base}{e}.up_proj.weight"] = up.clone()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e, w in enumerate(t):
                out[f"{prefix}{base}{e}.down_proj.weight"] = w.clone()
        else:
            out[f"{prefix}{name}"] = t.clone()
    return out


def hf_target(version: str, seed: int = 0, **kw):
    return randomize(HF(version).causal_lm(tiny_config(version, **kw)), seed)


def zoo_target(ref) -> DeepseekForCausalLM:
    return rm.load_reference(DeepseekForCausalLM(ref.config), ref).eval()


# -- target model ------------------------------------------------------------------------

TARGET_CASES = {
    "v2-lite-no-q-lora": ("v2", dict(q_lora_rank=None)),
    "v2-yarn-group-limited": ("v2", dict(rope_parameters=YARN, topk_method="group_limited_greedy", n_group=2,
                                         topk_group=1)),
    "v3-yarn": ("v3", dict(rope_parameters=YARN)),
    "v3-no-q-lora-unnormed": ("v3", dict(q_lora_rank=None, norm_topk_prob=False)),
    "v3-neox-rope": ("v3", dict(rope_interleave=False, n_group=1, topk_group=1)),
}


@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_matches_transformers(case):
    version, kw = TARGET_CASES[case]
    ref = hf_target(version, **kw)
    model = DeepseekForCausalLM(ref.config)
    loaded = model.load_weights(ref.state_dict(), "model.safetensors")  # transformers' fused 3-D experts
    assert "layers.1.mlp.experts.gate_up_proj" in loaded and "layers.0.mlp.gate_up_proj.weight" in loaded
    assert ("layers.2.self_attn.fused_qkv_a_proj.weight" in loaded) == (kw.get("q_lora_rank", 24) is not None)
    ids, positions, _ = inputs()
    rm.assert_target_matches(model, ref, ids, positions, aux_layer_ids=(2, 0, 1), check=assert_close)


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_target_loads_published_layout(tmp_path, version):
    """save_pretrained writes per-expert keys; a V3 checkpoint's next-n (MTP) layer and
    old rotary caches are skipped."""
    kw = {"num_nextn_predict_layers": 1} if version == "v3" else {}
    ref = hf_target(version, seed=2, **kw)
    ref.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert "model.layers.2.mlp.experts.3.down_proj.weight" in weights
    assert not any(k.endswith("experts.gate_up_proj") for k in weights)
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    if version == "v3":  # what DeepSeek-V3's published checkpoint has after its last layer
        weights["model.layers.3.enorm.weight"] = torch.ones(H)
        weights["model.layers.3.mlp.experts.0.gate_proj.weight"] = torch.ones(16, H)
    model = DeepseekForCausalLM(ref.config)
    model.load_weights(weights, str(tmp_path))
    ids, positions, _ = inputs(seed=3)
    rm.assert_target_matches(model, ref, ids, positions, check=assert_close)


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_cached_decode_matches_full_forward(version):
    """Prefill then one-token steps through the KV cache (expanded k: 16 dims, v: 12)."""
    ref = hf_target(version, seed=4, rope_parameters=YARN)
    model = zoo_target(ref)
    ids, positions, _ = inputs(seed=5, offset=0)
    caches = allocate_kv_caches(model, num_slots=3, max_len=16, dtype=torch.float32, device=torch.device("cpu"))
    assert caches[0][0].shape[-2:] == (4, 16) and caches[0][1].shape[-2:] == (4, 12)
    assert caches.stacked is None  # k and v differ in width: one tensor per cache
    rm.assert_cached_decode_matches(model, ref, ids, positions, caches, slots=torch.tensor([2, 0]), prompt=4,
                                    check=assert_close)


# -- MoE -------------------------------------------------------------------------------------

MOE_CASES = {
    "v2-greedy": ("v2", {}),
    "v2-group-limited": ("v2", dict(topk_method="group_limited_greedy", n_group=2, topk_group=1)),
    "v3-grouped": ("v3", {}),
    "v3-ungrouped-unnormed": ("v3", dict(n_group=1, topk_group=1, norm_topk_prob=False)),
}


@pytest.mark.parametrize("case", list(MOE_CASES))
@pytest.mark.parametrize("tokens", [1, 14], ids=["gathered", "dense"])  # N * top_k < E or not
def test_moe_matches_transformers(case, tokens):
    version, kw = MOE_CASES[case]
    config = tiny_config(version, **kw)
    ref = randomize(HF(version).moe(config), seed=6)
    moe = DeepseekMoE(config)
    # Under its checkpoint name (mapping parts start with a dot: ".experts.0.gate_proj.weight").
    holder = nn.ModuleDict({"mlp": moe})
    load_weights(holder, published_experts(ref.state_dict(), "mlp."), deepseek_mapping(config), "moe.safetensors")
    x = torch.randn(1, tokens, H, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert_close(moe(x), ref(x))


def test_router_stays_float32():
    moe = DeepseekMoE(tiny_config("v3"))
    randomize(moe, 8).to(torch.bfloat16)
    assert moe.gate.weight.dtype == torch.float32 and moe.gate.e_score_correction_bias.dtype == torch.float32
    assert moe.experts.gate_up_proj.dtype == torch.bfloat16
    assert moe(torch.randn(1, 3, H, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_tensor_parallel_shards_sum_to_the_whole(monkeypatch, version):
    """At a faked tp size 2, MLA (heads split) and MoE (expert intermediate split) give
    partial outputs that add up to the unsharded module's output."""
    config = tiny_config(version, rope_parameters=YARN)
    ref = hf_target(version, seed=9, rope_parameters=YARN)
    prefix = "model.layers.1."
    weights = {k[len(prefix):]: v for k, v in ref.state_dict().items()
               if k.startswith((prefix + "self_attn.", prefix + "mlp."))}
    mapping = deepseek_mapping(config)

    def build(rank, size):
        with ps.fake(rank, size):
            attn, moe = DeepseekMLAAttention(config, 0), DeepseekMoE(config)
        load_weights(nn.ModuleDict({"self_attn": attn, "mlp": moe}), weights, mapping, "layer 1")
        return attn, moe

    _, positions, g = inputs()
    x = torch.randn(B, T, H, generator=g)
    with torch.no_grad():
        attn, moe = build(0, 1)
        whole = attn(positions, x), moe(x)
        monkeypatch.setattr(ps, "all_reduce", lambda t, tp=None: t)  # each rank's partial sum
        parts = [build(r, 2) for r in range(2)]
        assert parts[0][0].num_heads == 2 and parts[0][1].experts.inter == 8
        summed = (sum(a(positions, x) for a, _ in parts), sum(m(x) for _, m in parts))
    for got, want in zip(summed, whole):
        assert_close(got, want)


# -- checkpoint writers (the head layouts vLLM's DeepSeek EAGLE files read) -----------------


def write_head(directory: Path, config, architecture: str, weights: dict, **extra) -> Path:
    """A flat config.json (the draft's DeepSeek config, num_hidden_layers 1) + model.safetensors."""
    cfg = config.to_dict()
    for key in ("transformers_version", "_name_or_path", "id2label", "label2id", "attn_implementation"):
        cfg.pop(key, None)
    cfg.update(architectures=[architecture], num_hidden_layers=1, **extra)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory


@pytest.fixture
def builtin_plugins(monkeypatch, reset_plugin_host):
    """The global plugin host with the built-in plugins only: what is tested here is
    the built-in family, whatever third-party packages happen to be installed."""
    monkeypatch.setenv(reset_plugin_host.DISABLE_AUTOLOAD_ENV, "1")
    return reset_plugin_host


def shared_target(version: str, **kw) -> DeepseekForCausalLM:
    return zoo_target(hf_target(version, seed=20, **kw))


# -- EAGLE-1 head ------------------------------------------------------------------------------


class RefEagle(nn.Module):
    """DeepSeek EAGLE from transformers' modules: fc(cat[enorm(embed), hnorm(hidden)]) ->
    a full DeepSeek decoder layer (input norm kept) -> final norm -> lm_head."""

    def __init__(self, config, version: str, moe: bool):
        super().__init__()
        hf, eps = HF(version), config.rms_norm_eps
        self.embed = nn.Embedding(V, H)
        self.enorm, self.hnorm, self.norm = hf.norm(H, eps), hf.norm(H, eps), hf.norm(H, eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        # transformers builds the MoE for layer indices >= first_k_dense_replace.
        self.layer = hf.layer(config, config.first_k_dense_replace if moe else 0)
        assert isinstance(self.layer.mlp, hf.moe) == moe
        self.lm_head = nn.Linear(H, V, bias=False)
        self.rotary = hf.rotary(config)

    def forward(self, ids, positions, hidden):
        h = self.fc(torch.cat([self.enorm(self.embed(ids)), self.hnorm(hidden)], -1))
        h = self.layer(h, attention_mask=causal_mask(h.shape[1]), position_embeddings=self.rotary(h, positions),
                       position_ids=positions)
        return self.norm(h)

    def checkpoint(self, lm_head: bool) -> dict:
        sd = {"embed_tokens.weight": self.embed.weight, "enorm.weight": self.enorm.weight,
              "hnorm.weight": self.hnorm.weight, "fc.weight": self.fc.weight, "norm.weight": self.norm.weight}
        if lm_head:
            sd["lm_head.weight"] = self.lm_head.weight
        sd.update(published_experts(self.layer.state_dict(), "layers.0."))
        return {k: v.detach().clone() for k, v in sd.items()}


EAGLE_CASES = {
    # (version, config keys, architecture in config.json, lm_head in the checkpoint)
    "v3-moe-own-lm-head": ("v3", dict(rope_parameters=YARN), "DeepseekV3ForCausalLM", True),
    "v3-dense-mtp-name": ("v3", dict(q_lora_rank=None, n_routed_experts=0), "EagleDeepSeekMTPModel", False),
    "v2-moe-shared-lm-head": ("v2", {}, "DeepseekV2ForCausalLM", False),
}


@pytest.mark.parametrize("case", list(EAGLE_CASES))
def test_eagle_head_loads_and_matches_reference(tmp_path, builtin_plugins, case):
    version, kw, arch, own_lm_head = EAGLE_CASES[case]
    config = tiny_config(version, **kw)
    moe = config.n_routed_experts > 0
    ref = randomize(RefEagle(config, version, moe), seed=10)
    ckpt = ref.checkpoint(own_lm_head)
    assert ("layers.0.mlp.experts.3.up_proj.weight" in ckpt) == moe
    target = shared_target(version)
    if not own_lm_head:
        ref.lm_head.weight.data.copy_(target.lm_head.weight)
    path = write_head(tmp_path / case, config, arch, ckpt)

    got = eagle_zoo.load(path, target=target)
    head = got.head
    assert (got.format, got.family, got.method) == ("yuhuili-eagle", "deepseek", "eagle")
    assert isinstance(head, DeepseekEagleHead) and head.fc.bias is None
    assert got.shared == ([] if own_lm_head else ["lm_head"])
    assert isinstance(head.layers[0].mlp, DeepseekMoE) == moe
    assert not isinstance(head.layers[0].input_layernorm, nn.Identity)

    ids, positions, g = inputs(seed=11)
    hidden = torch.randn(B, T, H, generator=g)
    _, expected, logits = rm.eagle_step(head, ref, ids, positions, hidden, check=assert_close)  # the normed feature
    with torch.no_grad():
        assert_close(logits, ref.lm_head(expected))


# -- EAGLE-3 head ------------------------------------------------------------------------------


class RefEagle3(rm.Eagle3Reference):
    """EAGLE-3 layer 0 from transformers' DeepSeek attention (q_a_proj / q_proj and
    kv_a_proj_with_mqa widened to read 2H), dense MLP and RMSNorm."""

    def __init__(self, config, version: str, draft_vocab: int, norm_before_residual: bool):
        super().__init__()
        hf = HF(version)
        self.nbr = norm_before_residual
        self.embed = nn.Embedding(V, H)
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.build_layer(config, draft_vocab, hf.attention, hf.mlp, hf.norm, hf.rotary,
                         widen=("q_a_proj", "q_proj", "kv_a_proj_with_mqa"))  # q_a_proj is None without q_lora

    def checkpoint(self, d2t, t2d) -> dict:
        """The yuhuili / SpecForge layout: midlayer.*, fc, norm, lm_head, d2t, t2d; no embed_tokens."""
        sd = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight,
              "d2t": d2t, "t2d": t2d}
        sd.update(self.layer_state("midlayer."))
        return {k: v.detach().clone() for k, v in sd.items()}


EAGLE3_CASES = {
    "v3-q-lora": ("v3", dict(rope_parameters=YARN), False, "Eagle3DeepseekV3ForCausalLM"),
    "v3-no-q-lora-nbr": ("v3", dict(q_lora_rank=None), True, "DeepseekV3ForCausalLMEagle3"),
    "v2-q-lora": ("v2", dict(rope_parameters=YARN), False, "Eagle3DeepseekV2ForCausalLM"),
}


@pytest.mark.parametrize("case", list(EAGLE3_CASES))
def test_eagle3_head_loads_and_matches_reference(tmp_path, builtin_plugins, case):
    version, kw, nbr, arch = EAGLE3_CASES[case]
    draft_vocab = 40
    config = tiny_config(version, **kw)
    ref = randomize(RefEagle3(config, version, draft_vocab, nbr), seed=12)
    g = torch.Generator().manual_seed(13)
    draft_ids = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    d2t = draft_ids - torch.arange(draft_vocab)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    target = shared_target(version)
    ref.embed.weight.data.copy_(target.embed_tokens.weight)
    path = write_head(tmp_path / case, config, arch, ref.checkpoint(d2t, t2d), draft_vocab_size=draft_vocab,
                      norm_before_residual=nbr)

    got = eagle_zoo.load(path, target=target)
    head = got.head
    assert (got.format, got.family, got.method) == ("yuhuili-eagle3", "deepseek", "eagle3")
    assert got.shared == ["embed_tokens"]
    assert isinstance(head, DeepseekEagle3Head)
    attn = head.layers[0].self_attn
    first = attn.fused_qkv_a_proj if kw.get("q_lora_rank", 24) else attn.q_proj
    assert first.weight.shape[1] == 2 * H

    ids, positions, g = inputs(seed=14)
    aux_cat = torch.randn(B, T, 3 * H, generator=g)
    draft_logits, logits = rm.eagle3_step(head, ref, ids, positions, aux_cat, check=assert_close)
    assert_close(logits[..., draft_ids], draft_logits)
    assert torch.isneginf(logits[..., ~t2d]).all()


# -- the mapping table -------------------------------------------------------------------------


def test_every_mapping_entry_maps_a_published_key(tmp_path):
    """Each stacked entry of DEEPSEEK_MAPPING and of a config's expert table matches a key
    transformers writes, and lands on a parameter of the model with its shard id."""
    keys, params = set(), set()
    for q_lora in (24, None):
        ref = hf_target("v3", seed=15, q_lora_rank=q_lora)
        ref.save_pretrained(tmp_path / str(q_lora))
        keys |= set(load_file(str(tmp_path / str(q_lora) / "model.safetensors")))
        params |= {n for n, _ in DeepseekForCausalLM(ref.config).named_parameters()}
    config = tiny_config("v3")
    mapping = deepseek_mapping(config, mtp_after=config.num_hidden_layers)
    assert set(DEEPSEEK_MAPPING.stacked) <= set(mapping.stacked)
    assert len(mapping.stacked) == len(DEEPSEEK_MAPPING.stacked) + 3 * config.n_routed_experts
    for fused, part, shard_id in mapping.stacked:
        matching = [k for k in sorted(keys) if part in k]
        assert matching, f"no published key contains {part!r}"
        name, got_shard = map_name(matching[0], mapping)
        assert got_shard == shard_id and name in params and fused in name, (matching[0], name)
    for old, new in mapping.renames:
        assert any(k.startswith(old.lstrip("^")) for k in keys)
    # Without q_lora_rank, q_a_proj / kv_a_proj_with_mqa are not fused.
    plain = deepseek_mapping(tiny_config("v3", q_lora_rank=None))
    assert map_name("layers.0.self_attn.kv_a_proj_with_mqa.weight", plain) == (
        "layers.0.self_attn.kv_a_proj_with_mqa.weight", None)


def test_missing_expert_shard_is_named():
    ref = hf_target("v3", seed=16)
    weights = published_experts(ref.state_dict())
    del weights["model.layers.2.mlp.experts.1.up_proj.weight"]
    with pytest.raises(WeightLoadError, match=r"layers.2.mlp.experts.gate_up_proj.*\(1, 'up'\)"):
        DeepseekForCausalLM(ref.config).load_weights(weights, "model.safetensors")


def test_mis_shaped_expert_is_named():
    ref = hf_target("v2", seed=17)
    weights = published_experts(ref.state_dict())
    weights["model.layers.1.mlp.experts.0.down_proj.weight"] = torch.zeros(H, 8)
    with pytest.raises(WeightLoadError, match=r"experts.0.down_proj.*\(32, 16\)"):
        DeepseekForCausalLM(ref.config).load_weights(weights, "model.safetensors")


@pytest.mark.parametrize("bad, match", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(topk_method="noaux_tc", scoring_func="softmax"), "topk_method 'noaux_tc' with scoring_func 'softmax'"),
    (dict(topk_method="group_limited_greedy", n_group=3, topk_group=1), "n_group"),
])
def test_bad_config_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        DeepseekForCausalLM(tiny_config("v2", **bad))


def test_unknown_model_type_needs_routing_keys():
    class Cfg:
        model_type, n_routed_experts, num_experts_per_tok, hidden_size = "deepseek_mtp", 4, 2, H

    with pytest.raises(ValueError, match="scoring_func"):
        DeepseekRouter(Cfg())
    Cfg.scoring_func, Cfg.topk_method = "sigmoid", "noaux_tc"
    assert DeepseekRouter(Cfg()).e_score_correction_bias is not None


# -- registration ------------------------------------------------------------------------------


def test_registers_deepseek_family():
    spec = rm.registered_spec(register_families, name="deepseek",
                              architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
                              model_types=("deepseek_v2", "deepseek_v3"), target_model=DeepseekForCausalLM,
                              weight_mapping=DEEPSEEK_MAPPING,
                              heads={"eagle": DeepseekEagleHead, "eagle3": DeepseekEagle3Head})
    assert ("EagleDeepSeekMTPModel", "eagle") in spec.extra_head_architectures
    assert spec.config_class(model_type="deepseek_v2", hidden_size=64).model_type == "deepseek_v2"


def test_registry_resolves_deepseek_head_names(builtin_plugins):
    registry = builtin_plugins.get_registry()
    for arch in ("EagleDeepseekV2ForCausalLM", "EagleDeepseekV3ForCausalLM", "EagleDeepSeekMTPModel"):
        assert registry.head_class(arch) is DeepseekEagleHead
    for arch in ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMEagle3"):
        assert registry.head_class(arch) is DeepseekEagle3Head
    # vLLM's own draft name for DeepSeek, renamed by the EAGLE rule
    assert registry.head_class(rename_architecture("DeepSeekMTPModel", "eagle")) is DeepseekEagleHead
    assert registry.family_for_config({"model_type": "deepseek_v2"}).name == "deepseek"
