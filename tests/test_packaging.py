"""A plain (non-editable) install, from the tree or from an sdist, ships kernels/ (as
eagle_zoo.kernels), converters/ and registry.yaml.

The repository's build inputs are copied to tmp_path (so the in-tree build leaves
nothing in the checkout), installed with pip into a target folder, and imported from
there by a subprocess running outside the repository.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "registry.yaml",
                "eagle_zoo", "kernels", "converters")
# kernels/'s files as paths from kernels/ (a built package must hold each of them)
KERNEL_FILES = sorted(p.relative_to(ROOT / "kernels") for p in (ROOT / "kernels").glob("*.py"))
KERNEL_FILES.append(Path("csrc") / "cpu_decode.cpp")

PROBE = textwrap.dedent("""
    import json, converters, eagle_zoo, eagle_zoo.kernels.linear as kernels
    from eagle_zoo.catalog import load_catalog_file, registry_path
    path = registry_path()
    print(json.dumps({"kernels": kernels.__file__, "converters": converters.__file__,
                      "eagle_zoo": eagle_zoo.__file__, "registry": str(path),
                      "ids": [e.id for e in load_catalog_file(path)]}))
""")


def copy_build_inputs(src: Path) -> Path:
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=junk)
        elif path.is_file():
            shutil.copy2(path, src / name)
    assert not (src / "eagle_zoo" / "registry.yaml").exists()  # the build must place it
    return src


def pip_install(source: Path, site: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=600,
    )
    return site


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("pkg")
    return pip_install(copy_build_inputs(root / "src"), root / "site")


def test_installed_copy_has_kernels_converters_and_registry(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_ZOO_")}
    env["PYTHONPATH"] = str(installed)  # first on sys.path, ahead of the editable install
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    for key in ("kernels", "converters", "eagle_zoo", "registry"):
        assert Path(found[key]).resolve().is_relative_to(installed.resolve()), (key, found[key])
    assert Path(found["registry"]).resolve() == (installed / "eagle_zoo" / "registry.yaml").resolve()
    assert Path(found["kernels"]).resolve() == (installed / "eagle_zoo" / "kernels" / "linear.py").resolve()
    # Same catalog as the repository's file, read here independently of eagle_zoo.
    root_ids = [e["id"] for e in yaml.safe_load((ROOT / "registry.yaml").read_text())["entries"]]
    assert found["ids"] == root_ids and len(root_ids) > 0


def test_kernels_ship_inside_eagle_zoo_and_not_as_top_level_kernels(installed):
    # A top-level kernels/ would overwrite (or be overwritten by) Hugging Face's `kernels`.
    assert not (installed / "kernels").exists()
    shipped = installed / "eagle_zoo" / "kernels"
    # The package init is eagle_zoo/kernels/__init__.py (kernels/ has none, on purpose).
    assert (shipped / "__init__.py").read_text() == (ROOT / "eagle_zoo" / "kernels" / "__init__.py").read_text()
    for path in KERNEL_FILES:
        assert (shipped / path).is_file(), path


def test_package_data_ships(installed):
    data = ROOT / "eagle_zoo" / "data"
    for path in sorted(data.glob("*.jsonl")) + sorted(data.glob("*.md")):
        assert (installed / "eagle_zoo" / "data" / path.name).is_file(), path.name


def test_sdist_carries_kernels_and_registry_and_installs(tmp_path):
    # kernels/ and registry.yaml are no packages, so only setup.py's sdist puts them in.
    src = copy_build_inputs(tmp_path / "src")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=src,
                   check=True, capture_output=True, timeout=600)
    (archive,) = (tmp_path / "dist").glob("eagle_zoo-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for path in KERNEL_FILES:
        assert str("kernels" / path) in names, path
    assert "registry.yaml" in names
    site = pip_install(archive, tmp_path / "site")
    assert (site / "eagle_zoo" / "kernels" / "linear.py").is_file()
    assert (site / "eagle_zoo" / "registry.yaml").read_text() == (ROOT / "registry.yaml").read_text()
