"""`eagle-zoo train {eagle,eagle3} --init-from HEAD`: a warm start from a saved head
(CPU, the tiny random Llama target of test_train.py)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from eagle_zoo.checkpoints.tensors import load_state_dict
from eagle_zoo.cli import main
from eagle_zoo.train.trainer import Trainer, TrainSettings, _recorded_path, _recorded_settings
from test_train import _settings, tiny  # noqa: F401  (tiny: the module-scoped target + data fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = dict(log=lambda *a: None)


def _train(tiny, method, out, *extra):
    ttt = ["--ttt-steps", "2"] if method == "eagle3" else []
    assert main(["train", method, "--target", str(tiny / "target"), "--data", str(tiny / "data"), "--out", str(out),
                 "--max-len", "64", "--token-budget", "8192", "--warmup-steps", "1", *ttt, "--device", "cpu",
                 "--no-progress", "--no-verify", *extra]) == 0


@pytest.fixture(scope="module")
def heads(tiny):
    """Heads trained 20 steps (one batch: the whole data): eagle, and eagle3 in both layouts."""
    _train(tiny, "eagle", tiny / "eagle", "--steps", "20", "--lr", "1e-2")
    _train(tiny, "eagle3", tiny / "eagle3", "--steps", "20", "--lr", "1e-2", "--draft-vocab-size", "32",
           "--format", "yuhuili-eagle3,speculators-eagle3")
    return tiny


def _same_tensors(a, b):
    sa, sb = load_state_dict(a), load_state_dict(b)
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name
    return sa


# -- (a), (b): one step at lr 0 saves exactly the init head -----------------------------------------
@pytest.mark.parametrize("method,layout", [("eagle", ""), ("eagle3", "yuhuili-eagle3"),
                                           ("eagle3", "speculators-eagle3")])
def test_init_from_head_is_the_starting_point(heads, tmp_path, method, layout):
    init = heads / method / layout if layout else heads / method
    out = tmp_path / "again"
    fmt = ["--format", layout] if layout else []
    # No --draft-vocab-size: a fresh eagle3 run would choose 128 tokens; the init head has 32.
    _train(heads, method, out, "--init-from", str(init), "--steps", "1", "--lr", "0", *fmt)
    state = _same_tensors(init, out)  # bf16 files -> fp32 training weights -> bf16 files: bitwise
    if method == "eagle3":
        assert state["d2t"].numel() == 32 and int(state["t2d"].sum()) == 32
    record = json.loads((out / "eagle_zoo_training.json").read_text())
    assert record["settings"]["init_from"] == str(init)
    assert record["init_from"]["format"] == (layout or "yuhuili-eagle") and record["steps"] == 1
    # The start's own record comes along, so a head trained round after round keeps its history.
    assert record["init_from"]["record"] == json.loads((init / "eagle_zoo_training.json").read_text())
    again = tmp_path / "again2"  # a start with no record (a published head) records none
    bare = tmp_path / "bare"
    shutil.copytree(init, bare)
    (bare / "eagle_zoo_training.json").unlink()
    _train(heads, method, again, "--init-from", str(bare), "--steps", "1", "--lr", "0", *fmt)
    assert "record" not in json.loads((again / "eagle_zoo_training.json").read_text())["init_from"]
    assert json.loads((out / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids") == \
        json.loads((init / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")


# -- (c): heads that do not fit ---------------------------------------------------------------------
def test_mismatched_heads_are_refused(heads, tmp_path):
    eagle, eagle3 = str(heads / "eagle"), str(heads / "eagle3" / "yuhuili-eagle3")
    with pytest.raises(ValueError, match=rf"--init-from {eagle} is an EAGLE-1 head .*train eagle3"):
        Trainer(_settings(heads, "eagle3", init_from=eagle), **QUIET)
    with pytest.raises(ValueError, match=rf"--init-from {eagle3} is an EAGLE-3 head"):
        Trainer(_settings(heads, "eagle", init_from=eagle3), **QUIET)
    with pytest.raises(ValueError, match=r"--draft-vocab-size 48 conflicts with --init-from .* has 32 tokens.*"
                                         r"drop --draft-vocab-size, pass 32, or add --reselect-draft-vocab"):
        Trainer(_settings(heads, "eagle3", init_from=eagle3, draft_vocab_size=48), **QUIET)
    aux = json.loads((heads / "eagle3" / "yuhuili-eagle3" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    with pytest.raises(ValueError, match=rf"--aux-layers 0,1,3 conflicts with --init-from .* target layers "
                                         rf"{','.join(map(str, aux))}: drop --aux-layers"):
        Trainer(_settings(heads, "eagle3", init_from=eagle3, draft_vocab_size=None, aux_layers=[0, 1, 3]), **QUIET)

    # A tensor missing from the files: named, with the path.
    broken = tmp_path / "broken"
    shutil.copytree(eagle, broken)
    from safetensors.torch import save_file

    tensors = load_state_dict(broken)
    del tensors["fc.weight"]
    for f in broken.glob("model*.safetensors*"):
        f.unlink()
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"--init-from {broken}: .*missing weights for 'fc.weight'"):
        Trainer(_settings(heads, "eagle", init_from=str(broken)), **QUIET)

    # Same shapes, another layer: a speculators head with the residual taken after hidden_norm.
    other = tmp_path / "other"
    shutil.copytree(heads / "eagle3" / "speculators-eagle3", other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(cfg, norm_before_residual=True)))
    with pytest.raises(ValueError, match=rf"--init-from {other}: its config has norm_before_residual = True"):
        Trainer(_settings(heads, "eagle3", init_from=str(other), draft_vocab_size=None), **QUIET)


def test_every_tensor_must_match(heads):
    """init_from_head lists what the loader cannot see: tensors one head has and the other lacks."""
    import copy
    from types import SimpleNamespace

    from eagle_zoo.train.build import init_from_head

    trainer = Trainer(_settings(heads, "eagle", steps=1), **QUIET)
    other = copy.deepcopy(trainer.head)
    del other.fc
    other.register_buffer("mask_hidden", torch.zeros(3))
    init = SimpleNamespace(head=other, config=other.config, shared=["embed_tokens", "lm_head"])
    with pytest.raises(ValueError, match=r"--init-from HEAD does not fit .*missing tensors: fc.weight; "
                                         r"extra tensors: mask_hidden\. pass a head"):
        init_from_head(trainer.head, init, "eagle", "HEAD")


@pytest.mark.parametrize("size", [48, 16])
def test_reselected_draft_vocabulary_keeps_the_trained_rows(heads, tmp_path, size):
    """--reselect-draft-vocab: the draft vocabulary is chosen from this run's data (here
    the init head's data: its 32 tokens are the top 32, so a larger choice holds them all
    and a smaller one is inside them); tokens both heads draft keep the init's trained
    lm_head rows, new ones start from the target's rows carried into the init's space by the
    least-squares linear map of shared target rows onto trained rows; every other weight is
    the init's."""
    import numpy as np
    from eagle_zoo.loading import load
    from eagle_zoo.train.vocab import select_draft_vocab, token_counts, vocab_maps

    init_dir = heads / "eagle3" / "yuhuili-eagle3"
    trainer = Trainer(_settings(heads, "eagle3", init_from=str(init_dir), draft_vocab_size=size,
                                reselect_draft_vocab=True), **QUIET)
    target = trainer.target.model
    init = load(str(init_dir), target=target, dtype=torch.float32, device="cpu").head
    counts = token_counts(trainer.data.input_ids, trainer.data.loss_mask, target.config.vocab_size)
    ids = select_draft_vocab(counts, size)
    d2t, t2d = vocab_maps(ids, target.config.vocab_size)
    head = trainer.head
    assert torch.equal(head.d2t.cpu(), d2t) and torch.equal(head.t2d.cpu(), t2d)
    assert trainer.flat_config["draft_vocab_size"] == size
    init_ids = (torch.arange(init.draft_vocab_size) + init.d2t).tolist()
    shared = [t for t in ids.tolist() if t in init_ids]
    # the map, fitted here with numpy (minimum-norm least squares, as lstsq's gelsd)
    fit = np.linalg.lstsq(target.lm_head.weight[shared].detach().double().numpy(),
                          init.lm_head.weight[[init_ids.index(t) for t in shared]].detach().double().numpy(), rcond=None)[0]
    kept = 0
    for row, token in enumerate(ids.tolist()):
        if token in init_ids:
            kept += 1
            assert torch.equal(head.lm_head.weight[row], init.lm_head.weight[init_ids.index(token)]), token
        else:
            mapped = torch.from_numpy(target.lm_head.weight[token].detach().double().numpy() @ fit).float()
            assert torch.allclose(head.lm_head.weight[row], mapped, atol=1e-5), token
            assert not torch.allclose(head.lm_head.weight[row], target.lm_head.weight[token].float()), token
    assert kept == min(size, 32) and (size < 32 or kept < size)  # both kinds of row were checked
    theirs = init.state_dict()
    for name, value in head.state_dict().items():
        if name not in ("d2t", "t2d", "lm_head.weight") and not name.startswith("embed_tokens"):
            assert torch.equal(value, theirs[name]), name
    # through the CLI: saved with the new size
    out = tmp_path / "reselected"
    _train(heads, "eagle3", out, "--init-from", str(init_dir), "--steps", "1", "--reselect-draft-vocab",
           "--draft-vocab-size", str(size))
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == size


