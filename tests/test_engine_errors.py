"""Bad input to the engine fails early with an error that names the thing and the fix.

Every case checks the exception type and that the message names what was wrong (the
model id, the option, the size) and, where there is one, what to do instead.
"""
from __future__ import annotations


import pytest

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.engine.sampling_params import SamplingParamsError

VOCAB = cf.TINY["vocab_size"]
MAX_MODEL_LEN = 32


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return ef.write_target(tmp_path_factory.mktemp("errors") / "target", ef.kind_of("llama"))


@pytest.fixture(scope="module")
def llm(target):
    return LLM(str(target), device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=2)


def ids(n: int, start: int = 3) -> dict:
    return {"prompt_token_ids": [start + i % (VOCAB - start) for i in range(n)]}


GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


# -- the model -----------------------------------------------------------------------
def test_unknown_hub_id_names_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be downloaded in tests
    with pytest.raises(Exception, match="nobody-here/no-such-model") as info:
        LLM("nobody-here/no-such-model", device="cpu")
    assert "hf download nobody-here/no-such-model" in str(info.value)


def test_missing_directory_names_it(tmp_path):
    missing = tmp_path / "nowhere" / "model"
    with pytest.raises(Exception, match="no such directory") as info:
        LLM(str(missing), device="cpu")
    assert str(missing) in str(info.value)


def test_directory_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path), device="cpu")


def test_architecture_no_family_serves(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises((KeyError, ValueError), match="GPT2LMHeadModel") as info:
        LLM(str(tmp_path), device="cpu")
    assert "LlamaForCausalLM" in str(info.value)  # lists what is supported


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_model_len=100_000), "max_position_embeddings"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(dtype="int8"), "dtype='int8'"),
])
def test_bad_engine_options(target, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(target), device="cpu", **kwargs)


# -- heads and draft models that do not fit the target -----------------------------
@pytest.mark.parametrize("write, match", [
    (lambda d: cf.write_yuhuili_eagle(d, hidden_size=48), r"size 48 .*hidden_size 32"),
    (lambda d: cf.write_yuhuili_eagle(d, vocab_size=100), r"vocab_size is 100 but the target's is 128"),
    (lambda d: cf.write_yuhuili_eagle3(d, target_hidden_size=48), r"size 48 \(target_hidden_size"),
    (lambda d: cf.write_yuhuili_eagle3(d, eagle_aux_hidden_state_layer_ids=[1, 2, 9]), r"\[1, 2, 9\].*has 4"),
], ids=["eagle-hidden", "eagle-vocab", "eagle3-target-hidden", "eagle3-aux-layers"])
def test_head_that_does_not_fit_the_target(tmp_path, target, write, match):
    head = tmp_path / "EAGLE-head"
    write(head)
    with pytest.raises(ValueError, match=match) as info:
        LLM(str(target), speculative_config={"model": str(head)}, device="cpu")
    assert str(head) in str(info.value)


def test_method_does_not_match_the_head(tmp_path, target):
    cf.write_yuhuili_eagle3(tmp_path / "head")
    with pytest.raises(ValueError, match="eagle3") as info:
        LLM(str(target), speculative_config={"method": "eagle", "model": str(tmp_path / "head")}, device="cpu")
    assert "method" in str(info.value)


def test_draft_model_with_another_vocabulary(tmp_path, target):
    draft = ef.write_target(tmp_path / "draft", ef.kind_of("llama"), vocab_size=100)
    with pytest.raises(ValueError, match="vocab_size 100.*share the target's vocabulary"):
        LLM(str(target), speculative_config={"method": "draft_model", "model": str(draft)}, device="cpu")


# -- speculative_config -------------------------------------------------------------------
@pytest.mark.parametrize("spec, match", [
    ({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "tensor_parallel_size": 2}, "use 'draft_tensor_parallel_size'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be > 0"),
    ({"method": "eagle"}, "needs 'model'"),
    ({"metod": "ngram"}, "did you mean 'method'"),
    ({"method": "ngram", "temperature": 0.5}, "SamplingParams"),
    ({"method": "medusa", "model": "x"}, "medusa"),
    ("{not json", "not valid JSON"),
    (5, "JSON object"),
], ids=["lookup-min-max", "tensor-parallel", "zero-tokens", "no-model", "typo", "sampling-key",
        "unknown-method", "bad-json", "not-a-dict"])
def test_speculative_config_errors_surface_from_llm(target, spec, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(target), speculative_config=spec, device="cpu")


def test_method_the_engine_does_not_run(target):
    with pytest.raises(ValueError, match="'mtp' is not supported by this engine; use eagle, eagle3"):
        LLM(str(target), speculative_config={"method": "mtp", "model": str(target)}, device="cpu")


