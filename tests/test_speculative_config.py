"""SpeculativeConfig: key checks, method inference, defaults, and the error messages.

References: vLLM's documented speculative_config semantics and published checkpoint
config layouts (docs/formats.md); the expected values are written out here, not computed.
"""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eagle_zoo.config import SpeculativeConfig, SpeculativeConfigError, TreeConfig, infer_method
from eagle_zoo.config.speculative import USER_KEYS

parse = SpeculativeConfig.parse

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 100}
SPECULATORS = {
    "speculators_model_type": "eagle3",
    "architectures": ["Eagle3Speculator"],
    "draft_vocab_size": 32,
    "speculators_config": {
        "algorithm": "eagle3",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]},
    },
    "transformer_layer_config": dict(LLAMA),
}


def checkpoint(tmp_path, name, config):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def raises(obj, *fragments, **kw):
    with pytest.raises(SpeculativeConfigError) as err:
        parse(obj, **kw)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    return str(err.value)


# -- inference: ngram -------------------------------------------------------------------
@pytest.mark.parametrize("model", ["ngram", "[ngram]"])
def test_ngram_model_forms(model):
    cfg = parse({"model": model})
    assert cfg.method == "ngram" and cfg.inferred_from == f"model is {model!r}"
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (5, 5)


# -- inference: the checkpoint's config ----------------------------------------------
def test_speculators_eagle3(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "draft", SPECULATORS)})
    assert cfg.method == "eagle3" and not cfg.parallel_drafting
    assert "speculators_model_type='eagle3'" in cfg.inferred_from
    assert cfg.num_speculative_tokens == 4  # proposal_methods[0].speculative_tokens


def test_speculators_peagle_drafts_in_parallel(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {**SPECULATORS, "speculators_model_type": "peagle"})})
    assert cfg.method == "eagle3" and cfg.parallel_drafting is True
    assert cfg.inferred_from == "config.json has speculators_model_type='peagle'"


def test_peagle_parallel_drafting_can_be_turned_off(tmp_path):
    model = checkpoint(tmp_path, "draft", {**SPECULATORS, "speculators_model_type": "peagle"})
    assert parse({"model": model, "parallel_drafting": False}).parallel_drafting is False


def test_speculators_default_k_also_with_explicit_method(tmp_path):
    model = checkpoint(tmp_path, "draft", SPECULATORS)
    assert parse({"method": "eagle3", "model": model}).num_speculative_tokens == 4
    assert parse({"method": "eagle3", "model": model, "num_speculative_tokens": 2}).num_speculative_tokens == 2


def test_unknown_speculators_type(tmp_path):
    model = checkpoint(tmp_path, "draft", {**SPECULATORS, "speculators_model_type": "dflash"})
    raises({"model": model}, "speculators_model_type='dflash'", "set 'method' explicitly")


@pytest.mark.parametrize("arch", ["Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Qwen3ForCausalLM"])
def test_eagle3_architecture_names(tmp_path, arch):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {**LLAMA, "architectures": [arch]})})
    assert cfg.method == "eagle3" and arch in cfg.inferred_from


@pytest.mark.parametrize("arch", ["EagleLlamaForCausalLM", "EagleDeepSeekMTPModel"])
def test_eagle_architecture_names(tmp_path, arch):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {**LLAMA, "architectures": [arch]})})
    assert cfg.method == "eagle" and arch in cfg.inferred_from


def test_legacy_nested_config(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {"model_type": "eagle", "model": LLAMA})})
    assert cfg.method == "eagle" and "model_type='eagle'" in cfg.inferred_from


def test_legacy_nested_with_eagle3_inner_architecture(tmp_path):
    inner = {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"]}
    cfg = parse({"model": checkpoint(tmp_path, "draft", {"model_type": "eagle", "model": inner})})
    assert cfg.method == "eagle3" and "model.architectures" in cfg.inferred_from


@pytest.mark.parametrize("key", ["draft_vocab_size", "eagle_aux_hidden_state_layer_ids"])
def test_eagle3_fields(tmp_path, key):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {**LLAMA, key: [1, 2, 3]})})
    assert cfg.method == "eagle3" and key in cfg.inferred_from


