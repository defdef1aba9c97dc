"""Tensor parallelism on the CPU: gloo, two processes, fp32 (engine/parallel.py).

Greedy outputs with tensor_parallel_size=2 equal transformers' own greedy decoding
(the independent reference) and the engine's TP 1 outputs, token for token, and the
speculative counters equal TP 1's (so the drafts were the same):
  - workers started by the engine itself (this pytest process is rank 0): plain
    decoding with requests joining and leaving mid-flight from another thread (as the
    server's engine thread does), EAGLE with draft TP 1 (the head whole on every rank,
    using the target's sharded embedding / lm_head) and EAGLE-3 with draft TP 2, ngram;
  - the same LLM call in a script under `torchrun --nproc-per-node 2`: every registered
    family (MLA, MoE, per-head q/k norms, sliding windows), kv heads replicated (fewer kv
    heads than ranks), a vocabulary that does not divide (padded shards), EAGLE with
    draft TP 2 and EAGLE-3 with draft TP 1, and seeded random sampling (ranks agree).
Every error case the issue names is raised before any process starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.config.speculative import SpeculativeConfigError
from eagle_zoo.engine import parallel
from eagle_zoo.models import parallel_state as ps

pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is needed"),
              pytest.mark.usefixtures("one_thread")]

VOCAB = cf.TINY["vocab_size"]
PROMPTS = ef.random_prompts((7, 12, 4, 9), VOCAB, seed=11)
MAX_TOKENS = [14, 10, 16, 12]
MAX_MODEL_LEN = 64
MAX_NUM_SEQS = 2  # < number of prompts: requests join and leave between steps
K = 3
SCRIPT = Path(__file__).with_name("tp_script.py")


def llama_kind() -> ef.TargetKind:
    return ef.TargetKind("llama", "llama", "LlamaForCausalLM")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A bigram-like Llama target (drafts get accepted), an EAGLE-1 head that predicts
    it, a random EAGLE-3 head, and transformers' greedy continuations."""
    root = tmp_path_factory.mktemp("tp")
    target = ef.write_target(root / "target", llama_kind(), edit=ef.bigram_edit())
    return {
        "root": root,
        "target": target,
        "eagle": ef.write_bigram_eagle_head(root / "eagle", target),
        "eagle3": write_bigram_eagle3_head(root / "eagle3", target),
        "hf": ef.hf_greedy(target, PROMPTS, MAX_TOKENS),
    }


def write_bigram_eagle3_head(directory, target_dir) -> Path:
    """An EAGLE-3 head whose first draft is often right for the bigram target. At
    position i the head reads the target's aux states (about embed(x_i) in a bigram
    target) and must predict x_{i+2} = g(g(x_i)) (g: the target's next token from the
    token alone). Attention and MLP add nothing, norm and lm_head are the target's
    (final norm weight 1, draft vocab = the whole vocab, d2t = 0), and fc maps embed(x)
    by least squares onto lm_head row g(g(x)): most first drafts hit, later ones rarely."""
    from safetensors.torch import load_file, save_file

    directory = ef.write_head(directory, llama_kind(), "eagle3", seed=4, draft_vocab=VOCAB)
    target = load_file(str(Path(target_dir) / "model.safetensors"))
    w = load_file(str(directory / "model.safetensors"))
    H = cf.TINY["hidden_size"]
    embed, lm_head = target["model.embed_tokens.weight"], target["lm_head.weight"]
    normed = embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + cf.TINY["rms_norm_eps"])
    g = (normed @ lm_head.T).argmax(-1)
    fit = torch.linalg.lstsq(embed, lm_head[g[g]]).solution  # embed @ fit ~ lm_head[g(g(x))]
    w["fc.weight"] = torch.cat([fit.T, torch.zeros(H, 2 * H)], 1)
    w["midlayer.self_attn.o_proj.weight"].zero_()
    w["midlayer.mlp.down_proj.weight"].zero_()
    w["norm.weight"].fill_(1.0)
    w["lm_head.weight"] = target["lm_head.weight"].clone()
    save_file(w, str(directory / "model.safetensors"))
    return directory


