"""EagleConfig and rename_architecture.

References: the renamed names in docs/formats.md (vLLM's head classes), transformers'
own config classes for the inner config, and the user's dict itself for round trips.
"""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, PretrainedConfig, Qwen3Config

from eagle_zoo.config import EagleConfig, is_eagle3_architecture, rename_architecture

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 1000,
    "rope_theta": 500000.0,
}


# -- renaming rules ---------------------------------------------------------------
def test_eagle_prefixes_plain_name():
    assert rename_architecture("LlamaForCausalLM", "eagle") == "EagleLlamaForCausalLM"


def test_eagle_keeps_name_starting_with_eagle():
    assert rename_architecture("EagleLlamaForCausalLM", "eagle") == "EagleLlamaForCausalLM"
    assert rename_architecture("EagleDeepSeekMTPModel", "eagle") == "EagleDeepSeekMTPModel"


def test_eagle3_prefixes_plain_name():
    assert rename_architecture("Qwen3ForCausalLM", "eagle3") == "Eagle3Qwen3ForCausalLM"


def test_eagle3_keeps_prefix_form():
    assert rename_architecture("Eagle3LlamaForCausalLM", "eagle3") == "Eagle3LlamaForCausalLM"


def test_eagle3_keeps_suffix_form():
    assert rename_architecture("LlamaForCausalLMEagle3", "eagle3") == "LlamaForCausalLMEagle3"


def test_eagle3_prefixes_an_eagle1_name():
    # "Eagle" is not "Eagle3": the rule only spares names already in EAGLE-3 form.
    assert rename_architecture("EagleLlamaForCausalLM", "eagle3") == "Eagle3EagleLlamaForCausalLM"


@pytest.mark.parametrize("method", ["mtp", "ngram", "draft_model", "EAGLE", "", None])
def test_other_methods_are_rejected_naming_the_supported_ones(method):
    with pytest.raises(ValueError) as err:
        rename_architecture("LlamaForCausalLM", method)
    assert "'eagle'" in str(err.value) and "'eagle3'" in str(err.value)


@pytest.mark.parametrize(
    "target, method, published",
    [
        ("LlamaForCausalLM", "eagle", "EagleLlamaForCausalLM"),
        ("LlamaForCausalLM", "eagle3", "Eagle3LlamaForCausalLM"),
        ("Qwen3ForCausalLM", "eagle3", "Eagle3Qwen3ForCausalLM"),
        ("DeepseekV3ForCausalLM", "eagle", "EagleDeepseekV3ForCausalLM"),
        ("DeepseekV2ForCausalLM", "eagle3", "Eagle3DeepseekV2ForCausalLM"),
        ("DeepseekV3ForCausalLM", "eagle3", "Eagle3DeepseekV3ForCausalLM"),
        ("MistralForCausalLM", "eagle", "EagleMistralForCausalLM"),
        ("MistralLarge3ForCausalLM", "eagle", "EagleMistralLarge3ForCausalLM"),
        ("Llama4ForCausalLM", "eagle", "EagleLlama4ForCausalLM"),
        ("CohereForCausalLM", "eagle", "EagleCohereForCausalLM"),
    ],
)
def test_published_head_names(target, method, published):
    assert rename_architecture(target, method) == published


ARCH = st.from_regex(r"[A-Z][A-Za-z0-9]{0,24}", fullmatch=True)
ANY_ARCH = st.one_of(
    ARCH, ARCH.map(lambda a: "Eagle" + a), ARCH.map(lambda a: "Eagle3" + a), ARCH.map(lambda a: a + "Eagle3")
)


@given(ANY_ARCH)
def test_rename_properties_on_unchosen_names(arch):
    for method in ("eagle", "eagle3"):
        once = rename_architecture(arch, method)
        assert rename_architecture(once, method) == once  # idempotent
        assert once.endswith(arch)  # only ever a prefix is added
        assert once in (arch, ("Eagle" if method == "eagle" else "Eagle3") + arch)
    assert rename_architecture(arch, "eagle").startswith("Eagle")
    assert is_eagle3_architecture(rename_architecture(arch, "eagle3"))
    # A name already in form is never touched.
    assert (rename_architecture(arch, "eagle") == arch) == arch.startswith("Eagle")
    eagle3_form = arch.startswith("Eagle3") or arch.endswith("Eagle3")
    assert (rename_architecture(arch, "eagle3") == arch) == eagle3_form


