"""vLLM users' code, run unchanged but for the import line and the model names: the
offline EAGLE example of vLLM's speculative-decoding docs, its metrics acceptance loop,
a spec_decode.py command line with a local dataset, and the openai client sending
vLLM's extra parameters through ``extra_body`` to the server.

Each snippet is kept as text and executed as written, so an edit that makes it less
than verbatim shows in the diff. Against the embedded default target on the CPU, with
the shipped SmolLM2 heads (skipped where those are not installed); outputs are short.
"""
from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from eagle_zoo import default_target as dt
from eagle_zoo.plugins import get_registry

TARGET = dt.DEFAULT_MODEL_ID
EAGLE = "eagle-zoo/EAGLE-SmolLM2-135M-Instruct"
EAGLE3 = "eagle-zoo/EAGLE3-SmolLM2-135M-Instruct"

pytestmark = pytest.mark.usefixtures("one_thread", "k_drafts_every_step")


@pytest.fixture(scope="module")
def heads(default_target_dir):
    missing = [h for h in (EAGLE, EAGLE3) if get_registry().catalog.get(h) is None]
    if missing:
        pytest.skip(f"shipped heads not installed: {missing}")


def run_snippet(code: str, **names) -> dict:
    """Executes a user's snippet; returns its globals."""
    scope = dict(names)
    exec(compile(textwrap.dedent(code), "<vllm user code>", "exec"), scope)
    return scope


# vLLM docs, "Speculative Decoding", EAGLE: offline. Import line and model names changed.
OFFLINE_EAGLE = """
from eagle_zoo import LLM, SamplingParams

prompts = [
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(
    model="HuggingFaceTB/SmolLM2-135M-Instruct",
    tensor_parallel_size=1,
    speculative_config={
        "model": "eagle-zoo/EAGLE-SmolLM2-135M-Instruct",
        "draft_tensor_parallel_size": 1,
        "num_speculative_tokens": 2,
        "method": "eagle",
    },
)

outputs = llm.generate(prompts, sampling_params)

for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
"""

# vLLM's spec_decode.py: the acceptance loop over llm.get_metrics(). Import line changed.
METRICS_LOOP = """
from eagle_zoo.metrics import Counter, Vector

metrics = llm.get_metrics()

num_drafts = 0
num_draft_tokens = 0
num_accepted_tokens = 0
acceptance_counts = [0] * args.num_spec_tokens
for metric in metrics:
    if metric.name == "vllm:spec_decode_num_drafts":
        assert isinstance(metric, Counter)
        num_drafts += metric.value
    elif metric.name == "vllm:spec_decode_num_draft_tokens":
        assert isinstance(metric, Counter)
        num_draft_tokens += metric.value
    elif metric.name == "vllm:spec_decode_num_accepted_tokens":
        assert isinstance(metric, Counter)
        num_accepted_tokens += metric.value
    elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
        assert isinstance(metric, Vector)
        for pos in range(len(metric.values)):
            acceptance_counts[pos] += metric.values[pos]

print("-" * 50)
print(f"num_drafts: {num_drafts}")
print(f"num_draft_tokens: {num_draft_tokens}")
print(f"num_accepted_tokens: {num_accepted_tokens}")
acceptance_length = 1 + (num_accepted_tokens / num_drafts) if num_drafts > 0 else 1
print(f"mean acceptance length: {acceptance_length:.2f}")
print("-" * 50)

# print acceptance at each token position
for i in range(len(acceptance_counts)):
    acceptance_rate = acceptance_counts[i] / num_drafts if num_drafts > 0 else 0
    print(f"acceptance at token {i}: {acceptance_rate:.2f}")
"""


def test_offline_eagle_example_and_metrics_loop(heads, capsys):
    from types import SimpleNamespace

    scope = run_snippet(OFFLINE_EAGLE)
    printed = capsys.readouterr().out
    assert printed.startswith("Prompt: 'The future of AI is', Generated text: ")
    out = scope["outputs"][0].outputs[0]
    assert len(out.token_ids) == 16 or out.finish_reason == "stop"  # vLLM's default max_tokens
    llm = scope["llm"]

    scope = run_snippet(METRICS_LOOP, llm=llm, args=SimpleNamespace(num_spec_tokens=2))
    printed = capsys.readouterr().out
    m = llm.engine.metrics
    assert m.num_drafts > 0, "no drafting happened: the loop would prove nothing"
    assert scope["num_drafts"] == m.num_drafts and scope["num_accepted_tokens"] == m.num_accepted_tokens
    assert scope["num_draft_tokens"] == 2 * m.num_drafts
    assert scope["acceptance_counts"] == list(m.num_accepted_tokens_per_pos)
    assert f"num_drafts: {m.num_drafts}\n" in printed
    assert f"mean acceptance length: {1 + m.num_accepted_tokens / m.num_drafts:.2f}" in printed
    assert "acceptance at token 1: " in printed