def test_draft_graphs_under_an_eager_engine_are_refused(target):
    with pytest.raises(ValueError, match="enforce_eager=false asks for the draft's CUDA graphs.*remove one of them"):
        LLM(str(target), speculative_config={"method": "draft_model", "model": str(target), "enforce_eager": False},
            enforce_eager=True, device="cpu")


def test_draft_max_model_len_caps_the_default_and_refuses_a_longer_one(target):
    """speculative_config max_model_len is the longest context the draft serves: the
    engine's default max_model_len fits in it, and a longer explicit one is refused."""
    spec = {"method": "ngram", "max_model_len": 20}
    llm = LLM(str(target), speculative_config=spec, device="cpu", max_num_seqs=1)
    assert llm.engine.max_model_len == 20
    assert LLM(str(target), speculative_config=spec, device="cpu", max_model_len=16,
               max_num_seqs=1).engine.max_model_len == 16
    with pytest.raises(ValueError, match=r"max_model_len=24 exceeds speculative_config.max_model_len=20.*lower"):
        LLM(str(target), speculative_config=spec, device="cpu", max_model_len=24)


# -- prompts ---------------------------------------------------------------------------------
def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match=f"prompt of {MAX_MODEL_LEN} tokens does not fit max_model_len={MAX_MODEL_LEN}"):
        llm.generate([ids(3), ids(MAX_MODEL_LEN)], GREEDY)
    # The good prompt of the failed call was not left queued to run with the next call.
    assert not llm.engine.has_unfinished()
    before = llm.engine.metrics.num_requests
    out = llm.generate(ids(MAX_MODEL_LEN - 1), GREEDY)  # the longest that fits: one token
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 1
    assert out[0].outputs[0].finish_reason == "length"
    assert llm.engine.metrics.num_requests == before + 1


@pytest.mark.parametrize("prompt, exc, match", [
    ({"text": "hi"}, ValueError, "'prompt' \\(text\\) or 'prompt_token_ids'"),
    ("hello", ValueError, "no tokenizer: pass \\{'prompt_token_ids'"),
    ({"prompt": "hello"}, ValueError, "no tokenizer"),
    ({"prompt_token_ids": []}, ValueError, "empty"),
    ({"prompt_token_ids": [5, VOCAB]}, ValueError, f"outside the vocabulary \\[0, {VOCAB}\\)"),
    ({"prompt_token_ids": "5 6 7"}, TypeError, "list of integer token ids"),
    ({"prompt_token_ids": [5, 6.5]}, TypeError, "list of integer token ids"),
    (42, TypeError, "strings or dicts, got int"),
    ("a\ud800b", ValueError, r"lone UTF-16 surrogate \('\\ud800' at character 1\)"),
    ({"prompt": "\udfff"}, ValueError, "lone UTF-16 surrogate"),
], ids=["dict-without-prompt", "text-without-tokenizer", "dict-text-without-tokenizer", "empty",
        "out-of-vocab", "ids-as-string", "float-id", "int", "lone-surrogate", "dict-lone-surrogate"])
def test_bad_prompts(llm, prompt, exc, match):
    with pytest.raises(exc, match=match):
        llm.generate([ids(4), prompt], GREEDY)
    assert not llm.engine.has_unfinished()


def test_chat_without_template(llm):
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": "hi"}])


# -- sampling parameters ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(seed="7"), "seed"),
    (dict(stop=[""]), "stop"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(ignore_eos="yes"), "ignore_eos"),
])
def test_invalid_sampling_params(kwargs, field):
    with pytest.raises(SamplingParamsError, match=rf"SamplingParams\.{field} must be .*got"):
        SamplingParams(**kwargs)


def test_sampling_params_of_the_wrong_kind(llm):
    with pytest.raises(TypeError, match="SamplingParams\\(temperature=..."):
        llm.generate([ids(4)], {"temperature": 0})
    with pytest.raises(TypeError, match="must all be SamplingParams, got dict"):
        llm.generate([ids(4)], [{"temperature": 0}])
    with pytest.raises(ValueError, match="got 3 SamplingParams for 2 prompts"):
        llm.generate([ids(4), ids(5)], [GREEDY] * 3)
    assert not llm.engine.has_unfinished()


def test_engine_still_serves_after_errors(llm, target):
    """After the failures above the same LLM gives transformers' greedy continuation."""
    prompt = ids(6, start=11)["prompt_token_ids"]
    out = llm.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[0].token_ids
    assert out == ef.hf_greedy(target, [prompt], [4])[0]


