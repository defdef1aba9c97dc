"""A fresh head for a target: its config (the flat yuhuili form), weights initialised,
the target's embeddings (and, for EAGLE-1, lm_head) shared and frozen. With
``--init-from`` the initial weights are instead those of an existing head
(load_init_head, then init_from_head).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from ..models.layers import LinearBase, RMSNorm

# Keys of a target config.json that describe the file, not the model.
_DROP = ("_name_or_path", "_model_name_or_path", "transformers_version", "dtype", "torch_dtype", "auto_map",
         "quantization_config")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low / mid / high layers: (2, N//2, N-3) (docs/formats.md), clamped for tiny targets."""
    return [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


def head_config(target_dir: Path, method: str, *, draft_vocab_size: Optional[int] = None,
                aux_layer_ids: Optional[Sequence[int]] = None, num_layers: int = 1) -> dict:
    """The head's flat config.json: the target's, with ``num_layers`` decoder layers (one,
    as published heads have) and the head's keys."""
    if int(num_layers) < 1:
        raise ValueError(f"--head-layers {num_layers}: a head has at least one decoder layer")
    path = Path(target_dir) / "config.json"
    cfg = {k: v for k, v in json.loads(path.read_text()).items() if k not in _DROP}
    archs = cfg.get("architectures") or []
    if not archs:
        raise ValueError(f"{path}: the target config names no architectures; add e.g. [\"LlamaForCausalLM\"]")
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]  # readers on transformers 4 look here
    n_target = cfg["num_hidden_layers"]
    cfg["num_hidden_layers"] = int(num_layers)
    # transformers 5 writes one layer_types entry per target layer (qwen2, qwen3, ...) and
    # refuses a config whose list length differs from num_hidden_layers: let the config
    # class derive the head's list again.
    cfg.pop("layer_types", None)
    if method == "eagle":
        if num_layers != 1:  # its config is a plain target config: one layer is what marks it a head
            raise ValueError(f"--head-layers {num_layers}: an EAGLE-1 head has one decoder layer (loaders tell "
                             f"its plain {archs[0]} config from a model by num_hidden_layers = 1); train eagle3 "
                             f"for a deeper head")
        cfg["architectures"] = [archs[0]]  # yuhuili EAGLE-1: the plain target architecture
        return cfg
    if method != "eagle3":
        raise ValueError(f"method {method!r}: train 'eagle' or 'eagle3'")
    aux = list(aux_layer_ids) if aux_layer_ids else default_aux_layers(n_target)
    bad = [i for i in aux if not 0 <= i < n_target]
    if len(aux) != 3 or bad:
        raise ValueError(f"--aux-layers {aux}: give three layer ids in [0, {n_target}) (low, mid, high)")
    cfg.update(
        architectures=[f"{archs[0]}Eagle3"],  # LlamaForCausalLMEagle3, as yuhuili / SpecForge name it
        draft_vocab_size=int(draft_vocab_size or cfg["vocab_size"]),
        target_hidden_size=cfg["hidden_size"],
        eagle_aux_hidden_state_layer_ids=aux,
        tie_word_embeddings=False,
    )
    return cfg


@torch.no_grad()
def init_weights(module: nn.Module, std: float, generator: torch.Generator) -> None:
    """Linear weights ~ N(0, std), biases 0, norms 1 (the layers are created empty)."""
    for m in module.modules():
        if isinstance(m, LinearBase):
            m.weight.normal_(0.0, std, generator=generator)
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, RMSNorm):
            m.weight.fill_(1.0)


def _config_object(family, flat: dict, method: str):
    """The head's config as the family's transformers config class (heads read settings
    by attribute; extra keys such as draft_vocab_size become attributes). EagleConfig
    only when the family registers no class: eagle_zoo.config needs pydantic, which the
    GPU machines may lack."""
    if family.config_class is not None:
        return family.config_class(**{k: v for k, v in flat.items() if k != "model_type"})
    from ..config.eagle_config import EagleConfig

    return EagleConfig.from_dict(flat, method=method)


def shared_modules(method: str) -> tuple[str, ...]:
    """Modules taken from the target (frozen, never saved by default)."""
    return ("embed_tokens", "lm_head") if method == "eagle" else ("embed_tokens",)


