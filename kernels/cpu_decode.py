"""The float32 CPU kernels of decode steps (csrc/cpu_decode.cpp), for up to MAX_ROWS rows:
few_row_linear (y = x @ w^T, a row-major AVX2 dot product per output; w float32,
bfloat16 or exact 4-bit blocks, which q4_blocks makes; few_row_linear_int8 from a weight's
exact int8 blocks), rms_norm_rows,
cache_attention (flash-decoding over one sequence's cache row), llama_layer_rows (a
whole Llama decoder layer), eagle3_layer_rows (an EAGLE-3 head's first layer),
eagle3_catch_up_rows (an EAGLE-3 head's catch-up over verified tokens) and
eagle3_draft_rows (an EAGLE-3 head's greedy drafts).
All are batch invariant (a row's bits do not depend on how many rows there are). Built
on first use with torch's C++ extension loader (g++ with OpenMP; about 30 s, then
cached); where it cannot be built or the CPU lacks AVX2, `available()` is False and
callers keep torch's ops.

    python -m eagle_zoo.kernels.cpu_decode [--bench] [--against REV]
        builds it now (`make` does, so the first decode step does not wait for the
        compiler) and says whether it is in use; --bench then times few_row_linear over
        SmolLM2's products and few_row_linear_int8 over its lm_head's shape at 1 to 4
        rows (bench_products); --against REV times cache_attention and the products of
        this tree's source and of commit REV's (built with REV's flags), side by side,
        alternating in one process (bench_attention, bench_products)
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ..envs import cache_dir

MAX_ROWS = 8
SOURCE = Path(__file__).parent / "csrc" / "cpu_decode.cpp"
# On a CPU with AVX-512 (as torch reports it) the kernels are built for AVX-512VL too: the
# same 8-wide arithmetic, so the same bits, with 32 vector registers instead of 16, so a
# k = 3 verification's four rows take one pass over the weights (csrc: kFloatGroup).
# 256-bit vectors stay preferred where the compiler vectorizes loops itself: with 512-bit
# ones the attention took 6-21% longer (`--against`, BENCHMARKS.md).
BUILD_FLAGS = dict(extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"]
                   + (["-mavx512f", "-mavx512vl", "-mprefer-vector-width=256"]
                      if torch.backends.cpu.get_cpu_capability() == "AVX512" else []),
                   extra_ldflags=["-fopenmp"])
_module = None
_failure: Optional[str] = None


def build_directory() -> Path:
    """Where the compiled extension is cached: per torch version, in eagle-zoo's cache
    directory (eagle_zoo/envs.py, EAGLE_ZOO_CACHE)."""
    return cache_dir() / f"cpu_decode-torch{torch.__version__.replace('+', '-')}"


def _load():
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        _failure = f"this CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
        return None
    try:
        from torch.utils.cpp_extension import load

        out = build_directory()
        out.mkdir(parents=True, exist_ok=True)
        _module = load(name="eagle_zoo_cpu_decode", sources=[str(SOURCE)], build_directory=str(out),
                       verbose=False, **BUILD_FLAGS)
    except Exception as e:  # no compiler, no Python headers, ...: torch's matmul stays
        _failure = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        warnings.warn(f"kernels/cpu_decode.py: the CPU decode kernels could not be built ({_failure}); "
                      "CPU decoding keeps torch's ops (slower). Install g++ and the Python headers to build it.")
    return _module


def available() -> bool:
    """Whether the compiled kernels run (built on the first call)."""
    return _load() is not None


def few_row_linear_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Reference: x [M, K] @ w [N, K]^T (w widened to x's dtype)."""
    return F.linear(x, w.to(x.dtype))