@given(ARCH, st.text(max_size=8).filter(lambda m: m not in ("eagle", "eagle3")))
def test_rename_rejects_any_other_method(arch, method):
    with pytest.raises(ValueError, match="supported methods"):
        rename_architecture(arch, method)


# -- the legacy nested form -----------------------------------------------------
def legacy(**top):
    return {"model_type": "eagle", "model": dict(LLAMA), **top}


def test_legacy_inner_is_transformers_config_class():
    cfg = EagleConfig.from_dict(legacy())
    assert type(cfg.model) is LlamaConfig
    ref = LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})
    assert cfg.model.to_dict() == ref.to_dict()


def test_legacy_defaults():
    cfg = EagleConfig.from_dict(legacy())
    assert cfg.method == "eagle"
    assert cfg.architectures == ["EagleLlamaForCausalLM"]
    assert cfg.truncated_vocab_size == 1000  # the inner vocab size


def test_legacy_inner_keys_readable_at_top_level():
    cfg = EagleConfig.from_dict(legacy(eagle_fc_bias=True))
    assert cfg.hidden_size == 64 and cfg.num_key_value_heads == 2
    assert cfg.eagle_fc_bias is True
    assert cfg.rope_theta == 500000.0  # kept readable though transformers 5 renames it


def test_legacy_top_level_overrides_inner():
    cfg = EagleConfig.from_dict(legacy(hidden_size=32, truncated_vocab_size=500))
    assert cfg.hidden_size == 32
    assert cfg.model.hidden_size == 64  # the inner config stays as written
    assert cfg.truncated_vocab_size == 500


def test_legacy_top_level_architectures_and_method():
    cfg = EagleConfig.from_dict(legacy(method="eagle3", architectures=["LlamaForCausalLM"]))
    assert cfg.method == "eagle3"
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]


def test_legacy_vllm_saved_names_are_not_renamed_twice():
    cfg = EagleConfig.from_dict(legacy(architectures=["EagleLlamaForCausalLM"]))
    assert cfg.architectures == ["EagleLlamaForCausalLM"]


# -- the flat form ----------------------------------------------------------------
def test_flat_yuhuili_eagle1_with_bias_key():
    cfg = EagleConfig.from_dict({**LLAMA, "bias": True})
    assert type(cfg.model) is LlamaConfig
    assert cfg.method == "eagle"
    assert cfg.architectures == ["EagleLlamaForCausalLM"]
    assert cfg.bias is True
    assert cfg.to_dict() == {**LLAMA, "bias": True}  # no keys invented


def test_flat_yuhuili_eagle3():
    d = {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 320}
    cfg = EagleConfig.from_dict(d)
    assert cfg.method == "eagle3"
    assert cfg.architectures == ["LlamaForCausalLMEagle3"]
    assert cfg.draft_vocab_size == 320


def test_flat_draft_vocab_size_means_eagle3():
    cfg = EagleConfig.from_dict({**LLAMA, "draft_vocab_size": 320})
    assert cfg.method == "eagle3"
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]


def test_method_argument_overrides_the_file():
    cfg = EagleConfig.from_dict(dict(LLAMA), method="eagle3")
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]
    assert cfg.to_dict() == {**LLAMA, "method": "eagle3"}  # kept so a reload agrees
    assert EagleConfig.from_dict(cfg.to_dict()).method == "eagle3"


def test_unknown_model_type_falls_back_to_plain_config():
    cfg = EagleConfig.from_dict({"model_type": "my_new_arch", "hidden_size": 8, "architectures": ["MyForCausalLM"]})
    assert type(cfg.model) is PretrainedConfig
    assert cfg.hidden_size == 8
    assert cfg.architectures == ["EagleMyForCausalLM"]


