"""fp8 drafts (speculative_config quantization="fp8", eagle_zoo/models/quantization.py): the
rounding, which modules are quantized and which a head shares with its target are not,
the quantized head's forward, greedy output in an engine against plain decoding, the
step-cost tables' byte count, and the refusals. The kernel's own tests with fp8 weights
are in test_kernels.py."""
from __future__ import annotations

import argparse
import copy

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, bench, perf_steps
from eagle_zoo.kernels.linear import FP8, FP8_MAX, quantize_fp8
from eagle_zoo.models.quantization import quantize_fp8_

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = cf.STEP_COST_TINY


def test_quantize_fp8_scales_each_row_to_its_largest_magnitude():
    g = torch.Generator().manual_seed(0)
    ranges = torch.logspace(-3, 2, 6)[:, None]  # rows of very different magnitudes
    w = torch.randn(6, 50, generator=g) * ranges
    q, scale = quantize_fp8(w)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (6,)
    torch.testing.assert_close(scale, w.abs().amax(1) / FP8_MAX)
    assert torch.equal(q.float().abs().amax(1), torch.full((6,), FP8_MAX))
    # e4m3 keeps 3 mantissa bits: a normal value within 2^-4 of itself; subnormals (below
    # 2^-6 of the scale) within 2^-10 of the scale.
    assert ((q.float() * scale[:, None] - w).abs() <= 2 ** -4 * w.abs() + 2 ** -10 * scale[:, None]).all()
    again, same_scale = quantize_fp8(q.float() * scale[:, None])  # values on the grid stay put
    assert torch.equal(again.float(), q.float()) and torch.allclose(same_scale, scale)
    zeros, tiny = quantize_fp8(torch.zeros(2, 8))
    assert torch.equal(zeros.float(), torch.zeros(2, 8)) and torch.isfinite(tiny).all()


def _target_and_head(dtype=torch.float32):
    target = perf_steps.random_target(TINY, dtype, torch.device("cpu"))
    return target, perf_steps.random_eagle3_head(target, 200, dtype)


def test_every_linear_layer_and_the_lm_head_of_a_head_are_quantized():
    target, head = _target_and_head()
    embed = head.embed_tokens.weight
    names = quantize_fp8_(head, keep=list(target.parameters()))
    assert sorted(names) == ["fc", "layers.0.mlp.down_proj", "layers.0.mlp.gate_up_proj", "layers.0.self_attn.o_proj",
                             "layers.0.self_attn.qkv_proj", "lm_head"]
    for name in names:
        module = head.get_submodule(name)
        assert module.weight.dtype == FP8 and not module.weight.requires_grad
        assert module.weight_scale.shape == (module.weight.shape[0],)
    assert head.embed_tokens.weight is embed and embed.dtype == torch.float32  # a lookup of a few rows
    assert quantize_fp8_(head) == []  # already fp8: nothing more


def test_a_module_the_head_shares_with_its_target_is_left_alone(tmp_path):
    """An EAGLE-1 head without an lm_head of its own uses the target's: quantizing the head
    must not quantize the target's lm_head (the LLM passes the target's parameters)."""
    import eagle_zoo

    kind = ef.kind_of("llama")
    target_dir = ef.write_target(tmp_path / "target", kind)
    head_dir = ef.write_head(tmp_path / "head", kind, "eagle")
    target = eagle_zoo.load_target(str(target_dir))
    loaded = eagle_zoo.load(str(head_dir), target=target)
    assert loaded.head.lm_head is target.lm_head
    names = quantize_fp8_(loaded.head, keep=list(target.parameters()))
    assert "lm_head" not in names and "fc" in names
    assert target.lm_head.weight.dtype != FP8 and target.lm_head.weight_scale is None


def test_a_quantized_head_computes_what_its_dequantized_weights_compute():
    """The module path (prefill, the CPU) through kernels/linear.py's reference: the same
    as the head with each weight replaced by values x row scales, and not the same as the
    unquantized head (the rounding is applied)."""
    target, head = _target_and_head()
    quantized = copy.deepcopy(head)
    names = quantize_fp8_(quantized, keep=list(target.parameters()))
    dequantized = copy.deepcopy(head)
    with torch.no_grad():
        for name in names:
            q = quantized.get_submodule(name)
            dequantized.get_submodule(name).weight.copy_(q.weight.float() * q.weight_scale[:, None])
    g = torch.Generator().manual_seed(1)
    h = torch.randn(1, 3, 64, generator=g)
    aux = torch.randn(1, 3, 3 * 64, generator=g)
    with torch.no_grad():
        out = [m.compute_draft_logits(m.combine_hidden_states(aux) + h) for m in (quantized, dequantized, head)]
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0], out[2], rtol=1e-5, atol=1e-5)


