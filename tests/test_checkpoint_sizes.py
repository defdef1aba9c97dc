"""Broken files are refused by name before anything is allocated from them: weights of a
non-float dtype where floats belong, config sizes of the wrong type, out of bounds, or
far larger than the checkpoint's tensors (heads and targets)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import checkpoint_factory as cf
import eagle_zoo
from eagle_zoo.checkpoints.sizes import ConfigSizeError
from eagle_zoo.models.loader import WeightLoadError


def head(tmp_path: Path) -> Path:
    return cf.write_yuhuili_eagle3(tmp_path / "head", kind="safetensors", embed=True).path


def edit_config(directory: Path, **changes) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(changes)
    (directory / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.uint8])
def test_non_float_weights_are_refused_by_name(tmp_path, dtype):
    directory = head(tmp_path)
    weights = load_file(directory / "model.safetensors")
    assert eagle_zoo.load(str(directory)).head is not None  # loads as written
    weights["fc.weight"] = (weights["fc.weight"] * 100).to(dtype)
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(WeightLoadError) as e:
        eagle_zoo.load(str(directory))
    msg = str(e.value)
    assert "'fc.weight'" in msg and str(dtype) in msg and "float" in msg, msg


@pytest.mark.parametrize("key, value, words", [
    ("vocab_size", "49152", ["'vocab_size'", "integer", "'49152'", "without quotes"]),
    ("hidden_size", 32.0, ["'hidden_size'", "integer", "float"]),
    ("num_hidden_layers", True, ["'num_hidden_layers'", "integer"]),
    ("intermediate_size", 10**12, ["'intermediate_size'", str(10**12), "outside"]),
    ("num_hidden_layers", 10**6, ["'num_hidden_layers'", "outside"]),
    ("num_attention_heads", 0, ["'num_attention_heads'", "outside"]),
])
def test_head_config_sizes_are_checked_by_key(tmp_path, key, value, words):
    directory = head(tmp_path)
    edit_config(directory, **{key: value})
    with pytest.raises(ConfigSizeError) as e:
        eagle_zoo.load(str(directory))
    msg = str(e.value)
    assert str(directory / "config.json") in msg and all(w in msg for w in words), msg


def test_head_sizes_far_beyond_its_weights_are_refused_before_allocation(tmp_path, monkeypatch):
    """Within every bound, but 200 layers of 8192 x 28672 MLPs for a few-KB checkpoint:
    refused before the head is built (building it is made to fail the test)."""
    from eagle_zoo.models import heads

    directory = head(tmp_path)
    edit_config(directory, num_hidden_layers=200, hidden_size=8192, intermediate_size=28672)

    def never(*a, **kw):
        raise AssertionError("a head was built from sizes the weights cannot fill")

    monkeypatch.setattr(heads.nn.Module, "__init__", never)
    with pytest.raises(ConfigSizeError, match=r"num_hidden_layers=200, hidden_size=8192, intermediate_size=28672"
                                              r".*does not belong to\s+these weights"):
        eagle_zoo.load(str(directory))


@pytest.mark.parametrize("changes, words", [
    ({"vocab_size": "49152"}, ["'vocab_size'", "without quotes"]),
    ({"num_hidden_layers": 10**6}, ["'num_hidden_layers'", "outside"]),
    ({"intermediate_size": 10**12}, ["'intermediate_size'", "outside"]),
    ({"num_hidden_layers": 100, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32},
     ["num_hidden_layers=100", "does not belong"]),
    ({"vocab_size": 4000000, "hidden_size": 65536, "num_attention_heads": 512},
     ["vocab_size=4000000", "hidden_size=65536", "does not belong"]),
])
def test_target_config_sizes_are_checked_before_allocation(tmp_path, changes, words):
    from eagle_zoo import LLM

    target = cf.write_target(tmp_path / "t").path
    edit_config(target, **changes)
    with pytest.raises(ConfigSizeError) as e:
        LLM(str(target), device="cpu", max_model_len=16, max_num_seqs=1)
    assert all(w in str(e.value) for w in words), str(e.value)
