"""Every request field of OpenAI's chat / completions API and of vLLM's extra parameters
is honoured or refused with a 400 naming it; keys neither defines are ignored with a
logged warning (vLLM's behaviour). Over the scripted engine of test_serve (fast)."""
from __future__ import annotations

import logging

import pytest

from eagle_zoo.serve.protocol import ACCEPTED, UNSUPPORTED
from test_serve import _post, assert_openai_error, scripted, tokenizer_dir  # noqa: F401 (fixtures)

HI = [{"role": "user", "content": "hi"}]
# A value each unsupported field cannot take silently (not its neutral value).
ACTIVE = {
    "response_format": {"type": "json_object"}, "tool_choice": "required", "function_call": {"name": "f"},
    "priority": 1, "length_penalty": 0.5, "spaces_between_special_tokens": False,
    "modalities": ["text", "audio"], "guided_choice": ["a", "b"], "guided_json": {"type": "object"},
    "tools": [{"type": "function", "function": {"name": "f"}}], "use_beam_search": True,
    "logits_processors": ["m.P"], "store": True,
}


def body(route: str, **kw) -> dict:
    base = {"model": "smol", "max_tokens": 2}
    return {**base, **({"messages": HI} if route == "chat" else {"prompt": "hi"}), **kw}


def path(route: str) -> str:
    return "/v1/chat/completions" if route == "chat" else "/v1/completions"


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_field_is_a_400_naming_it_unless_neutral(scripted, route, name):
    value = ACTIVE.get(name, {"x": 1} if name.endswith(("kwargs", "params", "xargs", "options", "prediction"))
                       else "something")
    err = assert_openai_error(_post(scripted, path(route), body(route, **{name: value})), 400, name)
    assert name in err["message"] and "leave" in err["message"]
    for neutral in UNSUPPORTED[name][0][:2]:  # null, false: what leaving it out means
        r = _post(scripted, path(route), body(route, **{name: neutral}))
        assert r.status_code == 200, (name, neutral, r.text)


def test_neutral_values_that_vllm_clients_send_are_accepted(scripted):
    for kw in ({"response_format": {"type": "text"}}, {"tool_choice": "none"}, {"priority": 0},
               {"spaces_between_special_tokens": True}, {"modalities": ["text"]}, {"length_penalty": 1.0}):
        assert _post(scripted, path("chat"), body("chat", **kw)).status_code == 200, kw


def test_accepted_metadata_fields_change_nothing(scripted, caplog):
    plain = _post(scripted, path("completions"), body("completions", prompt=[[5, 6]])).json()
    meta = {name: "x" for name in ACCEPTED}
    with caplog.at_level(logging.WARNING, logger="eagle_zoo.serve"):
        r = _post(scripted, path("completions"), body("completions", prompt=[[5, 6]], **meta))
    assert r.status_code == 200 and r.json()["choices"] == plain["choices"]
    assert "ignored" not in caplog.text


def test_unknown_field_ignored_with_a_warning_naming_it(scripted, caplog):
    with caplog.at_level(logging.WARNING, logger="eagle_zoo.serve"):
        r = _post(scripted, path("chat"), body("chat", temprature=0.5))
    assert r.status_code == 200
    assert "The following fields were present in the request but ignored: ['temprature']" in caplog.text


@pytest.mark.parametrize("route,kw,param", [
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ("chat", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ("completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("completions", {"allowed_token_ids": []}, "allowed_token_ids"),
    ("completions", {"allowed_token_ids": [10 ** 9]}, "allowed_token_ids"),
    ("chat", {"echo": True}, "echo"),
    ("chat", {"chat_template": "{{ messages }}"}, "chat_template"),  # not trusted on this server
    ("chat", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ("chat", {"continue_final_message": True}, "continue_final_message"),  # the last message is the user's
    ("chat", {"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt"),
    ("chat", {"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
])
def test_bad_values_of_honoured_fields(scripted, route, kw, param):
    err = assert_openai_error(_post(scripted, path(route), body(route, **kw)), 400, param)
    assert param in err["message"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(scripted):
    r = _post(scripted, path("completions"), body("completions", prompt=[[1, 2, 3, 4, 5]], truncate_prompt_tokens=2))
    assert r.json()["usage"]["prompt_tokens"] == 2
    # The scripted engine continues from the last prompt token: 6, 7 either way.
    full = _post(scripted, path("completions"), body("completions", prompt=[[1, 2, 3, 4, 5]])).json()
    assert r.json()["choices"][0]["text"] == full["choices"][0]["text"]


def test_chat_template_options_shape_the_prompt(scripted):
    tok = scripted.engine.tokenizer

    def prompt_tokens(messages, **kw):
        r = _post(scripted, path("chat"), body("chat", messages=messages, **kw))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    def rendered(messages, **kw):
        return len(tok.encode(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False))

    with_prompt, without = rendered(HI, add_generation_prompt=True), rendered(HI, add_generation_prompt=False)
    assert with_prompt != without
    assert prompt_tokens(HI) == with_prompt
    assert prompt_tokens(HI, add_generation_prompt=False) == without
    prefill = HI + [{"role": "assistant", "content": "The answer is"}]
    text = tok.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
    assert text.endswith("The answer is")
    assert prompt_tokens(prefill, continue_final_message=True) == len(tok.encode(text, add_special_tokens=False))
    assert prompt_tokens(HI, chat_template_kwargs={"custom_flag": True}) == rendered(
        HI, add_generation_prompt=True, custom_flag=True)


def test_message_keys_name_is_passed_on_tool_keys_are_refused():
    from eagle_zoo.serve.protocol import APIError, ChatMessage

    m = ChatMessage.model_validate({"role": "developer", "content": "Be brief.", "name": "ops"})
    m.check_supported()
    assert m.template_message() == {"role": "system", "content": "Be brief.", "name": "ops"}
    for key, value in (("tool_calls", [{"id": "1"}]), ("tool_call_id", "1"), ("audio", {"id": "a"})):
        bad = ChatMessage.model_validate({"role": "assistant", "content": "x", key: value})
        with pytest.raises(APIError, match=f"messages\\[\\]\\.{key} is not supported"):
            bad.check_supported()
    ChatMessage.model_validate({"role": "assistant", "content": "x", "tool_calls": []}).check_supported()
