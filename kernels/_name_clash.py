"""The import name `kernels` is also Hugging Face's `kernels` distribution (transformers
>= 5.25 requires it). Installed side by side, one of the two is imported for both, and
transformers then fails on ours with "cannot import name 'CUDAProperties' from
'kernels'". This module only explains that clash when it happens; pyproject.toml keeps
transformers below 5.25 so a fresh install never has both."""
from __future__ import annotations

import importlib.metadata
import warnings


def hf_kernels_version() -> str | None:
    """The version of an installed distribution named `kernels` (never eagle-zoo's own:
    ours ships inside the eagle-zoo distribution), or None."""
    try:
        return importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return None


def warn_if_hf_kernels_installed() -> None:
    version = hf_kernels_version()
    if version is not None:
        warnings.warn(
            f"Hugging Face's `kernels` {version} is installed beside eagle-zoo, whose kernels/ "
            "package has the same import name: transformers will import eagle-zoo's and fail "
            "(cannot import name 'CUDAProperties'). Fix: `pip uninstall kernels` and "
            "`pip install 'transformers<5.25'` (5.25 requires it).",
            RuntimeWarning, stacklevel=3)
