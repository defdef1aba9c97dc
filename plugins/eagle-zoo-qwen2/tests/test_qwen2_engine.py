"""Speculative decoding must not change greedy output on a Qwen2 target: eagle_zoo.LLM
with this plugin's target model, heads in the published layouts and n-gram lookup
produce the plain greedy tokens, which are transformers' own greedy tokens.

Continuous batching: more prompts than max_num_seqs, different prompt lengths and
max_tokens, so requests join and leave between steps. Prompts are token ids (the
tiny targets have no tokenizer)."""
from __future__ import annotations

import json

import pytest
import torch

from eagle_zoo import LLM, SamplingParams
from qwen2_fixtures import (
    TINY,
    bigram_edit,
    hf_greedy,
    random_prompts,
    write_bigram_head,
    write_target,
    write_yuhuili_qwen2_head,
    yuhuili_qwen2_weights,
    yuhuili_qwen2_config,
)

LENGTHS = (5, 12, 3, 9)
MAX_TOKENS = (20, 14, 18, 11)
MAX_NUM_SEQS = 2
MAX_MODEL_LEN = 80

pytestmark = pytest.mark.usefixtures("one_thread", "k_drafts_every_step")


def run(target, prompts, max_tokens, spec=None):
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32",
              max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A tied-embedding Qwen2 target (as Qwen2.5-0.5B / 1.5B), its prompts, transformers'
    greedy continuations and the engine's plain ones."""
    root = tmp_path_factory.mktemp("qwen2")
    target = write_target(root / "target", seed=0, tie_word_embeddings=True)
    prompts = random_prompts(LENGTHS, seed=1)
    want = hf_greedy(target, prompts, MAX_TOKENS)
    _, plain = run(target, prompts, MAX_TOKENS)
    return root, target, prompts, want, plain


def test_plain_greedy_matches_transformers(case):
    _, _, _, want, plain = case
    assert plain == want


def write_llama_eagle3_head(directory, seed: int = 0, draft_vocab: int = 48):
    """A SpecForge-style EAGLE-3 head for a Qwen2.5 target (the published kind:
    LlamaForCausalLMEagle3, midlayer.*, d2t / t2d), written by hand at tiny sizes."""
    g = torch.Generator().manual_seed(seed)
    H, V, I = TINY["hidden_size"], TINY["vocab_size"], TINY["intermediate_size"]
    nh, nkv, d = TINY["num_attention_heads"], TINY["num_key_value_heads"], H // TINY["num_attention_heads"]
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": nh, "num_key_value_heads": nkv,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": draft_vocab, "hidden_act": "silu",
           "rms_norm_eps": 1e-6, "rope_theta": TINY["rope_theta"], "max_position_embeddings": 256,
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    w = {"midlayer.self_attn.q_proj.weight": rand(nh * d, 2 * H),
         "midlayer.self_attn.k_proj.weight": rand(nkv * d, 2 * H),
         "midlayer.self_attn.v_proj.weight": rand(nkv * d, 2 * H),
         "midlayer.self_attn.o_proj.weight": rand(H, nh * d),
         "midlayer.mlp.gate_proj.weight": rand(I, H), "midlayer.mlp.up_proj.weight": rand(I, H),
         "midlayer.mlp.down_proj.weight": rand(H, I),
         "fc.weight": rand(H, 3 * H), "lm_head.weight": rand(draft_vocab, H) * 3}
    for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        w[f"midlayer.{n}.weight"] = 1 + rand(H)
    w["norm.weight"] = 1 + rand(H)
    targets = torch.randperm(V, generator=g)[:draft_vocab].sort().values
    w["d2t"] = targets - torch.arange(draft_vocab)
    w["t2d"] = torch.zeros(V, dtype=torch.bool)
    w["t2d"][targets] = True
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.save(w, directory / "pytorch_model.bin")
    return directory


@pytest.mark.parametrize("method", ["eagle", "eagle3", "ngram"])
def test_greedy_speculative_equals_plain(case, method):
    root, target, prompts, _, plain = case
    if method == "eagle":  # a random head in the published yuhuili EAGLE-Qwen2 layout
        head = write_yuhuili_qwen2_head(root / "eagle", seed=2, rope_theta=TINY["rope_theta"]).path
        spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    elif method == "eagle3":  # a Llama-style EAGLE-3 head reading the Qwen2 target's aux states
        head = root / "eagle3"
        if not head.exists():
            write_llama_eagle3_head(head)
        spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm, got = run(target, prompts, MAX_TOKENS, spec)
    assert got == plain
    m = llm.engine.metrics
    assert m.num_drafts > 0 and m.num_generation_tokens == sum(MAX_TOKENS)


def test_high_acceptance_published_head_equals_transformers(tmp_path):
    """A bigram target and a published-layout head that drafts it well: multi-token
    acceptance, all-accepted rounds and rejections all happen, output unchanged."""
    target = write_target(tmp_path / "target", seed=5, edit=bigram_edit())
    head = write_bigram_head(tmp_path / "head", target)
    prompts = random_prompts(LENGTHS, seed=2)
    want = hf_greedy(target, prompts, MAX_TOKENS)
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    llm, got = run(target, prompts, MAX_TOKENS, spec)
    assert got == want
    m = llm.engine.metrics
    assert m.num_accepted_tokens_per_pos[-1] > 0  # some rounds accepted all K drafts
    assert m.num_accepted_tokens < m.num_draft_tokens  # and some drafts were rejected
    assert m.mean_acceptance_length > 1.5
