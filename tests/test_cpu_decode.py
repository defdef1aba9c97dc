"""kernels/cpu_decode.py: the few-row float32 CPU linear kernel against torch's matmul,
its batch invariance, and models/layers.py's dispatch to it. Skipped where the kernel
cannot be built (no g++ / Python headers / AVX2): the engine then keeps torch's matmul,
which the rest of the suite tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle_zoo.models import layers
from eagle_zoo.kernels import cpu_decode

needs_kernel = pytest.mark.skipif(not cpu_decode.available(), reason="kernels/cpu_decode.py could not be built here")

def test_build_directory_is_in_eagle_zoos_cache(monkeypatch, tmp_path):
    # EAGLE_ZOO_CACHE first, then $XDG_CACHE_HOME/eagle_zoo, then ~/.cache/eagle_zoo: the
    # cache directory of the default target's checkpoint too (envs.cache_dir).
    monkeypatch.setenv("EAGLE_ZOO_CACHE", str(tmp_path / "ours"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_decode.build_directory().parent == tmp_path / "ours"
    monkeypatch.setenv("EAGLE_ZOO_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_decode.build_directory().parent == tmp_path / "xdg" / "eagle_zoo"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty: the default, never a path relative to the working directory
    assert cpu_decode.build_directory().parent == tmp_path / "home" / ".cache" / "eagle_zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cpu_decode.build_directory().parent == tmp_path / "home" / ".cache" / "eagle_zoo"


SHAPES = [(40, 200), (1728, 576), (576, 1536), (7, 33), (193, 8)]  # (N, K): tails in K and in N


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matches_torch_and_is_batch_invariant(shape):
    N, K = shape
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g)
    x = torch.randn(cpu_decode.MAX_ROWS, K, generator=g)
    full = cpu_decode.few_row_linear(x, w)
    ref = x.double() @ w.double().t()
    torch.testing.assert_close(full.double(), ref, rtol=1e-5, atol=1e-5 * K ** 0.5)
    for m in range(1, cpu_decode.MAX_ROWS):  # a row's bits alone and among m rows
        assert torch.equal(cpu_decode.few_row_linear(x[:m], w), full[:m]), m
    assert torch.equal(cpu_decode.few_row_linear(x[5:6], w)[0], full[5])


@needs_kernel
def test_bad_inputs_name_the_problem():
    w = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="at most 8 rows"):
        cpu_decode._module.few_row_linear(torch.randn(9, 16), w)
    with pytest.raises(RuntimeError, match=r"float32 x and a float32, bfloat16 or 4-bit \(uint8\) weight only"):
        cpu_decode._module.few_row_linear(torch.randn(2, 16, dtype=torch.float64), w.double())
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and w \[N, K\]"):
        cpu_decode._module.few_row_linear(torch.randn(2, 15), w)


@needs_kernel
def test_layers_linear_uses_it_for_few_rows_and_keeps_autograd(monkeypatch):
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    x = torch.randn(1, 3, 40, generator=g)
    calls = []
    kernel = cpu_decode.few_row_linear
    monkeypatch.setattr(cpu_decode, "few_row_linear", lambda *a: calls.append(a[0].shape) or kernel(*a))
    y = layers.linear(x, w, b)
    assert calls == [(3, 40)] and y.shape == (1, 3, 24)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    layers.linear(torch.randn(1, 9, 40), w)  # 9 rows: prefill-sized, torch's matmul
    assert len(calls) == 1
    wg = w.clone().requires_grad_(True)
    layers.linear(x, wg).sum().backward()  # training: torch's matmul, which has a backward
    assert len(calls) == 1 and wg.grad is not None
    monkeypatch.setattr(cpu_decode, "available", lambda: False)  # not built here: torch's matmul
    layers.linear(x, w)
    assert len(calls) == 1



@needs_kernel
@pytest.mark.parametrize("n", [576, 2048, 37])
def test_rms_norm_rows_matches_the_reference_and_is_batch_invariant(n):
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(cpu_decode.MAX_ROWS, n, generator=g) * 3, torch.randn(n, generator=g)
    full = cpu_decode.rms_norm_rows(x, w, 1e-5)
    ref = (w.double() * x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)).float()
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=1e-5)
    for m in range(1, cpu_decode.MAX_ROWS):
        assert torch.equal(cpu_decode.rms_norm_rows(x[:m], w, 1e-5), full[:m]), m


@needs_kernel
def test_rmsnorm_module_uses_it_for_few_rows(monkeypatch):
    norm = layers.RMSNorm(64, 1e-5)
    torch.nn.init.normal_(norm.weight)
    calls = []
    kernel = cpu_decode.rms_norm_rows
    monkeypatch.setattr(cpu_decode, "rms_norm_rows", lambda *a: calls.append(a[0].shape) or kernel(*a))
    x = torch.randn(1, 4, 64)
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (64,), norm.weight, 1e-5),
                                   rtol=1e-5, atol=1e-6)
        norm(torch.randn(1, 12, 64))  # prefill-sized: torch's op
    assert calls == [(4, 64)]
    with pytest.raises(RuntimeError, match="at most 8 rows"):
        cpu_decode._module.rms_norm_rows(torch.randn(9, 64), norm.weight.detach(), 1e-5)


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_whole_llama_layer_in_one_call_gives_transformers_greedy(family, tmp_path, monkeypatch):
    """models/fused_layer.py CpuDecoderStack, cpu_decoder_layer, cpu_eagle3_layer and
    CpuEagle3Head: plain decoding and EAGLE / EAGLE-3 chain verification of a tiny
    random Llama target run the target's decoder layers as one C++ call (counted), the
    EAGLE-3 head's layer as one call, its catch-up of a step as one and its drafts of a
    step as one, and give transformers' greedy tokens.
    The tiny Mistral target has a sliding window, which the calls do not do: it keeps the
    module path, with the same result."""
    import checkpoint_factory as cf
    import engine_fixtures as ef
    from eagle_zoo import LLM, SamplingParams

    kind = ef.kind_of(family)
    target = ef.write_target(tmp_path / "target", kind)
    heads = {m: ef.write_head(tmp_path / m, kind, m, seed=4, scale=0.6) for m in ("eagle", "eagle3")}
    prompts = ef.random_prompts((5, 12, 3), cf.TINY["vocab_size"], seed=1)
    want = ef.hf_greedy(target, prompts, [20, 26, 14])
    stack_calls, calls, head_calls, draft_calls, catch_up_calls = [], [], [], [], []
    stack, kernel, head_kernel = cpu_decode.llama_stack_rows, cpu_decode.llama_layer_rows, cpu_decode.eagle3_layer_rows
    drafts_kernel, catch_up_kernel = cpu_decode.eagle3_draft_rows, cpu_decode.eagle3_catch_up_rows
    monkeypatch.setattr(cpu_decode, "eagle3_draft_rows",
                        lambda h, k, *a: draft_calls.append(k) or drafts_kernel(h, k, *a))
    monkeypatch.setattr(cpu_decode, "eagle3_catch_up_rows",
                        lambda aux, w, ids, *a: catch_up_calls.append(ids.numel()) or catch_up_kernel(aux, w, ids, *a))
    monkeypatch.setattr(cpu_decode, "llama_stack_rows", lambda h, *a: stack_calls.append(h.shape[0]) or stack(h, *a))
    monkeypatch.setattr(cpu_decode, "llama_layer_rows", lambda h, *a: calls.append(h.shape[0]) or kernel(h, *a))
    monkeypatch.setattr(cpu_decode, "eagle3_layer_rows",
                        lambda e, *a: head_calls.append(e.shape[0]) or head_kernel(e, *a))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (20, 26, 14)]
    for method in (None, "eagle", "eagle3"):
        stack_calls.clear(), calls.clear(), head_calls.clear(), draft_calls.clear(), catch_up_calls.clear()
        spec = method and {"method": method, "model": str(heads[method]), "num_speculative_tokens": 3}
        llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
                  max_num_seqs=1)
        if method == "eagle3":
            llm.engine.proposer.cpu_min_confidence = 0.0  # k drafts every step: catch-ups of k + 1 tokens
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
        assert got == want, method
        if family == "mistral":
            assert not stack_calls and not calls and not head_calls and not draft_calls and not catch_up_calls
            continue
        # Prompts of up to 8 tokens are prefilled through it too; then one token a step
        # (plain) or the last token and 3 drafts (verification).
        assert set(stack_calls) >= {5, 3} | ({1} if method is None else {4}), sorted(set(stack_calls))
        assert 12 not in stack_calls  # prefill-sized: the module path
        # No layer alone: the EAGLE-1 head's layer drops its input norm, so keeps its modules.
        assert not calls
        # The EAGLE-3 head's layer: the prompts' passes; a step's catch-up of 4 tokens in one
        # call (fc, embedding and layer); its three drafts a step in one call (the two
        # one-token passes between them inside).
        assert set(head_calls) == (set() if method != "eagle3" else {5, 3}), sorted(set(head_calls))
        assert set(catch_up_calls) == (set() if method != "eagle3" else {4}), sorted(set(catch_up_calls))
        assert set(draft_calls) == (set() if method != "eagle3" else {3}) and (method != "eagle3" or
                                                                               len(draft_calls) >= 12)


@needs_kernel
def test_llama_layer_rows_rejects_mismatched_weights_and_slots():
    H, heads, kv_heads, d = 32, 4, 2, 8
    ones = torch.ones(H)
    w = {"qkv": torch.zeros((heads + 2 * kv_heads) * d, H), "o": torch.zeros(H, heads * d),
         "gu": torch.zeros(2 * 16, H), "down": torch.zeros(H, 16)}
    caches = torch.zeros(2, 10, kv_heads, d), torch.zeros(2, 10, kv_heads, d)
    angles = torch.ones(1, d // 2)

    def call(qkv=w["qkv"], slot=0, kv_len=4):
        return cpu_decode.llama_layer_rows(torch.randn(1, H), ones, 1e-5, qkv, w["o"], ones, 1e-5, w["gu"],
                                           w["down"], angles, angles, *caches, slot, torch.tensor([3]), kv_len,
                                           heads, kv_heads, d ** -0.5)

    assert call().shape == (1, H)
    with pytest.raises(RuntimeError, match="slot 2 or kv_len 4 outside"):
        call(slot=2)
    with pytest.raises(RuntimeError, match="slot 0 or kv_len 11 outside"):  # past the rows' 10 positions
        call(kv_len=11)
    with pytest.raises(RuntimeError, match="w_qkv"):
        call(qkv=torch.zeros(heads * d, H))


@needs_kernel
def test_eagle3_catch_up_rows_is_fc_embedding_and_layer_and_refuses_bad_input():
    """eagle3_catch_up_rows gives what its parts give (few_row_linear over the aux streams
    side by side, the ids' embedding rows with a zero row for -1, eagle3_layer_rows), bit
    for bit, and names a bad token id, ids of the wrong length and an fc of the wrong width."""
    H, heads, kv_heads, d, V = 32, 4, 2, 8, 5
    g = torch.Generator().manual_seed(0)
    ones, embed, aux = torch.ones(H), torch.randn(V, H, generator=g), [torch.randn(2, H, generator=g) for _ in range(3)]
    w = {name: 0.2 * torch.randn(*shape, generator=g) for name, shape in
         {"fc": (H, 3 * H), "qkv": ((heads + 2 * kv_heads) * d, 2 * H), "o": (H, heads * d), "gu": (2 * 16, H),
          "down": (H, 16)}.items()}
    angles = torch.ones(2, d // 2)
    layer_rest = (ones, 1e-5, ones, 1e-5, False, w["qkv"], w["o"], ones, 1e-5, w["gu"], w["down"], angles, angles)
    position_rest = (0, torch.tensor([3, 4]), 5, heads, kv_heads, d ** -0.5)

    def caches():
        return torch.zeros(2, 10, kv_heads, d), torch.zeros(2, 10, kv_heads, d)

    def call(ids, fc=w["fc"]):
        return cpu_decode.eagle3_catch_up_rows(aux, fc, torch.tensor(ids), embed, *layer_rest, *caches(),
                                               *position_rest)

    got = call([4, -1])  # -1: past the accepted run, a zero embedding row
    hidden = cpu_decode.few_row_linear(torch.cat(aux, 1), w["fc"])
    embeds = torch.stack([embed[4], torch.zeros(H)])
    want = cpu_decode.eagle3_layer_rows(embeds, *layer_rest[:2], hidden, *layer_rest[2:], *caches(), *position_rest)
    assert torch.equal(got, want)
    assert not torch.equal(got, call([4, 0]))  # the zero row is not some row of the embedding
    with pytest.raises(RuntimeError, match="token id 5 outside the embedding's 5 rows"):
        call([1, 5])
    with pytest.raises(RuntimeError, match="token id -2"):
        call([-2, 1])
    with pytest.raises(RuntimeError, match=r"ids \[2\]"):
        call([1])
    with pytest.raises(RuntimeError, match="fc gives 16 features, the embedding 32"):
        call([1, 2], fc=torch.zeros(16, 3 * H))


def _rms(x, weight):
    return weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def _layer_reference(h, norm1, w, norm2, cos, sin, k_cache, v_cache, slot, pos, kv_len, heads, kv_heads, scale):
    """The decoder layer written out in float64 torch (writes the rows' k / v into the caches)."""
    x = h.double()
    return _layer_from_qkv_input(_rms(x, norm1), x, w, norm2, cos, sin, k_cache, v_cache, slot, pos, kv_len, heads,
                                 kv_heads, scale)


def _layer_from_qkv_input(qkv_in, residual, w, norm2, cos, sin, k_cache, v_cache, slot, pos, kv_len, heads, kv_heads,
                          scale):
    """float64: qkv of qkv_in, rope, attention over the cache row, o_proj + residual, the MLP."""
    f = lambda x: x.double()  # noqa: E731
    T, d = qkv_in.shape[0], k_cache.shape[-1]

    def rope(x):  # [T, n, d]: x1*cos - x2*sin, x2*cos + x1*sin
        c, s = f(cos)[:, None], f(sin)[:, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    qkv = qkv_in @ f(w["qkv"]).t()
    q = rope(qkv[:, : heads * d].view(T, heads, d))
    k = rope(qkv[:, heads * d: (heads + kv_heads) * d].view(T, kv_heads, d))
    v = qkv[:, (heads + kv_heads) * d:].view(T, kv_heads, d)
    keys, values = f(k_cache[slot]).clone(), f(v_cache[slot]).clone()
    keys[pos], values[pos] = k, v
    out = torch.zeros(T, heads, d, dtype=torch.float64)
    for t in range(T):
        n = min(int(pos[t]) + 1, kv_len)
        for head in range(heads):
            g = head // (heads // kv_heads)
            p = torch.softmax(keys[:n, g] @ q[t, head] * scale, 0)
            out[t, head] = p @ values[:n, g]
    h2 = residual + out.view(T, -1) @ f(w["o"]).t()
    gate, up = (_rms(h2, norm2) @ f(w["gu"]).t()).chunk(2, -1)
    return h2 + (torch.nn.functional.silu(gate) * up) @ f(w["down"]).t()


@needs_kernel
@pytest.mark.parametrize("context,d", [(5, 8), (700, 8), (600, 64), (260, 128)])
def test_llama_layer_rows_matches_the_reference_and_a_row_does_not_depend_on_the_others(context, d):
    """Grouped-query attention (3 query heads a kv head) over a cache row: every row agrees
    with the float64 layer, and row 0's bits are the same alone and among 1..8 rows (the
    later rows sit at later positions, which it does not see). Contexts past 256 keys span
    several of the attention's splits; head sizes of 8, 64 and 128 take each of its
    output paths (under 64 floats, 64, two groups of 64)."""
    g = torch.Generator().manual_seed(context)
    H, heads, kv_heads, inter, max_len = 48, 6, 2, 40, 1024
    w = {"qkv": torch.randn((heads + 2 * kv_heads) * d, H, generator=g) * 0.3,
         "o": torch.randn(H, heads * d, generator=g) * 0.3,
         "gu": torch.randn(2 * inter, H, generator=g) * 0.3, "down": torch.randn(H, inter, generator=g) * 0.3}
    norm1, norm2 = torch.rand(H, generator=g) + 0.5, torch.rand(H, generator=g) + 0.5
    caches = torch.randn(2, max_len, kv_heads, d, generator=g), torch.randn(2, max_len, kv_heads, d, generator=g)
    h = torch.randn(cpu_decode.MAX_ROWS, H, generator=g)
    pos = torch.arange(context, context + cpu_decode.MAX_ROWS)
    angles = pos[:, None].double() * 0.05 * torch.arange(1, d // 2 + 1)
    cos, sin = angles.cos().float(), angles.sin().float()

    def layer(T):
        k_cache, v_cache = caches[0].clone(), caches[1].clone()
        return cpu_decode.llama_layer_rows(h[:T], norm1, 1e-5, w["qkv"], w["o"], norm2, 1e-5, w["gu"], w["down"],
                                           cos[:T], sin[:T], k_cache, v_cache, 1, pos[:T], context + T,
                                           heads, kv_heads, d ** -0.5)

    full = layer(cpu_decode.MAX_ROWS)
    ref = _layer_reference(h, norm1, w, norm2, cos, sin, caches[0], caches[1], 1, pos, context + cpu_decode.MAX_ROWS,
                           heads, kv_heads, d ** -0.5)
    torch.testing.assert_close(full.double(), ref, rtol=1e-4, atol=1e-4)
    for T in range(1, cpu_decode.MAX_ROWS):
        assert torch.equal(layer(T), full[:T]), T


@needs_kernel
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_eagle3_layer_rows_matches_the_reference_and_bfloat16_weights_their_float32_bits(norm_before_residual):
    """kernels/cpu_decode.py eagle3_layer_rows (an EAGLE-3 head's first layer): qkv over
    [rms(embeds), rms(hidden)], the residual hidden or its norm, then the Llama layer.
    Every row agrees with the float64 layer, a row's bits do not depend on the others,
    and bfloat16 weights give the bits of their float32 copies."""
    g = torch.Generator().manual_seed(7)
    H, heads, kv_heads, d, inter, max_len, context = 48, 6, 2, 8, 40, 64, 9
    w = {"qkv": torch.randn((heads + 2 * kv_heads) * d, 2 * H, generator=g) * 0.3,
         "o": torch.randn(H, heads * d, generator=g) * 0.3,
         "gu": torch.randn(2 * inter, H, generator=g) * 0.3, "down": torch.randn(H, inter, generator=g) * 0.3}
    w = {k: v.bfloat16().float() for k, v in w.items()}  # exact in bfloat16, as a shipped head's
    norm_e, norm_h, norm2 = (torch.rand(H, generator=g) + 0.5 for _ in range(3))
    caches = torch.randn(2, max_len, kv_heads, d, generator=g), torch.randn(2, max_len, kv_heads, d, generator=g)
    embeds, hidden = torch.randn(cpu_decode.MAX_ROWS, H, generator=g), torch.randn(cpu_decode.MAX_ROWS, H, generator=g)
    pos = torch.arange(context, context + cpu_decode.MAX_ROWS)
    angles = pos[:, None].double() * 0.05 * torch.arange(1, d // 2 + 1)
    cos, sin = angles.cos().float(), angles.sin().float()

    def layer(T, weights):
        k_cache, v_cache = caches[0].clone(), caches[1].clone()
        return cpu_decode.eagle3_layer_rows(embeds[:T], norm_e, 1e-5, hidden[:T], norm_h, 1e-5, norm_before_residual,
                                            weights["qkv"], weights["o"], norm2, 1e-5, weights["gu"], weights["down"],
                                            cos[:T], sin[:T], k_cache, v_cache, 1, pos[:T], context + T, heads,
                                            kv_heads, d ** -0.5)

    full = layer(cpu_decode.MAX_ROWS, w)
    normed_hidden = _rms(hidden.double(), norm_h)
    qkv_in = torch.cat([_rms(embeds.double(), norm_e), normed_hidden], -1)
    residual = normed_hidden if norm_before_residual else hidden.double()
    ref = _layer_from_qkv_input(qkv_in, residual, w, norm2, cos, sin, caches[0], caches[1], 1, pos,
                                context + cpu_decode.MAX_ROWS, heads, kv_heads, d ** -0.5)
    torch.testing.assert_close(full.double(), ref, rtol=1e-4, atol=1e-4)
    for T in range(1, cpu_decode.MAX_ROWS):
        assert torch.equal(layer(T, w), full[:T]), T
    assert torch.equal(layer(cpu_decode.MAX_ROWS, {k: v.bfloat16() for k, v in w.items()}), full)
    with pytest.raises(RuntimeError, match="embeds and hidden"):
        cpu_decode.eagle3_layer_rows(embeds[:2], norm_e, 1e-5, hidden[:3], norm_h, 1e-5, False, w["qkv"], w["o"],
                                     norm2, 1e-5, w["gu"], w["down"], cos[:2], sin[:2], *caches, 1, pos[:2],
                                     context + 2, heads, kv_heads, d ** -0.5)
    with pytest.raises(RuntimeError, match=r"eagle3_layer_rows: w_qkv \[\d+, 96\]"):
        cpu_decode.eagle3_layer_rows(embeds[:2], norm_e, 1e-5, hidden[:2], norm_h, 1e-5, False, w["o"], w["o"],
                                     norm2, 1e-5, w["gu"], w["down"], cos[:2], sin[:2], *caches, 1, pos[:2],
                                     context + 2, heads, kv_heads, d ** -0.5)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_bfloat16_weight_gives_its_float32_copys_bits(shape):
    """few_row_linear reads a bfloat16 weight as its exact float32 values: every row count
    gives the bits of the float32 copy (and the reference's values)."""
    N, K = shape
    g = torch.Generator().manual_seed(N * K)
    w = torch.randn(N, K, generator=g).bfloat16()
    x = torch.randn(cpu_decode.MAX_ROWS, K, generator=g)
    for m in range(1, cpu_decode.MAX_ROWS + 1):
        assert torch.equal(cpu_decode.few_row_linear(x[:m], w), cpu_decode.few_row_linear(x[:m], w.float())), m
    torch.testing.assert_close(cpu_decode.few_row_linear(x, w), cpu_decode.few_row_linear_torch(x, w),
                               rtol=1e-5, atol=1e-5 * K ** 0.5)


@needs_kernel
def test_exact_bf16_copies_only_for_exact_unshared_weights_and_only_while_current():
    g = torch.Generator().manual_seed(2)
    exact, inexact, kept = (layers.ReplicatedLinear(16, 24) for _ in range(3))
    lm_head = layers.ParallelLMHead(40, 16)
    model = torch.nn.ModuleList([exact, inexact, kept, lm_head]).requires_grad_(False)
    for m in model:
        m.weight.copy_(torch.randn(m.weight.shape, generator=g).bfloat16().float())
    inexact.weight.add_(1e-4)  # no longer bfloat16 values
    inputs = [torch.randn(1, 3, 16, generator=g), torch.randn(1, 12, 16, generator=g)]  # kernel, torch's matmul
    before = [m(x) for m in model for x in inputs]
    calls = []
    kernel = cpu_decode.few_row_linear
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_decode, "few_row_linear", lambda x, w: calls.append(w.dtype) or kernel(x, w))
        assert layers.add_exact_bf16_copies(model, keep=[kept.weight]) == (24 * 16 + 40 * 16) * 2
        assert [hasattr(m.weight, "_bf16_copy") for m in model] == [True, False, False, True]
        assert all(m.weight.dtype == torch.float32 for m in model)
        after = [m(x) for m in model for x in inputs]
        assert calls == [torch.bfloat16, torch.float32, torch.float32, torch.bfloat16]  # the 3-row calls
        for b, a in zip(before, after):
            assert torch.equal(a, b)
        exact.weight.mul_(2)  # a changed weight: its copy no longer applies
        calls.clear()
        torch.testing.assert_close(exact(inputs[0]), 2 * before[0])
        assert calls == [torch.float32]


@needs_kernel
def test_a_bf16_eagle3_head_on_the_cpu_drafts_the_same_tokens_from_bf16_copies(tmp_path, monkeypatch):
    """An EAGLE-3 head shipped in bf16, run by a float32 CPU engine, gets bf16 copies of its
    linear weights (the target's weights none) and drafts exactly what it drafts from its
    float32 weights alone: the same drafts, the same outputs."""
    from safetensors.torch import load_file, save_file

    import checkpoint_factory as cf
    import engine_fixtures as ef
    from eagle_zoo import LLM, SamplingParams

    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind)
    head = ef.write_head(tmp_path / "head", kind, "eagle3", seed=4, scale=0.6)
    for f in head.glob("*.safetensors"):
        save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in load_file(f).items()}, f)
    prompts = [{"prompt_token_ids": p} for p in ef.random_prompts((5, 12, 3), cf.TINY["vocab_size"], seed=1)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}

    def run():
        llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
                  max_num_seqs=1)
        proposer, drafts = llm.engine.proposer, []
        propose = proposer.propose
        monkeypatch.setattr(proposer, "propose", lambda batch: drafts.append(propose(batch)[0].tolist()) or
                            (torch.tensor(drafts[-1]), None))
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        return llm, outs, drafts

    llm, outs, drafts = run()
    drafter = llm.engine.proposer.head
    assert drafter.fc.weight._bf16_copy[0].dtype == drafter.lm_head.weight._bf16_copy[0].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 and not hasattr(p, "_bf16_copy") for p in llm.engine.runner.model.parameters())
    import eagle_zoo.engine.llm as llm_module
    monkeypatch.setattr(llm_module, "add_exact_bf16_copies", lambda *a, **kw: 0)
    llm, outs_fp32, drafts_fp32 = run()
    assert not hasattr(llm.engine.proposer.head.fc.weight, "_bf16_copy")
    assert outs == outs_fp32 and len(drafts) > 5 and drafts == drafts_fp32


