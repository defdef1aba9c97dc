"""kernels/ is imported as `eagle_zoo.kernels`, never as a top-level `kernels`: that name
is Hugging Face's `kernels` distribution (transformers >= 5.25 requires it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_directory_is_no_regular_package():
    # A kernels/__init__.py would make the directory win over any installed `kernels`
    # whenever the repository root is first on sys.path (`python -m` from a checkout).
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_installed_kernels_package_wins_over_the_directory_from_the_repo_root(tmp_path):
    # A stand-in for Hugging Face's package: a regular package named `kernels`.
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("CUDAProperties = 'hf'\n")
    script = (
        "import kernels, eagle_zoo.kernels as ours, eagle_zoo.kernels.linear as linear\n"
        "print(kernels.CUDAProperties)\n"
        "print(linear.__file__)\n"
        "print(ours.rms_norm.__module__)\n")
    # `-c` puts the working directory (the repository root) first on sys.path.
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, check=True)
    hf_name, linear_file, norm_module = out.stdout.split()
    assert hf_name == "hf"
    assert Path(linear_file) == ROOT / "kernels" / "linear.py"
    assert norm_module == "eagle_zoo.kernels.norm"
