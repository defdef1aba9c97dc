"""No file outside a checkpoint directory is read because the checkpoint names it.

For each way a checkpoint names files (a safetensors index, a pytorch_model.bin
index, the single weight file, Mistral's consolidated files, the small files a
converter copies), an entry that is absolute, climbs with ``..``, or is a symlink
(the file or a folder on the way) out of the directory is refused by name, in the
loaders (head and target) and in the converters; and the outside file's tensors
appear nowhere. A Hugging Face cache snapshot, whose files link into its
repository's ``blobs`` folder, still loads.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import checkpoint_factory as cf
from eagle_zoo.checkpoints import tensors as ckpt
from eagle_zoo.checkpoints.formats import read_checkpoint
from eagle_zoo.cli import main

SECRET = torch.full((3,), 1234.5)


def outside_file(tmp_path: Path, kind: str) -> Path:
    """A weight file outside every checkpoint, holding a tensor no checkpoint has."""
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    path = out / ("secret.safetensors" if kind == "safetensors" else "secret.bin")
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file({"secret": SECRET}, str(path))
    else:
        torch.save({"secret": SECRET}, path)
    return path


def sharded_head(tmp_path: Path, kind: str) -> tuple[Path, Path, dict]:
    """A two-shard yuhuili EAGLE head (``kind`` shards) -> (directory, index, index JSON)."""
    head = cf.write_yuhuili_eagle(tmp_path / f"head-{kind}", kind=kind, shards=2)
    index = head.path / ("model.safetensors.index.json" if kind == "safetensors" else "pytorch_model.bin.index.json")
    return head.path, index, json.loads(index.read_text())


def escape(tmp_path: Path, directory: Path, index: Path, data: dict, how: str, kind: str) -> str:
    """Points one weight_map entry ('fc.weight') outside ``directory``; -> the entry."""
    secret = outside_file(tmp_path, kind)
    shard = data["weight_map"]["fc.weight"]
    if how == "absolute":
        entry = str(secret)
    elif how == "dotdot":
        entry = os.path.relpath(secret, directory)  # up one level, into outside/
    elif how == "symlinked file":
        entry = "link-" + shard
        (directory / entry).symlink_to(secret)
    else:  # a folder on the way is a link out
        (directory / "sub").symlink_to(secret.parent, target_is_directory=True)
        entry = "sub/" + secret.name
    data["weight_map"]["fc.weight"] = entry
    index.write_text(json.dumps(data))
    return entry


HOWS = ["absolute", "dotdot", "symlinked file", "symlinked folder"]


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
@pytest.mark.parametrize("how", HOWS)
def test_loaders_refuse_an_index_entry_outside(tmp_path, kind, how):
    directory, index, data = sharded_head(tmp_path, kind)
    entry = escape(tmp_path, directory, index, data, how, kind)
    readers = [ckpt.load_state_dict, ckpt.weight_files, ckpt.tensor_names, read_checkpoint,
               lambda d: ckpt.read_tensor(d, "fc.weight")]
    for read in readers:
        with pytest.raises(ckpt.OutsideCheckpointError) as e:
            read(directory)
        msg = str(e.value)
        assert str(index) in msg and repr(entry) in msg and "'fc.weight'" in msg, msg


def test_target_loader_refuses_an_index_entry_outside(tmp_path):
    """The engine's target loader (LLM) on a transformers-sharded target."""
    from eagle_zoo import LLM

    target = cf.write_target(tmp_path / "t", max_shard_size="20KB")
    index = target.path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    secret = outside_file(tmp_path, "safetensors")
    data["weight_map"]["lm_head.weight"] = os.path.join("..", "outside", secret.name)
    index.write_text(json.dumps(data))
    with pytest.raises(ckpt.OutsideCheckpointError, match=r"weight_map\['lm_head.weight'\].*\.\./outside"):
        LLM(str(target.path), device="cpu", max_model_len=16, max_num_seqs=1)


def test_single_weight_file_linked_out_is_refused(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "head", kind="safetensors")
    secret = outside_file(tmp_path, "safetensors")
    (head.path / "model.safetensors").unlink()
    (head.path / "model.safetensors").symlink_to(secret)
    with pytest.raises(ckpt.OutsideCheckpointError, match="leads outside"):
        ckpt.load_state_dict(head.path)


