"""The package as a third party publishes it: a wheel that carries the catalog and
declares the entry point, built from a copy of the source (nothing left in the tree)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_catalog_and_entry_point(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)],
                   check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("eagle_zoo_qwen2-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {"eagle_zoo_qwen2/catalog.yaml", "eagle_zoo_qwen2/plugin.py", "eagle_zoo_qwen2/modeling.py"} <= names
        (ep_file,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(ep_file).decode().split()
    assert entry_points == ["[eagle_zoo]", "qwen2", "=", "eagle_zoo_qwen2.plugin"]
