"""The function the prefill graphs capture (engine/graphs.py GraphedPrefill) runs on the
CPU too: a prompt padded at its end up to a bucket, attending to itself (kv_len = the
bucket), must give the unpadded prompt's hidden states, aux streams and cache rows at
the prompt's positions, whatever the padding holds. The graphs themselves: tests/
test_gpu_graphs.py (prompts of 20-44 tokens go through them)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM
from eagle_zoo.engine.graphs import MAX_GRAPH_TOKENS, PREFILL_BUCKETS, GraphedPrefill

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("T, bucket", [(20, 32), (50, 64)])
@torch.inference_mode()  # as in the engine's prefill
def test_a_padded_whole_prompt_gives_the_prompts_own_rows(T, bucket, tmp_path):
    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind)
    llm = LLM(str(target), device="cpu", dtype="float32", max_model_len=96, enforce_eager=True)
    runner = llm.engine.runner
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, cf.TINY["vocab_size"], (1, T), generator=g)
    slots = torch.tensor([0])
    aux_ids = (1,)
    hidden, aux = runner.run(ids, torch.arange(T).unsqueeze(0), slots, T, aux_ids)
    rows = [c[0, :T].clone() for pair in runner.kv_caches for c in pair]
    for c in (c for pair in runner.kv_caches for c in pair):
        c.normal_(generator=g)  # what an earlier request left in the row
    padding = torch.randint(0, cf.TINY["vocab_size"], (1, bucket - T), generator=g)
    padded_hidden, padded_aux = runner.forward_whole_prompt(torch.cat([ids, padding], dim=1),
                                                            torch.arange(bucket).unsqueeze(0), slots, aux_ids)
    torch.testing.assert_close(padded_hidden[:, :T], hidden)
    torch.testing.assert_close(padded_aux[0][:, :T], aux[0])
    for c, row in zip((c for pair in runner.kv_caches for c in pair), rows):
        torch.testing.assert_close(c[0, :T], row)


def test_prefill_graphs_take_one_sequences_whole_prompt_within_the_buckets():
    pool = SimpleNamespace(users=[])
    graphs = GraphedPrefill(forward=None, max_len=300, scratch_slot=4, pool=pool)
    assert pool.users == [graphs] and graphs.buckets == [b for b in PREFILL_BUCKETS if b <= 300]
    one = lambda T: torch.zeros(1, T, dtype=torch.long)  # noqa: E731
    assert graphs.eligible(one(MAX_GRAPH_TOKENS + 1), MAX_GRAPH_TOKENS + 1)
    assert graphs.eligible(one(256), 256)
    assert not graphs.eligible(one(MAX_GRAPH_TOKENS), MAX_GRAPH_TOKENS)  # decode-shaped: GraphedForward's
    assert not graphs.eligible(one(257), 257)  # no bucket of the cache row holds it: eager
    assert not graphs.eligible(one(40), 60)  # behind cached tokens: not a whole prompt
    assert not graphs.eligible(torch.zeros(2, 40, dtype=torch.long), 40)  # two sequences
    assert [graphs.bucket(T) for T in (17, 32, 33, 100, 193, 256)] == [32, 32, 48, 128, 256, 256]
    assert all(b / a <= 1.5 for a, b in zip(PREFILL_BUCKETS, PREFILL_BUCKETS[1:]))  # padding at most 1.5x
