"""eagle-zoo's trainer works on the plugin's family with nothing Qwen2-specific in it:
a fresh head for a Qwen2 target (built through FamilySpec.config_class and the head
classes), saved in every layout the trainer writes, reloads through eagle_zoo.load
with the same logits and the q/k/v biases in place."""
from __future__ import annotations

import pytest
import torch

import eagle_zoo
from eagle_zoo.engine.model_loader import load_model
from eagle_zoo.plugins import get_registry
from eagle_zoo.train.build import build_head, head_config, shared_modules
from eagle_zoo.train.save import FORMATS, save_head
from eagle_zoo_qwen2.modeling import Qwen2Eagle3Head, Qwen2EagleHead
from qwen2_fixtures import TINY, randomize, write_target

CASES = [(m, fmt) for m in ("eagle", "eagle3") for fmt in FORMATS[m]]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_target(tmp_path_factory.mktemp("qwen2") / "target", seed=3)
    return path, load_model(str(path), torch.float32, torch.device("cpu"))


def logits(head, method, ids, feats):
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    hidden = head.combine_hidden_states(feats) if method == "eagle3" else feats
    return head.compute_logits(head(ids, positions, hidden))


@pytest.mark.parametrize("method, fmt", CASES)
def test_fresh_head_saves_and_reloads(target, tmp_path, method, fmt):
    path, loaded_target = target
    family = get_registry().family_for_config(loaded_target.config)
    assert family.name == "qwen2"
    flat = head_config(path, method, draft_vocab_size=48)
    head = build_head(family, flat, method, loaded_target.model, seed=0,
                      draft_ids=torch.arange(40, 88) if method == "eagle3" else None)
    assert isinstance(head, Qwen2Eagle3Head if method == "eagle3" else Qwen2EagleHead)
    randomize(head.layers, seed=1)  # the init leaves biases at zero: make them count
    assert head.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0
    H = TINY["hidden_size"]
    ids = torch.randint(0, TINY["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(4))
    feats = torch.randn(2, 6, 3 * H if method == "eagle3" else H, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = logits(head, method, ids, feats)
    out = save_head(head, flat, fmt, tmp_path / fmt, mapping=family.weight_mapping,
                    skip=shared_modules(method), dtype=torch.float32, target_name="tiny-qwen2")
    reloaded = eagle_zoo.load(out, target=loaded_target.model, dtype=torch.float32)
    assert (reloaded.format, reloaded.family, reloaded.method) == (fmt, "qwen2", method)
    with torch.no_grad():
        torch.testing.assert_close(logits(reloaded.head, method, ids, feats), expected, rtol=0, atol=0)