@pytest.mark.parametrize("model_type", ["deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "qwen3_next_mtp", "future_mtp"])
def test_mtp_model_types(tmp_path, model_type):
    cfg = parse({"model": checkpoint(tmp_path, "draft", {"model_type": model_type})})
    assert cfg.method == "mtp" and model_type in cfg.inferred_from


def test_target_with_mtp_layers(tmp_path):
    config = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "num_nextn_predict_layers": 1}
    cfg = parse({"model": checkpoint(tmp_path, "DeepSeek-V3", config)})
    assert cfg.method == "mtp" and "num_nextn_predict_layers=1" in cfg.inferred_from


def test_checkpoint_config_wins_over_the_name(tmp_path):
    # The name says EAGLE-1 ("EAGLE-"), the config says EAGLE-3.
    model = checkpoint(tmp_path, "EAGLE-LLaMA3-draft", {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"]})
    assert parse({"model": model}).method == "eagle3"
    # The name says EAGLE-3, the config is a legacy EAGLE-1 conversion.
    model = checkpoint(tmp_path, "my-eagle3-draft", {"model_type": "eagle", "model": LLAMA})
    assert parse({"model": model}).method == "eagle"


def test_config_matching_nothing_falls_back_to_the_name(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "EAGLE-Vicuna-7B", LLAMA)})
    assert cfg.method == "eagle"
    assert cfg.inferred_from.startswith("config.json matched no rule; the name 'EAGLE-Vicuna-7B'")


def test_plain_draft_directory(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "Qwen3-0.6B", LLAMA), "num_speculative_tokens": 3})
    assert cfg.method == "draft_model" and cfg.num_speculative_tokens == 3


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_head_stating_its_method_wins_over_the_name(tmp_path, method):
    cfg = parse({"model": checkpoint(tmp_path, "Qwen3-0.6B", {**LLAMA, "eagle_zoo_method": method})})
    assert cfg.method == method and "eagle_zoo_method" in cfg.inferred_from


def test_head_stating_an_unknown_method(tmp_path):
    raises({"model": checkpoint(tmp_path, "h", {**LLAMA, "eagle_zoo_method": "medusa"})},
           "eagle_zoo_method='medusa'", "'eagle', 'eagle3'")


