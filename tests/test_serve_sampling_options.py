"""The server honours vLLM's sampling fields (penalties, min_tokens, logit_bias,
bad_words, n, logprobs / top_logprobs / prompt_logprobs) exactly as LLM.generate does
with the same SamplingParams, and returns logprobs in OpenAI's shapes, streamed or not.
The real engine on the embedded default target (SmolLM2-135M), CPU."""
from __future__ import annotations

import pytest

from eagle_zoo.engine.sampling_params import SamplingParams
from test_serve import MODEL, ServerThread, tokenizer_dir  # noqa: F401  (tokenizer_dir: a fixture)

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "red green blue red green blue red green"
OPTIONS = dict(presence_penalty=0.8, frequency_penalty=0.5, logit_bias={"13": 4.0})
EXTRA = dict(repetition_penalty=1.3, min_tokens=4, bad_words=["blue"])


def make_llm(**kw):
    from eagle_zoo.engine.llm import LLM

    return LLM(model=MODEL, device="cpu", dtype="float32", max_model_len=128, **kw)


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def pair(tokenizer_dir):  # noqa: F811
    from eagle_zoo.serve.app import create_app

    offline = make_llm(max_num_seqs=4)
    with ServerThread(create_app(make_llm(max_num_seqs=4, speculative_config=NGRAM),
                                 served_model_names=[MODEL])) as srv:
        yield offline, srv


def params(**kw) -> SamplingParams:
    bias = {int(k): v for k, v in OPTIONS["logit_bias"].items()}
    return SamplingParams(max_tokens=8, **{**OPTIONS, **EXTRA, "logit_bias": bias, **kw})


def test_completions_options_and_logprobs_equal_offline(pair):
    offline, srv = pair
    want = offline.generate(PROMPT, params(temperature=0, logprobs=2, prompt_logprobs=1))[0]
    plain = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
    assert want.outputs[0].token_ids != plain.token_ids, "the options change nothing here"
    assert "blue" not in want.outputs[0].text
    r = srv.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                        **OPTIONS, extra_body={**EXTRA, "prompt_logprobs": 1})
    c = r.choices[0]
    assert c.text == want.outputs[0].text
    lp = c.logprobs
    entries = want.outputs[0].logprobs
    assert lp.tokens == [e[t].decoded_token for t, e in zip(want.outputs[0].token_ids, entries)]
    assert lp.token_logprobs == pytest.approx([e[t].logprob for t, e in zip(want.outputs[0].token_ids, entries)],
                                              abs=1e-4)
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    prompt_lp = c.model_extra["prompt_logprobs"]
    assert prompt_lp[0] is None and len(prompt_lp) == len(want.prompt_token_ids)
    first = want.prompt_logprobs[1]
    assert set(prompt_lp[1]) == {str(t) for t in first}

    streamed = srv.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                               stream=True, **OPTIONS, extra_body=EXTRA)
    tokens, text = [], ""
    for chunk in streamed:
        for ch in chunk.choices:
            text += ch.text
            tokens += ch.logprobs.tokens if ch.logprobs else []
    assert text == c.text and tokens == lp.tokens


def test_chat_logprobs_shape_streamed_and_not(pair):
    offline, srv = pair
    messages = [{"role": "user", "content": "Name a colour."}]
    prompt = {"prompt": offline.apply_chat_template(messages)}
    want = offline.generate(prompt, params(temperature=0, logprobs=3))[0].outputs[0]
    client = srv.client()
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=3, **OPTIONS, extra_body=EXTRA)
    c = r.choices[0]
    assert c.message.content == want.text
    content = c.logprobs.content
    assert [x.token for x in content] == [e[t].decoded_token for t, e in zip(want.token_ids, want.logprobs)]
    for x, (t, e) in zip(content, zip(want.token_ids, want.logprobs)):
        assert x.logprob == pytest.approx(e[t].logprob, abs=1e-4)
        assert x.bytes == list(x.token.encode())
        assert len(x.top_logprobs) == 3
        assert [y.logprob for y in x.top_logprobs] == sorted((y.logprob for y in x.top_logprobs), reverse=True)
    streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True, **OPTIONS, extra_body=EXTRA)
    got = [x.token for chunk in streamed for ch in chunk.choices if ch.logprobs for x in ch.logprobs.content]
    assert got == [x.token for x in content]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_n_choices_equal_offline_children(pair):
    offline, srv = pair
    # The server samples through n-gram verification: the same distribution as plain
    # decoding, not the same draws, so its choices are compared with an offline LLM that
    # speculates alike (each child seeded from the request's seed, whatever the batch).
    want = make_llm(max_num_seqs=4, speculative_config=NGRAM).generate(
        PROMPT, SamplingParams(temperature=1.0, seed=11, n=3, max_tokens=6))[0]
    r = srv.client().completions.create(model=MODEL, prompt=[PROMPT, PROMPT], n=3, seed=11, temperature=1.0,
                                        max_tokens=6)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices[:3]] == [o.text for o in want.outputs]
    assert [c.text for c in r.choices[3:]] == [o.text for o in want.outputs]
    assert len({o.text for o in want.outputs}) > 1
    n_prompt = len(offline.get_tokenizer().encode(PROMPT))
    assert r.usage.prompt_tokens == 2 * n_prompt
    chat = srv.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                                max_tokens=3, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message == chat.choices[1].message


@pytest.mark.parametrize("body, param", [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"min_tokens": 1, "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"logprobs": 0}, "logprobs"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_tree_server_refuses_what_trees_do_not_implement(body, param):
    from eagle_zoo.serve.prepare import RequestPreparer
    from eagle_zoo.serve.protocol import APIError, CompletionRequest

    prep = RequestPreparer(None, max_model_len=64, vocab_size=100, served_model_names=["m"], tree=True)
    assert len(prep.completion(CompletionRequest(prompt=[1, 2], n=2))) == 2
    with pytest.raises(APIError, match="EAGLE-2 tree") as e:
        prep.completion(CompletionRequest(prompt=[1, 2], **body))
    assert e.value.param == param and e.value.status == 400