def build_head(family, flat_config: dict, method: str, target: nn.Module, seed: int,
               draft_ids: Optional[torch.Tensor] = None) -> nn.Module:
    head = family.head_class(method)(_config_object(family, flat_config, method))
    generator = torch.Generator().manual_seed(seed)
    init_weights(head, float(flat_config.get("initializer_range") or 0.02), generator)
    shared = shared_modules(method)
    for name in shared:
        setattr(head, name, getattr(target, name))
    if method == "eagle3":
        from .vocab import vocab_maps

        if draft_ids is None:
            draft_ids = torch.arange(head.draft_vocab_size)
        d2t, t2d = vocab_maps(draft_ids, head.vocab_size)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        with torch.no_grad():  # start from the target's own output layer, rows of the draft tokens
            head.lm_head.weight.copy_(target.lm_head.weight[draft_ids.to(target.lm_head.weight.device)].float())
            norm = getattr(target, "norm", None)
            if isinstance(norm, RMSNorm) and norm.weight.shape == head.norm.weight.shape:
                head.norm.weight.copy_(norm.weight.float())
    head.to(target.embed_tokens.weight.device)  # shared modules are already there
    for p in trainable_parameters(head, method).values():
        p.data = p.data.float()  # fp32 master weights; autocast computes in bf16 on CUDA
    return head


def trainable_parameters(head: nn.Module, method: str) -> dict[str, nn.Parameter]:
    shared = shared_modules(method)
    return {n: p for n, p in head.named_parameters() if not n.startswith(shared)}


# Settings of the init head that must equal the training head's (weights of the same
# shape can still mean something else: head split, norm placement). Default: absent.
_SAME_CONFIG = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_hidden_layers", "vocab_size", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                "norm_before_fc", "fc_norm", "norm_output")


def load_init_head(init_from: str, method: str, target: nn.Module):
    """``--init-from``: the head (a directory or a catalog / hub id, any layout
    eagle_zoo.load reads) checked against ``target`` and ``method``, in fp32 on the CPU
    (bf16 files convert exactly). Returns eagle_zoo.load's LoadedHead."""
    from ..loading import load

    try:
        init = load(init_from, target=target, dtype=torch.float32, device="cpu")
    except Exception as exc:  # HeadLoadError, HubError, WeightLoadError: they say what is wrong
        raise ValueError(f"--init-from {init_from}: {exc}") from exc
    if init.method != method:
        names = {"eagle": "EAGLE-1", "eagle3": "EAGLE-3"}
        raise ValueError(
            f"--init-from {init_from} is an {names.get(init.method, init.method)} head ({init.format}) but "
            f"`eagle-zoo train {method}` trains an {names[method]} head: give an {names[method]} head, or run "
            f"`eagle-zoo train {init.method} --init-from {init_from}`")
    return init


@torch.no_grad()
def init_from_head(head: nn.Module, init, method: str, init_from: str, log=print,
                   keep_draft_vocab: bool = False) -> None:
    """Copy the weights (and d2t / t2d) of ``init`` (load_init_head's result) into the
    freshly built training ``head``, exactly, in the head's dtype (fp32). Every tensor
    must match by name and shape; the modules shared with the target (frozen, the
    target's) are not copied. ``keep_draft_vocab`` (EAGLE-3, --reselect-draft-vocab):
    ``head`` keeps its own draft vocabulary (d2t / t2d); its lm_head rows of tokens the
    init head also drafts take the init's trained rows, the others keep theirs (the
    target's, from build_head). A head with more decoder layers than ``init`` grows
    (grown_layers): the init's layers come first, the new ones start as identities."""
    fix = "pass a head trained for this target and these settings, or drop --init-from"
    vocab_keys = ("d2t", "t2d", "lm_head.weight") if keep_draft_vocab else ()
    have_layers = len(init.head.layers)
    new_layers = grown_layers(head, have_layers, init_from)
    for key in _SAME_CONFIG:
        if (keep_draft_vocab and key == "draft_vocab_size") or (key == "num_hidden_layers" and new_layers):
            continue
        want, have = getattr(head.config, key, None), getattr(init.config, key, None)
        if key.startswith(("norm_", "fc_norm")):
            want, have = bool(want), bool(have)
        if want is not None and have is not None and want != have:
            raise ValueError(f"--init-from {init_from}: its config has {key} = {have!r}, the head trained here "
                             f"has {want!r}: {fix}")
    shared = shared_modules(method)
    mine = {k: v for k, v in head.state_dict().items() if not k.startswith(shared) and k not in vocab_keys}
    theirs = {k: v for k, v in init.head.state_dict().items() if not k.startswith(shared) and k not in vocab_keys}
    grown = tuple(f"layers.{i}." for i in new_layers)  # not in the init head: start as identities below
    missing = sorted(k for k in mine.keys() - theirs.keys() if not k.startswith(grown))
    extra = sorted(theirs.keys() - mine.keys())
    shapes = [f"{k} {tuple(theirs[k].shape)} (here {tuple(mine[k].shape)})"
              for k in sorted(mine.keys() & theirs.keys()) if theirs[k].shape != mine[k].shape]
    if missing or extra or shapes:
        raise ValueError(f"--init-from {init_from} does not fit the head trained here: "
                         + "; ".join(f"{what}: {', '.join(names)}" for what, names in
                                     (("missing tensors", missing), ("extra tensors", extra),
                                      ("other shapes", shapes)) if names)
                         + f". {fix}")
    for k, t in mine.items():
        if not k.startswith(grown):
            t.copy_(theirs[k])
    if new_layers:
        for i in new_layers:
            start_as_identity(head.layers[i], f"--head-layers {len(head.layers)}")
        log(f"--init-from {init_from}: {have_layers} decoder layer(s); layers {', '.join(map(str, new_layers))} are "
            f"new and start as identities (zero output projections), so the head starts computing what it computed")
    if keep_draft_vocab:
        _copy_shared_draft_rows(head, init.head, init_from, log)
    own = [m for m in shared if m not in init.shared]  # the checkpoint stores its own copy
    if own:
        log(f"--init-from {init_from}: its own {' and '.join(own)} not used: training shares the target's (frozen)")


