"""Hostile and broken requests against a real uvicorn server: each one gets a 400 / 413
naming the field or limit, nothing out of range reaches the engine, and no request
changes what another one receives.

Most cases run over test_serve's scripted engine (the real Scheduler and Sequence, a
fake forward pass) wrapped to record every request the engine is given; failure
isolation inside a step runs over a tiny random target with the real EngineCore.
"""
from __future__ import annotations

import concurrent.futures as cf
import gc
import json
import time
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from test_serve import (ScriptedEngine, ServerThread, assert_openai_error, metric,  # noqa: E402
                        metric_values, tokenizer_dir)  # noqa: F401  (a fixture)

from eagle_zoo.serve.app import create_app  # noqa: E402
from eagle_zoo.serve.limits import ServerLimits  # noqa: E402


class RecordingEngine(ScriptedEngine):
    """The scripted engine, recording (request id, prompt ids, params) of every request
    it is given, in order."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.added = []

    def add_request(self, prompt_token_ids, params, prompt=None, request_id=None):
        self.added.append((request_id, list(prompt_token_ids), params))
        return super().add_request(prompt_token_ids, params, prompt, request_id)


LIMITS = ServerLimits(max_request_bytes=4000, max_prompts_per_request=4)


@pytest.fixture(scope="module")
def srv(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    engine = RecordingEngine(tok, max_model_len=64, max_num_seqs=2, step_s=0.01)
    llm = SimpleNamespace(engine=engine, tokenizer=tok, model_path=tokenizer_dir)
    with ServerThread(create_app(llm, served_model_names=["smol"], limits=LIMITS)) as s:
        s.engine = engine
        yield s


def post(srv, path, content, **kw):
    if not isinstance(content, (str, bytes)):
        content = json.dumps(content)
    return httpx.post(srv.url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60, **kw)


def refused(srv, path, raw, status, param):
    """Posts ``raw``; asserts the error names ``param`` and that the engine got nothing."""
    before = len(srv.engine.added)
    err = assert_openai_error(post(srv, path, raw), status, param)
    assert len(srv.engine.added) == before, "a refused request reached the engine"
    return err


def still_serves(srv):
    r = post(srv, "/v1/completions", {"prompt": [[1, 2]], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == srv.engine.tokenizer.decode([3, 4, 5])


# -- numbers: NaN, Infinity, huge, out of range, in every numeric field ----------------------
NUMERIC = ["temperature", "top_p", "top_k", "max_tokens", "seed", "presence_penalty", "frequency_penalty",
           "best_of", "logprobs", "repetition_penalty", "min_tokens", "prompt_logprobs", "min_p", "n"]
BAD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "1180591620717411303424", "-1180591620717411303424"]


@pytest.mark.parametrize("field", NUMERIC)
@pytest.mark.parametrize("number", BAD_NUMBERS)
def test_bad_numbers_in_every_numeric_field(srv, field, number):
    refused(srv, "/v1/completions", f'{{"prompt": "hi", "{field}": {number}}}', 400, field)


@pytest.mark.parametrize("raw, param", [
    ('{"prompt": [1, NaN]}', "prompt"),
    ('{"prompt": [[1, 1e400]]}', "prompt"),
    ('{"prompt": [1180591620717411303424]}', "prompt"),
    ('{"prompt": "hi", "stop_token_ids": [Infinity]}', "stop_token_ids"),
    ('{"prompt": "hi", "stop_token_ids": [9223372036854775808]}', "stop_token_ids"),
    ('{"prompt": "hi", "logit_bias": {"5": NaN}}', "logit_bias"),
    ('{"prompt": "hi", "seed": 18446744073709551616}', "seed"),  # 2**64
    ('{"prompt": "hi", "top_k": 9223372036854775808}', "top_k"),  # 2**63
    ('{"prompt": "hi", "top_p": 1e-46}', "top_p"),  # rounds to 0 in float32
    ('{"prompt": "hi", "logit_bias": {"5": 1e400}}', "logit_bias"),
], ids=range(10))
def test_bad_numbers_elsewhere(srv, raw, param):
    refused(srv, "/v1/completions", raw, 400, param)


@pytest.mark.parametrize("body, param", [
    ({"stop": ["x"] * 17}, "stop"),
    ({"stop": "x" * 1001}, "stop"),
    ({"stop": ["ok", "x" * 1001]}, "stop"),
    ({"stop_token_ids": [5] * 1025}, "stop_token_ids"),
])
def test_stop_lists_are_bounded(srv, body, param):
    """The engine thread checks stop strings and ids on every step: their size is capped."""
    err = refused(srv, "/v1/completions", {"prompt": "hi", **body}, 400, param)
    assert "at most" in err["message"]


CHAT_NUMERIC = NUMERIC + ["max_completion_tokens"]


@pytest.mark.parametrize("field", CHAT_NUMERIC)
@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e400", "1180591620717411303424"])
def test_bad_numbers_in_chat(srv, field, number):
    msgs = '[{"role": "user", "content": "hi"}]'
    refused(srv, "/v1/chat/completions", f'{{"messages": {msgs}, "{field}": {number}}}', 400, field)


def test_range_edges_are_served(srv):
    """The largest accepted seed / top_k and the smallest top_p reach the engine as sent."""
    r = post(srv, "/v1/completions", {"prompt": [[1]], "max_tokens": 2, "seed": 2**64 - 1, "top_k": 2**31 - 1,
                                      "top_p": 1e-8, "temperature": 2, "stop_token_ids": [2**63 - 1]})
    assert r.status_code == 200, r.text
    params = srv.engine.added[-1][2]
    assert (params.seed, params.top_k, params.top_p, params.stop_token_ids) == (2**64 - 1, 2**31 - 1, 1e-8,
                                                                                [2**63 - 1])


# -- strict types: no coercion ---------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("max_tokens", "5"), ("stream", "yes"), ("stream", 1), ("temperature", "0.5"), ("top_k", 5.0),
    ("ignore_eos", "true"), ("seed", "7"), ("prompt", [1.0, 2.0]), ("stop", 5), ("echo", "no"),
    ("stream_options", {"include_usage": "yes"}), ("model", 5),
])
def test_no_type_coercion(srv, field, value):
    body = {"prompt": [[1]], field: value} if field != "prompt" else {"prompt": value}
    refused(srv, "/v1/completions", body, 400, field)


def test_text_part_must_be_a_string(srv):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    refused(srv, "/v1/chat/completions", body, 400, "messages")


# -- text that is not text -------------------------------------------------------------------
@pytest.mark.parametrize("path, raw, param, where", [
    ("/v1/completions", r'{"prompt": "a\ud800b"}', "prompt", "prompt"),
    ("/v1/completions", r'{"prompt": ["ok", "x\udfff"]}', "prompt", "prompt.1"),
    ("/v1/completions", r'{"prompt": "hi", "stop": ["\udc00"]}', "stop", "stop.0"),
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": "\ud83d"}]}', "messages",
     "messages.0.content"),
    ("/v1/chat/completions",
     r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}', "messages",
     "messages.0.content.0.text"),
    ("/v1/completions", r'{"prompt": "hi", "a\ud800": 1}', r"a\ud800", r"a\ud800"),
])
def test_lone_surrogates_are_refused_by_field(srv, path, raw, param, where):
    err = refused(srv, path, raw, 400, param)
    assert err["message"].startswith(f"{where}: ") and "surrogate" in err["message"]


def test_a_surrogate_pair_is_text(srv):
    r = post(srv, "/v1/completions", r'{"prompt": "smile \ud83d\ude00", "max_tokens": 1}')
    assert r.status_code == 200, r.text
    assert srv.engine.added[-1][1] == srv.engine.tokenizer.encode("smile \U0001F600")


@pytest.mark.parametrize("raw", [b'{"prompt": "\xff\xfe"}', b'{"prompt": "\xed\xa0\x80"}',
                                 b"\xc3", "[" * 3000])
def test_bodies_that_are_not_utf8_json(srv, raw):
    err = refused(srv, "/v1/completions", raw, 400, None)
    assert "UTF-8" in err["message"] or "JSON" in err["message"]


# -- limits ----------------------------------------------------------------------------------
def test_body_size_limit(srv):
    prompt = "word " * 1000  # 5000 bytes > 4000
    err = refused(srv, "/v1/completions", {"prompt": prompt}, 413, None)
    assert "4000" in err["message"] and "--max-request-bytes" in err["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 1000

    before = len(srv.engine.added)
    r = httpx.post(srv.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_openai_error(r, 413)
    assert len(srv.engine.added) == before
    body = json.dumps({"prompt": [[7]], "max_tokens": 1, "user": "x" * 3900})
    assert 3900 < len(body) <= 4000
    r = post(srv, "/v1/completions", body)  # at the limit: served
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == srv.engine.tokenizer.decode([8])


def test_prompts_per_request_cap(srv):
    err = refused(srv, "/v1/completions", {"prompt": [[1]] * 5, "max_tokens": 1}, 400, "prompt")
    assert "at most 4" in err["message"] and "--max-prompts-per-request" in err["message"]
    r = post(srv, "/v1/completions", {"prompt": [[1]] * 4, "max_tokens": 1})
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]


def test_small_request_is_not_queued_behind_a_large_one(tokenizer_dir):
    """max_num_seqs=2; a request of 16 prompts arrives first: a one-prompt request sent
    after it is given to the engine at the next free slot (round robin), not after all 16."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    engine = RecordingEngine(tok, max_model_len=64, max_num_seqs=2, step_s=0.01)
    llm = SimpleNamespace(engine=engine, tokenizer=tok, model_path="x")
    limits = ServerLimits(max_prompts_per_request=16)
    with ServerThread(create_app(llm, served_model_names=["smol"], limits=limits)) as s, \
            cf.ThreadPoolExecutor(2) as pool:
        # Each big prompt holds its slot for 40 steps (>= 0.4 s): time for the small
        # request to arrive before the third admission, even on a busy machine.
        big = pool.submit(post, s, "/v1/completions", {"prompt": [[1]] * 16, "max_tokens": 40})
        deadline = time.time() + 30
        while len(engine.added) < 2:
            assert time.time() < deadline
            time.sleep(0.005)
        small = post(s, "/v1/completions", {"prompt": [[100]], "max_tokens": 2})
        assert small.json()["choices"][0]["text"] == tok.decode([101, 102])
        assert not big.done(), "the small request waited for the whole batch"
        small_at = [i for i, (_, ids, _) in enumerate(engine.added) if ids == [100]]
        assert small_at and small_at[0] <= 3, [rid for rid, _, _ in engine.added]
        assert len(big.result().json()["choices"]) == 16


