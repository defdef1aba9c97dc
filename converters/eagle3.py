"""yuhuili EAGLE-3 <-> speculators eagle3. The tensors are the same; the tables below
say how names and config keys move.

Semantics decided here (see docs/converting.md):
* yuhuili heads add the un-normalized hidden state to the residual, which speculators
  writes as ``norm_before_residual: false`` (its default is true, so it is always
  written explicitly).
* to-yuhuili refuses heads whose flags or tensors yuhuili has no way to express
  (REFUSED_FLAGS, SPECULATORS_ONLY_TENSORS, other speculators_model_types, more than
  one layer): writing them anyway would produce a checkpoint that loads and computes
  something else.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .errors import ConvertError, InexpressibleError
from .plan import Plan
from .source import copyable_files, open_checkpoint, read_config, resolve_dir

# Tensor-name prefixes: yuhuili -> speculators (reversed for to-yuhuili).
RENAMES = (("midlayer.", "layers.0."),)
# yuhuili config keys that live at speculators' top level; everything else is the
# layer config (transformer_layer_config), so no key is lost either way.
TOP_LEVEL_KEYS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
# speculators flags: (value the yuhuili layout implies, speculators default when absent)
REFUSED_FLAGS = {
    "norm_before_residual": (False, True),
    "norm_before_fc": (False, False),
    "fc_norm": (False, False),
    "norm_output": (False, False),
}
SPECULATORS_ONLY_TENSORS = ("input_norm.", "fc_norm.")
# The yuhuili head architecture for a layer model_type (what the yuhuili / SpecForge
# code and vLLM's renaming recognise); --architecture overrides it.
YUHUILI_ARCHITECTURE = {"llama": "LlamaForCausalLMEagle3", "qwen3": "Eagle3Qwen3ForCausalLM"}
REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight")


def _rename(name: str, table) -> str:
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _check_head(src_dir: Path, tensors: dict, prefix: str) -> None:
    missing = [k for k in REQUIRED if k not in tensors]
    if missing or not any(k.startswith(prefix) for k in tensors):
        raise ConvertError(
            f"{src_dir}: not an EAGLE-3 head in this layout (missing {', '.join(missing) or prefix + '*'})"
        )


def to_speculators(src: str, verifier: str, verifier_architectures: Optional[Sequence[str]], speculative_tokens: int) -> Plan:
    src_dir = resolve_dir(src, "head")
    cfg = read_config(src_dir)
    if "speculators_model_type" in cfg:
        raise ConvertError(f"{src_dir}: already a speculators checkpoint ({cfg['speculators_model_type']})")
    if cfg.get("model_type") == "eagle":
        raise ConvertError(f"{src_dir}: a legacy vLLM EAGLE-1 checkpoint; speculators eagle3 holds EAGLE-3 heads only")
    tensors, files = open_checkpoint(src_dir)
    _check_head(src_dir, tensors, "midlayer.")
    if speculative_tokens < 1:
        raise ConvertError(f"--speculative-tokens must be at least 1, got {speculative_tokens}")
    fc, lm_head = tensors["fc.weight"], tensors["lm_head.weight"]
    draft_vocab = cfg.get("draft_vocab_size", lm_head.shape[0])
    if draft_vocab != lm_head.shape[0]:
        raise ConvertError(f"{src_dir}: draft_vocab_size {draft_vocab} but lm_head.weight has {lm_head.shape[0]} rows")
    if fc.shape[1] % 3:
        raise ConvertError(f"{src_dir}: fc.weight {list(fc.shape)} is not [hidden, 3 * target_hidden]")
    target_hidden = cfg.get("target_hidden_size") or fc.shape[1] // 3

    layer = {k: v for k, v in cfg.items() if k not in TOP_LEVEL_KEYS and k != "architectures"}
    if verifier_architectures is not None and (not verifier_architectures
                                               or not all(a.strip() for a in verifier_architectures)):
        raise ConvertError(f"--verifier-architectures {' '.join(map(repr, verifier_architectures))}: give the "
                           f"target's architecture names (e.g. LlamaForCausalLM), or leave it out to read them")
    archs = list(verifier_architectures or _verifier_architectures(verifier, cfg))
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": target_hidden,
        "norm_before_residual": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "verifier": {"name_or_path": verifier, "architectures": archs},
        },
    }
    if "eagle_aux_hidden_state_layer_ids" in cfg:
        config["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    if "torch_dtype" in cfg:
        config["torch_dtype"] = cfg["torch_dtype"]
    out = [t.renamed(_rename(n, RENAMES)) for n, t in tensors.items()]
    notes = [
        "speculators eagle3 (architectures Eagle3Speculator)",
        "norm_before_residual false (yuhuili semantics)",
        f"draft_vocab_size {draft_vocab}, target_hidden_size {target_hidden}",
        f"verifier {verifier} {archs}, {speculative_tokens} speculative tokens",
        f"original config (less {', '.join(k for k in ('architectures',) + TOP_LEVEL_KEYS if k in cfg)}) -> transformer_layer_config",
    ]
    copies, skipped = copyable_files(src_dir, files, keep_config=False)
    return Plan("to-speculators", src_dir, [out], [], config, notes, copies, skipped)


def _verifier_architectures(verifier: str, cfg: dict) -> list[str]:
    """The verifier's own config when it is a local directory; else the head's
    architecture with the Eagle3 marker removed (LlamaForCausalLMEagle3 -> LlamaForCausalLM)."""
    vcfg = read_config(Path(verifier), required=False) if Path(verifier).is_dir() else None
    if vcfg and vcfg.get("architectures"):
        return list(vcfg["architectures"])
    archs = [a.removeprefix("Eagle3").removesuffix("Eagle3") for a in cfg.get("architectures", [])]
    if not archs:
        raise ConvertError("the head's config has no architectures; pass --verifier-architectures")
    return archs


def _check_head_architecture(architecture: str) -> None:
    """--architecture must name a head some installed family loads: a head written under
    any other name would convert but never load."""
    from eagle_zoo.config.eagle_config import rename_architecture
    from eagle_zoo.plugins import get_registry

    known = get_registry().head_architectures
    if rename_architecture(architecture, "eagle3") not in known:
        eagle3 = sorted(a for a, (_, method) in known.items() if method == "eagle3")
        raise ConvertError(f"--architecture {architecture}: no installed family loads an EAGLE-3 head of this "
                           f"architecture; give one of {', '.join(eagle3)} (the names with or without Eagle3)")


def to_yuhuili(src: str, architecture: Optional[str]) -> Plan:
    src_dir = resolve_dir(src, "head")
    cfg = read_config(src_dir)
    kind = cfg.get("speculators_model_type")
    if kind is None:
        raise ConvertError(f"{src_dir}: not a speculators checkpoint (config has no speculators_model_type)")
    if kind != "eagle3":
        raise InexpressibleError(
            f"{src_dir}: speculators_model_type {kind!r}; the yuhuili layout holds plain eagle3 heads only "
            f"({'parallel drafting has no yuhuili equivalent' if kind == 'peagle' else 'no yuhuili equivalent'})"
        )
    for flag, (implied, default) in REFUSED_FLAGS.items():
        value = cfg.get(flag, default)
        if value != implied:
            absent = " (the speculators default when the key is absent)" if flag not in cfg else ""
            raise InexpressibleError(
                f"{src_dir}/config.json: {flag} is {value}{absent}; yuhuili EAGLE-3 heads compute "
                f"{flag} = {implied} and cannot express anything else. Use this head in the "
                f"speculators format (eagle-zoo and vLLM load it as it is)"
            )
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConvertError(f"{src_dir}/config.json: transformer_layer_config must be an object")
    tensors, files = open_checkpoint(src_dir)
    _check_head(src_dir, tensors, "layers.0.")
    extra = sorted(n for n in tensors if n.startswith(SPECULATORS_ONLY_TENSORS) or (n.startswith("layers.") and not n.startswith("layers.0.")))
    if extra:
        raise InexpressibleError(f"{src_dir}: tensor {extra[0]!r} has no place in the yuhuili layout (one midlayer, no input/fc norms)")

    arch = architecture or YUHUILI_ARCHITECTURE.get(layer.get("model_type"))
    if arch is None:
        raise ConvertError(
            f"{src_dir}: no default yuhuili architecture for layer model_type {layer.get('model_type')!r}; "
            f"pass --architecture (e.g. LlamaForCausalLMEagle3)"
        )
    if architecture is not None:
        _check_head_architecture(architecture)
    config = dict(layer, architectures=[arch], draft_vocab_size=cfg.get("draft_vocab_size", tensors["lm_head.weight"].shape[0]))
    target_hidden = cfg.get("target_hidden_size")
    if target_hidden and target_hidden != layer.get("hidden_size"):
        config["target_hidden_size"] = target_hidden
    if "eagle_aux_hidden_state_layer_ids" in cfg:
        config["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    reverse = tuple((new, old) for old, new in RENAMES)
    out = [t.renamed(_rename(n, reverse)) for n, t in tensors.items()]
    known = {"architectures", "speculators_model_type", "transformer_layer_config", "torch_dtype", *TOP_LEVEL_KEYS, *REFUSED_FLAGS}
    dropped_keys = sorted(k for k in cfg if k not in known)
    notes = [f"transformer_layer_config + architectures [{arch}], draft_vocab_size {config['draft_vocab_size']}"]
    if dropped_keys:
        notes.append(f"dropped keys yuhuili has no place for: {', '.join(dropped_keys)}")
    copies, skipped = copyable_files(src_dir, files, keep_config=False)
    return Plan("to-yuhuili", src_dir, [out], [], config, notes, copies, skipped)
