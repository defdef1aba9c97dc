"""Copies the top-level registry.yaml into the built eagle_zoo package.

The catalog lives at the repository root (the design card fixes the layout); an
installed distribution must still find it, so the build places a copy beside the
package's code. Editable installs read the root file directly (eagle_zoo.catalog).
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithCatalog(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "eagle_zoo" / "registry.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "registry.yaml", target)


setup(cmdclass={"build_py": BuildWithCatalog})