# -- gauges and cancellation -----------------------------------------------------------------
def running_gauge(srv) -> float:
    return metric(metric_values(httpx.get(srv.url + "/metrics").text), "eagle_zoo:num_requests_running")


def test_gauges_right_after_a_disconnect(srv):
    with pytest.raises(httpx.TimeoutException):
        httpx.post(srv.url + "/v1/completions", json={"prompt": [[1]], "max_tokens": 60}, timeout=0.3)
    deadline = time.time() + 5
    while srv.engine.has_unfinished():  # the handler notices (polls every 0.5 s) and aborts
        assert time.time() < deadline, "the abandoned request was not aborted"
        time.sleep(0.05)
    time.sleep(0.1)
    assert running_gauge(srv) == 0
    still_serves(srv)


@pytest.mark.slow
def test_mixed_cancellations_under_load_leave_no_trace(srv):
    """32 clients: a third read a stream partway and close it, a third time out, a third
    finish. Afterwards every slot is free, the gauges are 0, the finished answers are
    right, and the server's memory did not grow with the number of requests."""
    import resource

    def one(i):
        body = {"prompt": [[i % 50 + 1]], "max_tokens": 12}
        if i % 3 == 0:
            with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}) as r:
                for _ in zip(range(2), r.iter_lines()):
                    pass
            return None
        if i % 3 == 1:
            try:
                httpx.post(srv.url + "/v1/completions", json=body, timeout=0.2)
            except httpx.TimeoutException:
                pass
            return None
        return httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

    def wave(n):
        with cf.ThreadPoolExecutor(32) as pool:
            return list(pool.map(one, range(n)))

    wave(32)
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = wave(96)
    deadline = time.time() + 10
    while srv.engine.has_unfinished() or running_gauge(srv):
        assert time.time() < deadline, "requests left running"
        time.sleep(0.1)
    tok = srv.engine.tokenizer
    for i, text in enumerate(results):
        if text is not None:
            assert text == tok.decode([i % 50 + 2 + j for j in range(12)])
    sched = srv.engine.scheduler
    assert not sched.running and not sched.waiting and len(sched.free_slots) == sched.num_slots
    gc.collect()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kb < 64 * 1024, f"peak RSS grew by {grown_kb} KiB over 96 requests"
    still_serves(srv)