def _decode(target, head, strategy, prompts, tokens=24):
    """-> (each prompt's output tokens, the draft tokens the engine verified)."""
    from eagle_zoo.engine.sampling_params import SamplingParams

    engine = perf_steps.strategy_engine(target, head, strategy, 3, None, torch.float32, torch.device("cpu"), 256)
    seqs = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return [list(seq.output_token_ids) for seq in seqs], engine.metrics.num_draft_tokens


def test_an_engine_with_an_fp8_head_emits_plain_decodings_tokens():
    """The target verifies every draft: an fp8 head changes what is proposed, never what is
    emitted (greedy, a k = 3 chain through the module path)."""
    target, head = _target_and_head()
    quantize_fp8_(head, keep=list(target.parameters()))
    rng = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=rng).tolist() for n in (9, 30)]
    spec, drafted = _decode(target, head, "chain", prompts)
    assert drafted > 0  # the fp8 head drafted: the identity is not that of plain steps alone
    assert spec == _decode(target, head, "plain", prompts)[0]


def test_step_cost_tables_count_an_fp8_heads_bytes():
    """`--draft-quantization fp8` in the step-cost tables: the head quantized as the engine
    quantizes it, its weights counted at a byte a value (plus the row scales), so a chain
    step reads fewer bytes over a plain step's; the table says fp8."""
    kw = dict(shape=TINY, k=3, dtype=torch.float32, device=torch.device("cpu"), steps=4)
    plain_head = perf_steps.step_cost_table("tiny", **kw)
    fp8_head = perf_steps.step_cost_table("tiny", draft_quantization="fp8", **kw)
    target, head = _target_and_head()
    quantized = copy.deepcopy(head)
    quantize_fp8_(quantized, keep=list(target.parameters()))
    scales = sum(m.weight_scale.numel() * 4 for m in quantized.modules()
                 if getattr(m, "weight_scale", None) is not None)
    weights = sum(p.numel() for n, p in head.named_parameters() if "embed_tokens" not in n and p.dim() == 2)
    norms = sum(p.numel() * 4 for n, p in head.named_parameters() if "embed_tokens" not in n and p.dim() == 1)
    assert perf_steps.read_bytes(quantized) == weights + scales + norms
    assert fp8_head["chain_read_ratio"] < plain_head["chain_read_ratio"]
    assert fp8_head["draft_quantization"] == "fp8" and plain_head["draft_quantization"] is None
    assert perf_steps.format_table(fp8_head).startswith("shape tiny, cpu, float32, draft fp8, batch 1")


def _bench_args(*argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv))


def test_the_bench_refuses_fp8_where_it_is_not_read_or_cannot_run():
    with pytest.raises(SystemExit, match="--draft-quantization.*not read by plain decoding"):
        bench.refuse_unused_options(_bench_args("--draft-quantization", "fp8"))
    with pytest.raises(SystemExit, match="fp8 drafts run on CUDA only"):
        perf_steps.run_step_costs(_bench_args("--perf", "--step-costs", "smollm2", "--device", "cpu",
                                              "--draft-quantization", "fp8"), lambda *a: None)
    with pytest.raises(SystemExit):  # argparse names the choices
        _bench_args("--draft-quantization", "int4")


def test_the_llm_refuses_fp8_drafts_off_cuda_before_loading_anything(tmp_path, monkeypatch):
    from eagle_zoo.engine import llm as llm_module

    kind = ef.kind_of("llama")
    target_dir = ef.write_target(tmp_path / "target", kind)
    head_dir = ef.write_head(tmp_path / "head", kind, "eagle3")

    def no_loading(*args, **kwargs):
        raise AssertionError("the target was loaded before the option was checked")

    monkeypatch.setattr(llm_module, "load_model", no_loading)
    with pytest.raises(ValueError, match=r"quantization='fp8' runs on CUDA only \(device='cpu'.*remove quantization"):
        LLM(str(target_dir), device="cpu", speculative_config={"model": str(head_dir), "quantization": "fp8"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_drafts_on_cuda_emit_plain_decodings_tokens(tmp_path):
    """The LLM with quantization="fp8": the head's linear layers in fp8, bf16 greedy output
    the same as plain decoding's, CUDA graphs and the kernel's fp8 products included."""
    from eagle_zoo import SamplingParams

    kind = ef.kind_of("llama")
    target_dir = ef.write_target(tmp_path / "target", kind)
    head_dir = ef.write_head(tmp_path / "head", kind, "eagle3")
    prompts = [{"prompt_token_ids": p} for p in ef.random_prompts([7, 40, 19], cf.TINY["vocab_size"])]
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    engine = dict(device="cuda", dtype="bfloat16", max_model_len=256, max_num_seqs=4)
    plain = LLM(str(target_dir), **engine).generate(prompts, greedy)
    llm = LLM(str(target_dir), **engine,
              speculative_config={"model": str(head_dir), "num_speculative_tokens": 3, "quantization": "fp8"})
    assert llm.engine.proposer.head.lm_head.weight.dtype == FP8
    spec = llm.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
