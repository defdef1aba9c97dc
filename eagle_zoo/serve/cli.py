"""`eagle-zoo serve MODEL`: the OpenAI-compatible server (docs/serving.md)."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from .. import envs
from .limits import DEFAULT_MAX_PROMPTS_PER_REQUEST, DEFAULT_MAX_REQUEST_BYTES, ServerLimits

API_KEY_ENV = envs.API_KEY


def tcp_port(value: str) -> int:
    """--port's type: checked when parsed, before the model loads (a bind error came after)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535)")
    return port


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="target model: a hub id, a local directory, or 'default' (SmolLM2-135M-Instruct)")
    p.add_argument("--speculative-config", metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\' '
                        "or '{\"model\": \"<eagle head>\"}' (docs/speculative-config.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=tcp_port, default=8000, help="TCP port (default 8000)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                   help="shard the target over N GPUs of this host (default 1; docs/tensor-parallel.md)")
    p.add_argument("--max-num-seqs", type=int, help="requests decoded together (default 64 on CUDA, 8 on CPU)")
    p.add_argument("--max-model-len", type=int, help="context length: prompt + output (default min(model's, 2048))")
    p.add_argument("--api-key", default=envs.api_key(),
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default ${API_KEY_ENV})")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="names clients use for the model (default: MODEL); the first is reported")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--seed", type=int, default=0, help="the engine's random seed, as LLM(seed=...) (default 0)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before the previous one is read back (greedy requests; "
                        "README, engine options); default: on for a CUDA device, off on the CPU and with "
                        "tensor parallelism; also EAGLE_ZOO_ASYNC_SCHEDULING=0/1")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, metavar="N",
                   help="largest request body accepted; a larger one gets 413 "
                        f"(default {DEFAULT_MAX_REQUEST_BYTES} = 8 MiB)")
    p.add_argument("--max-prompts-per-request", type=int, default=DEFAULT_MAX_PROMPTS_PER_REQUEST, metavar="N",
                   help="most prompts one /v1/completions request may hold; more get 400 "
                        f"(default {DEFAULT_MAX_PROMPTS_PER_REQUEST})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log verbosity (default info)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or id (default: the model's)")
    p.add_argument("--revision", default=None, help="the model's hub revision")
    p.add_argument("--download-dir", default=None, metavar="DIR",
                   help="the Hugging Face cache directory hub ids are read from and downloaded to, as LLM("
                        "download_dir=...) (default: huggingface_hub's, HF_HUB_CACHE / HF_HOME)")
    p.add_argument("--hf-token", default=None, metavar="TOKEN",
                   help="the token for gated or private hub repos, as LLM(hf_token=...) (default: HF_TOKEN or "
                        "the `hf auth login` one)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs, as LLM(enforce_eager=True)")
    p.add_argument("--max-logprobs", type=int, default=20, metavar="N",
                   help="the most logprobs / top_logprobs / prompt_logprobs a request may ask for, as LLM("
                        "max_logprobs=...) (default 20, as vLLM; -1: the vocabulary size)")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template, or a file holding one, used instead of the tokenizer's")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="let chat requests bring their own chat_template (default: refused with a 400, as vLLM)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic 'SpecDecoding metrics' log lines (default: one every "
                        "--log-stats-interval seconds while drafting happens)")
    p.add_argument("--log-stats-interval", type=float, default=10.0, metavar="S",
                   help="seconds between 'SpecDecoding metrics' log lines (default 10)")
    p.add_argument("--uvicorn-log-level", default=None,
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="uvicorn's own log level (default: --log-level)")
    from ..engine.engine_args import add_cli_arguments

    add_cli_arguments(p, taken=lambda flag: flag in p._option_string_actions)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        import uvicorn
    except ImportError:
        return _fail("the server needs the 'serve' extra: pip install 'eagle-zoo[serve]'")
    spec = None
    if args.speculative_config:
        try:
            spec = json.loads(args.speculative_config)
        except json.JSONDecodeError as exc:
            return _fail(f"--speculative-config is not valid JSON ({exc}); "
                         'example: --speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\'')
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logging.warning("binding to %s without --api-key: anyone who can reach it can use it", args.host)

    from ..engine.engine_args import from_cli
    try:
        limits = ServerLimits(max_request_bytes=args.max_request_bytes,
                              max_prompts_per_request=args.max_prompts_per_request)
    except ValueError as exc:
        return _fail(str(exc).replace("ServerLimits.", "--").replace("_", "-"))

    from ..engine.llm import LLM
    from .app import create_app

    # A bad model, head or option: eagle_zoo/cli.py prints the error as one line, exit code 2.
    llm = LLM(args.model, spec, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, seed=args.seed, tensor_parallel_size=args.tensor_parallel_size,
              async_scheduling=args.async_scheduling, tokenizer=args.tokenizer, revision=args.revision,
              download_dir=args.download_dir, hf_token=args.hf_token,
              enforce_eager=args.enforce_eager, max_logprobs=args.max_logprobs, **from_cli(args))
    if args.chat_template is not None:
        try:
            llm.tokenizer.chat_template = chat_template(args.chat_template)
        except (OSError, ValueError) as exc:
            return _fail(str(exc))
    logging.getLogger("eagle_zoo.serve").info("%s", startup_line(llm))
    app = create_app(llm, served_model_names=args.served_model_name or [args.model], api_key=args.api_key,
                     limits=limits, trust_request_chat_template=args.trust_request_chat_template,
                     log_stats_interval_s=None if args.disable_log_stats else args.log_stats_interval)
    # On Ctrl-C open streams get a few seconds, then the engine fails what is left.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level or args.log_level,
                timeout_graceful_shutdown=5)
    return 0


def startup_line(llm) -> str:
    """What is served: target, draft, method and why that method (inferred or given)."""
    spec = llm.speculative_config
    target = f"target {llm.model_path}"
    if spec is None:
        return f"serving {target}, no speculative decoding"
    why = f"inferred: {spec.inferred_from}" if spec.inferred_from else "given in --speculative-config"
    if spec.method == "ngram":
        draft = f"prompt lookup (n-grams of {spec.prompt_lookup_min}..{spec.prompt_lookup_max} tokens)"
    else:
        draft = spec.model if spec.model is not None else "the target's own MTP layers"
    return (f"serving {target}, draft {draft}, method {spec.method} ({why}), "
            f"num_speculative_tokens {getattr(llm.engine, 'k', spec.num_speculative_tokens)}")


def chat_template(value: str) -> str:
    """--chat-template: a file's text when ``value`` names a file, else the template itself."""
    from pathlib import Path

    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:
        raise ValueError(f"--chat-template {value}: no such file, and not a Jinja template (no '{{'): "
                         f"give the path of a template file or the template text")
    return value


def _fail(message: str) -> int:
    print(f"eagle-zoo serve: error: {message}", file=sys.stderr)
    return 2
