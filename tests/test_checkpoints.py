"""Checkpoint reading: format detection, canonical naming, safe tensor reading."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import checkpoint_factory as cf
from eagle_zoo.checkpoints import tensors
from eagle_zoo.checkpoints.formats import (
    CheckpointFormatError,
    detect_format,
    read_checkpoint,
    validate_vocab_map,
)
from eagle_zoo.checkpoints.tensors import (
    CheckpointError,
    CorruptCheckpointError,
    MissingShardError,
    UnsafeCheckpointError,
    read_file,
    read_tensor,
    read_tensors,
)
from eagle_zoo.hookspecs import hookimpl
from eagle_zoo.plugins import get_registry
from eagle_zoo.specs import CheckpointFormat

# (expected format, writer, writer arguments): every publisher layout, single and sharded.
CASES = [
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {}),
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {"kind": "safetensors", "fc_bias": False}),
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {"shards": 2, "bias_key": True}),
    ("yuhuili-eagle", cf.write_yuhuili_eagle, {"kind": "safetensors", "shards": 3, "inv_freq": True}),
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {}),
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {"architecture": "Eagle3LlamaForCausalLM", "kind": "safetensors"}),
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {"architecture": "LlamaForCausalLM", "shards": 2}),
    ("yuhuili-eagle3", cf.write_yuhuili_eagle3, {"kind": "safetensors", "shards": 2, "embed": True}),
    ("speculators-eagle3", cf.write_speculators, {}),
    ("speculators-eagle3", cf.write_speculators, {"shards": 2, "embed": True}),
    ("speculators-peagle", cf.write_speculators, {"model_type": "peagle"}),
    ("speculators-peagle", cf.write_speculators, {"model_type": "peagle", "shards": 2}),
    ("legacy-vllm", cf.write_legacy_vllm, {}),
    ("legacy-vllm", cf.write_legacy_vllm, {"shards": 2, "fc_bias": False}),
]
# The published fact: only yuhuili EAGLE-3 names layer 0 "midlayer".
PUBLISHED_PREFIX = {"yuhuili-eagle3": "midlayer."}


def _id(case):
    fmt, _, kw = case
    return fmt + "".join(f"-{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_each_format_is_detected_and_read_in_canonical_names(tmp_path, case):
    fmt, write, kwargs = case
    written = write(tmp_path / "head", **kwargs)
    assert detect_format(written.path).name == fmt
    raw = read_checkpoint(written.path)
    assert raw.format == fmt
    prefix = PUBLISHED_PREFIX.get(fmt)
    expected = {
        ("layers.0." + k[len(prefix):] if prefix and k.startswith(prefix) else k): v
        for k, v in written.weights.items()
    }
    assert sorted(raw.weights) == sorted(expected)
    assert all(torch.equal(raw.weights[k], v) for k, v in expected.items())
    assert len(raw.files) == kwargs.get("shards", 1)
    assert raw.config.method == ("eagle3" if "eagle3" in fmt or "peagle" in fmt else "eagle")


# -- what the readers make of each config ---------------------------------------------
def test_yuhuili_eagle_fc_bias_comes_from_the_weights(tmp_path):
    with_bias = read_checkpoint(cf.write_yuhuili_eagle(tmp_path / "a", fc_bias=True).path).config
    assert with_bias.eagle_fc_bias is True and with_bias.architectures == ["EagleLlamaForCausalLM"]
    # The non-HF "bias" key says true but the file has no fc.bias: the file wins.
    cfg = read_checkpoint(cf.write_yuhuili_eagle(tmp_path / "b", fc_bias=False, bias_key=True).path).config
    assert cfg.eagle_fc_bias is False
    assert "bias" not in cfg.to_dict()


@pytest.mark.parametrize(
    "architecture, renamed",
    [
        ("LlamaForCausalLMEagle3", "LlamaForCausalLMEagle3"),
        ("Eagle3LlamaForCausalLM", "Eagle3LlamaForCausalLM"),
        ("LlamaForCausalLM", "Eagle3LlamaForCausalLM"),  # draft_vocab_size alone marks EAGLE-3
    ],
)
def test_yuhuili_eagle3_architectures(tmp_path, architecture, renamed):
    raw = read_checkpoint(cf.write_yuhuili_eagle3(tmp_path / "h", architecture=architecture).path)
    assert raw.config.architectures == [renamed]
    assert raw.config.draft_vocab_size == cf.DRAFT_VOCAB


def test_speculators_defaults_and_metadata(tmp_path):
    written = cf.write_speculators(tmp_path / "h", speculative_tokens=5, aux_layer_ids=[0, 1, 1])
    cfg = read_checkpoint(written.path).config
    assert cfg.method == "eagle3"
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]
    assert cfg.norm_before_residual is True  # speculators' default, unlike yuhuili's
    assert cfg.num_speculative_tokens == 5
    assert cfg.parallel_drafting is False
    assert cfg.verifier_name_or_path == "tiny/verifier"
    assert cfg.verifier_architectures == ["LlamaForCausalLM"]
    assert cfg.hidden_size == cf.TINY["hidden_size"]  # from transformer_layer_config
    assert cfg.draft_vocab_size == cf.DRAFT_VOCAB
    assert list(cfg.eagle_aux_hidden_state_layer_ids) == [0, 1, 1]
    assert getattr(cfg, "target_hidden_size", None) is None  # null in the file


def test_speculators_flags_and_peagle(tmp_path):
    flags = {"norm_before_residual": False, "norm_before_fc": True, "fc_norm": True, "norm_output": True}
    written = cf.write_speculators(tmp_path / "h", model_type="peagle", flags=flags, target_hidden_size=40)
    raw = read_checkpoint(written.path)
    assert {k: getattr(raw.config, k) for k in flags} == flags
    assert raw.config.parallel_drafting is True
    assert raw.config.target_hidden_size == 40
    assert {"input_norm.weight", "fc_norm.2.weight"} <= set(raw.weights)


def test_speculators_layer_type_without_a_family(tmp_path):
    written = cf.write_speculators(tmp_path / "h", layer_model_type="nosuchfamily")
    with pytest.raises(CheckpointFormatError, match="transformer_layer_config.model_type 'nosuchfamily'"):
        read_checkpoint(written.path)


def test_legacy_config_and_fc_bias_flag_must_agree(tmp_path):
    raw = read_checkpoint(cf.write_legacy_vllm(tmp_path / "ok").path)
    assert raw.config.eagle_fc_bias is True
    assert raw.config.truncated_vocab_size == cf.TINY["vocab_size"]
    assert "lm_head.weight" in raw.weights

    bad = cf.write_legacy_vllm(tmp_path / "bad", fc_bias=True)
    cfg = json.loads((bad.path / "config.json").read_text())
    cfg["eagle_fc_bias"] = False
    (bad.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointFormatError, match=r"config.json: eagle_fc_bias is False .* hold fc.bias"):
        read_checkpoint(bad.path)


# -- none, two, or a plugin's format ----------------------------------------------------
def test_no_format_lists_every_format_and_what_was_seen(tmp_path):
    target = cf.write_target(tmp_path / "target", num_hidden_layers=2)
    with pytest.raises(CheckpointFormatError) as err:
        detect_format(target.path)
    text = str(err.value)
    assert str(target.path) in text and "num_hidden_layers=2" in text
    for name, fmt in get_registry().formats.items():
        assert name in text and fmt.description in text


def test_unsupported_speculators_type_is_not_claimed(tmp_path):
    written = cf.write_speculators(tmp_path / "h")
    cfg = json.loads((written.path / "config.json").read_text())
    cfg["speculators_model_type"] = "dflash"
    (written.path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointFormatError, match="speculators_model_type='dflash'"):
        detect_format(written.path)


def test_missing_or_broken_config_and_missing_weights(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointFormatError, match="no config.json"):
        detect_format(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="config.json: not valid JSON"):
        detect_format(tmp_path / "empty")
    cf.write_config(tmp_path / "noweights", cf.llama_config())
    with pytest.raises(CheckpointFormatError, match="files: config.json"):
        detect_format(tmp_path / "noweights")


def _read_marker(directory):
    return "marker"


class GreedyFormat:
    """A badly written plugin format that claims every directory."""

    @hookimpl
    def register_formats(self, register):
        register(CheckpointFormat("greedy", "claims everything", lambda d, c: True, _read_marker))


class MarkerFormat:
    """A plugin format for a layout no built-in format knows."""

    @hookimpl
    def register_formats(self, register):
        register(CheckpointFormat("marker", "config.json with my_layout", lambda d, c: "my_layout" in c, _read_marker))


def test_two_claims_name_both(tmp_path, register_plugin):
    written = cf.write_yuhuili_eagle(tmp_path / "h")
    register_plugin(GreedyFormat(), "greedy-plugin")
    with pytest.raises(CheckpointFormatError, match="'yuhuili-eagle' and 'greedy'|'greedy' and 'yuhuili-eagle'"):
        detect_format(written.path)


def test_plugins_add_formats(tmp_path, register_plugin):
    register_plugin(MarkerFormat(), "marker-plugin")
    cf.write_config(tmp_path / "h", {"my_layout": True})
    assert detect_format(tmp_path / "h").name == "marker"
    assert read_checkpoint(tmp_path / "h") == "marker"


# -- pickles: weights_only, nothing executed ---------------------------------------------------
class Payload:
    """Unpickling this runs code that creates a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_pickles_are_read_with_weights_only(tmp_path, monkeypatch):
    written = cf.write_yuhuili_eagle(tmp_path / "h", kind="bin")
    calls, real = [], torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    read_checkpoint(written.path)
    assert calls and all(c.get("weights_only") is True and c.get("map_location") == "cpu" for c in calls)
    assert calls[0].get("mmap") is True  # torch.save's zip format can be memory mapped