def spec_for(models, name: str):
    return {
        "plain": None,
        "eagle-dtp1": {"model": str(models["eagle"]), "num_speculative_tokens": K, "draft_tensor_parallel_size": 1},
        "eagle-dtp2": {"model": str(models["eagle"]), "num_speculative_tokens": K, "draft_tensor_parallel_size": 2},
        "eagle3-dtp1": {"model": str(models["eagle3"]), "num_speculative_tokens": K, "draft_tensor_parallel_size": 1},
        "eagle3-dtp2": {"model": str(models["eagle3"]), "num_speculative_tokens": K},  # default: the target's TP
        "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    }[name]


def greedy(max_tokens):
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]


def make_llm(target, spec, tp: int, **kwargs):
    if tp == 1 and spec:  # the TP 1 reference of a draft-TP case: the draft runs whole anyway
        spec = {k: v for k, v in spec.items() if k != "draft_tensor_parallel_size"}
    return LLM(str(target), spec, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN,
               max_num_seqs=MAX_NUM_SEQS, tensor_parallel_size=tp, **kwargs)


def generate(llm, prompts=PROMPTS, max_tokens=MAX_TOKENS):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens))
    m = llm.engine.metrics
    counters = [m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, list(m.num_accepted_tokens_per_pos)]
    return [o.outputs[0].token_ids for o in outs], counters


def stop(llm) -> None:
    """Shut the workers down and check they exited cleanly and nothing is left behind."""
    procs = list(llm.parallel.pool.procs)
    llm.shutdown()
    assert [p.returncode for p in procs] == [0] * len(procs)
    assert not dist.is_initialized()
    assert ps.get_tp() == ps.SINGLE


def draft_tp_sizes(llm) -> tuple[int, int]:
    """(tp size of the head's own layers, tp size of the lm_head it uses)."""
    head = llm.engine.proposer.head
    return head.layers[0].self_attn.qkv_proj.tp_size, head.lm_head.tp_size


# -- workers started by the engine (this process is rank 0) ----------------------------
@pytest.mark.usefixtures("cpu_drafts_always_k")  # counters compared with paths that draft K
@pytest.mark.parametrize("name", ["plain", "eagle-dtp1", "eagle3-dtp2", "ngram"])
def test_engine_started_workers_match_tp1_and_transformers(models, name):
    spec = spec_for(models, name)
    want_tokens, want_counters = generate(make_llm(models["target"], spec, tp=1))
    assert want_tokens == models["hf"]
    if name != "plain":
        assert want_counters[2] > 0, "no draft was ever accepted: the comparison would prove little"

    llm = make_llm(models["target"], spec, tp=2)
    try:
        assert llm.parallel.launcher == "spawn" and llm.engine.target.lm_head.tp_size == 2
        if name == "eagle-dtp1":  # the head whole on every rank, the target's lm_head sharded
            assert draft_tp_sizes(llm) == (1, 2)
        if name == "eagle3-dtp2":  # sharded like the target, its own draft-vocab lm_head too
            assert draft_tp_sizes(llm) == (2, 2)
        tokens, counters = generate(llm)
        assert tokens == want_tokens
        assert counters == want_counters
    finally:
        stop(llm)


def _mid_flight(engine) -> dict:
    """Requests join, run and are aborted between steps, driven from another thread
    (the server's engine thread does the same)."""
    seqs, params = {}, greedy([20])[0]

    def drive():
        seqs["a"] = engine.add_request(PROMPTS[0], params, request_id="a")
        seqs["b"] = engine.add_request(PROMPTS[1], params, request_id="b")
        for _ in range(3):
            engine.step()
        seqs["c"] = engine.add_request(PROMPTS[2], params, request_id="c")
        try:  # a rejected request must not put the ranks out of step
            engine.add_request(PROMPTS[3] * 10, params, request_id="too-long")
        except ValueError:
            pass
        engine.step()
        engine.abort("b")
        seqs["d"] = engine.add_request(PROMPTS[3], params, request_id="d")
        while engine.has_unfinished():
            engine.step()

    thread = threading.Thread(target=drive)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    return {rid: list(s.output_token_ids) for rid, s in seqs.items()}


