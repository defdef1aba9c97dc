"""EAGLE-1 and EAGLE-3 draft heads, generic over a model family.

A family file subclasses a head and sets class attributes only:

    class LlamaEagleHead(EagleHead):
        decoder_layer_cls = LlamaDecoderLayer      # cls(config, layer_idx)
        weight_mapping = LLAMA_MAPPING

    class LlamaEagle3Head(Eagle3Head):
        attention_cls = LlamaAttention             # cls(config, layer_idx, input_size)
        mlp_cls = LlamaMLP                         # cls(config)
        decoder_layer_cls = LlamaDecoderLayer      # layers after the first, if any
        weight_mapping = LLAMA_MAPPING

Family modules follow one calling convention: attention ``forward(positions, x)``,
MLP ``forward(x)``, decoder layer ``forward(positions, h) -> h`` (residuals inside)
with submodules ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
``mlp``. ``make_norm(config, size)`` builds the family's norm (RMSNorm by default).

Settings are read by attribute from the config (an EagleConfig, whose attribute
access falls back to the inner transformers config, or any object with the fields).
"""
from __future__ import annotations

from typing import Any, ClassVar, Iterable, Mapping, Optional, Union

import torch
from torch import nn

from ..kernels.linear import fused_linear_triton, use_linear_kernel
from ..kernels.top_k import argmax_rows, log_softmax_top_k
from ..specs import WeightMapping
from .fused_layer import eagle3_layer_supports_fusion, fused_eagle3_layer
from .layers import ParallelLMHead, ReplicatedLinear, RMSNorm, VocabParallelEmbedding
from .loader import load_weights

Weights = Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


def cfg(config: Any, key: str, default: Any = None) -> Any:
    """config.key, or ``default`` when absent or None."""
    value = getattr(config, key, None)
    return default if value is None else value


def rms_norm(config: Any, size: int) -> nn.Module:
    return RMSNorm(size, cfg(config, "rms_norm_eps", 1e-6))


def _full_shape(module: nn.Module) -> tuple:
    if hasattr(module, "num_embeddings"):  # vocab-parallel (or plain) embedding / lm head
        return (module.num_embeddings, module.embedding_dim)
    return tuple(module.weight.shape)


class HeadNeedsTargetError(RuntimeError):
    """A head loaded without its target was run before the target's modules were given."""


class NeedsTarget(nn.Module):
    """Stands in for a module a head shares with its target (``embed_tokens`` /
    ``lm_head``) when the head was loaded without one; running it raises an error that
    says what to pass. ``share_from_target`` replaces it (its shape is the one expected)."""

    def __init__(self, name: str, num_embeddings: int, embedding_dim: int, source: str):
        super().__init__()
        self.name, self.num_embeddings, self.embedding_dim, self.source = name, num_embeddings, embedding_dim, source

    def _missing(self) -> HeadNeedsTargetError:
        return HeadNeedsTargetError(
            f"{self.source}: the head has no {self.name}.weight of its own and was loaded without a "
            f"target; give it the target's first: loaded.attach_target(eagle_zoo.load_target(<target id>)) "
            f"or eagle_zoo.load(<head>, target=<target model>)"
        )

    @property
    def weight(self):
        raise self._missing()

    def forward(self, *args, **kwargs):
        raise self._missing()

    def extra_repr(self) -> str:
        return f"{self.name}: the target's ({self.num_embeddings}, {self.embedding_dim}), not given yet"


