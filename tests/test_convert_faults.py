"""`eagle-zoo convert` under faults: real SIGTERM / SIGKILL in the middle of writing, and
--dry-run / inspection of a safetensors file too large to map."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import checkpoint_factory as cf
from eagle_zoo.checkpoints import tensors as ckpt
from eagle_zoo.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def huge_safetensors(path: Path, shape=(2**17, 2**17)) -> int:
    """A safetensors file whose one float32 tensor is ``shape`` (64 GiB by default): a
    valid header, then a sparse hole as its data (next to nothing on disk)."""
    nbytes = 4 * shape[0] * shape[1]
    header = json.dumps({"fc.weight": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, nbytes]},
                         "__metadata__": {"format": "pt"}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    return nbytes


def test_dry_run_of_a_file_larger_than_memory_reads_only_the_header(tmp_path, monkeypatch, capsys):
    """No memory map and no safetensors reader: the header's bytes are all that is read."""
    import mmap

    import safetensors

    def refused(*a, **kw):
        raise OSError("mapping refused (the test forbids it)")

    for module, name in ((mmap, "mmap"), (safetensors, "safe_open"), (ckpt, "safe_open")):
        monkeypatch.setattr(module, name, refused)
    src = tmp_path / "big"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cf.llama_config()))
    nbytes = huge_safetensors(src / "model.safetensors")
    assert os.path.getsize(src / "model.safetensors") > nbytes  # the file is that large
    assert main(["convert", "shard", str(src), "-o", str(tmp_path / "out"), "--max-shard-size", "1GB",
                 "--dry-run", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fc.weight" in out and "[131072, 131072] float32" in out and "dry run: nothing written" in out
    assert ckpt.tensor_names(src) == ["fc.weight"]
    assert ckpt.checkpoint_numel(src) == 2**34
    assert not (tmp_path / "out").exists()


def test_a_header_that_lies_about_the_file_is_corrupt(tmp_path):
    path = tmp_path / "model.safetensors"
    huge_safetensors(path, shape=(4, 4))
    os.truncate(path, os.path.getsize(path) - 8)  # the data is shorter than the header says
    with pytest.raises(ckpt.CorruptCheckpointError, match="past the end of the file"):
        ckpt.safetensors_header(path)


# -- real signals during a conversion ------------------------------------------------------
# The conversion in a child process, slowed to one tensor per 0.2 s so a signal lands
# while files are being written; everything else is the real CLI.
SLOW_CONVERT = """
import sys, time
import converters.plan as plan
real = plan.write_safetensors
def slow(path, tensors, on_bytes):
    def step(n, name):
        on_bytes(n, name)
        time.sleep(0.2)
    return real(path, tensors, step)
plan.write_safetensors = slow
from eagle_zoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start_conversion(src: Path, out: Path, *extra) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, "convert", "shard", str(src), "-o", str(out),
                             "--max-shard-size", "2kB", "--quiet", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_partial(proc: subprocess.Popen, parent: Path, name: str) -> Path:
    deadline = time.time() + 60
    while True:
        partial = [p for p in parent.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".partial")]
        if partial and any(partial[0].iterdir()):  # a first shard is being written
            return partial[0]
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the conversion never started writing"
        time.sleep(0.02)


def test_sigterm_counts_as_an_interrupt_whatever_error_it_comes_out_as():
    # SIGTERM's KeyboardInterrupt raised inside an extension's call back into Python can
    # come out as the extension's own error (safetensors: "could not determine the shape
    # of object type 'torch.storage.UntypedStorage'"); the CLI still exits as interrupted.
    from converters.cli import _sigterm_as_interrupt

    def extension_call():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            raise ValueError("the extension's own error") from None

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with _sigterm_as_interrupt():
            extension_call()
    assert signal.getsignal(signal.SIGTERM) is previous
    with pytest.raises(ValueError):  # without the signal an error stays what it is
        with _sigterm_as_interrupt():
            raise ValueError("a bug")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_mid_conversion_leaves_out_untouched(tmp_path, sig):
    src = cf.write_yuhuili_eagle3(tmp_path / "e3", kind="safetensors")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")  # --force replaces it only once the new one is complete
    proc = start_conversion(src.path, out, "--force")
    partial = wait_for_partial(proc, tmp_path, "out")
    proc.send_signal(sig)
    code = proc.wait(30)
    assert sorted(os.listdir(out)) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    if sig == signal.SIGTERM:
        assert code == 130, proc.stderr.read()
        assert not partial.exists()  # cleaned up like Ctrl-C
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    else:
        assert code == -signal.SIGKILL  # no chance to clean up: the hidden .partial may stay, never at OUT
    # A new conversion is not disturbed by what the killed one left.
    assert main(["convert", "shard", str(src.path), "-o", str(out), "--max-shard-size", "2kB", "--quiet",
                 "--force"]) == 0
    written = ckpt.load_state_dict(out)
    assert sorted(written) == sorted(src.weights)