def test_qwen3_inner_config_class():
    cfg = EagleConfig.from_dict({"model_type": "eagle", "model": {"model_type": "qwen3", "vocab_size": 10}})
    assert type(cfg.model) is Qwen3Config


# -- keyword construction ---------------------------------------------------------
def test_keyword_construction_with_a_config_object():
    inner = LlamaConfig(hidden_size=64, num_attention_heads=4, vocab_size=100, architectures=["LlamaForCausalLM"])
    cfg = EagleConfig(model=inner, method="eagle3", draft_vocab_size=32)
    assert cfg.model is inner
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]
    assert cfg.truncated_vocab_size == 100
    d = cfg.to_dict()
    assert d["model_type"] == "eagle" and d["method"] == "eagle3" and d["draft_vocab_size"] == 32
    assert EagleConfig.from_dict(d) == cfg


def test_keyword_construction_with_a_dict():
    cfg = EagleConfig(model=dict(LLAMA), eagle_fc_bias=True)
    assert cfg.to_dict() == legacy(eagle_fc_bias=True)


# -- edits and round trips ----------------------------------------------------------
def test_edits_are_written_back():
    cfg = EagleConfig.from_dict(legacy())
    cfg.model.hidden_size = 128
    cfg.eagle_fc_bias = True
    cfg.truncated_vocab_size = 64
    d = cfg.to_dict()
    assert d["model"]["hidden_size"] == 128
    assert d["eagle_fc_bias"] is True and d["truncated_vocab_size"] == 64
    assert EagleConfig.from_dict(d) == cfg


def test_save_and_load(tmp_path):
    cfg = EagleConfig.from_dict(legacy(eagle_fc_bias=True))
    file = cfg.save_pretrained(tmp_path / "head")
    assert file == tmp_path / "head" / "config.json"
    assert json.loads(file.read_text()) == legacy(eagle_fc_bias=True)
    assert EagleConfig.from_pretrained(tmp_path / "head") == cfg
    assert EagleConfig.from_pretrained(file) == cfg


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    # no nested 'dtype' key: transformers reads one as a dtype name (refused by name, below)
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5).filter(lambda k: k != "dtype"), inner, max_size=3),
    max_leaves=6,
)
EXTRA_KEYS = st.dictionaries(st.from_regex(r"x_[a-z0-9_]{1,10}", fullmatch=True), JSON, max_size=4)
HF_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "hidden_size": st.sampled_from([32, 64]),
        "num_attention_heads": st.sampled_from([1, 2, 4]),
        "num_hidden_layers": st.integers(1, 3),
        "vocab_size": st.integers(1, 5000),
        "architectures": st.lists(ANY_ARCH, max_size=2),
        "rope_theta": st.floats(1.0, 1e7),
        "torch_dtype": st.sampled_from(["float16", "bfloat16", "float32"]),
        "bias": st.booleans(),
        "draft_vocab_size": st.integers(1, 5000),
    },
)
MODEL_TYPE = st.sampled_from(["llama", "qwen3", "mistral", "my_custom_arch", None])


@st.composite
def inner_configs(draw):
    d = {**draw(HF_FIELDS), **draw(EXTRA_KEYS)}
    model_type = draw(MODEL_TYPE)
    if model_type is not None:
        d["model_type"] = model_type
    return d


TOP_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "method": st.sampled_from(["eagle", "eagle3"]),
        "truncated_vocab_size": st.integers(1, 5000),
        "eagle_fc_bias": st.booleans(),
        "architectures": st.lists(ANY_ARCH, max_size=2),
        "eagle_aux_hidden_state_layer_ids": st.lists(st.integers(0, 40), max_size=3),
        "norm_before_residual": st.booleans(),
    },
)


@st.composite
def user_configs(draw):
    inner = draw(inner_configs())
    if draw(st.booleans()):
        return inner  # flat
    return {"model_type": "eagle", "model": inner, **draw(TOP_FIELDS), **draw(EXTRA_KEYS)}