class _HeadBase(nn.Module):
    weight_mapping: ClassVar[WeightMapping] = WeightMapping()
    make_norm = staticmethod(rms_norm)
    # Parameters a checkpoint may lack: share_from_target() fills them.
    optional_weights: ClassVar[tuple[str, ...]] = ("embed_tokens.", "lm_head.")

    def load_weights(self, weights: Weights, source: str) -> set[str]:
        self.loaded = load_weights(self, weights, self.weight_mapping, source, self.optional_weights)
        return self.loaded

    def leave_for_target(self, source: str) -> list[str]:
        """Put a NeedsTarget in place of each of embed_tokens / lm_head the checkpoint
        lacks (instead of its random initial weights); returns their names."""
        left = []
        for name in ("embed_tokens", "lm_head"):
            if f"{name}.weight" in getattr(self, "loaded", ()):
                continue
            rows, cols = _full_shape(getattr(self, name))
            setattr(self, name, NeedsTarget(name, rows, cols, source))
            left.append(name)
        return left

    def share_from_target(self, target: nn.Module) -> list[str]:
        """Use the target's embed_tokens / lm_head where the checkpoint had none.

        The module is shared (tied), not copied. Returns the names shared.
        """
        shared = []
        for name in ("embed_tokens", "lm_head"):
            if f"{name}.weight" in getattr(self, "loaded", ()):
                continue
            mine, theirs = getattr(self, name), getattr(target, name)
            # Full (unsharded) shapes: a head built whole (draft_tensor_parallel_size=1)
            # may use a target module sharded over the ranks.
            if _full_shape(mine) != _full_shape(theirs):
                raise ValueError(
                    f"the head checkpoint has no {name}.weight and the target's {name} has shape "
                    f"{_full_shape(theirs)}, not the head's {_full_shape(mine)}: "
                    f"this head needs its own {name} weights (or a matching target)"
                )
            setattr(self, name, theirs)
            shared.append(name)
        return shared

    # Drafting reads only the best tokens, so it may skip building full-vocabulary logits
    # (Eagle3Head does); compute_logits stays the reference these must agree with.
    def draft_argmax(self, h: torch.Tensor) -> torch.Tensor:
        """The greedy draft token (target vocabulary ids) at each position of h."""
        return argmax_rows(self.compute_logits(h))

    def draft_top_k(self, h: torch.Tensor, k: int, parent_scores: Optional[torch.Tensor] = None,
                    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs in fp32, target vocabulary ids) of the k most likely draft tokens,
        most likely first, ties to the lower id; with parent_scores (fp32, one a position of
        h) the log-probs plus the position's parent score: an EAGLE-2 tree's cumulative
        scores, in the same launch; written into out = (scores, ids) when given
        (kernels/top_k.py's log_softmax_top_k)."""
        return log_softmax_top_k(self.compute_logits(h), k, add=parent_scores, out=out)


class EagleHead(_HeadBase):
    """EAGLE-1: h = layers(fc(cat([embed(ids), hidden]))); logits = lm_head([norm](h)).

    Class attributes a family sets:
      decoder_layer_cls    the family's decoder layer class, cls(config, layer_idx)
      input_norm_identity  layer 0's input_layernorm is dropped (yuhuili heads); False
                           keeps it (Mistral-format heads)
      pre_fc_norms         enorm / hnorm on embeddings and hidden before the concat (DeepSeek)
      final_norm           a final ``norm`` before the lm_head (DeepSeek, Llama4, Cohere)
      norm_output          with final_norm: forward returns norm(h), so the fed-back
                           feature is the normed one and compute_logits applies only the
                           lm_head (vLLM's Mistral EAGLE head: its model returns the
                           normed state for both logits and the next step)
      fc_bias              None: from the config (``eagle_fc_bias`` or yuhuili ``bias``)
    Config: ``logit_scale`` (default 1) multiplies the logits (Cohere), as vLLM's heads do.
    """

    decoder_layer_cls: ClassVar[type]
    input_norm_identity: ClassVar[bool] = True
    pre_fc_norms: ClassVar[bool] = False
    final_norm: ClassVar[bool] = False
    norm_output: ClassVar[bool] = False
    fc_bias: ClassVar[Optional[bool]] = None

    def __init__(self, config):
        super().__init__()
        self.config = config
        H = config.hidden_size
        H_target = cfg(config, "target_hidden_size", H)
        self.vocab_size = config.vocab_size
        draft_vocab = cfg(config, "truncated_vocab_size", self.vocab_size)
        self.embed_tokens = VocabParallelEmbedding(self.vocab_size, H)
        if self.pre_fc_norms:
            self.enorm, self.hnorm = self.make_norm(config, H), self.make_norm(config, H_target)
        bias = self.fc_bias
        if bias is None:
            bias = bool(cfg(config, "eagle_fc_bias", False) or cfg(config, "bias", False))
        self.fc = ReplicatedLinear(H + H_target, H, bias=bias)
        n_layers = cfg(config, "num_hidden_layers", 1)
        self.layers = nn.ModuleList(self.decoder_layer_cls(config, i) for i in range(n_layers))
        if self.input_norm_identity:
            self.layers[0].input_layernorm = nn.Identity()
        self.norm = self.make_norm(config, H) if (self.final_norm or self.norm_output) else None
        self.lm_head = ParallelLMHead(draft_vocab, H)
        self.logit_scale = float(cfg(config, "logit_scale", 1.0))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        if self.pre_fc_norms:
            embeds, hidden = self.enorm(embeds), self.hnorm(hidden)
        h = self.fc(torch.cat([embeds, hidden], dim=-1))  # embeddings first (yuhuili order)
        for layer in self.layers:
            h = layer(positions, h)
        return self.norm(h) if self.norm_output else h

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(h if self.norm is None or self.norm_output else self.norm(h))
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        missing = self.vocab_size - logits.shape[-1]
        if missing > 0:  # truncated vocab = the first ids; the rest can never be drafted
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], missing), float("-inf"))], -1)
        return logits


