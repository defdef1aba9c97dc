"""RequestOutput.metrics (vLLM's per-request timing and speculation counters): filled by
the engine for every request, and its counters add up to the engine-wide ones."""
from __future__ import annotations

import pytest

from eagle_zoo import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                         "prompt_lookup_min": 1}])
def test_metrics_are_filled_and_add_up(spec):
    llm = LLM("HuggingFaceTB/SmolLM2-135M-Instruct", speculative_config=spec, max_model_len=512, device="cpu",
              dtype="float32")
    prompts = ["one two three one two three one two", "The capital of France is"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    for out in outs:
        m = out.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    drafts = sum(o.metrics.num_drafts for o in outs)
    engine = llm.engine.metrics
    assert drafts == engine.num_drafts
    assert sum(o.metrics.num_accepted_tokens for o in outs) == engine.num_accepted_tokens
    assert sum(o.metrics.num_draft_tokens for o in outs) == engine.num_draft_tokens
    if spec is None:
        assert drafts == 0
    else:
        assert drafts > 0
        for o in outs:
            assert o.metrics.num_accepted_tokens <= o.metrics.num_draft_tokens <= 3 * o.metrics.num_drafts


def test_n_completions_share_one_request_metrics():
    llm = LLM("HuggingFaceTB/SmolLM2-135M-Instruct", max_model_len=256, device="cpu", dtype="float32")
    out = llm.generate(["Hello"], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs) == 3
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
