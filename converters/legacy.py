"""yuhuili EAGLE-1 head -> the layout vLLM < 0.7 loaded (its documented recipe):
weights unchanged plus the target's ``lm_head.weight``, saved as model.safetensors;
config wrapped as {"model_type": "eagle", "model": <original>, ...}.

Only the target's lm_head (or, for targets that tie embeddings, its embed_tokens) is
read: its shard's header, then that one tensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import ConvertError
from .plan import Plan
from .source import copyable_files, open_checkpoint, open_one, read_config, resolve_dir

# Tensors the head must hold, and those dropped (not weights: recomputed at load).
REQUIRED = ("embed_tokens.weight", "fc.weight")
DROPPED = {"rotary_emb.inv_freq": "rotary cache saved by transformers 4.28; recomputed at load"}
# Where a Hugging Face target keeps its output projection; the tied fallback.
LM_HEAD = "lm_head.weight"
EMBED_SUFFIX = "embed_tokens.weight"


def plan(src: str, target: str) -> Plan:
    src_dir = resolve_dir(src, "head")
    cfg = read_config(src_dir)
    _refuse_other_layouts(src_dir, cfg)
    tensors, files = open_checkpoint(src_dir)
    missing = [k for k in REQUIRED if k not in tensors]
    if missing or not any(k.startswith("layers.0.") for k in tensors):
        raise ConvertError(
            f"{src_dir}: not a yuhuili EAGLE-1 head (missing {', '.join(missing) or 'layers.0.*'}); "
            f"expected embed_tokens, fc and layers.0.* tensors"
        )
    if LM_HEAD in tensors:
        raise ConvertError(f"{src_dir}: already has {LM_HEAD}; legacy conversion adds the target's, pass the original head")
    V, H = _size(cfg, "vocab_size", src_dir), _size(cfg, "hidden_size", src_dir)
    _expect(tensors["embed_tokens.weight"].shape, (V, H), src_dir, "embed_tokens.weight")
    _expect(tensors["fc.weight"].shape, (H, 2 * H), src_dir, "fc.weight")

    lm_head = _target_lm_head(target, V, H)
    kept, dropped = [], []
    for name, t in tensors.items():
        why = next((w for pat, w in DROPPED.items() if pat in name), None)
        (dropped.append((t, why)) if why else kept.append(t))
    config = {"model_type": "eagle", "model": cfg, "truncated_vocab_size": V}
    notes = [f'wrapped as {{"model_type": "eagle", "model": <original>}}', f"truncated_vocab_size {V}"]
    if "fc.bias" in tensors:
        config["eagle_fc_bias"] = True
        notes.append("eagle_fc_bias true (the head has fc.bias)")
    copies, skipped = copyable_files(src_dir, files, keep_config=False)
    return Plan("legacy", src_dir, [kept + [lm_head]], dropped, config, notes, copies, skipped)


def _refuse_other_layouts(src_dir: Path, cfg: dict) -> None:
    if cfg.get("model_type") == "eagle" and isinstance(cfg.get("model"), dict):
        raise ConvertError(f"{src_dir}: already in the legacy vLLM layout (config model_type 'eagle'); nothing to do")
    if "speculators_model_type" in cfg or "draft_vocab_size" in cfg:
        raise ConvertError(
            f"{src_dir}: an EAGLE-3 head (config has "
            f"{'speculators_model_type' if 'speculators_model_type' in cfg else 'draft_vocab_size'}); "
            f"vLLM < 0.7 only ran EAGLE-1 heads, and current stacks load EAGLE-3 heads as published"
        )


def _size(cfg: dict, key: str, where: Path) -> int:
    value = cfg.get(key, (cfg.get("text_config") or {}).get(key))
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConvertError(f"{where}/config.json: {key!r} must be a positive integer, got {value!r}")
    return value


def _expect(shape, expected, where: Path, name: str) -> None:
    if tuple(shape) != tuple(expected):
        raise ConvertError(f"{where}: {name} has shape {list(shape)}, expected {list(expected)} from config.json")


def _target_lm_head(target: str, V: int, H: int):
    """The target's output projection as a lazy tensor named lm_head.weight."""
    tdir = resolve_dir(target, "target")
    tcfg = read_config(tdir)
    tV, tH = _size(tcfg, "vocab_size", tdir), _size(tcfg, "hidden_size", tdir)
    if (tV, tH) != (V, H):
        raise ConvertError(
            f"target {tdir} does not match the head: target vocab_size {tV}, hidden_size {tH}; "
            f"head vocab_size {V}, hidden_size {H}. Pass the target the head was trained for "
            f"(an EAGLE-1 head's hidden and vocab sizes are its target's)"
        )
    from eagle_zoo.checkpoints.tensors import tensor_names

    names = tensor_names(tdir)
    name: Optional[str] = LM_HEAD if LM_HEAD in names else None
    if name is None:
        tied = tcfg.get("tie_word_embeddings", (tcfg.get("text_config") or {}).get("tie_word_embeddings", True))
        embeds = [n for n in names if n.endswith(EMBED_SUFFIX)]
        if not tied or len(embeds) != 1:
            raise ConvertError(
                f"target {tdir}: no {LM_HEAD}"
                + (" and tie_word_embeddings is false" if not tied else f" and {len(embeds)} tensors named *{EMBED_SUFFIX}")
                + "; pass the full target checkpoint (the head uses the target's lm_head)"
            )
        name = embeds[0]
    t = open_one(tdir, name)
    if tuple(t.shape) != (V, H):
        raise ConvertError(f"target {tdir}: {name} has shape {list(t.shape)}, expected [{V}, {H}] (vocab_size, hidden_size)")
    return t.renamed(LM_HEAD)
