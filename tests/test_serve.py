"""`eagle-zoo serve`: a real uvicorn server on 127.0.0.1, spoken to with the official
`openai` client (and httpx for raw bodies).

Two kinds of server:
- over a scripted engine (the real Scheduler and Sequence, a fake forward pass):
  errors, API keys, failure isolation; fast;
- over the embedded default target on the CPU (fp32): answers equal offline
  ``LLM.generate`` / ``LLM.chat`` (the reference: the engine without any server),
  streaming, a concurrent load, metrics, cancellation, and a speculative (ngram)
  server started through the CLI whose greedy answers equal plain ones.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path
import os
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from eagle_zoo import default_target as dt  # noqa: E402
from eagle_zoo.engine.metrics import SpecDecodingMetrics  # noqa: E402
from eagle_zoo.engine.sampling_params import SamplingParams  # noqa: E402
from eagle_zoo.engine.scheduler import Scheduler  # noqa: E402
from eagle_zoo.engine.sequence import Sequence  # noqa: E402
from eagle_zoo.serve.app import _TextDeltas, create_app  # noqa: E402

MODEL = dt.DEFAULT_MODEL_ID
KEY = "sk-test-key"


# -- helpers --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``app`` in a thread of this process."""

    def __init__(self, app):
        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str = "unused", **kw) -> "openai.OpenAI":
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def metric_values(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} from Prometheus text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(values: dict, name: str, **labels) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def assert_openai_error(r: httpx.Response, status: int, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.fixture(scope="module")
def tokenizer_dir(default_target_dir):
    return default_target_dir


# -- a scripted engine: fast tests of the HTTP layer ---------------------------------------
class ScriptedEngine:
    """EngineCore's interface over the real Scheduler: each step appends token
    (last + 1) to every running sequence. ``fail_on`` makes add_request refuse a
    prompt containing that token; ``fail_steps`` makes that many steps raise."""

    k = 0

    def __init__(self, tokenizer, max_model_len=64, max_num_seqs=2, step_s=0.0):
        self.tokenizer, self.max_model_len, self.step_s = tokenizer, max_model_len, step_s
        self.scheduler = Scheduler(max_num_seqs)
        self.metrics = SpecDecodingMetrics()
        self.target = SimpleNamespace(config=SimpleNamespace(vocab_size=len(tokenizer)))
        self.fail_on, self.fail_steps = None, 0

    def add_request(self, prompt_token_ids, params, prompt=None, request_id=None):
        if self.fail_on in prompt_token_ids:
            raise RuntimeError("scripted failure in add_request")
        seq = Sequence(request_id, prompt, list(prompt_token_ids), params)
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id):
        self.scheduler.abort(request_id)

    def has_unfinished(self):
        return self.scheduler.has_unfinished()

    def step(self):
        plan = self.scheduler.schedule()
        time.sleep(self.step_s)
        if self.fail_steps:
            self.fail_steps -= 1
            raise RuntimeError("scripted failure in step")
        done = []
        for seq in plan.decode + plan.prefill:
            seq.output_token_ids.append((seq.last_token_id + 1) % self.target.config.vocab_size)
            seq.output_text = self.tokenizer.decode(seq.output_token_ids)
            if len(seq.output_token_ids) >= seq.params.max_tokens:
                seq.finish_reason = "length"
                self.scheduler.finish(seq)
                done.append(seq)
        return done