def few_row_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS) @ w [N, K]^T, float32 CPU x and a float32 or bfloat16 w
    (read as its exact float32 values): the kernel where available(), the reference
    otherwise."""
    if available():
        return _module.few_row_linear(x.contiguous(), w.contiguous())
    return few_row_linear_torch(x, w)


def few_row_linear_int8(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """few_row_linear of the float32 weight q [N, K] (int8) * d [N, K / 32] (one float32
    scale a block of 32 along K) when that product is the weight exactly (the copy
    models/layers.py add_exact_int8_copies makes): the same bits from a quarter of the
    bytes. The caller checks available()."""
    return _module.few_row_linear_int8(x.contiguous(), q, d)


def q4_blocks(w: torch.Tensor) -> Optional[torch.Tensor]:
    """w [N, K] (float32, K a multiple of 32) as exact 4-bit blocks, or None where a block is
    not q * d + m (models/layers.py exact_q4_blocks_torch, the reference: the same test and
    bytes in one C++ pass). The caller checks available()."""
    out = _module.q4_blocks(w.contiguous())
    return out if out.numel() else None


def rms_norm_rows_torch(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Reference: kernels/norm.py's formula in float32."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rms_norm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [M, N] (M <= MAX_ROWS) with weight w [N], float32 CPU tensors: the
    kernel where available(), the reference otherwise."""
    if available():
        return _module.rms_norm_rows(x.contiguous(), w.contiguous(), float(eps))
    return rms_norm_rows_torch(x, w, eps)


def cache_attention(q, k_cache, v_cache, slot: int, cache_positions, kv_len: int, num_heads: int,
                    num_kv_heads: int, scale: float) -> torch.Tensor:
    """Causal attention of q [T, num_heads * d] (T <= MAX_ROWS roped tokens of the sequence
    in cache row ``slot``, their k / v already written at cache_positions [T]) over keys
    [0, min(position + 1, kv_len)): llama_layer_rows' attention, for layers that keep their
    modules. float32 caches [slots, len, kv_heads, d], d a multiple of 8. The caller
    checks available() (models/attention.py); SDPA over the cache row is the reference."""
    return _module.cache_attention(q.contiguous(), k_cache, v_cache, int(slot), cache_positions.contiguous(),
                                   int(kv_len), int(num_heads), int(num_kv_heads), float(scale))


def llama_layer_rows(h, norm1, eps1, w_qkv, w_o, norm2, eps2, w_gate_up, w_down, cos, sin, k_cache, v_cache,
                     slot: int, cache_positions, kv_len: int, num_heads: int, num_kv_heads: int, scale: float):
    """An exact Llama decoder layer for h [T, H] (T <= MAX_ROWS tokens of one sequence in
    cache row ``slot``), float32, writing the tokens' k / v at cache_positions [T] and
    attending causally over [0, min(position + 1, kv_len)); cos / sin [T, d/2] (the
    rotary angles, already scaled). The caller checks available() and the layer's type
    (models/fused_layer.py cpu_decoder_layer); the module path is the reference."""
    return _module.llama_layer_rows(h.contiguous(), norm1, float(eps1), w_qkv, w_o, norm2, float(eps2), w_gate_up,
                                    w_down, cos.contiguous(), sin.contiguous(), k_cache, v_cache, int(slot),
                                    cache_positions.contiguous(), int(kv_len), int(num_heads), int(num_kv_heads),
                                    float(scale))


def llama_stack_rows(h, weights: list, eps: list, k_caches: list, v_caches: list, cos, sin, slot: int,
                     cache_positions, kv_len: int, num_heads: int, num_kv_heads: int, scale: float,
                     keep=()) -> list:
    """llama_layer_rows for each of a model's layers in turn, in one call: weights holds
    per layer norm1, w_qkv, w_o, norm2, w_gate_up, w_down, eps per layer eps1, eps2, and
    k_caches / v_caches one cache per layer. -> [the last layer's output, then the input
    of each layer in keep]. The caller checks available() and the layers' type
    (models/fused_layer.py CpuDecoderStack)."""
    return _module.llama_stack_rows(h.contiguous(), weights, [float(e) for e in eps], k_caches, v_caches,
                                    cos.contiguous(), sin.contiguous(), int(slot), cache_positions.contiguous(),
                                    int(kv_len), int(num_heads), int(num_kv_heads), float(scale),
                                    [int(i) for i in keep])


