"""SpecDecodingMetrics arithmetic against hand-computed examples."""
import math

import pytest
import torch

from eagle_zoo.engine.metrics import SpecDecodingMetrics
from eagle_zoo.metrics import Counter, Histogram, Vector


def test_hand_computed_example():
    m = SpecDecodingMetrics(num_speculative_tokens=3)
    m.observe([3, 3, 3], [3, 1, 0])               # step 1: three requests
    m.observe(torch.tensor([3, 0]), torch.tensor([2, 0]))  # step 2: 2nd request drafted nothing
    # drafts 4, draft tokens 12, accepted 3 + 1 + 0 + 2 = 6
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (4, 12, 6)
    # position 0 accepted in drafts with a >= 1 (3, 1, 2); pos 1 needs a >= 2 (3, 2); pos 2: (3)
    assert m.num_accepted_tokens_per_pos == [3, 2, 1]
    assert m.mean_acceptance_length == pytest.approx(1 + 6 / 4)   # 2.5
    assert m.acceptance_rate_per_pos == pytest.approx([0.75, 0.5, 0.25])
    assert m.acceptance_rate == pytest.approx(0.5)
    # per-position rates sum to mean acceptance length - 1
    assert sum(m.acceptance_rate_per_pos) == pytest.approx(m.mean_acceptance_length - 1)


def test_as_dict_and_get_metrics():
    m = SpecDecodingMetrics(num_speculative_tokens=2)
    m.observe([2, 2], [2, 1])
    m.observe_request(num_prompt_tokens=5, num_generation_tokens=7, finish_reason="length")
    m.observe_request(num_prompt_tokens=30, num_generation_tokens=1, finish_reason="stop")
    d = m.as_dict()
    assert d["eagle_zoo:spec_decode_num_drafts"] == 2
    assert d["eagle_zoo:spec_decode_num_draft_tokens"] == 4
    assert d["eagle_zoo:spec_decode_num_accepted_tokens"] == 3
    assert d["eagle_zoo:spec_decode_num_accepted_tokens_per_pos"] == [2, 1]
    assert (d["eagle_zoo:num_requests"], d["eagle_zoo:prompt_tokens"], d["eagle_zoo:generation_tokens"]) == (2, 35, 8)
    assert d["mean_acceptance_length"] == pytest.approx(2.5)
    metrics = m.get_metrics(labels={"model_name": "m"})
    assert Counter("vllm:spec_decode_num_drafts", {"model_name": "m"}, 2) in metrics
    assert Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {"model_name": "m"}, [2, 1]) in metrics
    assert Counter("vllm:request_success", {"model_name": "m", "finished_reason": "stop"}, 1) in metrics
    assert Counter("vllm:prompt_tokens", {"model_name": "m"}, 35) in metrics
    hist = next(x for x in metrics if x.name == "vllm:request_prompt_tokens")
    assert isinstance(hist, Histogram) and (hist.count, hist.sum) == (2, 35.0)
    # cumulative buckets: 5 <= "5", 30 <= "50"
    assert (hist.buckets["2"], hist.buckets["5"], hist.buckets["20"], hist.buckets["50"], hist.buckets["+Inf"]) == (0, 1, 1, 2, 2)
    assert [x.name for x in m.get_metrics(prefix="eagle_zoo:")][0] == "eagle_zoo:spec_decode_num_drafts"


def test_no_spec_metrics_without_drafting():
    names = {x.name for x in SpecDecodingMetrics().get_metrics()}
    assert "vllm:prompt_tokens" in names and not any("spec_decode" in n for n in names)


def test_empty_and_growing_and_reset():
    m = SpecDecodingMetrics()
    assert math.isnan(m.mean_acceptance_length) and m.acceptance_rate_per_pos == []
    m.observe([4], [4])  # positions grow to the longest draft seen
    assert m.num_accepted_tokens_per_pos == [1, 1, 1, 1]
    m.reset()
    assert m.num_drafts == 0 and m.num_accepted_tokens_per_pos == []


@pytest.mark.parametrize("drafted, accepted, words", [
    ([2, 2], [1], "2 draft counts but 1 accepted"),
    ([2], [3], "3 tokens accepted out of 2 drafted"),
    ([-1], [0], "must be >= 0"),
])
def test_bad_input(drafted, accepted, words):
    with pytest.raises(ValueError, match=words):
        SpecDecodingMetrics().observe(drafted, accepted)


def test_request_metrics_mean_acceptance_length():
    from eagle_zoo.engine.outputs import CompletionOutput, RequestMetrics

    rm = RequestMetrics(arrival_time=0.0, num_drafts=4, num_draft_tokens=12, num_accepted_tokens=6)
    assert rm.mean_acceptance_length == pytest.approx(2.5)
    assert math.isnan(RequestMetrics(arrival_time=0.0).mean_acceptance_length)
    assert not CompletionOutput(0, "", []).finished()
    assert CompletionOutput(0, "a", [5], finish_reason="length").finished()


def test_tree_positions_are_levels():
    """A tree step drafts n nodes but its accepted path is at most `num_positions` deep:
    per-position counts run over the levels, not the nodes."""
    m = SpecDecodingMetrics(num_speculative_tokens=3)
    m.observe([9, 9], [3, 1], num_positions=3)
    assert m.num_accepted_tokens_per_pos == [2, 1, 1]
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (2, 18, 4)
    assert m.mean_acceptance_length == 3.0


def test_periodic_log_line_covers_the_interval_since_the_last():
    from eagle_zoo.engine.metrics import SpecDecodingLogger

    now, lines = [0.0], []
    logger = SpecDecodingLogger(10.0, lines.append, clock=lambda: now[0])
    m = SpecDecodingMetrics(num_speculative_tokens=2)
    m.observe([2, 2], [2, 0])
    now[0] = 5.0
    assert not logger.maybe_log(m) and lines == []          # interval not over
    now[0] = 10.0
    assert logger.maybe_log(m)
    assert lines[0] == ("SpecDecoding metrics: Mean acceptance length: 2.00, Accepted throughput: 0.20 tokens/s, "
                        "Drafted throughput: 0.40 tokens/s, Accepted: 2 tokens, Drafted: 4 tokens, "
                        "Per-position acceptance rate: 0.500, 0.500, Avg Draft acceptance rate: 50.0%")
    m.observe([2], [1])                                      # the next line counts only the new step
    now[0] = 20.0
    assert logger.maybe_log(m)
    assert "Mean acceptance length: 2.00" in lines[1] and "Accepted: 1 tokens, Drafted: 2 tokens" in lines[1]
    assert "Per-position acceptance rate: 1.000, 0.000" in lines[1]
    now[0] = 30.0
    assert not logger.maybe_log(m) and len(lines) == 2       # no drafting since: no line