def test_eagle_weights_error_names_method():
    from eagle_zoo.config.speculative import eagle_weights_error

    assert eagle_weights_error("d", ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"], "x") is None
    err = eagle_weights_error("d", ["fc.weight", "layers.0.self_attn.q_proj.weight"], "because")
    assert "'method' to 'eagle'" in str(err) and "fc.weight" in str(err)
    err = eagle_weights_error("d", ["d2t", "fc.weight", "midlayer.mlp.up_proj.weight"], None)
    assert "'method' to 'eagle3'" in str(err) and "sets method='draft_model'" in str(err)


def test_directory_without_config_uses_the_name(tmp_path):
    (tmp_path / "EAGLE3-head").mkdir()
    assert parse({"model": str(tmp_path / "EAGLE3-head")}).method == "eagle3"


def test_broken_config_json(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{nope")
    raises({"model": str(tmp_path / "d")}, "config.json is not valid JSON", "set 'method' explicitly")


# -- inference: the name --------------------------------------------------------------
@pytest.mark.parametrize(
    "model, method",
    [
        ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3"),
        ("someone/EAGLE-3-Llama-3.1-8B", "eagle3"),  # vLLM's quirk: it sees "eagle-" first
        ("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "eagle3"),
        ("someone/qwen3-8b_eagle_3", "eagle3"),
        ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
        ("yuhuili/EAGLE-Qwen2-7B-Instruct", "eagle"),
        ("someone/EAGLE-34B-draft", "eagle"),  # "-34B" is a size, not EAGLE-3
        ("eagle_head_v1", "eagle"),
        ("Qwen/Qwen3-0.6B", "draft_model"),
        ("someone/seagle-draft", "draft_model"),
        ("eagle-org/tiny-llama", "draft_model"),  # only the last path part counts
    ],
)
def test_name_rules(model, method):
    found = infer_method(model)
    assert found.method == method and not found.parallel_drafting
    assert repr(model.split("/")[-1]) in found.reason


def test_reason_is_stored_and_absent_when_method_given():
    assert "contains 'EAGLE-3'" in parse({"model": "x/EAGLE-3-Llama"}).inferred_from
    assert parse({"method": "eagle", "model": "x/EAGLE-3-Llama"}).inferred_from is None


# -- the injectable config reader ---------------------------------------------------------
def test_injected_reader_sees_hub_ids():
    calls = []

    def reader(model):
        calls.append(model)
        return {**SPECULATORS, "speculators_model_type": "peagle"}

    cfg = parse({"model": "org/some-draft"}, config_reader=reader)
    assert calls == ["org/some-draft"]
    assert cfg.method == "eagle3" and cfg.parallel_drafting and cfg.num_speculative_tokens == 4
    assert infer_method("org/some-draft", config_reader=reader).parallel_drafting


def test_reader_not_called_for_ngram():
    def reader(model):
        raise AssertionError("read")

    parse({"model": "ngram"}, config_reader=reader)
    parse({"method": "ngram", "model": "[ngram]"}, config_reader=reader)
    parse({"method": "mtp"}, config_reader=reader)


def test_explicit_method_still_takes_the_checkpoint_defaults():
    calls = []

    def reader(model):
        calls.append(model)
        return {**SPECULATORS, "speculators_model_type": "peagle"}

    cfg = parse({"method": "eagle3", "model": "org/p-eagle"}, config_reader=reader)
    assert calls == ["org/p-eagle"] and cfg.inferred_from is None
    assert cfg.parallel_drafting is True and cfg.num_speculative_tokens == 4


def test_reader_returning_none_means_name_rules():
    assert parse({"model": "x/EAGLE3-head"}, config_reader=lambda m: None).method == "eagle3"


# -- defaults ----------------------------------------------------------------------------
def test_defaults():
    cfg = parse({"method": "eagle3", "model": "x"})
    assert cfg.num_speculative_tokens is None  # the engine picks
    assert cfg.draft_tensor_parallel_size is None and cfg.max_model_len is None
    assert cfg.disable_padded_drafter_batch is False and cfg.parallel_drafting is False
    assert cfg.enforce_eager is None and cfg.tree is None
    assert cfg.prompt_lookup_min is None and cfg.prompt_lookup_max is None


@pytest.mark.parametrize(
    "given, expected",
    [({}, (5, 5)), ({"prompt_lookup_min": 2}, (2, 2)), ({"prompt_lookup_max": 7}, (7, 7)),
     ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4))],
)
def test_ngram_lookup_window(given, expected):
    cfg = parse({"method": "ngram", **given})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == expected


def test_all_user_fields_accepted():
    cfg = parse({
        "method": "eagle3", "model": "x", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
        "disable_padded_drafter_batch": False, "parallel_drafting": True, "max_model_len": 2048,
        "revision": "main", "quantization": None, "enforce_eager": True,
    })
    assert cfg.num_speculative_tokens == 3 and cfg.parallel_drafting and cfg.draft_tensor_parallel_size == 1
    assert cfg.quantization is None and cfg.revision == "main" and cfg.max_model_len == 2048
    assert cfg.enforce_eager is True


def test_fp8_quantization_is_accepted_for_a_draft_model():
    assert parse({"method": "eagle3", "model": "x", "quantization": "fp8"}).quantization == "fp8"


@pytest.mark.parametrize("value", ["awq", "int8", ""])
def test_other_quantizations_are_refused_by_name(value):
    """Only fp8 (models/quantization.py): anything else is an error naming the key, the
    value and what is taken."""
    with pytest.raises(SpeculativeConfigError,
                       match=rf"quantization={value!r}.*give 'fp8' or leave 'quantization' out"):
        parse({"method": "eagle3", "model": "x", "quantization": value})


def test_quantization_of_ngram_is_refused():
    with pytest.raises(SpeculativeConfigError, match=r"quantization='fp8': method 'ngram' runs no draft model"):
        parse({"method": "ngram", "quantization": "fp8"})


@pytest.mark.parametrize("value", [True, False])
def test_enforce_eager_with_ngram_is_refused(value):
    with pytest.raises(SpeculativeConfigError, match=rf"enforce_eager={value}: method 'ngram' .*remove enforce_eager"):
        parse({"method": "ngram", "enforce_eager": value})


@pytest.mark.parametrize("method", ["eagle3", "ngram"])
def test_unpadded_drafter_batch_is_refused_by_name(method):
    obj = {"method": method, "disable_padded_drafter_batch": True}
    if method == "eagle3":
        obj["model"] = "x"
    with pytest.raises(SpeculativeConfigError, match="disable_padded_drafter_batch=true: .*remove disable_padded"):
        parse(obj)


@pytest.mark.parametrize("tree", [True, {}])
def test_tree_official_defaults(tree):
    assert parse({"method": "eagle", "model": "x", "tree": tree}).tree == TreeConfig(top_k=10, depth=6, total_tokens=60)


def test_tree_takes_no_num_speculative_tokens(tmp_path):
    """A tree's depth and total_tokens set its drafts: a K given with it is refused by name,
    and a speculators config's default K (for a chain) is not filled in."""
    with pytest.raises(SpeculativeConfigError, match="num_speculative_tokens=9 with 'tree'.*remove num_speculative"):
        parse({"method": "eagle", "model": "x", "tree": {"depth": 4}, "num_speculative_tokens": 9})
    cfg = parse({"model": checkpoint(tmp_path, "d", SPECULATORS), "tree": {"depth": 4}})
    assert cfg.num_speculative_tokens is None and cfg.tree == TreeConfig(top_k=10, depth=4, total_tokens=60)
    assert parse({"model": checkpoint(tmp_path, "e", SPECULATORS)}).num_speculative_tokens is not None


def test_tree_false_is_no_tree():
    assert parse({"method": "eagle", "model": "x", "tree": False}).tree is None


# -- parsing ------------------------------------------------------------------------------
def test_json_string_like_the_cli():
    cfg = parse('{"method": "eagle3", "model": "org/head", "num_speculative_tokens": 3}')
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("eagle3", "org/head", 3)
    assert parse(b'{"method": "ngram"}').method == "ngram"


def test_none_and_instances():
    assert parse(None) is None
    cfg = parse({"method": "ngram"})
    assert parse(cfg) is cfg


def test_dump_and_parse_again(tmp_path):
    cfg = parse({"model": checkpoint(tmp_path, "d", {**SPECULATORS, "speculators_model_type": "peagle"}), "tree": True})
    dumped = cfg.model_dump()
    assert "inferred_from" not in dumped
    assert parse(json.dumps(dumped)) == cfg.model_copy(update={"inferred_from": None})


def test_direct_construction_raises_our_error():
    assert SpeculativeConfig(method="ngram").prompt_lookup_min == 5
    with pytest.raises(SpeculativeConfigError, match="num_speculative_tokens must be > 0"):
        SpeculativeConfig(method="eagle", model="x", num_speculative_tokens=0)


def test_frozen():
    cfg = parse({"method": "ngram"})
    with pytest.raises(Exception):
        cfg.num_speculative_tokens = 3


# -- errors --------------------------------------------------------------------------------
def test_invalid_json():
    raises('{"method": eagle}', "not valid JSON", "column", '"num_speculative_tokens": 3')


@pytest.mark.parametrize("obj", ["[1, 2]", "3", ["method"]])
def test_not_an_object(obj):
    raises(obj, "expected a JSON object")


def test_tensor_parallel_size():
    raises({"method": "eagle", "model": "x", "tensor_parallel_size": 2}, "'tensor_parallel_size'", "use 'draft_tensor_parallel_size'")


@pytest.mark.parametrize("key", ["temperature", "top_p", "min_p", "seed", "max_tokens", "repetition_penalty"])
def test_sampling_keys(key):
    raises({"method": "eagle", "model": "x", key: 1}, repr(key), "sampling parameter", "SamplingParams")


def test_top_k_points_to_both_homes():
    raises({"method": "eagle", "model": "x", "top_k": 8}, "SamplingParams", '"tree": {"top_k": ...}')


@pytest.mark.parametrize("key", ["depth", "total_tokens"])
def test_tree_keys_at_top_level(key):
    raises({"method": "eagle", "model": "x", key: 4}, "tree option", f'"tree": {{"{key}": ...}}')


@pytest.mark.parametrize(
    "key", ["target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config", "inferred_from"]
)
def test_internal_keys(key):
    raises({"method": "eagle", "model": "x", key: {}}, repr(key), "internal", "remove it")


def test_unknown_key_suggests_and_lists():
    msg = raises({"method": "eagle", "model": "x", "num_speculative_token": 3}, "did you mean 'num_speculative_tokens'?")
    for key in USER_KEYS:
        assert key in msg


def test_unknown_key_close_to_a_sampling_key():
    raises({"method": "eagle", "model": "x", "temprature": 0.5}, "'temperature' is a sampling parameter")


def test_unknown_key_without_suggestion():
    msg = raises({"method": "eagle", "model": "x", "zzzz": 1}, "unknown key 'zzzz'", "valid keys:")
    assert "did you mean" not in msg


@pytest.mark.parametrize("k", [0, -1])
def test_num_speculative_tokens_positive(k):
    raises({"method": "eagle", "model": "x", "num_speculative_tokens": k}, f"num_speculative_tokens must be > 0, got {k}")


@pytest.mark.parametrize("key", ["draft_tensor_parallel_size", "max_model_len"])
def test_other_positive_fields(key):
    raises({"method": "eagle", "model": "x", key: 0}, f"{key} must be > 0")


@pytest.mark.parametrize("value", ["3", 3.0, True])
def test_wrong_types_name_the_key(value):
    raises({"method": "eagle", "model": "x", "num_speculative_tokens": value}, "speculative_config.num_speculative_tokens", "integer")


@pytest.mark.parametrize("method", ["ngram", "eagle", "draft_model", "mtp"])
def test_parallel_drafting_needs_a_parallel_head(method):
    obj = {"method": method, "parallel_drafting": True}
    if method != "ngram":
        obj["model"] = "x"
    raises(obj, "parallel_drafting needs a head trained to draft in parallel", f"method {method!r}", "remove parallel_drafting")


def test_parallel_drafting_with_eagle3():
    assert parse({"method": "eagle3", "model": "x", "parallel_drafting": True}).parallel_drafting


def test_ngram_min_above_max():
    raises({"method": "ngram", "prompt_lookup_min": 6, "prompt_lookup_max": 3}, "prompt_lookup_min (6) > prompt_lookup_max (3)", "swap")


def test_ngram_window_at_least_one():
    raises({"method": "ngram", "prompt_lookup_min": 0, "prompt_lookup_max": 3}, "must be >= 1")


def test_ngram_refuses_a_draft_model_or_revision_it_would_not_read():
    raises({"method": "ngram", "model": "org/head"}, "method 'ngram'", "model='org/head' would be ignored")
    raises({"method": "ngram", "revision": "v1"}, "revision='v1' would be ignored")
    assert parse({"method": "ngram", "model": "[ngram]"}).method == "ngram"  # vLLM's own spelling


def test_prompt_lookup_needs_ngram():
    raises({"method": "eagle", "model": "x", "prompt_lookup_max": 3}, "apply to method 'ngram' only", '"method": "ngram"')


@pytest.mark.parametrize(
    "method, hint",
    [("eagel3", "did you mean 'eagle3'?"), ("peagle", '"parallel_drafting": true'), ("deepseek_mtp", '"method": "mtp"'),
     ("medusa", "leave 'method' out")],
)
def test_unknown_method(method, hint):
    raises({"method": method, "model": "x"}, f"unknown method {method!r}", "supported: eagle, eagle3, ngram, draft_model, mtp", hint)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_method_needs_model(method):
    raises({"method": method}, f"method {method!r} needs 'model'")


def test_mtp_without_model_uses_the_target():
    assert parse({"method": "mtp", "num_speculative_tokens": 1}).model is None


def test_neither_method_nor_model():
    raises({"num_speculative_tokens": 3}, "give 'method' or 'model'")


def test_tree_unknown_key_suggests():
    raises({"method": "eagle", "model": "x", "tree": {"total_token": 60}}, "speculative_config.tree", "did you mean 'total_tokens'?")


@pytest.mark.parametrize("key, value, least", [("top_k", 0, 1), ("depth", 0, 1), ("total_tokens", 1, 2)])
def test_tree_bounds(key, value, least):
    raises({"method": "eagle", "model": "x", "tree": {key: value}}, f"tree.{key} must be >= {least}")


def test_tree_needs_an_eagle_method():
    raises({"method": "ngram", "tree": True}, "'tree' (EAGLE-2 dynamic tree)", "remove 'tree'")


def test_tree_wrong_type():
    raises({"method": "eagle", "model": "x", "tree": 5}, "'tree' must be true or an object")


# -- against the target -------------------------------------------------------------------
@pytest.mark.parametrize("draft_tp, target_tp, expected", [(None, 4, 4), (1, 4, 1), (4, 4, 4), (1, 1, 1)])
def test_draft_tp_accepted(draft_tp, target_tp, expected):
    cfg = parse({"method": "eagle", "model": "x", "draft_tensor_parallel_size": draft_tp})
    assert cfg.validate_against_target(target_tp) == expected


def test_draft_tp_rejected():
    cfg = parse({"method": "eagle", "model": "x", "draft_tensor_parallel_size": 2})
    with pytest.raises(SpeculativeConfigError, match="draft_tensor_parallel_size=2 .* tensor_parallel_size=4; use 1 or 4"):
        cfg.validate_against_target(4)


def test_no_pipeline_parallelism():
    with pytest.raises(SpeculativeConfigError, match="pipeline parallelism"):
        parse({"method": "ngram"}).validate_against_target(1, pipeline_parallel_size=2)


# -- properties on names and keys the tests did not choose --------------------------------
WORD = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)


@given(WORD.filter(lambda w: "eagle" not in w.lower() and w not in ("ngram",)))
def test_names_without_eagle_are_draft_models(name):
    assert infer_method(f"org/{name}").method == "draft_model"


@given(WORD, st.sampled_from(["eagle3", "EAGLE3", "Eagle-3", "eagle_3"]), WORD.filter(lambda w: not w[0].isdigit()))
def test_eagle3_marker_anywhere(before, marker, after):
    assert infer_method(f"org/{before}-{marker}-{after}").method == "eagle3"


@given(st.from_regex(r"[a-z_]{3,24}", fullmatch=True).filter(lambda k: k not in USER_KEYS))
def test_every_other_key_is_rejected_by_name(key):
    with pytest.raises(SpeculativeConfigError) as err:
        parse({"method": "ngram", key: 1})
    assert repr(key) in str(err.value)