@pytest.fixture(scope="module")
def scripted(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    engine = ScriptedEngine(tok, step_s=0.01)
    llm = SimpleNamespace(engine=engine, tokenizer=tok, model_path=tokenizer_dir)
    with ServerThread(create_app(llm, served_model_names=["smol", "smol-alias"])) as srv:
        srv.engine = engine
        yield srv


def test_scripted_completion_shapes(scripted):
    client = scripted.client()
    assert [m.id for m in client.models.list().data] == ["smol", "smol-alias"]
    r = client.completions.create(model="smol", prompt=[[1, 2, 3]], max_tokens=4)
    expected = scripted.engine.tokenizer.decode([4, 5, 6, 7])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 4, 7)
    # Several prompts in one request: one choice each, usage summed.
    r = client.completions.create(model="smol-alias", prompt=[[10], [20, 21]], max_tokens=3)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[1].text == scripted.engine.tokenizer.decode([22, 23, 24])
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 6
    stream = client.completions.create(model="smol", prompt=[[10], [20, 21]], max_tokens=3, stream=True,
                                       stream_options={"include_usage": True})
    texts, usage = ["", ""], None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
        usage = chunk.usage or usage
    assert texts == [r.choices[0].text, r.choices[1].text] and usage.completion_tokens == 6
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="smol", messages=messages, max_tokens=5)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(model="smol", messages=messages, max_tokens=5, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content


def _post(srv, path, body, **headers):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(srv.url + path, content=content, headers={"content-type": "application/json", **headers},
                      timeout=60)


BAD_COMPLETIONS = [
    ("{not json", None),
    ([1, 2], None),
    ({"model": "nope", "prompt": "hi"}, "model"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 64}, "max_tokens"),  # 1 prompt token + 64 > max_model_len 64
    ({"prompt": list(range(64)), "max_tokens": 1}, "prompt"),  # the prompt alone fills the context
    ({"prompt": "hi", "temperature": 2.5}, "temperature"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -2}, "top_k"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "min_tokens": 17}, "min_tokens"),  # more than max_tokens (16)
    ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"100000000": 1}}, "logit_bias"),  # outside the vocabulary
    ({"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({"prompt": "hi", "bad_words": "x"}, "bad_words"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10 ** 9]}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "hi", "stop": [""]}, None),
]


@pytest.mark.parametrize("body,param", BAD_COMPLETIONS, ids=[str(i) for i in range(len(BAD_COMPLETIONS))])
def test_bad_completion_requests_get_400(scripted, body, param):
    assert_openai_error(_post(scripted, "/v1/completions", body), 400, param)


BAD_CHATS = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x " * 80}]}, "messages"),  # too long for 64
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": 2}, "logprobs"),  # a boolean here
]


@pytest.mark.parametrize("body,param", BAD_CHATS, ids=[str(i) for i in range(len(BAD_CHATS))])
def test_bad_chat_requests_get_400(scripted, body, param):
    assert_openai_error(_post(scripted, "/v1/chat/completions", {"model": "smol", **body}), 400, param)


def test_openai_client_sees_400_and_404(scripted):
    client = scripted.client()
    with pytest.raises(openai.BadRequestError, match="not served here"):
        client.completions.create(model="gpt-4", prompt="hi")
    assert_openai_error(httpx.get(scripted.url + "/v1/nothing"), 404)
    # Nothing above took the server down.
    assert client.completions.create(model="smol", prompt=[[1]], max_tokens=1).choices[0].text