def test_mistral_consolidated_file_linked_out_is_refused(tmp_path):
    from eagle_zoo.checkpoints import mistral_native

    d = tmp_path / "mistral"
    d.mkdir()
    (d / "consolidated.safetensors").symlink_to(outside_file(tmp_path, "safetensors"))
    with pytest.raises(ckpt.OutsideCheckpointError, match="consolidated.safetensors"):
        mistral_native._weight_files(d)


def test_a_hub_cache_snapshot_still_loads(tmp_path):
    """models--org--name/snapshots/<rev>/* link to the blobs folder two levels up: inside the
    repository folder, so allowed; a snapshot link out of the repository is not."""
    head = cf.write_yuhuili_eagle(tmp_path / "head", kind="safetensors", shards=2)
    repo = tmp_path / "hub" / "models--org--head"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(head.path.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        (snap / f.name).symlink_to(Path("..", "..", "blobs") / f"blob{i}")
    got = ckpt.load_state_dict(snap)
    assert sorted(got) == sorted(head.weights) and torch.equal(got["fc.weight"], head.weights["fc.weight"])
    index = snap / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    index.unlink()
    (snap / "evil.safetensors").symlink_to(outside_file(tmp_path, "safetensors"))
    data["weight_map"]["fc.weight"] = "evil.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(ckpt.OutsideCheckpointError, match="evil.safetensors"):
        ckpt.load_state_dict(snap)


# -- converters ------------------------------------------------------------------------------
@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def convert(*args) -> int:
    return main(["convert", *map(str, args), "--quiet"])


@pytest.mark.parametrize("conversion, kind", [("to-safetensors", "bin"), ("unshard", "safetensors"),
                                              ("shard", "safetensors"), ("to-speculators", "safetensors")])
@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlinked file"])
def test_converters_refuse_an_index_entry_outside(tmp_path, capsys, offline, conversion, kind, how):
    directory, index, data = sharded_head(tmp_path, kind)
    if conversion == "to-speculators":  # an EAGLE-3 head: what to-speculators converts
        shutil.rmtree(directory)
        cf.write_yuhuili_eagle3(directory, kind=kind, shards=2)
        data = json.loads(index.read_text())
    entry = escape(tmp_path, directory, index, data, how, kind)
    out = tmp_path / "out"
    extra = {"shard": ["--max-shard-size", "10KB"], "to-speculators": ["--verifier", "v"]}.get(conversion, [])
    capsys.readouterr()
    assert convert(conversion, directory, "-o", out, *extra) == 4
    err = capsys.readouterr().err
    assert repr(entry) in err and str(index) in err, err
    assert not out.exists()


def test_to_safetensors_never_puts_outside_tensors_in_its_output(tmp_path, offline):
    """The reported case: pytorch_model.bin.index.json naming a .bin two levels up."""
    nested = tmp_path / "a" / "b"
    directory, index, data = sharded_head(nested, "bin")
    secret = outside_file(tmp_path, "bin")
    data["weight_map"]["secret"] = os.path.relpath(secret, directory)
    index.write_text(json.dumps(data))
    assert data["weight_map"]["secret"].startswith(os.path.join("..", "..", ""))
    out = tmp_path / "out"
    assert convert("to-safetensors", directory, "-o", out) == 4
    assert not out.exists()


def test_converters_refuse_to_copy_a_small_file_linked_out(tmp_path, capsys, offline):
    head = cf.write_yuhuili_eagle(tmp_path / "head", kind="bin")
    secret = tmp_path / "private.txt"
    secret.write_text("not yours")
    (head.path / "tokenizer.json").symlink_to(secret)
    out = tmp_path / "out"
    assert convert("to-safetensors", head.path, "-o", out) == 4
    assert "tokenizer.json" in capsys.readouterr().err and not out.exists()


def test_legacy_refuses_a_target_index_entry_outside(tmp_path, capsys, offline):
    """`convert legacy` reads lm_head.weight from the target's shards: that index too."""
    head = cf.write_yuhuili_eagle(tmp_path / "head")
    target = cf.write_target(tmp_path / "t", max_shard_size="20KB").path
    index = target / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["lm_head.weight"] = str(outside_file(tmp_path, "safetensors"))
    index.write_text(json.dumps(data))
    out = tmp_path / "out"
    capsys.readouterr()
    assert convert("legacy", head.path, "--target", target, "-o", out) == 4
    err = capsys.readouterr().err
    assert "'lm_head.weight'" in err and "secret.safetensors" in err and not out.exists()
