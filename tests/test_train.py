"""`eagle-zoo train` on a tiny random Llama target (CPU, seconds).

References nobody here wrote: transformers' generate() for the regenerated answers,
the engine's own drafting path (ModelRunner + KV cache) for the training-time-test
attention, the checkpoint readers + eagle_zoo.load for the saved layouts, and the
d2t / t2d definition of docs/formats.md.
"""
from __future__ import annotations

import json
import os
import random

import pytest
import torch

from checkpoint_factory import write_peaked_target
from eagle_zoo.train.batching import collate
from eagle_zoo.train.build import build_head, head_config
from eagle_zoo.train.data import GenerateSettings, TokenData, encode_prompt, generate_data, read_prompts
from eagle_zoo.train.eagle3 import ttt_mask, ttt_steps_forward
from eagle_zoo.config.speculative import infer_method
from eagle_zoo.train.save import FORMATS, export_tensors, parse_size, save_head
from eagle_zoo.train.trainer import Trainer, TrainSettings
from eagle_zoo.train.vocab import coverage, select_draft_vocab, token_counts, vocab_maps

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer random Llama (saved by transformers), prompts as token ids, and the
    greedy training data regenerated from them."""
    root = tmp_path_factory.mktemp("train")
    write_peaked_target(root / "target", num_hidden_layers=4, seed=1)
    rng = random.Random(0)
    with open(root / "prompts.jsonl", "w") as f:
        for _ in range(12):
            f.write(json.dumps({"prompt_token_ids": [rng.randrange(3, 128) for _ in range(rng.randrange(3, 10))]}) + "\n")
    settings = GenerateSettings(max_new_tokens=24, batch_size=8, backend="static")
    data = generate_data(str(root / "target"), read_prompts(root / "prompts.jsonl"), settings, CPU, torch.float32,
                         progress=False)
    data.save(root / "data")
    return root


def _target(root):
    from eagle_zoo.engine.model_loader import load_model

    return load_model(str(root / "target"), torch.float32, CPU)


def _settings(root, method, **kw):
    base = dict(method=method, target=str(root / "target"), data=[str(root / "data")], steps=4, token_budget=4096,
                max_len=64, lr=3e-3, warmup_steps=1, seed=0, device="cpu", log_every=1000, progress=False,
                ttt_steps=3 if method == "eagle3" else None, draft_vocab_size=48, save_every=0)
    base.update(kw)
    return TrainSettings(**base)


# -- data ----------------------------------------------------------------------------------
def test_regenerated_answers_match_transformers_generate(tiny):
    from transformers import LlamaForCausalLM

    data = TokenData.load(tiny / "data")
    prompts = [r["prompt_token_ids"] for r in read_prompts(tiny / "prompts.jsonl")]
    ref_model = LlamaForCausalLM.from_pretrained(str(tiny / "target")).eval()
    by_prompt = {}
    for i in range(len(data)):
        ids, mask = data.sequence(i)
        n = int((mask == 0).sum())
        assert mask[:n].eq(0).all() and mask[n:].eq(1).all(), "loss mask: prompt 0s then answer 1s"
        by_prompt[tuple(ids[:n].tolist())] = ids[n:].tolist()
    assert len(by_prompt) == len(prompts)
    for p in prompts[:4]:
        out = ref_model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=2,
                                 pad_token_id=0, attention_mask=torch.ones(1, len(p), dtype=torch.long))
        answer = out[0, len(p):].tolist()
        if 2 in answer:
            answer = answer[: answer.index(2) + 1]
        assert by_prompt[tuple(p)] == answer


def test_engine_backend_gives_the_same_data(tiny):
    records = read_prompts(tiny / "prompts.jsonl", limit=5)
    settings = GenerateSettings(max_new_tokens=24, batch_size=4, backend="engine")
    engine = generate_data(str(tiny / "target"), records, settings, CPU, torch.float32, progress=False)
    static = TokenData.load(tiny / "data")
    ours = {tuple(static.sequence(i)[0].tolist()) for i in range(len(static))}
    assert {tuple(engine.sequence(i)[0].tolist()) for i in range(len(engine))} <= ours


def test_token_data_roundtrip_and_concat(tmp_path):
    a = TokenData.from_sequences([([5, 6, 7], [0, 1, 1]), ([8, 9], [0, 1])], {"vocab_size": 10})
    b = TokenData.from_sequences([([1, 2, 3, 4], [0, 0, 1, 1])], {"vocab_size": 10})
    a.save(tmp_path / "a")
    back = TokenData.load(tmp_path / "a")
    assert back.input_ids.dtype == torch.int32 and back.offsets.tolist() == [0, 3, 5]
    both = TokenData.concat([back, b])
    assert len(both) == 3 and both.sequence(2)[0].tolist() == [1, 2, 3, 4]
    assert both.sequence(1)[1].tolist() == [0, 1]
    batch = collate(both, [0, 2], max_len=3)
    assert batch.input_ids.tolist() == [[5, 6, 7], [1, 2, 3]] and batch.loss_mask[1].tolist() == [False, False, True]


def test_chat_template_prompts_match_the_tokenizer(smol_tokenizer):
    tok = smol_tokenizer
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    expected = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert encode_prompt({"prompt": "What is 2+2?"}, tok) == list(expected)


# -- draft vocabulary ---------------------------------------------------------------------------
def test_draft_vocab_is_the_most_frequent_tokens_ascending():
    counts = torch.tensor([0, 5, 1, 9, 5, 0, 7, 2])
    ids = select_draft_vocab(counts, 4)
    assert ids.tolist() == [1, 3, 4, 6]  # 9, 7, 5, 5 (tie 1 vs 4: both kept)
    assert select_draft_vocab(counts, 3).tolist() == [1, 3, 6]  # tie at 5 goes to the lower id
    assert abs(coverage(counts, ids) - 26 / 29) < 1e-9
    d2t, t2d = vocab_maps(ids, 8)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert t2d[torch.arange(4) + d2t].all() and int(t2d.sum()) == 4
    tokens = torch.tensor([3, 3, 1, 7])
    assert token_counts(tokens, torch.tensor([1, 1, 0, 1]), 8).tolist() == [0, 0, 0, 2, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="draft-vocab-size"):
        select_draft_vocab(counts, 9)


# -- training-time test: the same attention as the engine's drafting -------------------------------
def test_ttt_attention_matches_engine_drafting(tiny):
    from eagle_zoo.engine.runner import ModelRunner
    from eagle_zoo.plugins import get_registry

    t = _target(tiny)
    family = get_registry().family_for_config(t.config)
    cfg = head_config(t.path, "eagle3", draft_vocab_size=48)
    head = build_head(family, cfg, "eagle3", t.model, seed=0, draft_ids=torch.arange(40, 88))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    T, S = 12, 4
    ids = torch.randint(3, 128, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, aux = t.model(ids, torch.arange(T)[None], cfg["eagle_aux_hidden_state_layer_ids"])
        feats = head.combine_hidden_states(torch.cat(aux, -1))[:, : T - 1]
        ttt = [h for _, h in ttt_steps_forward(head, ids, feats, S)]
        # The engine: the head catches up on positions 0..c from target features, then
        # drafts step s at position c+s from its own previous output.
        runner = ModelRunner(head, 1, 64, torch.float32, CPU)
        slot, checked = torch.tensor([0]), 0
        for c in range(T - S):
            h = runner.run(ids[:, 1 : c + 2], torch.arange(c + 1)[None], slot, c + 1, feats[:, : c + 1])[:, -1:]
            torch.testing.assert_close(h[0, 0], ttt[0][0, c], rtol=1e-4, atol=1e-4)
            for s in range(1, S):
                h = runner.run(ids[:, c + s + 1 : c + s + 2], torch.tensor([[c + s]]), slot, c + s + 1, h)
                torch.testing.assert_close(h[0, 0], ttt[s][0, c], rtol=1e-4, atol=1e-4)
                checked += 1
        assert checked == (T - S) * (S - 1)
        # Control: plain causal attention over the later steps is *not* what the engine does.
        plain = head(ids[:, 2:T], torch.arange(1, T - 1)[None], ttt[0][:, : T - 2])
        assert not torch.allclose(plain[0, 3], ttt[1][0, 3], atol=1e-3)


def test_ttt_mask_pattern():
    m = ttt_mask(3, 2)
    assert m.shape == (3, 9)
    assert m[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert m[:, 3:6].tolist() == m[:, 6:9].tolist() == torch.eye(3, dtype=torch.bool).tolist()


# -- training ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle ttt", "eagle3 sharpened"])
def test_training_overfits_a_fixed_batch(tiny, method):
    # One batch per epoch (token budget > the data): every step sees the same batch.
    kw = {"eagle ttt": dict(ttt_steps=3), "eagle3 sharpened": dict(label_temperature=0.5)}.get(method, {})
    trainer = Trainer(_settings(tiny, method.split()[0], steps=30, token_budget=8192, max_len=64, log_every=1,
                                lr=1e-2, **kw), log=lambda *a: None)
    assert len(trainer.epoch_batches) == 1
    history = trainer.run().history
    losses = [h["loss"] for h in history]
    assert len(losses) == 30 and losses[-1] < 0.8 * losses[0], losses
    acc = "acc0" if method.startswith("eagle3") else "acc"
    assert history[-1][acc] > history[0][acc] + 0.1
    if method == "eagle ttt":  # the unrolled steps learn too
        assert history[-1]["acc2"] > history[0]["acc2"] + 0.1


def test_eagle1_training_time_test_step0_is_the_one_step_loss(tiny):
    """EAGLE-1 with ttt_steps > 1: step 0 runs through the drafting attention path
    (eagle3.ttt_steps_forward) and must give the one-step loss's terms (plain causal
    attention); steps 1.. add terms with weight decay**s."""
    from eagle_zoo.train.batching import Batch
    from eagle_zoo.train.eagle1 import eagle1_loss

    trainer = Trainer(_settings(tiny, "eagle", steps=1), log=lambda *a: None)
    data = TokenData.load(tiny / "data")
    ids, mask = data.sequence(0)
    batch = Batch(ids.unsqueeze(0), mask.unsqueeze(0).bool(), torch.tensor([ids.shape[0]]))
    with torch.no_grad():
        one, m1, n1 = eagle1_loss(trainer.head, trainer.target.model, batch, noise=0.0)
        three, m3, n3 = eagle1_loss(trainer.head, trainer.target.model, batch, noise=0.0, ttt_steps=3, decay=0.5)
    assert n1 == n3 > 0
    for key in ("v_loss", "p_loss", "acc"):
        torch.testing.assert_close(m3[key], m1[key], rtol=1e-5, atol=1e-6)
    later = sum(0.5 ** s * (m3[f"v_loss{s}"] + 0.1 * m3[f"p_loss{s}"]) for s in (1, 2))
    torch.testing.assert_close(three, one + later, rtol=1e-5, atol=1e-6)
    assert float(later) > 0


def test_loss_rows_puts_the_valid_entries_first_in_order():
    from eagle_zoo.train.eagle3 import loss_rows, shifted_rows

    valid = torch.tensor([[False, True, False, True], [True, False, False, False]])
    rows, weights = loss_rows(valid, 5)
    assert rows[:3].tolist() == [1, 3, 4] and weights.tolist() == [1, 1, 1, 0, 0]
    assert len(set(rows.tolist())) == 5  # padding rows are other, distinct positions
    rows, weights = loss_rows(torch.zeros(2, 3, dtype=torch.bool), 0)  # an empty step: one row, weight 0
    assert rows.numel() == 1 and weights.tolist() == [0.0]
    # chain (b, i) of [B, n=3] reads x[b, i + shift] of [B, T=4]; clamped past the end
    assert shifted_rows(torch.tensor([0, 2, 4]), 3, 4, 1).tolist() == [1, 3, 6]
    assert shifted_rows(torch.tensor([2, 5]), 3, 4, 2).tolist() == [3, 7]


def _padded_batch(root, rows=4):
    """Sequences of different lengths padded together (padding rows in every gather)."""
    data = TokenData.load(root / "data")
    return collate(data, list(range(rows)), 64)


def test_gathered_losses_equal_boolean_indexing(tiny):
    """The losses gather their positions by index (no host sync); written out here with
    boolean indexing, as the loss is defined, they must give the same values."""
    import torch.nn.functional as F

    from eagle_zoo.train.eagle1 import P_WEIGHT, eagle1_loss
    from eagle_zoo.train.eagle3 import DECAY, chain_shift, eagle3_loss

    batch = _padded_batch(tiny)
    assert len(set(batch.lengths.tolist())) > 1
    B, T = batch.input_ids.shape
    n, pos = T - 1, torch.arange(T).expand(B, T)
    ids, mask = batch.input_ids, batch.loss_mask

    trainer = Trainer(_settings(tiny, "eagle3", steps=1), log=lambda *a: None)
    head, target, aux_ids = trainer.head, trainer.target.model, trainer.flat_config["eagle_aux_hidden_state_layer_ids"]
    with torch.no_grad():
        hidden, aux = target(ids, pos, aux_ids)
        logits = target.compute_logits(hidden)
        top_ok = head.t2d[logits.argmax(-1)]
        draft_logits = logits[..., torch.arange(head.draft_vocab_size) + head.d2t]
        feats = head.combine_hidden_states(torch.cat(aux, -1))[:, :n]
        for temperature in (1.0, 0.5):  # soft labels softmax(logits / t): the published 1 and a sharpened one
            loss, metrics, n0 = eagle3_loss(head, target, batch, aux_layer_ids=aux_ids, ttt_steps=3,
                                            label_temperature=temperature)
            expected = 0.0
            for s, h in ttt_steps_forward(head, ids, feats, 3):
                valid = chain_shift(mask, s + 2, n) & chain_shift(top_ok, s + 1, n)
                log_q = torch.log_softmax(head.compute_draft_logits(h[valid]).float(), -1)
                p = torch.softmax(chain_shift(draft_logits, s + 1, n)[valid].float() / temperature, -1)
                ce = -(p * log_q).sum(-1).mean()
                torch.testing.assert_close(metrics[f"ce{s}"], ce)
                torch.testing.assert_close(metrics[f"acc{s}"], (log_q.argmax(-1) == p.argmax(-1)).float().mean())
                if s == 0:
                    assert int(n0) == int(valid.sum()) > 0
                expected = expected + DECAY ** s * ce
            torch.testing.assert_close(loss, expected)

    trainer = Trainer(_settings(tiny, "eagle", steps=1), log=lambda *a: None)
    head, target = trainer.head, trainer.target.model
    with torch.no_grad():
        loss, metrics, n0 = eagle1_loss(head, target, batch, noise=0.0, ttt_steps=3)
        f, _ = target(ids, pos)
        expected = 0.0
        for s, h in ttt_steps_forward(head, ids, f[:, :-1].float(), 3):
            valid = chain_shift(mask, s + 2, n)
            f_next = chain_shift(f, s + 1, n)[valid]
            p = torch.softmax(target.compute_logits(f_next).float(), -1)
            log_q = torch.log_softmax(head.compute_logits(h[valid]).float(), -1)
            suffix = "" if s == 0 else str(s)
            v_loss = F.smooth_l1_loss(h[valid].float(), f_next.float())
            torch.testing.assert_close(metrics[f"v_loss{suffix}"], v_loss)
            torch.testing.assert_close(metrics[f"p_loss{suffix}"], -(p * log_q).sum(-1).mean())
            expected = expected + DECAY ** s * (v_loss + P_WEIGHT * -(p * log_q).sum(-1).mean())
        torch.testing.assert_close(loss, expected)
        assert int(n0) == int(chain_shift(mask, 2, n).sum())


@pytest.mark.parametrize("spill", [False, True], ids=["on-device", "spilled"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_cached_features_train_like_the_forward_every_step(tiny, method, spill, monkeypatch):
    """--cache-features: the target's features computed once give the run the target's
    forward gives every step (same losses, same weights, up to float rounding: the cache
    was filled in other batches), and the cache holds the target's own states; also
    with a third of the rows left on the device and the rest in host memory."""
    from eagle_zoo.train import feature_cache

    if spill:
        monkeypatch.setattr(feature_cache, "rows_on_device", lambda total, row_bytes, device: total // 3)
    kw = dict(steps=5, token_budget=256, max_len=48, ttt_steps=2, log_every=1)
    plain = Trainer(_settings(tiny, method, **kw), log=lambda *a: None)
    cached = Trainer(_settings(tiny, method, cache_features=True, **kw), log=lambda *a: None)
    assert len(plain.epoch_batches) > 1 and cached.features is not None
    assert (cached.features.hidden.host_rows is not None) == spill
    batch = cached.next_batch()
    B, T = batch.input_ids.shape
    aux_ids = cached.flat_config.get("eagle_aux_hidden_state_layer_ids") or []
    with torch.no_grad():
        hidden, aux = cached.target.model(batch.input_ids, torch.arange(T).expand(B, T), aux_ids)
    real = torch.arange(T) < batch.lengths.unsqueeze(1)
    torch.testing.assert_close(batch.hidden[real], hidden[real], rtol=1e-4, atol=1e-4)
    if method == "eagle3":
        torch.testing.assert_close(batch.aux[real], torch.cat(aux, -1)[real], rtol=1e-4, atol=1e-4)
    else:
        assert batch.aux is None
    a, b = plain.run().history, cached.run().history
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4), (x, y)
    for name, p in plain.params.items():
        torch.testing.assert_close(cached.params[name], p, rtol=1e-4, atol=1e-5)


def test_cached_features_refuse_what_does_not_fit(tiny, monkeypatch):
    from eagle_zoo.train import feature_cache

    data = TokenData.load(tiny / "data")
    target = _target(tiny)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10**9))  # no row fits the GPU
    monkeypatch.setattr(feature_cache, "host_free_bytes", lambda: 1000)  # nor the host
    with pytest.raises(ValueError, match="--cache-features needs .* GiB .* host's .* drop --cache-features"):
        feature_cache.FeatureCache(target.model, data, torch.arange(len(data)), 64, [], torch.device("cuda"),
                                   torch.bfloat16, 4096, log=lambda *a: None)


def test_host_memory_for_spilled_features_is_capped_by_the_memory_cgroup(tmp_path, monkeypatch):
    """A container sees the machine's free memory in sysconf but is killed at its cgroup's
    limit: the spill budget takes the smaller."""
    from eagle_zoo.train import feature_cache

    (tmp_path / "max").write_text("3000000\n")
    (tmp_path / "current").write_text("1000000\n")
    (tmp_path / "unlimited").write_text("max\n")
    missing = (str(tmp_path / "none"), str(tmp_path / "none"))
    whole_host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(feature_cache, "CGROUP_MEMORY_FILES", (missing, (str(tmp_path / "max"), str(tmp_path / "current"))))
    assert feature_cache.host_free_bytes() == min(whole_host, 2_000_000)
    monkeypatch.setattr(feature_cache, "CGROUP_MEMORY_FILES", ((str(tmp_path / "unlimited"), str(tmp_path / "current")),))
    assert abs(feature_cache.host_free_bytes() - whole_host) < 2**30  # no limit: the host's (it moves a little)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cache", ["forward", "cached", "spilled"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_training_step_reads_nothing_back_from_the_gpu(tiny, method, cache, monkeypatch):
    """A training step must not wait for the host: the loss,
    its backward, the optimizer step and the --ema update run without a device->host
    sync, with the target's forward or with --cache-features (all rows on the GPU, or
    half of them spilled to host memory). The batch itself (next_batch: host->device copies) is made
    before the check, as a step's input."""
    from eagle_zoo.train import feature_cache

    if cache == "spilled":
        monkeypatch.setattr(feature_cache, "rows_on_device", lambda total, row_bytes, device: total // 2)
    trainer = Trainer(_settings(tiny, method, steps=2, device="cuda", ttt_steps=3, cache_features=cache != "forward",
                                ema=0.999), log=lambda *a: None)  # the --ema update inside the step too
    batch = trainer.next_batch()
    assert (batch.hidden is not None) == (cache != "forward")
    trainer.train_step(batch)  # first use: allocations, lazy initialisation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        metrics = trainer.train_step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert float(metrics["tokens"]) > 0 and torch.isfinite(metrics["loss"])


def interrupt_after(trainer, steps: int) -> None:
    """Make the trainer's run stop with a KeyboardInterrupt once it has made `steps` steps."""
    calls = {"n": 0}
    real_step = trainer.train_step

    def step_or_interrupt(batch):
        if calls["n"] == steps:
            raise KeyboardInterrupt("simulated interruption")
        calls["n"] += 1
        return real_step(batch)

    trainer.train_step = step_or_interrupt


def test_resume_reproduces_the_uninterrupted_run(tiny, tmp_path):
    quiet = dict(log=lambda *a: None)
    straight = Trainer(_settings(tiny, "eagle", steps=6, token_budget=256, max_len=48), **quiet)
    straight.run()
    assert len(straight.epoch_batches) > 1 and straight.epoch >= 1  # the plan spans epochs

    state = str(tmp_path / "state")
    first = Trainer(_settings(tiny, "eagle", steps=6, token_budget=256, max_len=48, state_dir=state), **quiet)
    interrupt_after(first, 3)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    resumed = Trainer(_settings(tiny, "eagle", steps=6, token_budget=256, max_len=48, state_dir=state, resume=True),
                      **quiet)
    assert resumed.step == 3
    resumed.run()
    for name, p in straight.params.items():
        assert torch.equal(p, resumed.params[name]), name


def test_resume_refuses_another_runs_state(tiny, tmp_path):
    state = str(tmp_path / "state")
    Trainer(_settings(tiny, "eagle", steps=1, state_dir=state), log=lambda *a: None).run()
    with pytest.raises(ValueError, match="another run"):
        Trainer(_settings(tiny, "eagle", steps=1, state_dir=state, resume=True, seed=5), log=lambda *a: None)
    # an A/B of soft-label temperatures on one data set cannot continue the other arm's state
    sharp = str(tmp_path / "sharp")
    Trainer(_settings(tiny, "eagle3", steps=1, state_dir=sharp, label_temperature=0.5), log=lambda *a: None).run()
    with pytest.raises(ValueError, match="another run"):
        Trainer(_settings(tiny, "eagle3", steps=1, state_dir=sharp, resume=True), log=lambda *a: None)


# -- saving in the published layouts --------------------------------------------------------------
def _logits(head, method, ids, feats):
    pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    x = head.combine_hidden_states(feats) if method == "eagle3" else feats
    return head.compute_logits(head(ids, pos, x))


# layers 2: `--head-layers 2`, an EAGLE-3 head deeper than the published ones; its layers
# past the first are the family's plain decoder layers, stored as layers.1.* in both layouts.
@pytest.mark.parametrize("method,layers", [("eagle", 1), ("eagle3", 1), ("eagle3", 2)])
def test_saved_heads_reload_with_the_same_logits(tiny, tmp_path, method, layers):
    from eagle_zoo import load
    from eagle_zoo.checkpoints.formats import detect_format, validate_vocab_map
    from eagle_zoo.checkpoints.tensors import load_state_dict

    trainer = Trainer(_settings(tiny, method, steps=3, head_layers=layers), log=lambda *a: None)
    result = trainer.run()
    head, target = result.head, trainer.target.model
    skip = ("embed_tokens", "lm_head") if method == "eagle" else ("embed_tokens",)
    H = head.config.hidden_size
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    feats = torch.randn(2, 7, 3 * H if method == "eagle3" else H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = _logits(head, method, ids, feats)
    limit = parse_size("16KB")
    for fmt in FORMATS[method]:
        out = tmp_path / fmt
        save_head(head, result.flat_config, fmt, out, mapping=trainer.mapping, skip=skip, dtype=torch.float32,
                  max_shard_size=limit, target_name="tiny")
        assert detect_format(out).name == fmt
        weights = sorted(p for p in out.iterdir() if p.suffix == ".safetensors")
        assert len(weights) > 1 and (out / "model.safetensors.index.json").is_file()
        assert all(p.stat().st_size <= limit for p in weights)
        names = set(load_state_dict(out))
        assert not any(n.startswith("embed_tokens") or n.startswith("lm_head") for n in names) or method == "eagle3"
        if method == "eagle3":
            prefix = "midlayer." if fmt.startswith("yuhuili") else "layers.0."
            assert {f"{prefix}hidden_norm.weight", "fc.weight", "lm_head.weight", "d2t", "t2d"} <= names
            state = load_state_dict(out)
            validate_vocab_map(state, {"vocab_size": 128, "draft_vocab_size": 48}, out)
            d2t, t2d = state["d2t"], state["t2d"]
            assert t2d[torch.arange(48) + d2t].all() and int(t2d.sum()) == 48
            assert bool((torch.arange(48) + d2t).diff().gt(0).all())  # ascending draft vocab
        else:
            assert "layers.0.self_attn.q_proj.weight" in names and "layers.0.input_layernorm.weight" not in names
        deeper = {f"layers.1.{n}.weight" for n in ("input_layernorm", "self_attn.q_proj", "mlp.down_proj")}
        assert (deeper <= names) == (layers == 2) and not any(n.startswith("layers.2.") for n in names)
        config = json.loads((out / "config.json").read_text())
        assert config.get("transformer_layer_config", config)["num_hidden_layers"] == layers  # speculators nest it
        loaded = load(str(out), target=target, dtype=torch.float32)
        assert loaded.format == fmt and loaded.method == method and len(loaded.head.layers) == layers
        assert infer_method(str(out)).method == method  # "yuhuili-eagle" has no EAGLE marker in its name
        with torch.no_grad():
            torch.testing.assert_close(_logits(loaded.head, method, ids, feats), expected, rtol=0, atol=0)

    # bf16 files: the reloaded head equals the trained one with weights rounded to bf16.
    out = tmp_path / "bf16"
    save_head(head, result.flat_config, FORMATS[method][0], out, mapping=trainer.mapping, skip=skip)
    # the head states its method: a directory named "bf16" is inferred from its config.json
    inferred = infer_method(str(out))
    assert (inferred.method, inferred.reason) == (method, f"config.json has eagle_zoo_method={method!r} "
                                                           f"(the method the head states)")
    tensors = load_state_dict(out)
    assert all(t.dtype == torch.bfloat16 for n, t in tensors.items() if n not in ("d2t", "t2d"))
    with torch.no_grad():
        for p in trainer.params.values():
            p.copy_(p.to(torch.bfloat16).float())
        rounded = _logits(head, method, ids, feats)
        reloaded = _logits(load(str(out), target=target, dtype=torch.float32).head, method, ids, feats)
    torch.testing.assert_close(reloaded, rounded, rtol=0, atol=0)


def test_shard_limit_is_checked_before_training(tiny):
    from eagle_zoo.train.save import check_shard_limit

    trainer = Trainer(_settings(tiny, "eagle3", steps=1), log=lambda *a: None)
    tensors = export_tensors(trainer.head, trainer.mapping, ("embed_tokens",), torch.bfloat16)
    with pytest.raises(ValueError, match="draft-vocab-size"):
        check_shard_limit({"lm_head.weight": tensors["lm_head.weight"]}, 100)


def test_a_batch_out_of_gpu_memory_is_generated_in_halves(tiny, monkeypatch, capsys):
    """train data --backend static: a batch whose generation runs out of CUDA memory is
    split in two (recursively) and the answers come back in prompt order, the same as
    the whole batch gives (greedy)."""
    from eagle_zoo.train import generate

    real, sizes = generate.generate_batch, []

    def small_gpu(model, prompts, **kw):
        sizes.append(len(prompts))
        if len(prompts) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return real(model, prompts, **kw)

    monkeypatch.setattr(generate, "generate_batch", small_gpu)
    settings = GenerateSettings(max_new_tokens=24, batch_size=8, backend="static")
    data = generate_data(str(tiny / "target"), read_prompts(tiny / "prompts.jsonl"), settings, CPU, torch.float32,
                         progress=False)
    assert sizes[:5] == [8, 4, 2, 2, 4] and max(sizes) == 8
    assert "CUDA out of memory generating 8 rows: 4 and 4 in turn" in capsys.readouterr().out
    whole = TokenData.load(tiny / "data")  # the fixture's: batches of 8 in one go
    assert [data.sequence(i)[0].tolist() for i in range(len(data))] == \
        [whole.sequence(i)[0].tolist() for i in range(len(whole))]


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_held_out_prompts_are_measured_and_never_trained_on(tiny, method, tmp_path):
    """--val-share: the held-out sequences are out of every training batch (and of the
    feature cache), measured every --val-every steps and at the end without touching
    the weights, and the measurement is the losses' own on those sequences."""
    from eagle_zoo.train.validation import prompt_key

    state = str(tmp_path / "state")
    trainer = Trainer(_settings(tiny, method, steps=5, token_budget=256, max_len=48, val_share=0.3, val_every=2,
                                cache_features=True, state_dir=state), log=lambda *a: None)
    held = trainer.val_index
    assert held.numel() and trainer.index.numel()
    prompts = lambda idx: {prompt_key(*trainer.data.sequence(int(i))) for i in idx}  # noqa: E731
    assert prompts(held).isdisjoint(prompts(trainer.index))
    assert int(trainer.features.hidden.device_rows.shape[0]) == int(trainer.lengths.sum())  # the train rows only
    planned = {int(trainer.index[p]) for batch in trainer.epoch_batches for p in batch}
    assert planned.isdisjoint(held.tolist())

    before = {k: v.clone() for k, v in trainer.params.items()}
    first = trainer.evaluate()
    assert trainer.evaluate() == first  # deterministic: no input noise
    for k, v in trainer.params.items():
        assert torch.equal(v, before[k])  # the weights are not touched
    batches = [collate(trainer.data, held[b].tolist(), 48) for b in trainer.val_batches]
    n = [b.num_loss_tokens() for b in batches]
    with torch.no_grad():
        losses = [float(trainer._loss(b, noise=0.0)[0]) for b in batches]
    assert first["loss"] == pytest.approx(sum(x * w for x, w in zip(losses, n)) / sum(n), rel=1e-6)

    result = trainer.run()
    assert [r["step"] for r in trainer.val_history] == [2, 4, 5]
    assert result.info["held_out_sequences"] == held.numel() and result.info["held_out"][-1]["step"] == 5
    assert "loss" in trainer.val_history[-1] and any(k.startswith("acc") for k in trainer.val_history[-1])
    resumed = Trainer(_settings(tiny, method, steps=5, token_budget=256, max_len=48, val_share=0.3, val_every=2,
                                state_dir=state, resume=True), log=lambda *a: None)
    assert resumed.val_history == trainer.val_history  # kept in the state


def test_cli_trains_and_saves_both_eagle3_layouts(tiny, tmp_path):
    from eagle_zoo import load
    from eagle_zoo.cli import main

    out = tmp_path / "head"
    rc = main(["train", "eagle3", "--target", str(tiny / "target"), "--data", str(tiny / "data"), "--out", str(out),
               "--format", "yuhuili-eagle3,speculators-eagle3", "--steps", "2", "--ttt-steps", "2",
               "--draft-vocab-size", "32", "--max-len", "48", "--token-budget", "512", "--device", "cpu",
               "--val-share", "0.25", "--val-every", "1", "--label-temperature", "0.5", "--no-progress"])
    assert rc == 0
    assert (tmp_path / "head.state" / "state.pt").is_file()
    record = json.loads((out / "yuhuili-eagle3" / "eagle_zoo_training.json").read_text())
    assert record["settings"]["val_share"] == 0.25 and [r["step"] for r in record["held_out"]] == [1, 2]
    assert record["settings"]["label_temperature"] == 0.5
    spec = json.loads((out / "speculators-eagle3" / "config.json").read_text())
    assert spec["speculators_model_type"] == "eagle3" and spec["norm_before_residual"] is False
    assert spec["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    yuhuili = json.loads((out / "yuhuili-eagle3" / "config.json").read_text())
    assert yuhuili["architectures"] == ["LlamaForCausalLMEagle3"] and yuhuili["draft_vocab_size"] == 32
    assert yuhuili["num_hidden_layers"] == 1 and len(yuhuili["eagle_aux_hidden_state_layer_ids"]) == 3
    for fmt in ("yuhuili-eagle3", "speculators-eagle3"):
        assert load(str(out / fmt), target=_target(tiny).model).format == fmt


def test_label_temperature_must_be_positive(tiny):
    with pytest.raises(ValueError, match=r"--label-temperature 0\.0: give a temperature > 0"):
        _settings(tiny, "eagle3", label_temperature=0.0)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_trained_head_is_accepted_by_the_engine(tiny, tmp_path, method):
    """End to end: train on the regenerated data, save, serve through LLM: the engine
    accepts far more of the trained head's drafts than of the untrained head's."""
    from eagle_zoo import LLM, SamplingParams

    trainer = Trainer(_settings(tiny, method, steps=60, token_budget=8192, max_len=64, lr=1e-2), log=lambda *a: None)
    skip = ("embed_tokens", "lm_head") if method == "eagle" else ("embed_tokens",)
    fmt = FORMATS[method][0]
    save = dict(mapping=trainer.mapping, skip=skip, dtype=torch.float32)
    save_head(trainer.head, trainer.flat_config, fmt, tmp_path / "untrained", **save)
    trainer.run()
    save_head(trainer.head, trainer.flat_config, fmt, tmp_path / "trained", **save)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in read_prompts(tiny / "prompts.jsonl", limit=6)]

    def mean_acceptance_length(head_dir):
        llm = LLM(str(tiny / "target"), {"method": method, "model": str(head_dir), "num_speculative_tokens": 3},
                  device="cpu", dtype="float32")
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
        m = llm.engine.metrics
        return 1 + m.num_accepted_tokens / m.num_drafts

    trained, untrained = mean_acceptance_length(tmp_path / "trained"), mean_acceptance_length(tmp_path / "untrained")
    assert trained > untrained + 0.5, (trained, untrained)


def test_out_of_memory_splits_the_batch_with_the_same_update(tiny):
    quiet = dict(log=lambda *a: None)
    settings = dict(steps=1, noise=0.0, token_budget=8192, max_len=64)
    whole = Trainer(_settings(tiny, "eagle", **settings), **quiet)
    whole.run()
    split = Trainer(_settings(tiny, "eagle", **settings), **quiet)
    real_loss = split._loss

    def small_batches_only(part):
        if part.input_ids.shape[0] > 6:
            raise torch.OutOfMemoryError("simulated: CUDA out of memory")
        return real_loss(part)

    split._loss = small_batches_only
    split.run()
    assert split.micro == 2
    # AdamW divides by sqrt(v): where a gradient is near zero, summation-order noise of the
    # halves moves the update by ~1e-6 (seen on one CPU); a wrong accumulation moves it ~lr = 3e-3
    for name, p in whole.params.items():
        torch.testing.assert_close(split.params[name], p, rtol=1e-5, atol=1e-5)


def test_cli_refuses_an_occupied_out_before_making_data_or_training(tiny, tmp_path, capsys):
    # --out holds something that is not a head: refused at once (not after the data and the
    # training, which saving would then throw away), in one line naming --out.
    from eagle_zoo.cli import main

    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc = main(["train", "eagle", "--target", str(tiny / "target"), "--prompts", str(tiny / "prompts.jsonl"),
               "--max-prompts", "4", "--out", str(out), "--steps", "2", "--device", "cpu", "--no-progress"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (f"eagle-zoo train: error: {out} exists, is not empty and holds no "
                                               "head (no config.json): choose another --out")
    assert not (tmp_path / "notes.data").exists() and not (tmp_path / "notes.state").exists()
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_one_command_makes_the_data_then_trains(tiny, tmp_path):
    from eagle_zoo import load
    from eagle_zoo.cli import main

    out = tmp_path / "head"
    rc = main(["train", "eagle", "--target", str(tiny / "target"), "--prompts", str(tiny / "prompts.jsonl"),
               "--max-prompts", "4", "--max-new-tokens", "16", "--out", str(out), "--steps", "2", "--max-len", "48", "--token-budget", "512",
               "--device", "cpu", "--no-progress"])
    assert rc == 0
    assert len(TokenData.load(tmp_path / "head.data")) == 4
    assert load(str(out), target=_target(tiny).model).format == "yuhuili-eagle"


def test_saving_data_that_fails_leaves_the_earlier_data_as_it_was(tmp_path, monkeypatch):
    import eagle_zoo.train.data as data_module

    first = TokenData(torch.arange(6), torch.ones(6, dtype=torch.bool), torch.tensor([0, 3, 6]), {"run": 1})
    first.save(tmp_path / "d")
    before = {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}

    def full_disk(tensors, path):
        open(path, "wb").write(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(data_module, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        second = TokenData(torch.arange(4), torch.ones(4, dtype=torch.bool), torch.tensor([0, 4]), {"run": 2})
        second.save(tmp_path / "d")
    assert {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()} == before