@needs_kernel
def test_an_eagle3_heads_drafts_in_one_call_are_the_module_paths(tmp_path, monkeypatch):
    """EagleProposer on the CPU: an EAGLE-3 head's k drafts of a step in one C++ call and
    its catch-up in one (models/fused_layer.py CpuEagle3Head) give the module path's
    drafts and the head's state they start from (bit for bit), step for step, and so its
    outputs; an EAGLE-1 head and a norm_output head keep the module path."""
    import checkpoint_factory as cf
    import engine_fixtures as ef
    from eagle_zoo import LLM, SamplingParams
    from eagle_zoo.models.fused_layer import CpuEagle3Head

    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind)
    heads = {m: ef.write_head(tmp_path / m, kind, m, seed=4, scale=0.6) for m in ("eagle", "eagle3")}
    prompts = [{"prompt_token_ids": p} for p in ef.random_prompts((5, 12, 3), cf.TINY["vocab_size"], seed=1)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def llm(method, k):
        spec = {"method": method, "model": str(heads[method]), "num_speculative_tokens": k}
        return LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
                   max_num_seqs=1)

    for k in (1, 3, 5):
        engine = llm("eagle3", k)
        proposer = engine.engine.proposer
        one_call = proposer.cpu_head
        assert one_call is not None
        chain, drafts, states = proposer._draft_chain, [], []

        def recorded_chain(_, base, slots, *a, **kw):  # the head's state (the catch-up's), then the drafts
            states.append(proposer.next_hidden[slots].clone())
            drafts.append(chain(_, base, slots, *a, **kw).tolist())
            return torch.tensor(drafts[-1])
        monkeypatch.setattr(proposer, "_draft_chain", recorded_chain)
        runs = []
        proposer.cpu_min_confidence = 0.0  # the module path drafts k: so does the call
        for cpu_head in (one_call, None):
            proposer.cpu_head = cpu_head
            drafts.clear(), states.clear()
            runs.append(([o.outputs[0].token_ids for o in engine.generate(prompts, params)], list(drafts),
                         torch.cat(states)))
        assert runs[0][:2] == runs[1][:2] and len(runs[0][1]) > 10, k
        assert torch.equal(runs[0][2], runs[1][2]), k
    assert llm("eagle", 3).engine.proposer.cpu_head is None
    proposer = llm("eagle3", 3).engine.proposer
    proposer.head.norm_output = True
    assert not CpuEagle3Head.supported(proposer.head, proposer.runner.kv_caches)