def test_new_draft_rows_follow_the_map_the_shared_rows_make():
    """Where the trained rows are exactly a linear map of the target's rows (a rotation
    and a scale here), the new tokens' rows are that map of theirs: the warm start drafts
    over them as the init head would have, had it drafted them."""
    from types import SimpleNamespace

    from eagle_zoo.train.build import _copy_shared_draft_rows

    torch.manual_seed(0)
    vocab, hidden = 40, 8
    target_rows = torch.randn(vocab, hidden)
    rotation = torch.linalg.qr(torch.randn(hidden, hidden))[0] * 0.5

    def fake_head(token_ids, rows):
        ids = torch.tensor(token_ids)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        return SimpleNamespace(draft_vocab_size=len(ids), d2t=ids - torch.arange(len(ids)), t2d=t2d,
                               lm_head=torch.nn.Linear(hidden, len(ids), bias=False).requires_grad_(False)
                               if rows is None else SimpleNamespace(weight=rows))

    init = fake_head(list(range(0, 30)), target_rows[:30] @ rotation)  # trained: mapped rows
    head = fake_head(list(range(10, 40)), None)
    head.lm_head.weight.copy_(target_rows[10:40])  # build_head's start: the target's rows
    with torch.no_grad():
        _copy_shared_draft_rows(head, init, "init", log=lambda *a: None)
    assert torch.equal(head.lm_head.weight[:20], init.lm_head.weight[10:30])  # shared: kept as trained
    assert torch.allclose(head.lm_head.weight[20:], target_rows[30:40] @ rotation, atol=1e-5)  # new: mapped