def test_requests_joining_and_leaving_mid_flight(models):
    want = _mid_flight(make_llm(models["target"], None, tp=1).engine)
    assert 0 < len(want["b"]) < 20 and all(len(want[r]) == 20 for r in "acd")
    llm = make_llm(models["target"], None, tp=2, distributed_executor_backend="mp")
    try:
        assert _mid_flight(llm.engine) == want
        # The ranks are still in step: a later generate() agrees too.
        assert generate(llm, PROMPTS[:2], MAX_TOKENS[:2])[0] == models["hf"][:2]
    finally:
        stop(llm)


def tp_worker_children() -> list[int]:
    """Process ids of this process's children that are tensor-parallel workers."""
    pids = []
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        pids += [int(p) for p in children.read_text().split()]
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"eagle_zoo.engine.tp_worker" in cmdline:
            found.append(pid)
    return found


def test_draft_that_does_not_split_stops_the_workers(models, tmp_path):
    """The error comes from building the head (after the workers started): it names the
    option, the workers are stopped and the next tensor-parallel LLM starts normally."""
    head = cf.write_yuhuili_eagle(tmp_path / "head", fc_bias=False, kind="safetensors", intermediate_size=67).path
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": K, "draft_tensor_parallel_size": 2}
    with pytest.raises(parallel.TensorParallelError,
                       match=r"speculative_config.draft_tensor_parallel_size=2: the draft .* 67 is not divisible"):
        make_llm(models["target"], spec, tp=2)
    assert not dist.is_initialized() and parallel._active_driver is None
    if Path("/proc").is_dir():
        assert tp_worker_children() == []


# -- torchrun: the user's script on every rank ---------------------------------------------
@pytest.mark.usefixtures("cpu_drafts_always_k")  # counters compared with paths that draft K
def test_torchrun_every_family_and_draft_tp(models):
    root = models["root"] / "torchrun"
    jobs, want = {}, {}

    def job(name, target, prompts, max_tokens, spec=None, **extra):
        jobs[name] = dict(target=str(target), prompts=prompts, max_tokens=max_tokens, spec=spec,
                          max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, **extra)

    plain_prompts, plain_max = ef.random_prompts((7, 12, 4), 125, seed=12), [8, 6, 9]  # ids < 125
    for param in ef.family_params():
        kind = param.values[0]
        if kind is None:
            continue
        target = ef.write_target(root / kind.model_type, kind, seed=5)
        job(f"plain-{kind.family}", target, plain_prompts, plain_max)
        want[f"plain-{kind.family}"] = ef.hf_greedy(target, plain_prompts, plain_max)
    # One kv head for two ranks (replicated) and a vocabulary of 125 (shards of 63, padded).
    for name, overrides in (("kv-heads-1", {"num_key_value_heads": 1}), ("vocab-125", {"vocab_size": 125})):
        target = ef.write_target(root / name, llama_kind(), seed=6, **overrides)
        job(name, target, plain_prompts, plain_max)
        want[name] = ef.hf_greedy(target, plain_prompts, plain_max)
    for name in ("eagle-dtp2", "eagle3-dtp1"):
        spec = spec_for(models, name)
        job(name, models["target"], PROMPTS, MAX_TOKENS, spec)
        want[name] = generate(make_llm(models["target"], spec, tp=1))
    # The sampling of vLLM's speculative-decoding examples: both ranks must draw the same tokens.
    job("sampled", models["target"], PROMPTS, MAX_TOKENS, spec_for(models, "eagle3-dtp1"),
        sampling={"temperature": 0.8, "top_p": 0.95}, seed=3)

    (root / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that aborts reports its Python stacks
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), str(root / "jobs.json"), str(root)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    rank0, rank1 = (json.loads((root / f"rank{r}.json").read_text()) for r in (0, 1))
    # The engine's exit handler destroyed the process group and its gloo threads with it:
    # threads left to the interpreter's own exit can abort the rank after its work is done.
    assert [json.loads((root / f"threads-rank{r}.json").read_text()) for r in (0, 1)] == [[], []]
    assert rank0 == rank1  # every rank computed the same tokens, sampled ones included
    for name, expected in want.items():
        got = rank0[name]
        if name.startswith(("plain-", "kv-", "vocab-")):
            assert got["tokens"] == expected, name
        else:  # TP 1's tokens (= transformers' greedy) and its counters
            assert got["tokens"] == models["hf"], name
            assert [got["tokens"], got["counters"]] == [expected[0], expected[1]], name