class Eagle3DecoderLayer(nn.Module):
    """EAGLE-3 layer 0: attention over cat([input_layernorm(embeds), hidden_norm(h)])."""

    def __init__(self, config, attention_cls: type, mlp_cls: type, make_norm, layer_idx: int = 0):
        super().__init__()
        H = config.hidden_size
        self.norm_before_residual = bool(cfg(config, "norm_before_residual", False))
        self.self_attn = attention_cls(config, layer_idx=layer_idx, input_size=2 * H)
        self.mlp = mlp_cls(config)
        self.input_layernorm = make_norm(config, H)
        self.hidden_norm = make_norm(config, H)
        self.post_attention_layernorm = make_norm(config, H)

    # models/fused_layer.py's regrouped kernels for decode-shaped steps on CUDA: chosen
    # once, when an engine's runner takes the head (choose_decode_path).
    fused_decode = False

    def choose_decode_path(self) -> None:
        self.fused_decode = eagle3_layer_supports_fusion(self)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        if self.fused_decode:
            fused = fused_eagle3_layer(self, positions, embeds, hidden)  # None: not a decode-shaped CUDA step
            if fused is not None:
                return fused
        if self.norm_before_residual:  # speculators' default: the residual is the normed hidden
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:  # yuhuili
            residual, hidden = hidden, self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        h = residual + self.self_attn(positions, x)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(_HeadBase):
    """EAGLE-3: fc fuses the target's aux hidden states; one special decoder layer;
    logits over a draft vocabulary mapped back with d2t.

    Class attributes a family sets: ``attention_cls`` (cls(config, layer_idx, input_size)),
    ``mlp_cls`` (cls(config)), ``decoder_layer_cls`` (only for num_hidden_layers > 1),
    ``make_norm``, ``weight_mapping``.

    Config flags: norm_before_fc (``input_norm`` over the concatenated aux input),
    fc_norm (``fc_norm.{i}`` per aux chunk, applied first), norm_before_residual,
    norm_output (forward returns norm(h), which is then fed back and not normed again
    by compute_logits; decided here, default False).
    """

    attention_cls: ClassVar[type]
    mlp_cls: ClassVar[type]
    decoder_layer_cls: ClassVar[Optional[type]] = None
    optional_weights = ("embed_tokens.", "lm_head.", "t2d")

    def __init__(self, config):
        super().__init__()
        self.config = config
        H = config.hidden_size
        H_target = cfg(config, "target_hidden_size", H)
        self.vocab_size = config.vocab_size
        self.draft_vocab_size = cfg(config, "draft_vocab_size", self.vocab_size)
        self.num_aux = len(cfg(config, "eagle_aux_hidden_state_layer_ids", (0, 1, 2)))
        self.norm_output = bool(cfg(config, "norm_output", False))
        self.embed_tokens = VocabParallelEmbedding(self.vocab_size, H)
        self.input_norm = self.make_norm(config, self.num_aux * H_target) if cfg(config, "norm_before_fc", False) else None
        self.fc_norm = (nn.ModuleList(self.make_norm(config, H_target) for _ in range(self.num_aux))
                        if cfg(config, "fc_norm", False) else None)
        self.fc = ReplicatedLinear(self.num_aux * H_target, H, bias=False)
        n_layers = cfg(config, "num_hidden_layers", 1)
        if n_layers > 1 and self.decoder_layer_cls is None:
            raise ValueError(f"{type(self).__name__} supports num_hidden_layers=1 only (got {n_layers})")
        self.layers = nn.ModuleList(
            [Eagle3DecoderLayer(config, self.attention_cls, self.mlp_cls, self.make_norm, 0)]
            + [self.decoder_layer_cls(config, i) for i in range(1, n_layers)]
        )
        self.norm = self.make_norm(config, H)
        self.lm_head = ParallelLMHead(self.draft_vocab_size, H)
        # target_id = draft_id + d2t[draft_id]; t2d[target_id]: the token is in the draft vocab.
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(self.vocab_size) < self.draft_vocab_size)
        if self.draft_vocab_size == self.vocab_size:
            self.optional_weights = (*self.optional_weights, "d2t")
        if cfg(config, "speculators_model_type") == "peagle":
            # P-EAGLE: the aux-concat feature fed at parallel-drafting slots (through fc like
            # the target's); engine/parallel_drafting.py refuses a checkpoint without it.
            self.register_buffer("mask_hidden", torch.zeros(self.num_aux * H_target))
            self.optional_weights = (*self.optional_weights, "mask_hidden")

    def load_weights(self, weights: Weights, source: str) -> set[str]:
        loaded = super().load_weights(weights, source)
        if "t2d" not in loaded:  # derive it from d2t
            self.t2d.zero_()
            self.t2d[torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t] = True
        return loaded

    def combine_hidden_states(self, aux_cat: torch.Tensor) -> torch.Tensor:
        """[B,T,num_aux*H_target] (low, mid, high layers concatenated) -> [B,T,H]."""
        if self.fc_norm is not None:
            chunks = aux_cat.chunk(self.num_aux, dim=-1)
            aux_cat = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        if self.input_norm is not None:
            aux_cat = self.input_norm(aux_cat)
        return self.fc(aux_cat)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        h = self.layers[0](positions, embeds, hidden)
        for layer in self.layers[1:]:
            h = layer(positions, h)
        return self.norm(h) if self.norm_output else h

    def compute_draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.norm_output:
            return self.lm_head(h)
        if (type(self.norm) is RMSNorm and self.lm_head.tp_size == 1
                and use_linear_kernel(h, self.lm_head.weight, self.norm.weight)):
            # One launch a draft instead of two: the norm as the product's prologue.
            return fused_linear_triton(h, self.lm_head.weight, norm_weight=self.norm.weight, eps=self.norm.eps)
        return self.lm_head(self.norm(h))

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits; tokens outside the draft vocabulary get -inf."""
        draft = self.compute_draft_logits(h)
        out = draft.new_full((*draft.shape[:-1], self.vocab_size), float("-inf"))
        target_ids = torch.arange(self.draft_vocab_size, device=draft.device) + self.d2t
        return out.index_copy_(-1, target_ids, draft)

    # Over the draft vocabulary, then mapped (target id = draft id + d2t[draft id]): the
    # -inf columns compute_logits adds change neither the best tokens nor log_softmax's
    # normalizer, and skipping them saves a full-vocabulary fill and scatter per round.
    # d2t is increasing in published and our heads' vocabularies, so ties resolve alike.
    def draft_argmax(self, h: torch.Tensor) -> torch.Tensor:
        # On CUDA two launches (kernels/top_k.py) where torch takes an argmax, a gather and an add
        return argmax_rows(self.compute_draft_logits(h), self.d2t)

    def draft_top_k(self, h: torch.Tensor, k: int, parent_scores: Optional[torch.Tensor] = None,
                    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        return log_softmax_top_k(self.compute_draft_logits(h), k, self.d2t, add=parent_scores, out=out)
