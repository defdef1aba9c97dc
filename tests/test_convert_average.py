"""`eagle-zoo convert average`: the weighted mean of heads of one config and draft
vocabulary, in the first head's layout and sharding; what cannot be averaged is refused
by name, with nothing written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import eagle_zoo

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_factory as cf  # noqa: E402
from test_convert import convert, offline, read_dir  # noqa: E402,F401  (offline: autouse, no network)


def write_pair(tmp_path: Path, dtype=torch.float32, **b_overrides):
    """Two yuhuili EAGLE-3 heads in two shards, different weights, one draft vocabulary
    (as a warm-started head and the head it started from have)."""
    a = cf.write_yuhuili_eagle3(tmp_path / "a", kind="safetensors", shards=2, embed=True, seed=0)
    cfg = dict(a.config, **b_overrides)
    wb = cf.eagle3_weights(cfg, embed=True, seed=1, dtype=dtype)
    wb["d2t"], wb["t2d"] = a.weights["d2t"], a.weights["t2d"]
    if dtype != torch.float32:  # both heads in that dtype
        a.weights.update({k: v.to(dtype) for k, v in a.weights.items() if v.is_floating_point()})
        cf.save_weights(a.path, a.weights, "safetensors", 2)
    cf.write_config(tmp_path / "b", cfg)
    cf.save_weights(tmp_path / "b", wb, "safetensors", 2)
    (a.path / "eagle_zoo_training.json").write_text(json.dumps({"steps": 7}))
    return a.path, tmp_path / "b", a.weights, wb


def test_weighted_mean_keeps_layout_and_loads(tmp_path):
    a, b, wa, wb = write_pair(tmp_path)
    out = tmp_path / "avg"
    assert convert("average", a, "--with", b, "--weights", "1,3", "-o", out) == 0
    got = read_dir(out)
    assert sorted(got) == sorted(wa)
    for name, t in wa.items():
        if t.is_floating_point():
            torch.testing.assert_close(got[name], 0.25 * t + 0.75 * wb[name], rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(got[name], t), name
    # the first head's sharding, config and index, and a record of what was averaged
    assert json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] == \
        json.loads((a / "model.safetensors.index.json").read_text())["weight_map"]
    assert json.loads((out / "config.json").read_text()) == json.loads((a / "config.json").read_text())
    record = json.loads((out / "eagle_zoo_training.json").read_text())["average"]
    assert [(r["head"], r["weight"]) for r in record] == [(str(a), 0.25), (str(b), 0.75)]
    assert record[0]["record"] == {"steps": 7} and record[1]["record"] is None
    assert eagle_zoo.load(out).format == "yuhuili-eagle3"


def test_bf16_heads_are_averaged_in_fp32(tmp_path):
    a, b, wa, wb = write_pair(tmp_path, dtype=torch.bfloat16)
    out = tmp_path / "avg"
    assert convert("average", a, "--with", b, "-o", out) == 0
    got = read_dir(out)
    w = "fc.weight"
    assert got[w].dtype == torch.bfloat16
    assert torch.equal(got[w], (0.5 * wa[w].float() + 0.5 * wb[w].float()).bfloat16())


def test_a_negative_weight_extrapolates(tmp_path):
    """--weights 3,-1 (normalized: 1.5, -0.5) is A + 0.5 (A - B): the step from B to A
    taken half again, computed in fp32 and stored in the heads' dtype."""
    a, b, wa, wb = write_pair(tmp_path, dtype=torch.bfloat16)
    out = tmp_path / "ext"
    assert convert("average", a, "--with", b, "--weights", "3,-1", "-o", out) == 0
    got = read_dir(out)
    for name, t in wa.items():
        if t.is_floating_point():
            assert torch.equal(got[name], (1.5 * t.float() - 0.5 * wb[name].float()).bfloat16()), name
    record = json.loads((out / "eagle_zoo_training.json").read_text())["average"]
    assert [r["weight"] for r in record] == [1.5, -0.5]


