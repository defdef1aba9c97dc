"""kernels/ shares its import name with Hugging Face's `kernels` distribution: with that
one installed, importing ours warns and names the fix (kernels/_name_clash.py)."""
import importlib.metadata
import warnings

import pytest

from kernels import _name_clash


def test_no_warning_without_hf_kernels(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _name_clash.warn_if_hf_kernels_installed()


def test_warns_with_the_fix_when_hf_kernels_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.19.1" if name == "kernels" else "0")
    with pytest.warns(RuntimeWarning, match=r"kernels` 0\.19\.1 .*pip uninstall kernels.*transformers<5\.25"):
        _name_clash.warn_if_hf_kernels_installed()


def test_this_environment_has_no_clash():
    """make setup must never install both (pyproject keeps transformers < 5.25)."""
    assert _name_clash.hf_kernels_version() is None
