"""What the per-family parity tests share: transformers' modules with random weights
(the independent reference), eager-attention masks, seeded inputs, and the target check
(eagle_zoo's model against transformers' with the same weights, fp32).

Only the mechanics live here; each family file keeps its own tiny config, seeds and
tolerances, so a test reads the same as before and can still fail on its own.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

TOL = 1e-5  # fp32 agreement for tiny models: the default atol = rtol of the checks here
EAGLE3_LAYER_PARTS = ("self_attn", "mlp", "hidden_norm", "input_layernorm", "post_attention_layernorm")


@torch.no_grad()
def randomize(module: nn.Module, seed: int, zero_centred: tuple[str, ...] = ()) -> nn.Module:
    """N(0, 0.3) for every parameter, 1-D ones (norm scales, biases) shifted to 1:
    transformers initialises norms to 1 and would hide a missing or swapped norm.

    ``zero_centred`` names tensors (by substring) that stay around 0 and are randomised
    even when they are buffers, e.g. DeepSeek-V3's routing bias ``e_score_correction_bias``."""
    gen = torch.Generator().manual_seed(seed)
    tensors = list(module.named_parameters())
    tensors += [(n, b) for n, b in module.named_buffers() if any(s in n for s in zero_centred)]
    for name, p in tensors:
        shift = 1.0 if p.dim() == 1 and not any(s in name for s in zero_centred) else 0.0
        p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + shift)
    return module.eval()


def reference_target(hf_class: type, config, seed: int = 0) -> nn.Module:
    """transformers' ``XForCausalLM(config)`` with random weights, tied when the config says so."""
    ref = randomize(hf_class(config), seed)
    if config.tie_word_embeddings:
        ref.tie_weights()
    return ref


def load_reference(model: nn.Module, ref: nn.Module, source: str = "model.safetensors") -> nn.Module:
    """``model`` with the reference's weights, read under their transformers names."""
    model.load_weights(ref.state_dict(), source)
    return model


def additive_mask(visible: torch.Tensor) -> torch.Tensor:
    """bool [T, L] -> additive [1, 1, T, L] mask for transformers' eager attention."""
    return torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))[None, None]


def causal_mask(t: int, window: Optional[int] = None) -> torch.Tensor:
    """Key j visible to query i iff 0 <= i - j (< window, for a sliding window)."""
    diff = torch.arange(t)[:, None] - torch.arange(t)[None, :]
    visible = diff >= 0
    if window:
        visible &= diff < window
    return additive_mask(visible)