def grown_layers(head: nn.Module, init_layers: int, init_from: str) -> list[int]:
    """Indices of ``head``'s decoder layers past the init head's ``init_layers``; a head
    cannot shrink (which layers would go is not ours to guess)."""
    n = len(head.layers)
    if n < init_layers:
        raise ValueError(f"--init-from {init_from} has {init_layers} decoder layers, the head trained here "
                         f"{n}: pass --head-layers {init_layers} or more")
    return list(range(init_layers, n))


# A pre-norm decoder layer adds these projections' outputs to its residual stream: with
# them zero it passes its input through unchanged, and gradients still reach them (their
# inputs are not zero), so the layer learns from there (the zero-init residual trick).
_RESIDUAL_OUTPUTS = ("self_attn.o_proj", "mlp.down_proj")


@torch.no_grad()
def start_as_identity(layer: nn.Module, option: str) -> None:
    modules = dict(layer.named_modules())
    absent = [name for name in _RESIDUAL_OUTPUTS if name not in modules]
    if absent:
        raise ValueError(f"{option}: growing a head needs decoder layers whose residual branches end in "
                         f"{' and '.join(_RESIDUAL_OUTPUTS)}; {type(layer).__name__} has no {', '.join(absent)}: "
                         f"train this family's head with as many layers as --init-from has")
    for name in _RESIDUAL_OUTPUTS:
        for p in modules[name].parameters(recurse=False):
            p.zero_()


def _copy_shared_draft_rows(head: nn.Module, init_head: nn.Module, init_from: str, log=print) -> None:
    """lm_head rows of the tokens both draft vocabularies hold: the init head's. The new
    tokens' rows, the target's so far (build_head), are carried into the init head's
    output space by the linear map that best takes the target's rows of the shared tokens
    to their trained rows (least squares). A trained head's rows drift from the target's,
    so the target's rows as they are give logits on another scale, and new rare tokens
    then win the argmax: the shipped head, reselected, drafted at 0.07 first-step accuracy
    before one step was taken, against 0.85 with its own vocabulary and with the map."""
    weight = head.lm_head.weight
    ids = torch.arange(head.draft_vocab_size) + head.d2t.cpu()  # target ids, ascending
    init_ids = torch.arange(init_head.draft_vocab_size) + init_head.d2t.cpu()
    both = init_head.t2d.cpu()[ids]  # [draft V here]: this token was drafted by the init head too
    rows = torch.searchsorted(init_ids, ids[both])  # its row there (ids ascending in both)
    target_rows = weight.detach().cpu().double()
    trained = init_head.lm_head.weight.detach().cpu().double()[rows]
    new = ~both
    if both.any() and new.any():
        fit = torch.linalg.lstsq(target_rows[both], trained, driver="gelsd").solution  # [H, H]
        weight[new.to(weight.device)] = (target_rows[new] @ fit).to(weight)
    weight[both.to(weight.device)] = trained.to(weight)
    log(f"--init-from {init_from}: {int(both.sum())} of {ids.numel()} draft tokens keep its trained lm_head rows, "
        f"{int(new.sum())} new ones start from the target's, mapped into its space (least squares over the shared rows)")