# -- one request cannot fail another inside the engine ------------------------------------------
class IdText:
    """A detokenizer for a target without a tokenizer: token 5 reads "<5>"."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    import engine_fixtures as ef

    return ef.write_target(tmp_path_factory.mktemp("faults") / "target", ef.kind_of("llama"))


@pytest.mark.parametrize("when", ["at its prefill", "in a batched decode step"])
def test_a_poisoned_request_fails_alone_among_concurrent_ones(tiny_target, monkeypatch, when):
    """Three requests running on the real engine; a fourth joins them carrying sampling
    values changed past SamplingParams' checks (as a bug in the server could), before
    its prefill or once all four decode together. It gets a 500 naming the field; the
    other three get exactly what they get without it."""
    from eagle_zoo import LLM
    from eagle_zoo.serve import prepare

    made, poisoned_params = prepare.SamplingParams, []

    def poisoning(**kw):  # seed 666 marks the poisoned request
        sp = made(**kw)
        if kw.get("seed") == 666:
            poisoned_params.append(sp)
            if when == "at its prefill":
                sp.top_k = 2**70
        return sp

    monkeypatch.setattr(prepare, "SamplingParams", poisoning)
    llm = LLM(str(tiny_target), device="cpu", max_model_len=48, max_num_seqs=4)
    assert llm.tokenizer is None  # prompts go as token ids; the answers' text spells out the ids:
    llm.engine.tokenizer = IdText()
    step = llm.engine.step
    llm.engine.step = lambda: (time.sleep(0.01), step())[1]  # time for the test to act between steps
    running = llm.engine.scheduler.running
    good = [{"prompt": [5, 6, 7], "max_tokens": 30, "temperature": 0, "ignore_eos": True},
            {"prompt": [9, 10], "max_tokens": 30, "temperature": 0.9, "seed": 5, "ignore_eos": True},
            {"prompt": [30, 31, 32, 33], "max_tokens": 28, "temperature": 0, "ignore_eos": True, "stream": True}]
    poisoned = {"prompt": [40, 41], "max_tokens": 30, "temperature": 0.8, "top_k": 4, "seed": 666,
                "ignore_eos": True}

    def ask(s, body):
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        if body.get("stream"):
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")
                      and line != "data: [DONE]"]
            errors = [e for e in events if "error" in e]
            text = "".join(c["choices"][0]["text"] for c in events if c.get("choices"))
            return r.status_code, (errors[0] if errors else text)
        payload = r.json()
        return r.status_code, (payload if "error" in payload else payload["choices"][0]["text"])

    def wait_for(n):
        deadline = time.time() + 30
        while len(running) < n:
            assert time.time() < deadline, f"never {n} requests running together"
            time.sleep(0.002)

    with ServerThread(create_app(llm, served_model_names=["tiny"])) as s:
        alone = [ask(s, b) for b in good]
        assert all(st == 200 and text.count("<") >= 28 for st, text in alone), alone
        with cf.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(ask, s, b) for b in good]
            wait_for(3)
            bad = pool.submit(ask, s, poisoned)
            if when == "in a batched decode step":
                wait_for(4)
                poisoned_params[0].top_k = 2**70
            got = [f.result() for f in futures]
            status, err = bad.result()
        assert status == 500 and "SamplingParams.top_k" in err["error"]["message"], err
        assert got == alone
        assert not llm.engine.has_unfinished() and len(llm.engine.scheduler.free_slots) == 4


def test_a_large_request_does_not_stall_the_event_loop(tokenizer_dir):
    """A 1.2 MB chat message takes seconds to render and tokenize; meanwhile a small
    request is answered and /health answers at once (the work runs in preparation
    threads, not the event loop), and the large request still gets its answer (a 400:
    far longer than the context)."""
    import threading

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    llm = SimpleNamespace(engine=ScriptedEngine(tok), tokenizer=tok, model_path="x")
    with ServerThread(create_app(llm, served_model_names=["smol"])) as s:
        body = {"messages": [{"role": "user", "content": "hello world, this is a test. " * 40000}]}
        done = {}

        def post_timed(name, path, payload):
            response = httpx.post(s.url + path, json=payload, timeout=120)
            done[name] = (time.time(), response)

        t0 = time.time()
        big = threading.Thread(target=post_timed, args=("big", "/v1/chat/completions", body))
        big.start()
        time.sleep(0.1)
        small = threading.Thread(target=post_timed, args=("small", "/v1/completions",
                                                          {"prompt": "hi", "max_tokens": 2}))
        small.start()
        latencies = []
        while big.is_alive():
            t = time.time()
            assert httpx.get(s.url + "/health", timeout=30).status_code == 200
            latencies.append(time.time() - t)
            time.sleep(0.05)
        small.join(30)
        big_s = done["big"][0] - t0
        assert assert_openai_error(done["big"][1], 400, "messages")["code"] == "context_length_exceeded"
        assert done["small"][1].status_code == 200
        assert done["small"][0] < done["big"][0], "the small request waited for the large one"
        assert big_s > 0.5 and len(latencies) >= 3, (big_s, latencies)
        assert max(latencies) < min(1.0, big_s / 2), latencies


def test_limits_must_be_positive(capsys):
    from eagle_zoo.cli import main

    with pytest.raises(ValueError, match=r"ServerLimits\.max_prompts_per_request must be an integer >= 1, got 0"):
        ServerLimits(max_prompts_per_request=0)
    assert main(["serve", "default", "--max-request-bytes", "0"]) == 2
    assert "--max-request-bytes must be an integer >= 1, got 0" in capsys.readouterr().err