def test_the_payload_is_live(tmp_path):
    # Control: unpickled without protection, the payload does create its file.
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps({"x": Payload(marker)}, protocol=2))
    assert marker.exists()


@pytest.mark.parametrize("layout", ["torch-zip", "legacy-pickle"])
def test_a_pickle_that_would_run_code_is_refused(tmp_path, layout):
    marker = tmp_path / "pwned"
    head = cf.write_yuhuili_eagle(tmp_path / "h", kind="bin").path
    evil = {"fc.weight": torch.zeros(2), "x": Payload(marker)}
    if layout == "torch-zip":
        torch.save(evil, head / "pytorch_model.bin")
    else:
        (head / "pytorch_model.bin").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(UnsafeCheckpointError) as err:
        read_checkpoint(head)
    assert not marker.exists()
    text = str(err.value)
    assert str(head / "pytorch_model.bin") in text
    assert "eagle-zoo convert" in text and "safetensors" in text


def test_safetensors_is_preferred_so_a_bin_beside_it_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    head = cf.write_yuhuili_eagle(tmp_path / "h", kind="safetensors").path
    torch.save({"x": Payload(marker)}, head / "pytorch_model.bin")
    raw = read_checkpoint(head)
    assert [f.name for f in raw.files] == ["model.safetensors"]
    assert not marker.exists()


