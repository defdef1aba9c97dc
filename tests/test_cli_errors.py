"""`eagle-zoo COMMAND` on bad input: one line naming what is wrong, exit code 2; a bug keeps
its traceback."""
from __future__ import annotations

import pytest

from eagle_zoo import cli
from eagle_zoo.hub import HubError


def _raising(exc: BaseException):
    """cli._entry whose command run raises exc (its arguments are the real ones)."""
    real = cli._entry

    def run(args):
        raise exc
    return lambda module, kind, command: run if kind == "run" else real(module, kind, command)


@pytest.mark.parametrize("exc", [FileNotFoundError("--dataset d.jsonl: no such file"),
                                 ValueError("--max-tokens 0: give at least 1"),
                                 HubError("org/head: not in the local cache and HF_HUB_OFFLINE=1")])
def test_bad_input_is_one_line_and_exit_code_2(monkeypatch, capsys, exc):
    monkeypatch.setattr(cli, "_entry", _raising(exc))
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err == f"eagle-zoo list: error: {exc}\n"


@pytest.mark.parametrize("exc", [TypeError("unsupported operand"), KeyError("hidden_size"), RuntimeError("CUDA")])
def test_a_bug_keeps_its_traceback(monkeypatch, exc):
    monkeypatch.setattr(cli, "_entry", _raising(exc))
    with pytest.raises(type(exc)):
        cli.main(["list"])


def test_a_missing_sources_directory_is_one_line(capsys, tmp_path):
    missing = tmp_path / "no-such-dir"
    assert cli.main(["train", "mix", "--sources", str(missing), "--train-out", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eagle-zoo train: error: ") and str(missing) in err and err.count("\n") == 1


@pytest.mark.parametrize("port, message", [("99999", "99999 is not a TCP port (0-65535)"),
                                           ("http", "'http' is not a port number")])
def test_serve_refuses_a_bad_port_when_parsing(capsys, port, message):
    with pytest.raises(SystemExit) as stop:
        cli.main(["serve", "some/model", "--port", port])
    assert stop.value.code == 2 and f"argument --port: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["list"], ["info", "org/head"], ["plugins"]])
def test_a_registry_that_cannot_be_built_is_one_line(monkeypatch, capsys, command):
    from eagle_zoo import catalog_cli
    from eagle_zoo.plugins import PluginError

    def broken():
        raise PluginError("plugin 'acme' failed to register: add_families raised KeyError")
    monkeypatch.setattr(catalog_cli, "get_registry", broken)
    assert cli.main(command) == 2
    assert capsys.readouterr().err == f"eagle-zoo {command[0]}: error: plugin 'acme' failed to register: " \
                                      "add_families raised KeyError\n"


def test_serve_with_a_bad_engine_argument_is_one_line_before_loading(capsys):
    assert cli.main(["serve", "default", "--max-model-len", "0"]) == 2
    assert capsys.readouterr().err == ("eagle-zoo serve: error: max_model_len must be an integer >= 1 "
                                       "(or None for the default), got 0\n")


def test_serve_passes_download_dir_and_hf_token_to_the_engine(monkeypatch, capsys, tmp_path):
    """`serve --download-dir DIR --hf-token T` is LLM(download_dir=DIR, hf_token=T); a hub id
    missing from that cache is one line naming it, before anything is served."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["serve", "org/not-there", "--download-dir", str(tmp_path), "--hf-token", "hf_x",
                     "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eagle-zoo serve: error: 'org/not-there' (revision 'main') is not in the Hugging Face "
                          f"cache at {tmp_path}")
    assert f"`hf download org/not-there --cache-dir {tmp_path}`" in err  # the download that lands there