def eagle3_layer_rows(embeds, norm_e, eps_e, hidden, norm_h, eps_h, norm_before_residual: bool, w_qkv, w_o, norm2,
                      eps2, w_gate_up, w_down, cos, sin, k_cache, v_cache, slot: int, cache_positions, kv_len: int,
                      num_heads: int, num_kv_heads: int, scale: float):
    """An EAGLE-3 head's first decoder layer (models/heads.py Eagle3DecoderLayer) for T <=
    MAX_ROWS tokens of one sequence: qkv of [rms_norm(embeds), rms_norm(hidden)] side by
    side, the residual hidden (its norm with norm_before_residual), then as
    llama_layer_rows. embeds and hidden [T, H] float32; weights float32 or bfloat16. The
    caller checks available() and the layer's type (models/fused_layer.py
    cpu_eagle3_layer); the module path is the reference."""
    return _module.eagle3_layer_rows(embeds.contiguous(), norm_e, float(eps_e), hidden.contiguous(), norm_h,
                                     float(eps_h), bool(norm_before_residual), w_qkv, w_o, norm2, float(eps2),
                                     w_gate_up, w_down, cos.contiguous(), sin.contiguous(), k_cache, v_cache,
                                     int(slot), cache_positions.contiguous(), int(kv_len), int(num_heads),
                                     int(num_kv_heads), float(scale))


def eagle3_catch_up_rows(aux: list, w_fc, ids, embed, norm_e, eps_e, norm_h, eps_h, norm_before_residual: bool,
                         w_qkv, w_o, norm2, eps2, w_gate_up, w_down, cos, sin, k_cache, v_cache, slot: int,
                         cache_positions, kv_len: int, num_heads: int, num_kv_heads: int, scale: float):
    """An EAGLE-3 head's catch-up over T <= MAX_ROWS verified tokens of one sequence: the
    features fc(cat(aux)) (aux: the target's aux residual streams [T, H_t], float32), the
    rows of embed [V, H] float32 for ids [T] int64 (-1: a zero row), then
    eagle3_layer_rows at cache_positions [T] (cos / sin [T, d/2]). -> the layer's output
    [T, H]. The caller checks available() and the head's structure (models/fused_layer.py
    CpuEagle3Head); EagleProposer._catch_up's module path is the reference."""
    return _module.eagle3_catch_up_rows([a.contiguous() for a in aux], w_fc, ids.contiguous(), embed, norm_e,
                                        float(eps_e), norm_h, float(eps_h), bool(norm_before_residual), w_qkv, w_o,
                                        norm2, float(eps2), w_gate_up, w_down, cos.contiguous(), sin.contiguous(),
                                        k_cache, v_cache, int(slot), cache_positions.contiguous(), int(kv_len),
                                        int(num_heads), int(num_kv_heads), float(scale))


def eagle3_draft_rows(h, k: int, embed, norm_f, eps_f, lm_head, d2t, norm_e, eps_e, norm_h, eps_h,
                      norm_before_residual: bool, w_qkv, w_o, norm2, eps2, w_gate_up, w_down, cos, sin, k_cache,
                      v_cache, slot: int, cache_positions, kv_len: int, num_heads: int, num_kv_heads: int,
                      scale: float, min_confidence: float):
    """An EAGLE-3 head's k greedy drafts [k] (target ids, int64) for one sequence from its
    hidden state h [1, H] float32: per draft the final norm (norm_f), the lm_head over the
    draft vocabulary, its argmax + d2t, then (but after the last) the token's row of embed
    [V, H] float32 through eagle3_layer_rows at the next of cache_positions [k - 1] (cos /
    sin [k - 1, d/2]). With min_confidence > 0, the first n <= k of them [n]: drafting
    stops before the draft at which the product of the drafts' top softmax probabilities
    falls below min_confidence (n = 0 when the first one's does). The caller checks
    available() and the head's structure (models/fused_layer.py CpuEagle3Head);
    EagleProposer._draft_chain's module path is the reference for the drafts made."""
    return _module.eagle3_draft_rows(h.contiguous(), int(k), embed, norm_f, float(eps_f), lm_head, d2t, norm_e,
                                     float(eps_e), norm_h, float(eps_h), bool(norm_before_residual), w_qkv, w_o, norm2,
                                     float(eps2), w_gate_up, w_down, cos.contiguous(), sin.contiguous(), k_cache,
                                     v_cache, int(slot), cache_positions.contiguous(), int(kv_len), int(num_heads),
                                     int(num_kv_heads), float(scale), float(min_confidence))


