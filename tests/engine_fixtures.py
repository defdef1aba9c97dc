"""Tiny random checkpoints and independent references for the engine tests.

Targets are written by transformers itself (``XForCausalLM(config).save_pretrained``)
for every family registered in eagle_zoo.plugins that serves a target model, so a new
family file is picked up without touching the tests. Weights are re-randomised at a
larger scale than transformers' 0.02 init: near-flat logits would let an argmax flip
under fp32 round-off between a batched verification pass and a one-token decode step,
which would make greedy-equality tests flaky without any bug.

Heads are written in the yuhuili layouts (flat HF config; EAGLE-1 ``layers.0.*`` /
EAGLE-3 ``midlayer.*`` with ``d2t`` / ``t2d``): the family's own head module is built
with random weights and its fused parameters are split back into the checkpoint names
its WeightMapping reads (q/k/v, gate/up, ...), so the file looks like a published one.

References nobody here wrote: transformers' own forward (``hf_greedy``,
``hf_probs``), and a plain-Python prompt lookup (``ngram_lookup``).
"""
from __future__ import annotations

import copy
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

from checkpoint_factory import DRAFT_VOCAB, TINY, save_weights, vocab_map

# Every tiny target: the checkpoint factory's head dimensions (so its published-layout
# Llama heads fit), four layers (EAGLE-3's default aux layers (2, N//2, N-3) exist).
TARGET_LAYERS = 4
TINY_TARGET = {**TINY, "num_hidden_layers": TARGET_LAYERS, "bos_token_id": 1, "eos_token_id": 2}
# Family-specific keys that keep a config tiny, by HF model_type. A family without an
# entry gets TINY_TARGET alone (fine for Llama-shaped families).
FAMILY_CONFIG: dict[str, dict] = {
    # Windows shorter than the sequences: the cache path must apply them.
    "mistral": {"sliding_window": 24},
    "cohere2": {"sliding_window": 16},
    "deepseek_v3": dict(
        num_key_value_heads=4, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
        q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8,
        num_nextn_predict_layers=0,
    ),
    "deepseek_v2": dict(
        num_key_value_heads=4, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8,
    ),
    "llama4_text": dict(
        intermediate_size_mlp=64, num_local_experts=2, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=4096,
    ),
}
METHODS = ("eagle", "eagle3")


# -- which families the engine tests run on ------------------------------------------
@dataclass(frozen=True)
class TargetKind:
    family: str        # the FamilySpec's name
    model_type: str    # HF model_type of the tiny target
    architecture: str  # the transformers class that writes it (a name the family serves)


def _hf_causal_lm_names() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def target_kinds(spec) -> tuple[list[TargetKind], str]:
    """Every transformers causal-LM class the family says it serves (one per class),
    or ([], why not)."""
    if spec.target_model is None:
        return [], f"family {spec.name!r} registers no target model"
    names = _hf_causal_lm_names()
    # Text-only configs first (llama4_text before the multimodal llama4 wrapper).
    types = sorted(spec.model_types, key=lambda mt: not mt.endswith("_text"))
    kinds: dict[str, TargetKind] = {}
    for mt in types:
        arch = names.get(mt)
        if arch in spec.architectures and arch not in kinds:
            kinds[arch] = TargetKind(spec.name, mt, arch)
    if kinds:
        return list(kinds.values()), ""
    return [], (f"family {spec.name!r}: transformers has no causal-LM class for model_types "
                f"{list(spec.model_types)} among its architectures {list(spec.architectures)}, "
                f"so no reference target can be written")


def target_kind(spec) -> tuple[Optional[TargetKind], str]:
    """The family's first kind (see target_kinds), or (None, why not)."""
    kinds, why = target_kinds(spec)
    return (kinds[0] if kinds else None), why


def kind_of(family: str) -> TargetKind:
    """The first kind of the registered family ``family``; fails, saying why, where it
    has none (the tests that call this need that family's target)."""
    from eagle_zoo.plugins import get_registry

    kind, why = target_kind(get_registry().families[family])
    assert kind is not None, why
    return kind