# -- (d): the weights are used ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_warm_start_begins_with_a_lower_loss(heads, method):
    init = heads / "eagle" if method == "eagle" else heads / "eagle3" / "speculators-eagle3"
    kw = dict(steps=1, log_every=1, token_budget=8192, max_len=64, draft_vocab_size=None, ttt_steps=2)
    fresh = Trainer(_settings(heads, method, **kw), **QUIET).run().history[0]
    warm_trainer = Trainer(_settings(heads, method, init_from=str(init), **kw), **QUIET)
    warm = warm_trainer.run().history[0]
    assert warm["loss"] < 0.9 * fresh["loss"], (warm, fresh)
    assert warm_trainer.result().info["init_from"]["path"] == str(init)


def test_training_record_keeps_paths_inside_the_working_directory_relative(tmp_path, monkeypatch):
    # A head trained in a checkout records where its start and data lie in the checkout, not
    # the machine's absolute paths; paths elsewhere and hub ids are kept as given.
    monkeypatch.chdir(tmp_path)
    assert _recorded_path(tmp_path / "heads" / "eagle3") == "heads/eagle3"
    assert _recorded_path("./heads/eagle3") == "heads/eagle3"
    assert _recorded_path("/elsewhere/eagle3") == "/elsewhere/eagle3"
    assert _recorded_path("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert _recorded_path(None) is None
    settings = TrainSettings(method="eagle3", target="smollm2", data=[str(tmp_path / "data"), "/elsewhere/data"],
                             init_from=str(tmp_path / "heads" / "eagle3"),
                             state_dir=str(tmp_path / "state"))
    record = _recorded_settings(settings)
    assert record["data"] == ["data", "/elsewhere/data"]
    assert (record["target"], record["init_from"], record["state_dir"], record["stop_file"]) == (
        "smollm2", "heads/eagle3", "state", None)
    assert str(tmp_path) not in json.dumps(record)


def test_resume_state_wins_over_init_from(heads, tmp_path):
    state = str(tmp_path / "state")
    first = Trainer(_settings(heads, "eagle", steps=2, state_dir=state), **QUIET)
    first.run()
    resumed = Trainer(_settings(heads, "eagle", steps=2, state_dir=state, resume=True,
                                init_from=str(heads / "eagle")), **QUIET)
    assert resumed.step == 2 and "init_from" not in resumed.result().info
    for name, p in first.params.items():
        assert torch.equal(p, resumed.params[name]), name


# -- (e): a deeper head grown from a one-layer head (--head-layers) ---------------------------------
def test_grown_head_starts_as_the_init_head_then_trains_its_new_layers(heads, tmp_path):
    """--head-layers 3 --init-from a one-layer EAGLE-3 head: the init's tensors are copied,
    layers 1 and 2 start as identities (o_proj and down_proj zero, the rest initialised),
    so the first loss is the init head's own; training then moves the new layers."""
    init = str(heads / "eagle3" / "yuhuili-eagle3")
    kw = dict(steps=1, lr=0.0, log_every=1, token_budget=8192, max_len=64, draft_vocab_size=None, ttt_steps=2)
    same = Trainer(_settings(heads, "eagle3", init_from=init, **kw), **QUIET).run().history[0]["loss"]
    grown = Trainer(_settings(heads, "eagle3", init_from=init, head_layers=3, **kw), **QUIET)
    layers = grown.head.layers
    assert len(layers) == 3 and grown.flat_config["num_hidden_layers"] == 3
    for layer in layers[1:]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.qkv_proj.weight.any() and layer.mlp.gate_up_proj.weight.any()
    assert grown.run().history[0]["loss"] == pytest.approx(same, rel=1e-6)

    trainer = Trainer(_settings(heads, "eagle3", init_from=init, head_layers=3, **dict(kw, steps=6, lr=1e-2)), **QUIET)
    history = trainer.run().history
    assert history[-1]["loss"] < history[0]["loss"], history
    assert all(layer.self_attn.o_proj.weight.any() and layer.mlp.down_proj.weight.any()
               for layer in trainer.head.layers[1:])

    # Through the CLI, saved and grown no further: a three-layer head as --init-from, with
    # --head-layers 3 or without it (a warm start keeps the init head's depth), copies every
    # tensor; a one-layer run cannot take it.
    out = tmp_path / "grown"
    _train(heads, "eagle3", out, "--init-from", init, "--head-layers", "3", "--steps", "1", "--lr", "0")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    for name, layers in (("again", ["--head-layers", "3"]), ("default", [])):
        again = tmp_path / name
        _train(heads, "eagle3", again, "--init-from", str(out), *layers, "--steps", "1", "--lr", "0")
        assert json.loads((again / "config.json").read_text())["num_hidden_layers"] == 3
        _same_tensors(out, again)
    with pytest.raises(ValueError, match=rf"--init-from {out} has 3 decoder layers, the head trained here 1: "
                                         r"pass --head-layers 3 or more"):
        Trainer(_settings(heads, "eagle3", init_from=str(out), draft_vocab_size=None, head_layers=1), **QUIET)


def test_a_grown_runs_start_is_rebuilt_anywhere_and_averages_with_its_end(heads, tmp_path):
    """The head a growing run starts from (its --init-from, --head-layers and seed; saved by
    --steps 1 --lr 0) does not depend on the data: the new layers' random weights come from
    a seeded CPU generator. So a GPU round's start can be rebuilt on the CPU and averaged
    with the round's end (`eagle-zoo convert average`), the tensors matching."""
    init = str(heads / "eagle3" / "yuhuili-eagle3")
    grow = ["--init-from", init, "--head-layers", "2"]
    start, start_other_data, end = tmp_path / "start", tmp_path / "start2", tmp_path / "end"
    _train(heads, "eagle3", start, *grow, "--steps", "1", "--lr", "0")
    _train(heads, "eagle3", start_other_data, *grow, "--steps", "1", "--lr", "0", "--val-share", "0.5")
    _same_tensors(start, start_other_data)
    _train(heads, "eagle3", end, *grow, "--steps", "6", "--lr", "1e-2")
    avg = tmp_path / "avg"
    assert main(["convert", "average", str(start), "--with", str(end), "-o", str(avg), "--quiet"]) == 0
    s, e, a = (load_state_dict(p) for p in (start, end, avg))
    w = "layers.1.self_attn.o_proj.weight"  # zero at the start: the mean is half the end's, exactly
    assert not s[w].any() and e[w].any()
    assert torch.equal(a[w], (0.5 * e[w].float()).to(a[w].dtype))


def test_head_layers_are_refused_where_they_cannot_be_served(heads):
    with pytest.raises(ValueError, match=r"--head-layers 2: an EAGLE-1 head has one decoder layer .*train eagle3"):
        Trainer(_settings(heads, "eagle", head_layers=2), **QUIET)
    with pytest.raises(ValueError, match=r"--head-layers 0: a head has at least one decoder layer"):
        Trainer(_settings(heads, "eagle3", head_layers=0), **QUIET)
    from eagle_zoo.train.build import start_as_identity

    with pytest.raises(ValueError, match=r"--head-layers 2: growing a head needs decoder layers whose residual "
                                         r"branches end in self_attn.o_proj and mlp.down_proj; Sequential has no "
                                         r"self_attn.o_proj, mlp.down_proj"):
        start_as_identity(torch.nn.Sequential(torch.nn.Linear(2, 2)), "--head-layers 2")
