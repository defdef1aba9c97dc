"""eagle-zoo finds this package through its ``eagle_zoo`` entry point, with nothing in
eagle_zoo naming it: what it registered, under which plugin name and version, and
which architectures now resolve to it."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import eagle_zoo_qwen2
from eagle_zoo import plugins
from eagle_zoo_qwen2 import plugin as qwen2_plugin
from eagle_zoo_qwen2.modeling import Qwen2Eagle3Head, Qwen2EagleHead, Qwen2ForCausalLM

DIST = "eagle-zoo-qwen2"
CATALOG = Path(eagle_zoo_qwen2.__file__).with_name("catalog.yaml")


def catalog_ids() -> list[str]:
    """The ids in the shipped yaml, read with plain yaml (not eagle-zoo's reader)."""
    return [e["id"] for e in yaml.safe_load(CATALOG.read_text())["entries"]]


def test_installed_distribution_declares_the_entry_point():
    eps = [ep for ep in metadata.entry_points(group="eagle_zoo") if ep.name == "qwen2"]
    assert len(eps) == 1, "eagle-zoo-qwen2 is not installed: pip install --no-deps -e plugins/eagle-zoo-qwen2"
    (ep,) = eps
    assert ep.value == "eagle_zoo_qwen2.plugin"
    assert ep.dist.name == DIST
    assert ep.load() is qwen2_plugin


def test_registry_attributes_family_and_catalog_to_the_entry_point(fresh_plugin_host):
    reg = plugins.get_registry()
    info = reg.plugins["qwen2"]
    assert info.version == metadata.version(DIST) == eagle_zoo_qwen2.__version__
    assert info.source == f"entry point of {DIST}"
    assert info.registered == {"families": ["qwen2"], "catalog": catalog_ids()}
    for entry_id in catalog_ids():
        assert reg.catalog[entry_id].source == "qwen2" and reg.catalog[entry_id].family == "qwen2"


def test_architectures_resolve_to_this_plugin(fresh_plugin_host):
    reg = plugins.get_registry()
    family = reg.family_for_architecture("Qwen2ForCausalLM")
    assert family.name == "qwen2" and family.target_model is Qwen2ForCausalLM
    assert reg.model_types["qwen2"] is family
    assert reg.family_for_config({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}) is family
    assert reg.head_class("EagleQwen2ForCausalLM") is Qwen2EagleHead
    assert reg.head_class("Eagle3Qwen2ForCausalLM") is Qwen2Eagle3Head
    assert reg.head_class("Qwen2ForCausalLMEagle3") is Qwen2Eagle3Head
    assert reg.head_for_architecture("EagleQwen2ForCausalLM") == (family, "eagle")
    # the built-in families are untouched
    assert reg.family_for_architecture("Qwen3ForCausalLM").name == "qwen3"


def test_allow_list_and_opt_out(fresh_plugin_host, monkeypatch):
    monkeypatch.setenv(plugins.ALLOW_LIST_ENV, "qwen2")
    plugins.reset()
    assert "qwen2" in plugins.get_registry().families

    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    plugins.reset()
    reg = plugins.get_registry()
    assert "qwen2" not in reg.plugins and "qwen2" not in reg.families
    assert "yuhuili/EAGLE-Qwen2-7B-Instruct" not in reg.catalog
    with pytest.raises(KeyError, match="EagleQwen2ForCausalLM"):
        reg.head_class("EagleQwen2ForCausalLM")
    with pytest.raises(KeyError, match="no plugin registers the target architecture 'Qwen2ForCausalLM'"):
        reg.family_for_architecture("Qwen2ForCausalLM")


def _cli(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_ZOO_")}
    run = subprocess.run([sys.executable, "-m", "eagle_zoo.cli", *args], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_cli_lists_the_plugin_and_its_heads():
    out = _cli("plugins", "--all")
    lines = out.splitlines()
    i = lines.index(f"qwen2  {metadata.version(DIST)}  (entry point of {DIST})")
    block = lines[i + 1:i + 3]
    assert "    families: qwen2" in block
    assert f"    catalog: {', '.join(catalog_ids())}" in block

    listing = _cli("list", "--family", "qwen2")
    for entry_id in catalog_ids():
        assert entry_id in listing
    assert f"{len(catalog_ids())} of " in listing
