"""Triton kernels, each next to a plain-torch reference of the same function.

Every public function here is a dispatcher: Triton on CUDA tensors when triton
imports, the torch reference otherwise (CPU, no triton, autograd).
See kernels/README.md.

The code lives in the repository's top-level kernels/ directory; its import name is
`eagle_zoo.kernels`. A top-level `kernels` package would be Hugging Face's `kernels`
distribution's name (transformers >= 5.25 requires it): installed beside it, one of the
two would be imported for both. So kernels/ has no __init__.py (Python prefers any
regular `kernels` package to that directory, even from the repository root), this
package points its __path__ at it in a source tree or an editable install, and a built
wheel carries the directory's files here (setup.py).
"""
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "linear.py").is_file():  # source tree or editable install
    __path__.append(str(_HERE.parents[1] / "kernels"))

from .activation import silu_and_mul, silu_and_mul_torch, silu_and_mul_triton  # noqa: E402
from .attention import cache_attention, cache_attention_torch, cache_attention_triton  # noqa: E402
from .chain_accept import chain_accept_greedy, chain_accept_greedy_torch, chain_accept_greedy_triton  # noqa: E402
from .embedding import embedding, embedding_torch, embedding_triton  # noqa: E402
from .gather_rows import gather_rows, gather_rows_torch, gather_rows_triton  # noqa: E402
from .kv_cache import write_kv, write_kv_torch, write_kv_triton  # noqa: E402
from .norm import rms_norm, rms_norm_torch, rms_norm_triton  # noqa: E402
from .scatter_row import scatter_row, scatter_row_torch, scatter_row_triton  # noqa: E402
from .rope import (rope_angles, rope_angles_torch, rope_angles_triton, rope_neox, rope_neox_torch,  # noqa: E402
                   rope_neox_triton)
from .step_outputs import step_outputs, step_outputs_torch, step_outputs_triton  # noqa: E402
from .top_k import argmax_rows, argmax_rows_triton, log_softmax_top_k, log_softmax_top_k_torch, log_softmax_top_k_triton  # noqa: E402
from .tree_expand import tree_expand, tree_expand_torch, tree_expand_triton  # noqa: E402
from .tree_select import tree_select, tree_select_torch, tree_select_triton  # noqa: E402
from .tree_accept import tree_accept_greedy, tree_accept_greedy_torch, tree_accept_greedy_triton  # noqa: E402
from .tree_compact import tree_compact, tree_compact_torch, tree_compact_triton  # noqa: E402

__all__ = [
    "cache_attention", "cache_attention_torch", "cache_attention_triton",
    "chain_accept_greedy", "chain_accept_greedy_torch", "chain_accept_greedy_triton",
    "embedding", "embedding_torch", "embedding_triton",
    "gather_rows", "gather_rows_torch", "gather_rows_triton",
    "write_kv", "write_kv_torch", "write_kv_triton",
    "rms_norm", "rms_norm_torch", "rms_norm_triton",
    "silu_and_mul", "silu_and_mul_torch", "silu_and_mul_triton",
    "scatter_row", "scatter_row_torch", "scatter_row_triton",
    "rope_angles", "rope_angles_torch", "rope_angles_triton", "rope_neox", "rope_neox_torch", "rope_neox_triton",
    "argmax_rows", "argmax_rows_triton", "log_softmax_top_k", "log_softmax_top_k_torch", "log_softmax_top_k_triton",
    "tree_expand", "tree_expand_torch", "tree_expand_triton",
    "tree_select", "tree_select_torch", "tree_select_triton",
    "tree_accept_greedy", "tree_accept_greedy_torch", "tree_accept_greedy_triton",
    "tree_compact", "tree_compact_torch", "tree_compact_triton",
]