def token_inputs(vocab: int, batch: int, length: int, seed: int = 1, offset: int = 0):
    """-> (ids [B, T], positions [B, T] starting at ``offset``, the generator for more draws).
    A non-zero offset exercises rope away from position 0."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    return ids, (torch.arange(length) + offset).expand(batch, length), gen


def scaled_close(got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    """assert_close with rtol = ``tol`` and atol = ``tol`` times the reference's largest
    magnitude (at least 1): fp32 rounding after a few layers is relative to the scale of the
    residual stream (|x| ~ 20 here), so a small entry of a large tensor carries an absolute
    error of ~1e-5 that differs from CPU to CPU (summation order); a wrong weight or mask
    is off by far more."""
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got, want, atol=tol * scale, rtol=tol)


def _checker(tol: float, check: Optional[Callable]) -> Callable:
    """``check(got, want)`` as given, or scaled_close with ``tol``."""
    if check is not None:
        return check
    return lambda got, want: scaled_close(got, want, tol)


def assert_target_matches(model, ref, ids, positions, aux_layer_ids=None, tol: float = TOL,
                          check: Optional[Callable] = None) -> None:
    """eagle_zoo's target against transformers' with the same weights: the logits and,
    given ``aux_layer_ids``, each aux hidden state against transformers' hidden_states[i]
    (the input of layer i). ``check(got, want)`` replaces the default assert_close."""
    check = _checker(tol, check)
    with torch.no_grad():
        if aux_layer_ids is None:
            logits, want = model.compute_logits(model(ids, positions)[0]), ref(ids, position_ids=positions)
        else:
            want = ref(ids, position_ids=positions, output_hidden_states=True)
            hidden, aux = model(ids, positions, aux_layer_ids=aux_layer_ids)
            logits = model.compute_logits(hidden)
    check(logits, want.logits)
    if aux_layer_ids is not None:
        for got, i in zip(aux, aux_layer_ids):
            check(got, want.hidden_states[i])


def assert_tied_checkpoint_matches(model, ref, ids, positions, tol: float = TOL) -> None:
    """A tied checkpoint saved without ``lm_head.weight`` loads into ``model`` (its lm_head is
    the embedding) and the model then matches the reference."""
    weights = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    model.load_weights(weights, "model.safetensors")
    assert_target_matches(model, ref, ids, positions, tol=tol)


def zero_caches(model, shape) -> list:
    """One zeroed (k, v) cache pair of ``shape`` [slots, max_len, kv_heads, head_dim] per layer."""
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]


def assert_cached_decode_matches(model, ref, ids, positions, caches, slots, prompt: int, tol: float = TOL,
                                 check: Optional[Callable] = None) -> None:
    """A prefill of the first ``prompt`` tokens, then one-token decode steps, all through the
    KV ``caches`` (sequence b in cache slot ``slots[b]``), give the logits of transformers'
    full forward."""
    from eagle_zoo.models.attention import AttentionContext, use_context

    def step(start, end):
        with use_context(AttentionContext(caches, slots, positions[:, start:end], kv_len=end)):
            return model.compute_logits(model(ids[:, start:end], positions[:, start:end])[0])

    with torch.no_grad():
        expected = ref(ids, position_ids=positions).logits
        got = torch.cat([step(0, prompt)] + [step(t, t + 1) for t in range(prompt, ids.shape[1])], 1)
    _checker(tol, check)(got, expected)


def eagle_step(head, ref, ids, positions, hidden, tol: float = TOL, check: Optional[Callable] = None):
    """One draft step of ``head`` and its reference from the same hidden state: the head's
    output (for EAGLE-1 heads with a final norm, the fed-back feature) must agree. Returns
    (head output, reference output, the head's logits) for the caller's logits checks."""
    with torch.no_grad():
        h, expected = head(ids, positions, hidden), ref(ids, positions, hidden)
        _checker(tol, check)(h, expected)
        return h, expected, head.compute_logits(h)


def eagle3_step(head, ref: "Eagle3Reference", ids, positions, aux_cat, combine: Optional[Callable] = None,
                tol: float = TOL, check: Optional[Callable] = None):
    """One EAGLE-3 step of ``head`` and the reference from the target's concatenated aux
    hidden states: the combined hidden state (against ``combine``, default the reference's
    fc), the layer outputs and the draft-vocabulary logits must agree. Returns (the
    reference's draft logits, the head's target-vocabulary logits) for the caller's
    d2t / t2d checks."""
    check = _checker(tol, check)
    with torch.no_grad():
        hidden = head.combine_hidden_states(aux_cat)
        check(hidden, (combine or ref.fc)(aux_cat))
        h = head(ids, positions, hidden)
        expected = ref(ids, positions, hidden)
        check(h, expected)
        draft_logits = ref.lm_head(ref.norm(expected))
        check(head.compute_draft_logits(h), draft_logits)
        return draft_logits, head.compute_logits(h)


def registered_spec(register_families: Callable, *, name: str, architectures: tuple, model_types: tuple,
                    target_model: type, weight_mapping, heads: Optional[dict] = None):
    """The one FamilySpec a family module's ``register_families`` hook registers, checked
    against what the test expects (``heads``: method -> head class, or None for a method
    the family does not serve). Returned for the family's own further checks."""
    from eagle_zoo.specs import FamilySpec

    got = []
    register_families(register=got.append)
    (spec,) = got
    assert isinstance(spec, FamilySpec) and spec.name == name
    assert spec.architectures == architectures and spec.model_types == model_types
    assert spec.target_model is target_model and spec.weight_mapping is weight_mapping
    for method, cls in (heads or {}).items():
        assert spec.head_class(method) is cls, method
    return spec


def assert_mapping_entries_used(mapping, keys) -> None:
    """Each rename, fused (stacked) part and ignored name of a WeightMapping matches a real
    checkpoint key, and the ignored names map to "" (dropped)."""
    from eagle_zoo.models.loader import map_name

    for old, _ in mapping.renames:
        assert any(k.startswith(old[1:]) if old.startswith("^") else old in k for k in keys), old
    for _, part, _ in mapping.stacked:
        assert any(part in k for k in keys), part
    for part in mapping.ignored:
        assert any(part in k for k in keys) and all(map_name(k, mapping)[0] == "" for k in keys if part in k), part


def widen_inputs(module: nn.Module, names, in_features: int) -> None:
    """Replace the named projections of ``module`` (transformers' attention) by ones that
    read ``in_features`` (EAGLE-3's layer 0 reads cat[embed, hidden] = 2H); absent (None)
    projections stay absent, biases stay as they were."""
    for name in names:
        old = getattr(module, name)
        if old is not None:
            setattr(module, name, nn.Linear(in_features, old.out_features, bias=old.bias is not None))


class Eagle3Reference(nn.Module):
    """EAGLE-3 layer 0 from transformers' modules, written from the published description:
    residual / hidden_norm(hidden), x = cat[input_layernorm(embed(ids)), normed hidden]
    (2H wide) -> attention -> + residual -> post_attention_layernorm -> MLP -> + h.

    A family's subclass sets ``embed`` and ``fc`` (and whatever else it checks) in its
    __init__ and calls ``build_layer``; the order of that __init__ fixes the parameter
    order, hence the random weights. ``window`` (a sliding window) and ``nbr``
    (norm_before_residual) default to off."""

    nbr = False
    window = None

    def build_layer(self, config, draft_vocab: int, attention, mlp, norm, rotary,
                    widen=("q_proj", "k_proj", "v_proj")) -> None:
        """attention(config, 0) with the ``widen`` projections reading 2H, mlp(config), the
        four norms norm(H, eps), lm_head [draft_vocab, H], rotary(config), in this order."""
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.attn = attention(config, 0)
        widen_inputs(self.attn, widen, 2 * hidden)
        self.mlp = mlp(config)
        self.hidden_norm, self.input_layernorm = norm(hidden, eps), norm(hidden, eps)
        self.post_attention_layernorm, self.norm = norm(hidden, eps), norm(hidden, eps)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.rotary = rotary(config)

    def attend(self, x, positions):
        """The widened attention alone on a [B, T, 2H] input."""
        out, _ = self.attn(x, position_embeddings=self.rotary(x, positions),
                           attention_mask=causal_mask(x.shape[1], self.window))
        return out

    def residual_and_normed(self, hidden):
        """The residual is the hidden state before hidden_norm (yuhuili), or after it
        (``norm_before_residual``, speculators' default)."""
        normed = self.hidden_norm(hidden)
        return (normed if self.nbr else hidden), normed

    def forward(self, ids, positions, hidden):
        residual, hidden = self.residual_and_normed(hidden)
        h = residual + self.attend(torch.cat([self.input_layernorm(self.embed(ids)), hidden], -1), positions)
        return h + self.mlp(self.post_attention_layernorm(h))

    def layer_state(self, prefix: str) -> dict:
        """The layer's tensors under ``{prefix}{part}.`` (``layers.0.`` or ``midlayer.``)."""
        parts = dict(zip(EAGLE3_LAYER_PARTS, (self.attn, self.mlp, self.hidden_norm, self.input_layernorm,
                                              self.post_attention_layernorm)))
        return {f"{prefix}{part}.{k}": v for part, mod in parts.items() for k, v in mod.state_dict().items()}