# -- an EAGLE head taken as a separate draft model -------------------------------------
def test_eagle_head_in_a_plainly_named_directory(tmp_path, target):
    """A yuhuili EAGLE-1 head (its config.json is the target's, stating no method; EAGLE-3
    configs carry EAGLE-3 fields) in a directory without "eagle" in its name is inferred
    as draft_model; the error says its weights are an EAGLE
    head's and names `method` with the value to set, instead of a missing-weight error."""
    method = "eagle"
    head = ef.write_head(tmp_path / "my-head", ef.kind_of("llama"), method)
    with pytest.raises(ValueError) as info:
        LLM(str(target), speculative_config={"model": str(head)}, device="cpu", max_model_len=MAX_MODEL_LEN)
    message = str(info.value)
    assert "holds EAGLE head weights" in message and "inferred as 'draft_model'" in message
    assert "has no EAGLE marker" in message  # the reason it was inferred
    assert f"'method' to '{method}'" in message and str(head) in message
    with pytest.raises(ValueError, match="sets method='draft_model'"):  # given, not inferred
        LLM(str(target), speculative_config={"method": "draft_model", "model": str(head)}, device="cpu",
            max_model_len=MAX_MODEL_LEN)
    # with the method set, the same directory serves
    llm = LLM(str(target), speculative_config={"method": method, "model": str(head)}, device="cpu",
              max_model_len=MAX_MODEL_LEN)
    assert llm.generate(ids(5), GREEDY)[0].outputs[0].token_ids


# -- vLLM's engine arguments ---------------------------------------------------------------
def test_engine_arguments_without_effect_are_named_in_one_line(target, caplog):
    """vLLM code passing memory / caching / logging arguments runs, gets the same output,
    and is told once, in one line, that they do nothing here and why."""
    plain = LLM(str(target), device="cpu", max_model_len=MAX_MODEL_LEN).generate(ids(6), GREEDY)
    with caplog.at_level("INFO", logger="eagle_zoo"):
        llm = LLM(str(target), device="cpu", max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.9,
                  enable_prefix_caching=True, trust_remote_code=True, disable_log_stats=False, swap_space=4,
                  block_size=16, quantization=None, kv_cache_dtype="auto")
    lines = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert len(lines) == 1
    for name in ("gpu_memory_utilization=0.9", "enable_prefix_caching", "trust_remote_code", "disable_log_stats",
                 "swap_space", "block_size"):
        assert name in lines[0]
    assert "quantization" not in lines[0]  # at a supported value it is simply what happens
    assert llm.generate(ids(6), GREEDY)[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


@pytest.mark.parametrize("kwargs, words", [
    ({"quantization": "fp8"}, ["quantization='fp8' is not supported", "unquantized"]),
    ({"kv_cache_dtype": "fp8"}, ["kv_cache_dtype='fp8'", "accepted: 'auto'"]),
    ({"enable_lora": True}, ["enable_lora=True", "LoRA"]),
    ({"speculative_model": "x"}, ["speculative_model='x'", "speculative_config="]),
])
def test_engine_arguments_that_would_change_results_are_refused(target, kwargs, words):
    from eagle_zoo.engine.engine_args import UnsupportedEngineArgument

    with pytest.raises(UnsupportedEngineArgument) as info:
        LLM(str(target), device="cpu", **kwargs)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_model_len": 0}, "max_model_len must be an integer >= 1 (or None for the default), got 0"),
    ({"max_model_len": -5}, "max_model_len must be an integer >= 1"),
    ({"max_model_len": "64"}, "max_model_len must be an integer >= 1 (or None for the default), got '64'"),
    ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1"),
    ({"seed": "x"}, "seed must be an integer, got 'x'"),
    ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"enforce_eager": "no"}, "enforce_eager must be True or False, got 'no'"),
    ({"async_scheduling": "yes"}, "async_scheduling must be True, False or None (the default), got 'yes'"),
    ({"device": "tpu"}, "device='tpu' is not a device"),
    ({"device": "meta"}, "device='meta': this engine runs on 'cpu' or 'cuda'"),
])
def test_own_arguments_that_mean_nothing_are_refused_by_name(target, monkeypatch, kwargs, message):
    # Refused before the model loads, naming the argument: not a torch error from deep inside,
    # not a string read as True, not an engine that refuses every request.
    import eagle_zoo.engine.llm as llm_module

    monkeypatch.setattr(llm_module, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError) as info:
        LLM(str(target), **{"device": "cpu", **kwargs})
    assert str(info.value).startswith(message)


def test_an_eagle3_head_whose_default_layers_the_target_lacks_is_refused_at_construction(tmp_path):
    # A head that names no layers reads 2, N // 2, N - 3: on a 2-layer target that is refused
    # when the LLM is built, not at every request (each ended with finish_reason 'error').
    # Layers the head's config names are checked when the head loads.
    kind = ef.kind_of("llama")
    small = ef.write_target(tmp_path / "two-layers", kind, num_hidden_layers=2)
    head = ef.write_head(tmp_path / "head", kind, "eagle3", aux_layer_ids=None)
    with pytest.raises(ValueError, match=r"reads target layers \[2, 1, -1\] \(the default 2, N // 2, N - 3\), "
                                         r"but the target has 2 layers"):
        LLM(str(small), {"model": str(head)}, device="cpu")


