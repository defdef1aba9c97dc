"""eagle_zoo/envs.py is the one place that reads environment variables (eagle-zoo's own
EAGLE_ZOO_* ones and the other tools' it honours), and documents each of them."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle_zoo import envs

ROOT = Path(__file__).resolve().parents[1]
# EAGLE_ZOO_-prefixed strings in the package that are not environment variables.
NOT_VARIABLES = {"EAGLE_ZOO_USER_TURN"}  # train/synthesize.py: a chat-template sentinel


def test_no_other_module_names_an_eagle_zoo_variable():
    found = []
    for path in sorted([*(ROOT / "eagle_zoo").rglob("*.py"), *(ROOT / "kernels").glob("*.py")]):
        if path == ROOT / "eagle_zoo" / "envs.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in set(re.findall(r"EAGLE_ZOO_[A-Z_]+", line)) - NOT_VARIABLES:
                # Docstrings and comments may name a variable; code reads it through envs.
                if "environ" in line or "getenv" in line or re.search(rf"[\"']{name}[\"']", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "read EAGLE_ZOO_* variables through eagle_zoo/envs.py:\n" + "\n".join(found)


def test_no_other_module_reads_the_environment():
    # os.environ passed on whole (a worker process's environment) is not a read of a variable.
    read = re.compile(r"os\.environ(\.get\b|\[)|\bgetenv\(|environ\.get\(")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted([*(ROOT / "eagle_zoo").rglob("*.py"), *(ROOT / "kernels").glob("*.py")])
             if path != ROOT / "eagle_zoo" / "envs.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if read.search(line)]
    assert not found, "read environment variables through eagle_zoo/envs.py:\n" + "\n".join(found)


def test_torchrun_variables(monkeypatch):
    for name in (envs.WORLD_SIZE, envs.RANK, envs.LOCAL_RANK):
        monkeypatch.delenv(name, raising=False)
    assert (envs.torchrun_world_size(), envs.torchrun_rank(), envs.torchrun_local_rank()) == (1, 0, None)
    monkeypatch.setenv(envs.WORLD_SIZE, "4")
    monkeypatch.setenv(envs.RANK, "2")
    monkeypatch.setenv(envs.LOCAL_RANK, "0")
    assert (envs.torchrun_world_size(), envs.torchrun_rank(), envs.torchrun_local_rank()) == (4, 2, 0)


def test_every_variable_is_documented_above_its_name():
    lines = (ROOT / "eagle_zoo" / "envs.py").read_text().splitlines()
    assert len(envs.VARIABLES) == len(set(envs.VARIABLES)) >= 7
    for name in envs.VARIABLES:
        (n,) = [i for i, line in enumerate(lines) if re.match(rf'[A-Z_]+ = "{name}"$', line)]
        assert lines[n - 1].startswith("# "), f"{name} has no comment saying what it does"


# The yes / no variables, each with its reader and what an unset or empty one means.
SWITCHES = [(envs.ASYNC_SCHEDULING, envs.async_scheduling, None),
            (envs.DISABLE_PLUGIN_AUTOLOAD, envs.plugin_autoload_disabled, False)]


@pytest.mark.parametrize("name, read, unset", SWITCHES)
@pytest.mark.parametrize("value, want", [("1", True), ("on", True), ("TRUE", True), ("yes", True), ("0", False),
                                         ("no", False), ("off", False), ("", "unset")])
def test_switch_values(monkeypatch, name, read, unset, value, want):
    monkeypatch.setenv(name, value)
    assert read() is (unset if want == "unset" else want)


def test_values_that_mean_nothing_are_refused_by_name(monkeypatch):
    for name, read, _ in SWITCHES:  # "maybe" is neither yes nor no: refused, not read as either
        monkeypatch.setenv(name, "maybe")
        with pytest.raises(ValueError, match=f"{name}='maybe': use 1 / true"):
            read()
    monkeypatch.setenv(envs.TP_START_TIMEOUT, "ten")
    with pytest.raises(ValueError, match="EAGLE_ZOO_TP_START_TIMEOUT='ten': give a number of seconds"):
        envs.tp_start_timeout_s()


def test_read_when_asked_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv(envs.CACHE, str(tmp_path))
    monkeypatch.setenv(envs.TP_START_TIMEOUT, "12.5")
    monkeypatch.delenv(envs.TP_RANK, raising=False)
    assert envs.cache_dir() == tmp_path and envs.tp_start_timeout_s() == 12.5 and envs.tp_rank() is None
    monkeypatch.setenv(envs.TP_RANK, "3")
    assert envs.tp_rank() == 3