def test_failure_inside_one_request_fails_it_alone(scripted):
    client, engine = scripted.client(), scripted.engine
    engine.fail_on = 999
    with cf.ThreadPoolExecutor(2) as pool:
        good = pool.submit(client.completions.create, model="smol", prompt=[[1, 2]], max_tokens=20)
        with pytest.raises(openai.InternalServerError, match="scripted failure in add_request"):
            client.completions.create(model="smol", prompt=[[999]], max_tokens=2)
        assert good.result().choices[0].finish_reason == "length"
    with pytest.raises(openai.APIError, match="scripted failure in add_request"):  # an error event mid-stream
        for _ in client.completions.create(model="smol", prompt=[[999]], max_tokens=2, stream=True):
            pass
    # A step that raises fails the requests in flight; the loop keeps serving.
    engine.fail_steps = 1
    with pytest.raises(openai.InternalServerError, match="scripted failure in step"):
        client.completions.create(model="smol", prompt=[[5]], max_tokens=2)
    stream = client.completions.create(model="smol", prompt=[[5]], max_tokens=2, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == engine.tokenizer.decode([6, 7])
    assert httpx.get(scripted.url + "/health").status_code == 200
    assert not engine.scheduler.running and len(engine.scheduler.free_slots) == engine.scheduler.num_slots


def test_api_key(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    llm = SimpleNamespace(engine=ScriptedEngine(tok), tokenizer=tok, model_path="x")
    with ServerThread(create_app(llm, served_model_names=["smol"], api_key=KEY)) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = httpx.request(method, srv.url + path, headers=headers, json={})
                assert assert_openai_error(r, 401)["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            srv.client("wrong").models.list()
        client = srv.client(KEY)
        assert client.models.list().data[0].id == "smol"
        assert client.completions.create(model="smol", prompt=[[1]], max_tokens=2).usage.completion_tokens == 2
        r = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and "eagle_zoo:request_success_total" in r.text


def test_tokenize_detokenize_version(scripted):
    import eagle_zoo

    tok = scripted.engine.tokenizer
    r = _post(scripted, "/tokenize", {"model": "smol", "prompt": "Hello world"})
    assert r.status_code == 200, r.text
    ids = tok.encode("Hello world", add_special_tokens=True)
    assert r.json() == {"count": len(ids), "max_model_len": 64, "tokens": ids, "token_strs": None}
    messages = [{"role": "user", "content": "hi"}]
    r = _post(scripted, "/tokenize", {"messages": messages, "return_token_strs": True})
    want = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)
    assert r.json()["tokens"] == want and r.json()["token_strs"] == tok.convert_ids_to_tokens(want)
    r = _post(scripted, "/detokenize", {"tokens": want})
    assert r.status_code == 200 and r.json() == {"prompt": tok.decode(want)}
    assert_openai_error(_post(scripted, "/detokenize", {"tokens": [10 ** 7]}), 400, "tokens")
    assert_openai_error(_post(scripted, "/tokenize", {"prompt": "a", "messages": messages}), 400, "prompt")
    r = _post(scripted, "/tokenize", {"model": "nope", "prompt": "a"})
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == "model"
    assert _post(scripted, "/tokenize", {"prompt": "a", "unknown_field": 1}).status_code == 400
    assert httpx.get(scripted.url + "/version").json() == {"version": eagle_zoo.__version__}


def test_startup_line_names_target_draft_method_and_why():
    from eagle_zoo.config import SpeculativeConfig
    from eagle_zoo.serve.cli import chat_template, startup_line

    spec = SpeculativeConfig.parse({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"})
    llm = SimpleNamespace(model_path="/m/target", speculative_config=spec, engine=SimpleNamespace(k=3))
    line = startup_line(llm)
    assert line.startswith("serving target /m/target, draft yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, method eagle3 "
                           "(inferred: the name") and line.endswith("num_speculative_tokens 3")
    assert startup_line(SimpleNamespace(model_path="/m", speculative_config=None)) == \
        "serving target /m, no speculative decoding"
    assert chat_template("{{ messages }}") == "{{ messages }}"
    with pytest.raises(ValueError, match="--chat-template nofile: no such file"):
        chat_template("nofile")


def test_engine_spec_counters_under_both_prefixes():
    """The engine snapshot's Vector of per-position counts becomes one labelled counter
    per position, under eagle_zoo: and vllm: names."""
    from eagle_zoo.serve.metrics import ServerMetrics

    spec = SpecDecodingMetrics(num_speculative_tokens=2)
    spec.observe([2, 2, 2], [2, 1, 0])
    loop = SimpleNamespace(snapshot={"running": 1, "waiting": 0, "spec": spec.get_metrics(prefix=""),
                                     "mean_acceptance_length": spec.mean_acceptance_length})
    values = metric_values(ServerMetrics(loop).render().decode())
    for prefix in ("eagle_zoo:", "vllm:"):
        assert metric(values, prefix + "spec_decode_num_drafts_total") == 3
        assert metric(values, prefix + "spec_decode_num_accepted_tokens_total") == 3
        assert [metric(values, prefix + "spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                for i in range(2)] == [2, 1]
        assert metric(values, prefix + "num_requests_running") == 1


def test_stream_text_deltas_hold_back_partial_characters_and_stop_prefixes():
    d = _TextDeltas(["END"])
    assert d("ab\ufffd", False) == "ab"  # incomplete UTF-8 character waits
    assert d("ab日E", False) == "日"  # "E" could start "END"
    assert d("ab日EN", False) == ""
    assert d("ab日ENx", False) == "ENx"  # it did not
    assert d("ab日ENx", True) == ""
    d = _TextDeltas([])
    assert d("a", False) + d("a\ufffd", False) + d("ab", True) == "ab"


# -- the real engine on the embedded default target -----------------------------------------
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "red green blue red green blue red green blue red green",  # ngram drafts find matches here
    "The best way to learn a language is",
    "Water boils at",
    "My favourite colour is",
    "import numpy as np\n",
]
QUESTIONS = ["What is 2+2?", "Name a fruit.", "Say hello.", "What colour is the sky?"]
MAX_TOKENS = 6


def make_llm(**kw):
    from eagle_zoo.engine.llm import LLM

    return LLM(model=MODEL, device="cpu", dtype="float32", max_model_len=256, **kw)


@pytest.fixture(scope="module")
def offline(tokenizer_dir):
    """Reference answers: the engine alone, no server, no speculation."""
    llm = make_llm(max_num_seqs=16)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    chats = [{"prompt": llm.apply_chat_template([{"role": "user", "content": q}])} for q in QUESTIONS]
    extra = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=["."]),
             SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=MAX_TOKENS)]
    outs = [o.outputs[0] for o in llm.generate(PROMPTS + chats + [PROMPTS[0], PROMPTS[2]],
                                                 [greedy] * (len(PROMPTS) + len(chats)) + extra)]
    stopped, sampled = outs[-2:]
    assert stopped.finish_reason == "stop", "pick a stop string the answer contains"
    return SimpleNamespace(completions={p: o.text for p, o in zip(PROMPTS, outs)},
                           chats={q: o.text for q, o in zip(QUESTIONS, outs[len(PROMPTS):])},
                           tokenizer=llm.tokenizer, stopped=stopped, sampled=sampled.text)


@pytest.fixture(scope="module")
def server(tokenizer_dir):
    with ServerThread(create_app(make_llm(max_num_seqs=4), served_model_names=[MODEL])) as srv:
        yield srv


def ask(client, kind: str, text: str, stream: bool, max_tokens: int = MAX_TOKENS, **kw):
    """One greedy request -> (text, finish_reason, usage)."""
    common = dict(model=MODEL, max_tokens=max_tokens, temperature=0, stream=stream)
    common.update(kw)
    if stream:
        common["stream_options"] = {"include_usage": True}
    if kind == "chat":
        r = client.chat.completions.create(messages=[{"role": "user", "content": text}], **common)
    else:
        r = client.completions.create(prompt=text, **common)
    if not stream:
        c = r.choices[0]
        return (c.message.content if kind == "chat" else c.text), c.finish_reason, r.usage
    out, reason, usage = "", None, None
    for chunk in r:
        for c in chunk.choices:
            out += (c.delta.content or "") if kind == "chat" else c.text
            reason = c.finish_reason or reason
        usage = chunk.usage or usage
    return out, reason, usage


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_answers_equal_offline_generate(server, offline, stream):
    client = server.client()
    for p in PROMPTS[:3]:
        text, reason, usage = ask(client, "completion", p, stream)
        assert text == offline.completions[p] and reason in ("length", "stop")
        assert usage.prompt_tokens == len(offline.tokenizer.encode(p))
    for q in QUESTIONS[:2]:
        assert ask(client, "chat", q, stream)[0] == offline.chats[q]
    # A stop string (streamed: text that may start it is held back until it resolves).
    assert ask(client, "completion", PROMPTS[0], stream, stop=["."])[:2] == (
        offline.stopped.text, offline.stopped.finish_reason)
    # Seeded sampling draws from a per-request generator: the same answer whatever the batch.
    assert ask(client, "completion", PROMPTS[2], stream, temperature=0.8, top_p=0.9, seed=7)[0] == offline.sampled


@pytest.mark.slow
def test_concurrent_load_all_complete_and_metrics_add_up(server, offline):
    before = metric_values(httpx.get(server.url + "/metrics").text)
    client = server.client()
    jobs = [(("chat", QUESTIONS[(i + j) % len(QUESTIONS)]) if (i + j) % 3 == 0
             else ("completion", PROMPTS[(i + j) % len(PROMPTS)]), (i + j) % 2 == 1)
            for i in range(16) for j in range(2)]

    def client_run(i):  # each client: two requests in a row
        return [ask(client, kind, text, stream) for (kind, text), stream in jobs[2 * i: 2 * i + 2]]

    t0 = time.time()
    with cf.ThreadPoolExecutor(16) as pool:
        results = [r for rs in pool.map(client_run, range(16)) for r in rs]
    elapsed = time.time() - t0
    for ((kind, text), _), (answer, reason, _) in zip(jobs, results):
        expected = offline.chats[text] if kind == "chat" else offline.completions[text]
        assert answer == expected, (kind, text)
    after = metric_values(httpx.get(server.url + "/metrics").text)

    def grew(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    n_length = sum(r[1] == "length" for r in results)
    assert grew("eagle_zoo:request_success_total", finished_reason="length") == n_length
    assert grew("eagle_zoo:request_success_total", finished_reason="stop") == len(results) - n_length
    assert grew("eagle_zoo:server_generation_tokens_total") == sum(r[2].completion_tokens for r in results)
    assert grew("eagle_zoo:server_prompt_tokens_total") == sum(r[2].prompt_tokens for r in results)
    assert grew("eagle_zoo:e2e_request_latency_seconds_count") == len(results)
    assert metric(after, "eagle_zoo:num_requests_running") == 0
    # vLLM's names count the same
    assert grew("vllm:request_success_total", finished_reason="length") == n_length
    assert grew("vllm:generation_tokens_total") == sum(r[2].completion_tokens for r in results)
    assert grew("vllm:prompt_tokens_total") == sum(r[2].prompt_tokens for r in results)
    assert grew("vllm:e2e_request_latency_seconds_count") == len(results)
    assert grew("vllm:time_to_first_token_seconds_count") == len(results)
    assert metric(after, "vllm:num_requests_running") == 0
    print(f"load: {len(results)} requests from 16 clients in {elapsed:.1f} s")


@pytest.mark.slow
def test_cancelled_clients_free_their_slots(tokenizer_dir, offline):
    """max_num_seqs=1: a long request whose client leaves must not block the next."""
    with ServerThread(create_app(make_llm(max_num_seqs=1), served_model_names=[MODEL])) as srv:
        client = srv.client()
        long = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=200, temperature=0, extra_body={"ignore_eos": True})
        # A streaming client reads two chunks and closes the connection.
        stream = client.completions.create(stream=True, **long)
        for _, _chunk in zip(range(2), stream):
            pass
        stream.close()
        # A plain client gives up (timeout) while its request is queued / running. Raw
        # JSON carries ignore_eos itself (extra_body is the openai client's wrapper; sent
        # as is, the request stopped at EOS within the second once decoding got faster).
        raw = {**{k: v for k, v in long.items() if k != "extra_body"}, "ignore_eos": True}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(srv.url + "/v1/completions", json=raw, timeout=1.0)
        t0 = time.time()
        for p in PROMPTS[:2]:
            assert ask(client, "completion", p, False)[0] == offline.completions[p]
        assert time.time() - t0 < 60, "the abandoned requests held the only slot"
        values = metric_values(httpx.get(srv.url + "/metrics").text)
        assert metric(values, "eagle_zoo:request_failure_total", reason="aborted") == 2
        assert sum(metric(values, "eagle_zoo:request_success_total", finished_reason=r) for r in ("stop", "length")) == 2
        assert metric(values, "eagle_zoo:num_requests_running") == 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ngram", "async scheduling"])
def test_speculative_server_from_cli_equals_plain(tokenizer_dir, offline, variant):
    """The server from the command line gives the offline engine's greedy outputs: with
    n-gram speculation, and with plain decoding under --async-scheduling (steps launched
    before the previous one is read back, requests joining and leaving in between)."""
    port = free_port()
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    # ngram: info logs (the start-up line, periodic SpecDecoding lines), uvicorn's quiet
    mode = (["--speculative-config", spec, "--log-level", "info", "--uvicorn-log-level", "warning",
             "--log-stats-interval", "0.5"] if variant == "ngram" else ["--async-scheduling", "--log-level", "warning"])
    cmd = [sys.executable, "-m", "eagle_zoo.cli", "serve", MODEL, *mode, "--port", str(port),
           "--device", "cpu", "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4",
           "--served-model-name", MODEL, "smol"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "EAGLE_ZOO_API_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "server did not come up"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        assert httpx.get(url + "/v1/models").status_code == 401  # the key came from the environment
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        with cf.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda i: ask(client, "completion", PROMPTS[i], i % 2 == 1)[0], range(len(PROMPTS))))
        assert got == [offline.completions[p] for p in PROMPTS]
        assert ask(client, "chat", QUESTIONS[0], True)[0] == offline.chats[QUESTIONS[0]]
        if variant != "ngram":
            return
        values = metric_values(httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text)
        drafts = metric(values, "eagle_zoo:spec_decode_num_drafts_total")
        drafted = metric(values, "eagle_zoo:spec_decode_num_draft_tokens_total")
        accepted = metric(values, "eagle_zoo:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and 0 <= accepted <= drafted <= 3 * drafts
        per_pos = [metric(values, "eagle_zoo:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                   for i in range(3)]
        assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
        mal = metric(values, "eagle_zoo:spec_decode_mean_acceptance_length")
        assert mal == pytest.approx(1 + accepted / drafts)
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):  # vLLM's names too
            assert metric(values, f"vllm:spec_decode_{name}_total") == metric(values, f"eagle_zoo:spec_decode_{name}_total")
        assert [metric(values, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                for i in range(3)] == per_pos
        proc.terminate()
        logged = proc.communicate(timeout=30)[0]
        assert f"serving target {Path(tokenizer_dir).resolve()}, draft prompt lookup (n-grams of " in logged, logged
        assert "method ngram (given in --speculative-config), num_speculative_tokens 3" in logged, logged
        lines = [line for line in logged.splitlines() if "SpecDecoding metrics: Mean acceptance length: " in line]
        assert lines and "Per-position acceptance rate: " in lines[0], logged
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