def test_a_tokenizer_that_cannot_load_is_named(target, tmp_path):
    with pytest.raises(ValueError, match=r"tokenizer='.*no-such-tokenizer': cannot be loaded as a tokenizer"):
        LLM(str(target), device="cpu", tokenizer=str(tmp_path / "no-such-tokenizer"))


def test_unknown_engine_argument_suggests_the_closest(target):
    with pytest.raises(TypeError, match="'gpu_memory_utilisation' .*did you mean 'gpu_memory_utilization'"):
        LLM(str(target), device="cpu", gpu_memory_utilisation=0.9)


def test_serve_takes_vllm_engine_flags():
    from eagle_zoo.cli import build_parser
    from eagle_zoo.engine.engine_args import from_cli

    args = build_parser(only="serve").parse_args(
        ["serve", "m", "-tp", "1", "--gpu-memory-utilization", "0.8", "--enable-prefix-caching",
         "--no-enable-chunked-prefill", "--kv-cache-dtype", "auto", "--trust-remote-code", "--max-model-len", "64"])
    assert from_cli(args) == {"gpu_memory_utilization": 0.8, "enable_prefix_caching": True,
                              "enable_chunked_prefill": False, "kv_cache_dtype": "auto", "trust_remote_code": True}
    assert (args.tensor_parallel_size, args.max_model_len) == (1, 64)


def test_prompt_token_ids_from_a_batch_encoding(llm):
    """Recent transformers return a BatchEncoding from apply_chat_template(tokenize=True);
    vLLM examples pass that as prompt_token_ids: its input_ids are the prompt."""
    from transformers import BatchEncoding

    ids_list = ids(7)["prompt_token_ids"]
    enc = BatchEncoding({"input_ids": ids_list, "attention_mask": [1] * len(ids_list)})
    got = llm.generate({"prompt_token_ids": enc}, GREEDY)[0]
    assert got.prompt_token_ids == ids_list
    assert got.outputs[0].token_ids == llm.generate(ids(7), GREEDY)[0].outputs[0].token_ids


# -- failure isolation inside a step ---------------------------------------------------------
def _poisoned(**kw) -> SamplingParams:
    """Params that passed the checks at creation and were changed afterwards to a value
    the step cannot put on the device (the engine's last line of defence)."""
    sp = SamplingParams(temperature=0.7, top_k=5, max_tokens=6, ignore_eos=True, **kw)
    sp.top_k = 2**70
    return sp


@pytest.mark.parametrize("when", ["at prefill", "in a batched decode step"])
def test_a_request_that_breaks_a_step_fails_alone(target, when):
    """One engine, four requests decoded together; one of them breaks a step (its own
    prefill, or the batched decode step of all four). That one finishes with reason
    "error" naming the field; the others give exactly what they give in a run without
    it (greedy and seeded sampling alike)."""
    llm = LLM(str(target), device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=4)
    engine = llm.engine
    good = [ids(5, start=7), ids(7, start=20), ids(4, start=40)]
    good_params = [GREEDY, SamplingParams(temperature=0.9, top_p=0.8, seed=11, max_tokens=6, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    alone = [o.outputs[0] for o in llm.generate(good, good_params)]

    bad_params = SamplingParams(temperature=0.7, top_k=5, max_tokens=6, ignore_eos=True, seed=3)
    prompts = [good[0], ids(6, start=30)] + good[1:]
    seqs = [engine.add_request(p["prompt_token_ids"], sp)
            for p, sp in zip(prompts, good_params[:1] + [bad_params] + good_params[1:])]
    if when == "at prefill":
        bad_params.top_k = 2**70  # past the checks made at creation
    else:
        engine.step()  # every request prefilled and one token out
        assert all(len(s.output_token_ids) == 1 for s in seqs)
        bad_params.top_k = 2**70
    while engine.has_unfinished():
        engine.step()
    bad = engine.to_output(seqs[1]).outputs[0]
    assert bad.finish_reason == "error" and "SamplingParams.top_k" in bad.stop_reason, bad
    rest = [engine.to_output(seqs[i]).outputs[0] for i in (0, 2, 3)]
    assert [o.token_ids for o in rest] == [o.token_ids for o in alone]
    assert [o.finish_reason for o in rest] == ["length"] * 3
    assert len(engine.scheduler.free_slots) == 4  # the failed request's slot came back