def test_spec_decode_command_line_with_a_local_dataset(heads, tmp_path, capsys):
    from eagle_zoo import cli

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Say hi.", "Name a colour.")))
    # vLLM: python examples/offline_inference/spec_decode.py <these flags>
    command = (f"--method eagle3 --model-dir {TARGET} --eagle-dir {EAGLE3} --num-spec-tokens 2 --tp 1 "
               f"--draft-tp 1 --dataset-name custom --dataset-path {data} --num-prompts 2 --max-num-seqs 2 "
               "--temp 0 --top-p 1.0 --top-k -1 --output-len 8 --print-output --enable-chunked-prefill")
    assert cli.main(["bench", *shlex.split(command)]) == 0
    printed = capsys.readouterr().out
    summary = printed[printed.index("num_drafts: "):]
    drafts = int(summary.split("\n")[0].split(": ")[1])
    assert drafts > 0
    assert f"num_draft_tokens: {2 * drafts}" in summary and "mean acceptance length: " in summary
    assert "acceptance at token 0: " in summary and "acceptance at token 1: " in summary
    assert "'Say hi.'" in printed  # --print-output


# -- the openai client against the server, vLLM's extra parameters in extra_body ---------
@pytest.fixture(scope="module")
def eagle_server(heads):
    from eagle_zoo import LLM
    from eagle_zoo.serve.app import create_app
    from test_serve import ServerThread

    llm = LLM(model=TARGET, max_model_len=256, dtype="float32",
              speculative_config={"model": EAGLE3, "num_speculative_tokens": 2, "method": "eagle3"})
    with ServerThread(create_app(llm, served_model_names=[TARGET])) as srv:
        srv.llm = llm
        yield srv


CLIENT = """
from openai import OpenAI

client = OpenAI(base_url=base_url, api_key="EMPTY")
completion = client.chat.completions.create(
    model="HuggingFaceTB/SmolLM2-135M-Instruct",
    messages=[{"role": "user", "content": "Classify this sentiment: vLLM is wonderful!"}],
    max_tokens=8,
    temperature=0,
    extra_body={
        "top_k": 20,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
        "spaces_between_special_tokens": True,
        "add_generation_prompt": True,
        "allowed_token_ids": allowed,
    },
)
print(completion.choices[0].message)
"""


def test_openai_client_extra_body_is_honoured(eagle_server, capsys):
    import openai

    tok = eagle_server.llm.tokenizer
    allowed = sorted({*tok.encode(" Positive negative neutral. The sentiment is", add_special_tokens=False)})
    scope = run_snippet(CLIENT, base_url=eagle_server.url + "/v1", allowed=allowed)
    text = scope["completion"].choices[0].message.content
    assert scope["completion"].usage.completion_tokens == 8  # ignore_eos
    # The same request offline, without speculation (the server's engine belongs to its
    # thread): the server honoured every field, and speculation changed nothing.
    from eagle_zoo import LLM, SamplingParams

    llm = LLM(model=TARGET, max_model_len=256, dtype="float32")
    prompt = llm.apply_chat_template(
        [{"role": "user", "content": "Classify this sentiment: vLLM is wonderful!"}])
    ref = llm.generate([{"prompt": prompt}], SamplingParams(
        temperature=0, max_tokens=8, top_k=20, repetition_penalty=1.1, min_tokens=2, ignore_eos=True,
        allowed_token_ids=allowed))[0].outputs[0]
    assert text == ref.text and set(ref.token_ids) <= set(allowed)
    free = llm.generate([{"prompt": prompt}], SamplingParams(temperature=0, max_tokens=8, top_k=20, ignore_eos=True))
    assert free[0].outputs[0].text != text, "allowed_token_ids changes nothing here: the test would prove nothing"
    assert "ChatCompletionMessage(content=" in capsys.readouterr().out
    assert eagle_server.llm.engine.metrics.num_drafts > 0

    client = openai.OpenAI(base_url=eagle_server.url + "/v1", api_key="EMPTY", max_retries=0)
    for extra, name in (({"guided_choice": ["positive", "negative"]}, "guided_choice"),
                        ({"response_format": {"type": "json_object"}}, "response_format"),
                        ({"use_beam_search": True}, "use_beam_search")):
        with pytest.raises(openai.BadRequestError, match=name) as e:
            client.chat.completions.create(model=TARGET, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2, extra_body=extra)
        assert e.value.body["param"] == name
