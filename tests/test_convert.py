"""`eagle-zoo convert`: every conversion round-trips, bad input leaves nothing behind.

References nobody here wrote: the tensors tests/checkpoint_factory.py wrote in each
publisher's layout, safetensors' own reader (load_file) for what the converter wrote,
and the original head loaded through eagle_zoo.load for the forward comparison.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import eagle_zoo
from eagle_zoo.cli import main

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_factory as cf  # noqa: E402

TINY = cf.TINY
V, H = TINY["vocab_size"], TINY["hidden_size"]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    # Nothing may touch the network: an unknown id fails fast from an empty cache.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def convert(*args) -> int:
    return main(["convert", *map(str, args), "--quiet"])


def read_dir(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a written checkpoint, read with safetensors itself."""
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        return load_file(directory / "model.safetensors")
    out = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        out.update(load_file(directory / shard))
    return out


def assert_same_tensors(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k], want[k]), k


def assert_nothing_left(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


def config_of(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


# -- forward through eagle_zoo.load ----------------------------------------------
def target_stub(target: cf.Written) -> SimpleNamespace:
    """The target's embed_tokens / lm_head as plain torch modules (what a head shares)."""
    w = target.weights
    embed = nn.Embedding(V, H).requires_grad_(False)
    embed.weight.copy_(w["model.embed_tokens.weight"])
    lm_head = nn.Linear(H, V, bias=False).requires_grad_(False)
    lm_head.weight.copy_(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
    return SimpleNamespace(config=target.config, embed_tokens=embed, lm_head=lm_head)


def eagle1_outputs(directory: Path, target=None, seed: int = 0):
    head = eagle_zoo.load(directory, target=target).head
    g = torch.Generator().manual_seed(seed)
    ids, pos = torch.randint(0, V, (2, 5), generator=g), torch.arange(5).expand(2, 5)
    hidden = torch.randn(2, 5, H, generator=g)
    with torch.no_grad():
        h = head(ids, pos, hidden)
        return h, head.compute_logits(h)


def eagle3_outputs(directory: Path, target_hidden: int = H, seed: int = 0):
    loaded = eagle_zoo.load(directory)
    head = loaded.head
    g = torch.Generator().manual_seed(seed)
    ids, pos = torch.randint(0, V, (2, 5), generator=g), torch.arange(5).expand(2, 5)
    aux = torch.randn(2, 5, 3 * target_hidden, generator=g)
    with torch.no_grad():
        h = head(ids, pos, head.combine_hidden_states(aux))
        return loaded.format, h, head.compute_logits(h)


def assert_same_outputs(a, b) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


# -- legacy -----------------------------------------------------------------------
@pytest.mark.parametrize("fc_bias, kind, shards", [(True, "bin", "20KB"), (False, "safetensors", None)])
def test_legacy_adds_target_lm_head_and_loads_as_legacy(tmp_path, fc_bias, kind, shards):
    head = cf.write_yuhuili_eagle(tmp_path / "head", fc_bias=fc_bias, kind=kind, inv_freq=True, bias_key=fc_bias)
    target = cf.write_target(tmp_path / "target", max_shard_size=shards)
    out = tmp_path / "legacy"
    assert convert("legacy", head.path, "--target", target.path, "-o", out) == 0

    want = {k: v for k, v in head.weights.items() if "rotary_emb.inv_freq" not in k}
    want["lm_head.weight"] = target.weights["lm_head.weight"]
    assert (target.path / "model.safetensors.index.json").exists() == (shards is not None)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert_same_tensors(load_file(out / "model.safetensors"), want)
    expected = {"model_type": "eagle", "model": head.config, "truncated_vocab_size": V}
    if fc_bias:
        expected["eagle_fc_bias"] = True
    assert config_of(out) == expected

    assert eagle_zoo.load(out).format == "legacy-vllm"
    original = eagle1_outputs(head.path, target=target_stub(target))
    assert_same_outputs(eagle1_outputs(out), original)
    # the logits are the target's lm_head applied to the feature (independent of the head code)
    torch.testing.assert_close(original[1], original[0] @ target.weights["lm_head.weight"].T)


def test_legacy_tied_target_uses_embed_tokens(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "head")
    target = cf.write_target(tmp_path / "target", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(target.path / "model.safetensors")  # the case under test
    out = tmp_path / "legacy"
    assert convert("legacy", head.path, "--target", target.path, "-o", out) == 0
    assert torch.equal(load_file(out / "model.safetensors")["lm_head.weight"], target.weights["model.embed_tokens.weight"])


def test_legacy_target_by_hub_id_from_the_cache(tmp_path):
    head = cf.write_yuhuili_eagle(tmp_path / "head")
    repo = tmp_path / "hf-cache" / "models--tiny-org--tiny-target"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    target = cf.write_target(repo / "snapshots" / commit, max_shard_size="20KB")
    out = tmp_path / "legacy"
    assert convert("legacy", head.path, "--target", "tiny-org/tiny-target", "-o", out) == 0
    assert torch.equal(load_file(out / "model.safetensors")["lm_head.weight"], target.weights["lm_head.weight"])


@pytest.mark.parametrize("overrides, word", [({"vocab_size": 256}, "vocab_size"), ({"hidden_size": 64}, "hidden_size")])
def test_legacy_refuses_mismatched_target(tmp_path, capsys, overrides, word):
    head = cf.write_yuhuili_eagle(tmp_path / "head")
    target = cf.write_target(tmp_path / "target", **overrides)
    out = tmp_path / "legacy"
    assert convert("legacy", head.path, "--target", target.path, "-o", out) == 2
    err = capsys.readouterr().err
    assert word in err and str(target.path) in err and "trained for" in err
    assert_nothing_left(out)


# -- yuhuili EAGLE-3 <-> speculators ----------------------------------------------
def test_to_speculators_round_trip(tmp_path):
    src = cf.write_yuhuili_eagle3(
        tmp_path / "yuhuili", kind="bin", embed=True, target_hidden_size=48, eagle_aux_hidden_state_layer_ids=[1, 3, 5]
    )
    spec = tmp_path / "spec"
    assert convert("to-speculators", src.path, "-o", spec, "--verifier", "org/target", "--speculative-tokens", 4) == 0

    cfg = config_of(spec)
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["norm_before_residual"] is False
    assert (cfg["draft_vocab_size"], cfg["target_hidden_size"]) == (cf.DRAFT_VOCAB, 48)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert cfg["speculators_config"]["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 4}]
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}
    layer = cfg["transformer_layer_config"]
    assert layer == {k: v for k, v in src.config.items()
                     if k not in ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")}
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in src.weights.items()}
    assert_same_tensors(read_dir(spec), renamed)

    fmt, *converted = eagle3_outputs(spec, 48)
    fmt0, *original = eagle3_outputs(src.path, 48)
    assert (fmt0, fmt) == ("yuhuili-eagle3", "speculators-eagle3")
    assert_same_outputs(converted, original)

    back = tmp_path / "back"
    assert convert("to-yuhuili", spec, "-o", back) == 0
    assert_same_tensors(read_dir(back), src.weights)
    assert config_of(back) == src.config


@pytest.mark.parametrize("conversion, flag, value, word", [
    ("to-yuhuili", "--architecture", "BogusForCausalLM", "no installed family loads an EAGLE-3 head"),
    ("to-speculators", "--verifier-architectures", "", "give the target's architecture names"),
])
def test_a_conversion_whose_head_could_not_load_is_refused(tmp_path, capsys, conversion, flag, value, word):
    # The head would be written and then refused by every loader: refused here, nothing written.
    src = cf.write_yuhuili_eagle3(tmp_path / "src").path
    if conversion == "to-yuhuili":  # a speculators head the yuhuili layout can express
        assert convert("to-speculators", src, "--verifier", "org/target", "-o", tmp_path / "spec") == 0
        src = tmp_path / "spec"
    extra = ["--verifier", "org/target"] if conversion == "to-speculators" else []
    out = tmp_path / "out"
    assert convert(conversion, src, *extra, flag, value, "-o", out) != 0
    assert word in capsys.readouterr().err
    assert_nothing_left(out)


def _normalized_speculators(cfg: dict) -> dict:
    """The parts of a speculators config a loader reads, defaults filled in."""
    layer = cfg["transformer_layer_config"]
    sc = cfg["speculators_config"]
    return {
        "type": cfg["speculators_model_type"],
        "layer": layer,
        "draft_vocab_size": cfg["draft_vocab_size"],
        "target_hidden_size": cfg.get("target_hidden_size") or layer["hidden_size"],
        "aux": cfg.get("eagle_aux_hidden_state_layer_ids"),
        "flags": [cfg.get("norm_before_residual", True), cfg.get("norm_before_fc", False), cfg.get("fc_norm", False)],
        "tokens": sc["proposal_methods"][0]["speculative_tokens"],
        "verifier": sc["verifier"],
    }


def test_to_yuhuili_round_trip(tmp_path):
    src = cf.write_speculators(tmp_path / "spec", embed=True, shards=2, flags={"norm_before_residual": False},
                               aux_layer_ids=[0, 2, 4])
    yuhuili = tmp_path / "yuhuili"
    assert convert("to-yuhuili", src.path, "-o", yuhuili) == 0
    cfg = config_of(yuhuili)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == cf.DRAFT_VOCAB
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert_same_tensors(read_dir(yuhuili), {k.replace("layers.0.", "midlayer."): v for k, v in src.weights.items()})

    fmt, *converted = eagle3_outputs(yuhuili)
    assert fmt == "yuhuili-eagle3"
    assert_same_outputs(converted, eagle3_outputs(src.path)[1:])

    back = tmp_path / "back"
    assert convert("to-speculators", yuhuili, "-o", back, "--verifier", "tiny/verifier") == 0
    assert_same_tensors(read_dir(back), src.weights)
    assert _normalized_speculators(config_of(back)) == _normalized_speculators(src.config)


@pytest.mark.parametrize("kwargs, word", [
    (dict(flags={}), "norm_before_residual"),  # absent = the speculators default, True
    (dict(flags={"norm_before_residual": False, "norm_before_fc": True}), "norm_before_fc"),
    (dict(flags={"norm_before_residual": False, "fc_norm": True}), "fc_norm"),
    (dict(model_type="peagle", flags={"norm_before_residual": False}), "peagle"),
])
def test_to_yuhuili_refuses_what_yuhuili_cannot_express(tmp_path, capsys, kwargs, word):
    src = cf.write_speculators(tmp_path / "spec", **kwargs)
    out = tmp_path / "yuhuili"
    assert convert("to-yuhuili", src.path, "-o", out) == 5
    assert word in capsys.readouterr().err
    assert_nothing_left(out)


# -- file-level conversions -----------------------------------------------------
def test_to_safetensors_keeps_shards_and_loads(tmp_path):
    src = cf.write_yuhuili_eagle(tmp_path / "bin", kind="bin", shards=2)
    (src.path / "README.md").write_text("card")
    out = tmp_path / "st"
    assert convert("to-safetensors", src.path, "-o", out) == 0
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert_same_tensors(read_dir(out), src.weights)
    assert config_of(out) == src.config
    target = target_stub(cf.write_target(tmp_path / "target"))
    assert_same_outputs(eagle1_outputs(out, target), eagle1_outputs(src.path, target))


def test_to_safetensors_single_file(tmp_path):
    src = cf.write_yuhuili_eagle(tmp_path / "bin", kind="bin")
    out = tmp_path / "st"
    assert convert("to-safetensors", src.path / "pytorch_model.bin", "-o", out) == 0
    assert_same_tensors(load_file(out / "model.safetensors"), src.weights)


def test_shard_unshard_round_trip(tmp_path):
    src = cf.write_speculators(tmp_path / "spec", embed=True, flags={"norm_before_residual": False})
    sharded = tmp_path / "sharded"
    assert convert("shard", src.path, "-o", sharded, "--max-shard-size", "10kB") == 0
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (sharded / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in src.weights.values())
    for shard in shards:  # each file holds exactly what the index says, within the limit (or one big tensor)
        part = load_file(sharded / shard)
        assert sorted(part) == sorted(k for k, f in index["weight_map"].items() if f == shard)
        size = sum(t.numel() * t.element_size() for t in part.values())
        assert size <= 10_000 or len(part) == 1
    assert_same_tensors(read_dir(sharded), src.weights)
    assert config_of(sharded) == src.config
    assert_same_outputs(eagle3_outputs(sharded)[1:], eagle3_outputs(src.path)[1:])

    single = tmp_path / "single"
    assert convert("unshard", sharded, "-o", single) == 0
    assert sorted(os.listdir(single)) == ["config.json", "model.safetensors"]
    assert_same_tensors(load_file(single / "model.safetensors"), src.weights)


def test_shard_size_parsing():
    from converters.errors import ConvertError
    from converters.plan import parse_size

    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("500") == 500
    for bad in ("five", "0GB", "5XB"):
        with pytest.raises(ConvertError, match="max-shard-size"):
            parse_size(bad)


# -- dry run, --force, atomic output -----------------------------------------------
def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    head = cf.write_yuhuili_eagle(tmp_path / "head", inv_freq=True)
    target = cf.write_target(tmp_path / "target")
    e3 = cf.write_yuhuili_eagle3(tmp_path / "e3")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert convert("legacy", head.path, "--target", target.path, "-o", tmp_path / "a", "--dry-run") == 0
    assert convert("to-speculators", e3.path, "--verifier", "v", "-o", tmp_path / "b", "--dry-run") == 0
    assert convert("shard", e3.path, "--max-shard-size", "1kB", "-o", tmp_path / "c", "--dry-run") == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    out = capsys.readouterr().out
    assert "add    lm_head.weight <- " in out and "[128, 32] float32" in out
    assert "drop   layers.0.self_attn.rotary_emb.inv_freq" in out
    assert "rename midlayer.self_attn.q_proj.weight -> layers.0.self_attn.q_proj.weight" in out
    assert "keep   d2t" in out and "int64" in out
    assert "model-00001-of-" in out and out.count("nothing written") == 3


def test_existing_output_needs_force(tmp_path, capsys):
    src = cf.write_yuhuili_eagle3(tmp_path / "e3")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert convert("to-speculators", src.path, "--verifier", "v", "-o", out) == 3
    assert "--force" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert convert("to-speculators", src.path, "--verifier", "v", "-o", out, "--force") == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp / old dirs


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    import converters.plan

    real = converters.plan.write_safetensors

    def interrupted(path, tensors, on_bytes):
        real(path, tensors[:1], on_bytes)  # a first file exists in the temp dir ...
        raise KeyboardInterrupt  # ... when the user presses Ctrl-C

    monkeypatch.setattr(converters.plan, "write_safetensors", interrupted)
    src = cf.write_yuhuili_eagle3(tmp_path / "e3")
    out = tmp_path / "new" / "deeper" / "out"
    assert convert("to-speculators", src.path, "--verifier", "v", "-o", out) == 130
    assert not (tmp_path / "new").exists()  # the parents it created are gone too
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert convert("to-speculators", src.path, "--verifier", "v", "-o", existing, "--force") == 130
    assert os.listdir(existing) == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- bad input ------------------------------------------------------------------------
def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def bad_inputs(tmp_path: Path):
    """(name, argv builder) for inputs that must fail with exit 2."""
    def missing_src():
        return ["legacy", tmp_path / "nope", "--target", tmp_path / "nope2"]

    def no_config():
        head = cf.write_yuhuili_eagle(tmp_path / "head")
        (head.path / "config.json").unlink()
        return ["legacy", head.path, "--target", cf.write_target(tmp_path / "t").path]

    def no_weights():
        head = cf.write_yuhuili_eagle(tmp_path / "head")
        (head.path / "pytorch_model.bin").unlink()
        return ["legacy", head.path, "--target", cf.write_target(tmp_path / "t").path]

    def truncated_head():
        head = cf.write_yuhuili_eagle(tmp_path / "head", kind="safetensors")
        _truncate(head.path / "model.safetensors")
        return ["legacy", head.path, "--target", cf.write_target(tmp_path / "t").path]

    def garbage_header():
        src = cf.write_speculators(tmp_path / "spec", flags={"norm_before_residual": False})
        (src.path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
        return ["to-yuhuili", src.path]

    def truncated_target_shard():
        head = cf.write_yuhuili_eagle(tmp_path / "head")
        target = cf.write_target(tmp_path / "t", max_shard_size="20KB")
        shard = json.loads((target.path / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
        _truncate(target.path / shard, 0.9)
        return ["legacy", head.path, "--target", target.path]

    def truncated_bin():
        src = cf.write_yuhuili_eagle(tmp_path / "bin", kind="bin")
        _truncate(src.path / "pytorch_model.bin")
        return ["to-safetensors", src.path]

    def missing_shard():
        src = cf.write_yuhuili_eagle3(tmp_path / "e3", kind="safetensors", shards=2)
        (src.path / "model-00002-of-00002.safetensors").unlink()
        return ["to-speculators", src.path, "--verifier", "v"]

    def wrong_kind():
        src = cf.write_yuhuili_eagle(tmp_path / "e1")
        return ["to-speculators", src.path, "--verifier", "v"]

    def already_legacy():
        src = cf.write_legacy_vllm(tmp_path / "legacy")
        return ["legacy", src.path, "--target", cf.write_target(tmp_path / "t").path]

    return {f.__name__: f for f in (missing_src, no_config, no_weights, truncated_head, garbage_header,
                                    truncated_target_shard, truncated_bin, missing_shard, wrong_kind, already_legacy)}


@pytest.mark.parametrize("case", list(bad_inputs(Path("."))))
def test_bad_input_fails_cleanly(tmp_path, capsys, case):
    argv = bad_inputs(tmp_path)[case]()
    out = tmp_path / "out"
    capsys.readouterr()  # drop what writing the fixtures printed
    assert convert(*argv, "-o", out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eagle-zoo convert {argv[0]}: error: ") and "Traceback" not in err
    assert str(tmp_path) in err or case == "wrong_kind"  # the message names the file
    assert_nothing_left(out)


class _Payload:
    """Unpickling this opens (creates) a file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("as_zip", [True, False])
def test_malicious_pickle_is_not_executed(tmp_path, capsys, as_zip):
    marker = tmp_path / "pwned"
    src = cf.write_yuhuili_eagle(tmp_path / "bin", kind="bin")
    weights = dict(src.weights, **{"fc.weight": _Payload(marker)})
    if as_zip:
        torch.save(weights, src.path / "pytorch_model.bin")
    else:
        (src.path / "pytorch_model.bin").write_bytes(pickle.dumps(weights, protocol=2))
    # the payload works: an unsafe load would create the marker
    try:
        torch.load(src.path / "pytorch_model.bin", weights_only=False)
    except RuntimeError:  # torch's legacy format wants a magic number after the payload ran
        pass
    assert marker.exists()
    marker.unlink()

    target = cf.write_target(tmp_path / "t")
    for argv in (["to-safetensors", src.path], ["legacy", src.path, "--target", target.path]):
        out = tmp_path / "out"
        assert convert(*argv, "-o", out) == 4
        assert "refused to unpickle" in capsys.readouterr().err
        assert not marker.exists()
        assert_nothing_left(out)


def test_usage_errors_exit_2(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["convert", "legacy", str(tmp_path), "-o", str(tmp_path / "o")])  # no --target
    assert exc.value.code == 2
    assert convert("shard", tmp_path, "-o", tmp_path / "o", "--max-shard-size", "lots") == 2


def test_source_inside_output_is_refused(tmp_path):
    src = cf.write_yuhuili_eagle3(tmp_path / "e3")
    assert convert("to-speculators", src.path, "--verifier", "v", "-o", tmp_path, "--force") == 2
    assert (src.path / "pytorch_model.bin").exists()


def test_help_through_the_installed_command():
    exe = shutil.which("eagle-zoo") or str(Path(sys.executable).parent / "eagle-zoo")
    result = subprocess.run([exe, "convert", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for word in ("legacy", "to-speculators", "to-yuhuili", "to-safetensors", "shard", "unshard", "exit codes", "130"):
        assert word in result.stdout