# -- errors: all raised before a process is started ----------------------------------------
def test_heads_that_do_not_divide(models):
    with pytest.raises(parallel.TensorParallelError,
                       match=r"tensor_parallel_size=3 does not divide the target model's num_attention_heads=4"):
        make_llm(models["target"], None, tp=3)


@pytest.mark.parametrize("key, value, tp, match", [
    ("num_key_value_heads", 3, 2, r"num_key_value_heads=3 .* divide the kv heads or be a multiple"),
    ("intermediate_size", 66, 4, r"does not divide the target model's intermediate_size=66"),
])
def test_config_sizes_that_do_not_divide(tmp_path, key, value, tp, match):
    # Only config.json is read: the check runs before any weight is loaded.
    cf.write_config(tmp_path, cf.llama_config(2, **{"num_attention_heads": 12, "hidden_size": 96, "head_dim": 8, key: value}))
    with pytest.raises(parallel.TensorParallelError, match=match):
        LLM(str(tmp_path), device="cpu", tensor_parallel_size=tp)


@pytest.mark.parametrize("tp, draft_tp", [(2, 3), (1, 2)])
def test_draft_tp_other_than_1_or_the_targets(models, tp, draft_tp):
    spec = {"model": str(models["eagle"]), "draft_tensor_parallel_size": draft_tp}
    with pytest.raises(SpeculativeConfigError, match=rf"draft_tensor_parallel_size={draft_tp} .* use 1 or {tp}"):
        LLM(str(models["target"]), spec, device="cpu", tensor_parallel_size=tp)


def test_pipeline_parallel_with_speculation(models):
    with pytest.raises(SpeculativeConfigError, match="speculative decoding does not combine with pipeline parallelism"):
        LLM(str(models["target"]), spec_for(models, "ngram"), device="cpu", tensor_parallel_size=2,
            pipeline_parallel_size=2)


def test_pipeline_parallel_alone(models):
    with pytest.raises(parallel.TensorParallelError, match="pipeline parallelism is not supported .* tensor_parallel_size"):
        LLM(str(models["target"]), device="cpu", pipeline_parallel_size=2)


def test_more_ranks_than_gpus(models, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(parallel.TensorParallelError,
                       match=r"tensor_parallel_size=2 needs 2 GPUs on this host, one per rank, but 1 is visible "
                             r"\(CUDA_VISIBLE_DEVICES=0\)"):
        LLM(str(models["target"]), device="cuda", tensor_parallel_size=2)


def test_torchrun_world_size_must_equal_tp(models, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(parallel.TensorParallelError, match="torchrun started 4 processes but tensor_parallel_size=2"):
        make_llm(models["target"], None, tp=2)
    assert not dist.is_initialized()


@pytest.mark.parametrize("kwargs, match", [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1, got 0"),
    ({"tensor_parallel_size": "2"}, "tensor_parallel_size must be an integer >= 1, got '2'"),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}, "distributed_executor_backend='ray' is not supported"),
    ({"tensor_parallel_size": 2, "distributed_executor_backend": "external_launcher"}, "not started by torchrun"),
])
def test_bad_options(models, kwargs, match):
    with pytest.raises(parallel.TensorParallelError, match=match):
        LLM(str(models["target"]), device="cpu", **kwargs)
