"""Places two top-level parts of the repository inside the built eagle_zoo package.

The design card fixes the layout: the catalog is registry.yaml and the kernels are
kernels/, both at the repository root. An installed distribution must still find them,
so the build copies registry.yaml beside eagle_zoo's code and kernels/ into
eagle_zoo/kernels/ (import name `eagle_zoo.kernels`; a top-level `kernels` would clash
with Hugging Face's distribution of that name, see kernels/README.md). Editable installs
read both from the root directly (eagle_zoo.catalog, eagle_zoo/kernels/__init__.py).
Neither is a package, so setuptools' default file list leaves them out of a source
distribution: its release tree gets a copy too, for a wheel built from it to carry them.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
KERNEL_FILES = ("*.py", "csrc/*.cpp")


def copy_root_parts(base: Path) -> None:
    """registry.yaml and kernels/'s files, under base at their paths from the root."""
    parts = [ROOT / "registry.yaml"]
    parts += [path for pattern in KERNEL_FILES for path in sorted((ROOT / "kernels").glob(pattern))]
    for source in parts:
        target = base / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


class BuildWithRootParts(build_py):
    def run(self):
        super().run()
        copy_root_parts(Path(self.build_lib) / "eagle_zoo")


class SdistWithRootParts(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy_root_parts(Path(base_dir))


setup(cmdclass={"build_py": BuildWithRootParts, "sdist": SdistWithRootParts})