def family_params(methods=(None,)) -> list:
    """pytest params over (TargetKind, method) for every registered family with a
    target model, once per transformers class it serves; unsupported combinations
    carry an explicit skip reason."""
    from eagle_zoo.plugins import get_registry

    params = []
    for name, spec in sorted(get_registry().families.items()):
        kinds, why = target_kinds(spec)
        for kind in kinds or [None]:
            fid = name if len(kinds) <= 1 else f"{name}[{kind.model_type}]"
            for method in methods:
                pid = fid if method is None else f"{fid}-{method}"
                if kind is None:
                    params.append(pytest.param(None, method, id=pid, marks=pytest.mark.skip(reason=why)))
                elif method in METHODS and spec.head_class(method) is None:
                    reason = f"family {name!r} registers no {method} head"
                    params.append(pytest.param(kind, method, id=pid, marks=pytest.mark.skip(reason=reason)))
                else:
                    params.append(pytest.param(kind, method, id=pid))
    return params


def family_spec(kind: TargetKind):
    from eagle_zoo.plugins import get_registry

    return get_registry().families[kind.family]


# -- targets -----------------------------------------------------------------------------
def tiny_config(kind: TargetKind, **overrides):
    """transformers' config for the tiny target of ``kind``."""
    from transformers import AutoConfig

    fields = {**TINY_TARGET, **FAMILY_CONFIG.get(kind.model_type, {}), **overrides}
    fields.setdefault("architectures", [kind.architecture])
    return AutoConfig.for_model(kind.model_type, **fields)


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int, scale: float = 0.3) -> torch.nn.Module:
    """Random weights everywhere: matrices N(0, scale); 1-D weights (norm scales)
    1 + N(0, 0.1); biases N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if p.dim() >= 2:
            value = noise * scale
        elif name.endswith("bias"):
            value = noise * 0.1
        else:
            value = 1.0 + noise * 0.1
        p.copy_(value.to(p.dtype))
    return module


def write_target(directory, kind: TargetKind, seed: int = 0, scale: float = 0.3,
                 edit: Optional[Callable] = None, **config_overrides) -> Path:
    """A tiny random target saved by transformers; ``edit(model)`` may change weights first."""
    import transformers

    config = tiny_config(kind, **config_overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, kind.architecture)(config)
    randomize(model, seed, scale)
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(directory)
    return Path(directory)


def load_hf(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                attn_implementation="eager").eval()


@torch.no_grad()
def hf_greedy(directory, prompts: list[list[int]], max_tokens: list[int], model=None) -> list[list[int]]:
    """Greedy continuations (EOS ignored) by transformers' forward and its own KV cache."""
    model = model or load_hf(directory)
    # transformers 5.x renamed past_key_values to cache (the old name warns).
    key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    outs = []
    for prompt, n in zip(prompts, max_tokens):
        out = model(torch.tensor([prompt]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        while len(tokens) < n:
            out = model(torch.tensor([tokens[-1:]]), use_cache=True, **{key: getattr(out, key)})
            tokens.append(int(out.logits[0, -1].argmax()))
        outs.append(tokens)
    return outs


@torch.no_grad()
def hf_next_token_probs(model, ids: list[int], temperature: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """The next-token distribution of transformers' forward, after temperature and top-k."""
    logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].double() / temperature
    if top_k:
        kth = logits.topk(top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


def hf_three_token_probs(model, prompt: list[int], top_k: int) -> dict[tuple, float]:
    """The exact joint distribution of the next three tokens after ``prompt`` (sampling
    at temperature 1 with ``top_k``), by chaining transformers' conditionals:
    {(a, b, c): p(a) p(b | a) p(c | a, b)} over every non-zero path."""
    expected: dict[tuple, float] = {}
    p1 = hf_next_token_probs(model, prompt, top_k=top_k)
    for a in p1.nonzero().flatten().tolist():
        p2 = hf_next_token_probs(model, prompt + [a], top_k=top_k)
        for b in p2.nonzero().flatten().tolist():
            p3 = hf_next_token_probs(model, prompt + [a, b], top_k=top_k)
            for c in p3.nonzero().flatten().tolist():
                expected[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return expected


@torch.no_grad()
def hf_head_features(hf_target, head, method: str, history: list[int]) -> torch.Tensor:
    """[1, len(history) - 1, H]: what an EAGLE head reads from the target at each
    verified position (the last token has no target pass yet), from transformers'
    forward: its final hidden state, or for EAGLE-3 the residual streams entering the
    aux layers (the head's config, else the default 2, N//2, N-3) fused by the head's fc."""
    hf = hf_target(torch.tensor([history[:-1]]), output_hidden_states=True, use_cache=False)
    if method == "eagle3":
        layers = hf_target.config.num_hidden_layers
        aux = getattr(head.config, "eagle_aux_hidden_state_layer_ids", None) or (2, layers // 2, layers - 3)
        return head.combine_hidden_states(torch.cat([hf.hidden_states[i] for i in aux], -1))
    return hf.hidden_states[-1]


# -- heads --------------------------------------------------------------------------------
def head_config_dict(kind: TargetKind, method: str, draft_vocab: int = DRAFT_VOCAB,
                     aux_layer_ids: Optional[list[int]] = None) -> dict:
    """A flat (yuhuili-style) config.json for a one-layer head of ``kind``'s family."""
    from eagle_zoo.config.eagle_config import rename_architecture

    cfg = tiny_config(kind, num_hidden_layers=1).to_dict()
    for key in ("transformers_version", "_name_or_path", "id2label", "label2id"):
        cfg.pop(key, None)
    if method == "eagle3":
        cfg["architectures"] = [rename_architecture(kind.architecture, "eagle3")]
        cfg["draft_vocab_size"] = draft_vocab
        if aux_layer_ids is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    return cfg


def _fused_parts(mapping) -> dict[str, list[tuple[str, object]]]:
    parts: dict[str, list] = {}
    for fused, part, shard_id in mapping.stacked:
        parts.setdefault(fused, []).append((part, shard_id))
    return parts


def export_state_dict(module: torch.nn.Module, mapping) -> dict[str, torch.Tensor]:
    """The module's tensors under checkpoint names: fused parameters (FusedColumnLinear)
    split back into the parts the WeightMapping stacks (q/k/v, gate/up, ...)."""
    from eagle_zoo.models.layers import FusedColumnLinear

    out = {}
    fused_parts = _fused_parts(mapping)
    for name, tensor in module.state_dict().items():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        split = None
        if isinstance(owner, FusedColumnLinear) and leaf in ("weight", "bias"):
            for fused, parts in fused_parts.items():
                ids = {sid for _, sid in parts}
                if fused in name and ids == set(owner.shards):
                    split = (fused, parts)
                    break
        if split is None:
            out[name] = tensor.detach().clone()
            continue
        fused, parts = split
        sizes = [owner.shards[sid][0] for sid in owner.shards]
        chunks = dict(zip(owner.shards, tensor.detach().split(sizes, 0)))
        for part, sid in parts:
            out[name.replace(fused, part)] = chunks[sid].clone()
    return out


def write_head(directory, kind: TargetKind, method: str, seed: int = 0, scale: float = 0.1,
               draft_vocab: int = DRAFT_VOCAB, aux_layer_ids: Optional[list[int]] = (1, 2, 3)) -> Path:
    """A random one-layer ``method`` head of ``kind``'s family in the yuhuili layout.

    embed_tokens (and, for EAGLE-1, lm_head) are left out: the engine shares the
    target's. EAGLE-3 gets a draft vocabulary of ``draft_vocab`` ids with d2t / t2d.
    The written directory is read back through the format reader and checked to load
    into a fresh head with identical tensors, so an engine failure is the engine's."""
    from eagle_zoo.checkpoints.formats import read_checkpoint
    from eagle_zoo.config.eagle_config import EagleConfig

    directory = Path(directory)
    spec = family_spec(kind)
    cfg = head_config_dict(kind, method, draft_vocab, aux_layer_ids)
    head = spec.head_class(method)(EagleConfig.from_dict(copy.deepcopy(cfg), method=method))
    randomize(head, seed, scale)
    if method == "eagle3":
        d2t, t2d = vocab_map(cfg["vocab_size"], draft_vocab, seed)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    state = export_state_dict(head, spec.weight_mapping)
    drop = ("embed_tokens.", "lm_head.") if method == "eagle" else ("embed_tokens.",)
    state = {k: v for k, v in state.items() if not k.startswith(drop)}
    if method == "eagle3":  # yuhuili / SpecForge name the first layer midlayer.
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                 for k, v in state.items()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    save_weights(directory, state, "safetensors")

    raw = read_checkpoint(directory)
    fresh = spec.head_class(method)(raw.config)
    loaded = fresh.load_weights(raw.weights, source=str(directory))
    want = head.state_dict()
    for name in loaded:
        assert torch.equal(fresh.state_dict()[name], want[name]), f"{directory}: {name} did not round-trip"
    return directory


# -- prompt lookup reference --------------------------------------------------------------
def ngram_lookup(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup as documented: the longest n in [n_min, n_max] whose trailing n-gram
    occurred earlier; the latest such earlier occurrence; the up to k tokens after it."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


def random_prompts(lengths, vocab: int, seed: int = 0, low: int = 3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=gen).tolist() for n in lengths]


# -- weight edits for high-acceptance cases (transformers' Llama module names) ------------
def perturb_edit(relative: float, seed: int = 99, scale: float = 0.3) -> Callable:
    """edit= for write_target: add N(0, relative * scale) to every matrix (a near copy
    of the target drafts well but not perfectly)."""
    def edit(model):
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * relative * scale)
    return edit


def bigram_edit(scale: float = 0.02) -> Callable:
    """edit= for a Llama write_target: attention and MLP outputs scaled down, final norm
    weight 1, so the next token depends mostly on the current one (lm_head(embed(x)) up
    to a positive factor) and only a little on the context."""
    def edit(model):
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
        model.model.norm.weight.fill_(1.0)
    return edit


def write_bigram_eagle_head(directory, target_dir, seed: int = 3, every: int = 7) -> Path:
    """A yuhuili EAGLE-1 head that predicts a bigram target's next token from the token
    alone: fc = [I | 0] (embedding only), attention and MLP outputs zero, so its logits
    are lm_head(embed(x)). Every ``every``-th embedding row is replaced by noise, so some
    drafts are wrong and acceptance is high but not total."""
    from safetensors.torch import load_file

    from checkpoint_factory import eagle1_weights, llama_config, write_config

    target = load_file(str(Path(target_dir) / "model.safetensors"))
    cfg = llama_config()
    H = cfg["hidden_size"]
    w = eagle1_weights(cfg, fc_bias=False, seed=seed)
    w["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1)
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.mlp.down_proj.weight"].zero_()
    embed = target["model.embed_tokens.weight"].clone()
    gen = torch.Generator().manual_seed(seed)
    embed[::every] = torch.randn(embed[::every].shape, generator=gen) * 0.3
    w["embed_tokens.weight"] = embed
    write_config(directory, cfg)
    save_weights(directory, w, "bin")  # yuhuili ships pytorch_model.bin
    return Path(directory)


def bigram_head_next_tokens(head_dir, target_dir) -> list[int]:
    """What the write_bigram_eagle_head head drafts after each token x, computed from the
    files alone: its feature is exactly embed'(x) (fc = [I | 0], zero attention and MLP
    outputs), so its draft is argmax(target lm_head @ embed'(x))."""
    from safetensors.torch import load_file

    head = torch.load(Path(head_dir) / "pytorch_model.bin", weights_only=True)
    lm_head = load_file(str(Path(target_dir) / "model.safetensors"))["lm_head.weight"]
    return (head["embed_tokens.weight"] @ lm_head.T).argmax(-1).tolist()


class RunnerGraphStandIn:
    """Stands in for runner.graphed (engine/graphs.py) on CPU: takes the calls a CUDA
    graph would replay and runs the forward a captured graph runs (full-length context,
    keys masked by position)."""

    def __init__(self, runner, name, calls):
        self.runner, self.name, self.calls = runner, name, calls

    def eligible(self, input_ids):
        return input_ids.shape[1] <= 16

    def __call__(self, input_ids, positions, slot_ids, *args):
        self.calls.append((self.name, input_ids.shape[1]))
        return self.runner.forward_full_length(input_ids, positions, slot_ids, *args)


class StepGraphStandIn:
    """Stands in for a whole-step CUDA graph (EngineCore.tree_step_graph, chain_step_graph,
    graphs.StepGraph) on the CPU: records (name, T) of each call and runs the function the
    graph would capture (graphs.feeding_step of the step's whole-row form) directly, so it
    feeds its next call through its inputs as the graph does."""

    def __init__(self, fn, calls, name, scratch_slot, drafted=None):
        from eagle_zoo.engine.graphs import feeding_step

        self.fn = feeding_step(fn, scratch_slot, drafted)
        self.calls, self.name = calls, name

    def eligible(self, input_ids):
        return True

    def __call__(self, last, base, slots, *args):
        self.calls.append((self.name, last.shape[1]))
        return self.fn(last, base, slots, *args)
