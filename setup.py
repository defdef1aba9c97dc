"""Places two top-level parts of the repository inside the built eagle_zoo package.

The design card fixes the layout: the catalog is registry.yaml and the kernels are
kernels/, both at the repository root. An installed distribution must still find them,
so the build copies registry.yaml beside eagle_zoo's code and kernels/ into
eagle_zoo/kernels/ (import name `eagle_zoo.kernels`; a top-level `kernels` would clash
with Hugging Face's distribution of that name, see kernels/README.md). Editable installs
read both from the root directly (eagle_zoo.catalog, eagle_zoo/kernels/__init__.py).
Neither is a package of its own, so the source distribution lists them explicitly, for
a wheel built from it to carry them too.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

KERNEL_FILES = ("*.py", "csrc/*.cpp")


class BuildWithRootParts(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        package = Path(self.build_lib) / "eagle_zoo"
        package.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "registry.yaml", package / "registry.yaml")
        for pattern in KERNEL_FILES:
            for source in (root / "kernels").glob(pattern):
                target = package / "kernels" / source.relative_to(root / "kernels")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


class SdistWithRootParts(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = Path(__file__).resolve().parent
        parts = [root / "registry.yaml"] + [p for pattern in KERNEL_FILES for p in (root / "kernels").glob(pattern)]
        for source in parts:
            target = Path(base_dir) / source.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)

setup(cmdclass={"build_py": BuildWithRootParts, "sdist": SdistWithRootParts})