@settings(max_examples=150, deadline=None)
@given(user_configs())
def test_round_trip_restores_every_key(d):
    cfg = EagleConfig.from_dict(d)
    assert cfg.to_dict() == d
    again = EagleConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.architectures == cfg.architectures
    # Written keys are readable at the top level; top-level ones win over inner ones.
    inner = d.get("model", d)
    top = {k: v for k, v in d.items() if k not in ("model_type", "model")} if "model" in d else {}
    for key in (k for k in {**inner, **top} if k.startswith("x_")):
        assert getattr(cfg, key) == top.get(key, inner.get(key))


# -- errors name the key and the fix ------------------------------------------------
def test_missing_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        EagleConfig.from_pretrained(tmp_path)


def test_invalid_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        EagleConfig.from_pretrained(tmp_path)


def test_file_errors_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(legacy(method="medusa")))
    with pytest.raises(ValueError, match=r"config\.json: config key 'method' is 'medusa'.*'eagle' or 'eagle3'"):
        EagleConfig.from_pretrained(tmp_path)


def test_legacy_without_model_key():
    with pytest.raises(ValueError, match="put the draft's HF config under 'model'"):
        EagleConfig.from_dict({"model_type": "eagle", "hidden_size": 8})


def test_model_object_with_wrong_model_type():
    with pytest.raises(ValueError, match="model_type 'eagle'"):
        EagleConfig.from_dict({"model_type": "llama", "model": {}})


def test_architectures_must_be_a_list():
    with pytest.raises(ValueError, match=r"'architectures' must be a list.*write \[\"LlamaForCausalLM\"\]"):
        EagleConfig.from_dict({**LLAMA, "architectures": "LlamaForCausalLM"})


def test_truncated_vocab_size_must_be_positive():
    with pytest.raises(ValueError, match="'truncated_vocab_size' must be a positive integer"):
        EagleConfig.from_dict(legacy(truncated_vocab_size=0))


def test_transformers_rejection_names_the_model_type():
    with pytest.raises(ValueError, match=r"model_type='llama'.*not a multiple"):
        EagleConfig.from_dict({**LLAMA, "num_attention_heads": 3})


def test_keyword_construction_needs_model():
    with pytest.raises(ValueError, match="EagleConfig.from_dict"):
        EagleConfig(hidden_size=8)


def test_missing_attribute_names_the_key():
    cfg = EagleConfig.from_dict(dict(LLAMA))
    with pytest.raises(AttributeError, match="no key 'nonexistent_key'"):
        cfg.nonexistent_key
    assert getattr(cfg, "nonexistent_key", 7) == 7


def test_model_cannot_be_replaced():
    cfg = EagleConfig.from_dict(dict(LLAMA))
    with pytest.raises(AttributeError, match="cannot be replaced"):
        cfg.model = LlamaConfig()


def test_bad_method_set_later():
    cfg = EagleConfig.from_dict(dict(LLAMA))
    with pytest.raises(ValueError, match="'eagle' or 'eagle3'"):
        cfg.method = "mtp"


def test_repr():
    text = repr(EagleConfig.from_dict(legacy(eagle_fc_bias=True)))
    assert text.startswith("EagleConfig(method='eagle'")
    assert "EagleLlamaForCausalLM" in text and "LlamaConfig" in text and "eagle_fc_bias=True" in text


@pytest.mark.parametrize("value", [[], 1.5, [1, 2]])
def test_a_dtype_key_that_is_no_dtype_name_is_refused_by_its_path(value):
    # unchecked, transformers' to_dict fails on {'x_0': {'dtype': []}} with an IndexError
    with pytest.raises(ValueError, match=r"config key 'x_0\.dtype' is .*give one as a string"):
        EagleConfig.from_dict({"model_type": "llama", "x_0": {"dtype": value}})
    with pytest.raises(ValueError, match=r"config key 'model\.dtype' is"):
        EagleConfig.from_dict({"model_type": "eagle", "model": {"dtype": value}}, method="eagle")


def test_a_dtype_key_naming_a_dtype_is_kept():
    d = {"model_type": "llama", "x_0": {"dtype": "bfloat16"}}
    assert EagleConfig.from_dict(d).to_dict() == d