def test_dry_run_names_the_average(tmp_path, capsys):
    a, b, _, _ = write_pair(tmp_path)
    assert convert("average", a, "--with", b, "-o", tmp_path / "avg", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "average fc.weight" in out and "file: eagle_zoo_training.json" in out
    # the draft vocabulary maps are not averaged: checked equal and kept from the first head
    assert [line.split()[0] for line in out.splitlines() if line.split()[1:2] in (["d2t"], ["t2d"])] == ["keep", "keep"]
    assert f"weights: 0.5 {a}, 0.5 {b}" in out and not (tmp_path / "avg").exists()


def test_an_unreadable_record_is_named_not_dropped(tmp_path):
    a, b, _, _ = write_pair(tmp_path)
    (b / "eagle_zoo_training.json").write_text("{not json")
    assert convert("average", a, "--with", b, "-o", tmp_path / "avg") == 0
    record = json.loads((tmp_path / "avg" / "eagle_zoo_training.json").read_text())["average"]
    assert record[0]["record"] == {"steps": 7}
    assert record[1]["record"]["unreadable"].startswith(f"{b / 'eagle_zoo_training.json'}: ")


def test_a_start_averaged_with_its_own_run_is_recorded_once(tmp_path):
    """b was trained from a (its record embeds a's): the average keeps a's record once."""
    a, b, _, _ = write_pair(tmp_path)
    (b / "eagle_zoo_training.json").write_text(json.dumps({"steps": 3, "init_from": {"head": str(a), "record": {"steps": 7}}}))
    assert convert("average", a, "--with", b, "-o", tmp_path / "avg") == 0
    record = json.loads((tmp_path / "avg" / "eagle_zoo_training.json").read_text())["average"]
    assert record[0]["record"] == {"steps": 7}
    assert record[1]["record"] == {"steps": 3, "init_from": {"head": str(a), "record": {"same_as": "average[0].record"}}}


def test_a_start_shared_by_two_averaged_heads_is_recorded_once(tmp_path):
    """a and b were both trained from a head c outside the average (a grown copy of c and
    c's own run): c's record is kept in a's entry, b's refers to it."""
    a, b, _, _ = write_pair(tmp_path)
    start = {"head": "c", "record": {"steps": 11}}
    (a / "eagle_zoo_training.json").write_text(json.dumps({"steps": 1, "init_from": start}))
    (b / "eagle_zoo_training.json").write_text(json.dumps({"steps": 9, "init_from": start}))
    assert convert("average", a, "--with", b, "-o", tmp_path / "avg") == 0
    record = json.loads((tmp_path / "avg" / "eagle_zoo_training.json").read_text())["average"]
    assert record[0]["record"] == {"steps": 1, "init_from": start}
    assert record[1]["record"] == {"steps": 9, "init_from": {"head": "c", "record": {
        "same_as": "average[0].record.init_from.record"}}}


def _vocab_differs(tmp_path):
    a, b, _, wb = write_pair(tmp_path)
    wb["d2t"] = wb["d2t"].flip(0)
    cf.save_weights(b, wb, "safetensors", 2)
    return [a, "--with", b]


def _config_differs(tmp_path):
    a, b, _, _ = write_pair(tmp_path, rms_norm_eps=1e-5)
    return [a, "--with", b]


def _given_twice(tmp_path):
    a, _, _, _ = write_pair(tmp_path)
    return [a, "--with", a]


def _weights(text):
    """A case: the pair of heads averaged with --weights TEXT."""
    def case(tmp_path):
        a, b, _, _ = write_pair(tmp_path)
        return [a, "--with", b, "--weights", text]
    return case


def _missing_tensor(tmp_path):
    a, b, _, wb = write_pair(tmp_path)
    del wb["norm.weight"]
    for p in b.glob("model*"):
        p.unlink()
    cf.save_weights(b, wb, "safetensors", 2)
    return [a, "--with", b]


@pytest.mark.parametrize("case, words", [
    (_vocab_differs, ["'d2t' differs", "different vocabularies"]),
    (_config_differs, ["config.json", "'rms_norm_eps'"]),
    (_given_twice, ["given twice"]),
    (_weights("1,2,3"), ["--weights", "3 weights for 2 heads"]),
    (_weights("1,0"), ["--weights", "a weight is 0", "leave that head out"]),
    (_weights("1,-1"), ["--weights", "sum to 0", "more than 0"]),
    (_weights("1,-2"), ["--weights", "sum to -1", "more than 0"]),
    (_weights("inf,1"), ["--weights", "finite"]),
    (_missing_tensor, ["lacks 'norm.weight'"]),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_what_cannot_be_averaged_is_refused(tmp_path, capsys, case, words, dry_run):
    args = case(tmp_path)
    capsys.readouterr()
    out = tmp_path / "avg"
    assert convert("average", *args, "-o", out, *(["--dry-run"] if dry_run else [])) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".avg.")]
