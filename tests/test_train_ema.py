"""`eagle-zoo train ... --ema DECAY`: the moving average of the weights is what is saved
(CPU, the tiny random Llama target of test_train.py). The reference is the recurrence
written out here over the weights recorded after every step."""
from __future__ import annotations

import json

import pytest
import torch

from eagle_zoo.checkpoints.tensors import load_state_dict
from eagle_zoo.cli import main
from eagle_zoo.train.trainer import Trainer
from test_train import _settings, interrupt_after, tiny  # noqa: F401  (tiny: the module-scoped target + data fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = dict(log=lambda *a: None)


def _record_every_step(trainer):
    """The trainable weights before training and after each step."""
    seen = [{n: p.detach().clone() for n, p in trainer.params.items()}]
    real_step = trainer.train_step

    def step_and_record(batch):
        metrics = real_step(batch)
        seen.append({n: p.detach().clone() for n, p in trainer.params.items()})
        return metrics

    trainer.train_step = step_and_record
    return seen


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_the_saved_head_is_the_moving_average_from_the_start(tiny, method):
    decay = 0.7
    trainer = Trainer(_settings(tiny, method, steps=4, token_budget=256, max_len=48, val_share=0.3, val_every=2,
                                ema=decay), **QUIET)
    seen = _record_every_step(trainer)
    result = trainer.run()
    assert len(seen) == 5
    expected = dict(seen[0])
    for weights in seen[1:]:
        expected = {n: decay * expected[n] + (1 - decay) * weights[n] for n in expected}
    for name, p in result.head.named_parameters():
        if name in expected:
            torch.testing.assert_close(p.detach(), expected[name], rtol=1e-5, atol=1e-6, msg=name)
    moved = [n for n in expected if not torch.allclose(expected[n], seen[-1][n])]
    assert moved  # the average is not the last step's weights: the test tells them apart
    # held out: every 2 steps, then the last step's weights and the average at the end
    assert [(r["step"], r.get("weights")) for r in trainer.val_history] == [(2, None), (4, None), (4, "ema 0.7")]
    assert result.info["settings"]["ema"] == decay


def test_a_resumed_run_averages_like_the_uninterrupted_one(tiny, tmp_path):
    settings = dict(steps=6, token_budget=256, max_len=48, ema=0.8)
    straight = Trainer(_settings(tiny, "eagle3", **settings), **QUIET)
    straight.run()

    state = tmp_path / "state"
    first = Trainer(_settings(tiny, "eagle3", state_dir=str(state), **settings), **QUIET)
    seen = _record_every_step(first)
    interrupt_after(first, 3)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    saved = torch.load(state / "state.pt", map_location="cpu", weights_only=True)
    for name, weights in seen[3].items():  # the state holds the last step's weights, the average apart
        assert torch.equal(saved["head"][name], weights), name
    assert any(not torch.equal(saved["ema"][n], seen[3][n]) for n in seen[3])

    resumed = Trainer(_settings(tiny, "eagle3", state_dir=str(state), resume=True, **settings), **QUIET)
    assert resumed.step == 3
    resumed.run()
    for name, p in straight.params.items():
        assert torch.equal(p, resumed.params[name]), name


def test_a_state_saved_with_ema_is_not_resumed_without(tiny, tmp_path):
    state = str(tmp_path / "state")
    Trainer(_settings(tiny, "eagle", steps=1, state_dir=state, ema=0.9), **QUIET).run()
    with pytest.raises(ValueError, match="another run"):
        Trainer(_settings(tiny, "eagle", steps=1, state_dir=state, resume=True), **QUIET)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_ema_must_be_a_decay_between_0_and_1(tiny, decay):
    with pytest.raises(ValueError, match=rf"--ema {decay}: give a decay between 0 and 1"):
        _settings(tiny, "eagle3", ema=decay)


def test_cli_saves_the_average_and_records_it(tiny, tmp_path, monkeypatch):
    from eagle_zoo.train import cli as train_cli

    runs, saved = [], []  # each CLI run's weights after every step; the heads it saved
    real_init, real_save = Trainer.__init__, train_cli.save_head

    def init_and_record(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        runs.append(_record_every_step(self))

    def save_and_keep(head, *args, **kwargs):
        saved.append(head)
        return real_save(head, *args, **kwargs)

    monkeypatch.setattr(Trainer, "__init__", init_and_record)
    monkeypatch.setattr(train_cli, "save_head", save_and_keep)

    def train(out, *extra):
        assert main(["train", "eagle3", "--target", str(tiny / "target"), "--data", str(tiny / "data"),
                     "--out", str(out), "--steps", "3", "--ttt-steps", "2", "--draft-vocab-size", "32",
                     "--max-len", "48", "--token-budget", "512", "--lr", "1e-2", "--warmup-steps", "1",
                     "--val-share", "0.25", "--val-every", "10", "--save-dtype", "float32", "--device", "cpu",
                     "--no-progress", *extra]) == 0
        return load_state_dict(out)

    last = train(tmp_path / "last")  # the same run without --ema: the last step's weights
    averaged = train(tmp_path / "ema", "--ema", "0.5")
    assert sorted(last) == sorted(averaged)
    assert any(not torch.equal(last[n], averaged[n]) for n in last)
    seen = runs[-1]
    assert len(seen) == 4  # before training and after each of the 3 steps
    expected = dict(seen[0])
    for weights in seen[1:]:
        expected = {n: 0.5 * expected[n] + 0.5 * weights[n] for n in expected}
    head = dict(saved[-1].named_parameters())
    for name, weights in expected.items():
        torch.testing.assert_close(head[name].detach(), weights, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.allclose(expected[n], seen[-1][n]) for n in expected)  # the average, not the last step
    record = json.loads((tmp_path / "ema" / "eagle_zoo_training.json").read_text())
    assert record["settings"]["ema"] == 0.5
    assert [r.get("weights") for r in record["held_out"]] == [None, "ema 0.5"]