@needs_kernel
def test_cpu_drafts_stop_where_the_heads_confidence_falls(tmp_path, monkeypatch):
    """EagleProposer.cpu_min_confidence: the one-call drafts are the leading ones of the
    module path's k drafts whose running product of top softmax probabilities (from the
    head's compute_draft_logits) stays at or above it; a step whose first draft falls
    below is a plain step; the greedy outputs stay the target's."""
    import checkpoint_factory as cf
    import engine_fixtures as ef
    from eagle_zoo import LLM, SamplingParams

    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind)
    head_dir = ef.write_head(tmp_path / "eagle3", kind, "eagle3", seed=4, scale=0.6)
    prompts = [{"prompt_token_ids": p} for p in ef.random_prompts((5, 12, 3), cf.TINY["vocab_size"], seed=1)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(str(target), device="cpu", dtype="float32", max_model_len=96,
                                                 max_num_seqs=1).generate(prompts, params)]
    spec = {"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": 3}
    engine = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
                 max_num_seqs=1)
    proposer, head = engine.engine.proposer, engine.engine.proposer.head
    one_call = proposer.cpu_head
    assert one_call is not None and proposer.cpu_min_confidence > 0

    top_probabilities = []  # the module path's, one per draft
    draft_argmax = head.draft_argmax
    monkeypatch.setattr(head, "draft_argmax", lambda h: top_probabilities.append(
        torch.softmax(head.compute_draft_logits(h), -1).max().item()) or draft_argmax(h))
    chain, steps = proposer._draft_chain, []

    def both_paths(*a, **kw):  # the module path's k drafts, then the call's (same cache writes)
        proposer.cpu_head = None
        top_probabilities.clear()
        full = chain(*a, **kw)[0].tolist()
        proposer.cpu_head = one_call
        drafts = chain(*a, **kw)
        steps.append((full, list(top_probabilities), drafts[0].tolist()))
        return drafts
    monkeypatch.setattr(proposer, "_draft_chain", both_paths)

    proposer.cpu_min_confidence = 0.0
    engine.generate(prompts, params)
    products = sorted(p for _, probs, _ in steps for p in torch.tensor(probs).cumprod(0).tolist())
    # A threshold among the products, so that steps keep different numbers of drafts.
    proposer.cpu_min_confidence = products[len(products) // 2]
    steps.clear()
    got = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    assert got == want
    kept = []
    for full, probs, drafts in steps:
        running = torch.tensor(probs, dtype=torch.float64).cumprod(0)
        if (running - proposer.cpu_min_confidence).abs().min() < 1e-5:
            continue  # too near the threshold for float32 against float64
        n = int((running >= proposer.cpu_min_confidence).cumprod(0).sum())
        assert drafts == full[:n], (full, probs, drafts)
        kept.append(n)
    assert len(kept) > 10 and {0, 3} <= set(kept), kept


def _q8_weight(N, K, generator):
    """A weight as a GGUF Q8_0 tensor dequantizes: per block of 32, int8 q (its largest
    magnitude 127) times a float16 scale, in float32."""
    q = torch.randint(-127, 128, (N, K // 32, 32), generator=generator, dtype=torch.int8)
    q[:, :, 7] = torch.where(torch.rand(N, K // 32, generator=generator) < 0.5, 127, -127).to(torch.int8)
    d = (0.01 * torch.rand(N, K // 32, generator=generator)).half().float()
    return (q.float() * d[..., None]).view(N, K)


@needs_kernel
@pytest.mark.parametrize("shape", [(300, 576), (65, 64)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_int8_copy_gives_the_float32_weights_bits(shape):
    N, K = shape
    g = torch.Generator().manual_seed(N)
    w = _q8_weight(N, K, g)
    q, d = layers.exact_int8_blocks(w)
    assert q.dtype == torch.int8 and d.shape == (N, K // 32)
    assert layers.exact_int8_blocks(w + 1e-4) is None  # no longer int8 blocks times a scale
    x = torch.randn(cpu_decode.MAX_ROWS, K, generator=g)
    for m in range(1, cpu_decode.MAX_ROWS + 1):
        assert torch.equal(cpu_decode.few_row_linear_int8(x[:m], q, d), cpu_decode.few_row_linear(x[:m], w)), m
    with pytest.raises(RuntimeError, match="a multiple of 32"):
        cpu_decode.few_row_linear_int8(torch.randn(1, 40), torch.zeros(2, 40, dtype=torch.int8), torch.zeros(2, 1))
    with pytest.raises(RuntimeError, match=r"float32 d \[2, 2\]"):
        cpu_decode.few_row_linear_int8(torch.randn(1, 64), torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 3))


def _q4_weight(N, K, generator):
    """A weight as a GGUF Q4_1 tensor dequantizes: per block of 32, 4-bit q (0 and 15 among
    them: the block's least and largest value) times a float16 d plus a float16 m, in float32."""
    q = torch.randint(0, 16, (N, K // 32, 32), generator=generator).float()
    q[:, :, 3], q[:, :, 20] = 0, 15
    d = (0.004 * torch.rand(N, K // 32, generator=generator)).half().float()
    m = (-0.03 * torch.rand(N, K // 32, generator=generator)).half().float()
    return (q * d[..., None] + m[..., None]).view(N, K)


@needs_kernel
@pytest.mark.parametrize("shape", [(300, 576), (65, 64)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_q4_copy_gives_the_float32_weights_bits(shape):
    N, K = shape
    g = torch.Generator().manual_seed(N + 1)
    w = _q4_weight(N, K, g)
    w[0, :32] = 0.25  # a block of one value: d = 0
    blocks = cpu_decode.q4_blocks(w)
    assert blocks.dtype == torch.uint8 and blocks.shape == (N, K // 32 * layers.Q4_BLOCK_BYTES)
    assert torch.equal(blocks, layers.exact_q4_blocks_torch(w))  # the reference's bytes
    for not_q4 in (w + 1e-4, _q8_weight(N, K, g)):  # no longer float16 d and m; 255 levels a block
        assert cpu_decode.q4_blocks(not_q4) is None and layers.exact_q4_blocks_torch(not_q4) is None
    last = w.clone()
    last[-1, -1] += 1e-3  # only the last block breaks
    assert cpu_decode.q4_blocks(last) is None and layers.exact_q4_blocks_torch(last) is None
    x = torch.randn(cpu_decode.MAX_ROWS, K, generator=g)
    for m in range(1, cpu_decode.MAX_ROWS + 1):
        assert torch.equal(cpu_decode.few_row_linear(x[:m], blocks), cpu_decode.few_row_linear(x[:m], w)), m
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and w \[N, K / 32 blocks\]"):
        cpu_decode.few_row_linear(torch.randn(1, 64), torch.zeros(2, 50, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and w \[N, K / 32 blocks\]"):
        cpu_decode.few_row_linear(torch.randn(1, 32), torch.zeros(2, 36, dtype=torch.uint8))  # 1.5 blocks a row


@needs_kernel
def test_exact_int8_copies_only_for_q8_weights_and_only_while_current():
    g = torch.Generator().manual_seed(3)
    q8, other = layers.ReplicatedLinear(64, 24), layers.ReplicatedLinear(64, 24)
    lm_head = layers.ParallelLMHead(40, 64)
    model = torch.nn.ModuleList([q8, other, lm_head]).requires_grad_(False)
    q8.weight.copy_(_q8_weight(24, 64, g))
    lm_head.weight.copy_(_q8_weight(40, 64, g))
    other.weight.copy_(torch.randn(24, 64, generator=g))
    x = torch.randn(1, 3, 64, generator=g)
    before = [m(x) for m in model]
    assert layers.add_exact_int8_copies(model) == (24 * 64 + 24 * 2 * 4) + (40 * 64 + 40 * 2 * 4)
    assert [hasattr(m.weight, "_int8_copy") for m in model] == [True, False, True]
    calls = []
    kernel = cpu_decode.few_row_linear_int8
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_decode, "few_row_linear_int8", lambda x, q, d: calls.append(q.shape) or kernel(x, q, d))
        after = [m(x) for m in model]
        assert calls == [(24, 64), (40, 64)]
        assert all(torch.equal(a, b) for a, b in zip(after, before))
        q8.weight.mul_(3)  # a changed weight: its copy no longer applies
        calls.clear()
        torch.testing.assert_close(q8(x), 3 * before[0])
        assert calls == []


@needs_kernel
def test_the_embedded_target_decodes_from_its_int8_and_q4_copies():
    """SmolLM2's GGUF stores the tied embedding as Q8_0 and the decoder layers' weights as
    Q4_1: a CPU float32 engine reads its lm_head from the exact int8 copy and its layers
    from the exact 4-bit copies, with the float32 weights' tokens and logprobs."""
    from eagle_zoo import LLM, SamplingParams

    llm = LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu", dtype="float32", max_model_len=64)
    target = llm.engine.target
    assert hasattr(target.lm_head.weight, "_int8_copy")
    layer_weights = [m.weight for layer in target.layers for m in layer.modules() if isinstance(m, layers.LinearBase)]
    assert len(layer_weights) == 4 * len(target.layers)  # qkv, o, gate_up, down
    assert all(hasattr(w, "_q4_copy") and not hasattr(w, "_int8_copy") for w in layer_weights)
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1)

    def decode():
        out = llm.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0]
        return out.token_ids, [entry[t].logprob for t, entry in zip(out.token_ids, out.logprobs)]

    int8_calls, stack_weights = [], []
    int8_kernel, stack = cpu_decode.few_row_linear_int8, cpu_decode.llama_stack_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_decode, "few_row_linear_int8",
                   lambda x, q, d: int8_calls.append(tuple(q.shape)) or int8_kernel(x, q, d))
        mp.setattr(cpu_decode, "llama_stack_rows",
                   lambda h, weights, *a, **k: stack_weights.append({w.dtype for w in weights})
                   or stack(h, weights, *a, **k))
        from_copies = decode()
        assert set(int8_calls) == {tuple(target.lm_head.weight.shape)} and len(int8_calls) >= 5  # each decode step's
        assert len(stack_weights) >= 5 and all(dtypes == {torch.float32, torch.uint8} for dtypes in stack_weights)
        del target.lm_head.weight._int8_copy  # the float32 weights themselves
        for w in layer_weights:
            del w._q4_copy
        int8_calls.clear()
        stack_weights.clear()
        assert decode() == from_copies and int8_calls == []
        assert stack_weights and all(dtypes == {torch.float32} for dtypes in stack_weights)


def test_the_benches_against_a_commit_refuse_one_git_does_not_know():
    """`python -m eagle_zoo.kernels.cpu_decode --against REV` names the option and the fix."""
    with pytest.raises(SystemExit, match="--against no-such-commit: .*give a commit"):
        cpu_decode.build_at_commit("no-such-commit")


def test_a_commits_build_flags_are_read_from_its_source(monkeypatch):
    """--against builds REV's kernels with REV's own flags, read from its module source
    (an expression of torch); a commit git does not know falls back to this tree's."""
    avx2 = 'BUILD_FLAGS = dict(extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"])\n'
    assert cpu_decode.build_flags_in("import torch\n" + avx2) == dict(
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"])
    this_tree = Path(cpu_decode.__file__).read_text()
    for capability, extra in (("AVX512", ["-mavx512f", "-mavx512vl", "-mprefer-vector-width=256"]), ("AVX2", [])):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        assert cpu_decode.build_flags_in(this_tree)["extra_cflags"] == ["-O3", "-mavx2", "-mfma", "-fopenmp", *extra]
    assert cpu_decode.build_flags_in("x = 1\n") is cpu_decode.BUILD_FLAGS
    assert cpu_decode.build_flags_at_commit("no-such-commit") is cpu_decode.BUILD_FLAGS


@needs_kernel
def test_the_stack_in_one_call_is_the_layers_one_call_each(monkeypatch):
    """LlamaForCausalLM on a decode-shaped CPU step: its layers as one llama_stack_rows
    call give the bits of each layer's own llama_layer_rows call (the outputs, the aux
    hidden states an EAGLE-3 head reads and the KV caches), for one token and four; the
    choice is made once, after the layers chose theirs (choose_decode_paths)."""
    from transformers import LlamaConfig

    from eagle_zoo.engine.cache import allocate_kv_caches
    from eagle_zoo.models.attention import AttentionContext, use_context
    from eagle_zoo.models.fused_layer import choose_decode_paths
    from eagle_zoo.models.llama import LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=4, vocab_size=100, rms_norm_eps=1e-5)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    assert model.cpu_stack is None
    choose_decode_paths(model)
    one_call_stack = model.cpu_stack
    assert one_call_stack is not None and all(layer.fused_decode for layer in model.layers)
    stack_calls = []
    stack = cpu_decode.llama_stack_rows
    monkeypatch.setattr(cpu_decode, "llama_stack_rows", lambda *a: stack_calls.append(1) or stack(*a))
    base = allocate_kv_caches(model, 2, 64, torch.float32, "cpu")
    for k, v in base:
        k.normal_(), v.normal_()
    for T in (1, 4):
        ids = torch.randint(0, 100, (1, T))
        positions = torch.arange(20, 20 + T).view(1, T)
        results = []
        for one_call in (True, False):
            model.cpu_stack = one_call_stack if one_call else None
            caches = [(k.clone(), v.clone()) for k, v in base]
            stack_calls.clear()
            with torch.no_grad(), use_context(AttentionContext(caches, torch.tensor([1]), positions, 40)):
                hidden, aux = model(ids, positions, aux_layer_ids=(0, 2))
            assert len(stack_calls) == int(one_call)
            results.append((hidden, aux, caches))
        (h1, aux1, c1), (h2, aux2, c2) = results
        assert torch.equal(h1, h2) and all(torch.equal(a, b) for a, b in zip(aux1, aux2)) and len(aux1) == 2
        assert all(torch.equal(a, b) for pair1, pair2 in zip(c1, c2) for a, b in zip(pair1, pair2))