def test_a_pickle_that_is_not_a_flat_state_dict(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(1)}}, tmp_path / "nested.bin")
    with pytest.raises(CorruptCheckpointError, match="nested.bin: expected a flat dict"):
        read_file(tmp_path / "nested.bin")


# -- corrupt and truncated files ------------------------------------------------------
@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated download
        lambda b: b[:4],  # not even a header length
        lambda b: b"",  # empty
        lambda b: (20).to_bytes(8, "little") + b"{this is not json}..." + b[28:],  # bad header
    ],
    ids=["truncated", "tiny", "empty", "garbage-header"],
)
def test_corrupt_safetensors(tmp_path, damage):
    head = cf.write_speculators(tmp_path / "h").path
    f = head / "model.safetensors"
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CorruptCheckpointError, match=str(f)):
        read_checkpoint(head)


def test_truncated_shard_is_named(tmp_path):
    head = cf.write_speculators(tmp_path / "h", shards=2).path
    shard = head / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match="model-00002-of-00002.safetensors"):
        read_checkpoint(head)


def test_truncated_bin(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h", kind="bin").path
    f = head / "pytorch_model.bin"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CorruptCheckpointError, match="pytorch_model.bin: .*truncated or corrupt"):
        read_checkpoint(head)


# -- sharded checkpoints ---------------------------------------------------------------
def test_missing_shard(tmp_path):
    head = cf.write_yuhuili_eagle3(tmp_path / "h", kind="safetensors", shards=3).path
    (head / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(MissingShardError, match="model-00002-of-00003.safetensors"):
        read_checkpoint(head)


def test_index_promising_a_tensor_the_shard_lacks(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h", kind="safetensors", shards=2).path
    index = json.loads((head / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.0.extra.weight"] = "model-00001-of-00002.safetensors"
    (head / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptCheckpointError, match="says it holds 'layers.0.extra.weight'"):
        read_tensors(head)


def test_broken_index(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "h", kind="bin", shards=2).path
    (head / "pytorch_model.bin.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CorruptCheckpointError, match='pytorch_model.bin.index.json: .*"weight_map"'):
        read_checkpoint(head)


# -- one tensor from a big target ----------------------------------------------------------
def test_read_one_tensor_from_a_sharded_target_reads_only_its_shard(tmp_path):
    target = cf.write_target(tmp_path / "t", num_hidden_layers=2, max_shard_size="20KB")
    index = json.loads((target.path / "model.safetensors.index.json").read_text())["weight_map"]
    home = index["lm_head.weight"]
    for shard in set(index.values()) - {home}:  # the others are not needed at all
        (target.path / shard).unlink()
    got = read_tensor(target.path, "lm_head.weight")
    assert torch.equal(got, target.weights["lm_head.weight"])
    with pytest.raises(CheckpointError, match="no tensor named 'nope'"):
        read_tensor(target.path, "nope")


def test_read_one_tensor_from_single_files(tmp_path):
    w = {"lm_head.weight": torch.randn(5, 3), "other": torch.randn(2)}
    (tmp_path / "s").mkdir()
    save_file(w, str(tmp_path / "s" / "model.safetensors"))
    (tmp_path / "b").mkdir()
    torch.save(w, tmp_path / "b" / "pytorch_model.bin")
    for d in ("s", "b"):
        assert torch.equal(read_tensor(tmp_path / d, "lm_head.weight"), w["lm_head.weight"])
        assert tensors.tensor_names(tmp_path / d) == ["lm_head.weight", "other"]


# -- the EAGLE-3 vocabulary map -----------------------------------------------------------------
def _map(vocab=64, draft=16):
    d2t, t2d = cf.vocab_map(vocab, draft, seed=3)
    return {"d2t": d2t, "t2d": t2d}, {"vocab_size": vocab, "draft_vocab_size": draft}


def test_factory_vocab_map_is_what_the_definition_says():
    # Independent of validate_vocab_map: check the definition element by element.
    w, c = _map()
    mapped = {d + int(w["d2t"][d]) for d in range(c["draft_vocab_size"])}
    assert len(mapped) == c["draft_vocab_size"]
    assert all(bool(w["t2d"][j]) == (j in mapped) for j in range(c["vocab_size"]))
    validate_vocab_map(w, c, "x")


def _move_one_mark(w):
    t2d = w["t2d"].clone()
    on, off = int(t2d.nonzero()[0]), int((~t2d).nonzero()[0])
    t2d[on], t2d[off] = False, True
    return {**w, "t2d": t2d}


BAD_MAPS = [
    ("t2d count", lambda w: {**w, "t2d": w["t2d"] & (torch.arange(64) != int(w["t2d"].nonzero()[0]))},
     "t2d marks 15 target tokens but d2t has 16"),
    ("t2d position", _move_one_mark, r"t2d\[\d+\] is (True|False)"),
    ("d2t range", lambda w: {**w, "d2t": w["d2t"] + 1000}, "outside the target vocabulary of 64"),
    ("d2t duplicate", lambda w: {**w, "d2t": torch.cat([w["d2t"][:1], w["d2t"][:1] - 1, w["d2t"][2:]])},
     "same target id"),  # draft ids 0 and 1 both -> target d2t[0]
    ("d2t length", lambda w: {**w, "d2t": w["d2t"][:-1]}, "d2t has 15 entries but config.json draft_vocab_size is 16"),
    ("t2d length", lambda w: {**w, "t2d": torch.cat([w["t2d"], torch.zeros(1, dtype=torch.bool)])},
     "t2d has 65 entries"),
    ("d2t float", lambda w: {**w, "d2t": w["d2t"].float()}, "1-D integer tensor"),
    ("no d2t", lambda w: {"t2d": w["t2d"]}, "needs the d2t tensor"),
]


@pytest.mark.parametrize("name, damage, message", BAD_MAPS, ids=[b[0] for b in BAD_MAPS])
def test_vocab_map_errors(name, damage, message):
    w, c = _map()
    with pytest.raises(CheckpointFormatError, match=message):
        validate_vocab_map(damage(w), c, "head.bin")


def test_bad_vocab_map_in_a_checkpoint_names_the_file(tmp_path):
    written = cf.write_yuhuili_eagle3(tmp_path / "h", kind="safetensors")
    cf.save_weights(written.path, _move_one_mark(written.weights), "safetensors")
    with pytest.raises(CheckpointFormatError, match=r"model.safetensors: t2d\["):
        read_checkpoint(written.path)
