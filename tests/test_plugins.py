"""The plugin host: hook typos, duplicate claims, entry-point loading and its env vars,
and a real throwaway plugin distribution found by `eagle-zoo plugins`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle_zoo import plugins
from eagle_zoo.hookspecs import hookimpl
from eagle_zoo.plugins import PluginError, PluginHost
from eagle_zoo.specs import FamilySpec


def bare_host(**kw) -> PluginHost:
    """No built-ins at all: these tests must not depend on which families exist."""
    return PluginHost(autoload=kw.pop("autoload", False), default_plugins=(), **kw)


class Misspelt:
    @hookimpl
    def register_familes(self, register):  # sic
        raise AssertionError("never called")


def family_plugin(fam_name: str, *archs: str):
    class P:
        @hookimpl
        def register_families(self, register):
            register(FamilySpec(name=fam_name, architectures=archs, model_types=()))
    return P()


# -- hook typos fail loudly ------------------------------------------------------
def test_register_rejects_misspelt_hook_and_leaves_host_clean():
    host = bare_host()
    with pytest.raises(PluginError) as err:
        host.register(Misspelt(), name="typo")
    msg = str(err.value)
    assert "'typo'" in msg and "'register_familes'" in msg and "Did you mean 'register_families'?" in msg
    assert host.pm.get_plugin("typo") is None
    assert "typo" not in host.registry.plugins


def test_check_pending_fails_for_misspelt_hook(reset_plugin_host, monkeypatch):
    monkeypatch.setattr(plugins, "_host", bare_host())
    plugins.check_pending()  # nothing wrong yet
    plugins.get_host().pm.register(Misspelt(), name="typo")  # behind the host's back
    with pytest.raises(PluginError, match=r"plugin 'typo' implements unknown hook 'register_familes'"):
        plugins.check_pending()


def test_hookimpl_may_take_fewer_arguments_than_the_spec(register_plugin):
    class NoArgs:
        @hookimpl
        def register_catalog(self):
            pass

    host = bare_host()
    register_plugin(NoArgs(), name="noargs", host=host)
    assert host.registry.plugins["noargs"].registered == {}


# -- two plugins claiming one name -----------------------------------------------
def test_same_architecture_from_two_plugins_names_both(register_plugin):
    host = bare_host()
    register_plugin(family_plugin("toy_a", "ToyZooForCausalLM"), name="plugin_a", host=host)
    register_plugin(family_plugin("toy_b", "OtherForCausalLM", "ToyZooForCausalLM"), name="plugin_b", host=host)
    with pytest.raises(PluginError) as err:
        host.registry
    msg = str(err.value)
    assert "architecture 'ToyZooForCausalLM'" in msg and "'plugin_a'" in msg and "'plugin_b'" in msg


def test_distinct_families_register_and_are_attributed(register_plugin):
    host = bare_host()
    register_plugin(family_plugin("toy_a", "ToyAForCausalLM"), name="plugin_a", host=host)
    register_plugin(family_plugin("toy_b", "ToyBForCausalLM"), name="plugin_b", host=host)
    reg = host.registry
    assert reg.family_for_architecture("ToyBForCausalLM").name == "toy_b"
    assert reg.plugins["plugin_a"].registered == {"families": ["toy_a"]}
    with pytest.raises(KeyError, match="registered families: toy_a, toy_b"):
        reg.family("nope")


# -- entry points and the two environment variables -------------------------------
@pytest.fixture
def fake_entry_points(tmp_path, monkeypatch):
    """An installed-looking entry point 'toy' -> a module written to tmp_path."""
    (tmp_path / "ez_fake_toy.py").write_text(textwrap.dedent("""
        from eagle_zoo.hookspecs import hookimpl

        @hookimpl
        def register_catalog(register):
            register(dict(id="acme/EAGLE-Fake", method="eagle", family="llama",
                          target="acme/Fake", format="yuhuili-eagle"))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [metadata.EntryPoint(name="toy", value="ez_fake_toy", group=plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(plugins, "metadata", SimpleNamespace(
        entry_points=lambda group: [ep for ep in eps if ep.group == group]))
    for var in (plugins.DISABLE_AUTOLOAD_ENV, plugins.ALLOW_LIST_ENV):
        monkeypatch.delenv(var, raising=False)
    return eps


@pytest.mark.parametrize("env, loaded", [
    ({}, True),
    ({"EAGLE_ZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}, False),
    ({"EAGLE_ZOO_PLUGINS": "something_else"}, False),
    ({"EAGLE_ZOO_PLUGINS": "something_else, toy"}, True),
])
def test_autoload_env_vars(fake_entry_points, monkeypatch, env, loaded):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    host = PluginHost(default_plugins=())  # autoload decided by the environment
    assert ("toy" in host.registry.plugins) is loaded
    assert ("acme/EAGLE-Fake" in host.registry.catalog) is loaded
    if loaded:
        assert host.registry.catalog["acme/EAGLE-Fake"].source == "toy"


def test_autoload_false_argument_wins(fake_entry_points):
    assert "toy" not in PluginHost(autoload=False, default_plugins=()).registry.plugins


def test_broken_entry_point_names_itself_and_the_way_out(fake_entry_points):
    fake_entry_points.append(metadata.EntryPoint(name="broken", value="ez_no_such_module",
                                                 group=plugins.ENTRY_POINT_GROUP))
    with pytest.raises(PluginError) as err:
        PluginHost(default_plugins=()).load()
    msg = str(err.value)
    assert "'broken'" in msg and plugins.DISABLE_AUTOLOAD_ENV in msg and plugins.ALLOW_LIST_ENV in msg


# -- a real throwaway distribution -----------------------------------------------
TOY_PYPROJECT = """
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "ez-toy-plugin"
version = "0.3.1"

[project.entry-points.eagle_zoo]
toyzoo = "ez_toy_plugin"
"""

TOY_MODULE = """
from eagle_zoo import hookimpl
from eagle_zoo.specs import FamilySpec


@hookimpl
def register_families(register):
    register(FamilySpec(name="toyfam", architectures=("ToyZooForCausalLM",), model_types=("toyzoo",)))


@hookimpl
def register_catalog(register):
    register(dict(id="acme/EAGLE3-ToyZoo-1B", method="eagle3", family="toyfam",
                  target="acme/ToyZoo-1B", format="yuhuili-eagle3"))
"""


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy_dist")
    src, site = root / "src", root / "site"
    (src / "ez_toy_plugin").mkdir(parents=True)
    (src / "pyproject.toml").write_text(TOY_PYPROJECT)
    (src / "ez_toy_plugin" / "__init__.py").write_text(TOY_MODULE)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(src)],
        check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert (site / "ez_toy_plugin" / "__init__.py").is_file()
    return site


def eagle_zoo_cli(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_ZOO_")}
    clean["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-m", "eagle_zoo.cli", *args], cwd=cwd, env={**clean, **env},
                          capture_output=True, text=True, timeout=300)


def test_installed_plugin_distribution_is_discovered(toy_site, tmp_path):
    run = eagle_zoo_cli(toy_site, tmp_path, "plugins")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("toyzoo "))
    assert "0.3.1" in lines[head] and "entry point of ez-toy-plugin" in lines[head]
    block = "\n".join(lines[head + 1: head + 3])
    assert "toyfam" in block and "acme/EAGLE3-ToyZoo-1B" in block

    listed = eagle_zoo_cli(toy_site, tmp_path, "list", "--family", "toyfam")
    assert listed.returncode == 0 and "acme/EAGLE3-ToyZoo-1B" in listed.stdout


@pytest.mark.parametrize("env", [{"EAGLE_ZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}, {"EAGLE_ZOO_PLUGINS": "other"}])
def test_installed_plugin_can_be_switched_off(toy_site, tmp_path, env):
    run = eagle_zoo_cli(toy_site, tmp_path, "plugins", **env)
    assert run.returncode == 0, run.stderr
    assert "toyzoo" not in run.stdout and "eagle_zoo.catalog" in run.stdout