def bench_products(modules: dict, rounds: int = 5) -> None:
    """few_row_linear of each module (label: built extension) over SmolLM2-135M's four
    products of 30 layers, with float32 weights (425 MB), bfloat16 ones (an EAGLE head's,
    212 MB) and 4-bit blocks (the embedded target's exact form, 80 MB), read from memory,
    not cache, as a decode step reads them, and few_row_linear_int8 over an int8 weight of
    its lm_head's shape (49,152 x 576, 29 MB), at 1 to 4 rows (a plain step; a
    verification at k = 1 to 3): the best of `rounds` passes, the modules alternating pass
    by pass (a module that refuses a weight, one built before it took 4-bit blocks, is left
    out of its lines). Checks that the modules give the same bits."""
    from ..models.layers import Q4_BLOCK_BYTES

    torch.manual_seed(0)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    q = torch.randint(-127, 128, (49152, 576), dtype=torch.int8)
    d = 0.01 * torch.rand(49152, 576 // 32)

    def compare(what: str, run, nbytes: Optional[int] = None) -> None:
        outs = {}
        for label, module in modules.items():  # also the warm-up pass
            try:
                outs[label] = run(module)
            except RuntimeError:
                continue
        same = all(torch.equal(a, b) for out in outs.values() for a, b in zip(out, outs[next(iter(outs))]))
        times = {label: [] for label in outs}
        for _ in range(rounds):
            for label in outs:
                start = time.perf_counter()
                run(modules[label])
                times[label].append(time.perf_counter() - start)
        cells = "  ".join(f"{label} {min(t) * 1e3:.3f} ms" + (f" ({nbytes / min(t) / 1e9:.1f} GB/s)" if nbytes else "")
                          for label, t in times.items())
        print(f"{what}: {cells}{'' if same else '  (results differ)'}")

    def q4_exact(n: int, k: int) -> torch.Tensor:
        """A weight of Q4_1's values: per block of 32, 4-bit q (0 and 15 among them) times a
        float16 d plus a float16 m."""
        q4 = torch.randint(0, 16, (n, k // 32, 32)).float()
        q4[..., 0], q4[..., 1] = 0, 15
        d4 = (0.004 * torch.rand(n, k // 32)).half().float()
        m4 = (-0.03 * torch.rand(n, k // 32)).half().float()
        return q4_blocks((q4 * d4[..., None] + m4[..., None]).reshape(n, k))

    def in_features(w):  # a 4-bit weight's row holds Q4_BLOCK_BYTES per 32 values
        return w.shape[1] // Q4_BLOCK_BYTES * 32 if w.dtype == torch.uint8 else w.shape[1]

    weight_sets = {str(dtype)[6:]: [[(0.03 * torch.randn(n, k)).to(dtype) for n, k in shapes] for _ in range(30)]
                   for dtype in (torch.float32, torch.bfloat16)}
    weight_sets["4-bit block"] = [[q4_exact(n, k) for n, k in shapes] for _ in range(30)]
    for kind, layers in weight_sets.items():
        nbytes = sum(w.numel() * w.element_size() for layer in layers for w in layer)
        for rows in (1, 2, 3, 4):
            x = {k: torch.randn(rows, k) for k in (576, 1536)}
            compare(f"{rows} row{'s' if rows > 1 else ' '}, 30 layers of {kind} weights",
                    lambda m: [m.few_row_linear(x[in_features(w)], w) for layer in layers for w in layer], nbytes)
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, 576)
        compare(f"{rows} row{'s' if rows > 1 else ' '}, the int8 lm_head", lambda m: [m.few_row_linear_int8(x, q, d)])


def _shown_at_commit(rev: str, path: str):
    """`git show REV:PATH` from this repository's checkout (a CompletedProcess)."""
    import subprocess

    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=SOURCE.parent, capture_output=True, text=True)


def build_flags_at_commit(rev: str) -> dict:
    """BUILD_FLAGS as kernels/cpu_decode.py of git commit ``rev`` sets them, or this
    tree's where git does not show that file."""
    shown = _shown_at_commit(rev, "kernels/cpu_decode.py")
    return build_flags_in(shown.stdout) if shown.returncode == 0 else BUILD_FLAGS


def build_flags_in(module_source: str) -> dict:
    """The value of the BUILD_FLAGS assignment in a version of this module's source (an
    expression of torch), or this tree's BUILD_FLAGS where it has none."""
    import ast

    for node in ast.parse(module_source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["BUILD_FLAGS"]:
            return eval(compile(ast.Expression(node.value), "BUILD_FLAGS", "eval"), {"torch": torch, "dict": dict})
    return BUILD_FLAGS


def build_at_commit(rev: str):
    """csrc/cpu_decode.cpp as of git commit ``rev``, built with that commit's flags under
    its own module name beside this tree's (for --against)."""
    from torch.utils.cpp_extension import load

    shown = _shown_at_commit(rev, "kernels/csrc/cpu_decode.cpp")
    if shown.returncode:
        raise SystemExit(f"--against {rev}: `git show {rev}:kernels/csrc/cpu_decode.cpp` failed in "
                         f"{SOURCE.parent}: {shown.stderr.strip()}; give a commit of this repository's checkout")
    name = "eagle_zoo_cpu_decode_" + "".join(c for c in rev if c.isalnum())
    out = build_directory() / name
    out.mkdir(parents=True, exist_ok=True)
    source = out / "cpu_decode.cpp"
    source.write_text(shown.stdout)
    return load(name=name, sources=[str(source)], build_directory=str(out), verbose=False,
                **build_flags_at_commit(rev))


def bench_attention(modules: dict, rounds: int = 15) -> None:
    """cache_attention of each module (label: built extension) over SmolLM2-135M's 30 layers'
    caches (9 query heads, 3 kv heads of 64) at a few contexts, for one token (plain
    decoding) and four (a k = 3 verification), each round after 48 MB are written, as a
    decode step's weights pass through the caches between two layers' attention: the
    median microseconds a layer, the modules alternating round by round. Checks that the
    modules give the same bits."""
    import statistics

    torch.manual_seed(0)
    heads, kv_heads, d, layers = 9, 3, 64, 30
    k_caches = [torch.randn(1, 4096, kv_heads, d) for _ in range(layers)]
    v_caches = [torch.randn(1, 4096, kv_heads, d) for _ in range(layers)]
    evict = torch.zeros(48 * 2**20 // 4)

    def layer_us(module, q, positions, kv_len) -> float:
        evict.add_(1.0)
        start = time.perf_counter()
        for k, v in zip(k_caches, v_caches):
            module.cache_attention(q, k, v, 0, positions, kv_len, heads, kv_heads, d ** -0.5)
        return (time.perf_counter() - start) / layers * 1e6

    for context in (60, 300, 1000, 2000):
        for tokens in (1, 4):
            q = torch.randn(tokens, heads * d)
            positions = torch.arange(context, context + tokens)
            outs = [m.cache_attention(q, k_caches[0], v_caches[0], 0, positions, context + tokens, heads, kv_heads,
                                      d ** -0.5) for m in modules.values()]
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            times = {label: [] for label in modules}
            for _ in range(rounds):
                for label, module in modules.items():
                    times[label].append(layer_us(module, q, positions, context + tokens))
            cells = "  ".join(f"{label} {statistics.median(t):6.0f}" for label, t in times.items())
            print(f"attention, context {context:5d}, {tokens} token{'s' if tokens > 1 else ' '}: {cells} us a layer"
                  f"{'' if same else '  (results differ)'}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m eagle_zoo.kernels.cpu_decode",
                                     description="Build the CPU decode kernels and say whether they are in use.")
    parser.add_argument("--bench", action="store_true", help="then time the products (bench_products)")
    parser.add_argument("--against", metavar="REV",
                        help="then time cache_attention and the products against commit REV's source, built "
                             "with REV's flags, alternating (bench_attention, bench_products)")
    args = parser.parse_args()
    state = "built, in use" if available() else f"not in use: {_failure}"
    print(f"kernels/cpu_decode.py: {state} ({build_directory()}; {' '.join(BUILD_FLAGS['extra_cflags'])})")
    if args.bench and available():
        bench_products({"this tree": _module})
    if args.against and available():
        modules = {"this tree": _module, args.against: build_at_commit(args.against)}
        bench_attention(modules)
        bench_products(modules)
    sys.exit(0)  # a failed build is not an error: torch's ops stay
